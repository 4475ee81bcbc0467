//! The plan: the agent's whole nftables state as data (sets with their elements, chains with their rules),
//! computed by [`crate::compile`] without a kernel and applied by [`crate::apply`].
//!
//! The layout (one table, `inet cni-netpol`, both families):
//!
//! - base chain `forward` (hook forward, priority filter, policy accept): established and related flows
//!   accepted; IPv6 neighbour discovery accepted; a pod address of this node that the agent has not judged
//!   yet (in `local4`/`local6` but not in `known4`/`known6`) dropped both ways; then a jump to `egress` for
//!   sources in `egress4`/`egress6` (pods some policy isolates for egress) and to `ingress` for destinations
//!   in `ingress4`/`ingress6`.
//! - `egress`: one rule per allowed (policy rule, peer, port) that returns to `forward`; the last rule drops.
//! - `ingress`: the same, accepting; the last rule drops.
//!
//! Every rule names its pods through sets, whose names come from a hash of what selects them (the same
//! selector in two policies is one set). The rules depend only on the policies, never on which pods exist,
//! so a pod coming, going or changing labels changes set elements only.
//!
//! [`Plan::judges`] evaluates the plan for one packet as the kernel would, so the tests can compute the
//! whole truth table of a plan without a kernel.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

pub use cnicore::ip::IpFamily as Family;

/// The agent's table (family inet).
pub const TABLE: &str = "cni-netpol";

pub const PROTO_TCP: u8 = 6;
pub const PROTO_UDP: u8 = 17;
pub const PROTO_SCTP: u8 = 132;
pub const PROTO_ICMPV6: u8 = 58;

/// What a set holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SetKind {
    /// Addresses (a hash set).
    Addr,
    /// Disjoint address ranges (an interval set): ipBlocks and the node's pod CIDRs.
    Ranges,
    /// `address . protocol . port`: named ports resolved per pod.
    AddrProtoPort,
}

/// One element of a set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Key {
    Addr(IpAddr),
    /// First and last address, inclusive.
    Range(IpAddr, IpAddr),
    AddrProtoPort(IpAddr, u8, u16),
}

/// A named set of the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Set {
    pub family: Family,
    pub kind: SetKind,
    pub elements: BTreeSet<Key>,
}

impl Set {
    pub fn new(family: Family, kind: SetKind) -> Set {
        Set { family, kind, elements: BTreeSet::new() }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Chain {
    Forward,
    Ingress,
    Egress,
}

impl Chain {
    pub const ALL: [Chain; 3] = [Chain::Forward, Chain::Ingress, Chain::Egress];

    pub fn name(self) -> &'static str {
        match self {
            Chain::Forward => "forward",
            Chain::Ingress => "ingress",
            Chain::Egress => "egress",
        }
    }
}

/// Which address of the packet a lookup reads: nf_tables' one enum, with its offsets.
pub use cnicore::firewall::nfnl::Field;

/// One match of a rule; all matches of a rule must hold.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Match {
    /// `ct state established,related`.
    Established,
    /// The address is (or, `negated`, is not) in the set.
    Lookup { field: Field, set: String, negated: bool },
    /// `meta l4proto`.
    Proto(u8),
    /// `meta l4proto` and the transport header's destination port in `first..=last`.
    Ports { proto: u8, first: u16, last: u16 },
    /// `daddr . l4proto . th dport` in the set: named ports resolved per destination pod.
    NamedPorts { set: String },
    /// ICMPv6 neighbour and router discovery (types 133 to 137).
    Ndisc,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Verdict {
    Accept,
    Drop,
    /// Back to the calling chain (an allowed egress goes on to the ingress check).
    Return,
    Jump(Chain),
    /// The packet to NFLOG (`limit ... log prefix "<isolation>" group N`), then on to the next rule: written
    /// before each drop, so a drop is logged at most at the limit's rate while every packet is still dropped.
    Log {
        isolation: Isolation,
        log: DropLog,
    },
}

/// Why a packet is dropped, as the NFLOG prefix of its drop's log rule names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Isolation {
    /// The destination pod is isolated for ingress and no rule of its policies admits the packet.
    Ingress,
    /// The source pod is isolated for egress and no rule of its policies lets the packet out.
    Egress,
    /// The destination is an address of this node's pod CIDRs that no pod the agent knows holds.
    UnknownDestination,
    /// The source is such an address.
    UnknownSource,
}

impl Isolation {
    pub const ALL: [Isolation; 4] =
        [Isolation::Ingress, Isolation::Egress, Isolation::UnknownDestination, Isolation::UnknownSource];

    /// The NFLOG prefix (at most 127 bytes; `cni-netpol:` so that another program's logs are told apart).
    pub fn prefix(self) -> &'static str {
        match self {
            Isolation::Ingress => "cni-netpol:ingress",
            Isolation::Egress => "cni-netpol:egress",
            Isolation::UnknownDestination => "cni-netpol:unknown-destination",
            Isolation::UnknownSource => "cni-netpol:unknown-source",
        }
    }

    pub fn from_prefix(prefix: &str) -> Option<Isolation> {
        Isolation::ALL.into_iter().find(|i| i.prefix() == prefix)
    }

    /// The direction whose policies drop the packet, as the drop log writes it.
    pub fn direction(self) -> &'static str {
        match self {
            Isolation::Ingress => "ingress",
            Isolation::Egress => "egress",
            Isolation::UnknownDestination => "unknown-destination",
            Isolation::UnknownSource => "unknown-source",
        }
    }
}

/// The drop log's NFLOG group and the kernel's rate limit of each drop rule's log (`limit rate <rate>/second
/// burst <burst> packets`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DropLog {
    pub group: u16,
    pub rate: u32,
    pub burst: u32,
}

/// Where the rules and the isolations come from, for `explain` and the drop log (never sent to the kernel).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Provenance {
    /// Per chain, per rule (by index): the policy rules it is written for, e.g. `policy x/allow-y ingress
    /// rule 0` (one kernel rule serves identical rules of several policies).
    pub rules: BTreeMap<Chain, Vec<Vec<String>>>,
    /// Per direction (`Chain::Ingress`, `Chain::Egress`) and pod address: the policies isolating it.
    pub isolating: BTreeMap<(Chain, IpAddr), BTreeSet<String>>,
}

impl Provenance {
    /// The policy rules a rule of `chain` is written for (none for the chains' own rules).
    pub fn of_rule(&self, chain: Chain, index: usize) -> &[String] {
        self.rules.get(&chain).and_then(|rules| rules.get(index)).map(Vec::as_slice).unwrap_or_default()
    }

    /// The policies isolating `addr` in the direction of `chain`.
    pub fn isolating(&self, chain: Chain, addr: IpAddr) -> Vec<String> {
        self.isolating.get(&(chain, addr)).map(|p| p.iter().cloned().collect()).unwrap_or_default()
    }
}

/// One rule: of one family (`meta nfproto`) or of both.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Rule {
    pub family: Option<Family>,
    pub matches: Vec<Match>,
    pub verdict: Verdict,
}

/// The table as data.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    pub sets: BTreeMap<String, Set>,
    pub chains: BTreeMap<Chain, Vec<Rule>>,
    /// What could not be expressed (and so denies) or matches nothing, for the log.
    pub warnings: BTreeSet<String>,
    pub provenance: Provenance,
}

/// A packet as [`Plan::judges`] sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub proto: u8,
    pub dport: u16,
    /// Part of a flow conntrack knows (a reply, or a packet after the first).
    pub established: bool,
    /// For ICMPv6: the type.
    pub icmp_type: u8,
}

impl Packet {
    pub fn new(src: IpAddr, dst: IpAddr, proto: u8, dport: u16) -> Packet {
        Packet { src, dst, proto, dport, established: false, icmp_type: 0 }
    }
}

impl Plan {
    /// The rules of `chain`.
    pub fn rules(&self, chain: Chain) -> &[Rule] {
        self.chains.get(&chain).map(Vec::as_slice).unwrap_or_default()
    }

    /// The plan's rules without their sets' elements: when two plans have the same shape, going from one to
    /// the other changes elements only.
    pub fn same_shape(&self, other: &Plan) -> bool {
        self.chains == other.chains
            && self.sets.len() == other.sets.len()
            && self.sets.iter().zip(&other.sets).all(|((name, set), (other_name, other_set))| {
                name == other_name
                    && set.family == other_set.family
                    && set.kind == other_set.kind
                    // Interval sets are changed by replacing the table (their elements are ranges, and
                    // they change only with the policies).
                    && (set.kind != SetKind::Ranges || set.elements == other_set.elements)
            })
    }

    /// Number of rules and of set elements.
    pub fn size(&self) -> (usize, usize) {
        let rules = self.chains.values().map(Vec::len).sum();
        let elements = self.sets.values().map(|s| s.elements.len()).sum();
        (rules, elements)
    }

    /// True when the kernel, holding this plan, lets `packet` through the forward hook.
    pub fn judges(&self, packet: &Packet) -> bool {
        self.trace(packet).0
    }

    /// [`Plan::judges`], with the rules that decided it in the order the kernel met them (a jump, then the
    /// rule of the jumped-to chain that ended or returned; log rules left out). No rule last: the base
    /// chain's policy, accept.
    pub fn trace(&self, packet: &Packet) -> (bool, Vec<(Chain, usize)>) {
        let mut path = Vec::new();
        // Returning from the base chain: its policy, accept.
        let accepted = self.run(Chain::Forward, packet, 0, &mut path).unwrap_or(true);
        (accepted, path)
    }

    /// A chain's outcome: `Some(accepted)` when a rule ends the evaluation, `None` when it returns.
    fn run(&self, chain: Chain, packet: &Packet, depth: usize, path: &mut Vec<(Chain, usize)>) -> Option<bool> {
        assert!(depth < 4, "jump loop");
        for (index, rule) in self.rules(chain).iter().enumerate() {
            if matches!(rule.verdict, Verdict::Log { .. }) || !self.rule_matches(rule, packet) {
                continue;
            }
            path.push((chain, index));
            match &rule.verdict {
                Verdict::Accept => return Some(true),
                Verdict::Drop => return Some(false),
                Verdict::Return => return None,
                Verdict::Jump(target) => {
                    if let Some(end) = self.run(*target, packet, depth + 1, path) {
                        return Some(end);
                    }
                }
                Verdict::Log { .. } => unreachable!("skipped above"),
            }
        }
        None
    }

    fn rule_matches(&self, rule: &Rule, packet: &Packet) -> bool {
        if rule.family.is_some_and(|family| family != Family::of(packet.dst)) {
            return false;
        }
        rule.matches.iter().all(|m| self.holds(m, packet))
    }

    fn holds(&self, m: &Match, packet: &Packet) -> bool {
        let has_ports = matches!(packet.proto, PROTO_TCP | PROTO_UDP | PROTO_SCTP);
        match m {
            Match::Established => packet.established,
            Match::Lookup { field, set, negated } => {
                let addr = match field {
                    Field::Saddr => packet.src,
                    Field::Daddr => packet.dst,
                };
                self.contains(set, Key::Addr(addr)) != *negated
            }
            Match::Proto(proto) => packet.proto == *proto,
            Match::Ports { proto, first, last } => {
                packet.proto == *proto && has_ports && (*first..=*last).contains(&packet.dport)
            }
            Match::NamedPorts { set } => {
                has_ports && self.contains(set, Key::AddrProtoPort(packet.dst, packet.proto, packet.dport))
            }
            Match::Ndisc => packet.proto == PROTO_ICMPV6 && (133..=137).contains(&packet.icmp_type),
        }
    }

    /// Set membership as the kernel decides it (a missing set would be refused by the kernel: a bug).
    fn contains(&self, name: &str, key: Key) -> bool {
        let set = self.sets.get(name).unwrap_or_else(|| panic!("rule names a missing set {name}"));
        match (set.kind, key) {
            (SetKind::Ranges, Key::Addr(addr)) => set.elements.iter().any(|element| match element {
                Key::Range(first, last) => Family::of(*first) == Family::of(addr) && *first <= addr && addr <= *last,
                _ => false,
            }),
            _ => set.elements.contains(&key),
        }
    }
}
