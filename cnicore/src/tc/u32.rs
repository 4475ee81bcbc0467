//! u32 filters: the match-all filter with a mirred "egress redirect" action that feeds an ifb device
//! (`tc filter add dev X parent ffff: protocol all prio 1 u32 match u32 0 0 flowid 1:1
//!  action mirred egress redirect dev IFB`), listing filters, and deleting them.

use std::io;

use netlink_packet_core::{NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL};
use netlink_packet_route::tc::{
    TcAction, TcActionAttribute, TcActionMirrorOption, TcActionOption, TcActionType, TcAttribute, TcFilterU32Option,
    TcHandle, TcMessage, TcMirror, TcMirrorActionType, TcOption, TcU32Key, TcU32Selector, TcU32SelectorFlags,
};
use netlink_packet_route::RouteNetlinkMessage;

use super::tc_message;
use crate::netlink::Netlink;

/// `ETH_P_ALL`: the filter sees every protocol.
pub const ETH_P_ALL: u16 = 0x0003;

/// The class id the reference bandwidth plugin gives its filter (`flowid 1:1`).
const REFERENCE_CLASS_ID: u32 = super::handle::make(1, 1);

/// A mirred action of a filter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Redirect {
    /// Target interface index.
    pub ifindex: u32,
    /// True for "egress redirect" (the packet leaves through the target), the kind the ifb needs.
    pub egress_redirect: bool,
    /// `TCA_ACT_COOKIE`: up to 16 opaque bytes the creator attached (empty when none).
    pub cookie: Vec<u8>,
}

/// A filter as the kernel reports it. A u32 filter dumps as one entry for its hash table (no actions)
/// and one per match node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Filter {
    pub index: u32,
    pub parent: u32,
    pub handle: u32,
    /// Priority (`pref`); filters are tried in increasing order.
    pub prio: u16,
    /// Ethernet protocol in host order (e.g. [`ETH_P_ALL`]).
    pub protocol: u16,
    pub kind: String,
    /// The mirred actions of a u32 node.
    pub redirects: Vec<Redirect>,
}

impl Filter {
    fn from_message(message: &TcMessage) -> Filter {
        let info = message.header.info;
        let mut filter = Filter {
            index: message.header.index as u32,
            parent: message.header.parent.into(),
            handle: message.header.handle.into(),
            prio: (info >> 16) as u16,
            protocol: u16::from_be((info & 0xFFFF) as u16),
            kind: String::new(),
            redirects: Vec::new(),
        };
        for attribute in &message.attributes {
            match attribute {
                TcAttribute::Kind(kind) => filter.kind = kind.clone(),
                TcAttribute::Options(options) => {
                    for option in options {
                        if let TcOption::U32(TcFilterU32Option::Action(actions)) = option {
                            filter.redirects.extend(actions.iter().filter_map(redirect_of));
                        }
                    }
                }
                _ => {}
            }
        }
        filter
    }
}

fn redirect_of(action: &TcAction) -> Option<Redirect> {
    let mut mirror = None;
    let mut cookie = Vec::new();
    for attribute in &action.attributes {
        match attribute {
            TcActionAttribute::Options(options) => {
                for option in options {
                    if let TcActionOption::Mirror(TcActionMirrorOption::Parms(parms)) = option {
                        mirror = Some(parms.clone());
                    }
                }
            }
            TcActionAttribute::Cookie(bytes) => cookie = bytes.clone(),
            _ => {}
        }
    }
    let mirror = mirror?;
    Some(Redirect {
        ifindex: mirror.ifindex,
        egress_redirect: mirror.eaction == TcMirrorActionType::EgressRedir,
        cookie,
    })
}

/// `info` of a filter message: priority in the high half, protocol in network order in the low half.
fn filter_info(prio: u16, protocol: u16) -> u32 {
    u32::from(prio) << 16 | u32::from(protocol.to_be())
}

impl Netlink {
    /// The filters attached at `parent` (e.g. [`super::handle::INGRESS`]) of interface `index`.
    pub fn filters(&mut self, index: u32, parent: u32) -> io::Result<Vec<Filter>> {
        let message = tc_message(index, 0, parent)?;
        let replies = self.request(RouteNetlinkMessage::GetTrafficFilter(message), NLM_F_DUMP)?;
        Ok(replies
            .iter()
            .filter_map(|reply| match reply {
                RouteNetlinkMessage::NewTrafficFilter(message) => Some(Filter::from_message(message)),
                _ => None,
            })
            .collect())
    }

    /// Adds a u32 filter at `parent`/`prio` of interface `index` that matches every packet (any
    /// protocol) and redirects it to the egress of interface `target` (mirred, verdict "stolen"), with
    /// class id 1:1 as the reference bandwidth plugin. `cookie` (≤ 16 bytes) is stored on the action so
    /// the creator can recognise its filter later. EEXIST/EINVAL when `prio` is taken by another kind or
    /// protocol.
    pub fn add_redirect_filter(
        &mut self,
        index: u32,
        parent: u32,
        prio: u16,
        target: u32,
        cookie: Option<&[u8]>,
    ) -> io::Result<()> {
        if prio == 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "filter priority 0 means 'any' to the kernel"));
        }
        let mut message = tc_message(index, 0, parent)?;
        message.header.info = filter_info(prio, ETH_P_ALL);
        message.attributes.push(TcAttribute::Kind("u32".into()));
        message.attributes.push(TcAttribute::Options(vec![
            TcOption::U32(TcFilterU32Option::ClassId(TcHandle::from(REFERENCE_CLASS_ID))),
            TcOption::U32(TcFilterU32Option::Selector(match_all())),
            TcOption::U32(TcFilterU32Option::Action(vec![mirred_redirect(target, cookie)])),
        ]));
        self.request(RouteNetlinkMessage::NewTrafficFilter(message), NLM_F_CREATE | NLM_F_EXCL)?;
        Ok(())
    }

    /// Deletes one filter node (by its handle) as listed by [`Netlink::filters`].
    pub fn delete_filter(&mut self, filter: &Filter) -> io::Result<()> {
        let mut message = tc_message(filter.index, filter.handle, filter.parent)?;
        message.header.info = filter_info(filter.prio, filter.protocol);
        message.attributes.push(TcAttribute::Kind(filter.kind.clone()));
        self.request(RouteNetlinkMessage::DelTrafficFilter(message), 0)?;
        Ok(())
    }

    /// Deletes every filter at `parent`/`prio` of interface `index` (the whole classifier instance, e.g.
    /// a u32 hash table with its nodes).
    pub fn delete_filter_prio(&mut self, index: u32, parent: u32, prio: u16, protocol: u16) -> io::Result<()> {
        if prio == 0 {
            // Priority 0 would flush every filter of the parent.
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "filter priority 0 would delete every filter"));
        }
        let mut message = tc_message(index, 0, parent)?;
        message.header.info = filter_info(prio, protocol);
        self.request(RouteNetlinkMessage::DelTrafficFilter(message), 0)?;
        Ok(())
    }
}

/// One key that matches anything (`match u32 0 0`), terminal.
fn match_all() -> TcU32Selector {
    let mut selector = TcU32Selector::default();
    selector.flags = TcU32SelectorFlags::Terminal;
    selector.nkeys = 1;
    selector.keys = vec![TcU32Key::default()];
    selector
}

fn mirred_redirect(target: u32, cookie: Option<&[u8]>) -> TcAction {
    let mut parms = TcMirror::default();
    parms.generic.action = TcActionType::Stolen;
    parms.eaction = TcMirrorActionType::EgressRedir;
    parms.ifindex = target;
    let mut action = TcAction::default();
    action.attributes.push(TcActionAttribute::Kind("mirred".into()));
    action
        .attributes
        .push(TcActionAttribute::Options(vec![TcActionOption::Mirror(TcActionMirrorOption::Parms(parms))]));
    if let Some(cookie) = cookie {
        action.attributes.push(TcActionAttribute::Cookie(cookie.to_vec()));
    }
    action
}
