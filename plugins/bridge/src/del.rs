//! DEL: remove whatever of the attachment is still there. Every step runs even when an earlier one failed,
//! a missing netns, link, rule or lease is not an error, and the pod's IPs come from `prevResult` when the
//! netns is gone, so IPAM and the masquerade rules are released in every case (the reference leaks the
//! rules then: containernetworking/plugins#810). A second DEL succeeds.

use std::io;

use cnicore::netlink::Netlink;
use cnicore::netns::NetNs;
use cnicore::spec::{ipam, Context, Error, ErrorContext, Errors, Result};
use ipnet::IpNet;

use crate::config::Config;
use crate::spoofchk::SpoofCheck;
use cnicore::firewall::masq;

/// Removes the reference's nftables ipMasq rule of the attachment, when `nft` is installed.
fn reference_ipmasq_teardown(network: &str, ifname: &str, container_id: &str) -> Result<()> {
    if !cnicore::firewall::Backend::Nftables.available() {
        return Ok(());
    }
    cnicore::firewall::reference_nft::ipmasq_teardown(network, ifname, container_id)
}

pub fn del(ctx: &Context) -> Result<()> {
    let conf = ctx.load_for_teardown(Config::load)?;
    let mut errors = Errors::new();
    let pod_link = errors.record(pod_link(ctx)).flatten();
    let ips = cnicore::check::teardown_pod_ips(ctx, pod_link.as_ref().map_or(&[], |l| &l.addresses));
    errors.extend(remove_concurrently(ctx, &conf, pod_link, &ips).into_iter().filter_map(Result::err));
    errors.into_result()
}

/// The pod's interface, if the netns and the interface are still there.
fn pod_link(ctx: &Context) -> Result<Option<PodLink>> {
    let Some(path) = &ctx.env.netns else { return Ok(None) };
    match NetNs::open(path) {
        Ok(pod_ns) => find_pod_link(&pod_ns, &ctx.env.ifname),
        // The pod is gone: so are its interface and, with it, the host veth.
        Err(e) if netns_gone(&e) => Ok(None),
        Err(e) => Err(Error::os(format!("failed to open netns {:?}", path.display().to_string()), e)),
    }
}

/// Deletes the veth, the masquerade rules, the spoof check and the lease, at the same time where they are
/// independent (`ipam::teardown`: the veth waits for IPAM's DEL when the IPAM plugin needs it, as dhcp does).
fn remove_concurrently(ctx: &Context, conf: &Config, pod_link: Option<PodLink>, ips: &[IpNet]) -> Vec<Result<()>> {
    let ifname = ctx.env.ifname.as_str();
    let mut others: Vec<ipam::TeardownStep> = Vec::new();
    if conf.layer3 && conf.ip_masq {
        let m = conf.masq(&ctx.env.container_id, ips);
        others.push(Box::new(move || masq::teardown(&m)));
        // The rule the reference bridge v1.6+ wrote with ipMasqBackend nftables (a node moved to ours).
        let (network, container_id) = (&conf.network, &ctx.env.container_id);
        others.push(Box::new(move || reference_ipmasq_teardown(network, ifname, container_id)));
    }
    if conf.mac_spoof_check {
        others.push(Box::new(|| SpoofCheck::new(&ctx.env.container_id, ifname).teardown()));
    }
    let interface = pod_link.map(|link| -> ipam::TeardownStep { Box::new(move || link.delete(ifname)) });
    ipam::teardown(ctx, conf.layer3, interface, others)
}

/// A netns path that no longer exists, or a file that is no longer a namespace (left behind after the
/// namespace was unmounted), means the pod's network is gone.
fn netns_gone(e: &io::Error) -> bool {
    matches!(e.kind(), io::ErrorKind::NotFound | io::ErrorKind::InvalidInput)
}

/// The pod end of one of our veth pairs, with the global addresses it has.
struct PodLink {
    netlink: Netlink,
    index: u32,
    addresses: Vec<IpNet>,
}

impl PodLink {
    /// Deletes the pod end, which deletes the host end too.
    fn delete(mut self, ifname: &str) -> Result<()> {
        cnicore::podlink::delete_link(&mut self.netlink, self.index, ifname)
    }
}

/// The pod's `ifname` if it is the pod end of one of our veth pairs (its peer is a veth in the node
/// namespace); anything else under that name is not ours to delete.
fn find_pod_link(pod_ns: &NetNs, ifname: &str) -> Result<Option<PodLink>> {
    let mut pod = Netlink::in_netns(pod_ns).context("failed to open netlink in the pod namespace")?;
    let Some(link) = pod.link_by_name(ifname).with_context(|| format!("failed to look up {ifname:?}"))? else {
        return Ok(None);
    };
    if link.kind.as_deref() != Some("veth") || !peer_is_on_node(link.index, link.peer_index) {
        cnicore::warn!("{ifname:?} in the pod is not a veth connected to this node; leaving it alone");
        return Ok(None);
    }
    let addresses =
        pod.addresses(Some(link.index)).with_context(|| format!("failed to get IP addresses of {ifname:?}"))?;
    let addresses = addresses.into_iter().map(|a| a.addr).filter(|a| is_global_unicast(a.addr())).collect();
    Ok(Some(PodLink { netlink: pod, index: link.index, addresses }))
}

/// True if the veth peer `peer_index` is, in the node namespace, a veth whose own peer is `pod_index`.
fn peer_is_on_node(pod_index: u32, peer_index: Option<u32>) -> bool {
    let Some(peer_index) = peer_index else { return false };
    let Ok(mut node) = Netlink::new() else { return false };
    match node.link_by_index(peer_index) {
        Ok(Some(peer)) => peer.kind.as_deref() == Some("veth") && peer.peer_index == Some(pod_index),
        _ => false,
    }
}

fn is_global_unicast(ip: std::net::IpAddr) -> bool {
    match ip {
        std::net::IpAddr::V4(a) => {
            !(a.is_loopback() || a.is_link_local() || a.is_multicast() || a.is_broadcast() || a.is_unspecified())
        }
        std::net::IpAddr::V6(a) => {
            !(a.is_loopback() || a.is_multicast() || a.is_unspecified() || (a.segments()[0] & 0xffc0) == 0xfe80)
        }
    }
}
