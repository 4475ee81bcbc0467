//! fabricd, the node agent, on a real etcd (Debian's etcd-server 3.4) with nodes in namespaces: host-gw on
//! one L2 segment, vxlan across two segments joined by a router, direct routing, path MTU, nodes joining,
//! leaving and changing address, etcd killed and restarted, an agent killed and restarted, a watch fallen
//! behind compaction while connected, drift repaired, 50 concurrent allocations, TLS with client certificates,
//! static mode. Dual stack is in fabric_dual.rs, flannel's conflists in fabric_flannel.rs, a store it does not
//! trust in fabric_store.rs; the shared helpers in the rig (netns-tests/src/fabric.rs).
//!
//! Timings printed here are for information; the figures are measured by scripts/bench-fabric.sh.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use netns_tests::fabric::*;
use netns_tests::{bin, json, TestNetns, Value};
use nix::sys::signal::Signal;

#[test]
fn host_gw_on_one_l2_without_nat_and_masquerade_to_the_wan() {
    let mut cluster = Cluster::new(1);
    cluster.start_etcd(&config(json!({ "Type": "host-gw" })), None);
    for _ in 0..3 {
        cluster.add_node(0, &["--ip-masq"]);
    }
    let subnets = start_all(&mut cluster);
    wait_routes(&cluster, 2);
    // Each route goes to the peer's node address.
    for node in &cluster.nodes {
        for (peer, subnet) in cluster.nodes.iter().zip(&subnets) {
            if peer.ip != node.ip {
                let wanted = format!("{subnet} via {} dev eth0", peer.ip);
                assert!(
                    node.fabric_routes().iter().any(|r| r.starts_with(&wanted)),
                    "{:?} lacks {wanted}",
                    node.fabric_routes()
                );
            }
        }
        let conflist: Value =
            serde_json::from_str(&std::fs::read_to_string(node.conf_dir().join("10-fabric.conflist")).unwrap())
                .unwrap();
        assert_eq!(conflist["plugins"][0]["mtu"], 1500, "host-gw: the underlay's MTU");
        let env = std::fs::read_to_string(node.subnet_file()).unwrap();
        assert!(
            env.contains("FLANNEL_NETWORK=10.244.0.0/16\n")
                && env.contains("FLANNEL_MTU=1500\n")
                && env.contains("FLANNEL_IPMASQ=true\n"),
            "{env}"
        );
        assert_eq!(node.node.sysctl("net/ipv4/ip_forward"), "1");
    }
    // Leases in flannel's format.
    let listing =
        String::from_utf8(cluster.etcdctl(&["get", "--prefix", "/coreos.com/network/subnets/"]).stdout).unwrap();
    for node in &cluster.nodes {
        assert!(
            listing.contains(&format!(
                "{{\"PublicIP\":\"{}\",\"PublicIPv6\":null,\"BackendType\":\"host-gw\",\"BackendData\":null}}",
                node.ip
            )),
            "{listing}"
        );
    }

    let pods = pods(&mut cluster);
    mesh(&cluster, &pods);
    // Leaving the cluster CIDR: masqueraded to the node's address, one copy of the rules.
    for (index, pod, _) in &pods {
        assert_eq!(tcp_source(pod, &cluster.wan, WAN_IP.into()), Some(cluster.nodes[*index].ip.into()));
        let rules = cluster.nodes[*index].node.exec("iptables-save", &["-t", "nat"], &[], b"");
        let rules = String::from_utf8_lossy(&rules.stdout);
        assert_eq!(
            rules.matches("-A POSTROUTING -m comment --comment \"flanneld masq\" -j FLANNEL-POSTRTG").count(),
            1,
            "{rules}"
        );
        assert_eq!(rules.matches("-A FLANNEL-POSTRTG").count(), 4, "{rules}");
        // --iptables-forward-rules: flanneld's FLANNEL-FWD, jumped to once from FORWARD.
        let filter = cluster.nodes[*index].node.exec("iptables-save", &["-t", "filter"], &[], b"");
        let filter = String::from_utf8_lossy(&filter.stdout);
        assert_eq!(filter.matches("-A FORWARD -m comment --comment \"flanneld forward\" -j FLANNEL-FWD").count(), 1);
        for rule in ["-s 10.244.0.0/16", "-d 10.244.0.0/16"] {
            let rule = format!("-A FLANNEL-FWD {rule} -m comment --comment \"flanneld forward\" -j ACCEPT");
            assert_eq!(filter.matches(&rule).count(), 1, "{filter}");
        }
    }
    let status = cluster.nodes[0].run(&["status"]);
    assert!(status.success() && status.stdout_text.contains("in sync"), "{} {}", status.stdout_text, status.stderr);
}

/// nftables: flannel's own table and chain (`ip flannel-ipv4`, `postrtg`); a node that ran fabricd's previous
/// release (`inet fabricd`) or flanneld (a stale `flannel-ipv4` and `flannel-ipv6`) is left with one copy.
#[test]
fn masquerade_with_the_nftables_backend() {
    let mut cluster = Cluster::new(1);
    cluster.start_etcd(&config(json!({ "Type": "host-gw" })), None);
    // Node 0 with flanneld's forward accept rules (its default), node 1 without.
    cluster.add_node(0, &["--ip-masq", "--firewall-backend=nftables"]);
    cluster.add_node(0, &["--ip-masq", "--firewall-backend=nftables", "--iptables-forward-rules=false"]);
    // What an earlier release and flanneld left on node 0.
    let leftovers =
        "add table inet fabricd\nadd chain inet fabricd postrouting { type nat hook postrouting priority srcnat; }\n\
        add rule inet fabricd postrouting ip saddr 10.244.0.0/16 masquerade\n\
        add table ip flannel-ipv4\nadd chain ip flannel-ipv4 postrtg { type nat hook postrouting priority srcnat; }\n\
        add rule ip flannel-ipv4 postrtg ip saddr 10.99.0.0/16 masquerade\nadd table ip6 flannel-ipv6\n";
    let made = cluster.nodes[0].node.exec("nft", &["-f", "-"], &[], leftovers.as_bytes());
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    start_all(&mut cluster);
    wait_routes(&cluster, 1);
    let pods = pods(&mut cluster);
    // Pod to pod keeps the source; leaving the cluster is masqueraded to the node's address.
    mesh(&cluster, &pods);
    for (index, pod, _) in &pods {
        assert_eq!(tcp_source(pod, &cluster.wan, WAN_IP.into()), Some(cluster.nodes[*index].ip.into()));
    }
    let node = &cluster.nodes[0];
    let ruleset = node.node.exec("nft", &["list", "ruleset"], &[], b"");
    let ruleset = String::from_utf8_lossy(&ruleset.stdout).into_owned();
    let subnet = node.subnet().unwrap();
    for rule in [
        "meta mark 0x00004000 return".to_string(),
        format!("ip saddr {subnet} ip daddr 10.244.0.0/16 return"),
        format!("ip saddr != {subnet} ip daddr 10.244.0.0/16 return"),
        "ip saddr 10.244.0.0/16 ip daddr != 224.0.0.0/4 masquerade fully-random".to_string(),
    ] {
        assert_eq!(ruleset.matches(&rule).count(), 1, "{rule}: {ruleset}");
    }
    assert!(ruleset.contains("table ip flannel-ipv4 {") && ruleset.contains("chain postrtg {"), "{ruleset}");
    assert_eq!(ruleset.matches("masquerade").count(), 2, "flannel's two masquerade rules only: {ruleset}");
    assert!(!ruleset.contains("table inet fabricd"), "the old release's table removed: {ruleset}");
    assert!(!ruleset.contains("10.99.0.0/16") && !ruleset.contains("flannel-ipv6"), "stale tables gone: {ruleset}");
    for rule in ["ip saddr 10.244.0.0/16 accept", "ip daddr 10.244.0.0/16 accept"] {
        assert_eq!(ruleset.matches(rule).count(), 1, "--iptables-forward-rules: {ruleset}");
    }
    assert!(ruleset.contains("chain forward {"), "{ruleset}");
    let other = cluster.nodes[1].node.exec("nft", &["list", "ruleset"], &[], b"");
    assert!(!String::from_utf8_lossy(&other.stdout).contains("chain forward"), "turned off, not written");
    let node = &mut cluster.nodes[0];
    let iptables = node.node.exec("iptables-save", &["-t", "nat"], &[], b"");
    assert!(!String::from_utf8_lossy(&iptables.stdout).contains("FLANNEL-POSTRTG"), "one backend only");
    node.stop(Signal::SIGTERM);
    let cleanup = node.run(&["cleanup"]);
    assert!(cleanup.success(), "{}", cleanup.stderr);
    let ruleset = node.node.exec("nft", &["list", "ruleset"], &[], b"");
    let ruleset = String::from_utf8_lossy(&ruleset.stdout).into_owned();
    assert!(!ruleset.contains("flannel-ipv4") && !ruleset.contains("fabricd"), "tables removed: {ruleset}");
}

#[test]
fn host_gw_refuses_a_peer_beyond_the_l2_segment() {
    let mut cluster = Cluster::new(2);
    cluster.start_etcd(&config(json!({ "Type": "host-gw" })), None);
    cluster.add_node(0, &[]);
    cluster.add_node(0, &[]);
    cluster.add_node(1, &[]);
    start_all(&mut cluster);
    let far = cluster.nodes[2].ip;
    let near = &cluster.nodes[0];
    let refused =
        wait_for(CONVERGE, || near.log().contains(&format!("its node {far} is not on this node's L2 segment")));
    assert!(refused.is_some(), "no clear error for {far}: {}", near.log());
    assert_eq!(near.fabric_routes().len(), 1, "only the same-L2 peer: {:?}", near.fabric_routes());
    let status = near.run(&["status"]);
    assert!(status.stdout_text.contains("REFUSED: host-gw cannot reach"), "{}", status.stdout_text);
    assert!(status.stdout_text.contains("use the vxlan backend"), "{}", status.stdout_text);
}

#[test]
fn vxlan_across_routed_segments_with_path_mtu_and_drift_repair() {
    let mut cluster = Cluster::new(2);
    cluster.start_etcd(&config(json!({ "Type": "vxlan" })), None);
    cluster.add_node(0, &[]);
    cluster.add_node(0, &[]);
    cluster.add_node(1, &[]);
    let subnets = start_all(&mut cluster);
    wait_routes(&cluster, 2);
    let node = &cluster.nodes[0];
    let link = node.node.ip(&["-d", "link", "show", "flannel.1"]);
    assert!(
        link.contains("mtu 1450")
            && link.contains("vxlan id 1 ")
            && link.contains("dstport 8472")
            && link.contains("nolearning"),
        "{link}"
    );
    assert!(link.contains(&format!("local {}", node.ip)), "{link}");
    let far_ip = cluster.nodes[2].ip;
    let route = format!("{} via {} dev flannel.1 onlink", subnets[2], subnets[2].addr());
    assert!(node.fabric_routes().iter().any(|r| r.starts_with(&route)), "{:?}", node.fabric_routes());
    let neighbours = node.node.ip(&["neigh", "show", "dev", "flannel.1"]);
    assert!(
        neighbours.contains(&format!("{} lladdr 0e:fa:", subnets[2].addr())) && neighbours.contains("PERMANENT"),
        "{neighbours}"
    );
    let fdb = node.node.exec("bridge", &["fdb", "show", "dev", "flannel.1"], &[], b"");
    let fdb = String::from_utf8_lossy(&fdb.stdout);
    assert!(fdb.contains(&format!("dst {far_ip} self permanent")), "{fdb}");

    let pods = pods(&mut cluster);
    mesh(&cluster, &pods);
    // Path MTU: pods get 1450; a full-size don't-fragment ping crosses the tunnel, one byte more fails at once.
    let (from, to) = (&pods[0].1, pods[2].2);
    let full = ping(from, to, &["-M", "do", "-s", "1422"]);
    assert!(full.status.success(), "1450-byte DF ping: {}", String::from_utf8_lossy(&full.stdout));
    let over = ping(from, to, &["-M", "do", "-s", "1423"]);
    assert!(!over.status.success());
    let said = format!("{}{}", String::from_utf8_lossy(&over.stdout), String::from_utf8_lossy(&over.stderr));
    assert!(said.contains("mtu=1450") || said.contains("too long"), "{said}");

    // Drift: a route, a neighbour, an FDB entry, then the device itself, deleted by hand: back within a second.
    let node = &cluster.nodes[0];
    let far_subnet = subnets[2].to_string();
    let tunnel = subnets[2].addr().to_string();
    let far_ip = far_ip.to_string();
    let mac =
        node.node.ip(&["neigh", "show", &tunnel, "dev", "flannel.1"]).split_whitespace().nth(2).unwrap().to_string();
    let cases: Vec<(&str, Vec<&str>)> = vec![
        ("route", vec!["route", "del", &far_subnet]),
        ("neighbour", vec!["neigh", "del", &tunnel, "dev", "flannel.1"]),
        ("device", vec!["link", "del", "flannel.1"]),
    ];
    for (what, args) in cases {
        node.node.ip(&args);
        let back = wait_for(CONVERGE, || {
            node.fabric_routes().len() == 2 && node.node.ip(&["neigh", "show", "dev", "flannel.1"]).contains(&tunnel)
        });
        assert!(back.is_some(), "{what} not repaired: {:?}\n{}", node.fabric_routes(), node.log());
        eprintln!("{what} deleted by hand: repaired in {:?}", back.unwrap());
    }
    let deleted = node.node.exec("bridge", &["fdb", "del", &mac, "dev", "flannel.1", "dst", &far_ip, "self"], &[], b"");
    assert!(deleted.status.success(), "{}", String::from_utf8_lossy(&deleted.stderr));
    let back = wait_for(CONVERGE, || {
        let fdb = node.node.exec("bridge", &["fdb", "show", "dev", "flannel.1"], &[], b"");
        String::from_utf8_lossy(&fdb.stdout).contains(&format!("dst {far_ip} self permanent"))
    });
    assert!(back.is_some(), "fdb entry not repaired");
    mesh(&cluster, &pods);
    let metrics = node.metrics();
    assert!(metrics.contains("fabricd_peers 2\n") && !metrics.contains("fabricd_drift_repairs_total 0\n"), "{metrics}");

    // Direct routing: same-segment peers get host-gw routes, the other stays on vxlan (config change + restart).
    cluster.etcdctl(&[
        "put",
        "/coreos.com/network/config",
        &config(json!({ "Type": "vxlan", "DirectRouting": true })).to_string(),
    ]);
    for node in &mut cluster.nodes {
        node.stop(Signal::SIGTERM);
        node.start();
    }
    let near_route = format!("{} via {} dev eth0", subnets[1], cluster.nodes[1].ip);
    let node = &cluster.nodes[0];
    let direct = wait_for(CONVERGE, || {
        node.fabric_routes().iter().any(|r| r.starts_with(&near_route)) && node.fabric_routes().len() == 2
    });
    assert!(direct.is_some(), "{:?}", node.fabric_routes());
    assert!(node.fabric_routes().iter().any(|r| r.starts_with(&route)), "{:?}", node.fabric_routes());
    assert_eq!(
        cluster.nodes.iter().map(|n| n.subnet().unwrap()).collect::<Vec<_>>(),
        subnets,
        "restarts keep the subnets"
    );
    mesh(&cluster, &pods);
}

#[test]
fn nodes_join_leave_and_change_address() {
    let mut cluster = Cluster::new(1);
    cluster.start_etcd(&config(json!({ "Type": "vxlan" })), None);
    for _ in 0..3 {
        cluster.add_node(0, &["--ip-masq"]);
    }
    start_all(&mut cluster);
    wait_routes(&cluster, 2);
    let mut pods = pods(&mut cluster);

    // Join.
    let new = cluster.add_node(0, &["--ip-masq"]);
    let started = Instant::now();
    cluster.nodes[new].start();
    let subnet = cluster.nodes[new].wait_ready(READY);
    let joined = wait_for(CONVERGE, || {
        cluster.nodes[..new].iter().all(|n| n.fabric_routes().iter().any(|r| r.starts_with(&subnet.to_string())))
    });
    assert!(joined.is_some(), "peers lack a route to {subnet}");
    eprintln!("join: agent start to every peer's route: {:?}", started.elapsed());
    let (pod, ip) = cluster.nodes[new].add_pod();
    pods.push((new, pod, ip));
    mesh(&cluster, &pods);

    // Leave: cleanup releases the lease; every peer drops its routes; the node is left clean.
    cluster.nodes[new].stop(Signal::SIGTERM);
    let cleanup = cluster.nodes[new].run(&["cleanup"]);
    assert!(cleanup.success(), "{}", cleanup.stderr);
    let left = wait_for(CONVERGE, || cluster.nodes[..new].iter().all(|n| n.fabric_routes().len() == 2));
    assert!(left.is_some(), "routes to the departed node remain");
    for n in &cluster.nodes[..new] {
        let neighbours = n.node.ip(&["neigh", "show", "dev", "flannel.1"]);
        assert!(!neighbours.contains(&subnet.addr().to_string()), "{neighbours}");
    }
    let gone = &cluster.nodes[new];
    assert!(gone.fabric_routes().is_empty() && !gone.node.links().contains(&"flannel.1".to_string()));
    assert!(!gone.conf_dir().join("10-fabric.conflist").exists() && !gone.subnet_file().exists());
    let rules = gone.node.exec("iptables-save", &["-t", "nat"], &[], b"");
    assert!(!String::from_utf8_lossy(&rules.stdout).contains("FLANNEL-POSTRTG"));
    pods.pop();

    // Address change: same subnet (the node recognises its lease), peers follow to the new address.
    let moved = 2;
    let old_subnet = cluster.nodes[moved].subnet().unwrap();
    cluster.nodes[moved].stop(Signal::SIGTERM);
    let new_ip = segment_ip(0, 77);
    let old = format!("{}/24", cluster.nodes[moved].ip);
    cluster.nodes[moved].node.ip(&["addr", "del", &old, "dev", "eth0"]);
    cluster.nodes[moved].node.ip(&["addr", "add", &format!("{new_ip}/24"), "dev", "eth0"]);
    cluster.nodes[moved].node.ip(&["route", "replace", "default", "via", &segment_ip(0, 254).to_string()]);
    cluster.nodes[moved].ip = new_ip;
    cluster.nodes[moved].start();
    let followed = wait_for(Duration::from_secs(10), || {
        cluster.nodes[..moved].iter().all(|n| {
            let fdb = n.node.exec("bridge", &["fdb", "show", "dev", "flannel.1"], &[], b"");
            String::from_utf8_lossy(&fdb.stdout).contains(&format!("dst {new_ip} self permanent"))
        })
    });
    assert!(followed.is_some(), "peers still point to the old address\n{}", cluster.nodes[moved].log());
    assert_eq!(cluster.nodes[moved].subnet(), Some(old_subnet));
    let listing =
        String::from_utf8(cluster.etcdctl(&["get", "--prefix", "/coreos.com/network/subnets/", "--keys-only"]).stdout)
            .unwrap();
    assert_eq!(listing.lines().filter(|l| !l.is_empty()).count(), 3, "one lease per node: {listing}");
    mesh(&cluster, &pods);
}

#[test]
fn etcd_outage_and_agent_restart_keep_the_data_plane() {
    let mut cluster = Cluster::new(1);
    cluster.start_etcd(&config(json!({ "Type": "vxlan" })), None);
    for _ in 0..3 {
        cluster.add_node(0, &[]);
    }
    let subnets = start_all(&mut cluster);
    wait_routes(&cluster, 2);
    let pods = pods(&mut cluster);
    let before: Vec<Vec<String>> = cluster.nodes.iter().map(|n| n.fabric_routes()).collect();

    // etcd killed: nothing removed meanwhile, pods keep talking.
    cluster.etcd.as_mut().unwrap().kill();
    let outage = Instant::now();
    while outage.elapsed() < Duration::from_secs(3) {
        let now: Vec<Vec<String>> = cluster.nodes.iter().map(|n| n.fabric_routes()).collect();
        assert_eq!(now, before, "a route changed during the store outage");
        std::thread::sleep(Duration::from_millis(100));
    }
    mesh(&cluster, &pods);
    let infra = &cluster.infra as *const TestNetns;
    // SAFETY: the infra namespace outlives this call; the borrow checker cannot see etcd and infra apart.
    cluster.etcd.as_mut().unwrap().restart(unsafe { &*infra });
    // Convergence after: a lease written now reaches every node.
    let fake = json!({ "PublicIP": "192.168.50.99", "BackendType": "vxlan", "BackendData": { "VNI": 1, "VtepMAC": "0e:fa:c0:a8:32:63" } });
    let out = cluster.etcdctl(&["put", "/coreos.com/network/subnets/10.244.250.0-24", &fake.to_string()]);
    assert!(out.status.success());
    let converged = wait_for(Duration::from_secs(15), || cluster.nodes.iter().all(|n| n.fabric_routes().len() == 3));
    assert!(
        converged.is_some(),
        "no convergence after etcd came back: {:?}\n{}",
        cluster.nodes[0].fabric_routes(),
        cluster.nodes[0].log()
    );
    cluster.etcdctl(&["del", "/coreos.com/network/subnets/10.244.250.0-24"]);
    wait_routes(&cluster, 2);

    // A stopped agent leaves the data plane working; killed and restarted, it keeps its subnet, duplicates
    // nothing, and two other nodes' pods lose no packet meanwhile.
    let (a, b) = (&pods[0], &pods[1]);
    let target = b.2.to_string();
    let pinger = a.1.command("ping").args(["-c", "300", "-i", "0.01", "-W", "1", &target]).output();
    let restarted = subnets[2];
    cluster.nodes[2].stop(Signal::SIGTERM);
    mesh(&cluster, &pods);
    cluster.nodes[2].start();
    cluster.nodes[2].stop(Signal::SIGKILL);
    cluster.nodes[2].start();
    assert_eq!(cluster.nodes[2].wait_ready(READY), restarted);
    let pinger = pinger.expect("ping");
    let summary = String::from_utf8_lossy(&pinger.stdout);
    assert!(summary.contains(" 0% packet loss"), "{summary}");
    std::thread::sleep(Duration::from_millis(300));
    for node in &cluster.nodes {
        for subnet in &subnets {
            let lines = node.node.ip(&["route", "show", &subnet.to_string()]);
            assert!(lines.lines().count() <= 1, "duplicate routes to {subnet}: {lines}");
        }
    }
    assert_eq!(cluster.nodes[2].fabric_routes().len(), 2);
    mesh(&cluster, &pods);
}

/// A watch that falls behind compaction while connected relists and converges.
///
/// A watch that merely waits is never compacted away: etcd sends it each event as it happens, and a stopped
/// reader only lets them queue in the stream. So the agent is stopped (SIGSTOP) with its watch open, and
/// writes under the watched prefix fill the stream until etcd gives up sending to the watcher (a "slow
/// watcher": its `etcd_debugging_mvcc_slow_watcher_total` gauge). Peers then change, and the store is
/// compacted at its current revision, past every revision the watcher was sent. Resumed, the agent reads
/// what was queued, and then etcd can only tell it that its next revision is compacted: it must relist, and
/// its routes must match the store (a peer deleted meanwhile gone, one changed and one added present).
#[test]
fn a_watch_behind_compaction_relists_and_converges() {
    let mut cluster = Cluster::new(1);
    cluster.start_etcd(&config(json!({ "Type": "host-gw" })), None);
    cluster.add_node(0, &[]);
    start_all(&mut cluster);
    let ok = |out: std::process::Output| {
        assert!(out.status.success(), "etcdctl: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    // Peers as agents write them: on an etcd lease, host-gw on this L2 segment.
    let granted = ok(cluster.etcdctl(&["lease", "grant", "600"]));
    let lease = granted.split_whitespace().nth(1).expect("lease id").to_string();
    let key = |third: u8| format!("/coreos.com/network/subnets/10.244.{third}.0-24");
    let put_peer = |third: u8, host: u8| {
        let attrs = json!({ "PublicIP": segment_ip(0, host).to_string(), "BackendType": "host-gw" });
        ok(cluster.etcdctl(&["put", &format!("--lease={lease}"), &key(third), &attrs.to_string()]));
    };
    put_peer(201, 101);
    put_peer(202, 102);
    let node = &cluster.nodes[0];
    let routes_are = |wanted: &[(u8, u8)]| {
        let routes = node.fabric_routes();
        routes.len() == wanted.len()
            && wanted.iter().all(|(third, host)| {
                let line = format!("10.244.{third}.0/24 via {} dev eth0", segment_ip(0, *host));
                routes.iter().any(|r| r.starts_with(&line))
            })
    };
    let listed = wait_for(CONVERGE, || routes_are(&[(201, 101), (202, 102)]));
    assert!(listed.is_some(), "routes {:?}\n{}", node.fabric_routes(), node.log());
    let before = node.metrics();
    let counter = |text: &str, name: &str| metric(text, name).unwrap_or_else(|| panic!("{name} in:\n{text}"));
    let restarts = counter(&before, "fabricd_watch_restarts_total");
    let errors = counter(&before, "fabricd_etcd_errors_total");
    let infra = &cluster.infra;
    let etcd = cluster.etcd.as_ref().expect("etcd");
    let slow_watchers = || counter(&etcd.metrics(infra), "etcd_debugging_mvcc_slow_watcher_total");
    assert_eq!(slow_watchers(), 0.0, "the agent's watch is in sync");

    // Stopped with its watch open, until etcd stops sending to it. The first writes are large (they fill the
    // HTTP/2 windows and socket buffers), the next small ones fill etcd's queue of responses (128).
    let agent = node.agent.as_ref().expect("agent running");
    agent.signal(Signal::SIGSTOP);
    let stopped = Instant::now();
    let filler = "/coreos.com/network/subnets/filler";
    let large = vec![b'x'; 1 << 20];
    let mut writes = 0;
    let became_slow = loop {
        let value: &[u8] = if writes < 16 { &large } else { b"x" };
        ok(etcd.ctl_in_with_stdin(infra, &["put", filler], value));
        writes += 1;
        if writes > 16 && slow_watchers() > 0.0 {
            break true;
        }
        if writes == 1000 {
            break false;
        }
    };
    if !became_slow {
        agent.signal(Signal::SIGCONT);
        panic!("etcd still sends to the stopped agent's watch after {writes} writes");
    }
    eprintln!("etcd gave up sending to the stopped agent after {writes} writes ({:?})", stopped.elapsed());

    // What changes meanwhile: a peer leaves, one moves to another address, one joins; the filler goes.
    ok(cluster.etcdctl(&["del", &key(201)]));
    put_peer(202, 112);
    put_peer(203, 103);
    ok(cluster.etcdctl(&["del", filler]));
    let status: Value = serde_json::from_str(&ok(cluster.etcdctl(&["get", &key(203), "-w", "json"]))).expect("json");
    let revision = status["header"]["revision"].as_u64().expect("revision");
    ok(cluster.etcdctl(&["compact", &revision.to_string()]));
    let agent = cluster.nodes[0].agent.as_ref().expect("agent");
    agent.signal(Signal::SIGCONT);
    let resumed = Instant::now();

    let node = &cluster.nodes[0];
    let converged = wait_for(CONVERGE, || routes_are(&[(202, 112), (203, 103)]));
    assert!(converged.is_some(), "routes {:?} after the compaction\n{}", node.fabric_routes(), node.log());
    eprintln!("converged {:?} after the agent resumed (stopped {:?})", resumed.elapsed(), resumed - stopped);
    // It relisted because of the compaction: one more watch start, and no lost connection.
    let wanted = format!("watch fell behind compaction (revision {revision}): relisting");
    assert!(node.log().contains(&wanted), "no {wanted:?} in the log:\n{}", node.log());
    let after = node.metrics();
    assert_eq!(counter(&after, "fabricd_watch_restarts_total"), restarts + 1.0, "{after}");
    assert_eq!(counter(&after, "fabricd_etcd_errors_total"), errors, "{after}");
    assert_eq!(counter(&after, "fabricd_peers"), 2.0, "{after}");
    // And it keeps watching from there: a change now arrives as an event.
    put_peer(204, 104);
    let watched = wait_for(CONVERGE, || routes_are(&[(202, 112), (203, 103), (204, 104)]));
    assert!(watched.is_some(), "routes {:?}\n{}", node.fabric_routes(), node.log());
    assert_eq!(counter(&node.metrics(), "fabricd_watch_restarts_total"), restarts + 1.0);
}

#[test]
fn fifty_concurrent_allocations_get_distinct_subnets() {
    let mut cluster = Cluster::new(1);
    cluster.start_etcd(&config(json!({ "Type": "host-gw" })), None);
    let endpoint = format!("--etcd-endpoints={}", cluster.etcd.as_ref().unwrap().endpoint);
    let children: Vec<_> = (0..50)
        .map(|i| {
            let mut command = netns_tests::upstream::clean_command(&cluster.infra, bin("fabricd"));
            command
                .args([
                    &endpoint,
                    &format!("--public-ip=10.99.0.{}", i + 1),
                    "--subnet-file=/nonexistent/subnet.env",
                    "acquire",
                ])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped());
            command.spawn().expect("fabricd acquire")
        })
        .collect();
    let mut subnets = BTreeSet::new();
    for child in children {
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let text = String::from_utf8_lossy(&out.stdout);
        subnets.insert(text.split_whitespace().next().unwrap().to_string());
    }
    assert_eq!(subnets.len(), 50, "{subnets:?}");
    let listing =
        String::from_utf8(cluster.etcdctl(&["get", "--prefix", "/coreos.com/network/subnets/"]).stdout).unwrap();
    let keys: Vec<&str> = listing.lines().filter(|l| l.starts_with('/')).collect();
    assert_eq!(keys.len(), 50);
    let owners: BTreeSet<&str> = listing.lines().filter(|l| l.starts_with('{')).collect();
    assert_eq!(owners.len(), 50);
}

#[test]
fn tls_with_client_certificates() {
    let mut cluster = Cluster::new(1);
    let tls = TlsFiles::make(&cluster.dir, segment_ip(0, 254));
    cluster.start_etcd(&config(json!({ "Type": "host-gw" })), Some(&tls));
    let files = |cert: &std::path::Path, key: &std::path::Path| {
        vec![
            format!("--etcd-cafile={}", tls.ca.display()),
            format!("--etcd-certfile={}", cert.display()),
            format!("--etcd-keyfile={}", key.display()),
        ]
    };
    let good = files(&tls.client_cert, &tls.client_key);
    let good: Vec<&str> = good.iter().map(String::as_str).collect();
    cluster.add_node(0, &good);
    cluster.add_node(0, &good);
    start_all(&mut cluster);
    wait_routes(&cluster, 1);

    let rogue = files(&tls.rogue_cert, &tls.rogue_key);
    let endpoint = format!("--etcd-endpoints={}", cluster.etcd.as_ref().unwrap().endpoint);
    let mut command = netns_tests::upstream::clean_command(&cluster.infra, bin("fabricd"));
    command.arg(&endpoint).args(&rogue).args([
        "--public-ip=192.168.50.99",
        "--subnet-file=/nonexistent/subnet.env",
        "acquire",
    ]);
    let out = command.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a certificate of another CA was accepted");
    assert!(
        stderr.to_lowercase().contains("certificate") || stderr.contains("tls") || stderr.contains("handshake"),
        "unclear error: {stderr}"
    );
    eprintln!("refused as: {stderr}");
    let listing =
        String::from_utf8(cluster.etcdctl(&["get", "--prefix", "/coreos.com/network/subnets/", "--keys-only"]).stdout)
            .unwrap();
    assert_eq!(listing.lines().filter(|l| !l.is_empty()).count(), 2);
}

#[test]
fn static_mode_without_etcd() {
    let mut cluster = Cluster::new(1);
    let (a, b) = (segment_ip(0, 10), segment_ip(0, 11));
    let file = |own: &str| {
        json!({ "Network": "10.244.0.0/16", "Backend": { "Type": "vxlan" }, "Subnet": own,
                "Peers": [ { "Subnet": "10.244.1.0/24", "PublicIP": a.to_string() }, { "Subnet": "10.244.2.0/24", "PublicIP": b.to_string() } ] })
    };
    for own in ["10.244.1.0/24", "10.244.2.0/24"] {
        let path = cluster.dir.join(format!("static-{}.json", &own[7..8]));
        std::fs::write(&path, file(own).to_string()).unwrap();
        cluster.add_node(0, &[&format!("--static-config={}", path.display()), "--metrics-addr="]);
    }
    let subnets = start_all(&mut cluster);
    assert_eq!(subnets, vec!["10.244.1.0/24".parse::<ipnet::IpNet>().unwrap(), "10.244.2.0/24".parse().unwrap()]);
    wait_routes(&cluster, 1);
    let pods = pods(&mut cluster);
    mesh(&cluster, &pods);
}
