//! ipMasq: the bridge's only door to [`cnicore::firewall::masq`], which owns the rules (the reference layout
//! for iptables: a per-container `CNI-<hash>` chain in the nat table jumped to from POSTROUTING with
//! `-s <pod IP>/32` and a comment naming the network and container; or nftables), one firewall transaction
//! per family per call.

use cnicore::firewall::masq;
use cnicore::spec::Result;
use ipnet::IpNet;

pub use cnicore::firewall::Backend;

/// One attachment's masquerade: who it is for and the pod's addresses (with their prefixes).
pub struct Masq<'a> {
    pub network: &'a str,
    pub container_id: &'a str,
    pub ips: &'a [IpNet],
}

/// Masquerades traffic from the pod's addresses leaving their subnets (multicast excepted). Without a
/// configured backend: iptables when its binary exists, else nftables.
pub fn setup(backend: Option<Backend>, m: &Masq) -> Result<()> {
    let backend = match backend {
        Some(backend) => backend,
        None => Backend::detect()?,
    };
    masq::setup(backend, m.network, m.container_id, m.ips)
}

/// Removes the attachment's masquerade rules, whichever backend made them; missing rules are not an error.
pub fn teardown(m: &Masq) -> Result<()> {
    masq::teardown(m.network, m.container_id, m.ips)
}

/// Removes the masquerade rules of `network` whose container is not in `valid` (containerID, ifname).
pub fn gc(network: &str, valid: &[(String, String)]) -> Result<()> {
    masq::gc(network, valid)
}
