//! DEL: remove whatever of the attachment is still there. Every step runs even when an earlier one failed,
//! a missing netns, link, rule or lease is not an error, and the pod's IPs come from `prevResult` when the
//! netns is gone, so IPAM and the masquerade rules are released in every case (the reference leaks the
//! rules then: containernetworking/plugins#810). A second DEL succeeds.

use cnicore::podlink::{self, PodVeth};
use cnicore::spec::{ipam, Context, Errors, Result};
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
    let pod_veth = errors.record(podlink::find_pod_veth(ctx)).flatten();
    let ips = cnicore::check::teardown_pod_ips(ctx, pod_veth.as_ref().map_or(&[], |v| &v.addresses));
    errors.extend(remove_concurrently(ctx, &conf, pod_veth, &ips).into_iter().filter_map(Result::err));
    errors.into_result()
}

/// Deletes the veth, the masquerade rules, the spoof check and the lease, at the same time where they are
/// independent (`ipam::teardown`: the veth waits for IPAM's DEL when the IPAM plugin needs it, as dhcp does).
fn remove_concurrently(ctx: &Context, conf: &Config, pod_veth: Option<PodVeth>, ips: &[IpNet]) -> Vec<Result<()>> {
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
    let interface = pod_veth.map(|veth| -> ipam::TeardownStep { Box::new(move || veth.delete(ifname)) });
    ipam::teardown(ctx, conf.layer3, interface, others)
}
