//! flannel's own manifest (`../shared/kubernetes/kube-flannel.yml`, flannel v0.28.9's) on the local cluster with
//! only its two image names changed, to images of fabricd (as `/opt/bin/flanneld`) and of our flannel plugin
//! (`scripts/cluster.sh up --network flannel`): it runs with the manifest's own security context (not privileged;
//! NET_ADMIN, NET_RAW) and flags (`--ip-masq --kube-subnet-mgr --healthz-port=8081`). Shown: the DaemonSet ready
//! on every node, the nodes' NetworkUnavailable false, the probes' /healthz and /readyz answering on 8081, pods
//! on different nodes reaching each other with their addresses kept, `kubectl delete node` removing that node's
//! route on the other, traffic to outside the cluster masqueraded to the node's address (pod to pod keeps it),
//! Services (ClusterIP from pods on both nodes, a pod through its own Service, NodePort from the wan);
//! then dual stack on vxlan (flannel.1 and flannel-v6.1) and with `"Type": "host-gw"` in net-conf.json.

use std::time::Duration;

use netns_tests::cluster::{self, Cluster, ClusterConfig};
use netns_tests::eventually;
use netns_tests::workloads::*;

const DUAL: &str = "ipFamilyPolicy: RequireDualStack\n  ipFamilies: [IPv4, IPv6]";

fn flannel_ready(cluster: &Cluster) {
    let ready = eventually(Duration::from_secs(120), || {
        let ds = cluster.get_json(&["daemonset", "-n", "kube-flannel", "kube-flannel-ds"]);
        let ready = ds["status"]["numberReady"].as_u64().unwrap_or(0);
        if ready == cluster.config.nodes as u64 {
            Ok(())
        } else {
            Err(ds["status"].clone())
        }
    });
    ready.unwrap_or_else(|status| panic!("flannel's DaemonSet not ready on every node: {status}\n{}", cluster.logs()));
    for node in cluster.nodes() {
        let obj = cluster.get_json(&["node", &node]);
        let conditions = obj["status"]["conditions"].as_array().cloned().unwrap_or_default();
        assert!(
            conditions.iter().any(|c| c["type"] == "NetworkUnavailable" && c["status"] == "False"),
            "{node}: NetworkUnavailable false: {conditions:?}"
        );
        for path in ["/healthz", "/readyz"] {
            cluster
                .node_get(&node, &format!("http://127.0.0.1:8081{path}"))
                .unwrap_or_else(|e| panic!("{node}: fabricd's {path} on 8081: {e}"));
        }
    }
}

/// fabricd logged no error on any node (a masquerade that never went in shows only there and on the way out).
fn no_errors_logged(cluster: &Cluster) {
    let logs =
        cluster.kubectl_ok(&["logs", "-n", "kube-flannel", "-l", "app=flannel", "-c", "kube-flannel", "--tail=-1"]);
    let errors: Vec<&str> = logs.lines().filter(|l| l.contains("error")).collect();
    assert!(errors.is_empty(), "fabricd logged errors:\n{}", errors.join("\n"));
}

#[test]
fn flannel_manifest_runs_fabricd() {
    if !cluster::available() {
        return;
    }
    let cluster = Cluster::up(ClusterConfig {
        network: "flannel",
        containerd: cluster::containerd("2.1"),
        ..ClusterConfig::default()
    });
    flannel_ready(&cluster);
    let pods = deployment_spreads_and_connects(&cluster);
    assert_outside_sees_the_node(&cluster, &pods[0]);
    services_from_pods(&cluster, &pods, "");
    node_port_from_wan(&cluster, "");
    no_errors_logged(&cluster);
    let node2_cidr = pod_cidrs(&cluster, "node2")[0].to_string();
    let route = |c: &Cluster| {
        String::from_utf8_lossy(&c.node_exec("node1", &["ip", "route", "show", &node2_cidr]).stdout).into_owned()
    };
    assert!(!route(&cluster).is_empty(), "node1 routes node2's {node2_cidr}");
    cluster.kubectl_ok(&["delete", "node", "node2"]);
    eventually(Duration::from_secs(30), || if route(&cluster).is_empty() { Ok(()) } else { Err(route(&cluster)) })
        .unwrap_or_else(|r| panic!("node2 deleted, node1 still routes its {node2_cidr}: {r}"));
}

#[test]
fn flannel_manifest_dual_stack_vxlan() {
    if !cluster::available() {
        return;
    }
    let cluster = Cluster::up(ClusterConfig { network: "flannel", dual_stack: true, ..ClusterConfig::default() });
    flannel_ready(&cluster);
    let pods = deployment_spreads_and_connects(&cluster);
    for pod in &pods {
        assert_eq!(pod.ips.len(), 2, "{} has an address of each family: {:?}", pod.name, pod.ips);
    }
    let links = String::from_utf8_lossy(&cluster.node_exec("node1", &["ip", "-d", "link"]).stdout).into_owned();
    for device in ["flannel.1:", "flannel-v6.1:"] {
        assert!(links.contains(device), "vxlan: node1 has {device}\n{links}");
    }
    for pod in by_node(&pods, "node2") {
        assert_outside_sees_the_node(&cluster, pod);
    }
    services_from_pods(&cluster, &pods, DUAL);
    node_port_from_wan(&cluster, DUAL);
    no_errors_logged(&cluster);
}

#[test]
fn flannel_manifest_dual_stack_host_gw() {
    if !cluster::available() {
        return;
    }
    let config =
        ClusterConfig { network: "flannel", dual_stack: true, flannel_backend: "host-gw", ..ClusterConfig::default() };
    let cluster = Cluster::up(config);
    flannel_ready(&cluster);
    let pods = deployment_spreads_and_connects(&cluster);
    for pod in &pods {
        assert_eq!(pod.ips.len(), 2, "{} has an address of each family: {:?}", pod.name, pod.ips);
    }
    let routes = String::from_utf8_lossy(&cluster.node_exec("node1", &["ip", "-6", "route"]).stdout).into_owned();
    assert!(
        routes.contains("via fd00:172:31::12"),
        "host-gw: node1 routes node2's IPv6 subnet via its address:\n{routes}"
    );
}
