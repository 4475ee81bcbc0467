//! The bridge plugin's `ipMasq`: masquerade pod traffic leaving the pod's subnet, except traffic to multicast
//! and to the configured `nonMasqueradeCIDRs` (the cluster CIDR, so that pods reach pods on other nodes with
//! their own address, as kubenet's `--non-masquerade-cidr` did).
//!
//! # API
//!
//! ```ignore
//! use cnicore::firewall::{masq, Backend};
//! // `ipMasqBackend` parsed with Backend::parse at config load (code 7 for an unknown name); none configured
//! // means iptables when its binary exists, else nftables.
//! let backend = Backend::or_detect(conf.masq_backend)?;
//! // The pod's addresses WITH their prefix (result.ips[].address, e.g. 10.22.0.5/24) and the exceptions.
//! let pod = masq::Attachment { network: &conf.name, container_id: &ctx.env.container_id, ips: &pod_ips,
//!                              non_masquerade: &conf.non_masquerade_cidrs };
//! masq::setup(backend, &pod)?;         // ADD, after IPAM
//! masq::check(backend, &pod)?;         // CHECK: every rule or element is there, no exception more or less
//! masq::teardown(&pod)?;               // DEL (also without netns, from prevResult's IPs; none = both families)
//! // GC: everything of this network whose container is not in the valid list (ifname is ignored).
//! masq::gc(&conf.name, &ctx.valid_attachments()?)?;
//! // ADD with iptables: the restore processes started while IPAM runs, then given the rules.
//! let ahead = masq::start_ahead(backend, &masq::expected_families(conf.ipam.as_ref()));
//! masq::setup_ahead(backend, &pod, ahead)?;
//! // CHECK and GC that also know the reference's nftables rules (a node moved from its v1.6+ binaries).
//! masq::check_with_reference(backend, &pod, &ctx.env.ifname)?;
//! masq::gc_with_reference(&conf.name, &ctx.valid_attachments()?)?;
//! // The decision alone, as data (per family).
//! let plans = masq::plan(&["10.244.1.0/24".parse()?], &["10.244.0.0/16".parse()?]);
//! ```
//!
//! (A node agent's masquerade of the whole pod network is [`super::node_masq`]'s, in flannel's layout.)
//!
//! - [`plan`] is the decision, per family: traffic from the sources to their own subnets, to the exceptions
//!   of the family (entries of the other family are not used) and to multicast keeps its source; everything
//!   else is masqueraded. [`Plan::iptables_chain_rules`] renders it in the reference's chain layout,
//!   [`Plan::nft_masquerade_rule`] as one nftables rule for whole subnets.
//! - `setup` is idempotent (a repeated ADD leaves one copy of every rule, and a changed exception list
//!   replaces the old one). iptables: one `iptables-restore` per family for a new pod (`-N` of its chain fails
//!   when it exists, and then the nat table is read with one `iptables-save -t nat` and a complete
//!   transaction applied); nftables: one netlink batch for all families (`nft -f -` for the first pod, which
//!   sets the table up).
//!   Errors: code 50 when the backend's binaries are missing, 999 when the kernel refuses.
//! - `teardown` cleans BOTH backends (whichever binaries are installed), since the pod may have been set up by
//!   another plugin version or config, and succeeds when everything is already gone (no netns needed: it
//!   needs only the network name, the container ID and, optionally, the IPs). iptables: one save + at most one
//!   restore per family; nftables: one netlink batch when the IPs are given and present, else set dumps and
//!   one batch (found by tag; `nft` when netlink cannot be used).
//! - `gc` removes the masquerade state of every attachment of `network` whose container ID is not listed.
//!
//! # Layout
//!
//! iptables (the reference bridge v1.1.1, `pkg/ip/ipmasq_linux.go`, so either plugin cleans up after the
//! other): in table `nat`, a chain `CNI-<hash>` (`utils.FormatChainName(network, containerID)`) holding, for
//! each pod address, `-d <pod subnet> -j ACCEPT`, then (ours only) `-d <exception> -j ACCEPT` for each
//! exception of the family, then one `! -d 224.0.0.0/4 -j MASQUERADE` (`ff00::/8` for IPv6), all with the
//! comment `name: "<network>" id: "<containerID>"`; `POSTROUTING` jumps to it with `-s <pod IP>/32` (`/128`)
//! and the same comment. The reference's DEL flushes and deletes the whole chain, exceptions included.
//!
//! nftables (ours): table `inet cni_ipmasq`; per family and pod prefix length (usually one), a postrouting
//! chain (nat hook, priority srcnat) of four fixed rules and two hash sets holding the pods, e.g. for /24:
//!
//! ```text
//! chain masq4-24 { meta nfproto ipv4 ip daddr 224.0.0.0/4 return                    # ff00::/8 for IPv6
//!                  meta nfproto ipv4 ip saddr . ip daddr & 255.255.255.0 @local4_24 return
//!                  meta nfproto ipv4 ip saddr vmap @nomasq4
//!                  meta nfproto ipv4 ip saddr @pods4_24 masquerade }
//! set pods4_24  { type ipv4_addr }               # <pod IP>
//! set local4_24 { type ipv4_addr . ipv4_addr }   # <pod IP> . <pod subnet address>
//! map nomasq4   { type ipv4_addr : verdict }     # <pod IP> : jump nomasq4-<hash>, for pods with exceptions
//! chain nomasq4-<12 hex of the sorted exceptions> { ip daddr { 10.244.0.0/16, ... } accept }
//! ```
//!
//! (Plain hash sets looked up with a masked address rather than interval sets: deleting from an interval set
//! costs time proportional to its size. One difference with the iptables layout: a pod with two addresses of
//! one family in different subnets is exempted, for each address, from its own subnet only.) A `nomasq`
//! chain is named by its content, one per distinct exception list, shared by the pods that use it and left
//! in place like the fixed chains.
//!
//! Each element carries the comment `masq-<net hash>-<attachment hash>` (for teardown without IPs and GC).
//! Adding a pod adds elements in one transaction (a netlink batch) without reading anything: its cost does not
//! depend on the number of pods.

use std::collections::BTreeSet;

use ipnet::IpNet;

use super::iptables::{self, Rule, Script};
use super::nftables::{self, Datum, Element, MapValue};
use super::{chain_name, families_of, hex_sha512, nft_tag, owner_comment};
use super::{validate_owner, Backend, Family};
use crate::spec::{Error, Errors, Result};

/// The nftables table of ipMasq.
pub const NFT_TABLE: &str = "cni_ipmasq";
/// Elements are tagged (commented) `masq-<net hash>-<attachment hash>`.
const NFT_TAG_KIND: &str = "masq";

fn multicast(family: Family) -> IpNet {
    match family {
        Family::V4 => "224.0.0.0/4".parse().expect("constant"),
        Family::V6 => "ff00::/8".parse().expect("constant"),
    }
}

/// One attachment's masquerade: who it is for, the pod's addresses (with their prefixes), and the
/// destinations besides the pod's own subnet that keep the pod's address (`nonMasqueradeCIDRs`).
#[derive(Debug, Clone, Copy)]
pub struct Attachment<'a> {
    pub network: &'a str,
    pub container_id: &'a str,
    pub ips: &'a [IpNet],
    pub non_masquerade: &'a [IpNet],
}

/// The masquerade decision for the traffic of one family's sources (pod addresses or whole pod subnets).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub family: Family,
    /// The addresses (or subnets) whose traffic is masqueraded, as given, with their prefixes.
    pub sources: Vec<IpNet>,
    /// The sources' own subnets, each once: traffic to them keeps its source.
    pub own_subnets: Vec<IpNet>,
    /// The exceptions of this family that are not an own subnet, each once, in the order given: traffic to
    /// them keeps its source too.
    pub exceptions: Vec<IpNet>,
}

/// What to masquerade for traffic from `sources` (pod addresses or pod subnets, with prefixes), given the
/// prefixes `non_masquerade` whose traffic keeps its source: one [`Plan`] per family of `sources`, IPv4
/// first. Exceptions of a family without sources are not used.
pub fn plan(sources: &[IpNet], non_masquerade: &[IpNet]) -> Vec<Plan> {
    families_of(sources)
        .into_iter()
        .map(|family| {
            let sources: Vec<IpNet> = sources.iter().copied().filter(|s| Family::of_net(s) == family).collect();
            let mut own_subnets: Vec<IpNet> = Vec::new();
            for subnet in sources.iter().map(IpNet::trunc) {
                if !own_subnets.contains(&subnet) {
                    own_subnets.push(subnet);
                }
            }
            let mut exceptions: Vec<IpNet> = Vec::new();
            for prefix in non_masquerade.iter().filter(|p| Family::of_net(p) == family).map(IpNet::trunc) {
                if !own_subnets.contains(&prefix) && !exceptions.contains(&prefix) {
                    exceptions.push(prefix);
                }
            }
            Plan { family, sources, own_subnets, exceptions }
        })
        .collect()
}

impl Plan {
    /// Multicast of the family, which is never masqueraded.
    pub fn multicast(&self) -> IpNet {
        multicast(self.family)
    }

    /// True when traffic from one of the sources to `destination` is masqueraded.
    #[cfg(test)]
    pub fn masquerades(&self, destination: std::net::IpAddr) -> bool {
        Family::of(destination) == self.family
            && !self.own_subnets.iter().chain(&self.exceptions).any(|net| net.contains(&destination))
            && !self.multicast().contains(&destination)
    }

    /// The rules of the reference's per-attachment chain, in order: ACCEPT for each own subnet, then for each
    /// exception, then `! -d <multicast> -j MASQUERADE`; all with `comment`. The chain is entered from
    /// POSTROUTING for the sources.
    pub fn iptables_chain_rules(&self, comment: &str) -> Result<Vec<Rule>> {
        let mut rules = Vec::new();
        for net in self.own_subnets.iter().chain(&self.exceptions) {
            rules.push(Rule::new().destination(*net, false)?.comment(comment).jump("ACCEPT"));
        }
        rules.push(Rule::new().destination(self.multicast(), true)?.comment(comment).jump("MASQUERADE"));
        Ok(rules)
    }

    /// The whole decision as one nftables rule for a postrouting nat chain of an `inet` table, e.g.
    /// `meta nfproto ipv4 ip saddr { 10.244.1.0/24 } ip daddr != { 10.244.1.0/24, 10.244.0.0/16, 224.0.0.0/4 }
    /// masquerade` (for a node agent masquerading whole pod subnets; the bridge keeps per-pod elements).
    pub fn nft_masquerade_rule(&self) -> String {
        let list =
            |nets: &mut dyn Iterator<Item = &IpNet>| nets.map(iptables::render_net).collect::<Vec<_>>().join(", ");
        let kept: Vec<IpNet> =
            self.own_subnets.iter().chain(&self.exceptions).copied().chain([self.multicast()]).collect();
        let (proto, kw) = (self.family.nfproto(), self.family.nft_keyword());
        format!(
            "meta nfproto {proto} {kw} saddr {{ {} }} {kw} daddr != {{ {} }} masquerade",
            list(&mut self.sources.iter()),
            list(&mut kept.iter())
        )
    }
}

/// Installs masquerading for the attachment's pod addresses.
pub fn setup(backend: Backend, pod: &Attachment) -> Result<()> {
    setup_ahead(backend, pod, Ahead::default())
}

/// The `iptables-restore` processes of an attachment's masquerade, started before its addresses are known
/// ([`start_ahead`]) and used by [`setup_ahead`]; dropped unused, they are killed.
#[derive(Debug, Default)]
pub struct Ahead {
    restores: Vec<(Family, super::exec::Started)>,
}

/// With the iptables backend, starts the restore process of each of `families` (the families the attachment
/// is expected to have: [`expected_families`]) while its addresses are still being found (the IPAM plugin
/// runs), so that the process has loaded its libraries and extensions when [`setup_ahead`] writes it the
/// rules. A family the lease turns out not to have costs one process, killed unused.
pub fn start_ahead(backend: Backend, families: &[Family]) -> Ahead {
    let restores = match backend {
        Backend::Iptables => families.iter().map(|&family| (family, iptables::start_restore(family))).collect(),
        Backend::Nftables => Vec::new(),
    };
    Ahead { restores }
}

/// The families an IPAM config names, to start ahead for: host-local's `ranges` and `subnet`, static's
/// `addresses`; IPv4 when it names none (any other IPAM, whose leases are most often IPv4 only).
pub fn expected_families(ipam: Option<&serde_json::Value>) -> Vec<Family> {
    use crate::spec::gojson::field;
    use serde_json::Value;
    let mut prefixes: Vec<&str> = Vec::new();
    if let Some(ipam) = ipam {
        let ranges = field(ipam, "ranges").and_then(Value::as_array).into_iter().flatten();
        for range in ranges.filter_map(Value::as_array).flatten() {
            prefixes.extend(field(range, "subnet").and_then(Value::as_str));
        }
        prefixes.extend(field(ipam, "subnet").and_then(Value::as_str));
        let addresses = field(ipam, "addresses").and_then(Value::as_array).into_iter().flatten();
        prefixes.extend(addresses.filter_map(|a| field(a, "address").and_then(Value::as_str)));
    }
    let mut families: Vec<Family> =
        prefixes.iter().filter_map(|p| p.parse::<IpNet>().ok()).map(|net| Family::of_net(&net)).collect();
    families.sort();
    families.dedup();
    if families.is_empty() {
        families.push(Family::V4);
    }
    families
}

/// [`setup`] with the restore processes started by [`start_ahead`].
pub fn setup_ahead(backend: Backend, pod: &Attachment, mut ahead: Ahead) -> Result<()> {
    validate_owner(pod.network, pod.container_id)?;
    if pod.ips.is_empty() {
        return Ok(());
    }
    match backend {
        Backend::Iptables => {
            for family_plan in plan(pod.ips, pod.non_masquerade) {
                let started = ahead.restores.iter().position(|(f, _)| *f == family_plan.family);
                iptables_setup(&family_plan, pod, started.map(|i| ahead.restores.swap_remove(i).1))?;
            }
            Ok(())
        }
        Backend::Nftables => nft_setup(pod),
    }
}

/// CHECK of a pod's masquerading (bridge's and ptp's): ours ([`check`]), or else the rule the reference's
/// nftables backend (v1.6+) wrote for the pod's interface `ifname`, for a pod set up before the node moved to
/// ours.
pub fn check_with_reference(backend: Backend, pod: &Attachment, ifname: &str) -> Result<()> {
    let Err(ours) = check(backend, pod) else { return Ok(()) };
    let theirs =
        backend == Backend::Nftables && super::reference_nft::ipmasq_has_rule(pod.network, ifname, pod.container_id)?;
    if theirs {
        Ok(())
    } else {
        Err(ours)
    }
}

/// CHECK: the attachment's masquerading is in place as `setup` makes it, with exactly the configured
/// exceptions (a missing, extra or changed rule or element is an error naming it).
pub fn check(backend: Backend, pod: &Attachment) -> Result<()> {
    validate_owner(pod.network, pod.container_id)?;
    match backend {
        Backend::Iptables => {
            for family_plan in plan(pod.ips, pod.non_masquerade) {
                iptables_check(&family_plan, pod)?;
            }
            Ok(())
        }
        Backend::Nftables => nft_check(pod),
    }
}

/// Removes the masquerading of the attachment from both backends. Its `ips` (from prevResult) limit the
/// iptables families looked at; when empty, both are. Each family's iptables transaction and the nftables
/// one run at the same time: they touch different tables, and each mostly waits (for its process, and for
/// the RCU grace period that a deleting nf_tables transaction waits for when its socket closes).
pub fn teardown(pod: &Attachment) -> Result<()> {
    validate_owner(pod.network, pod.container_id)?;
    let families = if pod.ips.is_empty() { Family::ALL.to_vec() } else { families_of(pod.ips) };
    let outcomes = std::thread::scope(|s| {
        let mut workers = Vec::new();
        for family in families {
            if iptables::available(family) {
                workers.push(s.spawn(move || iptables_teardown(family, pod.network, pod.container_id)));
            }
        }
        if Backend::Nftables.available() {
            workers.push(s.spawn(|| nft_teardown(pod)));
        }
        workers
            .into_iter()
            .map(|w| w.join().unwrap_or_else(|_| Err(Error::internal("a worker thread panicked"))))
            .collect::<Vec<_>>()
    });
    let mut errors = Errors::new();
    for outcome in outcomes {
        errors.record(outcome);
    }
    errors.into_result().map_err(|e| e.within("failed to remove ipMasq rules"))
}

/// GC of the masquerading of `network`: ours ([`gc`]) and the rules of the reference's nftables backend
/// (bridge's and ptp's GC).
pub fn gc_with_reference(network: &str, valid: &[(String, String)]) -> Result<()> {
    let mut errors = Errors::new();
    errors.record(gc(network, valid));
    // Rules the reference bridge and ptp v1.6+ wrote with ipMasqBackend nftables (a node moved to ours).
    if Backend::Nftables.available() {
        errors.record(super::reference_nft::ipmasq_gc(network, valid));
    }
    errors.into_result()
}

/// Removes the masquerading of every attachment of `network` whose container ID is not in `valid`
/// (`(containerID, ifname)` pairs as `Context::valid_attachments` gives them; ifname is ignored), in both
/// backends.
pub fn gc(network: &str, valid: &[(String, String)]) -> Result<()> {
    crate::spec::validate_network_name(network)?;
    let valid: BTreeSet<&str> = valid.iter().map(|(id, _)| id.as_str()).collect();
    let mut errors = Errors::new();
    for family in Family::ALL {
        if iptables::available(family) {
            errors.record(iptables_gc(family, network, &valid));
        }
    }
    if Backend::Nftables.available() {
        errors.record(nft_gc(network, &valid));
    }
    errors.into_result().map_err(|e| e.within("ipMasq garbage collection failed"))
}

// ---- iptables ----

/// `POSTROUTING -s <pod IP>/32 -m comment --comment ... -j CNI-<hash>`.
fn iptables_jump(ip: &IpNet, comment: &str, chain: &str) -> Result<Rule> {
    let host = IpNet::new(ip.addr(), ip.max_prefix_len()).map_err(|e| Error::internal(e.to_string()))?;
    Ok(Rule::new().source(host, false)?.comment(comment).jump(chain))
}

/// The attachment's chain, its rules and the POSTROUTING jumps to it, for one family's plan.
fn iptables_layout(plan: &Plan, pod: &Attachment) -> Result<(String, Vec<Rule>, Vec<Rule>)> {
    let chain = chain_name(pod.network, pod.container_id, "");
    let comment = super::trim_comment(&owner_comment(pod.network, pod.container_id));
    let rules = plan.iptables_chain_rules(&comment)?;
    let jumps = plan.sources.iter().map(|ip| iptables_jump(ip, &comment, &chain)).collect::<Result<Vec<_>>>()?;
    Ok((chain, rules, jumps))
}

fn iptables_setup(plan: &Plan, pod: &Attachment, restore: Option<super::exec::Started>) -> Result<()> {
    let (chain, rules, jumps) = iptables_layout(plan, pod)?;
    // The usual case, a new pod, needs no reading: `-N` fails when the chain exists (a repeated ADD).
    let mut fast = Script::new("nat");
    fast.new_chain(&chain);
    for rule in &rules {
        fast.append(&chain, rule);
    }
    for jump in &jumps {
        fast.append("POSTROUTING", jump);
    }
    let restore = restore.unwrap_or_else(|| iptables::start_restore(plan.family));
    if fast.apply_started(restore).is_ok() {
        return Ok(());
    }
    let what = format!("setting up ipMasq for {}", pod.container_id);
    iptables::update(plan.family, "nat", &what, |snapshot, script| {
        if !snapshot.has_chain(&chain) {
            script.new_chain(&chain);
        }
        let current: Vec<&str> = snapshot.rules(&chain).collect();
        let wanted: Vec<String> = rules.iter().map(Rule::render).collect();
        if current != wanted.iter().map(String::as_str).collect::<Vec<_>>() {
            if !current.is_empty() {
                script.flush_chain(&chain);
            }
            for rule in &rules {
                script.append(&chain, rule);
            }
        }
        for jump in &jumps {
            if !snapshot.has_rule("POSTROUTING", jump) {
                script.append("POSTROUTING", jump);
            }
        }
    })
}

/// The chain holds exactly the planned rules, in order, and POSTROUTING jumps to it for every pod address.
fn iptables_check(plan: &Plan, pod: &Attachment) -> Result<()> {
    let (chain, rules, jumps) = iptables_layout(plan, pod)?;
    let snapshot = iptables::save(plan.family, "nat").map_err(|f| f.to_error("reading the nat table"))?;
    let problem = |what: String| Error::internal(format!("ipMasq of container {}: {what}", pod.container_id));
    if !snapshot.has_chain(&chain) {
        return Err(problem(format!("chain {chain} not found in the nat table")));
    }
    let current: Vec<&str> = snapshot.rules(&chain).collect();
    let wanted: Vec<String> = rules.iter().map(Rule::render).collect();
    if let Some(missing) = wanted.iter().find(|w| !current.contains(&w.as_str())) {
        return Err(problem(format!("rule not found in chain {chain}: {missing}")));
    }
    if let Some(extra) = current.iter().find(|c| !wanted.iter().any(|w| w == *c)) {
        return Err(problem(format!("unexpected rule in chain {chain}: {extra}")));
    }
    if current != wanted.iter().map(String::as_str).collect::<Vec<_>>() {
        return Err(problem(format!("the rules of chain {chain} are out of order")));
    }
    if let Some(jump) = jumps.iter().find(|j| !snapshot.has_rule("POSTROUTING", j)) {
        return Err(problem(format!("rule not found in chain POSTROUTING: {}", jump.render())));
    }
    Ok(())
}

fn iptables_teardown(family: Family, network: &str, container_id: &str) -> Result<()> {
    let chain = chain_name(network, container_id, "");
    iptables::cleanup(family, "nat", &format!("removing ipMasq rules of {container_id}"), |snapshot, script| {
        iptables::remove_chain(script, snapshot, &chain)
    })
}

fn iptables_gc(family: Family, network: &str, valid: &BTreeSet<&str>) -> Result<()> {
    let owned = iptables::OwnedChains {
        table: "nat",
        jumps_from: "POSTROUTING",
        comment_prefix: "",
        chain_of: |network, id| chain_name(network, id, ""),
    };
    iptables::remove_stale_owners(family, &owned, network, valid, "ipMasq garbage collection")
}

// ---- nftables ----

/// The sets and chain of pod addresses of one family and prefix length: (pods set, local set, chain).
fn nft_objects(ip: &IpNet) -> (String, String, String) {
    let (v, len) = (Family::of_net(ip).digit(), ip.prefix_len());
    (format!("pods{v}_{len}"), format!("local{v}_{len}"), format!("masq{v}-{len}"))
}

/// The verdict map of a family's pods that have exceptions.
fn nft_exception_map(family: Family) -> String {
    format!("nomasq{}", family.digit())
}

/// The chain accepting a plan's exceptions, named by them (sorted, so the order in the config does not
/// matter); `None` without exceptions.
fn nft_exception_chain(plan: &Plan) -> Option<String> {
    if plan.exceptions.is_empty() {
        return None;
    }
    let mut exceptions: Vec<String> = plan.exceptions.iter().map(iptables::render_net).collect();
    exceptions.sort();
    let hash = hex_sha512(&exceptions.join(","));
    Some(format!("{}-{}", nft_exception_map(plan.family), &hash[..12]))
}

/// The table, for each prefix length of `ips` its sets and postrouting chain, and for each family the
/// exceptions map (all created or refreshed), and the exception chains of `plans`.
fn nft_base(script: &mut nftables::Script, ips: &[IpNet], plans: &[Plan]) {
    let t = format!("inet {NFT_TABLE}");
    script.push(format!("add table {t}"));
    for family in families_of(ips) {
        let addr = family.nft_addr_type();
        script.push(format!("add map {t} {} {{ type {addr} : verdict ; }}", nft_exception_map(family)));
    }
    let mut done = Vec::new();
    for ip in ips {
        let (pods, local, chain) = nft_objects(ip);
        if done.contains(&chain) {
            continue;
        }
        let family = Family::of_net(ip);
        let addr = family.nft_addr_type();
        let (proto, kw, mask) = (family.nfproto(), family.nft_keyword(), ip.netmask());
        let exceptions = nft_exception_map(family);
        script.push(format!("add set {t} {pods} {{ type {addr} ; }}"));
        script.push(format!("add set {t} {local} {{ type {addr} . {addr} ; }}"));
        script.push(format!("add chain {t} {chain} {{ type nat hook postrouting priority srcnat ; }}"));
        script.push(format!("flush chain {t} {chain}"));
        script.push(format!("add rule {t} {chain} meta nfproto {proto} {kw} daddr {} return", multicast(family)));
        script.push(format!(
            "add rule {t} {chain} meta nfproto {proto} {kw} saddr . {kw} daddr & {mask} @{local} return"
        ));
        script.push(format!("add rule {t} {chain} meta nfproto {proto} {kw} saddr vmap @{exceptions}"));
        script.push(format!("add rule {t} {chain} meta nfproto {proto} {kw} saddr @{pods} masquerade"));
        done.push(chain);
    }
    for plan in plans {
        let Some(chain) = nft_exception_chain(plan) else { continue };
        let list: Vec<String> = plan.exceptions.iter().map(iptables::render_net).collect();
        script.push(format!("add chain {t} {chain}"));
        script.push(format!("flush chain {t} {chain}"));
        script.push(format!(
            "add rule {t} {chain} {} daddr {{ {} }} accept",
            plan.family.nft_keyword(),
            list.join(", ")
        ));
    }
}

/// The elements of an attachment: each pod address in the `pods` set of its prefix length, (pod address,
/// its subnet's address) in the `local` set, and (pod address : jump to the chain of its exceptions, or
/// `continue` without any: the map element's value) in the family's exception map. An entry for every pod, so that adding one fails
/// where an entry of an earlier pod with the same address was left, instead of silently keeping its verdict.
fn nft_elements(pod: &Attachment) -> Vec<Element> {
    let tag = nft_tag(NFT_TAG_KIND, pod.network, pod.container_id);
    let mut out: Vec<Element> = Vec::new();
    for plan in plan(pod.ips, pod.non_masquerade) {
        let verdict = nft_exception_chain(&plan).map_or(MapValue::Continue, MapValue::Jump);
        for ip in &plan.sources {
            let (pods, local, _) = nft_objects(ip);
            let addr = Datum::Addr(ip.addr());
            out.push(Element::new(pods, vec![addr.clone()], None).tagged(&tag));
            out.push(Element::new(local, vec![addr.clone(), Datum::Addr(ip.trunc().addr())], None).tagged(&tag));
            let exceptions = Element::new(nft_exception_map(plan.family), vec![addr], Some(verdict.clone()));
            out.push(exceptions.tagged(&tag));
        }
    }
    out.sort_by_key(|e| (e.set.clone(), e.key_text()));
    out.dedup_by(|a, b| a.set == b.set && a.key == b.key);
    out
}

/// One transaction adding the attachment's elements, tagged; in the usual case (table and exception chain
/// set up) nothing is read or deleted, so the cost does not depend on the number of pods. That transaction
/// goes over netlink ([`nftables::add_elements`]); the slower paths are `nft` text.
fn nft_setup(pod: &Attachment) -> Result<()> {
    let t = format!("inet {NFT_TABLE}");
    let wanted = nft_elements(pod);
    if nftables::add_elements(NFT_TABLE, &wanted) {
        return Ok(());
    }
    let adds = nftables::add_script(NFT_TABLE, &wanted);
    let mut script = nftables::Script::new();
    nft_base(&mut script, pod.ips, &plan(pod.ips, pod.non_masquerade));
    for line in adds.render().lines() {
        script.push(line);
    }
    if script.apply().is_ok() {
        return Ok(());
    }
    // An exception map entry with another verdict: this pod's from an ADD with other exceptions, or a
    // pod's whose DEL never came. The new one replaces it.
    let mut retry = nftables::Script::new();
    for present in nftables::table_elements(NFT_TABLE)?.unwrap_or_default() {
        let replaced =
            wanted.iter().any(|w| present.is_key_of(w) && w.value.is_some() && w.value_text() != present.value);
        if replaced {
            retry.push(format!("delete element {t} {} {{ {} }}", present.set, present.key));
        }
    }
    for line in script.render().lines() {
        retry.push(line);
    }
    retry.apply().map_err(|f| f.to_error(&format!("setting up ipMasq for {}", pod.container_id)))
}

/// Every element of the attachment is present, an exception map entry with the verdict of the configured
/// exceptions.
fn nft_check(pod: &Attachment) -> Result<()> {
    let problem = |what: String| Error::internal(format!("ipMasq of container {}: {what}", pod.container_id));
    let present =
        nftables::table_elements(NFT_TABLE)?.ok_or_else(|| problem(format!("table inet {NFT_TABLE} not found")))?;
    for element in nft_elements(pod) {
        match present.iter().find(|p| p.is_key_of(&element)) {
            None => return Err(problem(format!("{} not found in {}", element.render(false), element.set))),
            Some(p) if p.value != element.value_text() => {
                let found = p.value.as_deref().unwrap_or_default();
                let wanted = element.value_text().unwrap_or_default();
                return Err(problem(format!(
                    "{} maps {} to {found:?}, the config wants {wanted:?}",
                    element.set,
                    element.key_text()
                )));
            }
            Some(_) => {}
        }
    }
    Ok(())
}

/// With the IPs: one transaction deleting exactly the attachment's elements ("add" first makes it succeed
/// when they are gone), over netlink. Otherwise, or when the table is missing or an entry has another
/// verdict: the elements tagged for the attachment. Nothing runs when the table does not exist (a node that
/// never used this backend); when that cannot be asked over netlink, `nft` finds out.
fn nft_teardown(pod: &Attachment) -> Result<()> {
    if let Ok(false) = super::nfnl::table_exists("inet", NFT_TABLE) {
        return Ok(());
    }
    if !pod.ips.is_empty() && nftables::remove_elements(NFT_TABLE, &nft_elements(pod)) {
        return Ok(());
    }
    let tag = nft_tag(NFT_TAG_KIND, pod.network, pod.container_id);
    nftables::delete_tagged(NFT_TABLE, |comment| comment == tag)
}

fn nft_gc(network: &str, valid: &BTreeSet<&str>) -> Result<()> {
    nftables::gc_tagged(NFT_TABLE, NFT_TAG_KIND, network, valid)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nets(list: &[&str]) -> Vec<IpNet> {
        list.iter().map(|n| n.parse().unwrap()).collect()
    }

    fn rendered(plan: &Plan, comment: &str) -> Vec<String> {
        plan.iptables_chain_rules(comment).unwrap().iter().map(Rule::render).collect()
    }

    #[test]
    fn expected_families_of_ipam_configs() {
        let of = |v: serde_json::Value| expected_families(Some(&v));
        let host_local = serde_json::json!({"type": "host-local",
            "ranges": [[{"subnet": "10.244.1.0/24"}], [{"subnet": "fd00::/64"}, {"subnet": "fd01::/64"}]]});
        assert_eq!(of(host_local), [Family::V4, Family::V6]);
        assert_eq!(of(serde_json::json!({"type": "host-local", "Subnet": "fd00::/64"})), [Family::V6]);
        assert_eq!(of(serde_json::json!({"type": "static", "addresses": [{"address": "fd00::5/64"}]})), [Family::V6]);
        // Nothing named (dhcp, an IPAM of its own), or nothing parseable: IPv4.
        assert_eq!(of(serde_json::json!({"type": "dhcp"})), [Family::V4]);
        assert_eq!(of(serde_json::json!({"type": "host-local", "ranges": [[{"subnet": "nope"}]]})), [Family::V4]);
        assert_eq!(expected_families(None), [Family::V4]);
    }

    #[test]
    fn reference_rules() {
        let comment = owner_comment("kubenet", "abc");
        let ips = nets(&["10.22.0.5/24"]);
        let plans = plan(&ips, &[]);
        assert_eq!(plans.len(), 1);
        assert_eq!(
            rendered(&plans[0], &comment),
            vec![
                r#"-d 10.22.0.0/24 -m comment --comment "name: \"kubenet\" id: \"abc\"" -j ACCEPT"#,
                r#"! -d 224.0.0.0/4 -m comment --comment "name: \"kubenet\" id: \"abc\"" -j MASQUERADE"#,
            ]
        );
        let jump = iptables_jump(&ips[0], &comment, "CNI-x").unwrap().render();
        assert_eq!(jump, r#"-s 10.22.0.5/32 -m comment --comment "name: \"kubenet\" id: \"abc\"" -j CNI-x"#);
        let v6: IpNet = "fd00::5/64".parse().unwrap();
        assert!(iptables_jump(&v6, &comment, "CNI-x").unwrap().render().starts_with("-s fd00::5/128 "));
    }

    #[test]
    fn exceptions_go_before_the_masquerade_per_family() {
        let ips = nets(&["10.244.1.5/24", "fd00:10:244:1::5/64"]);
        let exceptions = nets(&["10.244.0.0/16", "fd00:10:244::/56", "10.244.1.0/24", "10.96.0.1/12", "10.244.0.0/16"]);
        let plans = plan(&ips, &exceptions);
        assert_eq!(plans.iter().map(|p| p.family).collect::<Vec<_>>(), vec![Family::V4, Family::V6]);
        // The own subnet once, duplicates and host bits dropped, the other family's entries not used.
        assert_eq!(plans[0].exceptions, nets(&["10.244.0.0/16", "10.96.0.0/12"]));
        assert_eq!(plans[1].exceptions, nets(&["fd00:10:244::/56"]));
        assert_eq!(
            rendered(&plans[0], "c"),
            vec![
                "-d 10.244.1.0/24 -m comment --comment c -j ACCEPT",
                "-d 10.244.0.0/16 -m comment --comment c -j ACCEPT",
                "-d 10.96.0.0/12 -m comment --comment c -j ACCEPT",
                "! -d 224.0.0.0/4 -m comment --comment c -j MASQUERADE",
            ]
        );
        assert_eq!(rendered(&plans[1], "c")[1], "-d fd00:10:244::/56 -m comment --comment c -j ACCEPT");
        let v4 = &plans[0];
        for (dst, masqueraded) in [
            ("10.244.2.7", false),
            ("10.244.1.9", false),
            ("10.100.0.1", false),
            ("8.8.8.8", true),
            ("239.1.1.1", false),
        ] {
            assert_eq!(v4.masquerades(dst.parse().unwrap()), masqueraded, "{dst}");
        }
        assert!(plans[1].masquerades("2001:db8::1".parse().unwrap()));
        assert!(!plans[1].masquerades("fd00:10:244:2::7".parse().unwrap()));
        // A node agent's view: a whole pod subnet as the source gives the same decision.
        let node = plan(&nets(&["10.244.1.0/24"]), &exceptions);
        assert_eq!(node[0].exceptions, v4.exceptions);
        assert_eq!(
            node[0].nft_masquerade_rule(),
            "meta nfproto ipv4 ip saddr { 10.244.1.0/24 } ip daddr != { 10.244.1.0/24, 10.244.0.0/16, 10.96.0.0/12, 224.0.0.0/4 } masquerade"
        );
    }

    #[test]
    fn nft_elements_of_an_attachment() {
        let ips = nets(&["10.244.1.5/24", "fd00:10:244:1::5/64"]);
        let exceptions = nets(&["10.244.0.0/16"]);
        let pod = Attachment { network: "kubenet", container_id: "abc", ips: &ips, non_masquerade: &exceptions };
        let rendered: Vec<String> =
            nft_elements(&pod).iter().map(|e| format!("{} {}", e.set, e.render(false))).collect();
        let chain = nft_exception_chain(&plan(&ips, &exceptions)[0]).unwrap();
        assert!(chain.starts_with("nomasq4-") && chain.len() == "nomasq4-".len() + 12, "{chain}");
        assert_eq!(
            rendered,
            vec![
                "local4_24 10.244.1.5 . 10.244.1.0".to_string(),
                "local6_64 fd00:10:244:1::5 . fd00:10:244:1::".to_string(),
                format!("nomasq4 10.244.1.5 : jump {chain}"),
                "nomasq6 fd00:10:244:1::5 : continue".to_string(),
                "pods4_24 10.244.1.5".to_string(),
                "pods6_64 fd00:10:244:1::5".to_string(),
            ]
        );
        // The chain is named by the exceptions, whatever their order.
        let (a, b) = (nets(&["10.96.0.0/12", "10.244.0.0/16"]), nets(&["10.244.0.0/16", "10.96.0.0/12"]));
        assert_eq!(nft_exception_chain(&plan(&ips, &a)[0]), nft_exception_chain(&plan(&ips, &b)[0]));
        assert_ne!(nft_exception_chain(&plan(&ips, &a)[0]), Some(chain));
    }

    #[test]
    fn bad_names_are_refused() {
        let ips = nets(&["10.22.0.5/24"]);
        let pod = |network, container_id| Attachment { network, container_id, ips: &ips, non_masquerade: &[] };
        assert!(setup(Backend::Iptables, &pod("bad\"net", "c")).is_err());
        assert!(check(Backend::Nftables, &pod("net", "c\n")).is_err());
        assert!(teardown(&pod("net", "c d")).is_err());
        assert!(gc("net/../x", &[]).is_err());
    }
}
