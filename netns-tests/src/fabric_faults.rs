//! What every backend's fabric must ride out, for the backend test files (fabric_ipip.rs, fabric_wireguard.rs):
//! the store lost for a while (no route moves, pods keep talking), and a node joining then leaving.

use std::time::{Duration, Instant};

use ipnet::IpNet;
use nix::sys::signal::Signal;

use crate::fabric::{mesh, wait_for, wait_routes, Cluster, CONVERGE, READY};
use crate::TestNetns;

/// Kills etcd and checks for 3 s that no node's fabricd routes change; etcd stays down.
pub fn kill_etcd_and_watch_routes(cluster: &mut Cluster) {
    let before: Vec<Vec<String>> = cluster.nodes.iter().map(|n| n.fabric_routes()).collect();
    cluster.etcd.as_mut().expect("etcd started").kill();
    let outage = Instant::now();
    while outage.elapsed() < Duration::from_secs(3) {
        let now: Vec<Vec<String>> = cluster.nodes.iter().map(|n| n.fabric_routes()).collect();
        assert_eq!(now, before, "a route changed during the store outage");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Starts etcd again after [`kill_etcd_and_watch_routes`].
pub fn restart_etcd(cluster: &mut Cluster) {
    let (etcd, infra) = (&mut cluster.etcd, &cluster.infra);
    etcd.as_mut().expect("etcd started").restart(infra);
}

/// A node joins on `segment` (every node then has `peers` + 1 routes; `joined` checks more), its pod meshes
/// with `pods`, then it leaves with `fabricd cleanup`: the others drop their routes to it, and it is left with
/// none. Its subnet.
pub fn join_and_leave(
    cluster: &mut Cluster,
    segment: usize,
    pods: &mut Vec<(usize, TestNetns, std::net::IpAddr)>,
    peers: usize,
    joined: impl Fn(&Cluster, IpNet),
) -> IpNet {
    let new = cluster.add_node(segment, &[]);
    cluster.nodes[new].start();
    let subnet = cluster.nodes[new].wait_ready(READY);
    wait_routes(cluster, peers + 1);
    joined(cluster, subnet);
    let (pod, ip) = cluster.nodes[new].add_pod();
    pods.push((new, pod, ip));
    mesh(cluster, pods);
    cluster.nodes[new].stop(Signal::SIGTERM);
    let cleanup = cluster.nodes[new].run(&["cleanup"]);
    assert!(cleanup.success(), "{}", cleanup.stderr);
    let left = wait_for(CONVERGE, || {
        cluster.nodes[..new].iter().all(|n| !n.fabric_routes().iter().any(|r| r.starts_with(&subnet.to_string())))
    });
    assert!(left.is_some(), "routes to the departed node remain");
    assert!(cluster.nodes[new].fabric_routes().is_empty(), "the departed node keeps routes");
    pods.pop();
    mesh(cluster, pods);
    subnet
}
