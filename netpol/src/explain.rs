//! `cni-netpol explain FROM TO PORT/PROTO`: the plan evaluated for one flow ([`Plan::trace`], the kernel's
//! order), and what decided it named: the policy rules that allow it, or the isolation that drops it and the
//! policies behind it. FROM and TO are pods (`namespace/name`) or addresses; a pod's flow is judged in each
//! family where both ends have an address.

use std::fmt;
use std::net::IpAddr;

use crate::compile::{compile, NodeOptions};
use crate::model::Cluster;
use crate::plan::{Chain, Family, Isolation, Match, Packet, Plan, Verdict, PROTO_SCTP, PROTO_TCP, PROTO_UDP};

/// One end of a flow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    Pod { namespace: String, name: String },
    Addr(IpAddr),
}

impl Endpoint {
    /// `namespace/name` or an address.
    pub fn parse(text: &str) -> Result<Endpoint, ExplainError> {
        if let Ok(ip) = text.parse() {
            return Ok(Endpoint::Addr(ip));
        }
        match text.split_once('/') {
            Some((namespace, name)) if !namespace.is_empty() && !name.is_empty() && !name.contains('/') => {
                Ok(Endpoint::Pod { namespace: namespace.to_string(), name: name.to_string() })
            }
            _ => Err(ExplainError::Endpoint(text.to_string())),
        }
    }

    /// Its addresses in the cluster view.
    fn addresses(&self, cluster: &Cluster) -> Result<Vec<IpAddr>, ExplainError> {
        match self {
            Endpoint::Addr(ip) => Ok(vec![*ip]),
            Endpoint::Pod { namespace, name } => {
                let pod = cluster
                    .pods
                    .iter()
                    .find(|p| &p.metadata.namespace == namespace && &p.metadata.name == name)
                    .ok_or_else(|| ExplainError::NoSuchPod { namespace: namespace.clone(), name: name.clone() })?;
                Ok(pod.status.pod_ips.iter().filter_map(|i| i.ip.parse().ok()).collect())
            }
        }
    }
}

/// `PORT/PROTO` (`80/tcp`, `53/UDP`, `9000/sctp`).
pub fn parse_port(text: &str) -> Result<(u16, u8), ExplainError> {
    let bad = || ExplainError::Port(text.to_string());
    let (port, proto) = text.split_once('/').ok_or_else(bad)?;
    let port = port.parse::<u16>().ok().filter(|p| *p > 0).ok_or_else(bad)?;
    let proto = match proto.to_ascii_lowercase().as_str() {
        "tcp" => PROTO_TCP,
        "udp" => PROTO_UDP,
        "sctp" => PROTO_SCTP,
        _ => return Err(bad()),
    };
    Ok((port, proto))
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExplainError {
    Endpoint(String),
    /// A pod (namespace, name) the view does not hold.
    NoSuchPod {
        namespace: String,
        name: String,
    },
    Port(String),
    /// The two ends have no address of one family.
    NoCommonFamily,
}

impl fmt::Display for ExplainError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExplainError::Endpoint(text) => write!(f, "{text:?} is neither a pod (namespace/name) nor an address"),
            ExplainError::NoSuchPod { namespace, name } => write!(f, "no pod {namespace}/{name} in the agent's view"),
            ExplainError::Port(text) => write!(f, "{text:?} is not PORT/PROTO (80/tcp, 53/udp, 9000/sctp)"),
            ExplainError::NoCommonFamily => f.write_str("the two ends have no address of one family"),
        }
    }
}

impl std::error::Error for ExplainError {}

/// The plan's judgement of one packet, with what decided it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Judgement {
    pub packet: Packet,
    pub allowed: bool,
    /// Each step that decided it, in the kernel's order, as a sentence.
    pub reasons: Vec<String>,
    /// For a drop: why, and the policies behind it.
    pub dropped_by: Option<(Isolation, Vec<String>)>,
}

impl fmt::Display for Judgement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Packet { src, dst, proto, dport, .. } = self.packet;
        let verdict = if self.allowed { "ALLOWED" } else { "DROPPED" };
        writeln!(f, "{verdict}: {src} -> {dst} {dport}/{}", proto_name(proto))?;
        for reason in &self.reasons {
            writeln!(f, "  {reason}")?;
        }
        Ok(())
    }
}

/// `tcp`, `udp`, `sctp`, or the number.
pub fn proto_name(proto: u8) -> String {
    match proto {
        PROTO_TCP => "tcp".into(),
        PROTO_UDP => "udp".into(),
        PROTO_SCTP => "sctp".into(),
        other => other.to_string(),
    }
}

/// The flow from `from` to `to` judged on the plan of `cluster` for this node, in each family both have.
pub fn explain(
    cluster: &Cluster,
    node: &NodeOptions,
    from: &Endpoint,
    to: &Endpoint,
    (port, proto): (u16, u8),
) -> Result<Vec<Judgement>, ExplainError> {
    let (sources, destinations) = (from.addresses(cluster)?, to.addresses(cluster)?);
    let plan = compile(cluster, node);
    let mut out = Vec::new();
    for family in Family::ALL {
        let of = |ips: &[IpAddr]| ips.iter().copied().find(|ip| Family::of(*ip) == family);
        if let (Some(src), Some(dst)) = (of(&sources), of(&destinations)) {
            out.push(judge(&plan, &Packet::new(src, dst, proto, port)));
        }
    }
    if out.is_empty() {
        return Err(ExplainError::NoCommonFamily);
    }
    Ok(out)
}

/// One packet judged on `plan`, each deciding rule named.
pub fn judge(plan: &Plan, packet: &Packet) -> Judgement {
    let (allowed, path) = plan.trace(packet);
    let mut judgement = Judgement { packet: *packet, allowed, reasons: Vec::new(), dropped_by: None };
    for &(chain, index) in &path {
        let rule = &plan.rules(chain)[index];
        let reason = step(plan, packet, chain, index, &rule.verdict, &rule.matches, &mut judgement.dropped_by);
        judgement.reasons.push(reason);
    }
    let ended = path
        .last()
        .is_some_and(|&(chain, index)| matches!(plan.rules(chain)[index].verdict, Verdict::Accept | Verdict::Drop));
    if !ended {
        judgement.reasons.push("no rule of the base chain drops it: its policy accepts".to_string());
    }
    judgement
}

/// The sentence for one deciding rule.
fn step(
    plan: &Plan,
    packet: &Packet,
    chain: Chain,
    index: usize,
    verdict: &Verdict,
    matches: &[Match],
    dropped_by: &mut Option<(Isolation, Vec<String>)>,
) -> String {
    let isolating = |chain, addr| plan.provenance.isolating(chain, addr).join(", ");
    match (chain, verdict) {
        (Chain::Forward, Verdict::Jump(Chain::Egress)) => {
            format!("{} is isolated for egress by {}", packet.src, isolating(Chain::Egress, packet.src))
        }
        (Chain::Forward, Verdict::Jump(Chain::Ingress)) => {
            format!("{} is isolated for ingress by {}", packet.dst, isolating(Chain::Ingress, packet.dst))
        }
        (Chain::Forward, Verdict::Drop) => {
            let unknown_source =
                matches.iter().any(|m| matches!(m, Match::Lookup { field: crate::plan::Field::Saddr, .. }));
            let (isolation, addr) = if unknown_source {
                (Isolation::UnknownSource, packet.src)
            } else {
                (Isolation::UnknownDestination, packet.dst)
            };
            *dropped_by = Some((isolation, Vec::new()));
            format!("dropped: {addr} is an address of this node's pod CIDRs that no pod the agent knows holds")
        }
        (Chain::Forward, _) => "accepted by the base chain (a reply, or neighbour discovery)".to_string(),
        (Chain::Egress | Chain::Ingress, Verdict::Drop) => {
            let (isolation, addr) =
                if chain == Chain::Egress { (Isolation::Egress, packet.src) } else { (Isolation::Ingress, packet.dst) };
            let policies = plan.provenance.isolating(chain, addr);
            let sentence = format!("dropped: no {} rule of {} allows it", chain.name(), policies.join(", "));
            *dropped_by = Some((isolation, policies));
            sentence
        }
        (Chain::Egress | Chain::Ingress, _) => {
            format!("{} allowed by {}", chain.name(), plan.provenance.of_rule(chain, index).join(", "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compile::tests::{policy, suite_cluster};
    use crate::plan::DropLog;

    fn node() -> NodeOptions {
        NodeOptions {
            pod_cidrs: vec!["10.244.1.0/24".parse().unwrap()],
            drop_log: Some(DropLog { group: 100, rate: 10, burst: 5 }),
        }
    }

    fn pod(text: &str) -> Endpoint {
        Endpoint::parse(text).unwrap()
    }

    #[test]
    fn parses_ends_and_ports() {
        assert_eq!(pod("x/a"), Endpoint::Pod { namespace: "x".into(), name: "a".into() });
        assert_eq!(pod("fd00::1"), Endpoint::Addr("fd00::1".parse().unwrap()));
        for bad in ["x", "/a", "x/", "x/a/b"] {
            assert!(Endpoint::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_port("80/tcp"), Ok((80, PROTO_TCP)));
        assert_eq!(parse_port("53/UDP"), Ok((53, PROTO_UDP)));
        for bad in ["80", "0/tcp", "80/icmp", "70000/tcp"] {
            assert!(parse_port(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn names_the_rule_that_allows_and_the_isolation_that_drops() {
        let mut cluster = suite_cluster();
        cluster.policies.push(policy(
            "x",
            "allow-y-a",
            serde_json::json!({"podSelector": {"matchLabels": {"pod": "a"}},
                "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}, "podSelector": {"matchLabels": {"pod": "a"}}}],
                             "ports": [{"port": 80}]}]}),
        ));
        let allowed = explain(&cluster, &node(), &pod("y/a"), &pod("x/a"), (80, PROTO_TCP)).unwrap();
        assert_eq!(allowed.len(), 2, "both families");
        assert!(allowed.iter().all(|j| j.allowed));
        assert_eq!(allowed[0].reasons[0], "10.244.1.11 is isolated for ingress by x/allow-y-a");
        assert_eq!(allowed[0].reasons[1], "ingress allowed by policy x/allow-y-a ingress rule 0");
        let dropped = explain(&cluster, &node(), &pod("y/b"), &pod("x/a"), (80, PROTO_TCP)).unwrap();
        assert!(!dropped[0].allowed);
        assert_eq!(dropped[0].dropped_by, Some((Isolation::Ingress, vec!["x/allow-y-a".to_string()])));
        assert_eq!(dropped[0].reasons[1], "dropped: no ingress rule of x/allow-y-a allows it");
        let open = explain(&cluster, &node(), &pod("x/a"), &pod("y/b"), (81, PROTO_UDP)).unwrap();
        assert!(open[0].allowed);
        assert_eq!(open[0].reasons, ["no rule of the base chain drops it: its policy accepts"]);
        let unknown = explain(&cluster, &node(), &pod("x/a"), &pod("10.244.1.200"), (80, PROTO_TCP)).unwrap();
        assert_eq!(unknown.len(), 1);
        assert_eq!(unknown[0].dropped_by, Some((Isolation::UnknownDestination, vec![])));
        assert_eq!(
            explain(&cluster, &node(), &pod("x/nope"), &pod("x/a"), (80, PROTO_TCP)),
            Err(ExplainError::NoSuchPod { namespace: "x".into(), name: "nope".into() })
        );
    }
}
