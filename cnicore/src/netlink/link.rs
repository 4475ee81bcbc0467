//! Links: listing, creating bridges, veth pairs and ifb devices, changing their settings, bridge port
//! flags, and waiting for a link to become operationally up.

use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::time::{Duration, Instant};

use netlink_packet_core::{DefaultNla, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL};
use netlink_packet_route::link::{
    InfoBridgePort, InfoData, InfoKind, InfoPortData, InfoVeth, LinkAttribute, LinkFlags, LinkInfo,
    LinkMessage, LinkProtoInfoBridge,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};

use super::Netlink;
use crate::netns::NetNs;

/// Bridge options that can be given at creation (`IFLA_BR_*`), e.g. `InfoBridge::VlanFiltering(true)`.
pub use netlink_packet_route::link::InfoBridge;

/// `IFLA_BRPORT_MODE`: hairpin mode of a bridge port.
const IFLA_BRPORT_MODE: u16 = 4;
/// `IFLA_BRPORT_ISOLATED`: isolated bridge port.
const IFLA_BRPORT_ISOLATED: u16 = 33;

/// A network interface as the kernel reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    pub index: u32,
    pub name: String,
    pub mtu: u32,
    pub mac: Option<[u8; 6]>,
    /// Administratively up (IFF_UP).
    pub up: bool,
    /// Operationally up (IFF_RUNNING: up and the carrier/lower layer is ready).
    pub oper_up: bool,
    pub loopback: bool,
    pub pointopoint: bool,
    pub promisc: bool,
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

impl Link {
    fn from_message(message: &LinkMessage) -> Link {
        let flags = message.header.flags;
        let mut link = Link {
            index: message.header.index,
            name: String::new(),
            mtu: 0,
            mac: None,
            up: flags.contains(LinkFlags::Up),
            oper_up: flags.contains(LinkFlags::Running),
            loopback: flags.contains(LinkFlags::Loopback),
            pointopoint: flags.contains(LinkFlags::Pointopoint),
            promisc: flags.contains(LinkFlags::Promisc),
            kind: None,
            master: None,
            peer_index: None,
            bridge_port: None,
        };
        for attribute in &message.attributes {
            match attribute {
                LinkAttribute::IfName(name) => link.name = name.clone(),
                LinkAttribute::Mtu(mtu) => link.mtu = *mtu,
                LinkAttribute::Address(mac) => link.mac = <[u8; 6]>::try_from(mac.as_slice()).ok(),
                LinkAttribute::Controller(master) => link.master = Some(*master),
                LinkAttribute::Link(peer) => link.peer_index = Some(*peer),
                LinkAttribute::LinkInfo(infos) => read_link_info(&mut link, infos),
                _ => {}
            }
        }
        link
    }
}

fn read_link_info(link: &mut Link, infos: &[LinkInfo]) {
    for info in infos {
        match info {
            LinkInfo::Kind(kind) => link.kind = Some(kind.to_string()),
            LinkInfo::PortData(InfoPortData::BridgePort(options)) => {
                let mut port = BridgePort::default();
                for option in options {
                    match option {
                        InfoBridgePort::HairpinMode(on) => port.hairpin = *on,
                        InfoBridgePort::Isolated(on) => port.isolated = *on,
                        _ => {}
                    }
                }
                link.bridge_port = Some(port);
            }
            _ => {}
        }
    }
}

/// A link message addressed to an existing link.
fn message_for(index: u32) -> LinkMessage {
    let mut message = LinkMessage::default();
    message.header.index = index;
    message
}

fn named_message(name: &str, mtu: Option<u32>, info: Vec<LinkInfo>) -> LinkMessage {
    let mut message = LinkMessage::default();
    message
        .attributes
        .push(LinkAttribute::IfName(name.to_string()));
    if let Some(mtu) = mtu {
        message.attributes.push(LinkAttribute::Mtu(mtu));
    }
    message.attributes.push(LinkAttribute::LinkInfo(info));
    message
}

fn not_found(what: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::NotFound, format!("link {what} not found"))
}

impl Netlink {
    /// All links of the namespace.
    pub fn links(&mut self) -> io::Result<Vec<Link>> {
        let replies = self.request(
            RouteNetlinkMessage::GetLink(LinkMessage::default()),
            NLM_F_DUMP,
        )?;
        Ok(replies
            .iter()
            .filter_map(|reply| match reply {
                RouteNetlinkMessage::NewLink(message) => Some(Link::from_message(message)),
                _ => None,
            })
            .collect())
    }

    /// The link called `name`, if any.
    pub fn link_by_name(&mut self, name: &str) -> io::Result<Option<Link>> {
        let mut message = LinkMessage::default();
        message
            .attributes
            .push(LinkAttribute::IfName(name.to_string()));
        self.get_link(message)
    }

    /// The link with index `index`, if any.
    pub fn link_by_index(&mut self, index: u32) -> io::Result<Option<Link>> {
        self.get_link(message_for(index))
    }

    fn get_link(&mut self, message: LinkMessage) -> io::Result<Option<Link>> {
        match self.request(RouteNetlinkMessage::GetLink(message), 0) {
            Ok(replies) => Ok(replies.iter().find_map(|reply| match reply {
                RouteNetlinkMessage::NewLink(message) => Some(Link::from_message(message)),
                _ => None,
            })),
            Err(e) if super::is_not_found(&e) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Like [`Netlink::link_by_name`] but a missing link is an error (`ErrorKind::NotFound`).
    pub fn require_link(&mut self, name: &str) -> io::Result<Link> {
        self.link_by_name(name)?.ok_or_else(|| not_found(name))
    }

    /// Sends an `RTM_NEWLINK` that must create a new link (`NLM_F_CREATE | NLM_F_EXCL`: an existing name
    /// is EEXIST, see [`super::is_exists`]) and returns the created link.
    pub fn create_link(&mut self, message: LinkMessage) -> io::Result<Link> {
        let name = message
            .attributes
            .iter()
            .find_map(|attribute| match attribute {
                LinkAttribute::IfName(name) => Some(name.clone()),
                _ => None,
            });
        self.request(
            RouteNetlinkMessage::NewLink(message),
            NLM_F_CREATE | NLM_F_EXCL,
        )?;
        match name {
            Some(name) => self.require_link(&name),
            None => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a new link needs a name",
            )),
        }
    }

    /// Creates a bridge.
    pub fn create_bridge(&mut self, name: &str, mtu: Option<u32>) -> io::Result<Link> {
        self.create_bridge_with(name, mtu, Vec::new())
    }

    /// Creates a bridge with `IFLA_BR_*` options. Options the kernel does not support fail with their
    /// errno (e.g. EOPNOTSUPP for vlan filtering without CONFIG_BRIDGE_VLAN_FILTERING).
    pub fn create_bridge_with(
        &mut self,
        name: &str,
        mtu: Option<u32>,
        options: Vec<InfoBridge>,
    ) -> io::Result<Link> {
        let mut info = vec![LinkInfo::Kind(InfoKind::Bridge)];
        if !options.is_empty() {
            info.push(LinkInfo::Data(InfoData::Bridge(options)));
        }
        self.create_link(named_message(name, mtu, info))
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
        let mut peer = LinkMessage::default();
        peer.attributes
            .push(LinkAttribute::IfName(peer_name.to_string()));
        if let Some(mtu) = mtu {
            peer.attributes.push(LinkAttribute::Mtu(mtu));
        }
        if let Some(mac) = peer_mac {
            peer.attributes.push(LinkAttribute::Address(mac.to_vec()));
        }
        peer.attributes
            .push(LinkAttribute::NetNsFd(peer_netns.as_fd().as_raw_fd()));
        let info = vec![
            LinkInfo::Kind(InfoKind::Veth),
            LinkInfo::Data(InfoData::Veth(InfoVeth::Peer(peer))),
        ];
        self.create_link(named_message(name, mtu, info))
    }

    /// Creates an ifb (intermediate functional block) device.
    pub fn create_ifb(&mut self, name: &str, mtu: Option<u32>) -> io::Result<Link> {
        self.create_link(named_message(
            name,
            mtu,
            vec![LinkInfo::Kind(InfoKind::Ifb)],
        ))
    }

    /// Deletes the link with index `index` (ENODEV if it does not exist).
    pub fn delete_link(&mut self, index: u32) -> io::Result<()> {
        self.request(RouteNetlinkMessage::DelLink(message_for(index)), 0)?;
        Ok(())
    }

    /// Deletes the link called `name`; false if there was none.
    pub fn delete_link_by_name(&mut self, name: &str) -> io::Result<bool> {
        let mut message = LinkMessage::default();
        message
            .attributes
            .push(LinkAttribute::IfName(name.to_string()));
        match self.request(RouteNetlinkMessage::DelLink(message), 0) {
            Ok(_) => Ok(true),
            Err(e) if super::is_not_found(&e) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Sends an `RTM_SETLINK` for `index` with the given flag changes and attributes.
    fn set_link(
        &mut self,
        index: u32,
        flags: LinkFlags,
        change: LinkFlags,
        attributes: Vec<LinkAttribute>,
    ) -> io::Result<()> {
        let mut message = message_for(index);
        message.header.flags = flags;
        message.header.change_mask = change;
        message.attributes = attributes;
        self.request(RouteNetlinkMessage::SetLink(message), 0)?;
        Ok(())
    }

    pub fn set_up(&mut self, index: u32) -> io::Result<()> {
        self.set_link(index, LinkFlags::Up, LinkFlags::Up, Vec::new())
    }

    pub fn set_down(&mut self, index: u32) -> io::Result<()> {
        self.set_link(index, LinkFlags::empty(), LinkFlags::Up, Vec::new())
    }

    pub fn set_promisc(&mut self, index: u32, on: bool) -> io::Result<()> {
        let flags = if on {
            LinkFlags::Promisc
        } else {
            LinkFlags::empty()
        };
        self.set_link(index, flags, LinkFlags::Promisc, Vec::new())
    }

    /// Attaches the link to a bridge (`master_index` 0 detaches it).
    pub fn set_master(&mut self, index: u32, master_index: u32) -> io::Result<()> {
        let attributes = vec![LinkAttribute::Controller(master_index)];
        self.set_link(index, LinkFlags::empty(), LinkFlags::empty(), attributes)
    }

    pub fn set_mtu(&mut self, index: u32, mtu: u32) -> io::Result<()> {
        self.set_link(
            index,
            LinkFlags::empty(),
            LinkFlags::empty(),
            vec![LinkAttribute::Mtu(mtu)],
        )
    }

    pub fn set_mac(&mut self, index: u32, mac: [u8; 6]) -> io::Result<()> {
        let attributes = vec![LinkAttribute::Address(mac.to_vec())];
        self.set_link(index, LinkFlags::empty(), LinkFlags::empty(), attributes)
    }

    /// Sets hairpin mode on a bridge port (traffic may leave by the port it came in on).
    pub fn set_hairpin(&mut self, index: u32, on: bool) -> io::Result<()> {
        self.set_bridge_port_flag(index, IFLA_BRPORT_MODE, on)
    }

    /// Sets a bridge port isolated (isolated ports only talk to non-isolated ones).
    pub fn set_port_isolated(&mut self, index: u32, on: bool) -> io::Result<()> {
        self.set_bridge_port_flag(index, IFLA_BRPORT_ISOLATED, on)
    }

    /// Bridge port options go in a nested `IFLA_PROTINFO` of an `AF_BRIDGE` `RTM_SETLINK`.
    fn set_bridge_port_flag(&mut self, index: u32, option: u16, on: bool) -> io::Result<()> {
        let mut message = message_for(index);
        message.header.interface_family = AddressFamily::Bridge;
        let value = DefaultNla::new(option, vec![u8::from(on)]);
        message.attributes.push(LinkAttribute::ProtoInfoBridge(vec![
            LinkProtoInfoBridge::Other(value),
        ]));
        self.request(RouteNetlinkMessage::SetLink(message), 0)?;
        Ok(())
    }

    /// Waits until the link is operationally up, woken by link events rather than polling with sleeps.
    /// Fails with `ErrorKind::TimedOut` after `timeout`, and if the link disappears.
    pub fn wait_oper_up(&mut self, index: u32, timeout: Duration) -> io::Result<()> {
        let deadline = Instant::now() + timeout;
        // Subscribe before looking, so that no change between the look and the wait is missed.
        let events = self.subscribe(&[libc::RTNLGRP_LINK])?;
        loop {
            match self.link_by_index(index)? {
                None => return Err(not_found(index)),
                Some(link) if link.oper_up => return Ok(()),
                Some(_) => {}
            }
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() || !wait_readable(events.as_raw_fd(), remaining)? {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("link {index} not operationally up after {timeout:?}"),
                ));
            }
            // The event only wakes us up; the link is looked at again above. ENOBUFS (events lost) is
            // fine for the same reason.
            match events.recv_from_full() {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {}
                Err(e) => return Err(e),
            }
        }
    }
}

/// Waits up to `timeout` for `fd` to become readable; false on timeout.
fn wait_readable(fd: i32, timeout: Duration) -> io::Result<bool> {
    let mut pollfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
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
