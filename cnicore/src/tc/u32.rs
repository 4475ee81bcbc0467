//! u32 filters: the match-all filter with a mirred "egress redirect" action that feeds an ifb device
//! (`tc filter add dev X parent ffff: protocol all prio 1 u32 match u32 0 0 flowid 1:1
//!  action mirred egress redirect dev IFB`), listing filters, and deleting them.

use std::io;

use netlink_packet_core::{NLM_F_CREATE, NLM_F_EXCL};

use super::{kind_and_options, tc_request, TcHeader};
use crate::netlink::wire::{self, attributes, Request, NLA_F_NESTED};
use crate::netlink::Netlink;

/// `TCA_U32_*` options of a u32 filter (linux/pkt_cls.h).
const TCA_U32_CLASSID: u16 = 1;
const TCA_U32_SEL: u16 = 5;
const TCA_U32_ACT: u16 = 7;
/// `TC_U32_TERMINAL`: a selector flag; the match is final.
const TC_U32_TERMINAL: u8 = 1;
/// `TCA_ACT_*` attributes of one action; actions are numbered from `TCA_ACT_TAB` (1) in a list.
const TCA_ACT_TAB: u16 = 1;
const TCA_ACT_KIND: u16 = 1;
const TCA_ACT_OPTIONS: u16 = 2;
const TCA_ACT_COOKIE: u16 = 6;
/// `TCA_MIRRED_PARMS`: `struct tc_mirred` {tc_gen {index, capab, action, refcnt, bindcnt}, eaction, ifindex}.
const TCA_MIRRED_PARMS: u16 = 2;
const TC_MIRRED_LEN: usize = 28;
/// `TCA_EGRESS_REDIR`: the mirred action redirects to the target's egress.
const TCA_EGRESS_REDIR: u32 = 1;
/// `TC_ACT_STOLEN`: the packet is consumed (redirected).
const TC_ACT_STOLEN: u32 = 4;

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
    /// The filter in an `RTM_NEWTFILTER` payload.
    fn parse(data: &[u8]) -> Option<Filter> {
        let (header, attrs) = TcHeader::parse(data)?;
        let (kind, options) = kind_and_options(attrs);
        let mut redirects = Vec::new();
        if let (Some(options), "u32") = (options, kind.as_str()) {
            for (_, actions) in attributes(options).filter(|(option, _)| *option == TCA_U32_ACT) {
                redirects.extend(attributes(actions).filter_map(|(_, action)| redirect_of(action)));
            }
        }
        Some(Filter {
            index: header.index,
            parent: header.parent,
            handle: header.handle,
            prio: (header.info >> 16) as u16,
            protocol: u16::from_be((header.info & 0xFFFF) as u16),
            kind,
            redirects,
        })
    }
}

/// The redirect of one action if it is a mirred action.
fn redirect_of(action: &[u8]) -> Option<Redirect> {
    let mut kind = None;
    let mut options = None;
    let mut cookie = Vec::new();
    for (attribute, value) in attributes(action) {
        match attribute {
            TCA_ACT_KIND => kind = Some(wire::as_string(value)),
            TCA_ACT_OPTIONS => options = Some(value),
            TCA_ACT_COOKIE => cookie = value.to_vec(),
            _ => {}
        }
    }
    if kind.as_deref() != Some("mirred") {
        return None;
    }
    let parms =
        attributes(options?).find(|(option, value)| *option == TCA_MIRRED_PARMS && value.len() >= TC_MIRRED_LEN)?.1;
    Some(Redirect {
        ifindex: wire::u32_at(parms, 24)?,
        egress_redirect: wire::u32_at(parms, 20)? == TCA_EGRESS_REDIR,
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
        let mut request = tc_request(libc::RTM_GETTFILTER, index, 0, parent, 0)?;
        self.dump(&mut request, libc::RTM_NEWTFILTER, Filter::parse)
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
        let mut request = redirect_request(index, parent, prio, target, cookie)?;
        self.request_raw(&mut request, NLM_F_CREATE | NLM_F_EXCL)?;
        Ok(())
    }

    /// Deletes one filter node (by its handle) as listed by [`Netlink::filters`].
    pub fn delete_filter(&mut self, filter: &Filter) -> io::Result<()> {
        let info = filter_info(filter.prio, filter.protocol);
        let mut request = tc_request(libc::RTM_DELTFILTER, filter.index, filter.handle, filter.parent, info)?;
        request.attr_str(libc::TCA_KIND, &filter.kind);
        self.request_raw(&mut request, 0)?;
        Ok(())
    }

    /// Deletes every filter at `parent`/`prio` of interface `index` (the whole classifier instance, e.g.
    /// a u32 hash table with its nodes).
    pub fn delete_filter_prio(&mut self, index: u32, parent: u32, prio: u16, protocol: u16) -> io::Result<()> {
        if prio == 0 {
            // Priority 0 would flush every filter of the parent.
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "filter priority 0 would delete every filter"));
        }
        let mut request = tc_request(libc::RTM_DELTFILTER, index, 0, parent, filter_info(prio, protocol))?;
        self.request_raw(&mut request, 0)?;
        Ok(())
    }
}

/// The `RTM_NEWTFILTER` of [`Netlink::add_redirect_filter`].
fn redirect_request(index: u32, parent: u32, prio: u16, target: u32, cookie: Option<&[u8]>) -> io::Result<Request> {
    let mut request = tc_request(libc::RTM_NEWTFILTER, index, 0, parent, filter_info(prio, ETH_P_ALL))?;
    request.attr_str(libc::TCA_KIND, "u32");
    let options = request.begin_nested(libc::TCA_OPTIONS);
    request.attr_u32(TCA_U32_CLASSID, REFERENCE_CLASS_ID);
    request.attr(TCA_U32_SEL, &match_all());
    let actions = request.begin_nested(TCA_U32_ACT);
    add_mirred_redirect(&mut request, target, cookie);
    request.end_nested(actions);
    request.end_nested(options);
    Ok(request)
}

/// `struct tc_u32_sel` with one key that matches anything (`match u32 0 0`), terminal.
fn match_all() -> [u8; 32] {
    let mut selector = [0; 32];
    selector[0] = TC_U32_TERMINAL;
    selector[2] = 1; // nkeys; the key (mask, value, offset, offset mask) is all zeros
    selector
}

/// One mirred action (the first of the list) redirecting to the egress of `target`.
fn add_mirred_redirect(request: &mut Request, target: u32, cookie: Option<&[u8]>) {
    let action = request.begin_nested(TCA_ACT_TAB);
    request.attr_str(TCA_ACT_KIND, "mirred");
    let options = request.begin_nested(TCA_ACT_OPTIONS | NLA_F_NESTED);
    let mut parms = [0; TC_MIRRED_LEN];
    parms[8..12].copy_from_slice(&TC_ACT_STOLEN.to_ne_bytes());
    parms[20..24].copy_from_slice(&TCA_EGRESS_REDIR.to_ne_bytes());
    parms[24..28].copy_from_slice(&target.to_ne_bytes());
    request.attr(TCA_MIRRED_PARMS, &parms);
    request.end_nested(options);
    if let Some(cookie) = cookie {
        request.attr(TCA_ACT_COOKIE, cookie);
    }
    request.end_nested(action);
}

#[cfg(test)]
mod tests {
    //! Requests compared byte for byte with netlink-packet-route's, and the parser fed its messages.
    use netlink_packet_route::tc::{
        TcAction, TcActionAttribute, TcActionMirrorOption, TcActionOption, TcActionType, TcAttribute,
        TcFilterU32Option, TcHandle, TcMessage, TcMirror, TcMirrorActionType, TcOption, TcU32Key, TcU32Selector,
        TcU32SelectorFlags,
    };

    use super::*;
    use crate::netlink::wire::emitted;

    /// The filter the earlier netlink-packet-route code built.
    fn reference(index: u32, parent: u32, prio: u16, target: u32, cookie: Option<&[u8]>) -> TcMessage {
        let mut message = TcMessage::with_index(index as i32);
        message.header.parent = TcHandle::from(parent);
        message.header.info = filter_info(prio, ETH_P_ALL);
        message.attributes.push(TcAttribute::Kind("u32".into()));
        let mut selector = TcU32Selector::default();
        selector.flags = TcU32SelectorFlags::Terminal;
        selector.nkeys = 1;
        selector.keys = vec![TcU32Key::default()];
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
        message.attributes.push(TcAttribute::Options(vec![
            TcOption::U32(TcFilterU32Option::ClassId(TcHandle::from(REFERENCE_CLASS_ID))),
            TcOption::U32(TcFilterU32Option::Selector(selector)),
            TcOption::U32(TcFilterU32Option::Action(vec![action])),
        ]));
        message
    }

    #[test]
    fn redirect_filter() {
        for cookie in [None, Some(&b"0123456789abcdef"[..])] {
            let request = redirect_request(4, super::super::handle::INGRESS, 1, 9, cookie).unwrap();
            let expected = reference(4, super::super::handle::INGRESS, 1, 9, cookie);
            assert_eq!(request.payload(), emitted(&expected));

            let mut reported = expected.clone();
            reported.header.handle = TcHandle::from(0x8000_0800);
            let filter = Filter::parse(&emitted(&reported)).unwrap();
            assert_eq!(
                filter,
                Filter {
                    index: 4,
                    parent: super::super::handle::INGRESS,
                    handle: 0x8000_0800,
                    prio: 1,
                    protocol: ETH_P_ALL,
                    kind: "u32".into(),
                    redirects: vec![Redirect {
                        ifindex: 9,
                        egress_redirect: true,
                        cookie: cookie.unwrap_or(&[]).to_vec()
                    }],
                }
            );
        }
    }

    #[test]
    fn deletion() {
        let mut request = tc_request(libc::RTM_DELTFILTER, 4, 0x800, 0xFFFF_0000, filter_info(1, ETH_P_ALL)).unwrap();
        request.attr_str(libc::TCA_KIND, "u32");
        let mut expected = TcMessage::with_index(4);
        expected.header.handle = TcHandle::from(0x800);
        expected.header.parent = TcHandle::from(0xFFFF_0000);
        expected.header.info = filter_info(1, ETH_P_ALL);
        expected.attributes.push(TcAttribute::Kind("u32".into()));
        assert_eq!(request.payload(), emitted(&expected));
    }
}
