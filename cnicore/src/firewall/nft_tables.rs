//! Which nf_tables tables exist, asked over netlink (NETLINK_NETFILTER, one `NFT_MSG_GETTABLE` dump) in the
//! calling thread's namespace: what DEL needs to know before running `nft` at all. On a node that never had a
//! table of ours or the reference's nftables backends, DEL then runs no `nft` process (an exec and
//! libnftables' cache fetch each, milliseconds; a dump is one netlink round trip).

use std::io;

use netlink_packet_core::NLM_F_DUMP;
use netlink_sys::{protocols::NETLINK_NETFILTER, Socket};

use crate::netlink::wire::{self, Request};

const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFT_MSG_NEWTABLE: u16 = 0;
const NFT_MSG_GETTABLE: u16 = 1;
const NFTA_TABLE_NAME: u16 = 1;

/// Every table of the namespace as (family as `nft` names it, name).
pub fn tables() -> io::Result<Vec<(String, String)>> {
    let mut socket = Socket::new(NETLINK_NETFILTER)?;
    socket.bind_auto()?;
    let mut found = Vec::new();
    wire::exchange(&socket, &mut dump_request(), NLM_F_DUMP, 1, |message_type, payload| {
        if let Some(table) = parse_table(message_type, payload) {
            found.push(table);
        }
    })?;
    Ok(found)
}

/// True when `family name` exists. An error (no nf_tables in this kernel, say) is the caller's to judge.
pub fn exists(family: &str, name: &str) -> io::Result<bool> {
    Ok(tables()?.iter().any(|(f, n)| f == family && n == name))
}

/// `NFT_MSG_GETTABLE` of every family: nfgenmsg (AF_UNSPEC, NFNETLINK_V0, resource id 0), no attributes.
fn dump_request() -> Request {
    Request::new((NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_GETTABLE, &[0, 0, 0, 0])
}

/// A table of the dump: (family, name).
fn parse_table(message_type: u16, payload: &[u8]) -> Option<(String, String)> {
    if message_type != (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWTABLE {
        return None;
    }
    let family = family_name(*payload.first()?)?;
    let name = wire::attributes(payload.get(4..)?).find(|(kind, _)| *kind == NFTA_TABLE_NAME)?.1;
    Some((family.to_string(), wire::as_string(name)))
}

/// The `NFPROTO_*` families as `nft` spells them.
fn family_name(family: u8) -> Option<&'static str> {
    Some(match family {
        1 => "inet",
        2 => "ip",
        3 => "arp",
        5 => "netdev",
        7 => "bridge",
        10 => "ip6",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dump_request_bytes() {
        let mut request = dump_request();
        let flags = netlink_packet_core::NLM_F_REQUEST | netlink_packet_core::NLM_F_ACK | NLM_F_DUMP;
        let bytes = request.finish(flags, 7).to_vec();
        let mut expected = Vec::new();
        expected.extend_from_slice(&20u32.to_ne_bytes()); // length
        expected.extend_from_slice(&0x0a01u16.to_ne_bytes()); // NFNL_SUBSYS_NFTABLES << 8 | NFT_MSG_GETTABLE
        expected.extend_from_slice(&0x0305u16.to_ne_bytes()); // REQUEST | ACK | DUMP
        expected.extend_from_slice(&7u32.to_ne_bytes()); // sequence
        expected.extend_from_slice(&0u32.to_ne_bytes()); // port
        expected.extend_from_slice(&[0, 0, 0, 0]); // AF_UNSPEC, NFNETLINK_V0, resource id 0
        assert_eq!(bytes, expected);
    }

    #[test]
    fn parses_tables_of_the_dump() {
        // nfgenmsg (inet), NFTA_TABLE_NAME "cni_ipmasq", NFTA_TABLE_FLAGS 0.
        let mut payload = vec![1, 0, 0, 0];
        payload.extend_from_slice(&15u16.to_ne_bytes());
        payload.extend_from_slice(&NFTA_TABLE_NAME.to_ne_bytes());
        payload.extend_from_slice(b"cni_ipmasq\0\0");
        payload.extend_from_slice(&8u16.to_ne_bytes());
        payload.extend_from_slice(&2u16.to_ne_bytes());
        payload.extend_from_slice(&0u32.to_ne_bytes());
        let table = parse_table(0x0a00, &payload);
        assert_eq!(table, Some(("inet".to_string(), "cni_ipmasq".to_string())));
        payload[0] = 10;
        assert_eq!(parse_table(0x0a00, &payload).map(|t| t.0), Some("ip6".to_string()));
        assert_eq!(parse_table(0x0a03, &payload), None, "a chain, not a table");
        payload[0] = 99;
        assert_eq!(parse_table(0x0a00, &payload), None, "an unknown family");
    }
}
