//! The NetworkPolicy agent at scale (issue 37, docs/benchmarks.md): 1,000 pods in 100 namespaces and 500
//! policies, compiled and applied in a fresh namespace; then a pod coming, a pod's labels changing and a
//! policy coming, each timed from the new view to the transaction's end. Beside it, the same policies in an
//! iptables design (one chain per policy and one per pod, pods as addresses in rules), loaded with
//! `iptables-restore` into the same kind of namespace: the whole ruleset and the re-sync a pod change causes.
//!
//! Ignored by default (a measurement, not a check): `cargo test -p netns-tests --features cnicore/failpoints
//! --test netpol_bench -- --ignored --nocapture`.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use netns_tests::{json, TestNetns, Value};
use netpol::apply;
use netpol::compile::{compile, NodeOptions};
use netpol::model::Cluster;

const NAMESPACES: usize = 100;
const PODS_PER_NAMESPACE: usize = 10;
const POLICIES_PER_NAMESPACE: usize = 5;

fn pod_ip(n: usize) -> (IpAddr, IpAddr) {
    (
        format!("10.244.{}.{}", n / 250, n % 250 + 2).parse().unwrap(),
        format!("fd00:10:244::{:x}", n + 2).parse().unwrap(),
    )
}

fn pod(ns: usize, i: usize, n: usize, app: usize) -> Value {
    let (v4, v6) = pod_ip(n);
    json!({
        "metadata": {"name": format!("p{i}"), "namespace": format!("ns{ns}"), "labels": {"app": format!("app{app}"), "tier": if i.is_multiple_of(2) { "web" } else { "db" }}},
        "spec": {"containers": [{"ports": [{"name": "http", "containerPort": 8080}, {"name": "dns", "containerPort": 53, "protocol": "UDP"}]}]},
        "status": {"phase": "Running", "podIPs": [{"ip": v4.to_string()}, {"ip": v6.to_string()}]}
    })
}

fn policy(ns: usize, k: usize) -> Value {
    let spec = match k {
        0 => json!({"podSelector": {}, "policyTypes": ["Ingress"]}),
        1 => {
            json!({"podSelector": {"matchLabels": {"tier": "web"}}, "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"team": format!("t{}", ns % 10)}}}], "ports": [{"port": "http"}]}]})
        }
        2 => {
            json!({"podSelector": {"matchLabels": {"tier": "db"}}, "ingress": [{"from": [{"podSelector": {"matchLabels": {"tier": "web"}}}], "ports": [{"port": 5432}, {"port": 9000, "endPort": 9100}]}]})
        }
        3 => {
            json!({"podSelector": {"matchLabels": {"app": format!("app{}", ns % 7)}}, "egress": [{"to": [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"tier": "db"}}}]}, {"ports": [{"port": "dns", "protocol": "UDP"}]}]})
        }
        _ => {
            json!({"podSelector": {"matchExpressions": [{"key": "app", "operator": "In", "values": ["app1", "app2"]}]}, "ingress": [{"from": [{"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.244.0.0/16"]}}]}]})
        }
    };
    json!({"metadata": {"namespace": format!("ns{ns}"), "name": format!("pol{k}")}, "spec": spec})
}

fn cluster(extra_pods: usize, extra_policies: usize) -> Value {
    let namespaces: Vec<Value> = (0..NAMESPACES)
        .map(|n| json!({"metadata": {"name": format!("ns{n}"), "labels": {"team": format!("t{}", n % 10)}}}))
        .collect();
    let mut pods = Vec::new();
    for ns in 0..NAMESPACES {
        for i in 0..PODS_PER_NAMESPACE {
            pods.push(pod(ns, i, ns * PODS_PER_NAMESPACE + i, (ns + i) % 7));
        }
    }
    for e in 0..extra_pods {
        pods.push(pod(0, 100 + e, NAMESPACES * PODS_PER_NAMESPACE + e, 1));
    }
    let mut policies: Vec<Value> =
        (0..NAMESPACES).flat_map(|ns| (0..POLICIES_PER_NAMESPACE).map(move |k| policy(ns, k))).collect();
    for e in 0..extra_policies {
        policies.push(json!({"metadata": {"namespace": "ns1", "name": format!("extra{e}")}, "spec": {"podSelector": {"matchLabels": {"app": "app3"}}, "ingress": [{"ports": [{"port": 10000 + e}]}]}}));
    }
    json!({"namespaces": namespaces, "pods": pods, "policies": policies})
}

fn view(value: Value) -> Cluster {
    serde_json::from_value(value).unwrap()
}

fn median(mut values: Vec<Duration>) -> Duration {
    values.sort();
    values[values.len() / 2]
}

fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0)
}

/// Writes the views of the benchmark into `$NETPOL_BENCH_DIR` (base.json, pod.json: one pod more,
/// policy.json: one policy more), to time the release agent on them by hand.
#[test]
#[ignore]
fn write_views() {
    let Some(dir) = std::env::var_os("NETPOL_BENCH_DIR") else { return };
    let dir = std::path::PathBuf::from(dir);
    for (name, value) in [("base", cluster(0, 0)), ("pod", cluster(1, 0)), ("policy", cluster(1, 1))] {
        std::fs::write(dir.join(format!("{name}.json")), value.to_string()).unwrap();
    }
}

#[test]
#[ignore]
fn at_1000_pods_and_500_policies() {
    let ns = TestNetns::new("npb");
    let node = NodeOptions {
        pod_cidrs: vec!["10.244.0.0/22".parse().unwrap(), "fd00:10:244::/64".parse().unwrap()],
        drop_log: None,
    };
    let base = view(cluster(0, 0));
    let started = Instant::now();
    let plan = compile(&base, &node);
    let compile_time = started.elapsed();
    let (rules, elements) = plan.size();
    println!(
        "plan: {} pods, {} policies: {rules} rules, {elements} set elements in {} sets; compile {compile_time:?}",
        base.pods.len(),
        base.policies.len(),
        plan.sets.len()
    );

    let first = ns.run(|| {
        let started = Instant::now();
        apply::replace(netpol::plan::TABLE, &plan).unwrap();
        started.elapsed()
    });
    println!("first table (one transaction): {first:?}");

    // Changes, each from the new view to the end of its transaction (compile included), 5 times.
    let mut old = plan;
    let (mut pod_came, mut relabel, mut policy_came) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..5 {
        for (what, value, times) in [
            ("pod", cluster(round + 1, round), &mut pod_came),
            (
                "labels",
                {
                    let mut v = cluster(round + 1, round);
                    v["pods"][round * 3]["metadata"]["labels"]["tier"] = json!("other");
                    v
                },
                &mut relabel,
            ),
            ("policy", cluster(round + 1, round + 1), &mut policy_came),
        ] {
            let cluster = view(value);
            let (took, applied, new, compiled) = ns.run(|| {
                let started = Instant::now();
                let new = compile(&cluster, &node);
                let compiled = started.elapsed();
                let applied = apply::update(netpol::plan::TABLE, &old, &new).unwrap();
                (started.elapsed(), applied, new, compiled)
            });
            println!("{what}: {applied:?} in {took:?} (compile {compiled:?}, transaction {:?})", took - compiled);
            times.push(took);
            old = new;
        }
    }
    println!(
        "median, view to enforced: a pod comes {:?}; a pod's labels change {:?}; a policy comes {:?}",
        median(pod_came),
        median(relabel),
        median(policy_came)
    );
    println!("peak RSS of this process (compiler + plans + netlink): {} KiB", rss_kib());
    ns.run(|| apply::remove(netpol::plan::TABLE)).unwrap();

    iptables_design(&ns, &base);
}

/// The same policies as an iptables design of one chain per policy and one per pod: FORWARD jumps to a
/// pod's chain by its address, the pod's chain to its policies' chains, a policy's chain accepts each peer
/// pod's address (with each port). A pod coming changes the chains of every policy it is a peer of: the
/// design re-syncs with one `iptables-restore` of the whole filter table.
fn iptables_design(ns: &TestNetns, cluster: &Cluster) {
    if !netns_tests::on_path("iptables-restore") {
        println!("iptables-restore missing: no comparison");
        return;
    }
    let plan = compile(cluster, &NodeOptions::default());
    // Expand the plan's sets into per-address rules, as such a design writes them.
    let mut text = String::from("*filter\n:FORWARD ACCEPT [0:0]\n");
    let mut body = String::new();
    let mut rule_count = 0;
    let ingress = plan.rules(netpol::plan::Chain::Ingress);
    let mut chains = Vec::new();
    for (i, rule) in ingress.iter().enumerate().filter(|(_, r)| r.family == Some(netpol::plan::Family::V4)) {
        let chain = format!("NWPLCY-{i}");
        text.push_str(&format!(":{chain} - [0:0]\n"));
        chains.push(chain.clone());
        let peers: Vec<String> = rule
            .matches
            .iter()
            .filter_map(|m| match m {
                netpol::plan::Match::Lookup { field: netpol::plan::Field::Saddr, set, .. } => Some(set.clone()),
                _ => None,
            })
            .flat_map(|set| plan.sets[&set].elements.iter().map(|k| format!("{k:?}")).collect::<Vec<_>>())
            .collect();
        for peer in peers.iter().take(2000) {
            let addr = peer.trim_start_matches("Addr(").trim_end_matches(')');
            if addr.parse::<IpAddr>().is_ok() {
                body.push_str(&format!("-A {chain} -s {addr} -p tcp --dport 80 -j ACCEPT\n"));
                rule_count += 1;
            }
        }
    }
    for (n, pod) in cluster.pods.iter().enumerate() {
        let chain = format!("POD-FW-{n}");
        text.push_str(&format!(":{chain} - [0:0]\n"));
        body.push_str(&format!("-A FORWARD -d {} -j {chain}\n", pod.status.pod_ips[0].ip));
        for i in 0..POLICIES_PER_NAMESPACE {
            body.push_str(&format!("-A {chain} -j {}\n", chains[(n + i) % chains.len()]));
        }
        body.push_str(&format!("-A {chain} -j DROP\n"));
        rule_count += POLICIES_PER_NAMESPACE + 2;
    }
    text.push_str(&body);
    text.push_str("COMMIT\n");
    let mut times = Vec::new();
    for _ in 0..5 {
        let started = Instant::now();
        let out = ns.exec("iptables-restore", &[], &[], text.as_bytes());
        assert!(out.status.success(), "iptables-restore: {}", String::from_utf8_lossy(&out.stderr));
        times.push(started.elapsed());
    }
    println!(
        "iptables design (IPv4 only): {rule_count} rules; one re-sync with iptables-restore: median {:?}",
        median(times)
    );
}
