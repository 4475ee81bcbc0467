//! A small synchronous rtnetlink (NETLINK_ROUTE) client: one socket per network namespace.
//!
//! [`Netlink::request_raw`] sends one request built with [`wire::Request`] and collects the replies (ACKs,
//! errors and multi-part dumps); the typed helpers in [`link`], [`addr`], [`route`] and `crate::tc` are built
//! on it and parse only the attributes they need (see [`wire`] for why). Errors are
//! `std::io::Error`s carrying the kernel's errno, so callers can test e.g.
//! `e.raw_os_error() == Some(libc::EEXIST)` (see [`is_exists`] and [`is_not_found`]).
//!
//! Tunnel devices: [`vxlan`], [`tunnel`] (ipip, and the wireguard link). Generic netlink: [`genl`] (a
//! NETLINK_GENERIC socket, family ids from nlctrl) and [`wireguard`] (a wireguard device's key, port and peers).

pub mod addr;
pub mod bridge_vlan;
pub mod dad;
pub mod genl;
pub mod kinds;
pub mod link;
pub mod neigh;
pub mod nsid;
pub mod refusal;
pub mod route;
pub mod rule;
pub mod tunnel;
pub mod vrf;
pub mod vxlan;
pub mod wire;
pub mod wireguard;

use std::io;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use netlink_packet_core::{NetlinkDeserializable, NetlinkHeader, NLM_F_DUMP};
use netlink_sys::{protocols::NETLINK_ROUTE, Socket};

use crate::netns::NetNs;

pub use addr::{Address, AddressOptions};
pub use bridge_vlan::PortVlan;
pub use kinds::{IpvlanLink, IpvlanMode, KindData, LinkKind, MacvlanMode, NewLink};
pub use link::{BridgePort, InfoBridge, Link};
pub use neigh::{FdbEntry, Neighbour};
pub use netlink_packet_route::RouteNetlinkMessage;
pub use route::{Route, RT_TABLE_MAIN};
pub use rule::Rule;
pub use tunnel::Ipip;
pub use vxlan::Vxlan;
pub use wire::{Reply, Request};
pub use wireguard::{PeerChange, WgDevice, WgPeer, Wireguard};

/// A dump that the kernel flags as interrupted (the table changed meanwhile) is retried at once this many times,
/// then with a growing pause (1, 2, 4 ... 32 ms) until [`DUMP_PATIENCE`] has passed and [`DUMP_MIN_ATTEMPTS`]
/// were made: where pods come and go by the dozen (seen in the VM lane: 64 concurrent bridge ADDs on Debian's 6.1
/// under emulation), five immediate retries all met another change.
const DUMP_QUICK_ATTEMPTS: u32 = 5;
/// An interrupted dump is tried at least this many times before the caller gets the error.
const DUMP_MIN_ATTEMPTS: u32 = 12;
/// How long an interrupted dump is retried in all before the caller gets the error.
const DUMP_PATIENCE: std::time::Duration = std::time::Duration::from_secs(3);

/// IP version of addresses and routes (one type with the firewall's `Family`).
pub use crate::ip::IpFamily;

/// Scope of an address or route (`RT_SCOPE_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Scope {
    #[default]
    Universe,
    Site,
    Link,
    Host,
    Nowhere,
    Other(u8),
}

impl From<u8> for Scope {
    fn from(value: u8) -> Scope {
        match value {
            0 => Scope::Universe,
            200 => Scope::Site,
            253 => Scope::Link,
            254 => Scope::Host,
            255 => Scope::Nowhere,
            other => Scope::Other(other),
        }
    }
}

impl From<Scope> for u8 {
    fn from(scope: Scope) -> u8 {
        match scope {
            Scope::Universe => 0,
            Scope::Site => 200,
            Scope::Link => 253,
            Scope::Host => 254,
            Scope::Nowhere => 255,
            Scope::Other(other) => other,
        }
    }
}

/// True for "already exists" errors (EEXIST), e.g. a link or address created concurrently.
pub fn is_exists(err: &io::Error) -> bool {
    err.raw_os_error() == Some(libc::EEXIST)
}

/// True for the errors the kernel uses when the object asked for is missing
/// (ENODEV for links, EADDRNOTAVAIL for addresses, ESRCH/ENOENT for routes).
pub fn is_not_found(err: &io::Error) -> bool {
    matches!(
        err.raw_os_error(),
        Some(libc::ENODEV) | Some(libc::ENOENT) | Some(libc::ESRCH) | Some(libc::EADDRNOTAVAIL)
    )
}

/// A NETLINK_ROUTE socket bound in one network namespace.
pub struct Netlink {
    socket: Socket,
    /// The namespace the socket lives in, to open more sockets there (event subscriptions).
    netns: NetNs,
    sequence: u32,
}

impl Netlink {
    /// A socket in the calling thread's current network namespace.
    pub fn new() -> io::Result<Netlink> {
        let netns = NetNs::current()?;
        let socket = open_socket(&[])?;
        Ok(Netlink { socket, netns, sequence: 0 })
    }

    /// A socket in `netns` (a socket stays bound to the namespace it was created in).
    pub fn in_netns(netns: &NetNs) -> io::Result<Netlink> {
        let socket = netns.run(|| open_socket(&[]))??;
        Ok(Netlink { socket, netns: netns.try_clone()?, sequence: 0 })
    }

    /// The namespace this socket operates in.
    pub fn netns(&self) -> &NetNs {
        &self.netns
    }

    /// Calls `look` until it answers, woken by events of the `RTNLGRP_*` `groups` rather than by polling with
    /// sleeps; `ErrorKind::TimedOut` ("<what> after <timeout>") when `timeout` passes first. The subscription is
    /// made before the first look, so that no change between a look and the wait is missed.
    pub(crate) fn wait_until<T>(
        &mut self,
        groups: &[u32],
        timeout: Duration,
        what: impl Fn() -> String,
        mut look: impl FnMut(&mut Netlink) -> io::Result<Option<T>>,
    ) -> io::Result<T> {
        let deadline = Instant::now() + timeout;
        let events = self.subscribe(groups)?;
        loop {
            if let Some(done) = look(self)? {
                return Ok(done);
            }
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() || !wait_readable(events.as_raw_fd(), remaining)? {
                return Err(io::Error::new(io::ErrorKind::TimedOut, format!("{} after {timeout:?}", what())));
            }
            // The event only wakes us up; the state is looked at again above. ENOBUFS (events were lost) is
            // fine for the same reason.
            match events.recv_from_full() {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// A new socket in the same namespace subscribed to the given `RTNLGRP_*` multicast groups.
    pub(crate) fn subscribe(&self, groups: &[u32]) -> io::Result<Socket> {
        self.netns.run(|| open_socket(groups))?
    }

    /// Sends `request` with `NLM_F_REQUEST | NLM_F_ACK | flags` and returns the messages the kernel
    /// answered with (empty for a plain ACK, every part for a dump with `NLM_F_DUMP`). A negative kernel
    /// answer becomes `io::Error::from_raw_os_error(errno)`.
    pub fn request_raw(&mut self, request: &mut Request, flags: u16) -> io::Result<Vec<Reply>> {
        let is_dump = flags & NLM_F_DUMP == NLM_F_DUMP;
        let started = std::time::Instant::now();
        let mut attempts = 0u32;
        loop {
            attempts += 1;
            let (replies, interrupted) = self.request_once(request, flags)?;
            if !(is_dump && interrupted) {
                return Ok(replies);
            }
            // Both bounds: one slow attempt (a loaded node) does not use up the patience.
            if attempts >= DUMP_MIN_ATTEMPTS && started.elapsed() >= DUMP_PATIENCE {
                return Err(io::Error::new(
                    io::ErrorKind::Interrupted,
                    format!("netlink dump kept being interrupted by concurrent changes ({attempts} attempts)"),
                ));
            }
            if attempts >= DUMP_QUICK_ATTEMPTS {
                let pause_ms = 1u64 << (attempts - DUMP_QUICK_ATTEMPTS).min(5);
                std::thread::sleep(std::time::Duration::from_millis(pause_ms));
            }
        }
    }

    /// Like [`Netlink::request_raw`] with netlink-packet-route's message enum. This links the parser and
    /// emitter of every rtnetlink message into the binary (hundreds of KiB): prefer the typed helpers.
    pub fn request(&mut self, message: RouteNetlinkMessage, flags: u16) -> io::Result<Vec<RouteNetlinkMessage>> {
        let mut request = Request::new(message.message_type(), &[]);
        request.emit(&message);
        let replies = self.request_raw(&mut request, flags)?;
        replies
            .iter()
            .map(|reply| {
                let mut header = NetlinkHeader::default();
                header.message_type = reply.message_type;
                RouteNetlinkMessage::deserialize(&header, &reply.data)
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("bad netlink message: {e}")))
            })
            .collect()
    }

    /// Sends many requests (each with its `NLM_F_*` flags, e.g. [`Route::REPLACE`]) in as few datagrams as
    /// possible and returns each one's outcome, in order. The kernel handles the messages of a datagram one
    /// after the other and acknowledges each, so a thousand routes cost a few system calls instead of a
    /// thousand round trips. Only requests answered by an ACK (changes, not dumps) belong in a batch.
    pub fn batch(&mut self, requests: Vec<(Request, u16)>) -> io::Result<Vec<io::Result<()>>> {
        let mut outcomes = Vec::with_capacity(requests.len());
        let mut requests = requests.into_iter().peekable();
        while requests.peek().is_some() {
            // Bounded so that the acknowledgements (errors echo their request) fit the receive buffer.
            let mut datagram = Vec::new();
            let first = self.sequence.wrapping_add(1);
            let mut count = 0u32;
            while count < BATCH_MESSAGES && datagram.len() < BATCH_BYTES {
                let Some((mut request, flags)) = requests.next() else { break };
                self.sequence = self.sequence.wrapping_add(1);
                let flags = netlink_packet_core::NLM_F_REQUEST | netlink_packet_core::NLM_F_ACK | flags;
                datagram.extend_from_slice(request.finish(flags, self.sequence));
                count += 1;
            }
            let mut answers: Vec<Option<io::Result<()>>> = (0..count).map(|_| None).collect();
            let mut pending = count;
            self.socket.send_to(&datagram, &netlink_sys::SocketAddr::new(0, 0), 0)?;
            while pending > 0 {
                let (received, _) = self.socket.recv_from_full()?;
                for message in wire::split_datagram(&received)? {
                    let slot = message.sequence.wrapping_sub(first) as usize;
                    let outcome = match message.received {
                        wire::Received::End => Ok(()),
                        wire::Received::Failed(e) => Err(e),
                        _ => continue,
                    };
                    if let Some(answer @ None) = answers.get_mut(slot) {
                        *answer = Some(outcome);
                        pending -= 1;
                    }
                }
            }
            outcomes.extend(answers.into_iter().flatten());
        }
        Ok(outcomes)
    }

    /// A socket that receives the kernel's notifications of the `RTNLGRP_*` `groups` in this namespace.
    pub fn events(&self, groups: &[u32]) -> io::Result<Events> {
        Ok(Events { socket: self.subscribe(groups)? })
    }

    /// A dump (`request` with `NLM_F_DUMP`): the replies of type `reply_type` that `parse` reads, in order.
    pub fn dump<T>(
        &mut self,
        request: &mut Request,
        reply_type: u16,
        parse: impl FnMut(&[u8]) -> Option<T>,
    ) -> io::Result<Vec<T>> {
        let replies = self.request_raw(request, NLM_F_DUMP)?;
        let mut parse = parse;
        Ok(replies
            .iter()
            .filter(|reply| reply.message_type == reply_type)
            .filter_map(|reply| parse(&reply.data))
            .collect())
    }

    /// One request; the flag says whether the kernel marked the answer as interrupted (NLM_F_DUMP_INTR).
    fn request_once(&mut self, request: &mut Request, flags: u16) -> io::Result<(Vec<Reply>, bool)> {
        self.sequence = self.sequence.wrapping_add(1);
        let mut replies = Vec::new();
        let interrupted = wire::exchange(&self.socket, request, flags, self.sequence, |message_type, payload| {
            replies.push(Reply { message_type, data: payload.to_vec() })
        })?;
        Ok((replies, interrupted))
    }
}

/// At most this many requests, or about this many bytes, go in one datagram of [`Netlink::batch`].
const BATCH_MESSAGES: u32 = 256;
const BATCH_BYTES: usize = 32 * 1024;

/// Notifications of changes (links, addresses, routes, neighbours), see [`Netlink::events`].
pub struct Events {
    socket: Socket,
}

/// One notification.
#[derive(Debug, Clone)]
pub enum Event {
    /// A message: `RTM_NEWROUTE`, `RTM_DELNEIGH`, ... and its payload.
    Message(Reply),
    /// The kernel dropped notifications (the receive buffer overflowed, ENOBUFS): the state must be read again.
    Lost,
}

impl Events {
    /// Waits for the next datagram of notifications.
    pub fn recv(&self) -> io::Result<Vec<Event>> {
        match self.socket.recv_from_full() {
            Ok((datagram, _)) => Ok(wire::split_datagram(&datagram)?
                .into_iter()
                .filter_map(|message| match message.received {
                    wire::Received::Message { message_type, payload } => {
                        Some(Event::Message(Reply { message_type, data: payload.to_vec() }))
                    }
                    _ => None,
                })
                .collect()),
            Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => Ok(vec![Event::Lost]),
            Err(e) => Err(e),
        }
    }

    /// Like [`Events::recv`] but gives up after `timeout` (an empty list).
    pub fn recv_timeout(&self, timeout: Duration) -> io::Result<Vec<Event>> {
        if wait_readable(self.socket.as_raw_fd(), timeout)? {
            self.recv()
        } else {
            Ok(Vec::new())
        }
    }
}

/// Opens a NETLINK_ROUTE socket in the current namespace, joined to `groups` (`RTNLGRP_*` numbers).
fn open_socket(groups: &[u32]) -> io::Result<Socket> {
    let mut socket = Socket::new(NETLINK_ROUTE)?;
    socket.bind_auto()?;
    // The kernel's reason with a refusal (see `refusal`), and only the header of the refused request echoed;
    // a kernel without these options (before 4.12) answers with the errno alone, as before.
    let _ = socket.set_ext_ack(true);
    let _ = socket.set_cap_ack(true);
    for &group in groups {
        socket.add_membership(group)?;
    }
    Ok(socket)
}

/// Waits up to `timeout` for `fd` to become readable; false on timeout.
fn wait_readable(fd: i32, timeout: Duration) -> io::Result<bool> {
    let mut pollfd = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    // Round up so that a sub-millisecond remainder still waits.
    let millis = timeout.as_millis().saturating_add(1).min(i32::MAX as u128) as i32;
    loop {
        // SAFETY: one valid pollfd for the duration of the call.
        let ready = unsafe { libc::poll(&mut pollfd, 1, millis) };
        if ready >= 0 {
            return Ok(ready > 0);
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}
