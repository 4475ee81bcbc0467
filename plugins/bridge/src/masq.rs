//! ipMasq: the bridge's only door to [`cnicore::firewall::masq`], which owns the rules (the reference layout
//! for iptables: a per-container `CNI-<hash>` chain in the nat table jumped to from POSTROUTING with
//! `-s <pod IP>/32` and a comment naming the network and container, our `nonMasqueradeCIDRs` as extra ACCEPT
//! rules before its MASQUERADE; or nftables), one firewall transaction per family per call.

use cnicore::firewall::masq;
use cnicore::spec::Result;

pub use cnicore::firewall::masq::Attachment as Masq;
pub use cnicore::firewall::Backend;

/// The configured backend, else iptables when its binary exists, else nftables.
fn resolve(backend: Option<Backend>) -> Result<Backend> {
    backend.map_or_else(Backend::detect, Ok)
}

/// Masquerades traffic from the pod's addresses leaving their subnets, except to multicast and to the
/// `nonMasqueradeCIDRs`.
pub fn setup(backend: Option<Backend>, m: &Masq) -> Result<()> {
    masq::setup(resolve(backend)?, m)
}

/// CHECK: the masquerade rules are there as `setup` makes them, with exactly the configured exceptions.
pub fn check(backend: Option<Backend>, m: &Masq) -> Result<()> {
    masq::check(resolve(backend)?, m)
}

/// Removes the attachment's masquerade rules, whichever backend made them; missing rules are not an error.
pub fn teardown(m: &Masq) -> Result<()> {
    masq::teardown(m)
}

/// Removes the masquerade rules of `network` whose container is not in `valid` (containerID, ifname).
pub fn gc(network: &str, valid: &[(String, String)]) -> Result<()> {
    masq::gc(network, valid)
}
