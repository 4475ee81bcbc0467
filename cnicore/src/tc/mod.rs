//! Traffic control over rtnetlink: qdiscs (tbf, ingress, clsact) and u32 filters with a mirred redirect,
//! built on [`Netlink::request`]. No `tc` process is ever spawned.
//!
//! Handles are plain `u32`s as the kernel sees them (`major << 16 | minor`); see [`handle`].

mod tbf;
mod u32;

use std::io;

use netlink_packet_core::{DefaultNla, Nla, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL, NLM_F_REPLACE};
use netlink_packet_route::tc::{TcAttribute, TcHandle, TcMessage, TcOption};
use netlink_packet_route::RouteNetlinkMessage;

use crate::netlink::Netlink;

pub use tbf::{tick_in_usec, ticks_to_time, time_to_ticks, Tbf, TbfError, MAX_BUFFER_TICKS};
pub use u32::{Filter, Redirect};

/// Well-known handles.
pub mod handle {
    /// `TC_H_ROOT`: the parent of a root qdisc.
    pub const ROOT: u32 = 0xFFFF_FFFF;
    /// `TC_H_INGRESS` (= `TC_H_CLSACT`): the parent of an ingress or clsact qdisc.
    pub const INGRESS_PARENT: u32 = 0xFFFF_FFF1;
    /// `ffff:`: the handle of an ingress or clsact qdisc, and the parent of filters on an ingress qdisc.
    pub const INGRESS: u32 = 0xFFFF_0000;
    /// `ffff:fff2`: the parent of filters on the ingress hook of a clsact qdisc.
    pub const CLSACT_INGRESS: u32 = 0xFFFF_FFF2;
    /// `ffff:fff3`: the parent of filters on the egress hook of a clsact qdisc.
    pub const CLSACT_EGRESS: u32 = 0xFFFF_FFF3;

    /// `major:minor`.
    pub const fn make(major: u16, minor: u16) -> u32 {
        (major as u32) << 16 | minor as u32
    }
}

/// What a qdisc is, as far as this module knows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QdiscKind {
    Tbf(Option<Tbf>),
    Ingress,
    Clsact,
    Other(String),
}

impl QdiscKind {
    pub fn name(&self) -> &str {
        match self {
            QdiscKind::Tbf(_) => "tbf",
            QdiscKind::Ingress => "ingress",
            QdiscKind::Clsact => "clsact",
            QdiscKind::Other(name) => name,
        }
    }
}

/// A qdisc as the kernel reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Qdisc {
    /// Interface index.
    pub index: u32,
    pub handle: u32,
    pub parent: u32,
    pub kind: QdiscKind,
}

impl Qdisc {
    fn from_message(message: &TcMessage) -> Qdisc {
        let mut name = String::new();
        let mut options = None;
        for attribute in &message.attributes {
            match attribute {
                TcAttribute::Kind(kind) => name = kind.clone(),
                TcAttribute::Options(values) => options = Some(values),
                _ => {}
            }
        }
        let kind = match name.as_str() {
            "tbf" => {
                QdiscKind::Tbf(options.and_then(|values| raw_options(values)).and_then(|raw| Tbf::from_options(&raw)))
            }
            "ingress" => QdiscKind::Ingress,
            "clsact" => QdiscKind::Clsact,
            _ => QdiscKind::Other(name),
        };
        Qdisc {
            index: message.header.index as u32,
            handle: message.header.handle.into(),
            parent: message.header.parent.into(),
            kind,
        }
    }

    /// True for the root qdisc of its device.
    pub fn is_root(&self) -> bool {
        self.parent == handle::ROOT
    }

    /// True for an ingress or clsact qdisc (the ones filters for incoming traffic hang on).
    pub fn is_ingress_like(&self) -> bool {
        matches!(self.kind, QdiscKind::Ingress | QdiscKind::Clsact)
    }

    /// The parent to give filters that must see the traffic a device receives.
    pub fn ingress_filter_parent(&self) -> Option<u32> {
        match self.kind {
            QdiscKind::Ingress => Some(handle::INGRESS),
            QdiscKind::Clsact => Some(handle::CLSACT_INGRESS),
            _ => None,
        }
    }
}

/// netlink-packet-route keeps the `TCA_OPTIONS` of kinds it does not know as one raw attribute holding
/// the nested payload; returns that payload.
fn raw_options(values: &[TcOption]) -> Option<Vec<u8>> {
    match values {
        [TcOption::Other(nla)] => {
            let mut payload = vec![0; nla.value_len()];
            nla.emit_value(&mut payload);
            Some(payload)
        }
        _ => None,
    }
}

fn tc_message(index: u32, handle: u32, parent: u32) -> io::Result<TcMessage> {
    let index = i32::try_from(index)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "interface index out of range"))?;
    let mut message = TcMessage::with_index(index);
    message.header.handle = TcHandle::from(handle);
    message.header.parent = TcHandle::from(parent);
    Ok(message)
}

impl Netlink {
    /// The qdiscs of interface `index` (every interface when `None`). The kernel's implicit default
    /// qdiscs (handle 0, e.g. `noqueue` or `pfifo_fast`) are included; see [`Qdisc::handle`].
    pub fn qdiscs(&mut self, index: Option<u32>) -> io::Result<Vec<Qdisc>> {
        let message = tc_message(index.unwrap_or(0), 0, 0)?;
        let replies = self.request(RouteNetlinkMessage::GetQueueDiscipline(message), NLM_F_DUMP)?;
        Ok(replies
            .iter()
            .filter_map(|reply| match reply {
                RouteNetlinkMessage::NewQueueDiscipline(message) => Some(Qdisc::from_message(message)),
                _ => None,
            })
            .filter(|qdisc| index.is_none_or(|index| qdisc.index == index))
            .collect())
    }

    /// The root qdisc of interface `index`, unless it is the kernel's default one.
    pub fn root_qdisc(&mut self, index: u32) -> io::Result<Option<Qdisc>> {
        Ok(self.qdiscs(Some(index))?.into_iter().find(|q| q.is_root() && q.handle != 0))
    }

    /// The ingress or clsact qdisc of interface `index`, if any.
    pub fn ingress_qdisc(&mut self, index: u32) -> io::Result<Option<Qdisc>> {
        Ok(self.qdiscs(Some(index))?.into_iter().find(Qdisc::is_ingress_like))
    }

    /// Adds a tbf qdisc (`tc qdisc add dev <index> parent <parent> handle <handle> tbf ...`). With
    /// `replace`, an existing qdisc at that parent is replaced (`tc qdisc replace`); without, an existing
    /// one is EEXIST.
    pub fn add_tbf(&mut self, index: u32, handle: u32, parent: u32, tbf: &Tbf, replace: bool) -> io::Result<()> {
        let mut message = tc_message(index, handle, parent)?;
        message.attributes.push(TcAttribute::Kind("tbf".into()));
        let options = tbf
            .to_attributes()
            .into_iter()
            .map(|(kind, value)| TcOption::Other(DefaultNla::new(kind, value)))
            .collect();
        message.attributes.push(TcAttribute::Options(options));
        let flags = if replace { NLM_F_CREATE | NLM_F_REPLACE } else { NLM_F_CREATE | NLM_F_EXCL };
        self.request(RouteNetlinkMessage::NewQueueDiscipline(message), flags)?;
        Ok(())
    }

    /// Adds an ingress qdisc (`tc qdisc add dev <index> ingress`); EEXIST when the device already has an
    /// ingress or clsact qdisc.
    pub fn add_ingress_qdisc(&mut self, index: u32) -> io::Result<()> {
        self.add_classless(index, "ingress")
    }

    /// Adds a clsact qdisc (`tc qdisc add dev <index> clsact`); EEXIST as for ingress.
    pub fn add_clsact_qdisc(&mut self, index: u32) -> io::Result<()> {
        self.add_classless(index, "clsact")
    }

    fn add_classless(&mut self, index: u32, kind: &str) -> io::Result<()> {
        let mut message = tc_message(index, handle::INGRESS, handle::INGRESS_PARENT)?;
        message.attributes.push(TcAttribute::Kind(kind.into()));
        self.request(RouteNetlinkMessage::NewQueueDiscipline(message), NLM_F_CREATE | NLM_F_EXCL)?;
        Ok(())
    }

    /// Deletes the qdisc at `parent` (with `handle`, 0 for any) of interface `index`. A missing qdisc is
    /// an error (ENOENT / EINVAL from the kernel); see [`Netlink::delete_qdisc_if_present`].
    pub fn delete_qdisc(&mut self, index: u32, handle: u32, parent: u32) -> io::Result<()> {
        let message = tc_message(index, handle, parent)?;
        self.request(RouteNetlinkMessage::DelQueueDiscipline(message), 0)?;
        Ok(())
    }

    /// Deletes `qdisc`; false when it (or its device) was already gone.
    pub fn delete_qdisc_if_present(&mut self, qdisc: &Qdisc) -> io::Result<bool> {
        match self.delete_qdisc(qdisc.index, qdisc.handle, qdisc.parent) {
            Ok(()) => Ok(true),
            Err(e) if crate::netlink::is_not_found(&e) || e.raw_os_error() == Some(libc::EINVAL) => Ok(false),
            Err(e) => Err(e),
        }
    }
}
