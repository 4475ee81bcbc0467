//! Links of the interface plugins of the reference suite: macvlan, ipvlan and vlan (on a parent link) and
//! dummy, created straight into a pod's namespace, and their settings read back for CHECK.
//!
//! A kernel built without one of these kinds answers the creation with EOPNOTSUPP; [`missing_support`] names
//! the kernel option that is missing.

use std::io;
use std::os::fd::{AsFd, AsRawFd};

use super::link::{ifinfomsg, split_link_message, Link};
use super::wire::{self, attributes, Request};
use super::Netlink;
use crate::netns::NetNs;

const IFLA_MACVLAN_MODE: u16 = 1;
const IFLA_MACVLAN_BC_QUEUE_LEN: u16 = 7;
const IFLA_IPVLAN_MODE: u16 = 1;
const IFLA_VLAN_ID: u16 = 1;
/// `IFLA_LINK_NETNSID`: where a link's lower device lives, as a namespace id.
const IFLA_LINK_NETNSID: u16 = 37;

/// `enum macvlan_mode` of the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MacvlanMode {
    Private,
    Vepa,
    Bridge,
    Passthru,
    /// A mode this code has no name for (e.g. `source`), as the kernel reports it.
    Other(u32),
}

impl MacvlanMode {
    pub fn to_kernel(self) -> u32 {
        match self {
            MacvlanMode::Private => 1,
            MacvlanMode::Vepa => 2,
            MacvlanMode::Bridge => 4,
            MacvlanMode::Passthru => 8,
            MacvlanMode::Other(mode) => mode,
        }
    }

    pub fn from_kernel(mode: u32) -> MacvlanMode {
        match mode {
            1 => MacvlanMode::Private,
            2 => MacvlanMode::Vepa,
            4 => MacvlanMode::Bridge,
            8 => MacvlanMode::Passthru,
            other => MacvlanMode::Other(other),
        }
    }
}

/// `enum ipvlan_mode` of the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IpvlanMode {
    L2,
    L3,
    L3s,
    Other(u16),
}

impl IpvlanMode {
    pub fn to_kernel(self) -> u16 {
        match self {
            IpvlanMode::L2 => 0,
            IpvlanMode::L3 => 1,
            IpvlanMode::L3s => 2,
            IpvlanMode::Other(mode) => mode,
        }
    }

    pub fn from_kernel(mode: u16) -> IpvlanMode {
        match mode {
            0 => IpvlanMode::L2,
            1 => IpvlanMode::L3,
            2 => IpvlanMode::L3s,
            other => IpvlanMode::Other(other),
        }
    }
}

/// The mode as configs and `ip link` name it (`l2`, `l3`, `l3s`; one the kernel added later: `mode N`).
impl std::fmt::Display for IpvlanMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            IpvlanMode::L2 => f.write_str("l2"),
            IpvlanMode::L3 => f.write_str("l3"),
            IpvlanMode::L3s => f.write_str("l3s"),
            IpvlanMode::Other(mode) => write!(f, "mode {mode}"),
        }
    }
}

/// What kind of link to create, with the settings of its kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkKind {
    /// `bcqueuelen` is only sent when set (the kernel keeps its default, 1000, otherwise).
    Macvlan {
        mode: MacvlanMode,
        bc_queue_len: Option<u32>,
    },
    Ipvlan {
        mode: IpvlanMode,
    },
    Vlan {
        id: u16,
    },
    Dummy,
}

impl LinkKind {
    /// `IFLA_INFO_KIND`.
    pub fn name(&self) -> &'static str {
        match self {
            LinkKind::Macvlan { .. } => "macvlan",
            LinkKind::Ipvlan { .. } => "ipvlan",
            LinkKind::Vlan { .. } => "vlan",
            LinkKind::Dummy => "dummy",
        }
    }

    /// The kernel option (and module) that provides the kind.
    pub fn kernel_option(&self) -> &'static str {
        match self {
            LinkKind::Macvlan { .. } => "CONFIG_MACVLAN",
            LinkKind::Ipvlan { .. } => "CONFIG_IPVLAN",
            LinkKind::Vlan { .. } => "CONFIG_VLAN_8021Q",
            LinkKind::Dummy => "CONFIG_DUMMY",
        }
    }

    fn add_data(&self, request: &mut Request) {
        match *self {
            LinkKind::Macvlan { mode, bc_queue_len } => {
                request.attr_u32(IFLA_MACVLAN_MODE, mode.to_kernel());
                if let Some(len) = bc_queue_len {
                    request.attr_u32(IFLA_MACVLAN_BC_QUEUE_LEN, len);
                }
            }
            LinkKind::Ipvlan { mode } => {
                request.attr(IFLA_IPVLAN_MODE, &mode.to_kernel().to_ne_bytes());
            }
            LinkKind::Vlan { id } => {
                request.attr(IFLA_VLAN_ID, &id.to_ne_bytes());
            }
            LinkKind::Dummy => {}
        }
    }

    fn has_data(&self) -> bool {
        !matches!(self, LinkKind::Dummy)
    }
}

/// A link to create: its kind, the parent it sits on (`IFLA_LINK`), MTU and MAC when set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewLink {
    pub kind: LinkKind,
    pub parent: Option<u32>,
    pub mtu: Option<u32>,
    pub mac: Option<[u8; 6]>,
}

/// A kind-specific setting read back from a link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KindData {
    Macvlan {
        mode: MacvlanMode,
    },
    Ipvlan {
        mode: IpvlanMode,
    },
    Vlan {
        id: u16,
    },
    /// Another kind, or none.
    Other,
}

/// The `RTM_NEWLINK` that creates `link` as `name`, inside the namespace of the open file `netns_fd` if given.
fn new_link_request(name: &str, link: &NewLink, netns_fd: Option<u32>) -> Request {
    let mut request = Request::new(libc::RTM_NEWLINK, &ifinfomsg(0, 0, 0, 0));
    request.attr_str(libc::IFLA_IFNAME, name);
    if let Some(mtu) = link.mtu {
        request.attr_u32(libc::IFLA_MTU, mtu);
    }
    if let Some(mac) = link.mac {
        request.attr(libc::IFLA_ADDRESS, &mac);
    }
    if let Some(parent) = link.parent {
        request.attr_u32(libc::IFLA_LINK, parent);
    }
    if let Some(fd) = netns_fd {
        request.attr_u32(libc::IFLA_NET_NS_FD, fd);
    }
    let info = request.begin_nested(libc::IFLA_LINKINFO);
    request.attr_str(libc::IFLA_INFO_KIND, link.kind.name());
    if link.kind.has_data() {
        let data = request.begin_nested(libc::IFLA_INFO_DATA);
        link.kind.add_data(&mut request);
        request.end_nested(data);
    }
    request.end_nested(info);
    request
}

/// The kind settings of an `RTM_NEWLINK` payload.
fn kind_data_of(data: &[u8]) -> Option<KindData> {
    let (_, _, attrs) = split_link_message(data)?;
    let Some((_, info)) = attributes(attrs).find(|(kind, _)| *kind == libc::IFLA_LINKINFO) else {
        return Some(KindData::Other);
    };
    let mut kind = String::new();
    for (attr, value) in attributes(info) {
        match attr {
            libc::IFLA_INFO_KIND => kind = wire::as_string(value),
            libc::IFLA_INFO_DATA => {
                let find = |wanted: u16| attributes(value).find(|(a, _)| *a == wanted).map(|(_, v)| v);
                return Some(match kind.as_str() {
                    "macvlan" => KindData::Macvlan {
                        mode: MacvlanMode::from_kernel(find(IFLA_MACVLAN_MODE).and_then(wire::as_u32).unwrap_or(0)),
                    },
                    "ipvlan" => KindData::Ipvlan {
                        mode: IpvlanMode::from_kernel(find(IFLA_IPVLAN_MODE).and_then(wire::as_u16).unwrap_or(0)),
                    },
                    "vlan" => KindData::Vlan { id: find(IFLA_VLAN_ID).and_then(wire::as_u16).unwrap_or(0) },
                    _ => KindData::Other,
                });
            }
            _ => {}
        }
    }
    Some(KindData::Other)
}

/// True for the kernel's answer to a link kind it was built without (no module to load either).
pub fn is_unsupported_kind(err: &io::Error) -> bool {
    err.raw_os_error() == Some(libc::EOPNOTSUPP)
}

/// The message for a kernel without `kind`: "this kernel has no ipvlan support (CONFIG_IPVLAN)".
pub fn missing_support(kind: &LinkKind) -> String {
    format!("this kernel has no {} support ({})", kind.name(), kind.kernel_option())
}

impl Netlink {
    /// Creates `link` as `name` in `netns` (this socket's namespace when None); the parent index is one of
    /// this socket's namespace. The link is down. Returns nothing: its index in `netns` is looked up there.
    pub fn create_kind(&mut self, name: &str, link: &NewLink, netns: Option<&NetNs>) -> io::Result<()> {
        let fd = netns.map(|ns| ns.as_fd().as_raw_fd() as u32);
        let mut request = new_link_request(name, link, fd);
        self.request_raw(&mut request, netlink_packet_core::NLM_F_CREATE | netlink_packet_core::NLM_F_EXCL)?;
        Ok(())
    }

    /// The link called `name` and its kind settings, if there is such a link.
    pub fn link_with_kind_data(&mut self, name: &str) -> io::Result<Option<(Link, KindData)>> {
        self.link_message_by_name(name, |data| Some((Link::parse(data)?.0, kind_data_of(data)?)))
    }

    /// The links of `kind` (`ipvlan` or `ipvtap`) of this socket's namespace. The kernel leaves the others out
    /// of the dump when it knows the kind, so a namespace without such links answers with an empty dump.
    pub fn ipvlan_links(&mut self, kind: &str) -> io::Result<Vec<IpvlanLink>> {
        self.dump(&mut links_of_kind_request(kind), libc::RTM_NEWLINK, ipvlan_link_of)
    }
}

/// An ipvlan or ipvtap link as its namespace lists it. The kernel keeps one ipvlan "port" per master, and its
/// mode is that of every ipvlan link of the master: a new one of another mode switches them all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpvlanLink {
    pub name: String,
    /// `IFLA_LINK`: the master's index, in the master's namespace.
    pub master: u32,
    /// `IFLA_LINK_NETNSID`: the id this namespace gives the master's, when the master is in another one.
    pub master_nsid: Option<i32>,
    pub mode: IpvlanMode,
}

/// A dump of the links of `kind` only (`IFLA_LINKINFO` with `IFLA_INFO_KIND` as the filter).
fn links_of_kind_request(kind: &str) -> Request {
    let mut request = super::link::link_request(libc::RTM_GETLINK, 0, 0);
    let info = request.begin_nested(libc::IFLA_LINKINFO);
    request.attr_str(libc::IFLA_INFO_KIND, kind);
    request.end_nested(info);
    request
}

/// The ipvlan link of an `RTM_NEWLINK` payload; None for a link of another kind.
fn ipvlan_link_of(data: &[u8]) -> Option<IpvlanLink> {
    let (_, _, attrs) = split_link_message(data)?;
    let mut link = IpvlanLink { name: String::new(), master: 0, master_nsid: None, mode: IpvlanMode::L3 };
    let mut is_ipvlan = false;
    for (attr, value) in attributes(attrs) {
        match attr {
            libc::IFLA_IFNAME => link.name = wire::as_string(value),
            libc::IFLA_LINK => link.master = wire::as_u32(value)?,
            IFLA_LINK_NETNSID => link.master_nsid = Some(wire::as_u32(value)? as i32),
            libc::IFLA_LINKINFO => {
                for (info, value) in attributes(value) {
                    match info {
                        libc::IFLA_INFO_KIND => {
                            is_ipvlan = matches!(wire::as_string(value).as_str(), "ipvlan" | "ipvtap")
                        }
                        libc::IFLA_INFO_DATA => {
                            if let Some((_, mode)) = attributes(value).find(|(a, _)| *a == IFLA_IPVLAN_MODE) {
                                link.mode = IpvlanMode::from_kernel(wire::as_u16(mode)?);
                            }
                        }
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    is_ipvlan.then_some(link)
}

#[cfg(test)]
mod tests {
    use netlink_packet_route::link::{
        InfoData, InfoIpVlan, InfoKind, InfoMacVlan, InfoVlan, IpVlanMode, LinkAttribute, LinkInfo, LinkMessage,
        MacVlanMode,
    };

    use super::*;
    use crate::netlink::wire::emitted;

    /// What netlink-packet-route emits for the same link, attributes in the same order.
    fn reference(name: &str, link: &NewLink, netns_fd: Option<u32>) -> LinkMessage {
        let mut attributes = vec![LinkAttribute::IfName(name.into())];
        if let Some(mtu) = link.mtu {
            attributes.push(LinkAttribute::Mtu(mtu));
        }
        if let Some(mac) = link.mac {
            attributes.push(LinkAttribute::Address(mac.to_vec()));
        }
        if let Some(parent) = link.parent {
            attributes.push(LinkAttribute::Link(parent));
        }
        if let Some(fd) = netns_fd {
            attributes.push(LinkAttribute::NetNsFd(fd as i32));
        }
        let info = match link.kind {
            LinkKind::Macvlan { mode, bc_queue_len } => {
                let mode = match mode {
                    MacvlanMode::Private => MacVlanMode::Private,
                    MacvlanMode::Vepa => MacVlanMode::Vepa,
                    MacvlanMode::Bridge => MacVlanMode::Bridge,
                    MacvlanMode::Passthru => MacVlanMode::Passthrough,
                    MacvlanMode::Other(m) => MacVlanMode::Other(m),
                };
                let mut data = vec![InfoMacVlan::Mode(mode)];
                data.extend(bc_queue_len.map(InfoMacVlan::BcQueueLen));
                vec![LinkInfo::Kind(InfoKind::MacVlan), LinkInfo::Data(InfoData::MacVlan(data))]
            }
            LinkKind::Ipvlan { mode } => {
                let mode = match mode {
                    IpvlanMode::L2 => IpVlanMode::L2,
                    IpvlanMode::L3 => IpVlanMode::L3,
                    IpvlanMode::L3s => IpVlanMode::L3S,
                    IpvlanMode::Other(m) => IpVlanMode::Other(m),
                };
                vec![LinkInfo::Kind(InfoKind::IpVlan), LinkInfo::Data(InfoData::IpVlan(vec![InfoIpVlan::Mode(mode)]))]
            }
            LinkKind::Vlan { id } => {
                vec![LinkInfo::Kind(InfoKind::Vlan), LinkInfo::Data(InfoData::Vlan(vec![InfoVlan::Id(id)]))]
            }
            LinkKind::Dummy => vec![LinkInfo::Kind(InfoKind::Dummy)],
        };
        attributes.push(LinkAttribute::LinkInfo(info));
        let mut message = LinkMessage::default();
        message.attributes = attributes;
        message
    }

    fn cases() -> Vec<NewLink> {
        let on = |kind| NewLink { kind, parent: Some(7), mtu: None, mac: None };
        let mut cases = Vec::new();
        for mode in [MacvlanMode::Bridge, MacvlanMode::Private, MacvlanMode::Vepa, MacvlanMode::Passthru] {
            cases.push(on(LinkKind::Macvlan { mode, bc_queue_len: None }));
        }
        cases.push(NewLink {
            kind: LinkKind::Macvlan { mode: MacvlanMode::Bridge, bc_queue_len: Some(5000) },
            parent: Some(3),
            mtu: Some(1400),
            mac: Some([2, 0, 0, 0, 0, 9]),
        });
        for mode in [IpvlanMode::L2, IpvlanMode::L3, IpvlanMode::L3s] {
            cases.push(on(LinkKind::Ipvlan { mode }));
        }
        cases.push(NewLink { mtu: Some(9000), ..on(LinkKind::Ipvlan { mode: IpvlanMode::L3 }) });
        for id in [0, 1, 100, 4094] {
            cases.push(on(LinkKind::Vlan { id }));
        }
        cases.push(NewLink { mtu: Some(1496), ..on(LinkKind::Vlan { id: 42 }) });
        cases.push(NewLink { kind: LinkKind::Dummy, parent: None, mtu: None, mac: None });
        cases
    }

    #[test]
    fn creation_requests_match_netlink_packet_route() {
        for link in cases() {
            for fd in [None, Some(5)] {
                let ours = new_link_request("tmp1234", &link, fd);
                assert_eq!(ours.payload(), emitted(&reference("tmp1234", &link, fd)), "{link:?} fd {fd:?}");
            }
        }
    }

    #[test]
    fn kind_settings_read_back() {
        for link in cases() {
            let message = emitted(&reference("x", &link, None));
            let want = match link.kind {
                LinkKind::Macvlan { mode, .. } => KindData::Macvlan { mode },
                LinkKind::Ipvlan { mode } => KindData::Ipvlan { mode },
                LinkKind::Vlan { id } => KindData::Vlan { id },
                LinkKind::Dummy => KindData::Other,
            };
            assert_eq!(kind_data_of(&message), Some(want), "{link:?}");
        }
        let bare = emitted(&LinkMessage::default());
        assert_eq!(kind_data_of(&bare), Some(KindData::Other));
    }

    #[test]
    fn ipvlan_links_are_read_with_their_master_and_mode() {
        for link in cases() {
            let mut message = reference("x", &link, None);
            message.attributes.push(LinkAttribute::LinkNetNsId(4));
            let read = ipvlan_link_of(&emitted(&message));
            match link.kind {
                LinkKind::Ipvlan { mode } => {
                    let want = IpvlanLink { name: "x".into(), master: 7, master_nsid: Some(4), mode };
                    assert_eq!(read, Some(want), "{link:?}");
                }
                _ => assert_eq!(read, None, "{link:?}"),
            }
        }
        let l3s = NewLink { kind: LinkKind::Ipvlan { mode: IpvlanMode::L3s }, parent: Some(7), mtu: None, mac: None };
        let same_namespace = emitted(&reference("y", &l3s, None));
        assert_eq!(ipvlan_link_of(&same_namespace).map(|l| (l.master, l.master_nsid)), Some((7, None)));
    }

    #[test]
    fn the_dump_of_one_kind_matches_netlink_packet_route() {
        let mut message = LinkMessage::default();
        message.attributes = vec![LinkAttribute::LinkInfo(vec![LinkInfo::Kind(InfoKind::IpVlan)])];
        assert_eq!(links_of_kind_request("ipvlan").payload(), emitted(&message));
    }

    #[test]
    fn missing_support_names_the_kernel_option() {
        let ipvlan = LinkKind::Ipvlan { mode: IpvlanMode::L2 };
        assert_eq!(missing_support(&ipvlan), "this kernel has no ipvlan support (CONFIG_IPVLAN)");
        assert_eq!(missing_support(&LinkKind::Vlan { id: 1 }), "this kernel has no vlan support (CONFIG_VLAN_8021Q)");
        assert!(is_unsupported_kind(&io::Error::from_raw_os_error(libc::EOPNOTSUPP)));
    }
}
