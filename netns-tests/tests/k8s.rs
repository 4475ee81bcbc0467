//! The plugins under a real Kubernetes v1.28.7 (`scripts/cluster.sh`): kube-apiserver, kube-controller-manager
//! allocating podCIDRs, kube-scheduler, and per node containerd 1.6 rendering the kubenet conflist from the
//! kubelet's podCIDR, the kubelet and kube-proxy in iptables mode. What a user of a cluster sees: nodes Ready,
//! pods Running with addresses of their node's podCIDR, pods reaching pods on their node and across nodes with
//! their source address kept, traffic to outside the cluster masqueraded to the node's address, Services (ClusterIP from pods, a pod through its own Service, NodePort from the
//! wan), hostPort from another node and the wan, the bandwidth annotations on the pod's veth; and after
//! deletion, restarts of the kubelet and containerd, and a swap of the plugins with pods running: nothing left.

use std::io::{Read, Write};
use std::time::Duration;

use netns_tests::cluster::{self, Cluster, ClusterConfig, Pod};
use netns_tests::eventually;
use netns_tests::workloads::*;

/// A hostPort on node1 reached from node2 and the wan; bandwidth annotations as tbf on a pod's veth on node2.
fn host_port_and_bandwidth(cluster: &Cluster) {
    cluster.apply(&pinned_pod("hostport", "node1", Some(8088), None));
    cluster.apply(&pinned_pod("shaped", "node2", None, Some("10M")));
    cluster.running_pods("app=hostport", 1, POD_TIMEOUT);
    cluster.running_pods("app=shaped", 1, POD_TIMEOUT);
    let node1 = cluster.get_json(&["node", "node1"]);
    let ip = node1["status"]["addresses"][0]["address"].as_str().unwrap().to_string();
    for from in ["node2", "wan"] {
        let answer = eventually(REACH_TIMEOUT, || cluster.node_get(from, &format!("http://{ip}:8088/hostname")))
            .unwrap_or_else(|e| panic!("{from} -> hostPort {ip}:8088: {e}"));
        assert_eq!(answer.trim(), "hostport", "{from} reached the hostPort pod");
    }
    let qdiscs = String::from_utf8_lossy(&cluster.node_exec("node2", &["tc", "qdisc", "show"]).stdout).into_owned();
    assert!(
        qdiscs.lines().filter(|l| l.contains("tbf") && l.contains("rate 10Mbit")).count() >= 2,
        "tbf at 10Mbit on the pod's veth and its ifb on node2:\n{qdiscs}"
    );
    cluster.kubectl_ok(&["delete", "pod", "hostport", "shaped", "--wait=true"]);
}

/// The kubelet, then containerd, restarted on node1 with pods running: the pods keep their networking and a
/// new pod starts.
fn restarts_keep_pods(cluster: &Cluster, pods: &[Pod]) {
    let (a, b) = (by_node(pods, "node1")[0], by_node(pods, "node2")[0]);
    for daemon in ["kubelet", "containerd"] {
        cluster.script_ok(&["restart", "node1", daemon]);
        assert_pod_to_pod(cluster, b, a);
        assert_pod_to_pod(cluster, a, b);
    }
    cluster.apply(&pinned_pod("after-restart", "node1", None, None));
    let fresh = cluster.running_pods("app=after-restart", 1, POD_TIMEOUT);
    assert_pod_to_pod(cluster, &fresh[0], b);
    cluster.kubectl_ok(&["delete", "pod", "after-restart", "--wait=true"]);
}

/// node1's plugins swapped for the reference ones with pods running: old pods keep working, are deleted by the
/// reference; the reference's new pod works and is deleted by ours after the swap back.
fn takeover_both_ways(cluster: &Cluster) {
    cluster.script_ok(&["plugins", "node1", "reference"]);
    let pods = cluster.running_pods("app=web", 2 * cluster.config.nodes, POD_TIMEOUT);
    let old = by_node(&pods, "node1")[0].clone();
    assert_pod_to_pod(cluster, &old, by_node(&pods, "node2")[0]);
    cluster.kubectl_ok(&["delete", "pod", &old.name, "--wait=true"]);
    cluster.apply(&pinned_pod("by-reference", "node1", None, None));
    let theirs = cluster.running_pods("app=by-reference", 1, POD_TIMEOUT);
    let pods = cluster.running_pods("app=web", 2 * cluster.config.nodes, POD_TIMEOUT);
    assert_pod_to_pod(cluster, by_node(&pods, "node2")[0], &theirs[0]);
    cluster.script_ok(&["plugins", "node1", &cluster::ours()]);
    cluster.kubectl_ok(&["delete", "pod", "by-reference", "--wait=true"]);
}

/// What an operator reaches through the API server and the kubelet: a pod's logs, and `kubectl port-forward`
/// from the machine's loopback to a pod's port.
fn logs_and_port_forward(cluster: &Cluster, pods: &[Pod]) {
    let pod = &pods[0];
    let logs = cluster.kubectl_ok(&["logs", &pod.name]);
    assert!(logs.contains("Started HTTP server on port 8080"), "{}'s log through the kubelet: {logs}", pod.name);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free loopback port");
    let port = listener.local_addr().expect("addr").port();
    drop(listener);
    let mut forward = std::process::Command::new(cluster::kubectl())
        .arg("--kubeconfig")
        .arg(cluster.kubeconfig())
        .args(["port-forward", &format!("pod/{}", pod.name), &format!("{port}:8080")])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("kubectl port-forward");
    let answer = eventually(REACH_TIMEOUT, || {
        let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
        stream.write_all(b"GET /hostname HTTP/1.0\r\n\r\n").map_err(|e| e.to_string())?;
        let mut body = String::new();
        stream.read_to_string(&mut body).map_err(|e| e.to_string())?;
        if body.ends_with(&pod.name) {
            Ok(body)
        } else {
            Err(body)
        }
    });
    let _ = forward.kill();
    let _ = forward.wait();
    answer.unwrap_or_else(|e| panic!("port-forward to {}: {e}", pod.name));
}

#[test]
fn kubenet_cluster_on_our_plugins() {
    if !cluster::available() {
        return;
    }
    let cluster = Cluster::up(ClusterConfig::default());
    let pods = deployment_spreads_and_connects(&cluster);
    logs_and_port_forward(&cluster, &pods);
    assert_outside_sees_the_node(&cluster, &pods[0]);
    services_from_pods(&cluster, &pods, "");
    node_port_from_wan(&cluster, "");
    host_port_and_bandwidth(&cluster);
    restarts_keep_pods(&cluster, &pods);
    takeover_both_ways(&cluster);
    delete_everything(&cluster);
}

/// With no pod network (`--network none`) a node stays NotReady; once a conflist is in its /etc/cni/net.d it
/// turns Ready.
#[test]
fn node_turns_ready_only_with_a_cni_config() {
    if !cluster::available() {
        return;
    }
    let cluster = Cluster::up(ClusterConfig { nodes: 1, network: "none", ..ClusterConfig::default() });
    let ready = |c: &Cluster| {
        let node = c.get_json(&["node", "node1"]);
        let conditions = node["status"]["conditions"].as_array().cloned().unwrap_or_default();
        conditions.iter().any(|c| c["type"] == "Ready" && c["status"] == "True")
    };
    std::thread::sleep(Duration::from_secs(10));
    assert!(!ready(&cluster), "node1 is NotReady without a CNI config");
    let cidr = pod_cidrs(&cluster, "node1")[0];
    let conflist = format!(
        r#"{{"cniVersion": "1.0.0", "name": "kubenet", "plugins": [{{"type": "bridge", "bridge": "cbr0", "isGateway": true, "ipMasq": true, "ipam": {{"type": "host-local", "ranges": [[{{"subnet": "{cidr}"}}]], "routes": [{{"dst": "0.0.0.0/0"}}]}}}}, {{"type": "portmap", "capabilities": {{"portMappings": true}}}}]}}"#
    );
    let write = format!("cat > /etc/cni/net.d/10-kubenet.conflist <<'EOF'\n{conflist}\nEOF");
    assert!(cluster.node_exec("node1", &["sh", "-c", &write]).status.success());
    eventually(Duration::from_secs(60), || if ready(&cluster) { Ok(()) } else { Err(()) })
        .unwrap_or_else(|_| panic!("node1 did not turn Ready with its conflist\n{}", cluster.logs()));
    cluster.apply(&pinned_pod("first", "node1", None, None));
    let pod = cluster.running_pods("app=first", 1, POD_TIMEOUT);
    assert!(cidr.contains(&pod[0].ips[0]), "the pod's address {:?} is of {cidr}", pod[0].ips);
}
