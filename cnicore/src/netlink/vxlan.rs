//! VXLAN devices: creating one (`ip link add ... type vxlan`) and reading its settings back, so that a
//! device whose settings drifted can be told apart from the one wanted.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::link::{new_link_request, split_link_message, Link};
use super::wire::{self, attributes, Request};
use super::Netlink;

const IFLA_VXLAN_ID: u16 = 1;
const IFLA_VXLAN_LINK: u16 = 3;
const IFLA_VXLAN_LOCAL: u16 = 4;
const IFLA_VXLAN_LEARNING: u16 = 7;
const IFLA_VXLAN_PORT: u16 = 15;
const IFLA_VXLAN_LOCAL6: u16 = 17;
/// A flag attribute (no payload): present means on.
const IFLA_VXLAN_GBP: u16 = 23;

/// The settings of a VXLAN device that a node agent cares about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Vxlan {
    /// VXLAN network identifier.
    pub vni: u32,
    /// Local tunnel endpoint address (source of the encapsulated packets): an IPv4 or an IPv6 underlay.
    pub local: Option<IpAddr>,
    /// Index of the underlay link the tunnel is bound to.
    pub link: Option<u32>,
    /// UDP destination port (the kernel's default is 8472, Linux's historical port, which flannel uses).
    pub port: u16,
    /// Learn remote MACs from received packets; off when the FDB is programmed.
    pub learning: bool,
    /// Group Based Policy extension (the kernel cannot change it on a live device).
    pub gbp: bool,
}

impl Vxlan {
    fn add_data(&self, request: &mut Request) {
        request.attr_u32(IFLA_VXLAN_ID, self.vni);
        if let Some(link) = self.link {
            request.attr_u32(IFLA_VXLAN_LINK, link);
        }
        match self.local {
            Some(IpAddr::V4(local)) => {
                request.attr(IFLA_VXLAN_LOCAL, &local.octets());
            }
            Some(IpAddr::V6(local)) => {
                request.attr(IFLA_VXLAN_LOCAL6, &local.octets());
            }
            None => {}
        }
        request.attr_u8(IFLA_VXLAN_LEARNING, u8::from(self.learning));
        // The port is in network byte order.
        request.attr(IFLA_VXLAN_PORT, &self.port.to_be_bytes());
        if self.gbp {
            request.attr(IFLA_VXLAN_GBP, &[]);
        }
    }

    /// The settings in the `IFLA_INFO_DATA` of a vxlan link message.
    fn parse(data: &[u8]) -> Vxlan {
        let mut vxlan = Vxlan { vni: 0, local: None, link: None, port: 0, learning: true, gbp: false };
        for (kind, value) in attributes(data) {
            match kind {
                IFLA_VXLAN_ID => vxlan.vni = wire::as_u32(value).unwrap_or(0),
                IFLA_VXLAN_LINK => vxlan.link = wire::as_u32(value),
                IFLA_VXLAN_LOCAL => vxlan.local = <[u8; 4]>::try_from(value).ok().map(|v| Ipv4Addr::from(v).into()),
                IFLA_VXLAN_LOCAL6 => vxlan.local = <[u8; 16]>::try_from(value).ok().map(|v| Ipv6Addr::from(v).into()),
                IFLA_VXLAN_LEARNING => vxlan.learning = wire::as_u8(value).is_some_and(|v| v > 0),
                IFLA_VXLAN_PORT => vxlan.port = <[u8; 2]>::try_from(value).map(u16::from_be_bytes).unwrap_or(0),
                IFLA_VXLAN_GBP => vxlan.gbp = true,
                _ => {}
            }
        }
        vxlan
    }

    /// The vxlan settings of an `RTM_NEWLINK` payload, if it is a vxlan link.
    fn of_link_message(data: &[u8]) -> Option<Vxlan> {
        let (_, _, attrs) = split_link_message(data)?;
        let info = attributes(attrs).find(|(kind, _)| *kind == libc::IFLA_LINKINFO)?.1;
        let mut is_vxlan = false;
        for (kind, value) in attributes(info) {
            match kind {
                libc::IFLA_INFO_KIND => is_vxlan = wire::as_string(value) == "vxlan",
                libc::IFLA_INFO_DATA if is_vxlan => return Some(Vxlan::parse(value)),
                _ => {}
            }
        }
        None
    }
}

fn vxlan_request(name: &str, mtu: Option<u32>, vxlan: &Vxlan) -> Request {
    new_link_request(name, mtu, false, "vxlan", Some(&|request: &mut Request| vxlan.add_data(request)))
}

impl Netlink {
    /// Creates a vxlan device (down; EEXIST if the name is taken).
    pub fn create_vxlan(&mut self, name: &str, mtu: Option<u32>, vxlan: &Vxlan) -> io::Result<Link> {
        self.create(vxlan_request(name, mtu, vxlan), name)
    }

    /// The link called `name` and its vxlan settings (None for the settings when it is not a vxlan device).
    pub fn vxlan_by_name(&mut self, name: &str) -> io::Result<Option<(Link, Option<Vxlan>)>> {
        self.link_message_by_name(name, |data| Some((Link::parse(data)?.0, Vxlan::of_link_message(data))))
    }
}

#[cfg(test)]
mod tests {
    use netlink_packet_route::link::{InfoData, InfoKind, InfoVxlan, LinkAttribute, LinkInfo, LinkMessage};

    use super::*;
    use crate::netlink::wire::emitted;

    fn example() -> Vxlan {
        Vxlan {
            vni: 1,
            local: Some(Ipv4Addr::new(192, 168, 0, 3).into()),
            link: Some(2),
            port: 8472,
            learning: false,
            gbp: false,
        }
    }

    fn example_v6() -> Vxlan {
        Vxlan { local: Some("fd00:192:168::3".parse().unwrap()), ..example() }
    }

    fn reference(vxlan: &Vxlan) -> LinkMessage {
        let mut data = vec![InfoVxlan::Id(vxlan.vni)];
        if let Some(link) = vxlan.link {
            data.push(InfoVxlan::Link(link));
        }
        match vxlan.local {
            Some(IpAddr::V4(local)) => data.push(InfoVxlan::Local(local)),
            Some(IpAddr::V6(local)) => data.push(InfoVxlan::Local6(local)),
            None => {}
        }
        data.push(InfoVxlan::Learning(vxlan.learning));
        data.push(InfoVxlan::Port(vxlan.port));
        if vxlan.gbp {
            data.push(InfoVxlan::Gbp);
        }
        let mut message = LinkMessage::default();
        message.attributes = vec![
            LinkAttribute::IfName("flannel.1".into()),
            LinkAttribute::Mtu(1450),
            LinkAttribute::LinkInfo(vec![LinkInfo::Kind(InfoKind::Vxlan), LinkInfo::Data(InfoData::Vxlan(data))]),
        ];
        message
    }

    #[test]
    fn creation_request() {
        for vxlan in [
            example(),
            example_v6(),
            Vxlan { local: None, link: None, learning: true, port: 4789, ..example() },
            Vxlan { learning: true, gbp: true, ..example() },
        ] {
            assert_eq!(
                vxlan_request("flannel.1", Some(1450), &vxlan).payload(),
                emitted(&reference(&vxlan)),
                "{vxlan:?}"
            );
        }
    }

    #[test]
    fn parses_settings() {
        let gbp = Vxlan { learning: true, gbp: true, ..example() };
        for vxlan in [example(), example_v6(), gbp] {
            assert_eq!(Vxlan::of_link_message(&emitted(&reference(&vxlan))), Some(vxlan));
        }
        let mut bridge = LinkMessage::default();
        bridge.attributes = vec![LinkAttribute::LinkInfo(vec![LinkInfo::Kind(InfoKind::Bridge)])];
        assert_eq!(Vxlan::of_link_message(&emitted(&bridge)), None);
    }
}
