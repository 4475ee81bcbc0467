//! fabricd, the node agent, on a real etcd (Debian's etcd-server 3.4) with nodes in namespaces: host-gw on
//! one L2 segment, vxlan across two segments joined by a router, direct routing, path MTU, nodes joining,
//! leaving and changing address, etcd killed and restarted, an agent killed and restarted, a watch fallen
//! behind compaction while connected, drift repaired, 50 concurrent allocations, TLS with client certificates,
//! static mode, cleanup.
//!
//! Timings printed here are for information; the figures are measured by scripts/bench-fabric.sh.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use netns_tests::fabric::{metric, segment_ip, tcp_source, wait_for, wan_ip6, Cluster, TlsFiles, WAN_IP};
use netns_tests::{bin, json, TestNetns, Value};
use nix::sys::signal::Signal;

const READY: Duration = Duration::from_secs(15);
/// Generous bounds for what the issue's goals put at one second (the figures are in docs/benchmarks.md).
const CONVERGE: Duration = Duration::from_secs(3);

fn config(backend: Value) -> Value {
    json!({ "Network": "10.244.0.0/16", "SubnetLen": 24, "Backend": backend })
}

/// Starts every node's agent and waits until each wrote its conflist and routes to all the others.
fn start_all(cluster: &mut Cluster) -> Vec<ipnet::IpNet> {
    for node in &mut cluster.nodes {
        node.start();
    }
    let subnets: Vec<_> = cluster.nodes.iter().map(|n| n.wait_ready(READY)).collect();
    let distinct: BTreeSet<_> = subnets.iter().collect();
    assert_eq!(distinct.len(), subnets.len(), "subnets {subnets:?}");
    subnets
}

fn wait_routes(cluster: &Cluster, count: usize) {
    for node in &cluster.nodes {
        let done = wait_for(CONVERGE, || node.fabric_routes().len() == count);
        assert!(
            done.is_some(),
            "{}: routes {:?}, wanted {count}\n{}",
            node.node.name,
            node.fabric_routes(),
            node.log()
        );
    }
}

fn pods(cluster: &mut Cluster) -> Vec<(usize, TestNetns, IpAddr)> {
    let mut pods = Vec::new();
    for (index, node) in cluster.nodes.iter_mut().enumerate() {
        let (pod, ip) = node.add_pod();
        pods.push((index, pod, ip));
    }
    pods
}

fn mesh(cluster: &Cluster, pods: &[(usize, TestNetns, IpAddr)]) {
    let refs: Vec<(usize, &TestNetns, IpAddr)> = pods.iter().map(|(i, p, ip)| (*i, p, *ip)).collect();
    cluster.assert_full_mesh(&refs);
}

fn ping(from: &TestNetns, to: IpAddr, extra: &[&str]) -> std::process::Output {
    let mut args = vec!["-c1", "-W1"];
    args.extend_from_slice(extra);
    let to = to.to_string();
    args.push(&to);
    from.exec("ping", &args, &[], b"")
}

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
    }
    let status = cluster.nodes[0].run(&["status"]);
    assert!(status.success() && status.stdout_text.contains("in sync"), "{} {}", status.stdout_text, status.stderr);
}

#[test]
fn masquerade_with_the_nftables_backend() {
    let mut cluster = Cluster::new(1);
    cluster.start_etcd(&config(json!({ "Type": "host-gw" })), None);
    for _ in 0..2 {
        cluster.add_node(0, &["--ip-masq", "--firewall-backend=nftables"]);
    }
    start_all(&mut cluster);
    wait_routes(&cluster, 1);
    let pods = pods(&mut cluster);
    // Pod to pod keeps the source; leaving the cluster is masqueraded to the node's address.
    mesh(&cluster, &pods);
    for (index, pod, _) in &pods {
        assert_eq!(tcp_source(pod, &cluster.wan, WAN_IP.into()), Some(cluster.nodes[*index].ip.into()));
    }
    let node = &mut cluster.nodes[0];
    let table = node.node.exec("nft", &["list", "table", "inet", "fabricd"], &[], b"");
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(table.contains("ip saddr 10.244.0.0/16 ip daddr != { 10.244.0.0/16, 224.0.0.0/4 } masquerade"), "{table}");
    let iptables = node.node.exec("iptables-save", &["-t", "nat"], &[], b"");
    assert!(!String::from_utf8_lossy(&iptables.stdout).contains("FLANNEL-POSTRTG"), "one backend only");
    node.stop(Signal::SIGTERM);
    let cleanup = node.run(&["cleanup"]);
    assert!(cleanup.success(), "{}", cleanup.stderr);
    assert!(!node.node.exec("nft", &["list", "table", "inet", "fabricd"], &[], b"").status.success(), "table removed");
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
    let metrics = node.node.exec("curl", &["-s", "http://127.0.0.1:9799/metrics"], &[], b"");
    let metrics = String::from_utf8_lossy(&metrics.stdout);
    if metrics.is_empty() {
        eprintln!("curl missing: metrics not checked");
    } else {
        assert!(
            metrics.contains("fabricd_peers 2\n") && !metrics.contains("fabricd_drift_repairs_total 0\n"),
            "{metrics}"
        );
    }

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

fn dual_config(backend: Value) -> Value {
    json!({ "EnableIPv6": true, "Network": "10.244.0.0/16", "SubnetLen": 24, "IPv6Network": "fd00:10:244::/56",
            "Backend": backend })
}

/// Waits until every node has `count` IPv6 routes of fabricd's.
fn wait_routes6(cluster: &Cluster, count: usize) {
    for node in &cluster.nodes {
        let done = wait_for(CONVERGE, || node.fabric_routes6().len() == count);
        assert!(
            done.is_some(),
            "{}: IPv6 routes {:?}, wanted {count}\n{}",
            node.node.name,
            node.fabric_routes6(),
            node.log()
        );
    }
}

/// One pod per node, with its addresses (IPv4 first in a dual-stack cluster).
fn pods_all(cluster: &mut Cluster) -> Vec<(usize, TestNetns, Vec<IpAddr>)> {
    cluster
        .nodes
        .iter_mut()
        .enumerate()
        .map(|(index, node)| {
            let (pod, ips) = node.add_pod_all();
            (index, pod, ips)
        })
        .collect()
}

/// Pod to pod across nodes in each family the pods have, the receiver seeing the sender pod's own address.
/// IPv6 neighbour discovery along the path settles first (each pod pings each other pod, up to 5 s).
fn mesh_all(cluster: &Cluster, pods: &[(usize, TestNetns, Vec<IpAddr>)], families: usize) {
    for (_, from, _) in pods {
        for (_, _, ips) in pods {
            for to in ips.iter().filter(|ip| ip.is_ipv6()) {
                let settled = wait_for(Duration::from_secs(5), || ping(from, *to, &[]).status.success());
                assert!(settled.is_some(), "no IPv6 path to {to}");
            }
        }
    }
    for family in 0..families {
        let refs: Vec<(usize, &TestNetns, IpAddr)> = pods.iter().map(|(i, p, ips)| (*i, p, ips[family])).collect();
        // Dual stack: IPv4 first, then IPv6; an IPv6-only pod has one IPv6 address.
        let wanted_v6 = family == 1 || families == 1;
        assert!(refs.iter().all(|(_, _, ip)| ip.is_ipv6() == wanted_v6), "family {family} of {families}");
        cluster.assert_full_mesh(&refs);
    }
}

fn vtep_mac(ip: IpAddr) -> String {
    let tail: Vec<u8> = match ip {
        IpAddr::V4(ip) => [&[0x0e, 0xfa][..], &ip.octets()[..]].concat(),
        // fabricd's: an FNV-1a hash of the IPv6 address.
        IpAddr::V6(ip) => {
            let hash = ip.octets().iter().fold(0x811c_9dc5u32, |h, b| (h ^ u32::from(*b)).wrapping_mul(0x0100_0193));
            [&[0x0e, 0xfb][..], &hash.to_be_bytes()[..]].concat()
        }
    };
    tail.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":")
}

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
            let table = node.node.exec("nft", &["list", "table", "inet", "fabricd"], &[], b"");
            let table = String::from_utf8_lossy(&table.stdout);
            assert!(
                table.contains("ip6 saddr fd00:10:244::/56 ip6 daddr != { fd00:10:244::/56, ff00::/8 } masquerade"),
                "{table}"
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
