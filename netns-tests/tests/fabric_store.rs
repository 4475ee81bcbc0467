//! fabricd and a store it does not trust: leases written by hand that are not valid for a node (each class
//! refused with its reason, logged once, counted, listed by `status`), and the second round: the node's own
//! lease overwritten, aliases of a lease's key, values too large to list, a pod's address as a node's, the
//! network config changed under running agents. Each row asserts what a user sees: pods keep their addresses
//! and reach each other, nothing is routed to the writer, the agent lives and `status` works, also after
//! agent restarts.

use std::net::IpAddr;
use std::time::Duration;

use netns_tests::fabric::*;
use netns_tests::{json, TestNetns, Value};

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

const PREFIX: &str = "/coreos.com/network/subnets";

/// A lease as someone with write access to etcd would put it, naming `public_ip` (vxlan: with its MAC).
fn forged_lease(backend: &str, public_ip: std::net::Ipv4Addr) -> String {
    let o = public_ip.octets();
    let mac = format!("0e:fa:{:02x}:{:02x}:{:02x}:{:02x}", o[0], o[1], o[2], o[3]);
    let data = if backend == "vxlan" { json!({ "VNI": 1, "VtepMAC": mac }) } else { Value::Null };
    json!({ "PublicIP": public_ip.to_string(), "PublicIPv6": null, "BackendType": backend, "BackendData": data })
        .to_string()
}

/// `10.244.3.0-24` for 10.244.3.0/24.
fn key_of(subnet: &ipnet::IpNet) -> String {
    format!("{PREFIX}/{}-{}", subnet.addr(), subnet.prefix_len())
}

fn put(cluster: &Cluster, key: &str, value: &str) {
    let out = cluster.etcdctl(&["put", key, value]);
    assert!(out.status.success(), "put {key:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// The value at `key`.
fn get(cluster: &Cluster, key: &str) -> String {
    let out = cluster.etcdctl(&["get", "--print-value-only", key]);
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// What a user must see after an attack: each node has its subnet (subnet.env as at the start), routes to
/// every other node's subnet and nothing routed or tunnelled to `attacker`; `status` works; the old pods
/// reach each other, and a new pod on each node gets an address of the node's subnet and reaches them.
fn assert_unharmed(
    cluster: &mut Cluster,
    subnets: &[ipnet::IpNet],
    pods: &[(usize, TestNetns, IpAddr)],
    attacker: &str,
) {
    for (index, node) in cluster.nodes.iter().enumerate() {
        assert_eq!(node.subnet(), Some(subnets[index]), "{}: subnet changed\n{}", node.node.name, node.log());
        let others: Vec<&ipnet::IpNet> = subnets.iter().filter(|s| **s != subnets[index]).collect();
        // The agent may still be applying the lease written back (the test sees it in the store first), so
        // the tunnel to the attacker is waited out like the routes.
        let fdb = || {
            let out = node.node.exec("bridge", &["fdb", "show"], &[], b"");
            String::from_utf8_lossy(&out.stdout).into_owned()
        };
        let routed = wait_for(CONVERGE, || {
            let routes = node.fabric_routes();
            others.iter().all(|s| routes.iter().any(|r| r.starts_with(&format!("{s} "))))
                && !routes.iter().any(|r| r.contains(attacker))
        });
        assert!(routed.is_some(), "{}: routes {:?}\n{}", node.node.name, node.fabric_routes(), node.log());
        let untunnelled = wait_for(CONVERGE, || !fdb().contains(&format!("dst {attacker} ")));
        assert!(untunnelled.is_some(), "{}: tunnel to the attacker: {}\n{}", node.node.name, fdb(), node.log());
        let status = node.run(&["status"]);
        assert!(status.success(), "{}: status: {} {}", node.node.name, status.stdout_text, status.stderr);
        assert!(status.stdout_text.contains(&format!("subnet {}", subnets[index])), "{}", status.stdout_text);
    }
    mesh(cluster, pods);
    let new = pods_all(cluster);
    for (index, _, ips) in &new {
        assert!(subnets[*index].contains(&ips[0]), "a new pod on node {index} got {ips:?}, not of {}", subnets[*index]);
    }
    let mut all: Vec<(usize, &TestNetns, IpAddr)> = pods.iter().map(|(i, p, ip)| (*i, p, *ip)).collect();
    all.extend(new.iter().map(|(i, p, ips)| (*i, p, ips[0])));
    cluster.assert_full_mesh(&all);
}

fn restart_all(cluster: &mut Cluster) {
    for node in &mut cluster.nodes {
        node.stop(nix::sys::signal::Signal::SIGTERM);
        node.start();
    }
}

/// Lines of `log` containing `text`.
fn count(log: &str, text: &str) -> usize {
    log.lines().filter(|l| l.contains(text)).count()
}

/// The second round, on each backend, against two running nodes, then again after their agents restart: the
/// node's own lease overwritten by a plain put with the address of a host on the segment (the attacker);
/// aliases of the other node's key naming it with the attacker's address (a zero-padded length, a `+`, a
/// nested key, a trailing space, a dual-stack key in an IPv4 cluster); five values of 1 MB under the prefix
/// (past the client's 4 MiB response); a lease whose PublicIP is a pod's address. Each is refused or healed,
/// logged once, and the pods keep their addresses and reach each other.
fn hostile_store_round_two(backend: &str) {
    let mut cluster = Cluster::new(1);
    cluster.start_etcd(&config(json!({ "Type": backend })), None);
    cluster.add_node(0, &[]);
    cluster.add_node(0, &[]);
    let subnets = start_all(&mut cluster);
    wait_routes(&cluster, 1);
    let pods = pods(&mut cluster);
    mesh(&cluster, &pods);
    let attacker = WAN_IP.to_string();
    let forged = forged_lease(backend, WAN_IP);

    // Node 0's own lease, overwritten: written back at once, logged once.
    let own = key_of(&subnets[0]);
    put(&cluster, &own, &forged);
    let node0 = &cluster.nodes[0];
    let back = wait_for(CONVERGE, || get(&cluster, &own).contains(&format!("\"{}\"", node0.ip)));
    assert!(back.is_some(), "not written back: {}\n{}", get(&cluster, &own), node0.log());
    eprintln!("{backend}: the own lease written back {:?} after the overwrite", back.unwrap());
    assert_eq!(count(&node0.log(), "was overwritten by another writer"), 1, "{}", node0.log());

    // Aliases of node 1's key.
    let (s1, ip1) = (subnets[1], cluster.nodes[1].ip);
    let base = format!("{}-{}", s1.addr(), s1.prefix_len());
    let aliases = [
        format!("{PREFIX}/{}-0{}", s1.addr(), s1.prefix_len()),
        format!("{PREFIX}/{}-+{}", s1.addr(), s1.prefix_len()),
        format!("{PREFIX}/x/{base}"),
        format!("{PREFIX}/{base} "),
    ];
    for alias in &aliases {
        put(&cluster, alias, &forged);
    }
    put(&cluster, &format!("{PREFIX}/{base}&fd00:10:244:7::-64"), &forged);
    // Five values of 1 MB, and a lease naming a pod's address.
    let large = vec![b'x'; 1 << 20];
    for i in 0..5 {
        let out = cluster.etcd.as_ref().unwrap().ctl_in_with_stdin(
            &cluster.infra,
            &["put", &format!("{PREFIX}/10.244.{}.0-24", 220 + i)],
            &large,
        );
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
    let pod_ip = pods[1].2.to_string();
    let pod_ip: std::net::Ipv4Addr = pod_ip.parse().unwrap();
    put(&cluster, &format!("{PREFIX}/10.244.230.0-24"), &forged_lease(backend, pod_ip));

    for node in &cluster.nodes {
        let logged = wait_for(CONVERGE, || {
            let log = node.log();
            aliases.iter().all(|a| log.contains(&format!("ignoring {a:?}")))
                && (node.ip == ip1 || log.contains(&format!("the older lease of {s1} names that subnet")))
                && count(&log, "larger than any lease") >= 5
                && log.contains(&format!("its public address {pod_ip} is inside the cluster's Network"))
        });
        assert!(logged.is_some(), "{}: not all refused:\n{}", node.node.name, node.log());
    }
    assert_unharmed(&mut cluster, &subnets, &pods, &attacker);
    assert!(get(&cluster, &key_of(&s1)).contains(&format!("\"{ip1}\"")), "node 1's lease changed");

    // Agents restarted with all of it still in the store, node 0's lease overwritten again while it is down.
    for node in &mut cluster.nodes {
        node.stop(nix::sys::signal::Signal::SIGTERM);
    }
    put(&cluster, &own, &forged);
    for node in &mut cluster.nodes {
        node.start();
    }
    let node0 = &cluster.nodes[0];
    let back = wait_for(READY, || get(&cluster, &own).contains(&format!("\"{}\"", node0.ip)));
    assert!(back.is_some(), "not written back at start: {}\n{}", get(&cluster, &own), node0.log());
    assert_unharmed(&mut cluster, &subnets, &pods, &attacker);
    // Each refusal logged once per agent run (two runs).
    for node in &cluster.nodes {
        let log = node.log();
        for alias in &aliases {
            assert_eq!(count(&log, &format!("ignoring {alias:?}")), 2, "{alias:?} in {}:\n{log}", node.node.name);
        }
        assert_eq!(count(&log, "larger than any lease"), 10, "{}:\n{log}", node.node.name);
        if node.ip != ip1 {
            assert_eq!(count(&log, "names that subnet"), 2, "{}:\n{log}", node.node.name);
        }
    }
    restart_all(&mut cluster);
    assert_unharmed(&mut cluster, &subnets, &pods, &attacker);
}

#[test]
fn hostile_store_round_two_on_vxlan() {
    hostile_store_round_two("vxlan");
}

#[test]
fn hostile_store_round_two_on_host_gw() {
    hostile_store_round_two("host-gw");
}

/// A lease planted with a node's address before it joins (a plain put, with a VtepMAC of someone else) is
/// adopted as flanneld does (a node reinstalled without its subnet.env gets its subnet back), and its value
/// written again at once by the node on an etcd lease: what peers use is the node's own. The network config
/// changed under running agents: a backend change (`from` to `to`) is applied by them, pods keep reaching
/// each other; a Network that no longer holds the nodes' subnets is reported once and not applied, and a
/// restarted agent refuses to start with an error naming both; the config put back, it starts with its subnet.
fn planted_lease_and_config_changes(from: &str, to: &str) {
    let mut cluster = Cluster::new(1);
    cluster.start_etcd(&config(json!({ "Type": from })), None);
    cluster.add_node(0, &[]);
    cluster.add_node(0, &[]);
    let planted = format!("{PREFIX}/10.244.77.0-24");
    let mut forged: Value = serde_json::from_str(&forged_lease("vxlan", cluster.nodes[0].ip)).unwrap();
    forged["BackendData"]["VtepMAC"] = json!("0e:00:00:00:00:66");
    put(&cluster, &planted, &forged.to_string());
    let subnets = start_all(&mut cluster);
    assert_eq!(subnets[0].to_string(), "10.244.77.0/24", "the planted lease adopted");
    let value = get(&cluster, &planted);
    assert!(!value.contains("0e:00:00:00:00:66"), "value not rewritten: {value}");
    let lease = cluster.etcdctl(&["get", "-w", "json", &planted]);
    assert!(String::from_utf8_lossy(&lease.stdout).contains("\"lease\":"), "not on an etcd lease");
    wait_routes(&cluster, 1);
    let pods = pods(&mut cluster);
    mesh(&cluster, &pods);

    // The backend: applied by the running agents.
    let config_key = "/coreos.com/network/config";
    put(&cluster, config_key, &config(json!({ "Type": to })).to_string());
    for (index, node) in cluster.nodes.iter().enumerate() {
        let peer = subnets[1 - index];
        let direct = match to {
            "host-gw" => format!("{peer} via {} dev eth0", cluster.nodes[1 - index].ip),
            _ => format!("{peer} via {} dev flannel.1", peer.addr()),
        };
        let applied = wait_for(CONVERGE, || node.fabric_routes().iter().any(|r| r.starts_with(&direct)));
        assert!(applied.is_some(), "{}: {:?}\n{}", node.node.name, node.fabric_routes(), node.log());
        eprintln!(
            "{from} -> {to}: {} on the new backend {:?} after the config change",
            node.node.name,
            applied.unwrap()
        );
        assert_eq!(count(&node.log(), "the network config changed: Backend"), 1, "{}", node.log());
    }
    mesh(&cluster, &pods);

    // A Network that does not hold the subnets: reported once, not applied.
    let moved = json!({ "Network": "10.245.0.0/16", "SubnetLen": 24, "Backend": { "Type": to } });
    put(&cluster, config_key, &moved.to_string());
    for node in &cluster.nodes {
        let reported = wait_for(CONVERGE, || node.log().contains("keeps running with the config it started with"));
        assert!(reported.is_some(), "{}", node.log());
    }
    std::thread::sleep(Duration::from_secs(1));
    mesh(&cluster, &pods);
    for node in &cluster.nodes {
        assert_eq!(count(&node.log(), "keeps running with the config it started with"), 1, "{}", node.log());
        assert_eq!(node.fabric_routes().len(), 1, "{:?}", node.fabric_routes());
    }
    let node = &mut cluster.nodes[0];
    node.stop(nix::sys::signal::Signal::SIGTERM);
    node.start();
    let exited = wait_for(READY, || node.agent.as_ref().is_some_and(|a| a.has_exited()));
    assert!(exited.is_some(), "started on a Network without its subnet:\n{}", node.log());
    let last = node.log().lines().last().unwrap_or_default().to_string();
    assert!(last.contains("10.244.77.0/24") && last.contains("10.245.0.0/16"), "{last}");

    // Put back: it starts with its subnet, and the pods reach each other.
    put(&cluster, config_key, &config(json!({ "Type": to })).to_string());
    let node = &mut cluster.nodes[0];
    node.start();
    let back = wait_for(READY, || node.run(&["status"]).stdout_text.contains("in sync"));
    std::thread::sleep(Duration::from_secs(1));
    assert!(back.is_some() && !node.agent.as_ref().unwrap().has_exited(), "{}", node.log());
    assert_eq!(node.subnet(), Some(subnets[0]));
    mesh(&cluster, &pods);
}

#[test]
fn planted_lease_and_config_changes_from_vxlan_to_host_gw() {
    planted_lease_and_config_changes("vxlan", "host-gw");
}

#[test]
fn planted_lease_and_config_changes_from_host_gw_to_vxlan() {
    planted_lease_and_config_changes("host-gw", "vxlan");
}

/// Fifty values of 1.4 MB under the prefix (70 MB, past the 64 MiB that fabricd reads in one response): the
/// listing is read again in smaller pages, a node starts and gets routes to its peer, `status` works, and each
/// value is ignored and logged once.
#[test]
fn values_past_the_read_limit_are_listed_in_smaller_pages() {
    let mut cluster = Cluster::new(1);
    cluster.start_etcd(&config(json!({ "Type": "vxlan" })), None);
    cluster.add_node(0, &[]);
    cluster.add_node(0, &[]);
    let large = vec![b'x'; 1_400_000];
    for i in 0..50 {
        let key = format!("{PREFIX}/10.244.{}.0-24", 100 + i);
        let out = cluster.etcd.as_ref().unwrap().ctl_in_with_stdin(&cluster.infra, &["put", &key], &large);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
    let subnets = start_all(&mut cluster);
    wait_routes(&cluster, 1);
    for (index, node) in cluster.nodes.iter().enumerate() {
        let status = node.run(&["status"]);
        assert!(status.success(), "{} {}", status.stdout_text, status.stderr);
        assert!(status.stdout_text.contains(&format!("subnet {}", subnets[index])), "{}", status.stdout_text);
        assert_eq!(count(&node.log(), "larger than any lease"), 50, "{}", node.log());
    }
    let pods = pods(&mut cluster);
    mesh(&cluster, &pods);
}
