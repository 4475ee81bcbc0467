//! fabricd's vxlan backend with flannel v0.28's other options, on a real etcd and kernel: `MTU` (the packets'
//! size on the underlay: the device's MTU and subnet.env's FLANNEL_MTU are it less the 50 bytes of vxlan over
//! IPv4), `GBP` and `Learning` as `ip -d link` shows them, pods on two routed segments reaching each other with
//! a full-size don't-fragment ping, GBP turned off while running (the device recreated, pods still reaching),
//! and configs whose MTU does not fit the underlay or whose GBP is not a bool refused with nothing made on the
//! node until they are fixed.

use std::time::Duration;

use netns_tests::fabric::*;
use netns_tests::{json, wait_for, Value};

/// The options under test: 1400-byte packets on the underlay (1500), GBP and learning on.
fn backend() -> Value {
    json!({ "Type": "vxlan", "MTU": 1400, "GBP": true, "Learning": true })
}

fn subnet_env(node: &FabricNode) -> String {
    std::fs::read_to_string(node.subnet_file()).unwrap_or_default()
}

#[test]
fn vxlan_mtu_gbp_and_learning_reach_the_device_subnet_env_and_pods() {
    let mut cluster = Cluster::new(2);
    cluster.start_etcd(&config(backend()), None);
    cluster.add_node(0, &[]);
    cluster.add_node(1, &[]);
    start_all(&mut cluster);
    wait_routes(&cluster, 1);
    for node in &cluster.nodes {
        let shown = node.node.ip_json(&["-d", "link", "show", "flannel.1"]);
        let data = &shown[0]["linkinfo"]["info_data"];
        assert_eq!(shown[0]["mtu"], 1350, "MTU 1400 less vxlan's 50: {shown}");
        assert!(data.get("gbp").is_some(), "GBP on the device: {data}");
        assert_eq!(data["learning"], true, "{data}");
        let env = subnet_env(node);
        assert!(env.contains("FLANNEL_MTU=1350\n"), "{env}");
        // The flannel CNI plugin reads FLANNEL_MTU; fabricd's own conflist carries the same MTU.
        let conflist = std::fs::read_to_string(node.conf_dir().join("10-fabric.conflist")).unwrap();
        assert!(conflist.contains("\"mtu\": 1350") || conflist.contains("\"mtu\":1350"), "{conflist}");
        // With learning on, as flanneld, every peer's neighbour and FDB entry is still programmed.
        let neighbours = node.node.ip(&["neigh", "show", "dev", "flannel.1"]);
        assert!(neighbours.contains("PERMANENT"), "{neighbours}");
    }
    let pods = pods(&mut cluster);
    mesh(&cluster, &pods);
    // Pods' MTU is 1350: a 1350-byte don't-fragment ping crosses (1322 + 28), one byte more does not leave.
    let (from, to) = (&pods[0].1, pods[1].2);
    let full = ping(from, to, &["-M", "do", "-s", "1322"]);
    assert!(full.status.success(), "1350-byte DF ping: {}", String::from_utf8_lossy(&full.stdout));
    let over = ping(from, to, &["-M", "do", "-s", "1323"]);
    assert!(!over.status.success(), "1351 bytes do not fit the pod's MTU");

    // GBP turned off in the running cluster: the kernel cannot change it on a live device, so each agent
    // recreates it, with its peers' entries; pods keep reaching each other.
    let off = config(json!({ "Type": "vxlan", "MTU": 1400, "Learning": true }));
    cluster.etcdctl(&["put", "/coreos.com/network/config", &off.to_string()]);
    for node in &cluster.nodes {
        let recreated = wait_for(CONVERGE, || {
            // The device is briefly missing while it is recreated: read it without failing.
            let out = node.node.exec("ip", &["-j", "-d", "link", "show", "flannel.1"], &[], b"");
            let shown: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
            let data = &shown[0]["linkinfo"]["info_data"];
            data.is_object() && data.get("gbp").is_none() && node.fabric_routes().len() == 1
        });
        assert!(recreated.is_some(), "{}: GBP still on or routes missing\n{}", node.node.name, node.log());
    }
    mesh(&cluster, &pods);
}

/// In etcd mode a config the agent cannot use is reported and retried (the operator fixes it in etcd), as for
/// the other keys: nothing is made on the node meanwhile; the fixed config is then applied.
#[test]
fn a_backend_mtu_larger_than_the_underlay_is_refused_with_nothing_made() {
    let mut cluster = Cluster::new(1);
    cluster.start_etcd(&config(json!({ "Type": "vxlan", "MTU": 9000 })), None);
    let index = cluster.add_node(0, &[]);
    cluster.nodes[index].start();
    let refused = |cluster: &Cluster, says: &str| {
        let node = &cluster.nodes[index];
        let logged = wait_for(Duration::from_secs(10), || node.log().contains(says));
        assert!(logged.is_some(), "no error naming the key ({says}): {}", node.log());
        std::thread::sleep(Duration::from_secs(1));
        let links = node.node.ip(&["-o", "link", "show"]);
        assert!(!links.contains("flannel."), "no device made: {links}");
        assert!(!node.subnet_file().exists(), "no subnet.env written");
        assert!(cluster.etcdctl(&["get", "--prefix", "/coreos.com/network/subnets"]).stdout.is_empty(), "no lease");
    };
    refused(&cluster, "vxlan backend: MTU: 9000 is more than the underlay interface's MTU 1500");
    let put = |cluster: &Cluster, backend: Value| {
        cluster.etcdctl(&["put", "/coreos.com/network/config", &config(backend).to_string()]);
    };
    put(&cluster, json!({ "Type": "vxlan", "GBP": "on" }));
    refused(&cluster, "vxlan backend: GBP: invalid type");
    put(&cluster, json!({ "Type": "vxlan", "MTU": 1500 }));
    let node = &cluster.nodes[index];
    node.wait_ready(Duration::from_secs(15));
    let shown = node.node.ip_json(&["-d", "link", "show", "flannel.1"]);
    assert_eq!(shown[0]["mtu"], 1450, "the fixed config applied: {shown}");
}
