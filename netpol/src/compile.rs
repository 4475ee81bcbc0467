//! The policy compiler: a view of the cluster ([`Cluster`]) in, the table as data ([`Plan`]) out. Pure: no
//! kernel, no clock, no I/O; the same input gives the same plan.
//!
//! Semantics (`networking.k8s.io/v1`): a pod selected by no policy of a direction is open in that direction;
//! a pod selected by some is isolated, and a flow passes when any rule of any policy selecting it allows it
//! (rules add up, in both directions independently: egress at the source, ingress at the destination).
//! `policyTypes` absent (or empty) means `Ingress`, plus `Egress` when the policy has egress rules. A rule
//! without peers allows every peer, without ports every port. A named port is resolved on the destination
//! pod (the selected pod for ingress, the peer for egress) from its containers' ports.
//!
//! Failing closed: what cannot be expressed (a protocol other than TCP, UDP and SCTP, an unknown selector
//! operator, a malformed ipBlock, an `endPort` with a named port, ...) is left out of the rule and a warning
//! recorded; when nothing of a rule's peers (or ports) is left, the rule allows nothing (it never becomes a
//! rule for every peer or port). A policy whose `podSelector` or `policyTypes` cannot be understood isolates
//! every pod of its namespace in both directions and allows nothing.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;

use cnicore::firewall::hex_sha512;
use ipnet::IpNet;
use serde_json::{json, Value};

use crate::model::{BadSelector, Cluster, LabelSelector, NetworkPolicy, Peer, Pod, PolicyPort};
use crate::plan::{
    Chain, DropLog, Family, Field, Isolation, Key, Match, Plan, Rule, Set, SetKind, Verdict, PROTO_SCTP, PROTO_TCP,
    PROTO_UDP,
};
use crate::ranges;

/// Why part of a policy cannot be expressed (it is left out, and denies).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unexpressible(pub String);

impl Unexpressible {
    fn new(why: &str) -> Unexpressible {
        Unexpressible(why.to_string())
    }
}

impl From<BadSelector> for Unexpressible {
    fn from(bad: BadSelector) -> Unexpressible {
        Unexpressible(bad.0)
    }
}

impl std::fmt::Display for Unexpressible {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// What the compiler knows of the node it runs on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeOptions {
    /// This node's pod CIDRs: an address there that no known pod has is dropped until the agent knows it.
    pub pod_cidrs: Vec<IpNet>,
    /// Each drop logged to NFLOG before it, rate-limited (`None`: drops only).
    pub drop_log: Option<DropLog>,
}

/// Compiles the whole cluster view into the plan of this node.
pub fn compile(cluster: &Cluster, node: &NodeOptions) -> Plan {
    let mut compiler = Compiler::new(cluster);
    let mut policies: Vec<&NetworkPolicy> = cluster.policies.iter().collect();
    policies.sort_by(|a, b| (&a.metadata.namespace, &a.metadata.name).cmp(&(&b.metadata.namespace, &b.metadata.name)));
    for policy in policies {
        compiler.policy(policy);
    }
    compiler.finish(node)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    Ingress,
    Egress,
}

impl Direction {
    /// The address of the selected pod and the peer's.
    fn fields(self) -> (Field, Field) {
        match self {
            Direction::Ingress => (Field::Daddr, Field::Saddr),
            Direction::Egress => (Field::Saddr, Field::Daddr),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Direction::Ingress => "ingress",
            Direction::Egress => "egress",
        }
    }
}

/// A pod that takes part in policy, with its parsed addresses.
struct PodView<'a> {
    pod: &'a Pod,
    ips: Vec<IpAddr>,
}

impl PodView<'_> {
    fn namespace(&self) -> &str {
        &self.pod.metadata.namespace
    }
}

/// One name per family.
type PerFamily = [String; 2];

fn index(family: Family) -> usize {
    match family {
        Family::V4 => 0,
        Family::V6 => 1,
    }
}

fn digit(family: Family) -> &'static str {
    match family {
        Family::V4 => "4",
        Family::V6 => "6",
    }
}

/// `<prefix><4|6>-<12 hex>`: a set's name from what selects its elements.
fn set_name(prefix: &str, family: Family, canonical: &str) -> String {
    format!("{prefix}{}-{}", digit(family), &hex_sha512(canonical)[..12])
}

/// The rules of a policy chain, each once, with the policy rules each is written for.
#[derive(Default)]
struct ChainRules {
    rules: Vec<Rule>,
    index: HashMap<Rule, usize>,
    origins: Vec<Vec<String>>,
}

struct Compiler<'a> {
    namespaces: BTreeMap<&'a str, &'a BTreeMap<String, String>>,
    pods: Vec<PodView<'a>>,
    /// The pods of each namespace (indices into `pods`).
    by_namespace: BTreeMap<&'a str, Vec<usize>>,
    plan: Plan,
    rules: BTreeMap<Chain, ChainRules>,
    /// Pods isolated per direction and family (their addresses).
    isolated: BTreeMap<(Chain, Family), BTreeSet<Key>>,
}

impl<'a> Compiler<'a> {
    fn new(cluster: &'a Cluster) -> Compiler<'a> {
        let namespaces = cluster.namespaces.iter().map(|n| (n.metadata.name.as_str(), &n.metadata.labels)).collect();
        let mut plan = Plan::default();
        let mut pods = Vec::new();
        for pod in cluster.pods.iter().filter(|p| p.is_policy_pod()) {
            let mut ips = Vec::new();
            for text in &pod.status.pod_ips {
                match text.ip.parse::<IpAddr>() {
                    Ok(ip) => ips.push(ip),
                    Err(_) => {
                        plan.warnings.insert(format!("pod {}: podIP {:?} is not an address", pod_id(pod), text.ip));
                    }
                }
            }
            pods.push(PodView { pod, ips });
        }
        let mut by_namespace: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
        for (i, view) in pods.iter().enumerate() {
            by_namespace.entry(view.pod.metadata.namespace.as_str()).or_default().push(i);
        }
        Compiler { namespaces, pods, by_namespace, plan, rules: BTreeMap::new(), isolated: BTreeMap::new() }
    }

    fn warn(&mut self, policy: &NetworkPolicy, what: String) {
        self.plan.warnings.insert(format!("policy {}: {what}", policy.id()));
    }

    fn namespace_labels(&self, name: &str) -> &BTreeMap<String, String> {
        static NONE: BTreeMap<String, String> = BTreeMap::new();
        self.namespaces.get(name).copied().unwrap_or(&NONE)
    }

    /// The pods of `namespaces` that `selector` matches.
    fn select_in<'n>(
        &self,
        namespaces: impl IntoIterator<Item = &'n str>,
        selector: &LabelSelector,
    ) -> Result<Vec<usize>, Unexpressible> {
        let mut out = Vec::new();
        for namespace in namespaces {
            for &i in self.by_namespace.get(namespace).map(Vec::as_slice).unwrap_or_default() {
                if selector.matches(&self.pods[i].pod.metadata.labels)? {
                    out.push(i);
                }
            }
        }
        out.sort_unstable();
        Ok(out)
    }

    fn policy(&mut self, policy: &NetworkPolicy) {
        let namespace = policy.metadata.namespace.as_str();
        let selector = &policy.spec.pod_selector;
        let in_namespace = |p: &PodView| p.namespace() == namespace;
        let selected = self.select_in([namespace], selector);
        let types = policy_types(policy);
        let (subject, usable) = match (&selected, &types) {
            (Ok(subject), Ok(_)) => (subject.clone(), true),
            (Err(why), _) | (_, Err(why)) => {
                self.warn(policy, format!("{why}: every pod of its namespace is isolated and nothing allowed"));
                let all = (0..self.pods.len()).filter(|&i| in_namespace(&self.pods[i])).collect();
                (all, false)
            }
        };
        if usable && subject.is_empty() {
            self.warn(policy, "selects no pod".to_string());
        }
        let (ingress, egress) = if usable { types.unwrap_or((true, true)) } else { (true, true) };
        let canonical = json!(["subject", namespace, selector]).to_string();
        let subject_sets = self.pod_set("sel", &canonical, &subject);
        for (on, chain) in [(ingress, Chain::Ingress), (egress, Chain::Egress)] {
            if on {
                self.isolate(chain, &subject, policy);
            }
        }
        if !usable {
            return;
        }
        if ingress {
            for (i, rule) in policy.spec.ingress.iter().flatten().enumerate() {
                let context = RuleContext { policy, direction: Direction::Ingress, index: i, subject: &subject };
                self.rule(&context, &subject_sets, &canonical, rule.from.as_deref(), rule.ports.as_deref());
            }
        }
        if egress {
            for (i, rule) in policy.spec.egress.iter().flatten().enumerate() {
                let context = RuleContext { policy, direction: Direction::Egress, index: i, subject: &subject };
                self.rule(&context, &subject_sets, &canonical, rule.to.as_deref(), rule.ports.as_deref());
            }
        }
    }

    fn isolate(&mut self, chain: Chain, pods: &[usize], policy: &NetworkPolicy) {
        for &i in pods {
            for ip in &self.pods[i].ips {
                self.isolated.entry((chain, Family::of(*ip))).or_default().insert(Key::Addr(*ip));
                self.plan.provenance.isolating.entry((chain, *ip)).or_default().insert(policy.id());
            }
        }
    }

    /// The address sets (one per family) of `members`, named from `canonical`.
    fn pod_set(&mut self, prefix: &str, canonical: &str, members: &[usize]) -> PerFamily {
        let names = Family::ALL.map(|family| set_name(prefix, family, canonical));
        for family in Family::ALL {
            let name = &names[index(family)];
            if self.plan.sets.contains_key(name) {
                continue;
            }
            let mut set = Set::new(family, SetKind::Addr);
            for &i in members {
                let ips = self.pods[i].ips.iter().filter(|ip| Family::of(**ip) == family);
                set.elements.extend(ips.map(|ip| Key::Addr(*ip)));
            }
            self.plan.sets.insert(name.clone(), set);
        }
        names
    }

    /// The rules of one ingress or egress rule of a policy.
    fn rule(
        &mut self,
        context: &RuleContext,
        subject_sets: &PerFamily,
        subject_canonical: &str,
        peers: Option<&[Peer]>,
        ports: Option<&[PolicyPort]>,
    ) {
        let peers = match peers {
            None | Some([]) => None,
            Some(list) => match self.peers(context, list) {
                Some(matches) => Some(matches),
                None => return,
            },
        };
        let ports = match ports {
            None | Some([]) => None,
            Some(list) => match self.ports(context, subject_canonical, list) {
                Some(matches) => Some(matches),
                None => return,
            },
        };
        let (subject_field, _) = context.direction.fields();
        let (chain, verdict) = match context.direction {
            Direction::Ingress => (Chain::Ingress, Verdict::Accept),
            Direction::Egress => (Chain::Egress, Verdict::Return),
        };
        for family in Family::ALL {
            let of_family = |list: &Option<Vec<(Option<Family>, Match)>>| -> Vec<Option<Match>> {
                match list {
                    None => vec![None],
                    Some(list) => list
                        .iter()
                        .filter(|(f, _)| f.is_none_or(|f| f == family))
                        .map(|(_, m)| Some(m.clone()))
                        .collect(),
                }
            };
            let subject =
                Match::Lookup { field: subject_field, set: subject_sets[index(family)].clone(), negated: false };
            for peer in of_family(&peers) {
                for port in of_family(&ports) {
                    let mut matches = vec![subject.clone()];
                    matches.extend(peer.clone());
                    matches.extend(port);
                    let origin = format!("policy {} {}", context.policy.id(), context.name());
                    self.push(chain, Rule { family: Some(family), matches, verdict: verdict.clone() }, origin);
                }
            }
        }
    }

    fn push(&mut self, chain: Chain, rule: Rule, origin: String) {
        let chain = self.rules.entry(chain).or_default();
        let next = chain.rules.len();
        let index = *chain.index.entry(rule.clone()).or_insert(next);
        if index == next {
            chain.rules.push(rule);
            chain.origins.push(Vec::new());
        }
        if !chain.origins[index].contains(&origin) {
            chain.origins[index].push(origin);
        }
    }

    /// The peer matches of a rule; `None` when no peer could be expressed (the rule allows nothing).
    fn peers(&mut self, context: &RuleContext, peers: &[Peer]) -> Option<Vec<(Option<Family>, Match)>> {
        let mut out = Vec::new();
        for (i, peer) in peers.iter().enumerate() {
            match self.peer(context, peer) {
                Ok(matches) => out.extend(matches),
                Err(why) => {
                    self.warn(context.policy, format!("{} peer {i}: {why}: left out", context.name()));
                }
            }
        }
        if out.is_empty() {
            self.warn(context.policy, format!("{}: no peer can be expressed: it allows nothing", context.name()));
            return None;
        }
        Some(out)
    }

    fn peer(&mut self, context: &RuleContext, peer: &Peer) -> Result<Vec<(Option<Family>, Match)>, Unexpressible> {
        let (_, field) = context.direction.fields();
        if let Some(block) = &peer.ip_block {
            if peer.pod_selector.is_some() || peer.namespace_selector.is_some() {
                return Err(Unexpressible::new("ipBlock beside a selector"));
            }
            let (family, name) = self.ip_block(&block.cidr, block.except.as_deref().unwrap_or_default())?;
            return Ok(vec![(Some(family), Match::Lookup { field, set: name, negated: false })]);
        }
        let namespace = context.policy.metadata.namespace.as_str();
        let everything = LabelSelector::default();
        let pods = peer.pod_selector.as_ref().unwrap_or(&everything);
        if peer.namespace_selector.is_none() && peer.pod_selector.is_none() {
            return Err(Unexpressible::new("empty peer"));
        }
        let scope = match &peer.namespace_selector {
            None => json!(namespace),
            Some(selector) => json!(selector),
        };
        let canonical = json!(["peer", scope, pods]).to_string();
        let names = Family::ALL.map(|family| set_name("peer", family, &canonical));
        if names.iter().all(|name| self.plan.sets.contains_key(name)) {
            return Ok(Family::ALL
                .iter()
                .map(|&f| (Some(f), Match::Lookup { field, set: names[index(f)].clone(), negated: false }))
                .collect());
        }
        let members = match &peer.namespace_selector {
            None => self.select_in([namespace], pods)?,
            Some(selector) => {
                let mut chosen = Vec::new();
                for name in self.by_namespace.keys() {
                    if selector.matches(self.namespace_labels(name))? {
                        chosen.push(*name);
                    }
                }
                self.select_in(chosen, pods)?
            }
        };
        let names = self.pod_set("peer", &canonical, &members);
        Ok(Family::ALL
            .iter()
            .map(|&f| (Some(f), Match::Lookup { field, set: names[index(f)].clone(), negated: false }))
            .collect())
    }

    /// The interval set of an ipBlock: its CIDR without its exceptions.
    fn ip_block(&mut self, cidr: &str, except: &[String]) -> Result<(Family, String), Unexpressible> {
        let net: IpNet = cidr.parse().map_err(|_| Unexpressible(format!("ipBlock cidr {cidr:?} is not a CIDR")))?;
        let net = net.trunc();
        let mut holes = Vec::new();
        for text in except {
            let hole: IpNet =
                text.parse().map_err(|_| Unexpressible(format!("ipBlock except {text:?} is not a CIDR")))?;
            if !net.contains(&hole) || hole.prefix_len() <= net.prefix_len() {
                return Err(Unexpressible(format!("ipBlock except {text:?} is not strictly inside {cidr}")));
            }
            holes.push(hole.trunc());
        }
        holes.sort();
        let family = Family::of_net(&net);
        let canonical = format!("{net} except {holes:?}");
        let name = set_name("net", family, &canonical);
        let mut set = Set::new(family, SetKind::Ranges);
        set.elements = ranges::subtract(&net, &holes).into_iter().map(|(a, b)| Key::Range(a, b)).collect();
        self.plan.sets.insert(name.clone(), set);
        Ok((family, name))
    }

    /// The port matches of a rule; `None` when no port could be expressed (the rule allows nothing).
    fn ports(
        &mut self,
        context: &RuleContext,
        subject_canonical: &str,
        ports: &[PolicyPort],
    ) -> Option<Vec<(Option<Family>, Match)>> {
        let mut out = Vec::new();
        let mut named = BTreeSet::new();
        for (i, port) in ports.iter().enumerate() {
            match port_match(port) {
                Ok(PortSpec::Match(m)) => out.push((None, m)),
                Ok(PortSpec::Named(proto, name)) => {
                    named.insert((proto, name));
                }
                Err(why) => self.warn(context.policy, format!("{} port {i}: {why}: left out", context.name())),
            }
        }
        if !named.is_empty() {
            out.extend(self.named_ports(context, subject_canonical, &named));
        }
        if out.is_empty() {
            self.warn(context.policy, format!("{}: no port can be expressed: it allows nothing", context.name()));
            return None;
        }
        Some(out)
    }

    /// The `address . protocol . port` sets of named ports, resolved on the pods that can be the
    /// destination: the selected pods for ingress, every pod for egress.
    fn named_ports(
        &mut self,
        context: &RuleContext,
        subject_canonical: &str,
        named: &BTreeSet<(u8, String)>,
    ) -> Vec<(Option<Family>, Match)> {
        let members: Vec<usize> = match context.direction {
            Direction::Ingress => context.subject.to_vec(),
            Direction::Egress => (0..self.pods.len()).collect(),
        };
        let owner = match context.direction {
            Direction::Ingress => subject_canonical,
            Direction::Egress => "every pod",
        };
        let canonical = json!(["named", owner, named]).to_string();
        let names = Family::ALL.map(|family| set_name("named", family, &canonical));
        if names.iter().all(|name| self.plan.sets.contains_key(name)) {
            return Family::ALL
                .iter()
                .map(|&f| (Some(f), Match::NamedPorts { set: names[index(f)].clone() }))
                .collect();
        }
        let mut declared = BTreeSet::new();
        let mut out = Vec::new();
        for family in Family::ALL {
            let name = set_name("named", family, &canonical);
            let mut set = Set::new(family, SetKind::AddrProtoPort);
            for &i in &members {
                let pod = &self.pods[i];
                for (proto, port) in resolve(pod.pod, named) {
                    declared.insert(port.0.clone());
                    let ips = pod.ips.iter().filter(|ip| Family::of(**ip) == family);
                    set.elements.extend(ips.map(|ip| Key::AddrProtoPort(*ip, proto, port.1)));
                }
            }
            self.plan.sets.insert(name.clone(), set);
            out.push((Some(family), Match::NamedPorts { set: name }));
        }
        for (_, port) in named.iter().filter(|(_, n)| !declared.contains(n)) {
            let what = format!(
                "{}: named port {port:?} is declared by no pod it could reach: it matches nothing",
                context.name()
            );
            self.warn(context.policy, what);
        }
        out
    }

    fn finish(mut self, node: &NodeOptions) -> Plan {
        for family in Family::ALL {
            let d = digit(family);
            let mut known = Set::new(family, SetKind::Addr);
            let ips = self.pods.iter().flat_map(|p| &p.ips).filter(|ip| Family::of(**ip) == family);
            known.elements.extend(ips.map(|ip| Key::Addr(*ip)));
            self.plan.sets.insert(format!("known{d}"), known);
            let mut local = Set::new(family, SetKind::Ranges);
            for net in node.pod_cidrs.iter().filter(|n| Family::of_net(n) == family) {
                local.elements.extend(ranges::subtract(&net.trunc(), &[]).into_iter().map(|(a, b)| Key::Range(a, b)));
            }
            self.plan.sets.insert(format!("local{d}"), local);
            for (chain, prefix) in [(Chain::Ingress, "ingress"), (Chain::Egress, "egress")] {
                let mut set = Set::new(family, SetKind::Addr);
                set.elements = self.isolated.remove(&(chain, family)).unwrap_or_default();
                self.plan.sets.insert(format!("{prefix}{d}"), set);
            }
        }
        self.plan.chains.insert(Chain::Forward, forward_rules(node.drop_log));
        for (chain, isolation) in [(Chain::Ingress, Isolation::Ingress), (Chain::Egress, Isolation::Egress)] {
            let ChainRules { mut rules, origins, .. } = self.rules.remove(&chain).unwrap_or_default();
            rules.extend(dropping(None, Vec::new(), isolation, node.drop_log));
            self.plan.chains.insert(chain, rules);
            self.plan.provenance.rules.insert(chain, origins);
        }
        self.plan
    }
}

/// A drop, after its log rule when drops are logged.
fn dropping(family: Option<Family>, matches: Vec<Match>, isolation: Isolation, log: Option<DropLog>) -> Vec<Rule> {
    let drop = Rule { family, matches, verdict: Verdict::Drop };
    match log {
        Some(log) => vec![Rule { verdict: Verdict::Log { isolation, log }, ..drop.clone() }, drop],
        None => vec![drop],
    }
}

/// The base chain: the same for every plan of one node.
fn forward_rules(log: Option<DropLog>) -> Vec<Rule> {
    let lookup = |field, set: String, negated| Match::Lookup { field, set, negated };
    let mut rules = vec![
        Rule { family: None, matches: vec![Match::Established], verdict: Verdict::Accept },
        Rule { family: Some(Family::V6), matches: vec![Match::Ndisc], verdict: Verdict::Accept },
    ];
    for family in Family::ALL {
        let d = digit(family);
        for (field, isolation) in
            [(Field::Daddr, Isolation::UnknownDestination), (Field::Saddr, Isolation::UnknownSource)]
        {
            let matches = vec![lookup(field, format!("local{d}"), false), lookup(field, format!("known{d}"), true)];
            rules.extend(dropping(Some(family), matches, isolation, log));
        }
    }
    for (field, prefix, chain) in [(Field::Saddr, "egress", Chain::Egress), (Field::Daddr, "ingress", Chain::Ingress)] {
        for family in Family::ALL {
            let matches = vec![lookup(field, format!("{prefix}{}", digit(family)), false)];
            rules.push(Rule { family: Some(family), matches, verdict: Verdict::Jump(chain) });
        }
    }
    rules
}

/// Where a rule comes from, for its warnings and named ports.
struct RuleContext<'a> {
    policy: &'a NetworkPolicy,
    direction: Direction,
    index: usize,
    subject: &'a [usize],
}

impl RuleContext<'_> {
    fn name(&self) -> String {
        format!("{} rule {}", self.direction.name(), self.index)
    }
}

enum PortSpec {
    Match(Match),
    Named(u8, String),
}

/// One entry of `ports`: a protocol, a number or range, or a name to resolve per pod.
fn port_match(port: &PolicyPort) -> Result<PortSpec, Unexpressible> {
    let proto = protocol(port.protocol.as_deref())?;
    match (&port.port, port.end_port) {
        (None, None) => Ok(PortSpec::Match(Match::Proto(proto))),
        (None, Some(_)) => Err(Unexpressible::new("endPort without port")),
        (Some(Value::Number(n)), end) => {
            let first = n
                .as_u64()
                .filter(|p| (1..=65535).contains(p))
                .ok_or_else(|| Unexpressible(format!("port {n} out of range")))?;
            let last = end.map_or(Ok(first), |e| {
                u64::try_from(e).map_err(|_| Unexpressible(format!("endPort {e} out of range")))
            })?;
            if last < first || last > 65535 {
                return Err(Unexpressible(format!("endPort {last} is not between port {first} and 65535")));
            }
            Ok(PortSpec::Match(Match::Ports { proto, first: first as u16, last: last as u16 }))
        }
        (Some(Value::String(name)), None) => {
            let valid = !name.is_empty()
                && name.len() <= 15
                && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && name.bytes().any(|b| b.is_ascii_lowercase());
            if !valid {
                return Err(Unexpressible(format!("port name {name:?} is not a valid port name")));
            }
            Ok(PortSpec::Named(proto, name.clone()))
        }
        (Some(Value::String(name)), Some(_)) => Err(Unexpressible(format!("endPort with the named port {name:?}"))),
        (Some(other), _) => Err(Unexpressible(format!("port {other} is neither a number nor a name"))),
    }
}

/// The protocol number of a policy port (TCP when absent).
fn protocol(name: Option<&str>) -> Result<u8, Unexpressible> {
    match name.unwrap_or("TCP") {
        "TCP" => Ok(PROTO_TCP),
        "UDP" => Ok(PROTO_UDP),
        "SCTP" => Ok(PROTO_SCTP),
        other => Err(Unexpressible(format!("protocol {other:?} is not TCP, UDP or SCTP"))),
    }
}

/// The container ports of `pod` that the named entries name: (protocol, (name, number)).
fn resolve(pod: &Pod, named: &BTreeSet<(u8, String)>) -> Vec<(u8, (String, u16))> {
    let mut out = Vec::new();
    for port in pod.spec.containers.iter().flat_map(|c| &c.ports) {
        let (Some(name), Ok(number)) = (&port.name, u16::try_from(port.container_port)) else { continue };
        let Ok(proto) = protocol(port.protocol.as_deref()) else { continue };
        if number != 0 && named.contains(&(proto, name.clone())) {
            out.push((proto, (name.clone(), number)));
        }
    }
    out
}

/// `policyTypes` as (ingress, egress), with the API's default.
fn policy_types(policy: &NetworkPolicy) -> Result<(bool, bool), Unexpressible> {
    let spec = &policy.spec;
    match spec.policy_types.as_deref() {
        None | Some([]) => Ok((true, spec.egress.as_ref().is_some_and(|e| !e.is_empty()))),
        Some(types) => {
            let (mut ingress, mut egress) = (false, false);
            for kind in types {
                match kind.as_str() {
                    "Ingress" => ingress = true,
                    "Egress" => egress = true,
                    other => return Err(Unexpressible(format!("policyType {other:?} is neither Ingress nor Egress"))),
                }
            }
            Ok((ingress, egress))
        }
    }
}

fn pod_id(pod: &Pod) -> String {
    format!("{}/{}", pod.metadata.namespace, pod.metadata.name)
}

#[cfg(test)]
#[path = "compile_tests.rs"]
pub(crate) mod tests;
