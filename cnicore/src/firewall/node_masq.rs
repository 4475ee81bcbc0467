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
/// flanneld's iptables chain of `--iptables-forward-rules` (table `filter`, jumped to from `FORWARD`).
pub const FORWARD_CHAIN: &str = "FLANNEL-FWD";
const FORWARD_COMMENT: &str = "flanneld forward";
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

/// flanneld's `--iptables-forward-rules` for one family's Network (its `forwardRules`).
fn forward_rules(cluster: IpNet) -> Result<Vec<Rule>> {
    Ok(vec![
        Rule::new().source(cluster, false)?.comment(FORWARD_COMMENT).jump("ACCEPT"),
        Rule::new().destination(cluster, false)?.comment(FORWARD_COMMENT).jump("ACCEPT"),
    ])
}

/// One of flanneld's iptables chains: its table, its name, the built-in chain jumping to it and that jump's
/// comment.
struct IptablesChain {
    table: &'static str,
    name: &'static str,
    from: &'static str,
    comment: &'static str,
}

const MASQ_CHAIN: IptablesChain =
    IptablesChain { table: "nat", name: CHAIN, from: "POSTROUTING", comment: JUMP_COMMENT };
const FWD_CHAIN: IptablesChain =
    IptablesChain { table: "filter", name: FORWARD_CHAIN, from: "FORWARD", comment: FORWARD_COMMENT };

impl IptablesChain {
    fn jump(&self) -> Rule {
        Rule::new().comment(self.comment).jump(self.name)
    }

    /// The transaction making the chain exactly `rules`, jumped to, given what the table holds.
    fn plan(&self, snapshot: &iptables::Snapshot, script: &mut Script, rules: &[Rule]) {
        if snapshot.has_chain(self.name) {
            script.declare_chain(self.name).flush_chain(self.name);
        } else {
            script.new_chain(self.name);
        }
        for rule in rules {
            script.append(self.name, rule);
        }
        if !snapshot.has_rule(self.from, &self.jump()) {
            script.append(self.from, &self.jump());
        }
    }

    fn install(&self, family: Family, rules: &[Rule], what: &str) -> Result<()> {
        iptables::update(family, self.table, what, |snapshot, script| self.plan(snapshot, script, rules))
    }

    /// True when the chain holds exactly `rules` and is jumped to.
    fn holds(&self, family: Family, rules: &[Rule]) -> Result<bool> {
        let snapshot =
            iptables::save(family, self.table).map_err(|f| f.to_error(&format!("reading the {} table", self.table)))?;
        let wanted: Vec<String> = rules.iter().map(Rule::render).collect();
        let present: Vec<&str> = snapshot.rules(self.name).collect();
        Ok(snapshot.has_rule(self.from, &self.jump())
            && present == wanted.iter().map(String::as_str).collect::<Vec<_>>())
    }

    fn remove(&self, family: Family, errors: &mut Errors) {
        let what = format!("removing the {} chain", self.name);
        errors.record(iptables::cleanup(family, self.table, &what, |snapshot, script| {
            iptables::remove_chain(script, snapshot, self.name)
        }));
    }
}

/// True when the nftables layout is as [`flannel_nft::transaction`] makes it: each family of `pairs` or
/// `forward` has its table with flanneld's rules in each chain (counted), no other table of the layout exists
/// (netlink dumps).
fn nft_is_set_up(pairs: &[(IpNet, IpNet)], forward: &[IpNet]) -> Result<bool> {
    let tables = nfnl::tables().context("listing the nf_tables tables")?;
    let exists = |family: &str, name: &str| tables.iter().any(|(f, n)| f == family && n == name);
    if exists("inet", OLD_NFT_TABLE) {
        return Ok(false);
    }
    for (family, name) in NFT_TABLES {
        let keyword = if family == Family::V4 { "ip" } else { "ip6" };
        let masq = pairs.iter().find(|(cluster, _)| Family::of_net(cluster) == family);
        let accept = forward.iter().find(|cluster| Family::of_net(cluster) == family);
        if masq.is_none() && accept.is_none() {
            if exists(keyword, name) {
                return Ok(false);
            }
            continue;
        }
        let wanted = [
            (flannel_nft::CHAIN, masq.map_or(0, |(cluster, pods)| flannel_nft::rules(*cluster, *pods).len())),
            (flannel_nft::FORWARD_CHAIN, accept.map_or(0, |cluster| flannel_nft::forward_rules(*cluster).len())),
        ];
        if !exists(keyword, name) {
            return Ok(false);
        }
        for (chain, count) in wanted {
            if flannel_nft::rule_count(family, chain).context("listing the rules")? != count {
                return Ok(false);
            }
        }
    }
    Ok(true)
}

/// Installs (or corrects) the masquerade rules for each (cluster network, this node's subnet) pair of `pairs`,
/// and flanneld's forward accept rules (`--iptables-forward-rules`) for each cluster network of `forward`, one
/// family each (iptables: one transaction per family and table; nftables: one for all).
pub fn setup(backend: Backend, pairs: &[(IpNet, IpNet)], forward: &[IpNet]) -> Result<()> {
    match backend {
        Backend::Iptables => {
            for (cluster, node_subnet) in pairs {
                let rules = rules(*cluster, *node_subnet)?;
                MASQ_CHAIN.install(Family::of_net(cluster), &rules, "installing the node masquerade rules")?;
            }
            for cluster in forward {
                let rules = forward_rules(*cluster)?;
                FWD_CHAIN.install(Family::of_net(cluster), &rules, "installing the forward accept rules")?;
            }
            Ok(())
        }
        Backend::Nftables => flannel_nft::apply(pairs, forward)
            .map_err(|e| crate::spec::Error::io(format!("installing the node masquerade rules: {e}"))),
    }
}

/// True when the rules of [`setup`] are in place (iptables: each family's chains hold exactly them and are
/// jumped to).
pub fn is_set_up(backend: Backend, pairs: &[(IpNet, IpNet)], forward: &[IpNet]) -> Result<bool> {
    match backend {
        Backend::Iptables => {
            for (cluster, node_subnet) in pairs {
                if !MASQ_CHAIN.holds(Family::of_net(cluster), &rules(*cluster, *node_subnet)?)? {
                    return Ok(false);
                }
            }
            for cluster in forward {
                if !FWD_CHAIN.holds(Family::of_net(cluster), &forward_rules(*cluster)?)? {
                    return Ok(false);
                }
            }
            Ok(true)
        }
        Backend::Nftables => nft_is_set_up(pairs, forward),
    }
}

/// Removes the rules of [`setup`] from both backends and both families (whichever is installed); nothing
/// there is fine.
pub fn teardown() -> Result<()> {
    let mut errors = Errors::new();
    for family in Family::ALL {
        if iptables::available(family) {
            MASQ_CHAIN.remove(family, &mut errors);
            FWD_CHAIN.remove(family, &mut errors);
        }
    }
    // Over netlink: no `nft` binary needed; a kernel without nf_tables has none of the tables.
    if nfnl::tables().is_ok() {
        errors.record(
            flannel_nft::apply(&[], &[])
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
        MASQ_CHAIN.plan(&fresh, &mut script, &rules(cluster, subnet).unwrap());
        let text = script.render();
        assert!(text.contains("-N FLANNEL-POSTRTG\n"), "{text}");
        assert!(text.contains("-A POSTROUTING -m comment --comment \"flanneld masq\" -j FLANNEL-POSTRTG"), "{text}");
        // --iptables-forward-rules: flanneld's FLANNEL-FWD in filter, jumped to from FORWARD.
        let rendered: Vec<String> = forward_rules(cluster).unwrap().iter().map(Rule::render).collect();
        assert_eq!(
            rendered,
            [
                "-s 10.244.0.0/16 -m comment --comment \"flanneld forward\" -j ACCEPT",
                "-d 10.244.0.0/16 -m comment --comment \"flanneld forward\" -j ACCEPT",
            ]
        );
        let fresh = iptables::Snapshot::parse("*filter\n:FORWARD DROP [0:0]\nCOMMIT\n", "filter");
        let mut script = Script::new("filter");
        FWD_CHAIN.plan(&fresh, &mut script, &forward_rules(cluster).unwrap());
        let text = script.render();
        assert!(text.contains("-A FORWARD -m comment --comment \"flanneld forward\" -j FLANNEL-FWD"), "{text}");
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
