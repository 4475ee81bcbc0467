//! The ptp plugin against the real kernel: routed pods (veth, /32 and /128 routes on the node, the gateway
//! address on each host veth) reach the node, each other and, with ipMasq, a "wan" namespace beyond the node's
//! uplink that has no route back to them (masqueraded, with iptables and with nftables: the wan sees the
//! node's address); IPv6; MTU; CHECK and drift; DEL leaves nothing (veths, routes, rules, leases), is
//! idempotent and works without netns; every spec version with GC and STATUS; takeover both ways with the
//! reference ptp 1.1.1 (/usr/lib/cni), masquerade rules included; a pod of the reference v1.9 nftables masquerade
//! (its rule from the fixture rendered from their source) checked and removed by ours.

use std::net::{IpAddr, SocketAddr};

use netns_tests::linkrig::{link_details, Impl, LinkRig, LAN_HOST, UPLINK};
use netns_tests::snapshot::{assert_unchanged, NodeSnapshot};
use netns_tests::traffic::{tcp_ask, TcpServer};
use netns_tests::{assert_no_ping, assert_ping, json, unique_name, TestNetns, Value};

const SUBNET: &str = "10.40.0.0/24";
const GATEWAY: &str = "10.40.0.1";
const SUBNET6: &str = "fd40::/64";
/// The node's address on the uplink to the wan (the lan namespace of the rig).
const NODE_UPLINK: &str = "10.30.0.1";

/// The rig with the node's uplink addressed: the wan (`rig.lan`) has no route to the pod subnet.
fn rig() -> LinkRig {
    let rig = LinkRig::new("ptp");
    rig.node.ip(&["addr", "add", &format!("{NODE_UPLINK}/24"), "dev", UPLINK]);
    rig
}

fn conf(rig: &LinkRig, version: &str, extra: Value) -> Value {
    let mut conf = json!({
        "cniVersion": version, "name": rig.network, "type": "ptp",
        "ipam": {"type": "host-local", "dataDir": rig.ipam_dir(), "ranges": [[{"subnet": SUBNET}]],
                 "routes": [{"dst": "0.0.0.0/0"}]},
    });
    for (key, value) in extra.as_object().expect("object") {
        conf[key] = value.clone();
    }
    conf
}

fn address(result: &Value, n: usize) -> IpAddr {
    let ip = result["ips"][n]["address"].as_str().expect("address in result");
    ip.split('/').next().expect("address").parse().expect("ip")
}

fn nat_rules(rig: &LinkRig) -> String {
    let out = rig.node.exec("iptables-save", &["-t", "nat"], &[], b"");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn nft_ruleset(rig: &LinkRig) -> String {
    let out = rig.node.exec("nft", &["list", "ruleset"], &[], b"");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn has_nft() -> bool {
    std::process::Command::new("nft").arg("--version").output().is_ok_and(|o| o.status.success())
}

#[test]
fn routed_pods_reach_node_each_other_and_masqueraded_wan_then_del_leaves_nothing() {
    let rig = rig();
    let conf = conf(&rig, "1.1.0", json!({"ipMasq": true}));
    let (pod1, pod2) = (rig.node.pod_netns(), rig.node.pod_netns());
    // ip_forward is the one thing ADD leaves on, as the reference does (see without_ip_masq_...).
    rig.node.run(|| cnicore_sysctl_on("net/ipv4/ip_forward"));
    // The nat table exists before (the DEL leaves it, empty, like the reference).
    for op in ["-A", "-D"] {
        let args = ["-t", "nat", op, "POSTROUTING", "-j", "RETURN"];
        assert!(rig.node.exec("iptables", &args, &[], b"").status.success());
    }
    let before = NodeSnapshot::settled(&rig.node, &[], std::time::Duration::from_secs(5));
    let r1 = rig.add(Impl::Ours, &pod1, "c1", &conf);
    let r2 = rig.add(Impl::Ours, &pod2, "c2", &conf);

    // The result: host veth, then the pod interface (its sandbox), the IPs on the pod interface.
    let host = r1["interfaces"][0]["name"].as_str().expect("host veth").to_string();
    assert!(host.starts_with("veth") && r1["interfaces"][0]["sandbox"].is_null(), "{r1}");
    assert_eq!(r1["interfaces"][1]["name"], "eth0");
    assert_eq!(r1["interfaces"][1]["sandbox"], pod1.path.display().to_string());
    assert_eq!((r1["ips"][0]["interface"].as_u64(), r1["ips"][0]["gateway"].as_str()), (Some(1), Some(GATEWAY)));
    assert_eq!(link_details(&pod1, "eth0").expect("eth0")["address"], r1["interfaces"][1]["mac"]);

    // The node: the gateway /32 on the host veth, a /32 route to the pod.
    let host_addrs = rig.node.ip(&["-o", "addr", "show", "dev", &host]);
    assert!(host_addrs.contains(&format!("{GATEWAY}/32")), "{host_addrs}");
    let p1 = address(&r1, 0);
    let routes = rig.node.ip(&["route", "show", &format!("{p1}/32")]);
    assert!(routes.contains(&format!("dev {host}")), "{routes}");
    // The pod: the gateway on the link, the subnet through the gateway.
    let pod_routes = pod1.ip(&["route", "show"]);
    assert!(pod_routes.contains(&format!("{GATEWAY} dev eth0 scope link src {p1}")), "{pod_routes}");
    assert!(pod_routes.contains(&format!("{SUBNET} via {GATEWAY} dev eth0 src {p1}")), "{pod_routes}");
    assert!(pod_routes.contains(&format!("default via {GATEWAY} dev eth0")), "{pod_routes}");

    assert_ping(&pod1, GATEWAY.parse().unwrap());
    assert_ping(&pod1, address(&r2, 0));
    assert_ping(&pod2, p1);
    // The wan has no route back to the pods: only masquerading gets an answer, from the node's address.
    let _server = TcpServer::echo_source(&rig.lan, 8080);
    let seen = tcp_ask(&pod1, SocketAddr::new(LAN_HOST.parse().unwrap(), 8080));
    assert_eq!(seen.as_deref(), Some(NODE_UPLINK));
    assert!(nat_rules(&rig).contains("CNI-"));

    for (pod, id, result) in [(&pod1, "c1", &r1), (&pod2, "c2", &r2)] {
        rig.check(Impl::Ours, pod, id, &conf, result).expect_ok();
    }
    rig.del(Impl::Ours, Some(&pod1.path), "c1", &conf, &r1);
    rig.del(Impl::Ours, Some(&pod1.path), "c1", &conf, &r1);
    assert!(!pod1.links().contains(&"eth0".to_string()));
    // containerd's later DELs: no netns; then the pod gone.
    rig.del(Impl::Ours, None, "c2", &conf, &r2);
    let pod2_path = pod2.path.clone();
    drop(pod2);
    rig.del(Impl::Ours, Some(&pod2_path), "c2", &conf, &r2);
    assert!(rig.leases().is_empty(), "{:?}", rig.leases());
    assert!(!nat_rules(&rig).contains("CNI-"), "{}", nat_rules(&rig));
    assert_unchanged(&before, &NodeSnapshot::settled(&rig.node, &[], std::time::Duration::from_secs(5)));
}

fn cnicore_sysctl_on(name: &str) {
    netns_tests::cnicore::sysctl::write(name, "1").unwrap_or_else(|e| panic!("{name}: {e}"));
}

#[test]
fn without_ip_masq_the_wan_is_not_reached() {
    let rig = rig();
    let conf = conf(&rig, "1.0.0", json!({}));
    let pod = rig.node.pod_netns();
    assert_eq!(rig.node.sysctl("net/ipv4/ip_forward").trim(), "0");
    let result = rig.add(Impl::Ours, &pod, "n", &conf);
    assert_eq!(rig.node.sysctl("net/ipv4/ip_forward").trim(), "1");
    assert_ping(&pod, GATEWAY.parse().unwrap());
    assert_ping(&pod, NODE_UPLINK.parse().unwrap());
    assert_no_ping(&pod, LAN_HOST.parse().unwrap());
    assert!(!nat_rules(&rig).contains("CNI-"));
    rig.del(Impl::Ours, Some(&pod.path), "n", &conf, &result);
}

#[test]
fn nftables_masquerade() {
    if !has_nft() {
        assert!(std::env::var("CI").as_deref() != Ok("true"), "nft is missing (scripts/setup.sh installs it)");
        eprintln!("skipped: nft not installed");
        return;
    }
    let rig = rig();
    let conf = conf(&rig, "1.0.0", json!({"ipMasq": true, "ipMasqBackend": "nftables"}));
    let pod = rig.node.pod_netns();
    let result = rig.add(Impl::Ours, &pod, "nft", &conf);
    let _server = TcpServer::echo_source(&rig.lan, 8080);
    let seen = tcp_ask(&pod, SocketAddr::new(LAN_HOST.parse().unwrap(), 8080));
    assert_eq!(seen.as_deref(), Some(NODE_UPLINK));
    assert!(nft_ruleset(&rig).contains("cni_ipmasq"));
    assert!(!nat_rules(&rig).contains("CNI-"));
    rig.check(Impl::Ours, &pod, "nft", &conf, &result).expect_ok();
    rig.del(Impl::Ours, Some(&pod.path), "nft", &conf, &result);
    assert!(!nft_ruleset(&rig).contains(&address(&result, 0).to_string()), "{}", nft_ruleset(&rig));
}

#[test]
fn dual_stack_and_mtu() {
    let rig = rig();
    let mut conf = conf(&rig, "1.0.0", json!({"mtu": 1400}));
    conf["ipam"]["ranges"] = json!([[{"subnet": SUBNET}], [{"subnet": SUBNET6}]]);
    conf["ipam"]["routes"] = json!([{"dst": "0.0.0.0/0"}, {"dst": "::/0"}]);
    let (pod1, pod2) = (rig.node.pod_netns(), rig.node.pod_netns());
    let r1 = rig.add(Impl::Ours, &pod1, "d1", &conf);
    let r2 = rig.add(Impl::Ours, &pod2, "d2", &conf);
    assert_eq!(link_details(&pod1, "eth0").expect("eth0")["mtu"].as_u64(), Some(1400));
    let host = r1["interfaces"][0]["name"].as_str().unwrap();
    assert_eq!(link_details(&rig.node, host).expect("host veth")["mtu"].as_u64(), Some(1400));
    assert!(address(&r1, 1).is_ipv6());
    let routes6 = pod1.ip(&["-6", "route", "show"]);
    assert!(routes6.contains("fd40::/64 via fd40::1 dev eth0"), "{routes6}");
    assert_ping(&pod1, "fd40::1".parse().unwrap());
    assert_ping(&pod1, address(&r2, 1));
    assert_ping(&pod2, address(&r1, 1));
    assert_ping(&pod1, "fd40::1".parse().unwrap());
    rig.check(Impl::Ours, &pod1, "d1", &conf, &r1).expect_ok();
    rig.del(Impl::Ours, Some(&pod1.path), "d1", &conf, &r1);
    rig.del(Impl::Ours, Some(&pod2.path), "d2", &conf, &r2);
    assert!(rig.leases().is_empty());
}

#[test]
fn every_spec_version_with_gc_and_status() {
    let rig = rig();
    for version in ["0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"] {
        let conf = conf(&rig, version, json!({"ipMasq": true}));
        let pod = rig.node.pod_netns();
        let result = rig.add(Impl::Ours, &pod, "v", &conf);
        assert_eq!(result["cniVersion"], version);
        if version < "0.3.0" {
            assert_eq!(result["ip4"]["gateway"], GATEWAY, "{version}: {result}");
        } else {
            assert_eq!(result["interfaces"][1]["name"], "eth0", "{version}: {result}");
        }
        assert_ping(&pod, GATEWAY.parse().unwrap());
        if version >= "0.4.0" {
            rig.check(Impl::Ours, &pod, "v", &conf, &result).expect_ok();
        }
        if version >= "1.1.0" {
            rig.run(Impl::Ours, "STATUS", None, "", &conf, "").expect_ok();
            // GC with this attachment valid keeps it; with none valid, its lease and rules go.
            let mut gc = conf.clone();
            gc["cni.dev/valid-attachments"] = json!([{"containerID": "v", "ifname": "eth0"}]);
            rig.run(Impl::Ours, "GC", None, "", &gc, "").expect_ok();
            assert_eq!(rig.leases().len(), 1);
            assert!(nat_rules(&rig).contains("CNI-"));
            gc["cni.dev/valid-attachments"] = json!([]);
            rig.run(Impl::Ours, "GC", None, "", &gc, "").expect_ok();
            assert!(rig.leases().is_empty());
            assert!(!nat_rules(&rig).contains("CNI-"), "{}", nat_rules(&rig));
        }
        rig.del(Impl::Ours, Some(&pod.path), "v", &conf, &result);
        assert!(!pod.links().contains(&"eth0".to_string()), "{version}");
    }
    assert!(rig.leases().is_empty());
    assert!(!nat_rules(&rig).contains("CNI-"));
}

#[test]
fn check_finds_drift() {
    let rig = rig();
    let conf = conf(&rig, "1.0.0", json!({"ipMasq": true}));
    let pod = rig.node.pod_netns();
    let result = rig.add(Impl::Ours, &pod, "d", &conf);
    let mut wrong_mac = result.clone();
    wrong_mac["interfaces"][1]["mac"] = "02:11:11:11:11:11".into();
    rig.check(Impl::Ours, &pod, "d", &conf, &wrong_mac).expect_err();
    pod.ip(&["route", "del", "default"]);
    let err = rig.check(Impl::Ours, &pod, "d", &conf, &result);
    assert!(err.expect_err()["msg"].as_str().unwrap().contains("0.0.0.0/0"), "{}", err.stdout_text);
    rig.run(Impl::Ours, "CHECK", Some(&pod.path), "d", &conf, "").expect_err();
    rig.del(Impl::Ours, Some(&pod.path), "d", &conf, &result);
}

/// DEL deletes the pod's interface only when it is the pod end of a veth pair with the node (as bridge's DEL,
/// one function in cnicore::podlink): an `eth0` veth to another namespace is someone else's and stays.
#[test]
fn del_leaves_a_veth_to_elsewhere_alone() {
    let rig = rig();
    let conf = conf(&rig, "1.0.0", json!({}));
    let pod = rig.node.pod_netns();
    let elsewhere = TestNetns::new("ptp-else");
    // The peer's index is one the node has none of: the check follows the peer's index into the node (indexes
    // are per namespace, and a fresh namespace's first links share theirs with the node's).
    elsewhere
        .ip(&["link", "add", "peer0", "index", "4000", "type", "veth", "peer", "name", "eth0", "netns", &pod.name]);
    pod.ip(&["addr", "add", "10.41.0.2/24", "dev", "eth0"]);
    rig.run(Impl::Ours, "DEL", Some(&pod.path), "x", &conf, "").expect_ok();
    assert!(pod.links().contains(&"eth0".to_string()), "DEL deleted a veth that is not ours: {:?}", pod.links());
    assert!(link_details(&elsewhere, "peer0").is_some(), "its peer went too");
}

#[test]
fn failed_adds_leave_node_and_pod_unchanged() {
    let rig = rig();
    let pod = rig.node.pod_netns();
    // A first pod turns ip_forward on (which ADD leaves on, as the reference does).
    let ok = conf(&rig, "1.0.0", json!({}));
    let first = rig.node.pod_netns();
    let first_result = rig.add(Impl::Ours, &first, "first", &ok);
    let settled = |ns: &TestNetns| NodeSnapshot::settled(ns, &[], std::time::Duration::from_secs(5));
    let before = (settled(&rig.node), settled(&pod));
    let one = json!({"type": "host-local", "dataDir": rig.ipam_dir(), "ranges": [[{"subnet": "10.40.0.0/30"}]]});
    let cases = [
        (json!({"ipam": {"type": "no-such-ipam"}}), "no-such-ipam"),
        (json!({"ipMasqBackend": "ebtables"}), "ebtables"),
        (json!({"mtu": 20}), "invalid MTU"),
        // host-local hands out an address, but not one with a gateway of its family: refused after IPAM.
        (
            json!({"ipam": {"type": "host-local", "dataDir": rig.ipam_dir(),
                             "ranges": [[{"subnet": "10.41.0.0/24", "gateway": "fd41::1"}]]}}),
            "gateway",
        ),
        (json!({"ipam": one, "name": unique_name("full")}), "no IP addresses available"),
    ];
    for (extra, message) in cases {
        let conf = conf(&rig, "1.0.0", extra.clone());
        let mut taken = None;
        if extra.get("name").is_some() {
            let p = rig.node.pod_netns();
            let r = rig.add(Impl::Ours, &p, "f1", &conf);
            taken = Some((p, r));
        }
        let before_this = settled(&rig.node);
        let out = rig.run(Impl::Ours, "ADD", Some(&pod.path), "bad", &conf, "");
        let msg = out.expect_err()["msg"].as_str().unwrap_or_default().to_string();
        assert!(msg.contains(message), "{extra}: {}", out.stdout_text);
        assert_unchanged(&before_this, &NodeSnapshot::settled(&rig.node, &[], std::time::Duration::from_secs(5)));
        if let Some((p, r)) = taken {
            rig.del(Impl::Ours, Some(&p.path), "f1", &conf, &r);
        }
        assert_unchanged(&before.1, &NodeSnapshot::take(&pod, &[]));
    }
    assert_unchanged(&before.0, &NodeSnapshot::settled(&rig.node, &[], std::time::Duration::from_secs(5)));
    rig.del(Impl::Ours, Some(&first.path), "first", &ok, &first_result);
    assert!(rig.leases().is_empty(), "{:?}", rig.leases());
}

#[test]
fn takeover_both_ways_with_the_reference() {
    let rig = rig();
    let conf = conf(&rig, "1.0.0", json!({"ipMasq": true}));
    let _server = TcpServer::echo_source(&rig.lan, 8080);
    rig.takeover_both_ways(
        &conf,
        |adder, pod| {
            let seen = tcp_ask(pod, SocketAddr::new(LAN_HOST.parse().unwrap(), 8080));
            assert_eq!(seen.as_deref(), Some(NODE_UPLINK), "{adder:?}");
        },
        |adder, other| assert!(!nat_rules(&rig).contains("CNI-"), "{adder:?} then {other:?}: {}", nat_rules(&rig)),
    );
}

/// A ptp pod of the reference v1.6-v1.9 with `ipMasqBackend: nftables` (their v1.9 binary cannot be installed
/// here: the reference 1.1.1 makes the pod, their masquerade rule is loaded from the fixture rendered from their
/// source, as `reference_nft.rs` does for the bridge): it keeps reaching the wan, our CHECK accepts it, our DEL
/// removes their rule.
#[test]
fn a_reference_v1_9_nftables_masquerade_is_checked_and_removed() {
    if !has_nft() {
        assert!(std::env::var("CI").as_deref() != Ok("true"), "nft is missing (scripts/setup.sh installs it)");
        eprintln!("skipped: nft not installed");
        return;
    }
    let rig = rig();
    let theirs = conf(&rig, "1.0.0", json!({}));
    let ours = conf(&rig, "1.0.0", json!({"ipMasq": true, "ipMasqBackend": "nftables"}));
    let pod = rig.node.pod_netns();
    let result = rig.add(Impl::Reference, &pod, "v19", &theirs);
    let ip: ipnet::IpNet = result["ips"][0]["address"].as_str().unwrap().parse().unwrap();
    let comment = netns_tests::cnicore::firewall::reference_nft::ipmasq_comment(&rig.network, "eth0", "v19");
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/reference-v1.9-ipmasq-nftables.nft");
    let text: String = std::fs::read_to_string(path)
        .expect("fixture")
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| format!("{l}\n"))
        .collect();
    let text = text
        .replace("${POD_IP}", &ip.addr().to_string())
        .replace("${POD_SUBNET}", &ip.trunc().to_string())
        .replace("${COMMENT}", &comment);
    let out = rig.node.exec("nft", &["-f", "-"], &[], text.as_bytes());
    assert!(out.status.success(), "nft -f: {}", String::from_utf8_lossy(&out.stderr));

    let _server = TcpServer::echo_source(&rig.lan, 8080);
    let seen = tcp_ask(&pod, SocketAddr::new(LAN_HOST.parse().unwrap(), 8080));
    assert_eq!(seen.as_deref(), Some(NODE_UPLINK), "their masquerade");
    rig.check(Impl::Ours, &pod, "v19", &ours, &result).expect_ok();
    rig.del(Impl::Ours, Some(&pod.path), "v19", &ours, &result);
    assert!(!nft_ruleset(&rig).contains(&comment), "{}", nft_ruleset(&rig));
    assert!(!pod.links().contains(&"eth0".to_string()));
    assert!(rig.leases().is_empty());
}
