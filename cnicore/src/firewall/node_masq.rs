//! Node-level masquerade of a flat pod network (a node agent's `--ip-masq`): pod traffic that leaves the
//! cluster CIDR is masqueraded to the node's address; traffic between pods (any node) keeps its source, which
//! is the meaning of the kubelet's `--non-masquerade-cidr`.
//!
//! iptables: flannel's layout, so a node moved from flanneld keeps one copy of each rule: table `nat`, chain
//! `FLANNEL-POSTRTG` jumped to from `POSTROUTING` (comment `flanneld masq`), holding
//!
//! ```text
//! -s <cluster> -d <cluster> -j RETURN                  pod to pod: never NAT
//! -s <cluster> ! -d 224.0.0.0/4 -j MASQUERADE          pods leaving the cluster
//! ! -s <cluster> -d <node subnet> -j RETURN            from outside to this node's pods
//! ! -s <cluster> -d <cluster> -j MASQUERADE            from outside to other nodes' pods (replies come back)
//! ```
//!
//! nftables (a network config's `EnableNFTables`): flannel v0.28's own layout (its
//! `pkg/trafficmngr/nftables`), so an operator's `nft list ruleset` and flannel's docs agree and a node moved
//! between flanneld and fabricd keeps one copy: table `ip flannel-ipv4` (and `ip6 flannel-ipv6`), chain
//! `postrtg` (nat hook postrouting, priority srcnat) holding, in flannel's order,
//!
//! ```text
//! meta mark 0x00004000 return                               kube-proxy masquerades what it marked
//! ip saddr <node subnet> ip daddr <cluster> return          this node's pods to pods: never NAT
//! ip saddr <cluster> ip daddr <node subnet> return          pods to this node's pods
//! ip saddr != <node subnet> ip daddr <cluster> return       forwarded to pods from elsewhere: keep the source
//! ip saddr <cluster> ip daddr != 224.0.0.0/4 masquerade fully-random     pods leaving the cluster
//! ip saddr != <cluster> ip daddr <cluster> masquerade fully-random       (flannel's last rule, kept as is)
//! ```
//!
//! (`ip6` and `ff00::/8` for IPv6.) One nf_tables netlink transaction ([`super::flannel_nft`]; no `nft`
//! process) replaces every table of the layout whole: flannel's two (a family not in use loses its table) and
//! `inet fabricd`, where fabricd's previous release kept its masquerade. Applying it again leaves one copy;
//! [`teardown`] removes them from both backends.

use ipnet::IpNet;

use super::iptables::{self, Rule, Script};
use super::{flannel_nft, masq, nfnl};
use super::{Backend, Family};
use crate::spec::{ErrorContext, Errors, Result};

/// The iptables chain (flannel's name, in `iptables` and `ip6tables`).
pub const CHAIN: &str = "FLANNEL-POSTRTG";
const JUMP_COMMENT: &str = "flanneld masq";
pub use super::flannel_nft::{CHAIN as NFT_CHAIN, OLD_TABLE as OLD_NFT_TABLE, TABLES as NFT_TABLES};

/// The chain's rules for one family, in order.
fn rules(cluster: IpNet, node_subnet: IpNet) -> Result<Vec<Rule>> {
    let multicast = masq::plan(&[cluster], &[]).remove(0).multicast();
    Ok(vec![
        Rule::new().source(cluster, false)?.destination(cluster, false)?.jump("RETURN"),
        Rule::new().source(cluster, false)?.destination(multicast, true)?.jump("MASQUERADE"),
        Rule::new().source(cluster, true)?.destination(node_subnet, false)?.jump("RETURN"),
        Rule::new().source(cluster, true)?.destination(cluster, false)?.jump("MASQUERADE"),
    ])
}

fn jump() -> Rule {
    Rule::new().comment(JUMP_COMMENT).jump(CHAIN)
}

/// The iptables transaction making the chain exactly [`rules`] given what the nat table holds.
fn iptables_plan(snapshot: &iptables::Snapshot, script: &mut Script, rules: &[Rule]) {
    if snapshot.has_chain(CHAIN) {
        script.declare_chain(CHAIN).flush_chain(CHAIN);
    } else {
        script.new_chain(CHAIN);
    }
    for rule in rules {
        script.append(CHAIN, rule);
    }
    if !snapshot.has_rule("POSTROUTING", &jump()) {
        script.append("POSTROUTING", &jump());
    }
}

/// True when the nftables layout is as [`flannel_nft::transaction`] makes it: each family of `pairs` has its
/// table with flanneld's rules (counted), no other table of the layout exists (netlink dumps).
fn nft_is_set_up(pairs: &[(IpNet, IpNet)]) -> Result<bool> {
    let tables = nfnl::tables().context("listing the nf_tables tables")?;
    let exists = |family: &str, name: &str| tables.iter().any(|(f, n)| f == family && n == name);
    if exists("inet", OLD_NFT_TABLE) {
        return Ok(false);
    }
    for (family, name) in NFT_TABLES {
        let keyword = if family == Family::V4 { "ip" } else { "ip6" };
        match pairs.iter().find(|(cluster, _)| Family::of_net(cluster) == family) {
            None if exists(keyword, name) => return Ok(false),
            None => {}
            Some((cluster, node_subnet)) => {
                let wanted = flannel_nft::rules(*cluster, *node_subnet).len();
                if !exists(keyword, name) || flannel_nft::rule_count(family).context("listing the rules")? != wanted {
                    return Ok(false);
                }
            }
        }
    }
    Ok(true)
}

/// Installs (or corrects) the masquerade rules for each (cluster network, this node's subnet) pair, one per
/// family (iptables: one transaction per family; nftables: one for all).
pub fn setup(backend: Backend, pairs: &[(IpNet, IpNet)]) -> Result<()> {
    match backend {
        Backend::Iptables => {
            for (cluster, node_subnet) in pairs {
                let rules = rules(*cluster, *node_subnet)?;
                let family = Family::of_net(cluster);
                iptables::update(family, "nat", "installing the node masquerade rules", |snapshot, script| {
                    iptables_plan(snapshot, script, &rules)
                })?;
            }
            Ok(())
        }
        Backend::Nftables => flannel_nft::apply(pairs)
            .map_err(|e| crate::spec::Error::io(format!("installing the node masquerade rules: {e}"))),
    }
}

/// True when the rules of [`setup`] are in place (iptables: each family's chain holds exactly them and is
/// jumped to).
pub fn is_set_up(backend: Backend, pairs: &[(IpNet, IpNet)]) -> Result<bool> {
    match backend {
        Backend::Iptables => {
            for (cluster, node_subnet) in pairs {
                let family = Family::of_net(cluster);
                let snapshot = iptables::save(family, "nat").map_err(|f| f.to_error("reading the nat table"))?;
                let wanted: Vec<String> = rules(*cluster, *node_subnet)?.iter().map(Rule::render).collect();
                let present: Vec<&str> = snapshot.rules(CHAIN).collect();
                if !snapshot.has_rule("POSTROUTING", &jump())
                    || present != wanted.iter().map(String::as_str).collect::<Vec<_>>()
                {
                    return Ok(false);
                }
            }
            Ok(true)
        }
        Backend::Nftables => nft_is_set_up(pairs),
    }
}

/// Removes the rules of [`setup`] from both backends and both families (whichever is installed); nothing
/// there is fine.
pub fn teardown() -> Result<()> {
    let mut errors = Errors::new();
    for family in Family::ALL {
        if iptables::available(family) {
            errors.record(iptables::cleanup(
                family,
                "nat",
                "removing the node masquerade rules",
                |snapshot, script| iptables::remove_chain(script, snapshot, CHAIN),
            ));
        }
    }
    // Over netlink: no `nft` binary needed; a kernel without nf_tables has none of the tables.
    if nfnl::tables().is_ok() {
        errors.record(
            flannel_nft::apply(&[])
                .map_err(|e| crate::spec::Error::io(format!("removing the node masquerade tables: {e}"))),
        );
    }
    errors.into_result().map_err(|e| e.within("failed to remove the node masquerade rules"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nets() -> (IpNet, IpNet) {
        ("10.244.0.0/16".parse().unwrap(), "10.244.3.0/24".parse().unwrap())
    }

    fn nets_v6() -> (IpNet, IpNet) {
        ("fd00:10:244::/56".parse().unwrap(), "fd00:10:244:3::/64".parse().unwrap())
    }

    #[test]
    fn iptables_rules_are_flannels() {
        let (cluster, subnet) = nets();
        let rendered: Vec<String> = rules(cluster, subnet).unwrap().iter().map(Rule::render).collect();
        assert_eq!(
            rendered,
            [
                "-s 10.244.0.0/16 -d 10.244.0.0/16 -j RETURN",
                "-s 10.244.0.0/16 ! -d 224.0.0.0/4 -j MASQUERADE",
                "! -s 10.244.0.0/16 -d 10.244.3.0/24 -j RETURN",
                "! -s 10.244.0.0/16 -d 10.244.0.0/16 -j MASQUERADE",
            ]
        );
        let fresh = iptables::Snapshot::parse("*nat\n:POSTROUTING ACCEPT [0:0]\nCOMMIT\n", "nat");
        let mut script = Script::new("nat");
        iptables_plan(&fresh, &mut script, &rules(cluster, subnet).unwrap());
        let text = script.render();
        assert!(text.contains("-N FLANNEL-POSTRTG\n"), "{text}");
        assert!(text.contains("-A POSTROUTING -m comment --comment \"flanneld masq\" -j FLANNEL-POSTRTG"), "{text}");
    }

    #[test]
    fn ip6tables_rules_are_flannels_for_ipv6() {
        let (cluster, subnet) = nets_v6();
        let rendered: Vec<String> = rules(cluster, subnet).unwrap().iter().map(Rule::render).collect();
        assert_eq!(
            rendered,
            [
                "-s fd00:10:244::/56 -d fd00:10:244::/56 -j RETURN",
                "-s fd00:10:244::/56 ! -d ff00::/8 -j MASQUERADE",
                "! -s fd00:10:244::/56 -d fd00:10:244:3::/64 -j RETURN",
                "! -s fd00:10:244::/56 -d fd00:10:244::/56 -j MASQUERADE",
            ]
        );
    }
}
