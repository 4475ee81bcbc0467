//! fabricd beside flannel's CNI plugin: flannel's conflists (first plugin `"type": "flannel"`) on the
//! subnet.env fabricd writes, run by our binaries, in one and two families.

use std::net::IpAddr;

use netns_tests::fabric::*;
use netns_tests::{json, TestNetns, Value};

/// A conflist as flannel's manifests install it (first plugin `"type": "flannel"`), run by our binaries on the
/// subnet.env that fabricd wrote: pods on two nodes reach each other; DEL uses the saved delegate config.
#[test]
fn flannel_conflists_work_on_our_plugins() {
    let mut cluster = Cluster::new(1);
    cluster.start_etcd(&config(json!({ "Type": "vxlan" })), None);
    cluster.add_node(0, &["--ip-masq"]);
    cluster.add_node(0, &["--ip-masq"]);
    start_all(&mut cluster);
    wait_routes(&cluster, 1);
    let mut pods = Vec::new();
    for (index, node) in cluster.nodes.iter().enumerate() {
        let conf_dir = node.node.dir().join("flannel-net.d");
        std::fs::create_dir_all(&conf_dir).unwrap();
        let conflist = json!({
            "name": "cbr0", "cniVersion": "0.3.1",
            "plugins": [
                { "type": "flannel", "delegate": { "hairpinMode": true, "isDefaultGateway": true },
                  "subnetFile": node.subnet_file(), "dataDir": node.node.dir().join("flannel"),
                  "ipam": { "dataDir": node.node.dir().join("flannel-ipam") } },
                { "type": "portmap", "capabilities": { "portMappings": true } }
            ]
        });
        std::fs::write(conf_dir.join("10-flannel.conflist"), conflist.to_string()).unwrap();
        let pod = TestNetns::new("pod");
        let out = node.cnitool_in(&conf_dir, &["add", "cbr0", pod.path.to_str().unwrap()]);
        let result = out.expect_ok();
        assert_eq!(result["cniVersion"], "0.3.1");
        let ip: ipnet::IpNet = result["ips"][0]["address"].as_str().unwrap().parse().unwrap();
        assert!(node.subnet().unwrap().contains(&ip.addr()), "{ip} outside {:?}", node.subnet());
        let saved: Vec<_> = std::fs::read_dir(node.node.dir().join("flannel")).unwrap().flatten().collect();
        assert_eq!(saved.len(), 1, "the delegate config is saved for DEL");
        let delegate: Value = serde_json::from_slice(&std::fs::read(saved[0].path()).unwrap()).unwrap();
        assert_eq!(
            (delegate["type"].as_str(), delegate["mtu"].as_u64(), delegate["ipMasq"].as_bool()),
            (Some("bridge"), Some(1450), Some(false))
        );
        let link = pod.ip(&["link", "show", "eth0"]);
        assert!(link.contains("mtu 1450"), "{link}");
        pods.push((index, pod, ip.addr(), conf_dir));
    }
    let refs: Vec<(usize, &TestNetns, IpAddr)> = pods.iter().map(|(i, p, ip, _)| (*i, p, *ip)).collect();
    cluster.assert_full_mesh(&refs);
    for (index, pod, _, conf_dir) in &pods {
        let node = &cluster.nodes[*index];
        node.cnitool_in(conf_dir, &["del", "cbr0", pod.path.to_str().unwrap()]).expect_ok();
        assert_eq!(
            std::fs::read_dir(node.node.dir().join("flannel")).unwrap().count(),
            0,
            "saved config removed by DEL"
        );
        assert!(!pod.links().contains(&"eth0".to_string()));
        // A second DEL (nothing saved any more) succeeds.
        node.cnitool_in(conf_dir, &["del", "cbr0", pod.path.to_str().unwrap()]).expect_ok();
    }
}

/// flannel's conflist (first plugin `"type": "flannel"`) on the dual-stack subnet.env fabricd writes: each pod
/// gets an address of each family, and pods on two nodes reach each other in both without NAT.
#[test]
fn flannel_conflists_give_dual_stack_pods() {
    let mut cluster = Cluster::dual(1);
    cluster.start_etcd(&dual_config(json!({ "Type": "vxlan" })), None);
    // As flannel's manifests run flanneld: the node masquerades, so the delegate bridge does not.
    cluster.add_node(0, &["--ip-masq"]);
    cluster.add_node(0, &["--ip-masq"]);
    start_all(&mut cluster);
    wait_routes6(&cluster, 1);
    let mut pods = Vec::new();
    for (index, node) in cluster.nodes.iter().enumerate() {
        let conf_dir = node.node.dir().join("flannel-net.d");
        std::fs::create_dir_all(&conf_dir).unwrap();
        let conflist = json!({
            "name": "cbr0", "cniVersion": "1.0.0",
            "plugins": [{ "type": "flannel", "delegate": { "hairpinMode": true, "isDefaultGateway": true },
                          "subnetFile": node.subnet_file(), "dataDir": node.node.dir().join("flannel"),
                          "ipam": { "dataDir": node.node.dir().join("flannel-ipam") } }]
        });
        std::fs::write(conf_dir.join("10-flannel.conflist"), conflist.to_string()).unwrap();
        let pod = TestNetns::new("pod");
        let out = node.cnitool_in(&conf_dir, &["add", "cbr0", pod.path.to_str().unwrap()]);
        let result = out.expect_ok();
        let ips: Vec<IpAddr> = result["ips"]
            .as_array()
            .unwrap()
            .iter()
            .map(|ip| ip["address"].as_str().unwrap().parse::<ipnet::IpNet>().unwrap().addr())
            .collect();
        assert_eq!(ips.len(), 2, "{result}");
        assert!(node.subnet().unwrap().contains(&ips[0]) && node.subnet6().unwrap().contains(&ips[1]), "{ips:?}");
        pods.push((index, pod, ips));
    }
    mesh_all(&cluster, &pods, 2);
}
