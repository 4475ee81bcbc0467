//! Deleting conntrack entries over netlink (NETLINK_NETFILTER, ctnetlink), in the calling thread's namespace.
//!
//! Used after adding UDP port mappings: a UDP "connection" tracked before the DNAT rule existed would keep
//! bypassing it (containernetworking/plugins `DeleteConntrackEntriesForDstPort`). The table is dumped once
//! and the matching entries are deleted by their original tuple.

use std::io;

use netlink_packet_core::NLM_F_DUMP;
use netlink_sys::{protocols::NETLINK_NETFILTER, Socket};

use super::Family;
use crate::netlink::wire::{self, Request};

const NFNL_SUBSYS_CTNETLINK: u16 = 1;
const IPCTNL_MSG_CT_GET: u16 = 1;
const IPCTNL_MSG_CT_DELETE: u16 = 2;

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
    // The table is dumped once, keeping the identity (original tuple and zone) of each matching entry.
    let mut victims = Vec::new();
    let mut dump = request(IPCTNL_MSG_CT_GET, nfgen_family, &[]);
    wire::exchange(&socket, &mut dump, NLM_F_DUMP, 1, |_, payload| {
        // The payload starts with the 4-byte nfgenmsg.
        if let Some(identity) = matching_entry(payload.get(4..).unwrap_or_default(), protocol, ports) {
            victims.push(identity);
        }
    })?;
    let mut deleted = 0;
    for (index, identity) in victims.iter().enumerate() {
        let mut delete = request(IPCTNL_MSG_CT_DELETE, nfgen_family, identity);
        match wire::exchange(&socket, &mut delete, 0, 1000 + index as u32, |_, _| {}) {
            Ok(_) => deleted += 1,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(deleted)
}

/// A ctnetlink request: nfgenmsg (family, version NFNETLINK_V0, resource id 0), then `attributes`.
fn request(kind: u16, family: u8, attributes: &[u8]) -> Request {
    let mut request = Request::new((NFNL_SUBSYS_CTNETLINK << 8) | kind, &[family, 0, 0, 0]);
    request.bytes(attributes);
    request
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

/// The attributes in `buf` as (type without flags, whole attribute, value). Unlike `wire::attributes`, each
/// comes with its raw bytes, flags included: the identity of an entry is sent back to the kernel as received.
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
        let proto = [
            attribute(CTA_PROTO_NUM, &[17]),
            attribute(2, &1234u16.to_be_bytes()),
            attribute(CTA_PROTO_DST_PORT, &53u16.to_be_bytes()),
        ]
        .concat();
        let tuple = [attribute(1, &[0; 12]), attribute(CTA_TUPLE_PROTO | 0x8000, &proto)].concat();
        let entry = [attribute(CTA_TUPLE_ORIG | 0x8000, &tuple), attribute(CTA_ZONE, &[0, 0])].concat();
        let identity = matching_entry(&entry, PROTO_UDP, &[53]).expect("matches");
        assert_eq!(identity, entry);
        assert!(matching_entry(&entry, PROTO_TCP, &[53]).is_none());
        assert!(matching_entry(&entry, PROTO_UDP, &[54]).is_none());
        assert!(matching_entry(&[1, 2], PROTO_UDP, &[53]).is_none());
    }
}
