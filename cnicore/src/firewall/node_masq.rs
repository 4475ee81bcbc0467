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
//! nftables: table `inet fabricd`, chain `postrouting` (nat hook, srcnat): pods leaving the cluster are
//! masqueraded by the rule the bridge's ipMasq decision renders ([`masq::plan`] with the cluster as source and
//! exception: `ip saddr { <cluster> } ip daddr != { <cluster>, 224.0.0.0/4 } masquerade`), then the two rules
//! for traffic from outside. Both backends are one transaction; applying them again leaves one copy;
//! [`teardown`] removes them from both.

use ipnet::IpNet;

use super::iptables::{self, Rule, Script};
use super::{masq, nftables};
use super::{Backend, Family};
use crate::spec::{Errors, Result};

/// The iptables chain (flannel's name, in `iptables` and `ip6tables`).
pub const CHAIN: &str = "FLANNEL-POSTRTG";
const JUMP_COMMENT: &str = "flanneld masq";
/// The nftables table.
pub const NFT_TABLE: &str = "fabricd";

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

/// The nftables transaction for every family (replaces the table whole, atomically).
fn nft_script(pairs: &[(IpNet, IpNet)]) -> nftables::Script {
    let t = format!("inet {NFT_TABLE}");
    let mut script = nftables::Script::new();
    script
        .push(format!("add table {t}"))
        .push(format!("delete table {t}"))
        .push(format!("add table {t}"))
        .push(format!("add chain {t} postrouting {{ type nat hook postrouting priority srcnat; }}"));
    for (cluster, node_subnet) in pairs {
        let kw = Family::of_net(cluster).nft_keyword();
        let pods_leaving = masq::plan(&[*cluster], &[*cluster]).remove(0).nft_masquerade_rule();
        script
            .push(format!("add rule {t} postrouting {pods_leaving}"))
            .push(format!("add rule {t} postrouting {kw} saddr != {cluster} {kw} daddr {node_subnet} return"))
            .push(format!("add rule {t} postrouting {kw} saddr != {cluster} {kw} daddr {cluster} masquerade"));
    }
    script
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
        Backend::Nftables => {
            nft_script(pairs).apply().map_err(|failure| failure.to_error("installing the node masquerade rules"))
        }
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
        Backend::Nftables => {
            let listing = nftables::list(&["table", "inet", NFT_TABLE]).map_err(|f| f.to_error("listing nftables"))?;
            Ok(listing.is_some_and(|listing| {
                nftables::objects(&listing, "rule", "inet", NFT_TABLE).count() == 3 * pairs.len()
            }))
        }
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
    if Backend::Nftables.available() {
        let mut script = nftables::Script::new();
        script.push(format!("add table inet {NFT_TABLE}")).push(format!("delete table inet {NFT_TABLE}"));
        errors.record(script.apply().map_err(|failure| failure.to_error("removing the node masquerade table")));
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
    fn nft_is_one_replacing_transaction() {
        let (cluster, subnet) = nets();
        let text = nft_script(&[(cluster, subnet), nets_v6()]).render();
        assert!(
            text.starts_with("add table inet fabricd\ndelete table inet fabricd\nadd table inet fabricd\n"),
            "{text}"
        );
        assert!(
            text.contains(
                "meta nfproto ipv4 ip saddr { 10.244.0.0/16 } ip daddr != { 10.244.0.0/16, 224.0.0.0/4 } masquerade"
            ),
            "{text}"
        );
        assert!(text.contains("add rule inet fabricd postrouting meta nfproto ipv6 ip6 saddr { fd00:10:244::/56 } ip6 daddr != { fd00:10:244::/56, ff00::/8 } masquerade\n"), "{text}");
        assert!(
            text.contains(
                "add rule inet fabricd postrouting ip6 saddr != fd00:10:244::/56 ip6 daddr fd00:10:244:3::/64 return\n"
            ),
            "{text}"
        );
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
