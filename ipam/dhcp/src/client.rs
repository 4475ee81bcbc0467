//! The DHCP exchanges of one lease, over sockets made inside the pod's netns (a socket stays in the netns it
//! was made in, whatever thread uses it later).
//!
//! Before the pod interface has its address (DISCOVER, the SELECTING REQUEST) and when rebinding, messages go
//! through a packet socket on the interface: broadcast, and the answer read whatever address it is sent to.
//! Renewing and releasing are unicast to the server from the leased address over a UDP socket, so the kernel
//! resolves the server's MAC as it would for any other traffic (RFC 2131 §4.3.6, §4.4.4).

use crate::packet::{self, ClientMessage, MessageType, ServerMessage, CLIENT_PORT, SERVER_PORT};
use cnicore::netns::NetNs;
use std::io;
use std::mem::size_of;
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

const ETH_P_IP: u16 = 0x0800;

fn check(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

fn set_recv_timeout(fd: &OwnedFd, timeout: Duration) -> io::Result<()> {
    // A zero timeout would mean "block forever".
    let timeout = timeout.max(Duration::from_millis(1));
    let tv = libc::timeval { tv_sec: timeout.as_secs() as _, tv_usec: timeout.subsec_micros() as _ };
    // SAFETY: setsockopt reads size_of::<timeval>() bytes from &tv.
    check(unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&tv as *const libc::timeval).cast(),
            size_of::<libc::timeval>() as libc::socklen_t,
        )
    })
    .map(drop)
}

fn set_int_option(fd: &OwnedFd, level: libc::c_int, name: libc::c_int, value: libc::c_int) -> io::Result<()> {
    // SAFETY: setsockopt reads one c_int from &value.
    check(unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (&value as *const libc::c_int).cast(),
            size_of::<libc::c_int>() as _,
        )
    })
    .map(drop)
}

/// The time until `deadline`, `None` once it has come.
fn time_left(deadline: Instant) -> Option<Duration> {
    deadline.checked_duration_since(Instant::now()).filter(|d| !d.is_zero())
}

fn is_timeout(e: &io::Error) -> bool {
    matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut)
}

/// Broadcast IPv4/UDP over the interface, with the IP header ours: the interface may have no address yet.
/// Closing one waits for an RCU grace period in the kernel (packet_release): callers drop it after answering.
pub struct PacketSocket {
    fd: OwnedFd,
    ifindex: u32,
}

impl PacketSocket {
    pub fn open(netns: &NetNs, ifindex: u32) -> io::Result<PacketSocket> {
        netns.run(|| {
            // Protocol 0 until bound: a socket created with a protocol is hooked in at once, and binding it
            // then unhooks it with an RCU grace period (synchronize_net, 8-15 ms on a busy machine).
            // SAFETY: plain socket(2); the descriptor is owned at once.
            let fd = check(unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) })?;
            // SAFETY: fd is a fresh descriptor of ours.
            let fd = unsafe { OwnedFd::from_raw_fd(fd) };
            let addr = sockaddr_ll(ifindex, [0; 6], 0);
            // SAFETY: bind reads size_of::<sockaddr_ll>() bytes from &addr.
            check(unsafe {
                libc::bind(
                    fd.as_raw_fd(),
                    (&addr as *const libc::sockaddr_ll).cast(),
                    size_of::<libc::sockaddr_ll>() as libc::socklen_t,
                )
            })?;
            Ok(PacketSocket { fd, ifindex })
        })?
    }

    pub fn send_broadcast(&self, src: Ipv4Addr, payload: &[u8]) -> io::Result<()> {
        let packet = packet::ip_udp_wrap(src, Ipv4Addr::BROADCAST, CLIENT_PORT, SERVER_PORT, payload);
        let addr = sockaddr_ll(self.ifindex, [0xff; 6], 6);
        // SAFETY: sendto reads packet.len() bytes of packet and the sockaddr_ll.
        check(unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                packet.as_ptr().cast(),
                packet.len(),
                0,
                (&addr as *const libc::sockaddr_ll).cast(),
                size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            ) as libc::c_int
        })
        .map(drop)
    }

    /// The next DHCP message to the client port before `deadline`, `None` when the time is up.
    pub fn recv(&self, deadline: Instant) -> io::Result<Option<Vec<u8>>> {
        let mut buf = vec![0u8; 1600];
        loop {
            let Some(left) = time_left(deadline) else { return Ok(None) };
            set_recv_timeout(&self.fd, left)?;
            // SAFETY: recv writes at most buf.len() bytes into buf.
            let n = unsafe { libc::recv(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
            if n < 0 {
                let e = io::Error::last_os_error();
                if is_timeout(&e) || e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            if let Some(payload) = packet::udp_payload(&buf[..n as usize], CLIENT_PORT) {
                return Ok(Some(payload.to_vec()));
            }
        }
    }
}

fn sockaddr_ll(ifindex: u32, addr: [u8; 6], halen: u8) -> libc::sockaddr_ll {
    let mut sll_addr = [0u8; 8];
    sll_addr[..6].copy_from_slice(&addr);
    libc::sockaddr_ll {
        sll_family: libc::AF_PACKET as u16,
        sll_protocol: ETH_P_IP.to_be(),
        sll_ifindex: ifindex as i32,
        sll_hatype: 0,
        sll_pkttype: 0,
        sll_halen: halen,
        sll_addr,
    }
}

/// UDP from the leased address's port 68 on the pod interface: renewals and releases, unicast to the server.
pub fn unicast_socket(netns: &NetNs, ifname: &str, addr: Ipv4Addr) -> io::Result<UdpSocket> {
    netns.run(|| {
        // SAFETY: plain socket(2); the descriptor is owned at once.
        let fd = check(unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) })?;
        // SAFETY: fd is a fresh descriptor of ours.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        set_int_option(&fd, libc::SOL_SOCKET, libc::SO_REUSEADDR, 1)?;
        let name = ifname.as_bytes();
        // SAFETY: setsockopt reads name.len() bytes of the interface name.
        check(unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_BINDTODEVICE,
                name.as_ptr().cast(),
                name.len() as libc::socklen_t,
            )
        })?;
        let sin = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: CLIENT_PORT.to_be(),
            sin_addr: libc::in_addr { s_addr: u32::from(addr).to_be() },
            sin_zero: [0; 8],
        };
        // SAFETY: bind reads size_of::<sockaddr_in>() bytes from &sin.
        check(unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&sin as *const libc::sockaddr_in).cast(),
                size_of::<libc::sockaddr_in>() as libc::socklen_t,
            )
        })?;
        Ok(UdpSocket::from(fd))
    })?
}

/// Where an exchange sends its message and reads the answers.
pub enum Path<'a> {
    Broadcast(&'a PacketSocket),
    Unicast(&'a UdpSocket, Ipv4Addr),
}

impl Path<'_> {
    fn send(&self, msg: &ClientMessage) -> io::Result<()> {
        let bytes = msg.encode();
        match self {
            Path::Broadcast(s) => s.send_broadcast(msg.ciaddr, &bytes),
            Path::Unicast(s, server) => s.send_to(&bytes, SocketAddrV4::new(*server, SERVER_PORT)).map(drop),
        }
    }

    fn recv(&self, deadline: Instant) -> io::Result<Option<Vec<u8>>> {
        match self {
            Path::Broadcast(s) => s.recv(deadline),
            Path::Unicast(s, _) => {
                let mut buf = vec![0u8; 1500];
                loop {
                    let Some(left) = time_left(deadline) else { return Ok(None) };
                    s.set_read_timeout(Some(left))?;
                    match s.recv(&mut buf) {
                        Ok(n) => return Ok(Some(buf[..n].to_vec())),
                        Err(e) if is_timeout(&e) || e.kind() == io::ErrorKind::Interrupted => continue,
                        Err(e) => return Err(e),
                    }
                }
            }
        }
    }
}

/// A random transaction ID (and jitter for the retries).
pub fn random_u32() -> u32 {
    let mut b = [0u8; 4];
    // SAFETY: getrandom writes at most 4 bytes into b.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), 4, 0) };
    if n != 4 {
        // Uniqueness, not secrecy, is what matters here.
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        return t.subsec_nanos() ^ std::process::id();
    }
    u32::from_ne_bytes(b)
}

/// Sends `msg` and returns the first answer of the same transaction and client whose type is in `want`
/// (a NAK always ends the exchange), or an error when none came within `timeout`.
pub fn exchange(
    path: &Path,
    msg: &ClientMessage,
    want: &[MessageType],
    timeout: Duration,
) -> io::Result<ServerMessage> {
    path.send(msg)?;
    let deadline = Instant::now() + timeout;
    while let Some(bytes) = path.recv(deadline)? {
        let Some(reply) = ServerMessage::decode(&bytes) else { continue };
        if reply.xid != msg.xid || reply.chaddr != msg.mac {
            continue;
        }
        if want.contains(&reply.kind) || reply.kind == MessageType::Nak {
            return Ok(reply);
        }
    }
    let what = match msg.kind {
        MessageType::Discover => "DHCPOFFER",
        _ => "DHCPACK",
    };
    Err(io::Error::new(io::ErrorKind::TimedOut, format!("no {what} within {timeout:?}")))
}

/// A RELEASE, unicast to the server: no answer comes (RFC 2131 §4.4.6).
pub fn release(path: &Path, msg: &ClientMessage) -> io::Result<()> {
    path.send(msg)
}
