//! Truth tables in the shape of Kubernetes' netpol suite: pods a, b, c in namespaces x, y, z (dual-stack),
//! probes on TCP and UDP ports 80 and 81 from every pod to every other. For each policy set, the verdicts of
//! the compiled plan ([`Plan::judges`], the kernel's evaluation order) are compared with [`oracle`], a direct
//! reading of the API's semantics that shares no code with the compiler; some tables are also written out by
//! hand, so that the two cannot be wrong together unnoticed.

use std::collections::BTreeMap;
use std::net::IpAddr;

use ipnet::IpNet;
use serde_json::{json, Value};

use super::*;
use crate::model::{Cluster, NetworkPolicy, Pod};
use crate::plan::{Packet, PROTO_TCP, PROTO_UDP};

pub(crate) const NAMESPACES: [&str; 3] = ["x", "y", "z"];
pub(crate) const PODS: [&str; 3] = ["a", "b", "c"];

/// The suite's cluster: namespace `n` labelled `ns=n`, pod `p` labelled `pod=p`, serving TCP and UDP on 80
/// and 81 with the suite's port names (`serve-80-tcp`, ...). IPv4 `10.244.1.<10*ns+pod>`, IPv6 likewise.
pub(crate) fn suite_cluster() -> Cluster {
    let mut namespaces = Vec::new();
    let mut pods = Vec::new();
    for (n, ns) in NAMESPACES.iter().enumerate() {
        namespaces.push(json!({"metadata": {"name": ns, "labels": {"ns": ns, "kubernetes.io/metadata.name": ns}}}));
        for (p, pod) in PODS.iter().enumerate() {
            let host = 10 * (n + 1) + p + 1;
            let ports: Vec<Value> = [80, 81]
                .iter()
                .flat_map(|port| {
                    ["TCP", "UDP"].map(|proto| {
                        json!({"name": format!("serve-{port}-{}", proto.to_lowercase()), "containerPort": port, "protocol": proto})
                    })
                })
                .collect();
            pods.push(json!({
                "metadata": {"name": pod, "namespace": ns, "labels": {"pod": pod}},
                "spec": {"containers": [{"name": "c", "ports": ports}]},
                "status": {"phase": "Running", "podIPs": [{"ip": format!("10.244.1.{host}")}, {"ip": format!("fd00:10:244:1::{host}")}]}
            }));
        }
    }
    serde_json::from_value(json!({"namespaces": namespaces, "pods": pods, "policies": []})).unwrap()
}

pub(crate) fn policy(namespace: &str, name: &str, spec: Value) -> NetworkPolicy {
    serde_json::from_value(json!({"metadata": {"namespace": namespace, "name": name}, "spec": spec})).unwrap()
}

fn ips(pod: &Pod) -> Vec<IpAddr> {
    pod.status.pod_ips.iter().map(|i| i.ip.parse().unwrap()).collect()
}

// ---- The oracle: the API's words, read directly. ----

fn labels_match(selector: &Value, labels: &BTreeMap<String, String>) -> bool {
    let ok_labels = selector["matchLabels"]
        .as_object()
        .map(|m| m.iter().all(|(k, v)| labels.get(k).map(String::as_str) == v.as_str()))
        .unwrap_or(true);
    let ok_exprs = selector["matchExpressions"].as_array().is_none_or(|exprs| {
        exprs.iter().all(|e| {
            let value = labels.get(e["key"].as_str().unwrap());
            let values: Vec<&str> =
                e["values"].as_array().map_or(vec![], |v| v.iter().map(|s| s.as_str().unwrap()).collect());
            match e["operator"].as_str().unwrap() {
                "In" => value.is_some_and(|v| values.contains(&v.as_str())),
                "NotIn" => !value.is_some_and(|v| values.contains(&v.as_str())),
                "Exists" => value.is_some(),
                "DoesNotExist" => value.is_none(),
                _ => false,
            }
        })
    });
    ok_labels && ok_exprs
}

fn ns_labels(cluster: &Cluster, ns: &str) -> BTreeMap<String, String> {
    cluster.namespaces.iter().find(|n| n.metadata.name == ns).map(|n| n.metadata.labels.clone()).unwrap_or_default()
}

/// Does `peer` (JSON) of a policy in `policy_ns` cover the endpoint (a pod, or an address outside)?
fn peer_covers(cluster: &Cluster, policy_ns: &str, peer: &Value, pod: Option<&Pod>, ip: IpAddr) -> bool {
    if let Some(block) = peer.get("ipBlock") {
        let cidr: IpNet = block["cidr"].as_str().unwrap().parse().unwrap();
        let excepted = block["except"]
            .as_array()
            .is_some_and(|list| list.iter().any(|e| e.as_str().unwrap().parse::<IpNet>().unwrap().contains(&ip)));
        return cidr.contains(&ip) && !excepted;
    }
    let Some(pod) = pod else { return false };
    let ns_ok = match peer.get("namespaceSelector") {
        Some(sel) => labels_match(sel, &ns_labels(cluster, &pod.metadata.namespace)),
        None => pod.metadata.namespace == policy_ns,
    };
    let pod_ok = peer.get("podSelector").is_none_or(|sel| labels_match(sel, &pod.metadata.labels));
    ns_ok && pod_ok
}

/// Does a `ports` list allow (proto, port) towards `dst` (whose container ports resolve names)?
fn ports_allow(ports: Option<&Value>, dst: Option<&Pod>, proto: &str, port: u16) -> bool {
    let Some(list) = ports.and_then(Value::as_array).filter(|l| !l.is_empty()) else { return true };
    list.iter().any(|entry| {
        let entry_proto = entry["protocol"].as_str().unwrap_or("TCP");
        if entry_proto != proto {
            return false;
        }
        match &entry["port"] {
            Value::Null => true,
            Value::Number(n) => {
                let first = n.as_u64().unwrap() as u16;
                let last = entry["endPort"].as_u64().map_or(first, |e| e as u16);
                first <= port && port <= last
            }
            Value::String(name) => dst.is_some_and(|pod| {
                pod.spec.containers.iter().flat_map(|c| &c.ports).any(|cp| {
                    cp.name.as_deref() == Some(name)
                        && cp.protocol.as_deref().unwrap_or("TCP") == proto
                        && cp.container_port == i64::from(port)
                })
            }),
            _ => false,
        }
    })
}

fn types_of(spec: &Value) -> (bool, bool) {
    match spec["policyTypes"].as_array() {
        Some(t) if !t.is_empty() => (t.iter().any(|v| v == "Ingress"), t.iter().any(|v| v == "Egress")),
        _ => (true, spec["egress"].as_array().is_some_and(|e| !e.is_empty())),
    }
}

/// Whether the API lets `src` reach `dst` on (proto, port), from the policies' JSON.
pub(crate) fn oracle(
    cluster: &Cluster,
    policies: &[Value],
    src: (&Pod, IpAddr),
    dst: (&Pod, IpAddr),
    proto: &str,
    port: u16,
) -> bool {
    let selecting = |pod: &Pod, want_ingress: bool| -> Vec<&Value> {
        policies
            .iter()
            .filter(|p| p["metadata"]["namespace"] == pod.metadata.namespace.as_str())
            .filter(|p| labels_match(&p["spec"]["podSelector"], &pod.metadata.labels))
            .filter(|p| {
                let (i, e) = types_of(&p["spec"]);
                if want_ingress {
                    i
                } else {
                    e
                }
            })
            .collect()
    };
    let egress_ok = {
        let list = selecting(src.0, false);
        list.is_empty()
            || list.iter().any(|p| {
                let ns = p["metadata"]["namespace"].as_str().unwrap();
                p["spec"]["egress"].as_array().into_iter().flatten().any(|rule| {
                    let peers_ok = rule["to"].as_array().filter(|l| !l.is_empty()).is_none_or(|peers| {
                        peers.iter().any(|peer| peer_covers(cluster, ns, peer, Some(dst.0), dst.1))
                    });
                    peers_ok && ports_allow(rule.get("ports"), Some(dst.0), proto, port)
                })
            })
    };
    let ingress_ok = {
        let list = selecting(dst.0, true);
        list.is_empty()
            || list.iter().any(|p| {
                let ns = p["metadata"]["namespace"].as_str().unwrap();
                p["spec"]["ingress"].as_array().into_iter().flatten().any(|rule| {
                    let peers_ok = rule["from"].as_array().filter(|l| !l.is_empty()).is_none_or(|peers| {
                        peers.iter().any(|peer| peer_covers(cluster, ns, peer, Some(src.0), src.1))
                    });
                    peers_ok && ports_allow(rule.get("ports"), Some(dst.0), proto, port)
                })
            })
    };
    egress_ok && ingress_ok
}

// ---- The comparison. ----

const PROBES: [(&str, u8, u16); 4] =
    [("TCP", PROTO_TCP, 80), ("TCP", PROTO_TCP, 81), ("UDP", PROTO_UDP, 80), ("UDP", PROTO_UDP, 81)];

/// Every probe (src, dst, family, protocol, port) judged by the plan and by the oracle; panics on the first
/// difference. Returns the plan's table: `table[src][dst][probe]` for IPv4 (IPv6 must agree).
fn compare(policies: Vec<Value>) -> (Plan, BTreeMap<(String, String), [bool; 4]>) {
    let mut cluster = suite_cluster();
    cluster.policies = policies.iter().map(|p| serde_json::from_value(p.clone()).unwrap()).collect();
    let plan = compile(
        &cluster,
        &NodeOptions {
            pod_cidrs: vec!["10.244.1.0/24".parse().unwrap(), "fd00:10:244:1::/64".parse().unwrap()],
            // Drops logged: the log rules before each drop change no verdict.
            drop_log: Some(crate::plan::DropLog { group: 100, rate: 10, burst: 5 }),
        },
    );
    let mut table = BTreeMap::new();
    for src in &cluster.pods {
        for dst in &cluster.pods {
            if std::ptr::eq(src, dst) {
                continue;
            }
            let mut row = [false; 4];
            for family in 0..2 {
                let (s, d) = (ips(src)[family], ips(dst)[family]);
                for (i, (name, proto, port)) in PROBES.iter().enumerate() {
                    let got = plan.judges(&Packet::new(s, d, *proto, *port));
                    let want = oracle(&cluster, &policies, (src, s), (dst, d), name, *port);
                    let explained = crate::explain::judge(&plan, &Packet::new(s, d, *proto, *port));
                    assert_eq!(explained.allowed, got, "explain agrees with the plan");
                    if let Some((isolation, policies)) = &explained.dropped_by {
                        assert!(!policies.is_empty(), "{isolation:?}: the isolating policies are named");
                    }
                    assert_eq!(
                        got, want,
                        "{}/{} -> {}/{} {name}/{port} {s}->{d}: plan {got}, API {want}\n{plan:#?}",
                        src.metadata.namespace, src.metadata.name, dst.metadata.namespace, dst.metadata.name
                    );
                    if family == 0 {
                        row[i] = got;
                    }
                }
            }
            table.insert(
                (
                    format!("{}/{}", src.metadata.namespace, src.metadata.name),
                    format!("{}/{}", dst.metadata.namespace, dst.metadata.name),
                ),
                row,
            );
        }
    }
    (plan, table)
}

fn p(ns: &str, name: &str, spec: Value) -> Value {
    json!({"metadata": {"namespace": ns, "name": name}, "spec": spec})
}

/// The pods reaching `dst` on probe `i`, as "ns/pod" names.
fn reaching(table: &BTreeMap<(String, String), [bool; 4]>, dst: &str, i: usize) -> Vec<String> {
    table.iter().filter(|((_, d), row)| d == dst && row[i]).map(|((s, _), _)| s.clone()).collect()
}

fn all_but(dst: &str) -> Vec<String> {
    let mut out = Vec::new();
    for ns in NAMESPACES {
        for pod in PODS {
            let name = format!("{ns}/{pod}");
            if name != dst {
                out.push(name);
            }
        }
    }
    out
}

#[test]
fn no_policy_everything_open() {
    let (plan, table) = compare(vec![]);
    assert!(table.values().all(|row| row.iter().all(|&v| v)));
    assert_eq!(plan.rules(Chain::Ingress).len(), 2, "only the final drop, after its log rule");
}

#[test]
fn default_deny_ingress_in_x() {
    let (_, table) = compare(vec![p("x", "deny", json!({"podSelector": {}}))]);
    for ((src, dst), row) in &table {
        assert_eq!(row.iter().all(|&v| v), !dst.starts_with("x/"), "{src} -> {dst}");
        assert_eq!(row.iter().any(|&v| v), !dst.starts_with("x/"), "{src} -> {dst}");
    }
}

#[test]
fn allow_all_and_same_namespace() {
    compare(vec![
        p("x", "deny", json!({"podSelector": {}})),
        p("x", "all", json!({"podSelector": {}, "ingress": [{}]})),
    ]);
    let (_, table) =
        compare(vec![p("x", "same-ns", json!({"podSelector": {}, "ingress": [{"from": [{"podSelector": {}}]}]}))]);
    assert_eq!(reaching(&table, "x/a", 0), vec!["x/b", "x/c"]);
}

#[test]
fn namespace_and_pod_selectors() {
    let (_, table) = compare(vec![p(
        "x",
        "from-y",
        json!({"podSelector": {"matchLabels": {"pod": "a"}},
        "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}}]}]}),
    )]);
    assert_eq!(reaching(&table, "x/a", 2), vec!["y/a", "y/b", "y/c"]);
    assert_eq!(reaching(&table, "x/b", 2), all_but("x/b"));
    // Both selectors in one peer: pod b of namespace y only; in two peers: either.
    let (_, table) = compare(vec![p(
        "x",
        "and",
        json!({"podSelector": {"matchLabels": {"pod": "a"}},
        "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}, "podSelector": {"matchLabels": {"pod": "b"}}}]}]}),
    )]);
    assert_eq!(reaching(&table, "x/a", 0), vec!["y/b"]);
    let (_, table) = compare(vec![p(
        "x",
        "or",
        json!({"podSelector": {"matchLabels": {"pod": "a"}},
        "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}}, {"podSelector": {"matchLabels": {"pod": "b"}}}]}]}),
    )]);
    assert_eq!(reaching(&table, "x/a", 0), vec!["x/b", "y/a", "y/b", "y/c"]);
    compare(vec![p(
        "x",
        "exprs",
        json!({"podSelector": {"matchExpressions": [{"key": "pod", "operator": "In", "values": ["a", "b"]}]},
        "ingress": [{"from": [{"namespaceSelector": {"matchExpressions": [{"key": "ns", "operator": "NotIn", "values": ["x"]}]},
                                "podSelector": {"matchExpressions": [{"key": "pod", "operator": "Exists"}]}}]}]}),
    )]);
}

#[test]
fn ports_numbers_names_and_ranges() {
    let (_, table) = compare(vec![p("x", "81", json!({"podSelector": {}, "ingress": [{"ports": [{"port": 81}]}]}))]);
    assert_eq!(table[&("y/a".to_string(), "x/a".to_string())], [false, true, false, false]);
    let (plan, table) = compare(vec![p(
        "x",
        "named",
        json!({"podSelector": {}, "ingress": [{"from": [{"namespaceSelector": {}}], "ports": [{"port": "serve-80-udp", "protocol": "UDP"}]}]}),
    )]);
    assert_eq!(table[&("z/c".to_string(), "x/b".to_string())], [false, false, true, false]);
    assert!(plan.sets.values().any(|s| s.kind == SetKind::AddrProtoPort && s.elements.len() == 3));
    let (_, table) = compare(vec![p(
        "x",
        "range",
        json!({"podSelector": {}, "ingress": [{"ports": [{"port": 80, "endPort": 81, "protocol": "UDP"}, {"protocol": "TCP", "port": 81}]}]}),
    )]);
    assert_eq!(table[&("y/a".to_string(), "x/a".to_string())], [false, true, true, true]);
    compare(vec![p("x", "proto-only", json!({"podSelector": {}, "ingress": [{"ports": [{"protocol": "UDP"}]}]}))]);
}

#[test]
fn egress_rules() {
    let (_, table) = compare(vec![p("x", "deny-egress", json!({"podSelector": {}, "policyTypes": ["Egress"]}))]);
    for ((src, _), row) in &table {
        assert_eq!(row.iter().any(|&v| v), !src.starts_with("x/"));
    }
    compare(vec![p(
        "x",
        "to-y",
        json!({"podSelector": {"matchLabels": {"pod": "a"}}, "egress": [{"to": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}}], "ports": [{"port": 80}]}]}),
    )]);
    compare(vec![p(
        "x",
        "udp-anywhere",
        json!({"podSelector": {}, "policyTypes": ["Egress", "Ingress"], "egress": [{"ports": [{"protocol": "UDP", "port": "serve-81-udp"}]}]}),
    )]);
    // Egress only: the ingress rules of a policy typed Egress are not in force.
    let (_, table) = compare(vec![p(
        "x",
        "egress-typed",
        json!({"podSelector": {}, "policyTypes": ["Egress"], "ingress": [{"from": [{"podSelector": {"matchLabels": {"pod": "zzz"}}}]}], "egress": [{}]}),
    )]);
    assert!(table.values().all(|row| row.iter().all(|&v| v)));
}

#[test]
fn ip_blocks_with_except() {
    let (plan, table) = compare(vec![p(
        "x",
        "cidr",
        json!({"podSelector": {"matchLabels": {"pod": "a"}},
        "ingress": [{"from": [{"ipBlock": {"cidr": "10.244.1.0/24", "except": ["10.244.1.22/32"]}}, {"ipBlock": {"cidr": "fd00:10:244:1::/64", "except": ["fd00:10:244:1::22/128"]}}]}]}),
    )]);
    let mut want = all_but("x/a");
    want.retain(|name| name != "y/b");
    assert_eq!(reaching(&table, "x/a", 0), want);
    assert!(plan.sets.values().any(|s| s.kind == SetKind::Ranges && s.elements.len() == 2));
    compare(vec![p(
        "y",
        "egress-cidr",
        json!({"podSelector": {}, "egress": [{"to": [{"ipBlock": {"cidr": "10.244.1.0/28", "except": ["10.244.1.12/30"]}}]}]}),
    )]);
}

#[test]
fn policies_add_up() {
    let (_, table) = compare(vec![
        p(
            "x",
            "from-y",
            json!({"podSelector": {"matchLabels": {"pod": "a"}}, "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}}]}]}),
        ),
        p(
            "x",
            "from-z-81",
            json!({"podSelector": {"matchLabels": {"pod": "a"}}, "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "z"}}}], "ports": [{"port": 81}]}]}),
        ),
        p("y", "deny-egress", json!({"podSelector": {"matchLabels": {"pod": "c"}}, "policyTypes": ["Egress"]})),
    ]);
    assert_eq!(reaching(&table, "x/a", 0), vec!["y/a", "y/b"]);
    assert_eq!(reaching(&table, "x/a", 1), vec!["y/a", "y/b", "z/a", "z/b", "z/c"]);
}

#[test]
fn selecting_nothing_is_open() {
    let (plan, table) = compare(vec![p("x", "nothing", json!({"podSelector": {"matchLabels": {"pod": "none"}}}))]);
    assert!(table.values().all(|row| row.iter().all(|&v| v)));
    assert!(plan.warnings.iter().any(|w| w.contains("selects no pod")), "{:?}", plan.warnings);
}

#[test]
fn what_cannot_be_expressed_denies() {
    let mut cluster = suite_cluster();
    let nodes = NodeOptions::default();
    let judge = |plan: &Plan, src: &str, dst: &str, port| {
        plan.judges(&Packet::new(src.parse().unwrap(), dst.parse().unwrap(), PROTO_TCP, port))
    };
    // A port entry of an unknown protocol is left out: the rule allows the rest only; with nothing left,
    // nothing (not every port).
    cluster.policies =
        vec![policy("x", "icmp", json!({"podSelector": {}, "ingress": [{"ports": [{"protocol": "ICMP"}]}]}))];
    let plan = compile(&cluster, &nodes);
    assert!(!judge(&plan, "10.244.1.21", "10.244.1.11", 80));
    assert!(plan.warnings.iter().any(|w| w.contains("ICMP")));
    // An unknown selector operator in a peer: that peer is left out, and with it the rule.
    cluster.policies = vec![policy(
        "x",
        "op",
        json!({"podSelector": {}, "ingress": [{"from": [{"podSelector": {"matchExpressions": [{"key": "pod", "operator": "Gt", "values": ["1"]}]}}]}]}),
    )];
    let plan = compile(&cluster, &nodes);
    assert!(!judge(&plan, "10.244.1.12", "10.244.1.11", 80));
    // An unknown operator in the policy's own selector isolates its whole namespace, both ways.
    cluster.policies = vec![policy(
        "x",
        "bad",
        json!({"podSelector": {"matchExpressions": [{"key": "pod", "operator": "Gt"}]}, "ingress": [{}]}),
    )];
    let plan = compile(&cluster, &nodes);
    assert!(!judge(&plan, "10.244.1.21", "10.244.1.11", 80));
    assert!(!judge(&plan, "10.244.1.11", "10.244.1.21", 80));
    assert!(judge(&plan, "10.244.1.21", "10.244.1.31", 80));
    // A malformed ipBlock and an endPort on a named port.
    cluster.policies = vec![policy(
        "x",
        "block",
        json!({"podSelector": {}, "ingress": [
        {"from": [{"ipBlock": {"cidr": "10.244.1.0/24", "except": ["10.0.0.0/8"]}}]},
        {"ports": [{"port": "serve-80-tcp", "endPort": 81}]}]}),
    )];
    let plan = compile(&cluster, &nodes);
    assert!(!judge(&plan, "10.244.1.21", "10.244.1.11", 80));
    assert_eq!(plan.warnings.len(), 4, "{:?}", plan.warnings);
}

#[test]
fn a_policy_the_agent_cannot_read_isolates_its_namespace() {
    let mut cluster = suite_cluster();
    cluster.policies = vec![NetworkPolicy::unreadable("x", "garbled")];
    let plan = compile(&cluster, &NodeOptions::default());
    let judge =
        |src: &str, dst: &str| plan.judges(&Packet::new(src.parse().unwrap(), dst.parse().unwrap(), PROTO_TCP, 80));
    assert!(!judge("10.244.1.21", "10.244.1.11"), "into x");
    assert!(!judge("10.244.1.11", "10.244.1.21"), "out of x");
    assert!(!judge("10.244.1.12", "10.244.1.11"), "within x");
    assert!(judge("10.244.1.21", "10.244.1.31"), "y to z: open");
    assert!(plan.warnings.iter().any(|w| w.starts_with("policy x/garbled:")), "{:?}", plan.warnings);
}

#[test]
fn unknown_pods_of_the_node_are_dropped_and_replies_pass() {
    let cluster = suite_cluster();
    let nodes = NodeOptions { pod_cidrs: vec!["10.244.1.0/24".parse().unwrap()], drop_log: None };
    let plan = compile(&cluster, &nodes);
    let packet = |src: &str, dst: &str| Packet::new(src.parse().unwrap(), dst.parse().unwrap(), PROTO_TCP, 80);
    assert!(plan.judges(&packet("10.244.1.11", "10.244.1.12")));
    assert!(!plan.judges(&packet("10.244.1.11", "10.244.1.99")), "a pod the agent has not seen");
    assert!(!plan.judges(&packet("10.244.1.99", "10.244.1.11")));
    assert!(plan.judges(&packet("10.244.2.5", "10.244.1.11")), "another node's pods are judged by their policies");
    let mut established = packet("10.244.1.11", "10.244.1.99");
    established.established = true;
    assert!(plan.judges(&established));
}

#[test]
fn pods_coming_and_going_change_elements_only() {
    let mut cluster = suite_cluster();
    cluster.policies = vec![
        policy(
            "x",
            "from-y",
            json!({"podSelector": {"matchLabels": {"pod": "a"}}, "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}}], "ports": [{"port": "serve-80-tcp"}]}]}),
        ),
        policy(
            "y",
            "egress",
            json!({"podSelector": {}, "egress": [{"to": [{"podSelector": {"matchLabels": {"pod": "b"}}}]}]}),
        ),
    ];
    let before = compile(&cluster, &NodeOptions::default());
    let mut moved = cluster.clone();
    moved.pods.retain(|p| p.metadata.name != "b");
    moved.pods[0].metadata.labels.insert("pod".into(), "b".into());
    let after = compile(&moved, &NodeOptions::default());
    assert!(before.same_shape(&after));
    assert_ne!(before.sets, after.sets);
    let mut changed = cluster.clone();
    changed.policies.pop();
    assert!(!before.same_shape(&compile(&changed, &NodeOptions::default())));
}
