//! The nftables backend (ours: the reference plugins have none, up to v1.9). One table, fixed rules, and the
//! containers as set elements, so that an ADD is one transaction (a netlink batch) that only adds elements:
//!
//! ```text
//! table inet cni_firewall {
//!   set containers4 { type ipv4_addr }          # container addresses, each commented with its owner tag
//!   set containers6 { type ipv6_addr }
//!   set isolated    { type ifname }             # bridges of ingressPolicy same-bridge or isolated
//!   set same_bridge { type ifname . ifname }    # "<br>" . "<br>" for each of them
//!   set within_bridge { type ifname . ifname }  # "<br>" . "<br>" for bridges of ingressPolicy isolated
//!   chain forward { type filter hook forward priority filter; policy accept;
//!     jump isolation
//!     jump admin
//!     ip daddr @containers4 ct state established,related accept
//!     ip saddr @containers4 accept
//!     ip6 daddr @containers6 ct state established,related accept
//!     ip6 saddr @containers6 accept }
//!   chain isolation {                           # the reference's CNI-ISOLATION-STAGE-1/2 in three rules
//!     iifname . oifname @within_bridge drop
//!     iifname . oifname @same_bridge return
//!     iifname @isolated oifname @isolated drop }
//!   chain admin { }                             # the administrator's (CNI-ADMIN): created, never changed
//! }
//! ```
//!
//! nftables evaluates every base chain of a hook: `accept` ends this table's verdict only, while a `drop`
//! anywhere is final. So the accept rules open nothing that another table (iptables' FORWARD with policy
//! DROP, a firewall of the administrator's own) drops; on such a node use the iptables or firewalld
//! backend. Isolation and the admin chain's drops work whatever else is there.
//!
//! Element comments are owner tags (`fw-<net hash>-<attachment hash>`, [`cnicore::firewall::nft_tag`]): DEL
//! without prevResult and GC find a container's addresses by them.

use std::collections::BTreeSet;

use cnicore::firewall::nftables::{self, Datum, Element, Script};
use cnicore::firewall::{nft_tag, Backend as Kernel, Family};
use cnicore::spec::{Error, Result};
use ipnet::IpNet;

use crate::config::{Backend, Config, Isolation};
use crate::driver::{kernel_status, Driver, KernelDriver};

pub const TABLE: &str = "cni_firewall";
const TAG_KIND: &str = "fw";

fn set_of(ip: &IpNet) -> &'static str {
    match Family::of_net(ip) {
        Family::V4 => "containers4",
        Family::V6 => "containers6",
    }
}

/// The table, its sets and its fixed rules (refreshed: the chains with rules are flushed and refilled).
fn base(script: &mut Script) {
    let t = format!("inet {TABLE}");
    script.push(format!("add table {t}"));
    script.push(format!("add set {t} containers4 {{ type ipv4_addr ; }}"));
    script.push(format!("add set {t} containers6 {{ type ipv6_addr ; }}"));
    script.push(format!("add set {t} isolated {{ type ifname ; }}"));
    script.push(format!("add set {t} same_bridge {{ type ifname . ifname ; }}"));
    script.push(format!("add set {t} within_bridge {{ type ifname . ifname ; }}"));
    script.push(format!("add chain {t} admin"));
    script.push(format!("add chain {t} isolation"));
    script.push(format!("flush chain {t} isolation"));
    script.push(format!("add rule {t} isolation iifname . oifname @within_bridge drop"));
    script.push(format!("add rule {t} isolation iifname . oifname @same_bridge return"));
    script.push(format!("add rule {t} isolation iifname @isolated oifname @isolated drop"));
    script.push(format!("add chain {t} forward {{ type filter hook forward priority filter ; policy accept ; }}"));
    script.push(format!("flush chain {t} forward"));
    script.push(format!("add rule {t} forward jump isolation"));
    script.push(format!("add rule {t} forward jump admin"));
    for (kw, set) in [("ip", "containers4"), ("ip6", "containers6")] {
        script.push(format!("add rule {t} forward {kw} daddr @{set} ct state established,related accept"));
        script.push(format!("add rule {t} forward {kw} saddr @{set} accept"));
    }
}

/// The elements of one attachment: its addresses (tagged with their owner) and its bridge's isolation
/// entries (untagged: shared by the bridge's containers).
fn elements(tag: &str, ips: &[IpNet], isolation: Option<&Isolation>) -> Result<Vec<Element>> {
    let mut out: Vec<Element> =
        ips.iter().map(|ip| Element::new(set_of(ip), vec![Datum::Addr(ip.addr())], None).tagged(tag)).collect();
    if let Some(isolation) = isolation {
        let name = Datum::ifname(&isolation.bridge)?;
        out.push(Element::new("isolated", vec![name.clone()], None));
        out.push(Element::new("same_bridge", vec![name.clone(), name.clone()], None));
        if isolation.within_bridge {
            out.push(within_bridge(name));
        }
    }
    Ok(out)
}

/// The `isolated` drop of a bridge: `"<br>" . "<br>"` in `within_bridge`.
fn within_bridge(name: Datum) -> Element {
    Element::new("within_bridge", vec![name.clone(), name], None)
}

/// ADD: one transaction adding the elements (over netlink; container addresses tagged with their owner); the
/// table is set up in the same `nft` transaction only when that fails (first container, or the table was
/// removed).
fn add(network: &str, container_id: &str, ips: &[IpNet], isolation: Option<&Isolation>) -> Result<()> {
    let wanted = elements(&nft_tag(TAG_KIND, network, container_id), ips, isolation)?;
    if nftables::add_elements(TABLE, &wanted) {
        return Ok(());
    }
    let mut script = Script::new();
    base(&mut script);
    for line in nftables::add_script(TABLE, &wanted).render().lines() {
        script.push(line);
    }
    script.apply().map_err(|f| f.to_error(&format!("adding firewall rules for {container_id}")))
}

/// CHECK: the table holds every element of the attachment.
fn check(container_id: &str, ips: &[IpNet], isolation: Option<&Isolation>) -> Result<()> {
    let present = nftables::table_elements(TABLE)?
        .ok_or_else(|| Error::internal(format!("nftables table inet {TABLE} is missing")))?;
    for element in elements("", ips, isolation)? {
        if !present.iter().any(|e| e.is_key_of(&element)) {
            return Err(Error::internal(format!(
                "firewall element {} of container {container_id} is missing from set {}",
                element.key_text(),
                element.set
            )));
        }
    }
    Ok(())
}

/// DEL: with the addresses (and with `drop_of` that bridge's `isolated` drop), one transaction (over
/// netlink) deleting exactly them ("add" first, so that ones already gone are fine); without, or when the
/// table is missing, the elements tagged for the attachment, then the drop on its own.
fn del(network: &str, container_id: &str, ips: &[IpNet], drop_of: Option<&str>) -> Result<()> {
    let tag = nft_tag(TAG_KIND, network, container_id);
    if !ips.is_empty() {
        let mut gone = elements(&tag, ips, None)?;
        if let Some(bridge) = drop_of {
            gone.push(within_bridge(Datum::ifname(bridge)?));
        }
        if nftables::remove_elements(TABLE, &gone) {
            return Ok(());
        }
    }
    nftables::delete_tagged(TABLE, |comment| comment == tag)?;
    drop_of.map_or(Ok(()), remove_within_bridge)
}

/// Removes the bridge's `isolated` drop (its `within_bridge` element); the same-bridge elements stay. A table
/// or set that is not there holds nothing to remove.
fn remove_within_bridge(bridge: &str) -> Result<()> {
    let present = match nftables::table_elements(TABLE)? {
        Some(elements) => elements,
        None => return Ok(()),
    };
    let key = format!("{bridge} . {bridge}");
    if !present.iter().any(|e| e.set == "within_bridge" && e.key == key) {
        return Ok(());
    }
    let name = nftables::string(bridge)?;
    let mut script = Script::new();
    script.push(format!("delete element inet {TABLE} within_bridge {{ {name} . {name} }}"));
    script.apply().map_err(|f| f.to_error(&format!("removing the isolated drop of bridge {bridge}")))
}

/// GC: the addresses of attachments of `network` whose container is not in `valid`.
fn gc(network: &str, valid: &BTreeSet<&str>) -> Result<()> {
    nftables::gc_tagged(TABLE, TAG_KIND, network, valid)
}

/// The nftables backend's driver.
pub struct Nftables;

impl Driver for Nftables {
    fn backend(&self) -> Backend {
        Backend::Nftables
    }

    fn open(&mut self, config: &Config, ips: &[IpNet], isolation: Option<&Isolation>) -> Result<()> {
        add(&config.network, &config.container_id, ips, isolation)
    }

    /// Without `nft` there is nothing to close.
    fn close(&mut self, config: &Config, ips: &[IpNet], drop_of: Option<&str>) -> Result<()> {
        if !Kernel::Nftables.available() {
            return Ok(());
        }
        del(&config.network, &config.container_id, ips, drop_of)
    }

    fn check(&mut self, config: &Config, ips: &[IpNet], isolation: Option<&Isolation>) -> Result<()> {
        check(&config.container_id, ips, isolation)
    }

    fn status(&self) -> Result<()> {
        kernel_status(Kernel::Nftables)
    }
}

impl KernelDriver for Nftables {
    /// One family or two, the elements are the same: the isolation sets hold interface names.
    fn isolate(&self, config: &Config, _ips: &[IpNet], isolation: &Isolation) -> Result<()> {
        add(&config.network, &config.container_id, &[], Some(isolation))
    }

    fn check_isolation(&self, config: &Config, _ips: &[IpNet], isolation: &Isolation) -> Result<()> {
        check(&config.container_id, &[], Some(isolation))
    }

    fn remove_drop(&self, bridge: &str, _ips: &[IpNet]) -> Result<()> {
        if !Kernel::Nftables.available() {
            return Ok(());
        }
        remove_within_bridge(bridge)
    }

    fn gc(&self, network: &str, valid: &BTreeSet<&str>) -> Result<()> {
        if !Kernel::Nftables.available() {
            return Ok(());
        }
        gc(network, valid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn elements_of_an_attachment() {
        let ips: Vec<IpNet> = vec!["10.88.0.2/32".parse().unwrap(), "fd00::2/128".parse().unwrap()];
        let bridge = |within_bridge| Some(Isolation { bridge: "cni-podman0".into(), within_bridge });
        let render = |elements: Vec<Element>| -> Vec<String> {
            elements.iter().map(|e| format!("{} {}", e.set, e.render(true))).collect()
        };
        assert_eq!(
            render(elements("fw-1", &ips, bridge(false).as_ref()).unwrap()),
            vec![
                "containers4 10.88.0.2 comment \"fw-1\"",
                "containers6 fd00::2 comment \"fw-1\"",
                "isolated \"cni-podman0\"",
                "same_bridge \"cni-podman0\" . \"cni-podman0\"",
            ]
        );
        let within = render(elements("fw-1", &[], bridge(true).as_ref()).unwrap());
        assert_eq!(within.last().unwrap(), "within_bridge \"cni-podman0\" . \"cni-podman0\"");
        assert!(elements("fw-1", &ips, Some(&Isolation { bridge: "a\"b".into(), within_bridge: false })).is_err());
        let mut script = Script::new();
        base(&mut script);
        let text = script.render();
        assert!(text
            .contains("add rule inet cni_firewall forward ip daddr @containers4 ct state established,related accept"));
        assert!(!text.contains("flush chain inet cni_firewall admin"), "the admin chain is the administrator's");
    }
}
