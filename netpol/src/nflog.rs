//! The agent's NFLOG group, read over netlink (nfnetlink_log): the group bound on a NETLINK_NETFILTER socket
//! of the agent's namespace, each logged packet's prefix and first bytes received. The messages are built
//! and parsed by `netlink-packet-netfilter` (the rust-netlink family's nfnetlink crate, on the same
//! `netlink-packet-core` as cnicore's netlink); the socket is `netlink-sys`'s, as everywhere else.
//!
//! A group is one program's: binding a group another socket holds is refused (`EPERM`), and the agent then
//! says so once and goes on enforcing without a drop log.

use std::fmt;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use netlink_packet_core::{NetlinkMessage, NetlinkPayload};
use netlink_packet_netfilter::nflog::{config_request, ConfigCmd, ConfigMode, PacketNla, ULogMessage};
use netlink_packet_netfilter::{NetfilterMessage, NetfilterMessageInner, NetfilterProtoFamily};
use netlink_sys::{protocols::NETLINK_NETFILTER, Socket};

use crate::plan::{PROTO_SCTP, PROTO_TCP, PROTO_UDP};

/// Bytes of each packet copied to us: an IPv6 header (40) and the ports that follow, with room to spare.
const COPY_RANGE: u32 = 128;

/// Why the group could not be bound.
#[derive(Debug)]
pub enum NflogError {
    /// Another program's socket holds the group.
    Held(u16),
    Socket(io::Error),
}

impl fmt::Display for NflogError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NflogError::Held(group) => write!(f, "NFLOG group {group} is held by another program"),
            NflogError::Socket(error) => write!(f, "NFLOG: {error}"),
        }
    }
}

impl std::error::Error for NflogError {}

/// A packet the kernel logged to the group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Logged {
    pub prefix: String,
    pub payload: Vec<u8>,
}

/// The bound group.
pub struct Nflog {
    socket: Socket,
    buffer: Vec<u8>,
}

impl Nflog {
    /// Binds `group` (copying the first [`COPY_RANGE`] bytes of each packet).
    pub fn bind(group: u16) -> Result<Nflog, NflogError> {
        let mut socket = Socket::new(NETLINK_NETFILTER).map_err(NflogError::Socket)?;
        socket.bind_auto().map_err(NflogError::Socket)?;
        let request = bind_request(group);
        socket.send(&request, 0).map_err(NflogError::Socket)?;
        let mut buffer = vec![0; 64 * 1024];
        let size = socket.recv(&mut &mut buffer[..], 0).map_err(NflogError::Socket)?;
        match acknowledged(&buffer[..size]) {
            Ok(()) => Ok(Nflog { socket, buffer }),
            // EPERM: another socket's instance; EBUSY: bound already.
            Err(e) if matches!(e.raw_os_error(), Some(libc::EPERM) | Some(libc::EBUSY)) => Err(NflogError::Held(group)),
            Err(e) => Err(NflogError::Socket(e)),
        }
    }

    /// Waits for the next datagram and returns the packets it logs. ENOBUFS (the kernel dropped messages we
    /// did not read in time) returns nothing: the drops were enforced, only their log is lost.
    pub fn receive(&mut self) -> io::Result<Vec<Logged>> {
        let size = match self.socket.recv(&mut &mut self.buffer[..], 0) {
            Ok(size) => size,
            Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        Ok(parse_datagram(&self.buffer[..size]))
    }
}

/// `NFULNL_MSG_CONFIG` for `group`: `NFULNL_CFG_CMD_BIND` and the copy mode (packet, [`COPY_RANGE`] bytes),
/// with an acknowledgement asked.
fn bind_request(group: u16) -> Vec<u8> {
    let nlas = vec![ConfigCmd::Bind.into(), ConfigMode::new_packet(COPY_RANGE).into()];
    let message = config_request(NetfilterProtoFamily::Unspec, group, nlas);
    let mut buffer = vec![0; message.header.length as usize];
    message.serialize(&mut buffer);
    buffer
}

/// The acknowledgement of the bind: `Ok` or the kernel's error.
fn acknowledged(datagram: &[u8]) -> io::Result<()> {
    let message = NetlinkMessage::<NetfilterMessage>::deserialize(datagram)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
    match message.payload {
        NetlinkPayload::Error(error) => match error.code {
            None => Ok(()),
            Some(code) => Err(io::Error::from_raw_os_error(-code.get())),
        },
        _ => Ok(()),
    }
}

/// The logged packets of one datagram (several messages may share it); anything else is skipped.
pub fn parse_datagram(datagram: &[u8]) -> Vec<Logged> {
    let mut out = Vec::new();
    let mut rest = datagram;
    while rest.len() >= 16 {
        let len = u32::from_ne_bytes(rest[..4].try_into().expect("4 bytes")) as usize;
        if len < 16 || len > rest.len() {
            break;
        }
        if let Ok(message) = NetlinkMessage::<NetfilterMessage>::deserialize(&rest[..len]) {
            out.extend(logged(&message));
        }
        rest = &rest[len.next_multiple_of(4).min(rest.len())..];
    }
    out
}

fn logged(message: &NetlinkMessage<NetfilterMessage>) -> Option<Logged> {
    let NetlinkPayload::InnerMessage(NetfilterMessage {
        inner: NetfilterMessageInner::ULog(ULogMessage::Packet(nlas)),
        ..
    }) = &message.payload
    else {
        return None;
    };
    let (mut prefix, mut payload) = (None, None);
    for nla in nlas {
        match nla {
            PacketNla::Prefix(text) => prefix = Some(text.to_string_lossy().into_owned()),
            PacketNla::Payload(bytes) => payload = Some(bytes.clone()),
            _ => {}
        }
    }
    Some(Logged { prefix: prefix.unwrap_or_default(), payload: payload? })
}

/// What the drop log reads of a packet's network and transport headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Headers {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub proto: u8,
    /// Source and destination ports (TCP, UDP, SCTP; not for a later fragment).
    pub ports: Option<(u16, u16)>,
}

/// The IPv4 or IPv6 header at the start of `packet` (IPv6 extension headers are not followed: such a
/// packet is reported with their protocol number and no ports).
pub fn parse_headers(packet: &[u8]) -> Option<Headers> {
    let version = packet.first()? >> 4;
    let (src, dst, proto, transport) = match version {
        4 => {
            let ihl = usize::from(packet[0] & 0x0f) * 4;
            let octets = |at: usize| -> Option<[u8; 4]> { packet.get(at..at + 4)?.try_into().ok() };
            let first_fragment = u16::from_be_bytes([*packet.get(6)?, *packet.get(7)?]) & 0x1fff == 0;
            let src = IpAddr::V4(Ipv4Addr::from(octets(12)?));
            let dst = IpAddr::V4(Ipv4Addr::from(octets(16)?));
            (src, dst, *packet.get(9)?, first_fragment.then_some(ihl))
        }
        6 => {
            let octets = |at: usize| -> Option<[u8; 16]> { packet.get(at..at + 16)?.try_into().ok() };
            let src = IpAddr::V6(Ipv6Addr::from(octets(8)?));
            let dst = IpAddr::V6(Ipv6Addr::from(octets(24)?));
            (src, dst, *packet.get(6)?, Some(40))
        }
        _ => return None,
    };
    let ports = match (proto, transport) {
        (PROTO_TCP | PROTO_UDP | PROTO_SCTP, Some(at)) => {
            let port = |at: usize| Some(u16::from_be_bytes([*packet.get(at)?, *packet.get(at + 1)?]));
            Some((port(at)?, port(at + 2)?))
        }
        _ => None,
    };
    Some(Headers { src, dst, proto, ports })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An NFULNL_MSG_PACKET laid out as nfnetlink_log sends it (`linux/netfilter/nfnetlink_log.h`), with the
    /// packet header, prefix and payload attributes (the kernel test reads the kernel's own).
    fn packet_message(prefix: &str, payload: &[u8]) -> Vec<u8> {
        let mut body = vec![2, 0, 0, 100]; // nfgenmsg: AF_INET, version 0, group 100 (network order)
        let mut attr = |kind: u16, value: &[u8]| {
            body.extend_from_slice(&((4 + value.len()) as u16).to_ne_bytes());
            body.extend_from_slice(&kind.to_ne_bytes());
            body.extend_from_slice(value);
            body.resize(body.len().next_multiple_of(4), 0);
        };
        attr(1, &[0x08, 0x00, 2, 0]); // NFULA_PACKET_HDR: hw protocol, hook
        let mut text = prefix.as_bytes().to_vec();
        text.push(0);
        attr(10, &text); // NFULA_PREFIX
        attr(9, payload); // NFULA_PAYLOAD
        let mut out = Vec::new();
        out.extend_from_slice(&((16 + body.len()) as u32).to_ne_bytes());
        out.extend_from_slice(&(4u16 << 8).to_ne_bytes()); // NFNL_SUBSYS_ULOG << 8 | NFULNL_MSG_PACKET (0)
        out.extend_from_slice(&[0; 10]);
        out.extend_from_slice(&body);
        out
    }

    fn udp4() -> Vec<u8> {
        let mut p = vec![0x45, 0, 0, 28, 0, 0, 0x40, 0, 64, PROTO_UDP, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2];
        p.extend_from_slice(&40000u16.to_be_bytes());
        p.extend_from_slice(&80u16.to_be_bytes());
        p.extend_from_slice(&[0, 8, 0, 0]);
        p
    }

    #[test]
    fn reads_the_prefix_and_the_packet() {
        let mut datagram = packet_message("cni-netpol:ingress", &udp4());
        datagram.extend(packet_message("cni-netpol:egress", &udp4()));
        let logged = parse_datagram(&datagram);
        assert_eq!(logged.len(), 2);
        assert_eq!(logged[0].prefix, "cni-netpol:ingress");
        assert_eq!(logged[1].prefix, "cni-netpol:egress");
        let headers = parse_headers(&logged[0].payload).unwrap();
        assert_eq!(headers.src, "10.0.0.1".parse::<IpAddr>().unwrap());
        assert_eq!(headers.dst, "10.0.0.2".parse::<IpAddr>().unwrap());
        assert_eq!((headers.proto, headers.ports), (PROTO_UDP, Some((40000, 80))));
    }

    #[test]
    fn ipv6_and_fragments() {
        let mut p = vec![0x60, 0, 0, 0, 0, 20, PROTO_TCP, 64];
        p.extend_from_slice(&"fd00::1".parse::<Ipv6Addr>().unwrap().octets());
        p.extend_from_slice(&"fd00::2".parse::<Ipv6Addr>().unwrap().octets());
        p.extend_from_slice(&[0x9c, 0x40, 0, 81]);
        let headers = parse_headers(&p).unwrap();
        assert_eq!((headers.dst, headers.ports), ("fd00::2".parse().unwrap(), Some((40000, 81))));
        let mut later_fragment = udp4();
        later_fragment[7] = 8;
        assert_eq!(parse_headers(&later_fragment).unwrap().ports, None);
        assert_eq!(parse_headers(&[0x45, 0, 0]), None, "truncated");
    }

    #[test]
    fn the_bind_request_is_nfnetlink_log_s() {
        let request = bind_request(100);
        // nlmsghdr: NFNL_SUBSYS_ULOG << 8 | NFULNL_MSG_CONFIG, REQUEST | ACK.
        assert_eq!(u16::from_ne_bytes([request[4], request[5]]), (4 << 8) | 1);
        assert_eq!(u16::from_ne_bytes([request[6], request[7]]), 0x1 | 0x4);
        // nfgenmsg: AF_UNSPEC, version 0, the group in network order.
        assert_eq!(request[16..20], [0, 0, 0, 100]);
        // NFULA_CFG_CMD (1): BIND (1); NFULA_CFG_MODE (2): range 128, COPY_PACKET (2).
        assert_eq!(request[20..28], [5, 0, 1, 0, 1, 0, 0, 0]);
        assert_eq!(request[28..38], [10, 0, 2, 0, 0, 0, 0, 128, 2, 0]);
    }
}
