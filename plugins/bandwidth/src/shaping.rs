//! The tc objects of one pod: a tbf at the root of the host veth (ingress), and for egress an ingress
//! (or someone else's clsact) qdisc on the host veth whose u32 filter redirects every packet to the
//! pod's ifb, which has the tbf at its root.
//!
//! Our filter carries a cookie: the ifb name and whether we created the ingress qdisc. DEL uses it to
//! remove our filter only, and the qdisc only when it was ours and nothing else is left on it. A filter
//! without cookie that redirects to the pod's ifb (or to a deleted device) was made by the reference
//! plugin, which always creates the qdisc too.

use std::collections::BTreeSet;
use std::io;

use cnicore::netlink::{is_exists, is_not_found, Link, Netlink};
use cnicore::spec::{Error, ErrorContext, Result};
use cnicore::tc::{handle, Filter, Qdisc, QdiscKind, Tbf};

/// Handle of our tbf qdiscs (`1:`), as the reference.
const TBF_HANDLE: u32 = handle::make(1, 0);
/// The node-id bits of a u32 filter handle (`htid:hash:node`).
const U32_NODE_MASK: u32 = 0xFFF;
/// Priority of our filter when the ingress qdisc is ours (the reference's).
const PREFERRED_PRIO: u16 = 1;

/// Ignores "it is gone" errors, as DEL must.
fn tolerate_gone(result: io::Result<()>) -> io::Result<()> {
    match result {
        Err(e) if is_not_found(&e) || e.raw_os_error() == Some(libc::EINVAL) => Ok(()),
        other => other,
    }
}

fn cookie(ifb_name: &str, owns_qdisc: bool) -> Vec<u8> {
    let mut cookie = ifb_name.as_bytes().to_vec();
    cookie.push(u8::from(owns_qdisc));
    cookie
}

/// How a filter relates to the pod's ifb.
enum Ownership {
    /// Ours; true when we created the ingress qdisc it hangs on.
    Ours {
        owns_qdisc: bool,
    },
    Foreign,
}

fn ownership(filter: &Filter, ifb_name: &str, ifb_index: Option<u32>) -> Ownership {
    for redirect in &filter.redirects {
        if let Some(flag) = redirect.cookie.strip_prefix(ifb_name.as_bytes()) {
            return Ownership::Ours { owns_qdisc: flag.first() == Some(&1) };
        }
        // The reference's filter: to the pod's ifb, or dangling (index 0) once the reference's DEL deleted
        // the ifb and left the rest to the veth's deletion. A dangling redirect drops everything anyway.
        if redirect.cookie.is_empty() && (Some(redirect.ifindex) == ifb_index || redirect.ifindex == 0) {
            return Ownership::Ours { owns_qdisc: true };
        }
    }
    Ownership::Foreign
}

/// Ingress shaping: the tbf at the root of the host veth. A tbf `1:` already there is a leftover of an
/// earlier ADD of this pod and is replaced; any other root qdisc belongs to someone else.
pub fn install_ingress(nl: &mut Netlink, host: &Link, tbf: &Tbf) -> Result<()> {
    match nl.add_tbf(host.index, TBF_HANDLE, handle::ROOT, tbf, false) {
        Ok(()) => Ok(()),
        Err(e) if is_exists(&e) => {
            let root = nl.root_qdisc(host.index).context("listing qdiscs")?;
            match root {
                Some(q) if matches!(q.kind, QdiscKind::Tbf(_)) && q.handle == TBF_HANDLE => nl
                    .add_tbf(host.index, TBF_HANDLE, handle::ROOT, tbf, true)
                    .with_context(|| format!("replacing the tbf qdisc of {}", host.name)),
                Some(q) => Err(Error::internal(format!(
                    "{} already has a root qdisc {} {}: not replacing it",
                    host.name,
                    q.kind.name(),
                    show_handle(q.handle)
                ))),
                None => Err(Error::os(format!("creating the tbf qdisc of {}", host.name), e)),
            }
        }
        Err(e) => Err(Error::os(format!("creating the tbf qdisc of {}", host.name), e)),
    }
}

/// Egress shaping: the tbf on the (new) ifb, then the redirect of the host veth's incoming traffic to
/// it, so that no packet is ever redirected to an unshaped ifb.
pub fn install_egress(nl: &mut Netlink, host: &Link, ifb: &Link, tbf: &Tbf) -> Result<()> {
    nl.add_tbf(ifb.index, TBF_HANDLE, handle::ROOT, tbf, true)
        .with_context(|| format!("creating the tbf qdisc of {}", ifb.name))?;
    cnicore::failpoint::hit("bandwidth/after-ifb-tbf");
    let (parent, owns_qdisc, used) = ingress_hook(nl, host, &ifb.name)?;
    cnicore::failpoint::hit("bandwidth/after-ingress-qdisc");
    // Our own qdisc: the reference's priority. Someone else's: the first priority nobody uses.
    let prio = (PREFERRED_PRIO..=u16::MAX)
        .find(|p| !used.contains(p))
        .ok_or_else(|| Error::internal(format!("no free filter priority on {}", host.name)))?;
    let cookie = cookie(&ifb.name, owns_qdisc);
    nl.add_redirect_filter(host.index, parent, prio, ifb.index, Some(&cookie))
        .with_context(|| format!("adding the filter redirecting {} to {}", host.name, ifb.name))
}

/// The filter parent for traffic the host veth receives: a new ingress qdisc, or the ingress or
/// clsact qdisc another tool put there. Returns the parent, whether the qdisc is ours, and the filter
/// priorities in use there (after removing our own leftovers from an earlier ADD).
fn ingress_hook(nl: &mut Netlink, host: &Link, ifb_name: &str) -> Result<(u32, bool, BTreeSet<u16>)> {
    match nl.add_ingress_qdisc(host.index) {
        Ok(()) => return Ok((handle::INGRESS, true, BTreeSet::new())),
        Err(e) if is_exists(&e) => {}
        Err(e) => return Err(Error::os(format!("creating the ingress qdisc of {}", host.name), e)),
    }
    let qdisc = nl.ingress_qdisc(host.index).context("listing qdiscs")?;
    let Some(parent) = qdisc.as_ref().and_then(Qdisc::ingress_filter_parent) else {
        return Err(Error::internal(format!("{} has an ingress qdisc that cannot be listed", host.name)));
    };
    let filters = nl.filters(host.index, parent).context("listing filters")?;
    let mut owns_qdisc = false;
    let mut leftovers = Vec::new();
    for filter in &filters {
        if let Ownership::Ours { owns_qdisc: owned } = ownership(filter, ifb_name, None) {
            owns_qdisc |= owned;
            leftovers.push(filter.clone());
        }
    }
    let remaining = if leftovers.is_empty() {
        filters
    } else {
        delete_filters(nl, &filters, &leftovers).context("removing an earlier filter of this pod")?;
        nl.filters(host.index, parent).context("listing filters")?
    };
    Ok((parent, owns_qdisc, remaining.iter().map(|f| f.prio).collect()))
}

/// Deletes `ours` among `all` (the filters of one parent): a whole priority when it holds only ours,
/// else node by node.
fn delete_filters(nl: &mut Netlink, all: &[Filter], ours: &[Filter]) -> io::Result<()> {
    let prios: BTreeSet<u16> = ours.iter().map(|f| f.prio).collect();
    for prio in prios {
        // A u32 instance also lists itself and its hash table (node id 0): only match nodes count.
        let foreign = all
            .iter()
            .filter(|f| f.prio == prio && !ours.contains(f))
            .any(|f| f.kind != "u32" || f.handle & U32_NODE_MASK != 0);
        if foreign {
            for filter in ours.iter().filter(|f| f.prio == prio) {
                tolerate_gone(nl.delete_filter(filter))?;
            }
        } else if let Some(first) = ours.iter().find(|f| f.prio == prio) {
            tolerate_gone(nl.delete_filter_prio(first.index, first.parent, prio, first.protocol))?;
        }
    }
    Ok(())
}

/// Removes what this pod's shaping put on `host`: our redirect filter (and the ingress qdisc when we
/// created it and nothing else remains on it) and the root tbf. Missing pieces are fine.
pub fn remove_from_host(nl: &mut Netlink, host: &Link, ifb_name: &str, ifb_index: Option<u32>) -> io::Result<()> {
    let qdiscs = nl.qdiscs(Some(host.index))?;
    if let Some(qdisc) = qdiscs.iter().find(|q| q.is_ingress_like()) {
        if let Some(parent) = qdisc.ingress_filter_parent() {
            let filters = nl.filters(host.index, parent)?;
            let mut owns_qdisc = false;
            let mut ours = Vec::new();
            for filter in &filters {
                if let Ownership::Ours { owns_qdisc: owned } = ownership(filter, ifb_name, ifb_index) {
                    owns_qdisc |= owned;
                    ours.push(filter.clone());
                }
            }
            delete_filters(nl, &filters, &ours)?;
            if owns_qdisc && nl.filters(host.index, parent)?.is_empty() {
                nl.delete_qdisc_if_present(qdisc)?;
            }
        }
    }
    let root = qdiscs.iter().find(|q| q.is_root() && q.handle == TBF_HANDLE && matches!(q.kind, QdiscKind::Tbf(_)));
    if let Some(root) = root {
        nl.delete_qdisc_if_present(root)?;
    }
    Ok(())
}

/// CHECK of ingress shaping: the host veth's root qdisc is a tbf with the expected values.
pub fn check_ingress(nl: &mut Netlink, host: &Link, expected: &Tbf) -> Result<()> {
    check_tbf(nl, host, expected, "ingress")
}

/// CHECK of egress shaping: the ifb exists and is up with the expected tbf, and the host veth's
/// incoming traffic is redirected to it.
pub fn check_egress(nl: &mut Netlink, host: &Link, ifb_name: &str, expected: &Tbf) -> Result<()> {
    let ifb = nl
        .link_by_name(ifb_name)
        .context("looking up the ifb device")?
        .filter(|link| link.kind.as_deref() == Some("ifb"))
        .ok_or_else(|| Error::internal(format!("ifb device {ifb_name} not found")))?;
    if !ifb.up {
        return Err(Error::internal(format!("ifb device {ifb_name} is down")));
    }
    check_tbf(nl, &ifb, expected, "egress")?;
    let qdisc = nl.ingress_qdisc(host.index).context("listing qdiscs")?;
    let parent = qdisc
        .as_ref()
        .and_then(Qdisc::ingress_filter_parent)
        .ok_or_else(|| Error::internal(format!("{} has no ingress qdisc", host.name)))?;
    let filters = nl.filters(host.index, parent).context("listing filters")?;
    let redirected = filters.iter().flat_map(|f| &f.redirects).any(|r| r.egress_redirect && r.ifindex == ifb.index);
    if !redirected {
        return Err(Error::internal(format!("no filter on {} redirects its traffic to {ifb_name}", host.name)));
    }
    Ok(())
}

fn check_tbf(nl: &mut Netlink, link: &Link, expected: &Tbf, direction: &str) -> Result<()> {
    let root = nl.root_qdisc(link.index).context("listing qdiscs")?;
    let actual = match root {
        Some(Qdisc { kind: QdiscKind::Tbf(Some(tbf)), .. }) => tbf,
        Some(q) => {
            return Err(Error::internal(format!(
                "{direction}: the root qdisc of {} is {}, not tbf",
                link.name,
                q.kind.name()
            )))
        }
        None => return Err(Error::internal(format!("{direction}: {} has no tbf qdisc", link.name))),
    };
    let expected = expected.as_kernel_reports();
    for (what, have, want) in [
        ("rate (bytes/s)", actual.rate, expected.rate),
        ("buffer (ticks)", u64::from(actual.buffer), u64::from(expected.buffer)),
        ("limit (bytes)", u64::from(actual.limit), u64::from(expected.limit)),
    ] {
        if have != want {
            return Err(Error::internal(format!(
                "{direction}: the tbf of {} has {what} {have}, expected {want}",
                link.name
            )));
        }
    }
    Ok(())
}

fn show_handle(handle: u32) -> String {
    format!("{:x}:{:x}", handle >> 16, handle & 0xFFFF)
}
