//! fabricd's wireguard backend, as flannel's `Type: wireguard`: nodes in network namespaces (two routed
//! segments, or dual stack), etcd in the infra namespace, pods meshing across in each family; the underlay
//! captured to show no pod address in clear; the key kept across restarts and out of the store and logs;
//! agent restart and etcd loss keep the data plane; peers follow joins, leaves and key rotations; leases with
//! a bad, a taken or this node's key are refused; the `MTU` option on the device, subnet.env and pods. Needs a
//! kernel with wireguard (CONFIG_WIREGUARD): the VM lane runs it (`scripts/vm-lane.sh --kernel 6.1
//! fabric_wireguard`).

use std::net::IpAddr;
use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use cnicore::netlink::{Netlink, WgPeer, Wireguard};
use netns_tests::capture::{contains, udp_ports, Capture};
use netns_tests::fabric::{
    config, dual_config, mesh, mesh_all, pods, pods_all, start_all, wait_for, wait_routes, wait_routes6, Cluster,
    FabricNode, CONVERGE, READY,
};
use netns_tests::fabric_faults::{join_and_leave, kill_etcd_and_watch_routes, restart_etcd};
use netns_tests::json;
use netns_tests::linkrig::skip_without_kind;
use nix::sys::signal::Signal;

const PSK: &str = "jD4iUbzdL8h9zD2sAoebvUWdqR7h7JqtzdLzX2LRPnI=";

/// The peers of `device` on `node`, read over generic netlink as `wg show` would.
fn wg_peers(node: &FabricNode, device: &str) -> Vec<WgPeer> {
    node.node.run(|| {
        let index = Netlink::new().unwrap().link_by_name(device).unwrap().map(|l| l.index);
        index.map(|index| Wireguard::new().unwrap().device(index).unwrap().peers).unwrap_or_default()
    })
}

/// The node's lease value in etcd.
fn lease_of(cluster: &Cluster, node: &FabricNode) -> String {
    let listing = String::from_utf8(cluster.etcdctl(&["get", "--prefix", "/coreos.com/network/subnets/"]).stdout);
    let listing = listing.unwrap();
    let public = format!("\"PublicIP\":\"{}\"", node.ip);
    listing.lines().find(|l| l.contains(&public)).unwrap_or_default().to_string()
}

fn wireguard_cluster(segments: usize, nodes: &[usize], backend: serde_json::Value) -> Option<Cluster> {
    if skip_without_kind("wireguard", "CONFIG_WIREGUARD") {
        return None;
    }
    let mut cluster = Cluster::new(segments);
    cluster.start_etcd(&config(backend), None);
    for segment in nodes {
        cluster.add_node(*segment, &[]);
    }
    Some(cluster)
}

#[test]
fn wireguard_three_nodes_encrypted_with_restart_outage_joins_and_leaves() {
    let backend = json!({ "Type": "wireguard", "PSK": PSK, "PersistentKeepaliveInterval": 25 });
    let Some(mut cluster) = wireguard_cluster(2, &[0, 0, 1], backend) else { return };
    let subnets = start_all(&mut cluster);
    wait_routes(&cluster, 2);
    let node = &cluster.nodes[0];
    let link = node.node.ip(&["-d", "link", "show", "flannel-wg"]);
    assert!(link.contains("mtu 1440") && link.contains("wireguard"), "{link}");
    let routes = node.fabric_routes();
    for subnet in &subnets[1..] {
        assert!(routes.iter().any(|r| r.starts_with(&format!("{subnet} dev flannel-wg"))), "{routes:?}");
    }
    let env = std::fs::read_to_string(node.subnet_file()).unwrap();
    assert!(env.contains("FLANNEL_MTU=1440\n"), "{env}");
    // The key: 0600 beside subnet.env, its public half in the lease as flannel writes it, the private half
    // neither in the store nor in the log.
    let key_file = node.subnet_file().with_file_name("wgkey");
    let private = std::fs::read_to_string(&key_file).unwrap();
    assert_eq!(std::fs::metadata(&key_file).unwrap().permissions().mode() & 0o777, 0o600);
    let lease = lease_of(&cluster, node);
    assert!(lease.contains(r#""BackendType":"wireguard","BackendData":{"PublicKey":""#), "{lease}");
    assert!(lease.ends_with(r#"","Port":51820}}"#), "{lease}");
    // (The PSK is in the store by design: it is part of flannel's network config.)
    let all = String::from_utf8(cluster.etcdctl(&["get", "--prefix", "/coreos.com/network"]).stdout).unwrap();
    assert!(!all.contains(private.trim()), "the private key is in the store");
    for secret in [private.trim(), PSK] {
        assert!(!cluster.nodes.iter().any(|n| n.log().contains(secret)), "a secret is in a log");
    }
    let peers = wg_peers(node, "flannel-wg");
    assert_eq!(peers.len(), 2, "{peers:?}");
    let far = peers.iter().find(|p| p.allowed_ips == [subnets[2]]).expect("the far node's peer");
    assert_eq!(far.endpoint, Some(format!("{}:51820", cluster.nodes[2].ip).parse().unwrap()));
    assert!(far.preshared_key.is_some() && far.keepalive == 25);

    // In sync: status sees nothing to change (the peers read back as they were set), and a resync changes
    // nothing (no peer rewritten every pass).
    let status = node.run(&["status"]);
    assert!(status.success() && status.stdout_text.contains("in sync"), "{}{}", status.stdout_text, status.stderr);
    let far_line = format!(
        "{} node {}: wireguard to {} port 51820 (PublicKey ",
        subnets[2], cluster.nodes[2].ip, cluster.nodes[2].ip
    );
    assert!(status.stdout_text.contains(&far_line), "{}", status.stdout_text);
    let applied = |node: &FabricNode| node.log().matches("applied").count();
    let settled = applied(node);
    std::thread::sleep(Duration::from_secs(11));
    assert_eq!(applied(node), settled, "a resync changed something:\n{}", node.log());

    // Pods mesh, and the underlay carries only wireguard's UDP: no pod address, no payload in clear.
    let mut pods = pods(&mut cluster);
    let capture = Capture::start(&cluster.infra, "n1");
    mesh(&cluster, &pods);
    let (from, to) = (&pods[0].1, pods[1].2);
    let marked = from.exec("ping", &["-c", "3", "-i", "0.2", "-p", "c0ffeec0ffee", &to.to_string()], &[], b"");
    assert!(marked.status.success(), "{}", String::from_utf8_lossy(&marked.stdout));
    let frames = capture.stop();
    let tunnelled = frames.iter().filter(|f| udp_ports(f).is_some_and(|(s, d)| s == 51820 || d == 51820)).count();
    assert!(tunnelled >= 6, "{tunnelled} wireguard frames of {} seen", frames.len());
    for (_, _, pod) in &pods {
        let IpAddr::V4(pod) = pod else { unreachable!() };
        assert!(!frames.iter().any(|f| contains(f, &pod.octets())), "pod {pod} in clear on the underlay");
    }
    assert!(!frames.iter().any(|f| contains(f, &[0xc0, 0xff, 0xee, 0xc0, 0xff, 0xee])), "a payload in clear");

    // etcd killed, then an agent killed: nothing moves, pods keep talking; restarted: the same key and subnet.
    kill_etcd_and_watch_routes(&mut cluster);
    cluster.nodes[2].stop(Signal::SIGKILL);
    mesh(&cluster, &pods);
    restart_etcd(&mut cluster);
    let lease_before = lease_of(&cluster, &cluster.nodes[2]);
    cluster.nodes[2].start();
    assert_eq!(cluster.nodes[2].wait_ready(READY), subnets[2]);
    wait_routes(&cluster, 2);
    assert_eq!(lease_of(&cluster, &cluster.nodes[2]), lease_before, "the same key after a restart");
    mesh(&cluster, &pods);

    // A join on the far segment, then its leave: every peer set follows, the device goes with cleanup.
    let joined = |cluster: &Cluster, subnet| {
        assert!(wg_peers(&cluster.nodes[0], "flannel-wg").iter().any(|p| p.allowed_ips == [subnet]));
    };
    join_and_leave(&mut cluster, 1, &mut pods, 2, joined);
    let gone = wait_for(CONVERGE, || wg_peers(&cluster.nodes[0], "flannel-wg").len() == 2);
    assert!(gone.is_some(), "the departed node's peer remains");
    let departed = cluster.nodes.last().unwrap();
    assert!(!departed.node.links().contains(&"flannel-wg".to_string()), "cleanup removes the device");
}

#[test]
fn wireguard_refuses_bad_taken_and_own_keys_and_follows_a_key_rotation() {
    let Some(mut cluster) = wireguard_cluster(1, &[0, 0, 0], json!({ "Type": "wireguard" })) else { return };
    let subnets = start_all(&mut cluster);
    wait_routes(&cluster, 2);
    let pods = pods(&mut cluster);
    mesh(&cluster, &pods);
    let key_of = |node: &FabricNode| {
        let lease = lease_of(&cluster, node);
        let start = lease.find("\"PublicKey\":\"").unwrap() + 13;
        lease[start..start + 44].to_string()
    };
    let (key0, key1) = (key_of(&cluster.nodes[0]), key_of(&cluster.nodes[1]));
    let before = wg_peers(&cluster.nodes[0], "flannel-wg");

    // Forged leases: a key that is not one, node 1's key (older: node 1 keeps it), node 0's own key.
    let forged = |public: &str, key: &str| {
        json!({ "PublicIP": public, "PublicIPv6": null, "BackendType": "wireguard",
                "BackendData": { "PublicKey": key, "Port": 51820 } })
        .to_string()
    };
    let cases = [
        ("10.244.200.0-24", forged("192.168.50.91", "bm90IGEga2V5"), "is not a base64 key of 32 bytes"),
        ("10.244.201.0-24", forged("192.168.50.92", &key1), "is already that of the lease of"),
        ("10.244.202.0-24", forged("192.168.50.93", &key0), "is this node's"),
    ];
    for (key, value, _) in &cases {
        let out = cluster.etcdctl(&["put", &format!("/coreos.com/network/subnets/{key}"), value]);
        assert!(out.status.success());
    }
    let node = &cluster.nodes[0];
    for (key, _, reason) in &cases {
        let subnet = key.replace("-", "/");
        let logged = wait_for(CONVERGE, || {
            node.log().lines().any(|l| l.contains(&format!("refusing the lease of {subnet}")) && l.contains(reason))
        });
        assert!(logged.is_some(), "{subnet} not refused ({reason}):\n{}", node.log());
    }
    std::thread::sleep(Duration::from_millis(1500));
    for (key, _, _) in &cases {
        let subnet = key.replace("-", "/");
        assert_eq!(node.log().matches(&format!("refusing the lease of {subnet}")).count(), 1, "logged once");
    }
    assert_eq!(wg_peers(node, "flannel-wg"), before, "nothing moved: node 1 keeps its peer and allowed IPs");
    assert_eq!(node.fabric_routes().len(), 2);
    mesh(&cluster, &pods);
    for (key, _, _) in &cases {
        cluster.etcdctl(&["del", &format!("/coreos.com/network/subnets/{key}")]);
    }

    // Rotation: node 2's key file replaced (a new key), the agent restarted: peers follow, pods keep meshing.
    let old_lease = lease_of(&cluster, &cluster.nodes[2]);
    let rotated = &mut cluster.nodes[2];
    rotated.stop(Signal::SIGTERM);
    std::fs::remove_file(rotated.subnet_file().with_file_name("wgkey")).unwrap();
    rotated.start();
    assert_eq!(rotated.wait_ready(READY), subnets[2]);
    let old_key = before.iter().find(|p| p.allowed_ips == [subnets[2]]).unwrap().public_key;
    let followed = wait_for(Duration::from_secs(5), || {
        let peers = wg_peers(&cluster.nodes[0], "flannel-wg");
        let far = peers.iter().find(|p| p.allowed_ips == [subnets[2]]);
        peers.len() == 2 && far.is_some_and(|p| p.public_key != old_key)
    });
    assert!(followed.is_some(), "node 0 kept the old key: {:?}", wg_peers(&cluster.nodes[0], "flannel-wg"));
    assert_ne!(lease_of(&cluster, &cluster.nodes[2]), old_lease, "the lease announces the new key");
    mesh(&cluster, &pods);
}

#[test]
fn wireguard_dual_stack_separate_and_one_tunnel() {
    if skip_without_kind("wireguard", "CONFIG_WIREGUARD") {
        return;
    }
    for (mode, devices) in [("separate", &["flannel-wg", "flannel-wg-v6"][..]), ("ipv6", &["flannel-wg"][..])] {
        let mut cluster = Cluster::dual(1);
        cluster.start_etcd(&dual_config(json!({ "Type": "wireguard", "Mode": mode })), None);
        for _ in 0..3 {
            cluster.add_node(0, &[]);
        }
        start_all(&mut cluster);
        wait_routes(&cluster, 2);
        wait_routes6(&cluster, 2);
        let node = &cluster.nodes[0];
        assert_eq!(node.node.links().iter().filter(|l| l.starts_with("flannel-wg")).count(), devices.len());
        let v6 = node.node.ip(&["-d", "link", "show", devices[devices.len() - 1]]);
        assert!(v6.contains("mtu 1420"), "{mode}: {v6}");
        let peers = wg_peers(node, devices[devices.len() - 1]);
        let endpoint = peers[0].endpoint.unwrap();
        assert!(endpoint.is_ipv6() && endpoint.port() == 51821 || mode == "ipv6", "{mode}: {endpoint}");
        if mode == "ipv6" {
            assert!(endpoint.is_ipv6() && endpoint.port() == 51820, "one tunnel over IPv6: {endpoint}");
            assert_eq!(peers[0].allowed_ips.len(), 2, "both families' subnets on one peer: {peers:?}");
        }
        let pods = pods_all(&mut cluster);
        mesh_all(&cluster, &pods, 2);
    }
}

/// flannel's `MTU` option: the packets' size on the underlay. The device and subnet.env's FLANNEL_MTU are it
/// less wireguard's 60 bytes over IPv4; a full-size don't-fragment ping between pods crosses, one byte more
/// does not leave the pod.
#[test]
fn wireguard_mtu_option_reaches_the_device_subnet_env_and_pods() {
    let Some(mut cluster) = wireguard_cluster(1, &[0, 0], json!({ "Type": "wireguard", "MTU": 1400 })) else {
        return;
    };
    start_all(&mut cluster);
    wait_routes(&cluster, 1);
    for node in &cluster.nodes {
        let link = node.node.ip(&["-d", "link", "show", "flannel-wg"]);
        assert!(link.contains("mtu 1340"), "MTU 1400 less wireguard's 60: {link}");
        let env = std::fs::read_to_string(node.subnet_file()).unwrap();
        assert!(env.contains("FLANNEL_MTU=1340\n"), "{env}");
    }
    let pods = pods(&mut cluster);
    mesh(&cluster, &pods);
    let ping = |size: &str| {
        let to = pods[1].2.to_string();
        pods[0].1.exec("ping", &["-c1", "-W2", "-M", "do", "-s", size, &to], &[], b"").status.success()
    };
    assert!(ping("1312"), "a 1340-byte don't-fragment ping crosses the tunnel");
    assert!(!ping("1313"), "1341 bytes do not fit the pod's MTU");
}
