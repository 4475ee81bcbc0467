//! fabricd with two address families: dual stack on vxlan over both underlays and on host-gw with
//! masquerade, an IPv6-only cluster, and a cluster turning IPv6 on.

use netns_tests::fabric::*;
use netns_tests::{json, Value};
use nix::sys::signal::Signal;

/// Dual stack on vxlan across two segments joined by a router: IPv4 pods tunnel over the IPv4 underlay
/// (`flannel.1`), IPv6 pods over the IPv6 underlay (`flannel-v6.1`, MTU 1500 - 70); a lease that flanneld wrote
/// for the far node is used as is; pods reach each other in both families without NAT; a v6 route deleted by
/// hand comes back; DirectRouting gives same-segment peers direct routes in both families; a node leaving with
/// `fabricd cleanup` leaves nothing of either family and its peers drop their routes to it.
#[test]
fn dual_stack_vxlan_over_both_underlays_direct_routing_and_cleanup() {
    let mut cluster = Cluster::dual(2);
    cluster.start_etcd(&dual_config(json!({ "Type": "vxlan" })), None);
    cluster.add_node(0, &[]);
    cluster.add_node(0, &[]);
    let far = cluster.add_node(1, &[]);
    // The far node's lease as flanneld writes it (on an etcd lease; MACs as its devices have them).
    let (far_ip, far_ip6) = (cluster.nodes[far].ip, cluster.nodes[far].ip6.unwrap());
    let granted = String::from_utf8(cluster.etcdctl(&["lease", "grant", "3600"]).stdout).unwrap();
    let lease_id = granted.split_whitespace().nth(1).expect("lease id").to_string();
    let far_key = "/coreos.com/network/subnets/10.244.9.0-24&fd00:10:244:9::-64";
    let far_value = format!(
        r#"{{"PublicIP":"{far_ip}","PublicIPv6":"{far_ip6}","BackendType":"vxlan","BackendData":{{"VNI":1,"VtepMAC":"{}"}},"BackendV6Data":{{"VNI":1,"VtepMAC":"{}"}}}}"#,
        vtep_mac(far_ip.into()),
        vtep_mac(far_ip6.into())
    );
    let put = cluster.etcdctl(&["put", &format!("--lease={lease_id}"), far_key, &far_value]);
    assert!(put.status.success(), "{}", String::from_utf8_lossy(&put.stderr));

    start_all(&mut cluster);
    wait_routes(&cluster, 2);
    wait_routes6(&cluster, 2);
    let far_node = &cluster.nodes[far];
    assert_eq!(far_node.subnet6(), Some("fd00:10:244:9::/64".parse().unwrap()), "the flanneld lease kept");
    assert_eq!(far_node.subnet(), Some("10.244.9.0/24".parse().unwrap()));
    let stored = String::from_utf8(cluster.etcdctl(&["get", "--print-value-only", far_key]).stdout).unwrap();
    assert_eq!(stored.trim(), far_value, "used as is, not rewritten");

    let node = &cluster.nodes[0];
    let link = node.node.ip(&["-d", "link", "show", "flannel-v6.1"]);
    let ip6 = node.ip6.unwrap();
    assert!(
        link.contains("mtu 1430")
            && link.contains("vxlan id 1 ")
            && link.contains(&format!("local {ip6}"))
            && link.contains("dstport 8472")
            && link.contains("nolearning"),
        "{link}"
    );
    assert!(node.node.ip(&["-d", "link", "show", "flannel.1"]).contains("mtu 1450"));
    let conflist: Value =
        serde_json::from_str(&std::fs::read_to_string(node.conf_dir().join("10-fabric.conflist")).unwrap()).unwrap();
    assert_eq!(conflist["plugins"][0]["mtu"], 1430, "the IPv6 underlay's larger header");
    assert_eq!(conflist["plugins"][0]["ipam"]["ranges"][1][0]["subnet"], node.subnet6().unwrap().to_string());
    let env = std::fs::read_to_string(node.subnet_file()).unwrap();
    assert!(
        env.contains("FLANNEL_IPV6_NETWORK=fd00:10:244::/56\n") && env.contains("FLANNEL_IPV6_SUBNET=fd00:10:244:"),
        "{env}"
    );
    let far_route6 = "fd00:10:244:9::/64 via fd00:10:244:9:: dev flannel-v6.1".to_string();
    assert!(node.fabric_routes6().iter().any(|r| r.starts_with(&far_route6)), "{:?}", node.fabric_routes6());
    let neighbours = node.node.ip(&["-6", "neigh", "show", "dev", "flannel-v6.1"]);
    assert!(neighbours.contains(&format!("fd00:10:244:9:: lladdr {}", vtep_mac(far_ip6.into()))), "{neighbours}");
    let fdb = node.node.exec("bridge", &["fdb", "show", "dev", "flannel-v6.1"], &[], b"");
    let fdb = String::from_utf8_lossy(&fdb.stdout);
    assert!(fdb.contains(&format!("dst {far_ip6} self permanent")), "{fdb}");
    let listing =
        String::from_utf8(cluster.etcdctl(&["get", "--prefix", "/coreos.com/network/subnets/"]).stdout).unwrap();
    assert!(
        listing.contains(&format!("\"PublicIPv6\":\"{ip6}\"")) && listing.contains("\"BackendV6Data\":{\"VNI\":1,"),
        "{listing}"
    );

    let pods = pods_all(&mut cluster);
    mesh_all(&cluster, &pods, 2);

    // Drift: an IPv6 route deleted by hand comes back.
    let node = &cluster.nodes[0];
    node.node.ip(&["-6", "route", "del", "fd00:10:244:9::/64"]);
    let back = wait_for(CONVERGE, || node.fabric_routes6().iter().any(|r| r.starts_with(&far_route6)));
    assert!(back.is_some(), "v6 route not repaired: {:?}\n{}", node.fabric_routes6(), node.log());
    eprintln!("IPv6 route deleted by hand: repaired in {:?}", back.unwrap());

    // DirectRouting: the same-segment peer gets direct routes in both families, the far one stays on vxlan.
    cluster.etcdctl(&[
        "put",
        "/coreos.com/network/config",
        &dual_config(json!({ "Type": "vxlan", "DirectRouting": true })).to_string(),
    ]);
    for node in &mut cluster.nodes {
        node.stop(Signal::SIGTERM);
        node.start();
    }
    let near = &cluster.nodes[1];
    let (near_subnet6, near_ip6) = (near.subnet6().unwrap(), near.ip6.unwrap());
    let node = &cluster.nodes[0];
    let direct6 = format!("{near_subnet6} via {near_ip6} dev eth0");
    let direct = wait_for(CONVERGE, || {
        node.fabric_routes6().iter().any(|r| r.starts_with(&direct6)) && node.fabric_routes6().len() == 2
    });
    assert!(direct.is_some(), "{:?}\n{}", node.fabric_routes6(), node.log());
    assert!(node.fabric_routes6().iter().any(|r| r.starts_with(&far_route6)), "{:?}", node.fabric_routes6());
    let direct4 = format!("{} via {} dev eth0", near.subnet().unwrap(), near.ip);
    assert!(wait_for(CONVERGE, || node.fabric_routes().iter().any(|r| r.starts_with(&direct4))).is_some());
    mesh_all(&cluster, &pods, 2);

    // The far node leaves: nothing of either family is left on it, and its peers drop their routes to it.
    let far_node = &mut cluster.nodes[far];
    far_node.stop(Signal::SIGTERM);
    let cleanup = far_node.run(&["cleanup"]);
    assert!(cleanup.success(), "{}", cleanup.stderr);
    assert!(far_node.fabric_routes().is_empty() && far_node.fabric_routes6().is_empty());
    let links = far_node.node.links();
    assert!(!links.iter().any(|l| l.starts_with("flannel")), "{links:?}");
    for node in &cluster.nodes[..far] {
        let dropped = wait_for(CONVERGE, || node.fabric_routes().len() == 1 && node.fabric_routes6().len() == 1);
        assert!(dropped.is_some(), "{:?} {:?}", node.fabric_routes(), node.fabric_routes6());
    }
}

/// Dual stack on host-gw with masquerade: pods reach each other in both families with their own addresses,
/// and the wan masqueraded to the node's address of each family (iptables and ip6tables; nftables on the
/// third node, whose `--iface` is its IPv6 address); `status` in sync.
#[test]
fn dual_stack_host_gw_with_masquerade_of_both_families() {
    let mut cluster = Cluster::dual(1);
    cluster.start_etcd(&dual_config(json!({ "Type": "host-gw" })), None);
    cluster.add_node(0, &["--ip-masq"]);
    cluster.add_node(0, &["--ip-masq"]);
    // The third with nftables, and its IPv6 underlay address named by --iface.
    let ip6 = netns_tests::fabric::segment_ip6(0, 12).to_string();
    cluster.add_node(0, &["--ip-masq", "--firewall-backend=nftables", &format!("--iface={ip6}")]);
    start_all(&mut cluster);
    wait_routes(&cluster, 2);
    wait_routes6(&cluster, 2);
    let node = &cluster.nodes[0];
    let peer = &cluster.nodes[1];
    let route6 = format!("{} via {} dev eth0", peer.subnet6().unwrap(), peer.ip6.unwrap());
    assert!(node.fabric_routes6().iter().any(|r| r.starts_with(&route6)), "{:?}", node.fabric_routes6());
    let pods = pods_all(&mut cluster);
    mesh_all(&cluster, &pods, 2);
    for (index, pod, _) in &pods {
        let node = &cluster.nodes[*index];
        assert_eq!(tcp_source(pod, &cluster.wan, WAN_IP.into()), Some(node.ip.into()));
        assert_eq!(tcp_source(pod, &cluster.wan, wan_ip6().into()), Some(node.ip6.unwrap().into()));
        if *index == 2 {
            let table = node.node.exec("nft", &["list", "table", "ip6", "flannel-ipv6"], &[], b"");
            let table = String::from_utf8_lossy(&table.stdout);
            assert!(
                table.contains("ip6 saddr fd00:10:244::/56 ip6 daddr != ff00::/8 masquerade fully-random"),
                "flannel's IPv6 table: {table}"
            );
            continue;
        }
        let rules = node.node.exec("ip6tables-save", &["-t", "nat"], &[], b"");
        let rules = String::from_utf8_lossy(&rules.stdout);
        assert_eq!(rules.matches("-A FLANNEL-POSTRTG").count(), 4, "{rules}");
    }
    let status = cluster.nodes[0].run(&["status"]);
    assert!(status.success() && status.stdout_text.contains("in sync"), "{} {}", status.stdout_text, status.stderr);
    // Cleanup removes the rules of both families.
    let node = &mut cluster.nodes[0];
    node.stop(Signal::SIGTERM);
    assert!(node.run(&["cleanup"]).success());
    for tool in ["iptables-save", "ip6tables-save"] {
        let rules = node.node.exec(tool, &["-t", "nat"], &[], b"");
        assert!(!String::from_utf8_lossy(&rules.stdout).contains("FLANNEL-POSTRTG"), "{tool}");
    }
    assert!(node.fabric_routes6().is_empty());
}

/// An IPv6-only cluster (EnableIPv4 false) on vxlan: leases at flannel's `0.0.0.0-0&<v6>-<len>` keys, only
/// the IPv6 device and routes, IPv6-only pods reaching each other without NAT.
#[test]
fn ipv6_only_cluster() {
    let mut cluster = Cluster::dual(1);
    let config = json!({ "EnableIPv4": false, "EnableIPv6": true, "IPv6Network": "fd00:10:244::/56",
                         "Backend": { "Type": "vxlan" } });
    cluster.start_etcd(&config, None);
    for _ in 0..3 {
        cluster.add_node(0, &[]);
    }
    start_all(&mut cluster);
    wait_routes6(&cluster, 2);
    let keys =
        String::from_utf8(cluster.etcdctl(&["get", "--prefix", "/coreos.com/network/subnets/", "--keys-only"]).stdout)
            .unwrap();
    let keys: Vec<&str> = keys.lines().filter(|l| !l.is_empty()).collect();
    assert_eq!(keys.len(), 3);
    assert!(keys.iter().all(|k| k.starts_with("/coreos.com/network/subnets/0.0.0.0-0&fd00:10:244:")), "{keys:?}");
    for node in &cluster.nodes {
        assert!(node.fabric_routes().is_empty(), "no IPv4 route: {:?}", node.fabric_routes());
        assert!(!node.node.links().contains(&"flannel.1".to_string()));
        let env = std::fs::read_to_string(node.subnet_file()).unwrap();
        assert!(!env.contains("FLANNEL_NETWORK=") && env.contains("FLANNEL_IPV6_SUBNET="), "{env}");
    }
    let pods = pods_all(&mut cluster);
    assert!(
        pods.iter().all(|(_, _, ips)| ips.len() == 1 && ips[0].is_ipv6()),
        "{:?}",
        pods.iter().map(|p| &p.2).collect::<Vec<_>>()
    );
    mesh_all(&cluster, &pods, 1);
    let status = cluster.nodes[0].run(&["status"]);
    assert!(status.success() && status.stdout_text.contains("in sync"), "{} {}", status.stdout_text, status.stderr);
}

/// An IPv4 cluster turning IPv6 on: after the config change and a restart, each node keeps its IPv4 subnet,
/// its IPv4-only lease is replaced by a dual-stack one (no second lease with its address), and new pods get
/// both families and reach each other in both.
#[test]
fn turning_ipv6_on_keeps_the_ipv4_subnets() {
    let mut cluster = Cluster::dual(1);
    cluster.start_etcd(&config(json!({ "Type": "vxlan" })), None);
    cluster.add_node(0, &[]);
    cluster.add_node(0, &[]);
    let before = start_all(&mut cluster);
    wait_routes(&cluster, 1);
    cluster.etcdctl(&["put", "/coreos.com/network/config", &dual_config(json!({ "Type": "vxlan" })).to_string()]);
    for node in &mut cluster.nodes {
        node.stop(Signal::SIGTERM);
        node.start();
    }
    wait_routes6(&cluster, 1);
    wait_routes(&cluster, 1);
    let after: Vec<_> = cluster.nodes.iter().map(|n| n.subnet().unwrap()).collect();
    assert_eq!(after, before, "IPv4 subnets kept");
    let keys =
        String::from_utf8(cluster.etcdctl(&["get", "--prefix", "/coreos.com/network/subnets/", "--keys-only"]).stdout)
            .unwrap();
    let keys: Vec<&str> = keys.lines().filter(|l| !l.is_empty()).collect();
    assert_eq!(keys.len(), 2, "{keys:?}");
    assert!(keys.iter().all(|k| k.contains("&fd00:10:244:")), "{keys:?}");
    let pods = pods_all(&mut cluster);
    mesh_all(&cluster, &pods, 2);
}
