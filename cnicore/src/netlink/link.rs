//! Links: listing, creating bridges, veth pairs and ifb devices, changing their settings, bridge port
//! flags, and waiting for a link to become operationally up.

use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::time::Duration;

use netlink_packet_core::{NLM_F_CREATE, NLM_F_EXCL};

use super::wire::{self, attributes, Request, NLA_F_NESTED};
use super::Netlink;
use crate::netns::NetNs;

/// Bridge options that can be given at creation (`IFLA_BR_*`), e.g. `InfoBridge::VlanFiltering(true)`.
pub use netlink_packet_route::link::InfoBridge;

/// `AF_BRIDGE`: link messages about bridge ports and their VLANs.
pub(crate) const AF_BRIDGE: u8 = libc::AF_BRIDGE as u8;

/// `IFLA_BRPORT_MODE`: hairpin mode of a bridge port.
const IFLA_BRPORT_MODE: u16 = 4;
/// `IFLA_BRPORT_ISOLATED`: isolated bridge port.
const IFLA_BRPORT_ISOLATED: u16 = 33;
/// `VETH_INFO_PEER`: the peer's `ifinfomsg` and attributes, inside `IFLA_INFO_DATA` of a veth.
const VETH_INFO_PEER: u16 = 1;

const IFF_UP: u32 = libc::IFF_UP as u32;
const IFF_LOOPBACK: u32 = libc::IFF_LOOPBACK as u32;
const IFF_POINTOPOINT: u32 = libc::IFF_POINTOPOINT as u32;
const IFF_RUNNING: u32 = libc::IFF_RUNNING as u32;
const IFF_LOWER_UP: u32 = libc::IFF_LOWER_UP as u32;
const IFF_PROMISC: u32 = libc::IFF_PROMISC as u32;
const IFF_ALLMULTI: u32 = libc::IFF_ALLMULTI as u32;

/// Size of `struct ifinfomsg`.
const IFINFOMSG_LEN: usize = 16;

/// A network interface as the kernel reports it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Link {
    pub index: u32,
    pub name: String,
    pub mtu: u32,
    pub mac: Option<[u8; 6]>,
    /// Administratively up (IFF_UP).
    pub up: bool,
    /// Operationally up (IFF_RUNNING: up and the carrier/lower layer is ready).
    pub oper_up: bool,
    /// The carrier is on (IFF_LOWER_UP). It is set at once; `oper_up` follows when the kernel's linkwatch has
    /// handled the change (up to a second later).
    pub carrier: bool,
    pub loopback: bool,
    pub pointopoint: bool,
    pub promisc: bool,
    /// Receives all multicast packets (IFF_ALLMULTI).
    pub allmulti: bool,
    /// Length of the transmit queue (`IFLA_TXQLEN`).
    pub txqlen: u32,
    /// `IFLA_INFO_KIND`: "bridge", "veth", "ifb", ... (None for e.g. loopback).
    pub kind: Option<String>,
    /// Index of the bridge (or other master) the link is attached to.
    pub master: Option<u32>,
    /// `IFLA_LINK`: for a veth the peer's index (in the peer's namespace).
    pub peer_index: Option<u32>,
    /// Port settings when the link is a bridge port.
    pub bridge_port: Option<BridgePort>,
}

/// Settings of a bridge port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BridgePort {
    pub hairpin: bool,
    pub isolated: bool,
}

/// `struct ifinfomsg` {family, pad, type, index, flags, change}.
pub(crate) fn ifinfomsg(family: u8, index: u32, flags: u32, change: u32) -> [u8; IFINFOMSG_LEN] {
    let mut header = [0; IFINFOMSG_LEN];
    header[0] = family;
    header[4..8].copy_from_slice(&index.to_ne_bytes());
    header[8..12].copy_from_slice(&flags.to_ne_bytes());
    header[12..16].copy_from_slice(&change.to_ne_bytes());
    header
}

/// A link request addressed to link `index` (0: by name, or none).
pub(crate) fn link_request(message_type: u16, family: u8, index: u32) -> Request {
    Request::new(message_type, &ifinfomsg(family, index, 0, 0))
}

/// An `RTM_SETLINK` for link `index`: `IFF_*` flags `flags` under the mask `change`, and one attribute if given.
fn setlink_request(index: u32, flags: u32, change: u32, attribute: Option<(u16, &[u8])>) -> Request {
    let mut request = Request::new(libc::RTM_SETLINK, &ifinfomsg(0, index, flags, change));
    if let Some((kind, value)) = attribute {
        request.attr(kind, value);
    }
    request
}

/// An `RTM_SETLINK` moving link `index` into the namespace of the open file `netns_fd`, renamed if `new_name`.
fn move_request(index: u32, netns_fd: u32, new_name: Option<&str>) -> Request {
    let mut request = link_request(libc::RTM_SETLINK, 0, index);
    request.attr_u32(libc::IFLA_NET_NS_FD, netns_fd);
    if let Some(name) = new_name {
        request.attr_str(libc::IFLA_IFNAME, name);
    }
    request
}

/// The fixed header of a link message: (index, flags) and the attributes after it.
pub(crate) fn split_link_message(data: &[u8]) -> Option<(u32, u32, &[u8])> {
    let index = wire::u32_at(data, 4)?;
    let flags = wire::u32_at(data, 8)?;
    Some((index, flags, data.get(IFINFOMSG_LEN..)?))
}

impl Link {
    /// The link in an `RTM_NEWLINK` payload, with its alias (`IFLA_IFALIAS`) if it has one.
    pub(crate) fn parse(data: &[u8]) -> Option<(Link, Option<String>)> {
        let (index, flags, attrs) = split_link_message(data)?;
        let mut link = Link {
            index,
            name: String::new(),
            mtu: 0,
            mac: None,
            up: flags & IFF_UP != 0,
            oper_up: flags & IFF_RUNNING != 0,
            carrier: flags & IFF_LOWER_UP != 0,
            loopback: flags & IFF_LOOPBACK != 0,
            pointopoint: flags & IFF_POINTOPOINT != 0,
            promisc: flags & IFF_PROMISC != 0,
            allmulti: flags & IFF_ALLMULTI != 0,
            txqlen: 0,
            kind: None,
            master: None,
            peer_index: None,
            bridge_port: None,
        };
        let mut alias = None;
        for (kind, value) in attributes(attrs) {
            match kind {
                libc::IFLA_IFNAME => link.name = wire::as_string(value),
                libc::IFLA_MTU => link.mtu = wire::as_u32(value).unwrap_or(0),
                libc::IFLA_TXQLEN => link.txqlen = wire::as_u32(value).unwrap_or(0),
                libc::IFLA_ADDRESS => link.mac = <[u8; 6]>::try_from(value).ok(),
                libc::IFLA_MASTER => link.master = wire::as_u32(value),
                libc::IFLA_LINK => link.peer_index = wire::as_u32(value),
                libc::IFLA_LINKINFO => read_link_info(&mut link, value),
                libc::IFLA_IFALIAS => alias = Some(wire::as_string(value)),
                _ => {}
            }
        }
        Some((link, alias))
    }
}

/// Reads `IFLA_LINKINFO`: the kind, and the bridge port settings when the link is a bridge port.
fn read_link_info(link: &mut Link, info: &[u8]) {
    let mut port_kind = None;
    for (kind, value) in attributes(info) {
        match kind {
            libc::IFLA_INFO_KIND => link.kind = Some(wire::as_string(value)),
            libc::IFLA_INFO_SLAVE_KIND => port_kind = Some(wire::as_string(value)),
            libc::IFLA_INFO_SLAVE_DATA if port_kind.as_deref() == Some("bridge") => {
                let mut port = BridgePort::default();
                for (option, value) in attributes(value) {
                    match option {
                        IFLA_BRPORT_MODE => port.hairpin = wire::as_u8(value).is_some_and(|v| v > 0),
                        IFLA_BRPORT_ISOLATED => port.isolated = wire::as_u8(value).is_some_and(|v| v > 0),
                        _ => {}
                    }
                }
                link.bridge_port = Some(port);
            }
            _ => {}
        }
    }
}

/// An `RTM_NEWLINK` creating a link: name, MTU, and `IFLA_LINKINFO` with the kind. `add_data` writes
/// what goes in `IFLA_INFO_DATA` (nothing: no `IFLA_INFO_DATA`).
pub(crate) fn new_link_request(
    name: &str,
    mtu: Option<u32>,
    up: bool,
    kind: &str,
    add_data: Option<&dyn Fn(&mut Request)>,
) -> Request {
    let flags = if up { IFF_UP } else { 0 };
    let mut request = Request::new(libc::RTM_NEWLINK, &ifinfomsg(0, 0, flags, flags));
    request.attr_str(libc::IFLA_IFNAME, name);
    if let Some(mtu) = mtu {
        request.attr_u32(libc::IFLA_MTU, mtu);
    }
    let info = request.begin_nested(libc::IFLA_LINKINFO);
    request.attr_str(libc::IFLA_INFO_KIND, kind);
    if let Some(add_data) = add_data {
        let data = request.begin_nested(libc::IFLA_INFO_DATA);
        add_data(&mut request);
        request.end_nested(data);
    }
    request.end_nested(info);
    request
}

/// Creates a bridge with `IFLA_BR_*` options (in `IFLA_INFO_DATA`).
fn bridge_request(name: &str, mtu: Option<u32>, options: &[InfoBridge]) -> Request {
    let add_options = |request: &mut Request| {
        for option in options {
            request.emit(option);
        }
    };
    let data: Option<&dyn Fn(&mut Request)> = if options.is_empty() { None } else { Some(&add_options) };
    new_link_request(name, mtu, false, "bridge", data)
}

/// Creates a veth pair; the peer is created in the namespace of the file descriptor `peer_netns`.
fn veth_request(name: &str, peer_name: &str, peer_netns: u32, mtu: Option<u32>, peer_mac: Option<[u8; 6]>) -> Request {
    let add_peer = |request: &mut Request| {
        let peer = request.begin_nested(VETH_INFO_PEER);
        request.bytes(&ifinfomsg(0, 0, 0, 0));
        request.attr_str(libc::IFLA_IFNAME, peer_name);
        if let Some(mtu) = mtu {
            request.attr_u32(libc::IFLA_MTU, mtu);
        }
        if let Some(mac) = peer_mac {
            request.attr(libc::IFLA_ADDRESS, &mac);
        }
        request.attr_u32(libc::IFLA_NET_NS_FD, peer_netns);
        request.end_nested(peer);
    };
    new_link_request(name, mtu, false, "veth", Some(&add_peer))
}

fn not_found(what: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::NotFound, format!("link {what} not found"))
}

impl Netlink {
    /// All links of the namespace.
    pub fn links(&mut self) -> io::Result<Vec<Link>> {
        Ok(self.links_with_aliases()?.into_iter().map(|(link, _)| link).collect())
    }

    /// All links of the namespace, each with its alias (`IFLA_IFALIAS`, `ip link set ... alias`) if set.
    pub fn links_with_aliases(&mut self) -> io::Result<Vec<(Link, Option<String>)>> {
        let mut request = link_request(libc::RTM_GETLINK, 0, 0);
        self.dump(&mut request, libc::RTM_NEWLINK, Link::parse)
    }

    /// The link called `name`, if any.
    pub fn link_by_name(&mut self, name: &str) -> io::Result<Option<Link>> {
        self.link_message_by_name(name, |data| Link::parse(data).map(|(link, _)| link))
    }

    /// The link called `name` as `parse` reads its `RTM_NEWLINK` message, if there is such a link.
    pub(crate) fn link_message_by_name<T>(
        &mut self,
        name: &str,
        parse: impl FnMut(&[u8]) -> Option<T>,
    ) -> io::Result<Option<T>> {
        let mut request = link_request(libc::RTM_GETLINK, 0, 0);
        request.attr_str(libc::IFLA_IFNAME, name);
        self.get_link_message(request, parse)
    }

    /// The link with index `index`, if any.
    pub fn link_by_index(&mut self, index: u32) -> io::Result<Option<Link>> {
        self.get_link(link_request(libc::RTM_GETLINK, 0, index))
    }

    pub(crate) fn get_link(&mut self, request: Request) -> io::Result<Option<Link>> {
        self.get_link_message(request, |data| Link::parse(data).map(|(link, _)| link))
    }

    /// The answer to a `RTM_GETLINK` request as `parse` reads it; None when there is no such link.
    fn get_link_message<T>(
        &mut self,
        mut request: Request,
        mut parse: impl FnMut(&[u8]) -> Option<T>,
    ) -> io::Result<Option<T>> {
        match self.request_raw(&mut request, 0) {
            Ok(replies) => Ok(replies
                .iter()
                .filter(|reply| reply.message_type == libc::RTM_NEWLINK)
                .find_map(|reply| parse(&reply.data))),
            Err(e) if super::is_not_found(&e) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Like [`Netlink::link_by_name`] but a missing link is an error (`ErrorKind::NotFound`).
    pub fn require_link(&mut self, name: &str) -> io::Result<Link> {
        self.link_by_name(name)?.ok_or_else(|| not_found(name))
    }

    /// Sends a request that creates the link `name` and returns the link.
    pub(crate) fn create(&mut self, mut request: Request, name: &str) -> io::Result<Link> {
        self.request_raw(&mut request, NLM_F_CREATE | NLM_F_EXCL)?;
        self.require_link(name)
    }

    /// Creates a bridge.
    pub fn create_bridge(&mut self, name: &str, mtu: Option<u32>) -> io::Result<Link> {
        self.create_bridge_with(name, mtu, Vec::new())
    }

    /// Creates a bridge with `IFLA_BR_*` options. Options the kernel does not support fail with their
    /// errno (e.g. EOPNOTSUPP for vlan filtering without CONFIG_BRIDGE_VLAN_FILTERING).
    pub fn create_bridge_with(&mut self, name: &str, mtu: Option<u32>, options: Vec<InfoBridge>) -> io::Result<Link> {
        let request = bridge_request(name, mtu, &options);
        self.create(request, name)
    }

    /// Creates a veth pair: `name` in this namespace, `peer_name` directly inside `peer_netns` (with
    /// `peer_mac` if given; both ends get `mtu`). Returns the local end; its `peer_index` is the peer's
    /// index in `peer_netns`.
    pub fn create_veth(
        &mut self,
        name: &str,
        peer_name: &str,
        peer_netns: &NetNs,
        mtu: Option<u32>,
        peer_mac: Option<[u8; 6]>,
    ) -> io::Result<Link> {
        let peer_netns = peer_netns.as_fd().as_raw_fd() as u32;
        let request = veth_request(name, peer_name, peer_netns, mtu, peer_mac);
        self.create(request, name)
    }

    /// Creates an ifb (intermediate functional block) device.
    pub fn create_ifb(&mut self, name: &str, mtu: Option<u32>) -> io::Result<Link> {
        self.create_ifb_with(name, mtu, false)
    }

    /// Creates an ifb device, administratively up at once when `up`.
    pub fn create_ifb_with(&mut self, name: &str, mtu: Option<u32>, up: bool) -> io::Result<Link> {
        let request = new_link_request(name, mtu, up, "ifb", None);
        self.create(request, name)
    }

    /// Deletes the link with index `index` (ENODEV if it does not exist).
    pub fn delete_link(&mut self, index: u32) -> io::Result<()> {
        self.request_raw(&mut link_request(libc::RTM_DELLINK, 0, index), 0)?;
        Ok(())
    }

    /// Deletes the link called `name`; false if there was none.
    pub fn delete_link_by_name(&mut self, name: &str) -> io::Result<bool> {
        let mut request = link_request(libc::RTM_DELLINK, 0, 0);
        request.attr_str(libc::IFLA_IFNAME, name);
        match self.request_raw(&mut request, 0) {
            Ok(_) => Ok(true),
            Err(e) if super::is_not_found(&e) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Moves link `index` into `netns`, renamed to `new_name` if given, in one request. It is not atomic: the
    /// kernel moves the link first (under `new_name` only if its current name is taken in the target), then
    /// renames it; a `new_name` already taken in the target fails with EEXIST after the move, leaving the link
    /// in the target under its old name. A caller that must not leave it there moves it back on that error.
    /// The link's index may change in its new namespace: look it up there by name.
    pub fn move_to_netns(&mut self, index: u32, netns: &NetNs, new_name: Option<&str>) -> io::Result<()> {
        let fd = netns.as_fd().as_raw_fd() as u32;
        self.request_raw(&mut move_request(index, fd, new_name), 0)?;
        Ok(())
    }

    /// Renames link `index` (it must be down, or the kernel answers EBUSY).
    pub fn rename(&mut self, index: u32, name: &str) -> io::Result<()> {
        let mut request = link_request(libc::RTM_SETLINK, 0, index);
        request.attr_str(libc::IFLA_IFNAME, name);
        self.request_raw(&mut request, 0)?;
        Ok(())
    }

    /// Sends an `RTM_SETLINK` for `index` with the given `IFF_*` flag changes (`flags` under the mask
    /// `change`) and, if given, one attribute.
    fn set_link(&mut self, index: u32, flags: u32, change: u32, attribute: Option<(u16, &[u8])>) -> io::Result<()> {
        self.request_raw(&mut setlink_request(index, flags, change, attribute), 0)?;
        Ok(())
    }

    pub fn set_up(&mut self, index: u32) -> io::Result<()> {
        self.set_link(index, IFF_UP, IFF_UP, None)
    }

    pub fn set_down(&mut self, index: u32) -> io::Result<()> {
        self.set_link(index, 0, IFF_UP, None)
    }

    pub fn set_promisc(&mut self, index: u32, on: bool) -> io::Result<()> {
        let flags = if on { IFF_PROMISC } else { 0 };
        self.set_link(index, flags, IFF_PROMISC, None)
    }

    pub fn set_allmulti(&mut self, index: u32, on: bool) -> io::Result<()> {
        let flags = if on { IFF_ALLMULTI } else { 0 };
        self.set_link(index, flags, IFF_ALLMULTI, None)
    }

    /// Sets the length of the transmit queue (`ip link set ... txqueuelen`).
    pub fn set_txqlen(&mut self, index: u32, txqlen: u32) -> io::Result<()> {
        self.set_link(index, 0, 0, Some((libc::IFLA_TXQLEN, &txqlen.to_ne_bytes())))
    }

    /// Attaches the link to a bridge (`master_index` 0 detaches it).
    pub fn set_master(&mut self, index: u32, master_index: u32) -> io::Result<()> {
        self.set_link(index, 0, 0, Some((libc::IFLA_MASTER, &master_index.to_ne_bytes())))
    }

    pub fn set_mtu(&mut self, index: u32, mtu: u32) -> io::Result<()> {
        self.set_link(index, 0, 0, Some((libc::IFLA_MTU, &mtu.to_ne_bytes())))
    }

    pub fn set_mac(&mut self, index: u32, mac: [u8; 6]) -> io::Result<()> {
        self.set_link(index, 0, 0, Some((libc::IFLA_ADDRESS, &mac)))
    }

    /// Sets the alias of a link (`ip link set ... alias`). The kernel ignores an alias given at creation.
    pub fn set_alias(&mut self, index: u32, alias: &str) -> io::Result<()> {
        let mut request = link_request(libc::RTM_SETLINK, 0, index);
        request.attr_str(libc::IFLA_IFALIAS, alias);
        self.request_raw(&mut request, 0)?;
        Ok(())
    }

    /// Sets hairpin mode on a bridge port (traffic may leave by the port it came in on).
    pub fn set_hairpin(&mut self, index: u32, on: bool) -> io::Result<()> {
        self.set_bridge_port_flag(index, IFLA_BRPORT_MODE, on)
    }

    /// Sets a bridge port isolated (isolated ports only talk to non-isolated ones).
    pub fn set_port_isolated(&mut self, index: u32, on: bool) -> io::Result<()> {
        self.set_bridge_port_flag(index, IFLA_BRPORT_ISOLATED, on)
    }

    /// Bridge port options go in a nested `IFLA_PROTINFO` of an `AF_BRIDGE` `RTM_SETLINK`; the kernel
    /// reads a `IFLA_PROTINFO` without `NLA_F_NESTED` as the old single-byte port state.
    fn set_bridge_port_flag(&mut self, index: u32, option: u16, on: bool) -> io::Result<()> {
        let mut request = link_request(libc::RTM_SETLINK, AF_BRIDGE, index);
        let protinfo = request.begin_nested(libc::IFLA_PROTINFO | NLA_F_NESTED);
        request.attr_u8(option, u8::from(on));
        request.end_nested(protinfo);
        self.request_raw(&mut request, 0)?;
        Ok(())
    }

    /// Waits until the link is operationally up, woken by link events rather than polling with sleeps.
    /// Fails with `ErrorKind::TimedOut` after `timeout`, and if the link disappears.
    pub fn wait_oper_up(&mut self, index: u32, timeout: Duration) -> io::Result<()> {
        let what = || format!("link {index} not operationally up");
        self.wait_until(&[libc::RTNLGRP_LINK], timeout, what, |nl| match nl.link_by_index(index)? {
            None => Err(not_found(index)),
            Some(link) => Ok(link.oper_up.then_some(())),
        })
    }
}

#[cfg(test)]
mod tests {
    //! The requests are compared byte for byte with what netlink-packet-route emits for the same message,
    //! and the parser is fed messages it emits.
    use netlink_packet_core::DefaultNla;
    use netlink_packet_route::link::{
        InfoBridgePort, InfoData, InfoKind, InfoPortData, InfoPortKind, InfoVeth, LinkAttribute, LinkFlags, LinkInfo,
        LinkProtoInfoBridge,
    };
    use netlink_packet_route::AddressFamily;

    use super::*;
    use crate::netlink::wire::emitted;
    use netlink_packet_route::link::LinkMessage;

    fn message(attributes: Vec<LinkAttribute>) -> LinkMessage {
        let mut message = LinkMessage::default();
        message.attributes = attributes;
        message
    }

    #[test]
    fn creation_requests() {
        let name = || LinkAttribute::IfName("br0".into());
        let bridge = bridge_request("br0", Some(1400), &[]);
        let expected = message(vec![
            name(),
            LinkAttribute::Mtu(1400),
            LinkAttribute::LinkInfo(vec![LinkInfo::Kind(InfoKind::Bridge)]),
        ]);
        assert_eq!(bridge.payload(), emitted(&expected));

        let options = [InfoBridge::VlanFiltering(true)];
        let filtering = bridge_request("br0", None, &options);
        let info = vec![LinkInfo::Kind(InfoKind::Bridge), LinkInfo::Data(InfoData::Bridge(options.to_vec()))];
        assert_eq!(filtering.payload(), emitted(&message(vec![name(), LinkAttribute::LinkInfo(info)])));

        let ifb = new_link_request("ifb0", Some(9000), true, "ifb", None);
        let mut expected = message(vec![
            LinkAttribute::IfName("ifb0".into()),
            LinkAttribute::Mtu(9000),
            LinkAttribute::LinkInfo(vec![LinkInfo::Kind(InfoKind::Ifb)]),
        ]);
        expected.header.flags = LinkFlags::Up;
        expected.header.change_mask = LinkFlags::Up;
        assert_eq!(ifb.payload(), emitted(&expected));
    }

    #[test]
    fn veth_pair_request() {
        let mac = [2, 0, 0, 0, 0, 1];
        let veth = veth_request("veth0", "eth0", 7, Some(1500), Some(mac));
        let peer = message(vec![
            LinkAttribute::IfName("eth0".into()),
            LinkAttribute::Mtu(1500),
            LinkAttribute::Address(mac.to_vec()),
            LinkAttribute::NetNsFd(7),
        ]);
        let info = vec![LinkInfo::Kind(InfoKind::Veth), LinkInfo::Data(InfoData::Veth(InfoVeth::Peer(peer)))];
        let expected = message(vec![
            LinkAttribute::IfName("veth0".into()),
            LinkAttribute::Mtu(1500),
            LinkAttribute::LinkInfo(info),
        ]);
        assert_eq!(veth.payload(), emitted(&expected));
    }

    #[test]
    fn setting_requests() {
        let mut request = Request::new(libc::RTM_SETLINK, &ifinfomsg(0, 5, IFF_PROMISC, IFF_PROMISC));
        request.attr_u32(libc::IFLA_MASTER, 3);
        let mut expected = message(vec![LinkAttribute::Controller(3)]);
        expected.header.index = 5;
        expected.header.flags = LinkFlags::Promisc;
        expected.header.change_mask = LinkFlags::Promisc;
        assert_eq!(request.payload(), emitted(&expected));

        let mut request = link_request(libc::RTM_SETLINK, 0, 5);
        request.attr_str(libc::IFLA_IFALIAS, "cni-bandwidth net id");
        let mut expected = message(vec![LinkAttribute::IfAlias("cni-bandwidth net id".into())]);
        expected.header.index = 5;
        assert_eq!(request.payload(), emitted(&expected));

        let mut request = link_request(libc::RTM_SETLINK, AF_BRIDGE, 5);
        let protinfo = request.begin_nested(libc::IFLA_PROTINFO | NLA_F_NESTED);
        request.attr_u8(IFLA_BRPORT_MODE, 1);
        request.end_nested(protinfo);
        let value = DefaultNla::new(IFLA_BRPORT_MODE, vec![1]);
        let mut expected = message(vec![LinkAttribute::ProtoInfoBridge(vec![LinkProtoInfoBridge::Other(value)])]);
        expected.header.index = 5;
        expected.header.interface_family = AddressFamily::Bridge;
        assert_eq!(request.payload(), emitted(&expected));

        let mut request = link_request(libc::RTM_GETLINK, 0, 0);
        request.attr_str(libc::IFLA_IFNAME, "eth0");
        assert_eq!(request.payload(), emitted(&message(vec![LinkAttribute::IfName("eth0".into())])));
    }

    #[test]
    fn move_and_rename_requests() {
        let moved = move_request(7, 42, Some("eth1"));
        let mut expected = message(vec![LinkAttribute::NetNsFd(42), LinkAttribute::IfName("eth1".into())]);
        expected.header.index = 7;
        assert_eq!(moved.payload(), emitted(&expected));
        let kept = move_request(7, 42, None);
        let mut expected = message(vec![LinkAttribute::NetNsFd(42)]);
        expected.header.index = 7;
        assert_eq!(kept.payload(), emitted(&expected));
    }

    #[test]
    fn link_attribute_requests() {
        // What set_mtu, set_mac, set_txqlen, set_promisc and set_allmulti send for link 7.
        let setlink = |flags, change, attribute| setlink_request(7, flags, change, attribute);
        let expect = |attributes: Vec<LinkAttribute>, flags: LinkFlags, change: LinkFlags| {
            let mut expected = message(attributes);
            expected.header.index = 7;
            expected.header.flags = flags;
            expected.header.change_mask = change;
            emitted(&expected)
        };
        let none = LinkFlags::empty();
        let (mtu_value, txqlen_value) = (9000u32.to_ne_bytes(), 20000u32.to_ne_bytes());
        let mtu = setlink(0, 0, Some((libc::IFLA_MTU, &mtu_value)));
        assert_eq!(mtu.payload(), expect(vec![LinkAttribute::Mtu(9000)], none, none));
        let mac = [0xc2, 0x11, 0x22, 0x33, 0x44, 0x55];
        let address = setlink(0, 0, Some((libc::IFLA_ADDRESS, &mac)));
        assert_eq!(address.payload(), expect(vec![LinkAttribute::Address(mac.to_vec())], none, none));
        let txqlen = setlink(0, 0, Some((libc::IFLA_TXQLEN, &txqlen_value)));
        assert_eq!(txqlen.payload(), expect(vec![LinkAttribute::TxQueueLen(20000)], none, none));
        let on = setlink(IFF_ALLMULTI, IFF_ALLMULTI, None);
        assert_eq!(on.payload(), expect(vec![], LinkFlags::Allmulti, LinkFlags::Allmulti));
        let off = setlink(0, IFF_ALLMULTI, None);
        assert_eq!(off.payload(), expect(vec![], none, LinkFlags::Allmulti));
        let promisc_off = setlink(0, IFF_PROMISC, None);
        assert_eq!(promisc_off.payload(), expect(vec![], none, LinkFlags::Promisc));
    }

    #[test]
    fn parses_links() {
        let mut reported = message(vec![
            LinkAttribute::IfName("veth1".into()),
            LinkAttribute::Mtu(1450),
            LinkAttribute::TxQueueLen(500),
            LinkAttribute::Address(vec![2, 1, 2, 3, 4, 5]),
            LinkAttribute::Controller(4),
            LinkAttribute::Link(9),
            LinkAttribute::IfAlias("tag".into()),
            LinkAttribute::LinkInfo(vec![
                LinkInfo::Kind(InfoKind::Veth),
                LinkInfo::PortKind(InfoPortKind::Bridge),
                LinkInfo::PortData(InfoPortData::BridgePort(vec![
                    InfoBridgePort::Learning(true),
                    InfoBridgePort::HairpinMode(true),
                    InfoBridgePort::Isolated(false),
                ])),
            ]),
        ]);
        reported.header.index = 12;
        reported.header.flags =
            LinkFlags::Up | LinkFlags::Running | LinkFlags::LowerUp | LinkFlags::Promisc | LinkFlags::Allmulti;
        let (link, alias) = Link::parse(&emitted(&reported)).unwrap();
        assert_eq!(alias.as_deref(), Some("tag"));
        assert_eq!(
            link,
            Link {
                index: 12,
                name: "veth1".into(),
                mtu: 1450,
                mac: Some([2, 1, 2, 3, 4, 5]),
                up: true,
                oper_up: true,
                carrier: true,
                loopback: false,
                pointopoint: false,
                promisc: true,
                allmulti: true,
                txqlen: 500,
                kind: Some("veth".into()),
                master: Some(4),
                peer_index: Some(9),
                bridge_port: Some(BridgePort { hairpin: true, isolated: false }),
            }
        );

        let mut lo = message(vec![LinkAttribute::IfName("lo".into()), LinkAttribute::Mtu(65536)]);
        lo.header.index = 1;
        lo.header.flags = LinkFlags::Loopback | LinkFlags::Up;
        let (lo, alias) = Link::parse(&emitted(&lo)).unwrap();
        assert_eq!(
            (lo.loopback, lo.up, lo.oper_up, lo.carrier, lo.kind, lo.bridge_port, alias),
            (true, true, false, false, None, None, None)
        );
        assert!(Link::parse(&[0; 8]).is_none());
    }
}
