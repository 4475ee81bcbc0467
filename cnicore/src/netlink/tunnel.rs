//! Tunnel devices of a node agent's backends besides vxlan: an IPv4-in-IPv4 device (`ip link add ... type ipip
//! local A`) with its settings read back, and a wireguard device (`ip link add ... type wireguard`, configured
//! afterwards over generic netlink).
//!
//! A kernel without the module answers the creation with EOPNOTSUPP ([`super::kinds::is_unsupported_kind`]).

use std::io;
use std::net::Ipv4Addr;

use super::link::{new_link_request, split_link_message, Link};
use super::wire::{self, attributes, Request};
use super::Netlink;

const IFLA_IPTUN_LINK: u16 = 1;
const IFLA_IPTUN_LOCAL: u16 = 2;
const IFLA_IPTUN_REMOTE: u16 = 3;

/// The settings of an ipip device that a node agent cares about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ipip {
    /// Local tunnel endpoint (the source of the encapsulated packets); the kernel reports 0.0.0.0 as None.
    pub local: Option<Ipv4Addr>,
    /// The one remote endpoint; None for a device that reaches any (routes name the endpoint as gateway).
    pub remote: Option<Ipv4Addr>,
    /// Index of the underlay link the tunnel is bound to.
    pub link: Option<u32>,
}

impl Ipip {
    fn add_data(&self, request: &mut Request) {
        if let Some(link) = self.link {
            request.attr_u32(IFLA_IPTUN_LINK, link);
        }
        if let Some(local) = self.local {
            request.attr(IFLA_IPTUN_LOCAL, &local.octets());
        }
        if let Some(remote) = self.remote {
            request.attr(IFLA_IPTUN_REMOTE, &remote.octets());
        }
    }

    /// The settings in the `IFLA_INFO_DATA` of an ipip link message.
    fn parse(data: &[u8]) -> Ipip {
        let address = |value: &[u8]| {
            <[u8; 4]>::try_from(value).ok().map(Ipv4Addr::from).filter(|address| !address.is_unspecified())
        };
        let mut ipip = Ipip { local: None, remote: None, link: None };
        for (kind, value) in attributes(data) {
            match kind {
                IFLA_IPTUN_LINK => ipip.link = wire::as_u32(value).filter(|index| *index != 0),
                IFLA_IPTUN_LOCAL => ipip.local = address(value),
                IFLA_IPTUN_REMOTE => ipip.remote = address(value),
                _ => {}
            }
        }
        ipip
    }

    /// The ipip settings of an `RTM_NEWLINK` payload, if it is an ipip link.
    fn of_link_message(data: &[u8]) -> Option<Ipip> {
        let (_, _, attrs) = split_link_message(data)?;
        let info = attributes(attrs).find(|(kind, _)| *kind == libc::IFLA_LINKINFO)?.1;
        let mut is_ipip = false;
        for (kind, value) in attributes(info) {
            match kind {
                libc::IFLA_INFO_KIND => is_ipip = wire::as_string(value) == "ipip",
                libc::IFLA_INFO_DATA if is_ipip => return Some(Ipip::parse(value)),
                _ => {}
            }
        }
        // An ipip device without settings (none given at creation) reports no IFLA_INFO_DATA on old kernels.
        is_ipip.then_some(Ipip { local: None, remote: None, link: None })
    }
}

fn ipip_request(name: &str, mtu: Option<u32>, ipip: &Ipip) -> Request {
    new_link_request(name, mtu, false, "ipip", Some(&|request: &mut Request| ipip.add_data(request)))
}

fn wireguard_request(name: &str, mtu: Option<u32>) -> Request {
    new_link_request(name, mtu, false, "wireguard", None)
}

impl Netlink {
    /// Creates an ipip device (down; EEXIST if the name is taken).
    pub fn create_ipip(&mut self, name: &str, mtu: Option<u32>, ipip: &Ipip) -> io::Result<Link> {
        self.create(ipip_request(name, mtu, ipip), name)
    }

    /// The link called `name` and its ipip settings (None for the settings when it is not an ipip device).
    pub fn ipip_by_name(&mut self, name: &str) -> io::Result<Option<(Link, Option<Ipip>)>> {
        self.link_message_by_name(name, |data| Some((Link::parse(data)?.0, Ipip::of_link_message(data))))
    }

    /// Creates a wireguard device (down, no key, no peers; EEXIST if the name is taken).
    pub fn create_wireguard(&mut self, name: &str, mtu: Option<u32>) -> io::Result<Link> {
        self.create(wireguard_request(name, mtu), name)
    }
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use netlink_packet_route::link::{InfoData, InfoIpTunnel, InfoKind, LinkAttribute, LinkInfo, LinkMessage};

    use super::*;
    use crate::netlink::wire::emitted;

    fn reference(name: &str, mtu: Option<u32>, info: Vec<LinkInfo>) -> LinkMessage {
        let mut message = LinkMessage::default();
        message.attributes = vec![LinkAttribute::IfName(name.into())];
        message.attributes.extend(mtu.map(LinkAttribute::Mtu));
        message.attributes.push(LinkAttribute::LinkInfo(info));
        message
    }

    fn ipip_reference(ipip: &Ipip) -> LinkMessage {
        let mut data = Vec::new();
        data.extend(ipip.link.map(InfoIpTunnel::Link));
        data.extend(ipip.local.map(|a| InfoIpTunnel::Local(IpAddr::V4(a))));
        data.extend(ipip.remote.map(|a| InfoIpTunnel::Remote(IpAddr::V4(a))));
        reference(
            "flannel.ipip",
            Some(1480),
            vec![LinkInfo::Kind(InfoKind::IpIp), LinkInfo::Data(InfoData::IpTunnel(data))],
        )
    }

    fn cases() -> Vec<Ipip> {
        vec![
            Ipip { local: Some(Ipv4Addr::new(192, 168, 50, 10)), remote: None, link: Some(2) },
            Ipip { local: Some(Ipv4Addr::new(10, 0, 0, 1)), remote: None, link: None },
            Ipip { local: Some(Ipv4Addr::new(10, 0, 0, 1)), remote: Some(Ipv4Addr::new(10, 0, 0, 2)), link: Some(7) },
        ]
    }

    #[test]
    fn ipip_creation_requests_match_netlink_packet_route() {
        for ipip in cases() {
            assert_eq!(
                ipip_request("flannel.ipip", Some(1480), &ipip).payload(),
                emitted(&ipip_reference(&ipip)),
                "{ipip:?}"
            );
        }
    }

    #[test]
    fn ipip_settings_read_back() {
        for ipip in cases() {
            assert_eq!(Ipip::of_link_message(&emitted(&ipip_reference(&ipip))), Some(ipip));
        }
        // As the kernel reports a device without a remote end: 0.0.0.0 and link 0 are none.
        let zeros = vec![
            InfoIpTunnel::Link(0),
            InfoIpTunnel::Local(IpAddr::V4(Ipv4Addr::new(192, 168, 50, 10))),
            InfoIpTunnel::Remote(IpAddr::V4(Ipv4Addr::UNSPECIFIED)),
            InfoIpTunnel::Ttl(0),
        ];
        let message =
            reference("x", None, vec![LinkInfo::Kind(InfoKind::IpIp), LinkInfo::Data(InfoData::IpTunnel(zeros))]);
        let read = Ipip::of_link_message(&emitted(&message));
        assert_eq!(read, Some(Ipip { local: Some(Ipv4Addr::new(192, 168, 50, 10)), remote: None, link: None }));
        let vxlan = reference("y", None, vec![LinkInfo::Kind(InfoKind::Vxlan)]);
        assert_eq!(Ipip::of_link_message(&emitted(&vxlan)), None);
    }

    #[test]
    fn wireguard_creation_request_matches_netlink_packet_route() {
        let ours = wireguard_request("flannel-wg", Some(1420));
        let theirs = reference("flannel-wg", Some(1420), vec![LinkInfo::Kind(InfoKind::Wireguard)]);
        assert_eq!(ours.payload(), emitted(&theirs));
    }
}
