//! Deleting conntrack entries over netlink (NETLINK_NETFILTER, ctnetlink), in the calling thread's namespace.
//!
//! Used after adding UDP port mappings: a UDP "connection" tracked before the DNAT rule existed would keep
//! bypassing it (containernetworking/plugins `DeleteConntrackEntriesForDstPort`). The table is dumped once
//! and the matching entries are deleted by their original tuple.

use std::io;

use netlink_sys::{protocols::NETLINK_NETFILTER, Socket, SocketAddr};

use super::Family;

const NFNL_SUBSYS_CTNETLINK: u16 = 1;
const IPCTNL_MSG_CT_GET: u16 = 1;
const IPCTNL_MSG_CT_DELETE: u16 = 2;

const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_DUMP: u16 = 0x300;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLA_TYPE_MASK: u16 = 0x3fff;

const CTA_TUPLE_ORIG: u16 = 1;
const CTA_ZONE: u16 = 18;
const CTA_TUPLE_PROTO: u16 = 2;
const CTA_PROTO_NUM: u16 = 1;
const CTA_PROTO_DST_PORT: u16 = 3;

/// IANA protocol numbers.
pub const PROTO_TCP: u8 = 6;
pub const PROTO_UDP: u8 = 17;
pub const PROTO_SCTP: u8 = 132;

/// Deletes the entries of `family` whose original tuple has protocol `protocol` and destination port in
/// `ports`. Returns how many were deleted. Entries that vanish meanwhile are not an error.
pub fn delete_by_dst_port(family: Family, protocol: u8, ports: &[u16]) -> io::Result<usize> {
    if ports.is_empty() {
        return Ok(0);
    }
    // A dump walks the kernel's whole (global) conntrack hash table, tens of milliseconds on a large one:
    // skip it when this namespace tracks nothing (or conntrack is not even loaded).
    match crate::sysctl::read("net/netfilter/nf_conntrack_count") {
        Ok(count) if count.trim() == "0" => return Ok(0),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
        _ => {}
    }
    let mut socket = Socket::new(NETLINK_NETFILTER)?;
    socket.bind_auto()?;
    let nfgen_family = match family {
        Family::V4 => libc::AF_INET as u8,
        Family::V6 => libc::AF_INET6 as u8,
    };
    let victims = dump_matching(&socket, nfgen_family, protocol, ports)?;
    let mut deleted = 0;
    for (index, attributes) in victims.iter().enumerate() {
        let sequence = 1000 + index as u32;
        let message = message(IPCTNL_MSG_CT_DELETE, NLM_F_REQUEST | NLM_F_ACK, sequence, nfgen_family, attributes);
        socket.send_to(&message, &SocketAddr::new(0, 0), 0)?;
        match wait_ack(&socket, sequence) {
            Ok(()) => deleted += 1,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(deleted)
}

/// A ctnetlink message: nlmsghdr, nfgenmsg, attributes.
fn message(kind: u16, flags: u16, sequence: u32, family: u8, attributes: &[u8]) -> Vec<u8> {
    let length = 16 + 4 + attributes.len();
    let mut buf = Vec::with_capacity(length);
    buf.extend_from_slice(&(length as u32).to_ne_bytes());
    buf.extend_from_slice(&((NFNL_SUBSYS_CTNETLINK << 8) | kind).to_ne_bytes());
    buf.extend_from_slice(&flags.to_ne_bytes());
    buf.extend_from_slice(&sequence.to_ne_bytes());
    buf.extend_from_slice(&0u32.to_ne_bytes());
    // nfgenmsg: family, version (NFNETLINK_V0), resource id (big endian).
    buf.extend_from_slice(&[family, 0, 0, 0]);
    buf.extend_from_slice(attributes);
    buf
}

/// Dumps the table and returns, for each matching entry, the attributes identifying it (the original tuple
/// and the zone, copied as received).
fn dump_matching(socket: &Socket, family: u8, protocol: u8, ports: &[u16]) -> io::Result<Vec<Vec<u8>>> {
    let sequence = 1;
    let request = message(IPCTNL_MSG_CT_GET, NLM_F_REQUEST | NLM_F_DUMP, sequence, family, &[]);
    socket.send_to(&request, &SocketAddr::new(0, 0), 0)?;
    let mut found = Vec::new();
    loop {
        let (datagram, _) = socket.recv_from_full()?;
        for (kind, seq, payload) in messages(&datagram)? {
            if seq != sequence {
                continue;
            }
            match kind {
                NLMSG_DONE => return Ok(found),
                NLMSG_ERROR => {
                    let code = payload.get(..4).map(|b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]])).unwrap_or(0);
                    if code == 0 {
                        return Ok(found);
                    }
                    return Err(io::Error::from_raw_os_error(-code));
                }
                _ => {
                    // Skip nfgenmsg.
                    let attributes = payload.get(4..).unwrap_or_default();
                    if let Some(identity) = matching_entry(attributes, protocol, ports) {
                        found.push(identity);
                    }
                }
            }
        }
    }
}

/// The identifying attributes of an entry if its original tuple matches.
fn matching_entry(attributes: &[u8], protocol: u8, ports: &[u16]) -> Option<Vec<u8>> {
    let mut tuple = None;
    let mut zone = None;
    for (kind, raw, value) in attributes_of(attributes) {
        match kind {
            CTA_TUPLE_ORIG => tuple = Some((raw, value)),
            CTA_ZONE => zone = Some(raw),
            _ => {}
        }
    }
    let (tuple_raw, tuple_value) = tuple?;
    let (_, _, proto) = attributes_of(tuple_value).find(|(kind, _, _)| *kind == CTA_TUPLE_PROTO)?;
    let mut number = None;
    let mut dst_port = None;
    for (kind, _, value) in attributes_of(proto) {
        match kind {
            CTA_PROTO_NUM => number = value.first().copied(),
            CTA_PROTO_DST_PORT if value.len() >= 2 => dst_port = Some(u16::from_be_bytes([value[0], value[1]])),
            _ => {}
        }
    }
    if number != Some(protocol) || !dst_port.is_some_and(|p| ports.contains(&p)) {
        return None;
    }
    let mut identity = padded(tuple_raw);
    if let Some(zone) = zone {
        identity.extend_from_slice(&padded(zone));
    }
    Some(identity)
}

/// An attribute copied with its padding to 4 bytes, ready to be sent again.
fn padded(raw: &[u8]) -> Vec<u8> {
    let mut out = raw.to_vec();
    while !out.len().is_multiple_of(4) {
        out.push(0);
    }
    out
}

/// The attributes in `buf` as (type without flags, whole attribute, value).
fn attributes_of(buf: &[u8]) -> impl Iterator<Item = (u16, &[u8], &[u8])> {
    let mut offset = 0;
    std::iter::from_fn(move || {
        let header = buf.get(offset..offset + 4)?;
        let length = u16::from_ne_bytes([header[0], header[1]]) as usize;
        let kind = u16::from_ne_bytes([header[2], header[3]]) & NLA_TYPE_MASK;
        if length < 4 {
            return None;
        }
        let raw = buf.get(offset..offset + length)?;
        offset += (length + 3) & !3;
        Some((kind, raw, &raw[4..]))
    })
}

/// The netlink messages of a datagram as (type, sequence, payload).
fn messages(datagram: &[u8]) -> io::Result<Vec<(u16, u32, &[u8])>> {
    let mut out = Vec::new();
    let mut offset = 0;
    while offset + 16 <= datagram.len() {
        let header = &datagram[offset..offset + 16];
        let length = u32::from_ne_bytes([header[0], header[1], header[2], header[3]]) as usize;
        if length < 16 || offset + length > datagram.len() {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "truncated netlink message"));
        }
        let kind = u16::from_ne_bytes([header[4], header[5]]);
        let sequence = u32::from_ne_bytes([header[8], header[9], header[10], header[11]]);
        out.push((kind, sequence, &datagram[offset + 16..offset + length]));
        offset += (length + 3) & !3;
    }
    Ok(out)
}

fn wait_ack(socket: &Socket, sequence: u32) -> io::Result<()> {
    loop {
        let (datagram, _) = socket.recv_from_full()?;
        for (kind, seq, payload) in messages(&datagram)? {
            if seq != sequence || kind != NLMSG_ERROR {
                continue;
            }
            let code = payload.get(..4).map(|b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]])).unwrap_or(0);
            return if code == 0 { Ok(()) } else { Err(io::Error::from_raw_os_error(-code)) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attribute(kind: u16, value: &[u8]) -> Vec<u8> {
        let mut out = ((4 + value.len()) as u16).to_ne_bytes().to_vec();
        out.extend_from_slice(&kind.to_ne_bytes());
        out.extend_from_slice(value);
        padded(&out)
    }

    #[test]
    fn matches_original_tuple() {
        let proto = [attribute(CTA_PROTO_NUM, &[17]), attribute(2, &1234u16.to_be_bytes()), attribute(CTA_PROTO_DST_PORT, &53u16.to_be_bytes())].concat();
        let tuple = [attribute(1, &[0; 12]), attribute(CTA_TUPLE_PROTO | 0x8000, &proto)].concat();
        let entry = [attribute(CTA_TUPLE_ORIG | 0x8000, &tuple), attribute(CTA_ZONE, &[0, 0])].concat();
        let identity = matching_entry(&entry, PROTO_UDP, &[53]).expect("matches");
        assert_eq!(identity, entry);
        assert!(matching_entry(&entry, PROTO_TCP, &[53]).is_none());
        assert!(matching_entry(&entry, PROTO_UDP, &[54]).is_none());
        assert!(matching_entry(&[1, 2], PROTO_UDP, &[53]).is_none());
    }
}
