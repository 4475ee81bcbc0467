//! The NetworkPolicy agent (issue 37) on a kubenet node: the netpol suite's pods (`a`, `b`, `c` in `x`, `y`,
//! `z`, dual-stack, TCP and UDP servers on 80 and 81) attached by the real bridge chain to `cbr0`, the agent
//! (`cni-netpol run --static`) in the node, and real connections and datagrams from every pod to every other.
//!
//! - `truth_tables`: for each policy set, the whole table of who reaches whom (576 probes: 72 pairs, both
//!   families, TCP and UDP, 80 and 81) equals what the compiled plan says ([`Plan::judges`], itself checked
//!   against a reading of the API in the compiler's unit tests); some tables are also written out by hand.
//! - `changes_while_traffic_runs`: new connections of an allowed flow never fail and of a denied flow never
//!   pass while policies change (the policy chains rewritten), pods change labels (element changes), the
//!   agent is killed and started again (the whole table replaced); a deleted table is put back; a pod the
//!   agent does not know is unreachable both ways until it does; `cleanup` removes the agent's table and changes nothing else of the node (the plugins' rules, a kube-proxy table).
//! - `across_nodes`: two kubenet nodes routing each other's pod subnets (what a cloud's routes do), an agent
//!   on each with the same view: a flow from a pod of one node to a pod of the other is judged by the
//!   destination's ingress policy and by the source's egress policy, in both families; a connection from
//!   outside through a pod's hostPort (DNAT, then forward) is judged by the pod's ingress policy.
//! - `a_policy_the_kernel_refuses_fails_closed`: a policy whose rules the kernel refuses (a test build's fail
//!   point adds one it cannot take) is put in force allowing nothing, its pods isolated, while every other
//!   policy and every later change applies; deleted, its pods are reachable again.
//! - `metrics_and_health_endpoints`: `--metrics-addr`'s `/metrics` (parsed as Prometheus does) holds the sizes
//!   of the compiled plan and counts each transaction by what it changed; `/healthz`, `/readyz`; an address in
//!   use stops a second agent at start.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use netns_tests::daemon::{http_get, sample, scrape};
use netns_tests::netpol::{policy, reaches, PolicyNode, Probe, Proto};
use netns_tests::{bin, json, Value};
use netpol::compile::{compile, NodeOptions};
use netpol::model::Cluster;
use netpol::plan::Packet;

/// What the compiled plan says of each probe.
fn expected(node: &PolicyNode, cluster: &Value, probes: &BTreeMap<Probe, bool>) -> BTreeMap<Probe, bool> {
    let cluster: Cluster = serde_json::from_value(cluster.clone()).expect("cluster view");
    let options = NodeOptions {
        pod_cidrs: vec![
            netns_tests::kubenet::SUBNET_V4.parse().unwrap(),
            netns_tests::kubenet::SUBNET_V6.parse().unwrap(),
        ],
        drop_log: None,
    };
    let plan = compile(&cluster, &options);
    probes
        .keys()
        .map(|probe| {
            let (src, dst) = (node.pod(&probe.src).ip(probe.v6), node.pod(&probe.dst).ip(probe.v6));
            (probe.clone(), plan.judges(&Packet::new(src, dst, probe.proto.number(), probe.port)))
        })
        .collect()
}

/// Applies `policies`, probes everything and compares with the plan; returns the table.
fn assert_enforced(node: &PolicyNode, what: &str, policies: &[Value]) -> BTreeMap<Probe, bool> {
    let cluster = node.cluster(&[], policies);
    node.apply(&cluster);
    let got = node.probe_all();
    let want = expected(node, &cluster, &got);
    let wrong: Vec<String> = got
        .iter()
        .filter(|(probe, reached)| want[*probe] != **reached)
        .map(|(probe, reached)| format!("{probe:?}: reached {reached}, policy says {}", want[probe]))
        .collect();
    if !wrong.is_empty() {
        // What the kernel held when it judged: a flow let through by an entry of an earlier table shows here.
        let (conntrack, ruleset) = (node.conntrack(), ruleset(node));
        panic!(
            "{what}: {} of {} probes wrong:\n  {}\nconntrack:\n{conntrack}\nruleset:\n{ruleset}\nagent:\n{}",
            wrong.len(),
            got.len(),
            wrong.join("\n  "),
            node.log()
        );
    }
    got
}

#[test]
fn truth_tables() {
    let node = PolicyNode::new();
    node.write_cluster(&node.cluster(&[], &[]));
    let _agent = node.start_agent();
    netns_tests::wait_for(Duration::from_secs(10), || node.applied() > 0).expect("the agent's first table");

    let open = assert_enforced(&node, "no policy", &[]);
    assert!(open.values().all(|&reached| reached), "no policy: everything reaches everything");

    let deny = assert_enforced(&node, "default deny ingress in x", &[policy("x", "deny", json!({"podSelector": {}}))]);
    for (probe, reached) in &deny {
        assert_eq!(*reached, !probe.dst.starts_with("x/"), "{probe:?}");
    }

    let from_y = [
        policy("x", "deny", json!({"podSelector": {}})),
        policy(
            "x",
            "a-from-y",
            json!({"podSelector": {"matchLabels": {"pod": "a"}},
            "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}}], "ports": [{"port": "serve-80-tcp"}, {"protocol": "UDP", "port": 81}]}]}),
        ),
    ];
    let table = assert_enforced(&node, "x/a from namespace y on a named port and UDP 81", &from_y);
    for (probe, reached) in &table {
        let want = !probe.dst.starts_with("x/")
            || (probe.dst == "x/a"
                && probe.src.starts_with("y/")
                && matches!((probe.proto, probe.port), (Proto::Tcp, 80) | (Proto::Udp, 81)));
        assert_eq!(*reached, want, "{probe:?}");
    }

    assert_enforced(
        &node,
        "x/a from pod b of y (both selectors) or pods c anywhere (two peers), endPort",
        &[policy(
            "x",
            "and-or",
            json!({"podSelector": {"matchLabels": {"pod": "a"}}, "ingress": [{"from": [
            {"namespaceSelector": {"matchLabels": {"ns": "y"}}, "podSelector": {"matchLabels": {"pod": "b"}}},
            {"namespaceSelector": {}, "podSelector": {"matchExpressions": [{"key": "pod", "operator": "In", "values": ["c"]}]}}],
            "ports": [{"protocol": "TCP", "port": 80, "endPort": 81}]}]}),
        )],
    );

    let y_b = node.pod("y/b");
    assert_enforced(
        &node,
        "ipBlock with except, both families",
        &[policy(
            "x",
            "cidr",
            json!({"podSelector": {}, "ingress": [{"from": [
            {"ipBlock": {"cidr": "10.244.0.0/16", "except": [format!("{}/32", y_b.ip(false))]}},
            {"ipBlock": {"cidr": "fd00:10:244::/48", "except": [format!("{}/128", y_b.ip(true))]}}]}]}),
        )],
    );

    assert_enforced(
        &node,
        "egress: y reaches x on UDP only, z on TCP 81 only; policies add up",
        &[
            policy(
                "y",
                "to-x-udp",
                json!({"podSelector": {}, "policyTypes": ["Egress"], "egress": [{"to": [{"namespaceSelector": {"matchLabels": {"ns": "x"}}}], "ports": [{"protocol": "UDP"}]}]}),
            ),
            policy(
                "y",
                "to-z-81",
                json!({"podSelector": {}, "policyTypes": ["Egress"], "egress": [{"to": [{"namespaceSelector": {"matchLabels": {"ns": "z"}}}], "ports": [{"port": "serve-81-tcp"}]}]}),
            ),
            policy(
                "z",
                "c-deny-all",
                json!({"podSelector": {"matchLabels": {"pod": "c"}}, "policyTypes": ["Ingress", "Egress"]}),
            ),
        ],
    );
}

/// A flow probed with new connections in a loop: how many reached and how many did not.
struct Hammer {
    reached: AtomicUsize,
    missed: AtomicUsize,
}

impl Hammer {
    fn new() -> Hammer {
        Hammer { reached: AtomicUsize::new(0), missed: AtomicUsize::new(0) }
    }

    fn run(&self, node: &PolicyNode, src: &str, dst: &str, stop: &AtomicBool) {
        let (from, to) = (&node.pod(src).netns, SocketAddr::new(node.pod(dst).ip(false), 80));
        while !stop.load(Ordering::Relaxed) {
            let counter =
                if reaches(from, to, Proto::Tcp, Duration::from_millis(1500)) { &self.reached } else { &self.missed };
            counter.fetch_add(1, Ordering::Relaxed);
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn counts(&self) -> (usize, usize) {
        (self.reached.load(Ordering::Relaxed), self.missed.load(Ordering::Relaxed))
    }
}

/// `nft list ruleset` in the node.
fn ruleset(node: &PolicyNode) -> String {
    let out = node.kubenet.node.exec("nft", &["list", "ruleset"], &[], b"");
    assert!(out.status.success(), "nft list ruleset: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The ruleset without the agent's table.
fn without_agent_table(ruleset: &str) -> String {
    let mut out = String::new();
    let mut inside = false;
    for line in ruleset.lines() {
        if line.starts_with("table inet cni-netpol ") {
            inside = true;
        } else if inside && line == "}" {
            inside = false;
        } else if !inside {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

#[test]
fn changes_while_traffic_runs() {
    if !netns_tests::require("nft", netns_tests::on_path("nft"), "apt-get install nftables") {
        return;
    }
    let node = PolicyNode::new();
    // A kube-proxy-like table that must outlive the agent.
    let kube_proxy = "table ip kube-proxy {\n chain forward { type filter hook forward priority -110; }\n}\n";
    let out = node.kubenet.node.exec("nft", &["-f", "-"], &[], kube_proxy.as_bytes());
    assert!(out.status.success());
    let only_y_a = policy(
        "x",
        "a-from-y-a",
        json!({"podSelector": {"matchLabels": {"pod": "a"}},
        "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}, "podSelector": {"matchLabels": {"pod": "a"}}}]}]}),
    );
    node.write_cluster(&node.cluster(&[], std::slice::from_ref(&only_y_a)));
    let mut agent = node.start_agent();
    netns_tests::wait_for(Duration::from_secs(10), || node.applied() > 0).expect("the agent's first table");

    let (allowed, denied, stop) = (Hammer::new(), Hammer::new(), AtomicBool::new(false));
    std::thread::scope(|scope| {
        scope.spawn(|| allowed.run(&node, "y/a", "x/a", &stop));
        scope.spawn(|| denied.run(&node, "y/b", "x/a", &stop));
        let mut latencies = Vec::new();
        for round in 0..6 {
            // A policy elsewhere comes and goes: the whole table is replaced, atomically.
            let other = policy("z", &format!("deny-{round}"), json!({"podSelector": {"matchLabels": {"pod": "c"}}}));
            let started = Instant::now();
            node.apply(&node.cluster(&[], &[only_y_a.clone(), other]));
            latencies.push(started.elapsed());
            // y/c takes the label of y/a (and gives it back): set elements only.
            let mut cluster = node.cluster(&[], std::slice::from_ref(&only_y_a));
            cluster["pods"][5]["metadata"]["labels"]["pod"] = json!("a");
            node.apply(&cluster);
            node.apply(&node.cluster(&[], std::slice::from_ref(&only_y_a)));
        }
        // The agent killed: the rules stay; started again: the table replaced in one transaction.
        agent.stop(nix::sys::signal::Signal::SIGKILL);
        std::thread::sleep(Duration::from_millis(500));
        let before = node.applied();
        agent = node.start_agent();
        netns_tests::wait_for(Duration::from_secs(10), || node.applied() > before)
            .expect("the restarted agent's table");
        std::thread::sleep(Duration::from_millis(500));
        stop.store(true, Ordering::Relaxed);
        eprintln!("apply latencies (file written to the agent's log line): {latencies:?}");
    });
    eprintln!("allowed flow (reached, missed): {:?}; denied flow: {:?}", allowed.counts(), denied.counts());
    let (reached, missed) = allowed.counts();
    assert!(reached > 20 && missed == 0, "the allowed flow: {reached} reached, {missed} missed\n{}", node.log());
    let (reached, missed) = denied.counts();
    assert!(missed > 0 && reached == 0, "the denied flow: {reached} reached, {missed} missed\n{}", node.log());
    assert!(node.log().contains("Elements("), "label changes are element changes:\n{}", node.log());
    assert!(node.log().contains("Rules("), "policy changes rewrite the policy chains:\n{}", node.log());

    // Someone deletes the table: the agent puts it back whole.
    let out = node.kubenet.node.exec("nft", &["delete", "table", "inet", "cni-netpol"], &[], b"");
    assert!(out.status.success());
    let back = netns_tests::wait_for(Duration::from_secs(10), || ruleset(&node).contains("table inet cni-netpol"));
    assert!(back.is_some() && node.log().contains("is gone"), "not repaired:\n{}", node.log());
    let y_b = &node.pod("y/b").netns;
    assert!(!reaches(y_b, SocketAddr::new(node.pod("x/a").ip(false), 80), Proto::Tcp, Duration::from_millis(700)));

    // A pod the agent has not been told of is unreachable both ways; once it is, it is open (no policy
    // selects it).
    let newcomer = node.add_pod("x", "d");
    let y_a = &node.pod("y/a").netns;
    for v6 in [false, true] {
        assert!(!reaches(y_a, SocketAddr::new(newcomer.ip(v6), 80), Proto::Tcp, Duration::from_millis(700)));
        assert!(!reaches(
            &newcomer.netns,
            SocketAddr::new(node.pod("y/a").ip(v6), 80),
            Proto::Udp,
            Duration::from_millis(700)
        ));
    }
    node.apply(&node.cluster(&[&newcomer], std::slice::from_ref(&only_y_a)));
    for v6 in [false, true] {
        assert!(reaches(y_a, SocketAddr::new(newcomer.ip(v6), 80), Proto::Tcp, Duration::from_secs(2)));
        assert!(reaches(
            &newcomer.netns,
            SocketAddr::new(node.pod("y/a").ip(v6), 80),
            Proto::Udp,
            Duration::from_secs(2)
        ));
    }

    // Cleanup: the agent's table goes, nothing else changes.
    agent.stop(nix::sys::signal::Signal::SIGKILL);
    let before = ruleset(&node);
    assert!(before.contains("table inet cni-netpol"));
    let out = node.kubenet.node.exec(bin("cni-netpol"), &["cleanup"], &[], b"");
    assert!(out.status.success(), "cleanup: {}", String::from_utf8_lossy(&out.stderr));
    let after = ruleset(&node);
    assert_eq!(after, without_agent_table(&before), "cleanup changed more than the agent's table");
    assert!(after.contains("table ip kube-proxy"));
    let again = node.kubenet.node.exec(bin("cni-netpol"), &["cleanup"], &[], b"");
    assert!(again.status.success(), "a second cleanup finds nothing to do");
}

#[test]
fn across_nodes() {
    use netns_tests::kubenet::{SUBNET_V4, SUBNET_V4_B, SUBNET_V6, SUBNET_V6_B};
    let (mut a, mut b) = (PolicyNode::empty(false), PolicyNode::empty(true));
    let underlay = [["192.168.80.1/24", "fd00:80::1/64"], ["192.168.80.2/24", "fd00:80::2/64"]];
    let nets = |n: usize| underlay[n].map(|t| t.parse().unwrap());
    netns_tests::veth_between(&a.kubenet.node, &b.kubenet.node, "und0", "und1", &nets(0), &nets(1));
    for (node, subnets, via) in [
        (&a, [SUBNET_V4_B, SUBNET_V6_B], ["192.168.80.2", "fd00:80::2"]),
        (&b, [SUBNET_V4, SUBNET_V6], ["192.168.80.1", "fd00:80::1"]),
    ] {
        node.kubenet.node.ip(&["route", "add", subnets[0], "via", via[0]]);
        node.kubenet.node.ip(&["-6", "route", "add", subnets[1], "via", via[1]]);
        for sysctl in ["net/ipv4/ip_forward", "net/ipv6/conf/all/forwarding"] {
            node.kubenet.node.run(|| cnicore::sysctl::write(sysctl, "1")).unwrap();
        }
    }
    let host_port = json!({"portMappings": [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}]});
    a.pods.push(a.add_pod_with("x", "a", &host_port));
    b.pods.push(b.add_pod("y", "b"));
    b.pods.push(b.add_pod("z", "c"));
    let pods: Vec<Value> = a.pods.iter().chain(&b.pods).map(|p| p.json()).collect();
    let policies = [
        policy(
            "x",
            "a-from-y",
            json!({"podSelector": {}, "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}}], "ports": [{"port": 80}]}]}),
        ),
        policy(
            "y",
            "b-to-x-tcp",
            json!({"podSelector": {}, "policyTypes": ["Egress"], "egress": [{"to": [{"namespaceSelector": {"matchLabels": {"ns": "x"}}}], "ports": [{"protocol": "TCP"}]}]}),
        ),
    ];
    let cluster = json!({"namespaces": netns_tests::netpol::namespaces_json(), "pods": pods, "policies": policies});
    let mut agents = Vec::new();
    for node in [&a, &b] {
        node.write_cluster(&cluster);
        agents.push(node.start_agent());
        netns_tests::wait_for(Duration::from_secs(10), || node.applied() > 0).expect("the agent's first table");
    }
    let (x_a, y_b, z_c) = (&a.pods[0], &b.pods[0], &b.pods[1]);
    let wait = Duration::from_millis(700);
    for v6 in [false, true] {
        let to = |port| SocketAddr::new(x_a.ip(v6), port);
        assert!(reaches(&y_b.netns, to(80), Proto::Tcp, Duration::from_secs(2)), "y/b -> x/a TCP 80 (v6 {v6})");
        assert!(!reaches(&y_b.netns, to(81), Proto::Tcp, wait), "x/a's ingress allows 80 only (v6 {v6})");
        assert!(!reaches(&y_b.netns, to(80), Proto::Udp, wait), "y/b's egress allows TCP only (v6 {v6})");
        assert!(!reaches(&z_c.netns, to(80), Proto::Tcp, wait), "z is not a peer of x/a (v6 {v6})");
        assert!(
            reaches(&x_a.netns, SocketAddr::new(z_c.ip(v6), 81), Proto::Udp, Duration::from_secs(2)),
            "z/c is open"
        );
    }
    // From outside through x/a's hostPort (portmap's DNAT on node A, then forward): node B's own address is
    // no peer of x/a; once an ipBlock names the underlay, it is.
    let outside = SocketAddr::new("192.168.80.1".parse().unwrap(), 8080);
    assert!(!reaches(&b.kubenet.node, outside, Proto::Tcp, wait), "the underlay is no peer of x/a");
    let mut with_block = cluster.clone();
    with_block["policies"].as_array_mut().unwrap().push(policy(
        "x",
        "from-underlay",
        json!({"podSelector": {}, "ingress": [{"from": [{"ipBlock": {"cidr": "192.168.80.0/24"}}]}]}),
    ));
    for node in [&a, &b] {
        node.apply(&with_block);
    }
    assert!(reaches(&b.kubenet.node, outside, Proto::Tcp, Duration::from_secs(2)), "the ipBlock lets it in");
    for node in [&a, &b] {
        node.apply(&cluster);
    }
    // Each judgement is made on both nodes: with only the source's agent, the destination's policy still
    // holds (the source node judges the remote pod's ingress too), and the other way round.
    agents.clear();
    a.kubenet.node.exec(bin("cni-netpol"), &["cleanup"], &[], b"");
    assert!(!reaches(&z_c.netns, SocketAddr::new(x_a.ip(false), 80), Proto::Tcp, wait), "judged on node B");
    b.kubenet.node.exec(bin("cni-netpol"), &["cleanup"], &[], b"");
    assert!(
        reaches(&z_c.netns, SocketAddr::new(x_a.ip(false), 80), Proto::Tcp, Duration::from_secs(2)),
        "both cleaned"
    );
}

/// Kubernetes: traffic between a pod and its own node is always allowed (the kubelet's probes). The agent
/// judges the forward hook only; the node's own connections to its pods leave through output (and their
/// replies come in through input), and a pod's connections to its node end in input: neither is judged.
#[test]
fn the_node_reaches_its_pods_under_default_deny() {
    let mut node = PolicyNode::empty(false);
    for (namespace, name) in [("x", "a"), ("y", "a")] {
        let pod = node.add_pod(namespace, name);
        node.pods.push(pod);
    }
    // A host-network server of the node (the kubelet's port, say), on cbr0's gateway addresses.
    let kubelet = netns_tests::traffic::TcpServer::start(&node.kubenet.node, 10250, |_| "ok".to_string());
    let deny_all = policy("x", "deny-all", json!({"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}));
    node.write_cluster(&node.cluster(&[], std::slice::from_ref(&deny_all)));
    let _agent = node.start_agent();
    netns_tests::wait_for(Duration::from_secs(10), || node.applied() > 0).expect("the agent's first table");

    let (x_a, y_a) = (node.pod("x/a"), node.pod("y/a"));
    let wait = Duration::from_millis(700);
    for v6 in [false, true] {
        for proto in Proto::ALL {
            let to = SocketAddr::new(x_a.ip(v6), 80);
            assert!(
                reaches(&node.kubenet.node, to, proto, Duration::from_secs(2)),
                "the node -> x/a {proto:?} (v6 {v6})"
            );
            assert!(!reaches(&y_a.netns, to, proto, wait), "y/a -> x/a {proto:?} is denied (v6 {v6})");
            let back = SocketAddr::new(y_a.ip(v6), 80);
            assert!(!reaches(&x_a.netns, back, proto, wait), "x/a -> y/a {proto:?}: egress denied (v6 {v6})");
        }
        // x/a, isolated for egress, still reaches its node's own server (the gateway address on cbr0).
        let gateway = node.kubenet.node.ip_json(&["addr", "show", "cbr0"]);
        let family = if v6 { "inet6" } else { "inet" };
        let local = gateway[0]["addr_info"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["family"] == family && a["scope"] == "global")
            .and_then(|a| a["local"].as_str())
            .expect("cbr0's gateway address")
            .parse()
            .unwrap();
        assert!(
            reaches(&x_a.netns, SocketAddr::new(local, 10250), Proto::Tcp, Duration::from_secs(2)),
            "x/a -> its node (v6 {v6})"
        );
    }
    drop(kubelet);
}

/// `--metrics-addr`: `/readyz` and `/healthz` 200 once the first view is in force; `/metrics` in the
/// Prometheus text format, its sizes those of the compiled plan, its transactions counted by what they
/// changed; a second agent on the same address stops at start and says why, the node unchanged.
#[test]
fn metrics_and_health_endpoints() {
    if !netns_tests::require("nft", netns_tests::on_path("nft"), "apt-get install nftables") {
        return;
    }
    let mut node = PolicyNode::empty(false);
    let pod = node.add_pod("x", "a");
    node.pods.push(pod);
    node.write_cluster(&node.cluster(&[], &[]));
    let address = SocketAddr::from(([127, 0, 0, 1], 9798));
    let file = node.cluster_file.display().to_string();
    // The drop log as the agent is told it, so the plan judged below has the agent's log rules.
    let drop_log = netpol::plan::DropLog { group: 100, rate: 10, burst: 20 };
    let _agent = node.start_agent_with(&[
        "--metrics-addr",
        "127.0.0.1:9798",
        "run",
        "--static",
        &file,
        "--drop-log-group=100",
        "--drop-log-rate=10",
        "--drop-log-burst=20",
    ]);
    let ns = &node.kubenet.node;
    let ready = netns_tests::wait_for(Duration::from_secs(10), || http_get(ns, address, "/readyz").is_ok());
    assert!(ready.is_some(), "/readyz: {:?}\n{}", http_get(ns, address, "/readyz"), node.log());
    assert_eq!(http_get(ns, address, "/healthz").unwrap(), "ok\n");
    assert!(http_get(ns, address, "/nothing").unwrap_err().contains("404"));

    let in_force = |cluster: &Value| {
        let pod_cidrs = node.pod_cidrs.iter().map(|c| c.parse().unwrap()).collect();
        let options = NodeOptions { pod_cidrs, drop_log: Some(drop_log) };
        let plan = compile(&serde_json::from_value::<Cluster>(cluster.clone()).unwrap(), &options);
        let (rules, elements) = plan.size();
        let scrape = scrape(ns, address);
        let value = |name: &str| sample(&scrape, name, &[]).unwrap_or(-1.0);
        assert_eq!(value("cni_netpol_rules"), rules as f64, "{scrape:?}");
        assert_eq!(value("cni_netpol_sets"), plan.sets.len() as f64, "{scrape:?}");
        assert_eq!(value("cni_netpol_set_elements"), elements as f64, "{scrape:?}");
        assert!(value("cni_netpol_last_apply_timestamp_seconds") > 1.7e9, "{scrape:?}");
        let transactions = ["replaced", "rules", "elements"]
            .map(|result| sample(&scrape, "cni_netpol_transactions_total", &[("result", result)]).unwrap_or(0.0));
        assert_eq!(value("cni_netpol_transaction_duration_seconds_count"), transactions.iter().sum::<f64>());
        transactions
    };
    assert_eq!(in_force(&node.cluster(&[], &[])), [1.0, 0.0, 0.0], "the table written at start");
    let isolated = node.cluster(&[], &[policy("x", "deny", json!({"podSelector": {"matchLabels": {"pod": "a"}}}))]);
    node.apply(&isolated);
    assert_eq!(in_force(&isolated), [1.0, 1.0, 0.0], "a policy: the policy chains written again");
    let mut relabelled = isolated.clone();
    relabelled["pods"][0]["metadata"]["labels"]["pod"] = json!("b");
    node.apply(&relabelled);
    assert_eq!(in_force(&relabelled), [1.0, 1.0, 1.0], "a label: set elements");

    let ruleset = node.kubenet.node.exec("nft", &["list", "ruleset"], &[], b"").stdout;
    let second = node
        .kubenet
        .node
        .command(bin("cni-netpol"))
        .args(["--metrics-addr", "127.0.0.1:9798", "--table", "second", "run", "--static", &file, "--once"])
        .output()
        .expect("cni-netpol");
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(!second.status.success(), "{stderr}");
    let said = "cni-netpol: --metrics-addr: cannot listen on 127.0.0.1:9798: Address already in use";
    assert!(stderr.starts_with(said), "{stderr}");
    assert_eq!(node.kubenet.node.exec("nft", &["list", "ruleset"], &[], b"").stdout, ruleset, "nothing changed");
}

/// As kube-router does, a policy the kernel refuses is skipped with its pods failed closed: the agent (a test
/// build, `CNI_FAILPOINT=netpol/kernel-refuses:x/allow-b` adding to that policy's rules one the kernel refuses)
/// puts it in force allowing nothing, says so once, counts it, and applies every other policy and every later
/// change; once the policy is deleted, the pods it isolated are reachable again.
#[test]
fn a_policy_the_kernel_refuses_fails_closed() {
    let mut node = PolicyNode::empty(false);
    for (namespace, name) in [("x", "a"), ("x", "b"), ("y", "a")] {
        let pod = node.add_pod(namespace, name);
        node.pods.push(pod);
    }
    let refused = policy(
        "x",
        "allow-b",
        json!({"podSelector": {"matchLabels": {"pod": "a"}}, "ingress": [{"from": [{"podSelector": {"matchLabels": {"pod": "b"}}}]}]}),
    );
    let deny_y = policy("y", "deny-all", json!({"podSelector": {}}));
    node.write_cluster(&node.cluster(&[], &[refused.clone(), deny_y.clone()]));
    let file = node.cluster_file.display().to_string();
    let metrics = SocketAddr::from(([127, 0, 0, 1], 9797));
    let args = ["--metrics-addr", "127.0.0.1:9797", "run", "--static", &file, "--interval-ms", "50"];
    let _agent = node.start_agent_with_env(&[("CNI_FAILPOINT", "netpol/kernel-refuses:x/allow-b")], &args);
    netns_tests::wait_for(Duration::from_secs(10), || node.applied() > 0).expect("the agent's first table");

    let (x_a, x_b, y_a) = (node.pod("x/a"), node.pod("x/b"), node.pod("y/a"));
    let (wait, long) = (Duration::from_millis(700), Duration::from_secs(2));
    let ns = &node.kubenet.node;
    let refused_count = || sample(&scrape(ns, metrics), "cni_netpol_refused_policies", &[]);
    for v6 in [false, true] {
        let (to_x_a, to_y_a) = (SocketAddr::new(x_a.ip(v6), 80), SocketAddr::new(y_a.ip(v6), 80));
        assert!(!reaches(&x_b.netns, to_x_a, Proto::Tcp, wait), "x/b -> x/a: failed closed (v6 {v6})\n{}", node.log());
        assert!(!reaches(&x_b.netns, to_y_a, Proto::Tcp, wait), "x/b -> y/a: the other policy in force (v6 {v6})");
        assert!(reaches(&y_a.netns, SocketAddr::new(x_b.ip(v6), 80), Proto::Tcp, long), "y/a -> x/b (v6 {v6})");
    }
    let said = "policy x/allow-b: the kernel refuses its rules";
    assert_eq!(node.log().matches(said).count(), 1, "{}", node.log());
    assert_eq!(refused_count(), Some(1.0));

    // A later change is not held back: y's isolation lifted while x/allow-b stays refused.
    node.apply(&node.cluster(&[], std::slice::from_ref(&refused)));
    for v6 in [false, true] {
        let to_y_a = SocketAddr::new(y_a.ip(v6), 80);
        assert!(reaches(&x_b.netns, to_y_a, Proto::Tcp, long), "x/b -> y/a after the change (v6 {v6})\n{}", node.log());
        assert!(!reaches(&x_b.netns, SocketAddr::new(x_a.ip(v6), 80), Proto::Tcp, wait), "x/b -> x/a (v6 {v6})");
    }
    assert_eq!(node.log().matches(said).count(), 1, "remembered, not found again:\n{}", node.log());

    // Deleted, the policy isolates nothing.
    node.apply(&node.cluster(&[], &[]));
    for v6 in [false, true] {
        let to_x_a = SocketAddr::new(x_a.ip(v6), 80);
        assert!(reaches(&x_b.netns, to_x_a, Proto::Tcp, long), "x/b -> x/a once deleted (v6 {v6})\n{}", node.log());
    }
    assert_eq!(refused_count(), Some(0.0));
}
