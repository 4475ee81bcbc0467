//! Finding the host side of the pod's veth: the interface of `prevResult` without a sandbox whose veth
//! peer is the pod interface `CNI_IFNAME` (the reference asks the pod interface for its peer's index).

use cnicore::netlink::{Link, Netlink};
use cnicore::netns::NetNs;
use cnicore::spec::{CniResult, Error, ErrorContext, Result};

/// The host veth of pod interface `ifname` in `pod`, which must be listed in `prev` without a sandbox.
pub fn find(host: &mut Netlink, pod: &NetNs, ifname: &str, prev: &CniResult) -> Result<Link> {
    if prev.interfaces.is_empty() {
        return Err(Error::config("no interfaces provided in prevResult"));
    }
    let host_link = veth_peer(host, pod, ifname)?;
    if !prev.interfaces.iter().any(|i| i.sandbox.is_empty() && i.name == host_link.name) {
        return Err(Error::internal(format!(
            "no veth peer of container interface {ifname} found in host ns among prevResult's interfaces \
             (its peer is {})",
            host_link.name
        )));
    }
    Ok(host_link)
}

/// The host end of the veth whose pod end is `ifname` in `pod`.
fn veth_peer(host: &mut Netlink, pod: &NetNs, ifname: &str) -> Result<Link> {
    let mut pod_nl = Netlink::in_netns(pod).context("opening netlink in the pod netns")?;
    let pod_link = pod_nl
        .link_by_name(ifname)
        .context("looking up the pod interface")?
        .ok_or_else(|| Error::internal(format!("container interface {ifname} has no veth peer: no such interface")))?;
    let peer_index = match (&pod_link.kind, pod_link.peer_index) {
        (Some(kind), Some(index)) if kind == "veth" && index > 0 => index,
        _ => return Err(Error::internal(format!("container interface {ifname} has no veth peer: it is not a veth"))),
    };
    let host_link = host
        .link_by_index(peer_index)
        .context("looking up the veth peer")?
        // The index must name the pod interface's own peer, not an unrelated link of the same index.
        .filter(|link| link.kind.as_deref() == Some("veth") && link.peer_index == Some(pod_link.index))
        .ok_or_else(|| Error::internal(format!("veth peer with index {peer_index} is not in host ns")))?;
    Ok(host_link)
}

/// DEL's best effort: the veth peer of the pod interface when the pod netns still exists, else the
/// sandbox-less veths of `prev` that still exist. Never fails: DEL must work when things are gone.
pub fn candidates(host: &mut Netlink, pod: Option<&NetNs>, ifname: &str, prev: Option<&CniResult>) -> Vec<Link> {
    if let Some(link) = pod.and_then(|pod| veth_peer(host, pod, ifname).ok()) {
        return vec![link];
    }
    let Some(prev) = prev else { return Vec::new() };
    prev.interfaces
        .iter()
        .filter(|i| i.sandbox.is_empty())
        .filter_map(|i| host.link_by_name(&i.name).ok().flatten())
        .filter(|link| link.kind.as_deref() == Some("veth"))
        .collect()
}
