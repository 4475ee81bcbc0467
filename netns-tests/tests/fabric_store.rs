//! fabricd and a store it does not trust: leases written by hand that are not valid for a node (each class
//! refused with its reason, logged once, counted, listed by `status`), and the second round: the node's own
//! lease overwritten, aliases of a lease's key, values too large to list, a pod's address as a node's, the
//! network config changed under running agents. Each row asserts what a user sees: pods keep their addresses
//! and reach each other, nothing is routed to the writer, the agent lives and `status` works, also after
//! agent restarts.

use std::time::Duration;

use netns_tests::fabric::*;
use netns_tests::{json, Value};

/// A store it does not trust: leases written by hand (by another node, or a typo) that are not valid for a
/// node, each of one class, beside two real nodes. Each is refused with its reason, logged once, counted and
/// listed by `fabricd status`; the node's connected route and a route made by hand stay as they are; the two
/// real nodes keep reaching each other's pods. A route conflict is the node's own: the other node uses that
/// lease.
#[test]
fn leases_that_are_not_valid_are_refused_and_the_others_keep_working() {
    let mut cluster = Cluster::new(1);
    cluster.start_etcd(&config(json!({ "Type": "vxlan" })), None);
    cluster.add_node(0, &[]);
    cluster.add_node(0, &[]);
    let subnets = start_all(&mut cluster);
    wait_routes(&cluster, 1);
    let (ip0, ip1) = (cluster.nodes[0].ip, cluster.nodes[1].ip);
    // Routes of someone else on node 0: one for a peer subnet exactly, one inside another.
    let node0 = &cluster.nodes[0].node;
    node0.ip(&["route", "add", "10.244.207.0/24", "via", &segment_ip(0, 254).to_string()]);
    node0.ip(&["route", "add", "10.244.208.0/25", "dev", "eth0"]);
    let before = node0.ip(&["route", "show", "table", "main"]);

    let lease = |public_ip: &str, mac: &str| {
        json!({ "PublicIP": public_ip, "PublicIPv6": null, "BackendType": "vxlan",
                "BackendData": { "VNI": 1, "VtepMAC": mac } })
    };
    let mac_of = |ip: std::net::Ipv4Addr| {
        let o = ip.octets();
        format!("0e:fa:{:02x}:{:02x}:{:02x}:{:02x}", o[0], o[1], o[2], o[3])
    };
    // (key, value, what node 0 says)
    let bad: Vec<(&str, Value, String)> = vec![
        (
            "192.168.50.0-24",
            lease("192.168.50.77", "0e:00:00:00:00:01"),
            "is not inside the Network 10.244.0.0/16".into(),
        ),
        ("10.244.200.0-25", lease("192.168.50.78", "0e:00:00:00:00:02"), "is not a /24 (SubnetLen)".into()),
        ("10.244.201.0-24", lease("127.0.0.1", "0e:00:00:00:00:03"), "127.0.0.1 is a loopback address".into()),
        ("10.244.202.0-24", lease("224.0.0.5", "0e:00:00:00:00:04"), "224.0.0.5 is a multicast address".into()),
        ("10.244.203.0-24", lease(&ip0.to_string(), "0e:00:00:00:00:05"), format!("{ip0} is this node's")),
        (
            "10.244.204.0-24",
            lease(&ip1.to_string(), "0e:00:00:00:00:06"),
            format!("{ip1} is already that of the lease of {}", subnets[1]),
        ),
        (
            "10.244.205.0-24",
            lease("192.168.50.81", &mac_of(ip1)),
            format!("VtepMAC {} is already that of the lease of {}", mac_of(ip1), subnets[1]),
        ),
        ("10.244.206.0-24", lease("192.168.50.82", "01:00:5e:00:00:01"), "01:00:5e:00:00:01 is not a unicast".into()),
        (
            "10.244.207.0-24",
            lease("192.168.50.83", "0e:00:00:00:00:07"),
            "would replace or shadow a route fabricd did not make (10.244.207.0/24 via 192.168.50.254)".into(),
        ),
        (
            "10.244.208.0-24",
            lease("192.168.50.84", "0e:00:00:00:00:08"),
            "would replace or shadow a route fabricd did not make (10.244.208.0/25)".into(),
        ),
    ];
    for (key, value, _) in &bad {
        let out = cluster.etcdctl(&["put", &format!("/coreos.com/network/subnets/{key}"), &value.to_string()]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
    let node = &cluster.nodes[0];
    let counted = wait_for(CONVERGE, || metric(&node.metrics(), "fabricd_refused_peers") == Some(bad.len() as f64));
    assert!(counted.is_some(), "{}\n{}", node.metrics(), node.log());
    // Node 0 routes only to node 1; node 1 also uses the leases that only conflict with node 0's routes.
    assert_eq!(node.fabric_routes().len(), 1, "{:?}", node.fabric_routes());
    let other = &cluster.nodes[1];
    let used = wait_for(CONVERGE, || {
        let routes = other.fabric_routes();
        routes.len() == 3
            && routes.iter().any(|r| r.starts_with("10.244.207.0/24 via 10.244.207.0 dev flannel.1"))
            && routes.iter().any(|r| r.starts_with("10.244.208.0/24 via 10.244.208.0 dev flannel.1"))
    });
    assert!(used.is_some(), "{:?}\n{}", other.fabric_routes(), other.log());
    // Node 1's FDB entry for its own MAC is untouched on node 0.
    let fdb = node.node.exec("bridge", &["fdb", "show", "dev", "flannel.1"], &[], b"");
    let fdb = String::from_utf8_lossy(&fdb.stdout);
    assert!(fdb.contains(&format!("{} dst {ip1} self permanent", mac_of(ip1))), "{fdb}");
    assert_eq!(fdb.matches("dst ").count(), 1, "{fdb}");

    // More passes (a drift repair) do not log the refusals again.
    node.node.ip(&["route", "del", &subnets[1].to_string()]);
    let back = wait_for(CONVERGE, || node.fabric_routes().len() == 1);
    assert!(back.is_some(), "{}", node.log());
    std::thread::sleep(Duration::from_millis(200));
    let log = node.log();
    for (key, _, reason) in &bad {
        let subnet = key.replace('-', "/");
        let lines: Vec<&str> =
            log.lines().filter(|l| l.contains(&format!("refusing the lease of {subnet}:"))).collect();
        assert_eq!(lines.len(), 1, "{subnet} logged {} times:\n{log}", lines.len());
        assert!(lines[0].contains(reason.as_str()), "{subnet}: {:?} lacks {reason:?}", lines[0]);
    }
    let metrics = node.metrics();
    assert_eq!(metric(&metrics, "fabricd_refused_leases_total"), Some(bad.len() as f64), "{metrics}");
    // The node's own routes are as they were (connected route, the hand-made ones), plus fabricd's.
    let after = node.node.ip(&["route", "show", "table", "main"]);
    for line in before.lines() {
        assert!(after.contains(line), "{line:?} lost:\n{after}");
    }

    let status = node.run(&["status"]);
    eprintln!("{}", status.stdout_text);
    assert!(status.success(), "{} {}", status.stdout_text, status.stderr);
    assert!(
        status.stdout_text.contains(&format!("peers: {} ({} refused)", bad.len() + 1, bad.len())),
        "{}",
        status.stdout_text
    );
    for (key, _, reason) in &bad {
        let subnet = key.replace('-', "/");
        let line = status.stdout_text.lines().find(|l| l.trim_start().starts_with(&format!("{subnet} ")));
        assert!(line.is_some_and(|l| l.contains("REFUSED: ") && l.contains(reason.as_str())), "{subnet}: {line:?}");
    }
    assert!(status.stdout_text.contains("in sync"), "{}", status.stdout_text);

    let pods = pods(&mut cluster);
    mesh(&cluster, &pods);
    // A bad lease that goes is no longer counted.
    cluster.etcdctl(&["del", "/coreos.com/network/subnets/10.244.204.0-24"]);
    let node = &cluster.nodes[0];
    let gone = wait_for(CONVERGE, || metric(&node.metrics(), "fabricd_refused_peers") == Some(bad.len() as f64 - 1.0));
    assert!(gone.is_some(), "{}", node.metrics());
}

/// The IPv6 half of a store it does not trust: IPv6 leases written by hand beside two dual-stack nodes, one
/// of each class, refused with their reason and listed by `status`; the underlay's own IPv6 subnet and a
/// route made by hand stay as they are; the nodes keep reaching each other's pods in both families.
#[test]
fn ipv6_leases_that_are_not_valid_are_refused_and_the_others_keep_working() {
    let mut cluster = Cluster::dual(1);
    cluster.start_etcd(&dual_config(json!({ "Type": "vxlan" })), None);
    cluster.add_node(0, &[]);
    cluster.add_node(0, &[]);
    start_all(&mut cluster);
    wait_routes6(&cluster, 1);
    let (ip0, ip1) = (cluster.nodes[0].ip6.unwrap(), cluster.nodes[1].ip6.unwrap());
    let holder = cluster.nodes[1].subnet6().unwrap();
    let node0 = &cluster.nodes[0].node;
    node0.ip(&["-6", "route", "add", "fd00:10:244:cf::/64", "via", &wan_ip6().to_string()]);
    let before = node0.ip(&["-6", "route", "show", "table", "main"]);
    let lease = |public: &str, mac: &str| {
        format!(
            r#"{{"PublicIP":"0.0.0.0","PublicIPv6":"{public}","BackendType":"vxlan","BackendV6Data":{{"VNI":1,"VtepMAC":"{mac}"}}}}"#
        )
    };
    let bad: Vec<(&str, String, String)> = vec![
        (
            "fd00:192:168:50::-64",
            lease("fd00:192:168:50::77", "0e:00:00:00:01:01"),
            "is not inside the Network fd00:10:244::/56".into(),
        ),
        ("fd00:10:244:c8::-80", lease("fd00:192:168:50::78", "0e:00:00:00:01:02"), "is not a /64".into()),
        ("fd00:10:244:c9::-64", lease("::1", "0e:00:00:00:01:03"), "::1 is a loopback address".into()),
        ("fd00:10:244:ca::-64", lease("ff02::5", "0e:00:00:00:01:04"), "ff02::5 is a multicast address".into()),
        ("fd00:10:244:cb::-64", lease(&ip0.to_string(), "0e:00:00:00:01:05"), format!("{ip0} is this node's")),
        (
            "fd00:10:244:cc::-64",
            lease(&ip1.to_string(), "0e:00:00:00:01:06"),
            format!("{ip1} is already that of the lease of {holder}"),
        ),
        (
            "fd00:10:244:cd::-64",
            lease("fd00:192:168:50::81", &vtep_mac(ip1.into())),
            format!("is already that of the lease of {holder}"),
        ),
        ("fd00:10:244:ce::-64", lease("fd00:192:168:50::82", "33:33:00:00:00:01"), "is not a unicast address".into()),
        (
            "fd00:10:244:cf::-64",
            lease("fd00:192:168:50::83", "0e:00:00:00:01:07"),
            format!("would replace or shadow a route fabricd did not make (fd00:10:244:cf::/64 via {})", wan_ip6()),
        ),
    ];
    for (key, value, _) in &bad {
        let out = cluster.etcdctl(&["put", &format!("/coreos.com/network/subnets/0.0.0.0-0&{key}"), value]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
    let node = &cluster.nodes[0];
    let counted = wait_for(CONVERGE, || metric(&node.metrics(), "fabricd_refused_peers") == Some(bad.len() as f64));
    assert!(counted.is_some(), "{}\n{}", node.metrics(), node.log());
    assert_eq!(node.fabric_routes6().len(), 1, "{:?}", node.fabric_routes6());
    assert_eq!(node.fabric_routes().len(), 1, "IPv4 untouched: {:?}", node.fabric_routes());
    let after = node.node.ip(&["-6", "route", "show", "table", "main"]);
    for line in before.lines() {
        assert!(after.contains(line), "{line:?} lost:\n{after}");
    }
    let log = node.log();
    let status = node.run(&["status"]);
    assert!(status.success() && status.stdout_text.contains("in sync"), "{} {}", status.stdout_text, status.stderr);
    for (key, _, reason) in &bad {
        let subnet = key.replace("-", "/");
        let lines = log.lines().filter(|l| l.contains(&format!("refusing the lease of {subnet}:"))).count();
        assert_eq!(lines, 1, "{subnet}:\n{log}");
        let line = status.stdout_text.lines().find(|l| l.trim_start().starts_with(&format!("{subnet} ")));
        assert!(line.is_some_and(|l| l.contains("REFUSED: ") && l.contains(reason.as_str())), "{subnet}: {line:?}");
    }
    let pods = pods_all(&mut cluster);
    mesh_all(&cluster, &pods, 2);
}
