//! fabricd's ipip backend, as flannel's `Type: ipip`: nodes in network namespaces on two routed segments,
//! etcd in the infra namespace, pods pinging across through the `flannel.ipip` device; `DirectRouting`;
//! agent restart and etcd loss keep the data plane; joins and leaves. Needs a kernel with ipip
//! (CONFIG_NET_IPIP): the VM lane runs it (`scripts/vm-lane.sh --kernel 6.1 fabric_ipip`).

use netns_tests::fabric::{config, mesh, ping, pods, start_all, wait_for, wait_routes, Cluster, CONVERGE, READY};
use netns_tests::fabric_faults::{join_and_leave, kill_etcd_and_watch_routes, restart_etcd};
use netns_tests::json;
use netns_tests::linkrig::skip_without_kind;
use nix::sys::signal::Signal;

fn ipip_cluster(direct_routing: bool) -> Option<Cluster> {
    if skip_without_kind("ipip", "CONFIG_NET_IPIP") {
        return None;
    }
    let mut cluster = Cluster::new(2);
    cluster.start_etcd(&config(json!({ "Type": "ipip", "DirectRouting": direct_routing })), None);
    cluster.add_node(0, &[]);
    cluster.add_node(0, &[]);
    cluster.add_node(1, &[]);
    Some(cluster)
}

#[test]
fn ipip_across_routed_segments_with_path_mtu_direct_routing_and_cleanup() {
    let Some(mut cluster) = ipip_cluster(false) else { return };
    let subnets = start_all(&mut cluster);
    wait_routes(&cluster, 2);
    let node = &cluster.nodes[0];
    let link = node.node.ip(&["-d", "link", "show", "flannel.ipip"]);
    assert!(
        link.contains("mtu 1480") && link.contains("ipip") && link.contains(&format!("local {}", node.ip)),
        "{link}"
    );
    let address = node.node.ip(&["addr", "show", "dev", "flannel.ipip"]);
    assert!(address.contains(&format!("inet {}/32", subnets[0].addr())), "{address}");
    for (peer, subnet) in cluster.nodes.iter().zip(&subnets).skip(1) {
        let route = format!("{subnet} via {} dev flannel.ipip", peer.ip);
        let routes = node.fabric_routes();
        assert!(routes.iter().any(|r| r.starts_with(&route) && r.contains("onlink")), "{routes:?} lacks {route}");
    }
    let listing =
        String::from_utf8(cluster.etcdctl(&["get", "--prefix", "/coreos.com/network/subnets/"]).stdout).unwrap();
    let lease = format!(r#"{{"PublicIP":"{}","PublicIPv6":null,"BackendType":"ipip","BackendData":null}}"#, node.ip);
    assert!(listing.contains(&lease), "as flannel writes it: {listing}");
    let env = std::fs::read_to_string(node.subnet_file()).unwrap();
    assert!(env.contains("FLANNEL_MTU=1480\n"), "{env}");

    let pods = pods(&mut cluster);
    mesh(&cluster, &pods);
    // Path MTU: pods get 1480; a full-size don't-fragment ping crosses the tunnel, one byte more fails.
    let (from, to) = (&pods[0].1, pods[2].2);
    let full = ping(from, to, &["-M", "do", "-s", "1452"]);
    assert!(full.status.success(), "1480-byte DF ping: {}", String::from_utf8_lossy(&full.stdout));
    assert!(!ping(from, to, &["-M", "do", "-s", "1453"]).status.success());

    // Drift: the device deleted by hand comes back with its routes.
    let node = &cluster.nodes[0];
    node.node.ip(&["link", "del", "flannel.ipip"]);
    let back = wait_for(CONVERGE, || node.fabric_routes().len() == 2);
    assert!(back.is_some(), "device not repaired: {:?}\n{}", node.fabric_routes(), node.log());
    mesh(&cluster, &pods);

    // DirectRouting: the same-segment peer over eth0, the far one still through the tunnel.
    cluster.etcdctl(&[
        "put",
        "/coreos.com/network/config",
        &config(json!({ "Type": "ipip", "DirectRouting": true })).to_string(),
    ]);
    for node in &mut cluster.nodes {
        node.stop(Signal::SIGTERM);
        node.start();
    }
    let node = &cluster.nodes[0];
    let direct = format!("{} via {} dev eth0", subnets[1], cluster.nodes[1].ip);
    let tunnelled = format!("{} via {} dev flannel.ipip", subnets[2], cluster.nodes[2].ip);
    let switched = wait_for(READY, || {
        let routes = node.fabric_routes();
        routes.iter().any(|r| r.starts_with(&direct)) && routes.iter().any(|r| r.starts_with(&tunnelled))
    });
    assert!(switched.is_some(), "{:?}\n{}", node.fabric_routes(), node.log());
    mesh(&cluster, &pods);

    // Cleanup: routes and device gone.
    let node = &mut cluster.nodes[0];
    node.stop(Signal::SIGTERM);
    let cleanup = node.run(&["cleanup"]);
    assert!(cleanup.success(), "{}", cleanup.stderr);
    assert!(node.fabric_routes().is_empty() && !node.node.links().contains(&"flannel.ipip".to_string()));
}

#[test]
fn ipip_keeps_the_data_plane_through_outages_and_follows_joins_and_leaves() {
    let Some(mut cluster) = ipip_cluster(false) else { return };
    let subnets = start_all(&mut cluster);
    wait_routes(&cluster, 2);
    let mut pods = pods(&mut cluster);

    // etcd killed: nothing removed, pods keep talking; an agent killed and restarted: same subnet, same routes.
    kill_etcd_and_watch_routes(&mut cluster);
    mesh(&cluster, &pods);
    cluster.nodes[2].stop(Signal::SIGKILL);
    mesh(&cluster, &pods);
    restart_etcd(&mut cluster);
    cluster.nodes[2].start();
    assert_eq!(cluster.nodes[2].wait_ready(READY), subnets[2]);
    wait_routes(&cluster, 2);

    // A join on the far segment, then its leave.
    join_and_leave(&mut cluster, 1, &mut pods, 2, |_, _| {});
}
