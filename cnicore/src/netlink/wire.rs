//! The netlink wire format by hand: building a request (`nlmsghdr`, the family's fixed header, attributes,
//! nested ones too), splitting received datagrams into messages, and walking attributes.
//!
//! Why by hand: netlink-packet-route parses and emits whole message enums, which links the parser of every
//! kind of link, route, tc filter and action into every binary (several hundred KiB). Each typed helper here
//! builds only its own request and reads only the attributes it needs.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use netlink_packet_core::{Emitable, NLM_F_ACK, NLM_F_DUMP_INTR, NLM_F_REQUEST};
use netlink_sys::{Socket, SocketAddr};

/// Size of `struct nlmsghdr`.
pub(crate) const NLMSG_HDRLEN: usize = 16;
/// Size of `struct nlattr`.
const NLA_HDRLEN: usize = 4;
/// Flag bit of an attribute type that says its payload is nested attributes.
pub const NLA_F_NESTED: u16 = 0x8000;
/// The bits of an attribute type that are flags rather than the type.
const NLA_FLAGS: u16 = 0xC000;

const NLMSG_NOOP: u16 = 1;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLMSG_OVERRUN: u16 = 4;

/// Netlink lengths are padded to 4 bytes.
pub(crate) const fn align(len: usize) -> usize {
    (len + 3) & !3
}

/// One request message being built: the header is completed when it is sent.
#[derive(Debug, Clone)]
pub struct Request {
    buf: Vec<u8>,
}

/// Where a nested attribute started, to close it with [`Request::end_nested`].
#[must_use]
pub struct Nest(usize);

impl Request {
    /// A message of type `message_type` (`RTM_*`) whose payload starts with the fixed family header
    /// `header` (e.g. the 16 bytes of `struct ifinfomsg`).
    pub fn new(message_type: u16, header: &[u8]) -> Request {
        let mut buf = Vec::with_capacity(128);
        buf.extend_from_slice(&[0; 4]); // length: see `finish`
        buf.extend_from_slice(&message_type.to_ne_bytes());
        buf.extend_from_slice(&[0; 10]); // flags, sequence number, port id: see `finish`
        buf.extend_from_slice(header);
        buf.resize(align(buf.len()), 0);
        Request { buf }
    }

    /// Appends an attribute (type, payload, padding).
    pub fn attr(&mut self, kind: u16, value: &[u8]) -> &mut Request {
        let len = NLA_HDRLEN + value.len();
        self.buf.extend_from_slice(&(len as u16).to_ne_bytes());
        self.buf.extend_from_slice(&kind.to_ne_bytes());
        self.buf.extend_from_slice(value);
        self.buf.resize(align(self.buf.len()), 0);
        self
    }

    pub fn attr_u8(&mut self, kind: u16, value: u8) -> &mut Request {
        self.attr(kind, &[value])
    }

    pub fn attr_u32(&mut self, kind: u16, value: u32) -> &mut Request {
        self.attr(kind, &value.to_ne_bytes())
    }

    /// A NUL-terminated string attribute.
    pub fn attr_str(&mut self, kind: u16, value: &str) -> &mut Request {
        let len = NLA_HDRLEN + value.len() + 1;
        self.buf.extend_from_slice(&(len as u16).to_ne_bytes());
        self.buf.extend_from_slice(&kind.to_ne_bytes());
        self.buf.extend_from_slice(value.as_bytes());
        self.buf.push(0);
        self.buf.resize(align(self.buf.len()), 0);
        self
    }

    /// An address attribute: 4 bytes for IPv4, 16 for IPv6.
    pub fn attr_ip(&mut self, kind: u16, ip: IpAddr) -> &mut Request {
        match ip {
            IpAddr::V4(ip) => self.attr(kind, &ip.octets()),
            IpAddr::V6(ip) => self.attr(kind, &ip.octets()),
        }
    }

    /// Opens a nested attribute: everything appended until [`Request::end_nested`] goes inside. `kind`
    /// is sent as given (add [`NLA_F_NESTED`] where the kernel wants it).
    pub fn begin_nested(&mut self, kind: u16) -> Nest {
        let start = self.buf.len();
        self.buf.extend_from_slice(&[0, 0]);
        self.buf.extend_from_slice(&kind.to_ne_bytes());
        Nest(start)
    }

    pub fn end_nested(&mut self, nest: Nest) {
        let len = (self.buf.len() - nest.0) as u16;
        self.buf[nest.0..nest.0 + 2].copy_from_slice(&len.to_ne_bytes());
    }

    /// Appends raw bytes (e.g. a fixed header inside a nested attribute), padded.
    pub fn bytes(&mut self, bytes: &[u8]) -> &mut Request {
        self.buf.extend_from_slice(bytes);
        self.buf.resize(align(self.buf.len()), 0);
        self
    }

    /// Appends anything netlink-packet-* can emit (an attribute, or a whole message payload).
    pub fn emit(&mut self, value: &impl Emitable) -> &mut Request {
        let start = self.buf.len();
        self.buf.resize(start + value.buffer_len(), 0);
        value.emit(&mut self.buf[start..]);
        self.buf.resize(align(self.buf.len()), 0);
        self
    }

    /// The message to send, with its length, flags and sequence number filled in.
    pub(crate) fn finish(&mut self, flags: u16, sequence: u32) -> &[u8] {
        let len = self.buf.len() as u32;
        self.buf[0..4].copy_from_slice(&len.to_ne_bytes());
        self.buf[6..8].copy_from_slice(&flags.to_ne_bytes());
        self.buf[8..12].copy_from_slice(&sequence.to_ne_bytes());
        &self.buf
    }

    /// The payload (family header and attributes), for tests.
    #[cfg(test)]
    pub(crate) fn payload(&self) -> &[u8] {
        &self.buf[NLMSG_HDRLEN..]
    }
}

/// A message the kernel answered with (not an ACK, error or end of dump).
#[derive(Debug, Clone)]
pub struct Reply {
    /// `RTM_*` type.
    pub message_type: u16,
    /// The payload: family header and attributes.
    pub data: Vec<u8>,
}

/// What one received netlink message means for the request it answers.
pub(crate) enum Received<'a> {
    /// A message of the answer.
    Message { message_type: u16, payload: &'a [u8] },
    /// The end: an ACK or the end of a dump.
    End,
    /// The kernel refused the request.
    Failed(io::Error),
    /// Ignored (NLMSG_NOOP).
    Nothing,
}

/// The fields of an `nlmsghdr` the client looks at, and what the message says.
pub(crate) struct Incoming<'a> {
    pub flags: u16,
    pub sequence: u32,
    pub received: Received<'a>,
}

fn invalid(message: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message.to_string())
}

fn i32_at(payload: &[u8]) -> Option<i32> {
    Some(i32::from_ne_bytes(payload.get(..4)?.try_into().ok()?))
}

/// Splits one received datagram into its messages.
pub(crate) fn split_datagram(datagram: &[u8]) -> io::Result<Vec<Incoming<'_>>> {
    let mut messages = Vec::new();
    let mut rest = datagram;
    while rest.len() >= NLMSG_HDRLEN {
        let length = u32::from_ne_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        if length < NLMSG_HDRLEN || length > rest.len() {
            return Err(invalid("truncated netlink message"));
        }
        let message_type = u16::from_ne_bytes([rest[4], rest[5]]);
        let flags = u16::from_ne_bytes([rest[6], rest[7]]);
        let sequence = u32::from_ne_bytes([rest[8], rest[9], rest[10], rest[11]]);
        let payload = &rest[NLMSG_HDRLEN..length];
        let received = match message_type {
            NLMSG_NOOP => Received::Nothing,
            // An error message holds the errno (negative, 0 for an ACK) and the request it answers.
            NLMSG_ERROR => match i32_at(payload) {
                None => return Err(invalid("truncated netlink error message")),
                Some(0) => Received::End,
                Some(code) => {
                    super::refusal::record(extended_ack_message(flags, payload));
                    Received::Failed(io::Error::from_raw_os_error(-code))
                }
            },
            // The kernel may send an NLMSG_DONE without its error code.
            NLMSG_DONE => match i32_at(payload).unwrap_or(0) {
                code if code < 0 => Received::Failed(io::Error::from_raw_os_error(-code)),
                _ => Received::End,
            },
            NLMSG_OVERRUN => Received::Failed(io::Error::other("netlink overrun")),
            _ => Received::Message { message_type, payload },
        };
        messages.push(Incoming { flags, sequence, received });
        rest = &rest[align(length).min(rest.len())..];
    }
    Ok(messages)
}

/// Sends `request` on `socket` with `NLM_F_REQUEST | NLM_F_ACK | flags` and hands every message of the answer
/// (type, payload) to `on_message`, until the ACK or the end of the dump. A negative answer becomes the
/// kernel's errno. Returns true when the kernel marked the dump as interrupted (`NLM_F_DUMP_INTR`). Messages
/// with another sequence number (answers to earlier requests, events) are skipped.
pub(crate) fn exchange(
    socket: &Socket,
    request: &mut Request,
    flags: u16,
    sequence: u32,
    mut on_message: impl FnMut(u16, &[u8]),
) -> io::Result<bool> {
    socket.send_to(request.finish(NLM_F_REQUEST | NLM_F_ACK | flags, sequence), &SocketAddr::new(0, 0), 0)?;
    let mut interrupted = false;
    loop {
        let (datagram, _) = socket.recv_from_full()?;
        for message in split_datagram(&datagram)? {
            if message.sequence != sequence {
                continue;
            }
            if message.flags & NLM_F_DUMP_INTR != 0 {
                interrupted = true;
            }
            match message.received {
                Received::Message { message_type, payload } => on_message(message_type, payload),
                // Dumps end with NLMSG_DONE, everything else with the ACK (also after a single answer).
                Received::End => return Ok(interrupted),
                Received::Failed(e) => return Err(e),
                Received::Nothing => {}
            }
        }
    }
}

/// The attributes in `data` as (type without flag bits, payload); stops at the first malformed one.
pub fn attributes(data: &[u8]) -> Attributes<'_> {
    Attributes { rest: data }
}

pub struct Attributes<'a> {
    rest: &'a [u8],
}

impl<'a> Iterator for Attributes<'a> {
    type Item = (u16, &'a [u8]);

    fn next(&mut self) -> Option<(u16, &'a [u8])> {
        let rest = self.rest;
        if rest.len() < NLA_HDRLEN {
            return None;
        }
        let len = usize::from(u16::from_ne_bytes([rest[0], rest[1]]));
        if len < NLA_HDRLEN || len > rest.len() {
            self.rest = &[];
            return None;
        }
        let kind = u16::from_ne_bytes([rest[2], rest[3]]) & !NLA_FLAGS;
        self.rest = &rest[align(len).min(rest.len())..];
        Some((kind, &rest[NLA_HDRLEN..len]))
    }
}

/// A `u8` attribute payload.
pub fn as_u8(value: &[u8]) -> Option<u8> {
    match value {
        [byte] => Some(*byte),
        _ => None,
    }
}

/// A `u16` attribute payload (host order).
pub fn as_u16(value: &[u8]) -> Option<u16> {
    Some(u16::from_ne_bytes(value.try_into().ok()?))
}

/// A `u32` attribute payload (host order).
pub fn as_u32(value: &[u8]) -> Option<u32> {
    Some(u32::from_ne_bytes(value.try_into().ok()?))
}

/// The host-order `u32` at `offset` of a fixed-size structure.
pub fn u32_at(data: &[u8], offset: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(data.get(offset..offset + 4)?.try_into().ok()?))
}

/// A string attribute payload (NUL-terminated or not).
pub fn as_string(value: &[u8]) -> String {
    let end = value.iter().position(|&b| b == 0).unwrap_or(value.len());
    String::from_utf8_lossy(&value[..end]).into_owned()
}

/// An address attribute payload of the given family (4 or 16 bytes).
pub fn as_ip(value: &[u8], v6: bool) -> Option<IpAddr> {
    if v6 {
        let octets: [u8; 16] = value.try_into().ok()?;
        Some(IpAddr::V6(Ipv6Addr::from(octets)))
    } else {
        let octets: [u8; 4] = value.try_into().ok()?;
        Some(IpAddr::V4(Ipv4Addr::from(octets)))
    }
}

/// What netlink-packet-* emits for `value`: the reference the hand-built requests are tested against.
#[cfg(test)]
pub(crate) fn emitted(value: &impl Emitable) -> Vec<u8> {
    let mut buf = vec![0; value.buffer_len()];
    value.emit(&mut buf);
    buf
}

/// `NLMSGERR_ATTR_MSG`: the extended ACK's message (a NUL-terminated string).
const NLMSGERR_ATTR_MSG: u16 = 1;
/// `NLM_F_CAPPED`: the error message echoes only the request's header.
const NLM_F_CAPPED: u16 = 0x100;
/// `NLM_F_ACK_TLVS`: extended ACK attributes follow the echoed request.
const NLM_F_ACK_TLVS: u16 = 0x200;

/// The extended ACK's message of an `NLMSG_ERROR` (`payload`: errno, echoed request, attributes; `flags`: its
/// header's), if the kernel gave one.
fn extended_ack_message(flags: u16, payload: &[u8]) -> Option<String> {
    if flags & NLM_F_ACK_TLVS == 0 {
        return None;
    }
    let echoed = payload.get(4..)?;
    let echoed_len = u32::from_ne_bytes(echoed.get(..4)?.try_into().ok()?) as usize;
    let skip = if flags & NLM_F_CAPPED != 0 { NLMSG_HDRLEN } else { align(echoed_len) };
    let mut attrs = echoed.get(skip..)?;
    while attrs.len() >= 4 {
        let len = u16::from_ne_bytes([attrs[0], attrs[1]]) as usize;
        let kind = u16::from_ne_bytes([attrs[2], attrs[3]]) & 0x3fff;
        let value = attrs.get(4..len.max(4))?;
        if kind == NLMSGERR_ATTR_MSG {
            let text = value.split(|&b| b == 0).next().unwrap_or_default();
            let text = String::from_utf8_lossy(text).trim().to_string();
            return (!text.is_empty()).then_some(text);
        }
        attrs = attrs.get(align(len.max(4)).min(attrs.len())..)?;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error_payload(flags_capped: bool, message: &str) -> Vec<u8> {
        let mut payload = (-libc::EEXIST).to_ne_bytes().to_vec();
        let echoed_len: u32 = if flags_capped { 16 } else { 24 };
        payload.extend_from_slice(&echoed_len.to_ne_bytes());
        payload.extend_from_slice(&[0; 12]);
        if !flags_capped {
            payload.extend_from_slice(&[7; 8]);
        }
        let text = [message.as_bytes(), &[0]].concat();
        payload.extend_from_slice(&((4 + text.len()) as u16).to_ne_bytes());
        payload.extend_from_slice(&NLMSGERR_ATTR_MSG.to_ne_bytes());
        payload.extend_from_slice(&text);
        payload.resize(align(payload.len()), 0);
        payload
    }

    #[test]
    fn reads_the_extended_ack_message_capped_or_not() {
        let capped = error_payload(true, "VLAN device already exists");
        let message = extended_ack_message(NLM_F_ACK_TLVS | NLM_F_CAPPED, &capped);
        assert_eq!(message.as_deref(), Some("VLAN device already exists"));
        let full = error_payload(false, "Unknown device type");
        assert_eq!(extended_ack_message(NLM_F_ACK_TLVS, &full).as_deref(), Some("Unknown device type"));
        assert_eq!(extended_ack_message(0, &full), None);
        assert_eq!(extended_ack_message(NLM_F_ACK_TLVS, &full[..10]), None);
    }

    #[test]
    fn nested_attributes_round_trip() {
        let mut request = Request::new(16, &[1, 2, 3]);
        request.attr_str(3, "eth0");
        let nest = request.begin_nested(18 | NLA_F_NESTED);
        request.attr_u32(1, 7).attr_u8(2, 1);
        request.end_nested(nest);
        let payload = request.payload();
        assert_eq!(&payload[..4], &[1, 2, 3, 0]);
        let attrs: Vec<_> = attributes(&payload[4..]).collect();
        assert_eq!(attrs.len(), 2);
        assert_eq!((attrs[0].0, as_string(attrs[0].1).as_str()), (3, "eth0"));
        assert_eq!(attrs[1].0, 18);
        let inner: Vec<_> = attributes(attrs[1].1).collect();
        assert_eq!(inner, vec![(1, &7u32.to_ne_bytes()[..]), (2, &[1u8][..])]);
        let sent = request.finish(5, 9).to_vec();
        assert_eq!(u32::from_ne_bytes(sent[0..4].try_into().unwrap()) as usize, sent.len());
        assert_eq!(u16::from_ne_bytes([sent[6], sent[7]]), 5);
    }

    #[test]
    fn malformed_attributes_stop_the_walk() {
        assert_eq!(attributes(&[8, 0, 1, 0, 0]).count(), 0);
        assert_eq!(attributes(&[2, 0, 1, 0]).count(), 0);
    }

    #[test]
    fn error_and_done_messages() {
        let mut datagram = Vec::new();
        for (kind, code) in [(NLMSG_ERROR, -17i32), (NLMSG_DONE, 0)] {
            datagram.extend_from_slice(&20u32.to_ne_bytes());
            datagram.extend_from_slice(&kind.to_ne_bytes());
            datagram.extend_from_slice(&[0; 10]);
            datagram.extend_from_slice(&code.to_ne_bytes());
        }
        let messages = split_datagram(&datagram).unwrap();
        assert!(matches!(&messages[0].received, Received::Failed(e) if e.raw_os_error() == Some(17)));
        assert!(matches!(messages[1].received, Received::End));
        assert!(split_datagram(&datagram[..19]).is_err());
    }
}
