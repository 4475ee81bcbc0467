//! VRF devices (`ip link add <name> type vrf table <id>`): created, and listed with their routing tables.
//! Kernels without `CONFIG_NET_VRF` refuse the kind with EOPNOTSUPP.

use std::io;

use super::link::{link_request, new_link_request, split_link_message, Link};
use super::wire::{self, attributes, Request};
use super::Netlink;

const IFLA_VRF_TABLE: u16 = 1;

/// The routing table in the `IFLA_INFO_DATA` of a vrf link message, if it is a vrf.
fn table_of_link_message(data: &[u8]) -> Option<u32> {
    let (_, _, attrs) = split_link_message(data)?;
    let info = attributes(attrs).find(|(kind, _)| *kind == libc::IFLA_LINKINFO)?.1;
    let mut is_vrf = false;
    for (kind, value) in attributes(info) {
        match kind {
            libc::IFLA_INFO_KIND => is_vrf = wire::as_string(value) == "vrf",
            libc::IFLA_INFO_DATA if is_vrf => {
                return attributes(value).find(|(k, _)| *k == IFLA_VRF_TABLE).and_then(|(_, v)| wire::as_u32(v))
            }
            _ => {}
        }
    }
    None
}

/// The `RTM_NEWLINK` creating VRF `name` bound to routing table `table`.
fn vrf_request(name: &str, table: u32) -> Request {
    new_link_request(
        name,
        None,
        false,
        "vrf",
        Some(&|request: &mut Request| {
            request.attr_u32(IFLA_VRF_TABLE, table);
        }),
    )
}

impl Netlink {
    /// Creates VRF `name` on routing table `table` (down). EOPNOTSUPP when the kernel has no VRF support.
    pub fn create_vrf(&mut self, name: &str, table: u32) -> io::Result<Link> {
        self.create(vrf_request(name, table), name)
    }

    /// Every VRF of the namespace with its routing table.
    pub fn vrfs(&mut self) -> io::Result<Vec<(Link, u32)>> {
        let mut request = link_request(libc::RTM_GETLINK, 0, 0);
        self.dump(&mut request, libc::RTM_NEWLINK, |data| Some((Link::parse(data)?.0, table_of_link_message(data)?)))
    }
}

#[cfg(test)]
mod tests {
    use netlink_packet_route::link::{InfoData, InfoKind, InfoVrf, LinkAttribute, LinkInfo, LinkMessage};

    use super::*;
    use crate::netlink::wire::emitted;

    fn reference(name: &str, table: u32) -> LinkMessage {
        let mut message = LinkMessage::default();
        message.attributes = vec![
            LinkAttribute::IfName(name.into()),
            LinkAttribute::LinkInfo(vec![
                LinkInfo::Kind(InfoKind::Vrf),
                LinkInfo::Data(InfoData::Vrf(vec![InfoVrf::TableId(table)])),
            ]),
        ];
        message
    }

    #[test]
    fn creation_request() {
        for (name, table) in [("vrf-blue", 1), ("red", 4_000_000)] {
            assert_eq!(vrf_request(name, table).payload(), emitted(&reference(name, table)), "{name}");
        }
    }

    #[test]
    fn parses_the_table() {
        assert_eq!(table_of_link_message(&emitted(&reference("vrf-blue", 42))), Some(42));
        let mut bridge = LinkMessage::default();
        bridge.attributes = vec![LinkAttribute::LinkInfo(vec![LinkInfo::Kind(InfoKind::Bridge)])];
        assert_eq!(table_of_link_message(&emitted(&bridge)), None);
    }
}
