//! The figures of fabricd in Kubernetes mode (issue 36), against a real kube-apiserver v1.28 with its etcd in
//! an infra namespace; ignored by the test suite (measurements, not tests). Prints a markdown table.
//!
//! - cold start at N = 100 and 1,000 peers (`CNI_BENCH_NODES=100,1000,5000` for others): N Node objects with podCIDRs and flannel's annotations already in
//!   the API server (made with one `kubectl create -f -`) -> one agent started -> N routes, neighbours and FDB
//!   entries programmed (netlink read every 10 ms); the agent's CPU time until then and its RSS right after;
//! - a Node's podCIDR to routes: one more Node created (clock started before kubectl is spawned, so its start
//!   is included) -> its route on the agent; and on a second agent;
//! - the watch idle with N Nodes: the agent's RSS and CPU over 30 s; kube-apiserver's RSS.

use std::time::{Duration, Instant};

use cnicore::netlink::{IpFamily, RT_TABLE_MAIN};
use netns_tests::fabric::{segment_ip, wait_for, Cluster};
use netns_tests::kubeapi::*;
use netns_tests::{json, Value};

const PREFIX: &str = "flannel.alpha.coreos.com";
const IDLE: Duration = Duration::from_secs(30);

/// Peer `i`: its Node as flanneld would have annotated it (vxlan, a public address outside the pod network).
fn peer_node(i: u32) -> (Value, ipnet::IpNet) {
    let cidr: ipnet::IpNet = format!("10.{}.{}.0/24", 1 + i / 256, i % 256).parse().unwrap();
    let (a, b) = (16 + i / 250, 1 + i % 250);
    let node = json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": { "name": format!("peer-{i}"), "annotations": {
            format!("{PREFIX}/kube-subnet-manager"): "true",
            format!("{PREFIX}/backend-type"): "vxlan",
            format!("{PREFIX}/public-ip"): format!("172.{a}.0.{b}"),
            format!("{PREFIX}/backend-data"): format!(r#"{{"VNI":1,"VtepMAC":"0e:fa:ac:{a:02x}:00:{b:02x}"}}"#),
        }},
        "spec": { "podCIDR": cidr.to_string(), "podCIDRs": [cidr.to_string()] },
    });
    (node, cidr)
}

fn our_routes(nl: &mut cnicore::netlink::Netlink) -> Vec<ipnet::IpNet> {
    let routes = nl.routes(IpFamily::V4, RT_TABLE_MAIN).unwrap();
    routes.into_iter().filter(|r| r.protocol == Some(75)).map(|r| r.dst).collect()
}

fn proc_field(pid: u32, key: &str) -> String {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    text.lines().find_map(|l| l.strip_prefix(key).map(|v| v.trim().to_string())).unwrap_or_default()
}

/// utime + stime of `pid`, in seconds (USER_HZ = 100).
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<u64> =
        stat.rsplit(')').next().unwrap_or("").split_whitespace().filter_map(|f| f.parse().ok()).collect();
    (fields.get(10).copied().unwrap_or(0) + fields.get(11).copied().unwrap_or(0)) as f64 / 100.0
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

/// The figures at `peers` Nodes: rows of (figure, value).
fn figures(peers: u32) -> Vec<(String, String)> {
    let mut cluster = Cluster::new(1);
    let api = KubeApi::start(&cluster.infra, segment_ip(0, 254), &cluster.dir);
    let items: Vec<Value> = (0..peers).map(|i| peer_node(i).0).collect();
    let list = json!({ "apiVersion": "v1", "kind": "List", "items": items }).to_string();
    let out = api.kubectl(&cluster.infra, &["create", "-f", "-", "-o", "name"], list.as_bytes());
    assert!(out.status.success(), "kubectl create: {}", String::from_utf8_lossy(&out.stderr));
    let net_conf = cluster.dir.join("net-conf.json");
    std::fs::write(&net_conf, r#"{"Network":"10.0.0.0/8","Backend":{"Type":"vxlan"}}"#).unwrap();
    let kubeconfig = api.kubeconfig("flannel", FLANNEL_TOKEN);
    for (i, cidr) in ["10.200.0.0/24", "10.200.1.0/24"].iter().enumerate() {
        let name = format!("node-{i}");
        api.create_node(&cluster.infra, &name, &[cidr]);
        let args = [
            "--kube-subnet-mgr".to_string(),
            format!("--kubeconfig-file={}", kubeconfig.display()),
            format!("--net-config-path={}", net_conf.display()),
        ];
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let index = cluster.add_node(0, &args);
        cluster.nodes[index].env.push(("NODE_NAME".into(), name));
    }
    // Cold start of node-0 with every peer already there.
    let mut nl = cluster.nodes[0].node.netlink();
    let start = Instant::now();
    cluster.nodes[0].start();
    let done = wait_for(Duration::from_secs(120), || {
        if our_routes(&mut nl).len() < peers as usize {
            return false;
        }
        let Ok(Some(link)) = nl.link_by_name("flannel.1") else { return false };
        let neighbours = nl.neighbours(IpFamily::V4, Some(link.index)).unwrap().len();
        let fdb = nl.fdb(link.index).unwrap().iter().filter(|e| e.dst.is_some()).count();
        neighbours >= peers as usize && fdb >= peers as usize
    });
    assert!(done.is_some(), "cold start with {peers} Nodes did not converge: {}", cluster.nodes[0].log());
    let cold = start.elapsed();
    let pid = cluster.nodes[0].agent.as_ref().unwrap().id();
    let cold_cpu = cpu_seconds(pid);
    let cold_rss = proc_field(pid, "VmRSS:");
    cluster.nodes[1].start();
    cluster.nodes[1].wait_ready(Duration::from_secs(60));
    let mut nl1 = cluster.nodes[1].node.netlink();
    wait_for(Duration::from_secs(60), || our_routes(&mut nl1).len() > peers as usize);
    // One more Node: podCIDR (and annotations) written -> its route on both agents.
    let (mut joins, mut after_kubectl) = (Vec::new(), Vec::new());
    for j in 0..5 {
        let (node, cidr) = peer_node(peers + j);
        let start = Instant::now();
        let out = api.kubectl(&cluster.infra, &["create", "-f", "-", "-o", "name"], node.to_string().as_bytes());
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let created = Instant::now();
        let seen = wait_for(Duration::from_secs(10), || {
            our_routes(&mut nl).contains(&cidr) && our_routes(&mut nl1).contains(&cidr)
        });
        assert!(seen.is_some(), "join {j} not seen");
        joins.push(start.elapsed());
        after_kubectl.push(created.elapsed());
    }
    joins.sort();
    after_kubectl.sort();
    std::thread::sleep(Duration::from_secs(2));
    let before = cpu_seconds(pid);
    std::thread::sleep(IDLE);
    let idle_cpu = (cpu_seconds(pid) - before) / IDLE.as_secs_f64() * 100.0;
    let idle_rss = format!("{} (peak {})", proc_field(pid, "VmRSS:"), proc_field(pid, "VmHWM:"));
    let apiserver_rss = proc_field(api.apiserver_pid(), "VmRSS:");
    vec![
        (
            "cold start: N Nodes in the API server -> N routes + neighbours + FDB entries (agent start to done)".into(),
            ms(cold),
        ),
        ("agent CPU time for that cold start (user + system)".into(), format!("{:.0} ms", cold_cpu * 1e3)),
        ("agent RSS right after the cold start".into(), cold_rss),
        ("a Node created (kubectl's start included) -> its route on both agents, median of 5".into(), ms(joins[2])),
        ("the same, slowest of 5".into(), ms(joins[4])),
        ("the same from kubectl's exit (the Node stored), median of 5".into(), ms(after_kubectl[2])),
        ("agent RSS, idle watching N Nodes (peak)".into(), idle_rss),
        (format!("agent CPU, idle (over {} s)", IDLE.as_secs()), format!("{idle_cpu:.2} % of one core")),
        ("kube-apiserver's RSS with N Nodes, 2 agents watching".into(), apiserver_rss),
    ]
}

#[test]
#[ignore]
fn kube_figures() {
    if !require_apiserver() {
        return;
    }
    let sizes: Vec<u32> = std::env::var("CNI_BENCH_NODES")
        .unwrap_or_else(|_| "100,1000".into())
        .split(',')
        .map(|n| n.trim().parse().expect("CNI_BENCH_NODES: a comma-separated list of Node counts"))
        .collect();
    let columns: Vec<Vec<(String, String)>> = sizes.iter().map(|n| figures(*n)).collect();
    let header: Vec<String> = sizes.iter().map(|n| format!("N = {n} Nodes")).collect();
    println!("| figure | {} |\n|{}", header.join(" | "), " --- |".repeat(sizes.len() + 1));
    for (row, (figure, _)) in columns[0].iter().enumerate() {
        let values: Vec<&str> = columns.iter().map(|column| column[row].1.as_str()).collect();
        println!("| {figure} | {} |", values.join(" | "));
    }
}
