//! Traffic control over rtnetlink: qdiscs (tbf, ingress, clsact) and u32 filters with a mirred redirect,
//! built on [`Netlink::request_raw`]. No `tc` process is ever spawned.
//!
//! Handles are plain `u32`s as the kernel sees them (`major << 16 | minor`); see [`handle`].

mod tbf;
mod u32;

use std::io;

use netlink_packet_core::{NLM_F_CREATE, NLM_F_EXCL, NLM_F_REPLACE};

use crate::netlink::wire::{self, attributes, Request};
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

/// Size of `struct tcmsg`.
const TCMSG_LEN: usize = 20;

/// The fields of a `struct tcmsg` {family, pad, ifindex, handle, parent, info}.
#[derive(Debug, Clone, Copy)]
struct TcHeader {
    index: u32,
    handle: u32,
    parent: u32,
    info: u32,
}

impl TcHeader {
    fn to_bytes(self) -> [u8; TCMSG_LEN] {
        let mut header = [0; TCMSG_LEN];
        header[4..8].copy_from_slice(&self.index.to_ne_bytes());
        header[8..12].copy_from_slice(&self.handle.to_ne_bytes());
        header[12..16].copy_from_slice(&self.parent.to_ne_bytes());
        header[16..20].copy_from_slice(&self.info.to_ne_bytes());
        header
    }

    /// The header of a tc message and the attributes after it.
    fn parse(data: &[u8]) -> Option<(TcHeader, &[u8])> {
        let header = TcHeader {
            index: wire::u32_at(data, 4)?,
            handle: wire::u32_at(data, 8)?,
            parent: wire::u32_at(data, 12)?,
            info: wire::u32_at(data, 16)?,
        };
        Some((header, data.get(TCMSG_LEN..)?))
    }
}

/// `TCA_KIND` and `TCA_OPTIONS` of a tc message (kind first: the options depend on it).
fn kind_and_options(attrs: &[u8]) -> (String, Option<&[u8]>) {
    let mut kind = String::new();
    let mut options = None;
    for (attribute, value) in attributes(attrs) {
        match attribute {
            libc::TCA_KIND => kind = wire::as_string(value),
            libc::TCA_OPTIONS => options = Some(value),
            _ => {}
        }
    }
    (kind, options)
}

impl Qdisc {
    /// The qdisc in an `RTM_NEWQDISC` payload.
    fn parse(data: &[u8]) -> Option<Qdisc> {
        let (header, attrs) = TcHeader::parse(data)?;
        let (name, options) = kind_and_options(attrs);
        let kind = match name.as_str() {
            "tbf" => QdiscKind::Tbf(options.and_then(Tbf::from_options)),
            "ingress" => QdiscKind::Ingress,
            "clsact" => QdiscKind::Clsact,
            _ => QdiscKind::Other(name),
        };
        Some(Qdisc { index: header.index, handle: header.handle, parent: header.parent, kind })
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

/// A tc request (`RTM_*QDISC`, `RTM_*TFILTER`) for interface `index`.
fn tc_request(message_type: u16, index: u32, handle: u32, parent: u32, info: u32) -> io::Result<Request> {
    // The kernel's ifindex is an int.
    if i32::try_from(index).is_err() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "interface index out of range"));
    }
    Ok(Request::new(message_type, &TcHeader { index, handle, parent, info }.to_bytes()))
}

/// The `RTM_NEWQDISC` of [`Netlink::add_tbf`].
fn tbf_request(index: u32, handle: u32, parent: u32, tbf: &Tbf) -> io::Result<Request> {
    let mut request = tc_request(libc::RTM_NEWQDISC, index, handle, parent, 0)?;
    request.attr_str(libc::TCA_KIND, "tbf");
    let options = request.begin_nested(libc::TCA_OPTIONS);
    for (kind, value) in tbf.to_attributes() {
        request.attr(kind, &value);
    }
    request.end_nested(options);
    Ok(request)
}

impl Netlink {
    /// The qdiscs of interface `index` (every interface when `None`). The kernel's implicit default
    /// qdiscs (handle 0, e.g. `noqueue` or `pfifo_fast`) are included; see [`Qdisc::handle`].
    pub fn qdiscs(&mut self, index: Option<u32>) -> io::Result<Vec<Qdisc>> {
        let mut request = tc_request(libc::RTM_GETQDISC, index.unwrap_or(0), 0, 0, 0)?;
        let qdiscs = self.dump(&mut request, libc::RTM_NEWQDISC, Qdisc::parse)?;
        Ok(qdiscs.into_iter().filter(|qdisc| index.is_none_or(|index| qdisc.index == index)).collect())
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
        let mut request = tbf_request(index, handle, parent, tbf)?;
        let flags = if replace { NLM_F_CREATE | NLM_F_REPLACE } else { NLM_F_CREATE | NLM_F_EXCL };
        self.request_raw(&mut request, flags)?;
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
        let mut request = tc_request(libc::RTM_NEWQDISC, index, handle::INGRESS, handle::INGRESS_PARENT, 0)?;
        request.attr_str(libc::TCA_KIND, kind);
        self.request_raw(&mut request, NLM_F_CREATE | NLM_F_EXCL)?;
        Ok(())
    }

    /// Deletes the qdisc at `parent` (with `handle`, 0 for any) of interface `index`. A missing qdisc is
    /// an error (ENOENT / EINVAL from the kernel); see [`Netlink::delete_qdisc_if_present`].
    pub fn delete_qdisc(&mut self, index: u32, handle: u32, parent: u32) -> io::Result<()> {
        let mut request = tc_request(libc::RTM_DELQDISC, index, handle, parent, 0)?;
        self.request_raw(&mut request, 0)?;
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

#[cfg(test)]
mod tests {
    use netlink_packet_core::DefaultNla;
    use netlink_packet_route::tc::{TcAttribute, TcHandle, TcMessage, TcOption};

    use super::*;
    use crate::netlink::wire::emitted;

    #[test]
    fn qdisc_requests_and_replies() {
        let tbf = Tbf { rate: 125_000, buffer: 1000, limit: 128_125, burst: None };
        let request = tbf_request(3, handle::make(1, 0), handle::ROOT, &tbf).unwrap();

        let mut expected = TcMessage::with_index(3);
        expected.header.handle = TcHandle::from(handle::make(1, 0));
        expected.header.parent = TcHandle::from(handle::ROOT);
        expected.attributes.push(TcAttribute::Kind("tbf".into()));
        let values = tbf.to_attributes().into_iter().map(|(kind, value)| TcOption::Other(DefaultNla::new(kind, value)));
        expected.attributes.push(TcAttribute::Options(values.collect()));
        assert_eq!(request.payload(), emitted(&expected));

        let qdisc = Qdisc::parse(&emitted(&expected)).unwrap();
        assert_eq!(
            qdisc,
            Qdisc { index: 3, handle: handle::make(1, 0), parent: handle::ROOT, kind: QdiscKind::Tbf(Some(tbf)) }
        );

        let mut request = tc_request(libc::RTM_NEWQDISC, 3, handle::INGRESS, handle::INGRESS_PARENT, 0).unwrap();
        request.attr_str(libc::TCA_KIND, "clsact");
        let mut expected = TcMessage::with_index(3);
        expected.header.handle = TcHandle::from(handle::INGRESS);
        expected.header.parent = TcHandle::from(handle::INGRESS_PARENT);
        expected.attributes.push(TcAttribute::Kind("clsact".into()));
        assert_eq!(request.payload(), emitted(&expected));
        assert_eq!(Qdisc::parse(&emitted(&expected)).unwrap().kind, QdiscKind::Clsact);
    }
}
