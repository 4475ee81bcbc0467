//! NetworkPolicy on the local cluster (`scripts/cluster.sh up --network-policy`): cni-netpol on every node
//! watching the real API server, judged with real connections between pods on one node and across nodes, as
//! Kubernetes' netpol suite probes them (agnhost `connect`), while policies and labels change: open without a
//! policy, default deny of a namespace's ingress, a namespace selector opening one port, a pod selector
//! following a label set later, and open again once the policies are deleted. Also judged: a client outside the
//! cluster (the wan) through a NodePort on either node (kube-proxy's DNAT, and its SNAT when the pod is on the
//! other node), and the kubelet's readiness probes, which reach pods under default deny (traffic between a pod
//! and its own node is always allowed, as Kubernetes defines it).

use std::net::SocketAddr;
use std::time::Duration;

use netns_tests::cluster::{self, Cluster, ClusterConfig, Pod, AGNHOST};
use netns_tests::eventually;

/// A pod `name` in namespace `ns` on `node`, serving TCP on 80 and 81.
fn server(ns: &str, name: &str, node: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: "{ns}", labels: {{pod: {name}}}}}
spec:
  nodeName: {node}
  terminationGracePeriodSeconds: 1
  containers:
  - name: a
    image: {AGNHOST}
    args: ["porter"]
    env: [{{name: SERVE_PORT_80, value: foo}}, {{name: SERVE_PORT_81, value: foo}}]
    readinessProbe: {{httpGet: {{path: /, port: 80}}, periodSeconds: 1, failureThreshold: 2}}
"#
    )
}

/// Whether `from` (namespace/name) connects to `to` on TCP `port`, once (agnhost connect, 1 s).
fn connects(cluster: &Cluster, from: (&str, &str), to: SocketAddr) -> bool {
    let target = to.to_string();
    let out = cluster.kubectl(&["exec", "-n", from.0, from.1, "--", "/agnhost", "connect", &target, "--timeout=1s"]);
    out.status.success()
}

/// Waits until `from` -> `to`:`port` is `allowed` on every address of `to` (each family of a dual-stack pod):
/// enforcement follows a change within a moment.
fn expect(cluster: &Cluster, from: (&str, &str), to: &Pod, port: u16, allowed: bool) {
    for ip in &to.ips {
        let target = SocketAddr::new(*ip, port);
        let seen = eventually(Duration::from_secs(20), || match connects(cluster, from, target) == allowed {
            true => Ok(()),
            false => Err(()),
        });
        let verb = if allowed { "should reach but does not reach" } else { "should be denied but reaches" };
        assert!(seen.is_ok(), "{}/{} {verb} {} at {target}", from.0, from.1, to.name);
    }
}

/// The pod's addresses, one per family.
fn pod(cluster: &Cluster, ns: &str, name: &str) -> Pod {
    let json = cluster.get_json(&["pod", "-n", ns, name]);
    let ips = json["status"]["podIPs"].as_array().expect("podIPs");
    let ips = ips.iter().map(|ip| ip["ip"].as_str().expect("ip").parse().expect("ip")).collect();
    Pod { name: name.into(), node: String::new(), phase: String::new(), ips }
}

/// Pods x/a (node1), x/b (node2) and y/c (node1), Ready.
fn three_servers(cluster: &Cluster) -> (Pod, Pod, Pod) {
    cluster.kubectl_ok(&["create", "namespace", "x"]);
    cluster.kubectl_ok(&["create", "namespace", "y"]);
    cluster.apply(&server("x", "a", "node1"));
    cluster.apply(&server("x", "b", "node2"));
    cluster.apply(&server("y", "c", "node1"));
    for (ns, name) in [("x", "a"), ("x", "b"), ("y", "c")] {
        cluster.kubectl_ok(&["wait", "-n", ns, "--for=condition=Ready", &format!("pod/{name}"), "--timeout=120s"]);
    }
    (pod(cluster, "x", "a"), pod(cluster, "x", "b"), pod(cluster, "y", "c"))
}

/// A pod's Ready condition, as kubectl prints it.
const READY: &str = "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}";

const DENY_X: &str = "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: deny, namespace: \"x\"}\nspec: {podSelector: {}, policyTypes: [Ingress]}\n";

const Y_TO_X_ON_80: &str = r#"apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: from-y, namespace: "x"}
spec:
  podSelector: {}
  ingress: [{from: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: "y"}}}], ports: [{port: 80, protocol: TCP}]}]
"#;

/// The same policies on a dual-stack cluster: each pod's IPv4 and IPv6 address judged alike, on one node and
/// across nodes, and an IPv6 ipBlock admitting one pod's IPv6 address only.
#[test]
fn network_policy_on_a_dual_stack_cluster() {
    if !cluster::available() {
        return;
    }
    let cluster = Cluster::up(ClusterConfig { network_policy: true, dual_stack: true, ..ClusterConfig::default() });
    let (a, b, c) = three_servers(&cluster);
    assert_eq!((a.ips.len(), b.ips.len(), c.ips.len()), (2, 2, 2), "dual-stack pods: {a:?} {b:?} {c:?}");
    expect(&cluster, ("x", "a"), &b, 81, true);
    cluster.apply(DENY_X);
    cluster.apply(Y_TO_X_ON_80);
    expect(&cluster, ("y", "c"), &a, 80, true);
    expect(&cluster, ("y", "c"), &b, 80, true);
    expect(&cluster, ("y", "c"), &b, 81, false);
    expect(&cluster, ("x", "a"), &b, 80, false);

    // x/a's IPv6 address admitted to b on 81, its IPv4 address not.
    let a_v6 = a.ips.iter().find(|ip| ip.is_ipv6()).expect("IPv6");
    cluster.apply(&format!(
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {{name: a-v6, namespace: \"x\"}}\nspec:\n  podSelector: {{matchLabels: {{pod: b}}}}\n  ingress: [{{from: [{{ipBlock: {{cidr: \"{a_v6}/128\"}}}}]}}]\n"
    ));
    let b_at = |v6: bool| *b.ips.iter().find(|ip| ip.is_ipv6() == v6).expect("address");
    let only = |v6: bool| Pod { ips: vec![b_at(v6)], ..b.clone() };
    expect(&cluster, ("x", "a"), &only(true), 81, true);
    expect(&cluster, ("x", "a"), &only(false), 81, false);

    cluster.kubectl_ok(&["delete", "networkpolicy", "-n", "x", "--all"]);
    expect(&cluster, ("x", "a"), &b, 81, true);
}

#[test]
fn network_policy_on_the_cluster() {
    if !cluster::available() {
        return;
    }
    let cluster = Cluster::up(ClusterConfig { network_policy: true, ..ClusterConfig::default() });
    let (a, b, c) = three_servers(&cluster);

    // No policy: open, on one node (a, c) and across nodes (a, b).
    expect(&cluster, ("x", "a"), &b, 80, true);
    expect(&cluster, ("y", "c"), &a, 80, true);

    // Default deny of x's ingress: nothing reaches x's pods, y's pods stay open.
    cluster.apply(DENY_X);
    expect(&cluster, ("x", "a"), &b, 80, false);
    expect(&cluster, ("y", "c"), &a, 80, false);
    expect(&cluster, ("x", "a"), &c, 80, true);

    // Namespace y may reach x's pods on 80, not on 81.
    cluster.apply(Y_TO_X_ON_80);
    expect(&cluster, ("y", "c"), &a, 80, true);
    expect(&cluster, ("y", "c"), &b, 80, true);
    expect(&cluster, ("y", "c"), &b, 81, false);
    expect(&cluster, ("x", "a"), &b, 80, false);

    // Pods labelled role=client in x may reach b: the label set after the policy opens a's way.
    cluster.apply(
        r#"apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: clients, namespace: "x"}
spec:
  podSelector: {matchLabels: {pod: b}}
  ingress: [{from: [{podSelector: {matchLabels: {role: client}}}]}]
"#,
    );
    expect(&cluster, ("x", "a"), &b, 81, false);
    cluster.kubectl_ok(&["label", "pod", "-n", "x", "a", "role=client"]);
    expect(&cluster, ("x", "a"), &b, 81, true);
    expect(&cluster, ("y", "c"), &b, 81, false);

    // The kubelet's probes come from the node itself: x's pods stay Ready under the deny.
    std::thread::sleep(Duration::from_secs(3));
    for name in ["a", "b"] {
        let ready = cluster.kubectl_ok(&["get", "pod", "-n", "x", name, "-o", READY]);
        assert_eq!(ready.trim(), "True", "x/{name} stays Ready: its node's probes pass the deny");
    }

    // From outside through a NodePort: denied on both nodes, then admitted by an ipBlock of the underlay.
    node_port_from_outside(&cluster);

    // The agent restarted on node2: b's rules hold while it is down and after.
    cluster.script_ok(&["restart", "node2", "cni-netpol"]);
    expect(&cluster, ("y", "c"), &b, 81, false);
    expect(&cluster, ("x", "a"), &b, 81, true);

    // The policies deleted: open again.
    cluster.kubectl_ok(&["delete", "networkpolicy", "-n", "x", "--all"]);
    expect(&cluster, ("y", "c"), &b, 81, true);
    expect(&cluster, ("x", "a"), &b, 80, true);
}

/// A NodePort in front of x/a, asked from the wan on each node's address: an ipBlock of the underlay
/// (172.31.0.0/24) admits it through both nodes (on node1 the wan's own address is judged, on node2 kube-proxy's
/// SNAT makes it node2's), and once that policy is deleted x's default deny drops it on both.
fn node_port_from_outside(cluster: &Cluster) {
    cluster.apply(
        r#"apiVersion: v1
kind: Service
metadata: {name: a-np, namespace: "x"}
spec:
  type: NodePort
  selector: {pod: a}
  ports: [{port: 80, targetPort: 80, protocol: TCP}]
"#,
    );
    let svc = cluster.get_json(&["service", "-n", "x", "a-np"]);
    let port = svc["spec"]["ports"][0]["nodePort"].as_u64().expect("nodePort");
    let urls: Vec<String> = ["node1", "node2"]
        .iter()
        .map(|node| {
            let obj = cluster.get_json(&["node", node]);
            let addresses = obj["status"]["addresses"].as_array().expect("addresses").clone();
            let internal = addresses.iter().find(|a| a["type"] == "InternalIP").expect("InternalIP");
            format!("http://{}:{port}/", internal["address"].as_str().expect("address"))
        })
        .collect();
    let wan_reaches = |url: &str, reach: bool| {
        let seen = eventually(Duration::from_secs(30), || match cluster.node_get("wan", url) {
            Ok(body) if reach && body.trim() == "foo" => Ok(()),
            Err(_) if !reach => Ok(()),
            other => Err(other),
        });
        let verb = if reach { "should reach" } else { "should be denied" };
        seen.unwrap_or_else(|last| panic!("wan -> NodePort {url} {verb} x/a: last {last:?}"));
    };
    cluster.apply(
        r#"apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: from-underlay, namespace: "x"}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress: [{from: [{ipBlock: {cidr: 172.31.0.0/24}}], ports: [{port: 80, protocol: TCP}]}]
"#,
    );
    for url in &urls {
        wan_reaches(url, true);
    }
    cluster.kubectl_ok(&["delete", "networkpolicy", "-n", "x", "from-underlay"]);
    for url in &urls {
        wan_reaches(url, false);
    }
    cluster.kubectl_ok(&["delete", "service", "-n", "x", "a-np"]);
}
