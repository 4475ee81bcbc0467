//! The NetworkPolicy agent watching a real kube-apiserver (issue 37): the kubenet node of `netpol.rs` with
//! the suite's nine pods, their Pod objects (status written with the addresses the CNI gave them, as a
//! kubelet would), Namespaces and NetworkPolicies created through the API, and `cni-netpol watch` in the node.
//!
//! Policies created, changed and deleted through the API are enforced (the whole truth table checked against
//! the plan of what the API lists); a Pod's labels patched move it between sets; kube-apiserver killed: the
//! rules stay in force and the agent says so; restarted: later changes are enforced again.
//!
//! `relists_after_410_gone`: kube-apiserver restarted while etcd moves on (a policy deleted in etcd itself while
//! the server is down, then etcd compacted, as fabric_kube.rs forces fabricd's 410 with the compaction added:
//! without it the server replays the deletion from etcd): the agent's watches are answered 410 Gone, it
//! lists again, and the rules follow the deletion made in the gap; the table is there at every moment (listed
//! every 20 ms throughout) and the change is a rule change, not a replaced table; `/metrics` counts the relist
//! and times each change from its API event to the kernel.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use netns_tests::daemon::{sample, scrape};
use netns_tests::kubeapi::{self, KubeApi, ADMIN_TOKEN};
use netns_tests::netpol::{policy, PolicyNode, Probe, Proto};
use netns_tests::{json, veth_between, TestNetns, Value};
use netpol::compile::{compile, NodeOptions};
use netpol::model::Cluster;
use netpol::plan::Packet;

const API_IP: Ipv4Addr = Ipv4Addr::new(192, 168, 91, 2);
/// The agent's `--metrics-addr`, in the node.
const METRICS: &str = "127.0.0.1:9798";

struct Rig {
    node: PolicyNode,
    infra: TestNetns,
    api: KubeApi,
}

impl Rig {
    /// The agent watching the API server as admin, once it has written its first table.
    fn watching_agent(&mut self) -> netns_tests::Daemon {
        let kubeconfig = self.api.kubeconfig("admin", ADMIN_TOKEN).display().to_string();
        let args = ["--metrics-addr", METRICS, "watch", "--kubeconfig", &kubeconfig, "--repair-ms", "1000"];
        let agent = self.node.start_agent_with(&args);
        let first = netns_tests::wait_for(Duration::from_secs(30), || self.node.applied() > 0);
        assert!(first.is_some(), "the agent's first table:\n{}", self.node.log());
        agent
    }

    fn new() -> Rig {
        let node = PolicyNode::new();
        let infra = TestNetns::new("npapi");
        veth_between(
            &node.kubenet.node,
            &infra,
            "api0",
            "api1",
            &["192.168.91.1/24".parse().unwrap()],
            &[format!("{API_IP}/24").parse().unwrap()],
        );
        let api = KubeApi::start(&infra, API_IP, node.kubenet.node.dir());
        let rig = Rig { node, infra, api };
        for ns in netns_tests::netpol::NAMESPACES {
            rig.api.create_namespace(&rig.infra, &json!({"metadata": {"name": ns, "labels": {"ns": ns}}}));
        }
        for pod in &rig.node.pods {
            let mut object = pod.json();
            let mut status = object["status"].take();
            status["podIP"] = status["podIPs"][0]["ip"].clone();
            object["spec"]["containers"][0]["image"] = json!("registry.k8s.io/pause:3.9");
            rig.api.create(&rig.infra, &format!("/api/v1/namespaces/{}/pods", pod.namespace), &object);
            let path = format!("/api/v1/namespaces/{}/pods/{}/status", pod.namespace, pod.name);
            rig.api.patch(&rig.infra, &path, &json!({"status": status}));
        }
        rig
    }

    /// The cluster as the API lists it.
    fn listed(&self) -> Value {
        json!({
            "namespaces": self.api.list(&self.infra, "/api/v1/namespaces"),
            "pods": self.api.list(&self.infra, "/api/v1/pods"),
            "policies": self.api.list(&self.infra, "/apis/networking.k8s.io/v1/networkpolicies"),
        })
    }

    /// Waits for one more transaction of the agent after `change`.
    fn applied_after(&self, change: impl FnOnce()) {
        let before = self.node.applied();
        change();
        let done = netns_tests::wait_for(Duration::from_secs(60), || self.node.applied() > before);
        assert!(done.is_some(), "the agent applied nothing:\n{}", self.node.log());
    }

    /// Every probe against the plan of what the API lists.
    fn assert_enforced(&self, what: &str) -> BTreeMap<Probe, bool> {
        let cluster: Cluster = serde_json::from_value(self.listed()).unwrap();
        let plan = compile(&cluster, &NodeOptions::default());
        let got = self.node.probe_all();
        let wrong: Vec<String> = got
            .iter()
            .filter(|(probe, reached)| {
                let (src, dst) = (self.node.pod(&probe.src).ip(probe.v6), self.node.pod(&probe.dst).ip(probe.v6));
                plan.judges(&Packet::new(src, dst, probe.proto.number(), probe.port)) != **reached
            })
            .map(|(probe, reached)| format!("{probe:?}: reached {reached}"))
            .collect();
        assert!(wrong.is_empty(), "{what}: {} probes wrong:\n  {}", wrong.len(), wrong.join("\n  "));
        got
    }
}

#[test]
fn watches_the_api_server() {
    if !kubeapi::require_apiserver() {
        return;
    }
    let mut rig = Rig::new();
    let _agent = rig.watching_agent();
    let open = rig.assert_enforced("no policy");
    assert!(open.values().all(|&r| r));

    let policies = "/apis/networking.k8s.io/v1/namespaces/x/networkpolicies";
    rig.applied_after(|| rig.api.create(&rig.infra, policies, &policy("x", "deny", json!({"podSelector": {}}))));
    let table = rig.assert_enforced("default deny in x");
    assert!(table.iter().all(|(p, &r)| r != p.dst.starts_with("x/")));

    let from_y = policy(
        "x",
        "a-from-y",
        json!({"podSelector": {"matchLabels": {"pod": "a"}},
        "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}, "podSelector": {"matchLabels": {"pod": "b"}}}], "ports": [{"port": "serve-81-udp", "protocol": "UDP"}]}]}),
    );
    rig.applied_after(|| rig.api.create(&rig.infra, policies, &from_y));
    rig.assert_enforced("x/a from y/b on a named UDP port");

    // y/c takes the label pod=b: it joins the peer set (an element change).
    rig.applied_after(|| {
        rig.api.patch(&rig.infra, "/api/v1/namespaces/y/pods/c", &json!({"metadata": {"labels": {"pod": "b"}}}))
    });
    let table = rig.assert_enforced("y/c labelled pod=b");
    let probe = Probe { src: "y/c".into(), dst: "x/a".into(), v6: false, proto: Proto::Udp, port: 81 };
    assert!(table[&probe], "y/c now reaches x/a on UDP 81");
    assert!(rig.node.log().contains("Elements("), "{}", rig.node.log());

    // The API server lost: the rules stay in force.
    rig.api.kill();
    let lost = netns_tests::wait_for(Duration::from_secs(30), || rig.node.log().contains("keeping the rules in force"));
    assert!(lost.is_some(), "the agent did not notice:\n{}", rig.node.log());
    let table = rig.node.probe_all();
    assert!(table[&probe], "still allowed");
    let denied = Probe { src: "z/a".into(), dst: "x/b".into(), v6: true, proto: Proto::Tcp, port: 80 };
    assert!(!table[&denied], "still denied");

    // Back: a deleted policy opens its pods again.
    rig.api.restart(&rig.infra);
    rig.applied_after(|| rig.api.delete(&rig.infra, &format!("{policies}/deny")));
    rig.assert_enforced("the default deny deleted after the API server came back");
}

#[test]
fn relists_after_410_gone() {
    if !kubeapi::require_apiserver() {
        return;
    }
    let mut rig = Rig::new();
    let _agent = rig.watching_agent();
    for ns in ["x", "z"] {
        let path = format!("/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies");
        rig.applied_after(|| rig.api.create(&rig.infra, &path, &policy(ns, "deny", json!({"podSelector": {}}))));
    }
    let table = rig.assert_enforced("default deny in x and z");
    assert!(table.iter().all(|(p, &r)| r != (p.dst.starts_with("x/") || p.dst.starts_with("z/"))));

    // The table, listed every 20 ms from now until the relisted view is applied.
    let (stop, listed, missing) = (AtomicBool::new(false), AtomicUsize::new(0), AtomicUsize::new(0));
    std::thread::scope(|scope| {
        scope.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                let out = rig.node.kubenet.node.exec("nft", &["list", "table", "inet", "cni-netpol"], &[], b"");
                let counter = if out.status.success() { &listed } else { &missing };
                counter.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        let before = rig.node.applied();
        let log_before = rig.node.log().len();
        // While kube-apiserver is down, x's policy is deleted in etcd itself: the revision moves past every
        // watch's resourceVersion, and the object is gone when the server lists again.
        let infra = &rig.infra;
        rig.api.restart_with(infra, |etcd| {
            let keys = etcd.ctl_in(infra, &["get", "--prefix", "--keys-only", "/registry/"]);
            let keys = String::from_utf8_lossy(&keys.stdout).into_owned();
            let key = keys.lines().find(|k| k.ends_with("networkpolicies/x/deny")).expect("x/deny in etcd");
            let deleted = etcd.ctl_in(infra, &["del", key]);
            assert_eq!(String::from_utf8_lossy(&deleted.stdout).trim(), "1", "deleted {key} in etcd");
            // Compacted up to now: a watch from an older revision cannot be served from etcd either.
            let put = etcd.ctl_in(infra, &["put", "-w", "json", "/unrelated/netpol", "x"]);
            let header: Value = serde_json::from_slice(&put.stdout).expect("etcdctl put -w json");
            let revision = header["header"]["revision"].as_u64().expect("the revision").to_string();
            assert!(etcd.ctl_in(infra, &["compact", &revision]).status.success(), "compact {revision}");
        });
        let relisted = netns_tests::wait_for(Duration::from_secs(90), || rig.node.applied() > before);
        stop.store(true, Ordering::Relaxed);
        let log = rig.node.log();
        assert!(relisted.is_some(), "the agent applied nothing after the restart:\n{log}");
        let after = &log[log_before..];
        assert!(
            after.contains("watching networkpolicies: resourceVersion expired (410 Gone): listing again"),
            "the policies' watch answered 410 Gone, and relisted:\n{after}"
        );
        assert!(after.contains("Rules(") && !after.contains("Replaced("), "a rule change, no new table:\n{after}");
        eprintln!("the agent's log after the restart:\n{after}");
    });
    let (listed, missing) = (listed.into_inner(), missing.into_inner());
    eprintln!("the table listed {listed} times across the restart and the relist, missing {missing} times");
    assert!(listed > 10 && missing == 0, "the table was missing {missing} of {} times", listed + missing);
    let table = rig.assert_enforced("x's policy deleted in the gap: x open again, z still denied");
    assert!(table.iter().all(|(p, &r)| r != p.dst.starts_with("z/")));
    // Counted: the relist and the watch restarts; each change from an API event to the kernel, timed.
    let scrape = scrape(&rig.node.kubenet.node, METRICS.parse().unwrap());
    let value = |name: &str, labels: &[(&str, &str)]| sample(&scrape, name, labels).unwrap_or(0.0);
    let policies = [("resource", "networkpolicies")];
    assert!(value("cni_netpol_relists_total", &policies) >= 1.0, "{scrape:?}");
    assert!(value("cni_netpol_watch_restarts_total", &policies) >= 1.0, "{scrape:?}");
    assert!(value("cni_netpol_event_to_kernel_seconds_count", &[]) >= 3.0, "two policies and the relist: {scrape:?}");
}
