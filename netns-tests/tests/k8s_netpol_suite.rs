//! NetworkPolicy truth tables on the local cluster, shaped like Kubernetes' own netpol suite: pods `a`, `b`, `c`
//! in namespaces `x`, `y`, `z` spread over two nodes, each serving TCP and UDP on ports 80 and 81 (agnhost
//! `serve-hostname`, as the suite runs it), and for each policy every pod probing every other pod on the four
//! port/protocol pairs (agnhost `connect`): 288 real probes a table, compared with what the API says they
//! should be, written out here as the rules of each policy: default deny, namespace and pod selectors with
//! ports, egress, `ipBlock` with `except` (ingress and egress, across nodes), named ports (the suite's
//! `serve-80-tcp` ... container ports) and `endPort` ranges. cni-netpol runs on every node
//! (`scripts/cluster.sh up --network-policy`) against the real API server, on kubenet nodes and on fabric nodes
//! (flannel's manifest running fabricd).

use std::collections::BTreeMap;
use std::time::Duration;

use netns_tests::cluster::{self, Cluster, ClusterConfig, AGNHOST};
use netns_tests::workloads;

const NAMESPACES: [&str; 3] = ["x", "y", "z"];
const PODS: [&str; 3] = ["a", "b", "c"];
const PROBES: [(u16, &str); 4] = [(80, "tcp"), (80, "udp"), (81, "tcp"), (81, "udp")];

/// One pod of the suite: four containers, one per port and protocol, each declaring its port by the name the
/// suite gives it (`serve-80-tcp`), which named-port rules resolve.
fn suite_pod(ns: &str, name: &str, node: &str) -> String {
    let containers: String = PROBES
        .iter()
        .map(|(port, proto)| {
            let upper = proto.to_uppercase();
            format!(
                "  - {{name: c-{port}-{proto}, image: {AGNHOST}, args: [serve-hostname, --{proto}, --http=false, --port, \"{port}\"], ports: [{{containerPort: {port}, name: serve-{port}-{proto}, protocol: {upper}}}]}}\n"
            )
        })
        .collect();
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: \"{ns}\", labels: {{pod: {name}}}}}\nspec:\n  nodeName: {node}\n  terminationGracePeriodSeconds: 1\n  containers:\n{containers}"
    )
}

/// A probe's key: (from "ns/pod", to "ns/pod", port, protocol).
type Probe = (String, String, u16, &'static str);

/// Every probe of the table, run: one `kubectl exec` per source pod running its probes in a loop, all sources
/// at once.
fn probe_all(cluster: &Cluster, ips: &BTreeMap<String, String>) -> BTreeMap<Probe, bool> {
    std::thread::scope(|scope| {
        let workers: Vec<_> = ips
            .keys()
            .map(|from| {
                scope.spawn(move || {
                    let mut script = String::new();
                    for (to, ip) in ips.iter().filter(|(to, _)| *to != from) {
                        for (port, proto) in PROBES {
                            script += &format!(
                                "/agnhost connect {ip}:{port} --timeout=1s --protocol={proto} >/dev/null 2>&1 && echo '{to} {port} {proto} 1' || echo '{to} {port} {proto} 0'\n"
                            );
                        }
                    }
                    let (ns, pod) = from.split_once('/').expect("ns/pod");
                    let out = cluster.kubectl(&["exec", "-n", ns, pod, "-c", "c-80-tcp", "--", "sh", "-c", &script]);
                    let text = String::from_utf8_lossy(&out.stdout).into_owned();
                    text.lines()
                        .filter_map(|line| {
                            let f: Vec<&str> = line.split_whitespace().collect();
                            let wanted = f.get(2).copied()?;
                            let proto = PROBES.iter().find(|(_, p)| *p == wanted)?.1;
                            Some(((from.clone(), f[0].to_string(), f[1].parse().ok()?, proto), f[3] == "1"))
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        workers.into_iter().flat_map(|w| w.join().expect("probe worker")).collect()
    })
}

/// Probes until the table equals `expected` (enforcement follows the API within moments), or says what differs.
fn assert_table(cluster: &Cluster, ips: &BTreeMap<String, String>, what: &str, expected: impl Fn(&Probe) -> bool) {
    let mut wrong = Vec::new();
    for _ in 0..6 {
        let seen = probe_all(cluster, ips);
        assert_eq!(seen.len(), ips.len() * (ips.len() - 1) * PROBES.len(), "{what}: every probe ran: {seen:?}");
        wrong = seen
            .iter()
            .filter(|(probe, reached)| expected(probe) != **reached)
            .map(|((from, to, port, proto), reached)| {
                format!(
                    "{from} -> {to} {port}/{proto}: {}",
                    if *reached { "reached, should not" } else { "denied, should reach" }
                )
            })
            .collect();
        if wrong.is_empty() {
            return;
        }
        std::thread::sleep(Duration::from_secs(2));
    }
    panic!("{what}: {} of the probes differ from the API's answer:\n{}", wrong.len(), wrong.join("\n"));
}

fn ns_of(pod: &str) -> &str {
    pod.split_once('/').expect("ns/pod").0
}

#[test]
fn netpol_suite_truth_tables() {
    if !cluster::available() {
        return;
    }
    truth_tables(Cluster::up(ClusterConfig { network_policy: true, ..ClusterConfig::default() }));
}

/// The same tables on fabric nodes: flannel's manifest running fabricd (vxlan), pods on flannel's cni0.
#[test]
fn netpol_suite_truth_tables_on_flannel_nodes() {
    if !cluster::available() {
        return;
    }
    truth_tables(Cluster::up(ClusterConfig { network_policy: true, network: "flannel", ..ClusterConfig::default() }));
}

fn truth_tables(cluster: Cluster) {
    let mut ips = BTreeMap::new();
    for (i, ns) in NAMESPACES.iter().enumerate() {
        cluster.kubectl_ok(&["create", "namespace", ns]);
        for (j, pod) in PODS.iter().enumerate() {
            let node = if (i + j) % 2 == 0 { "node1" } else { "node2" };
            cluster.apply(&suite_pod(ns, pod, node));
        }
    }
    for ns in NAMESPACES {
        cluster.kubectl_ok(&["wait", "-n", ns, "--for=condition=Ready", "pod", "--all", "--timeout=180s"]);
        for pod in PODS {
            let json = cluster.get_json(&["pod", "-n", ns, pod]);
            ips.insert(format!("{ns}/{pod}"), json["status"]["podIP"].as_str().expect("podIP").to_string());
        }
    }

    assert_table(&cluster, &ips, "no policy", |_| true);

    // Deny all ingress into x.
    cluster.apply("apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: deny, namespace: \"x\"}\nspec: {podSelector: {}, policyTypes: [Ingress]}\n");
    assert_table(&cluster, &ips, "ingress of x denied", |(_, to, _, _)| ns_of(to) != "x");

    // x/a admits namespace y on TCP 80, and x's pods labelled pod=b on 81 (both protocols).
    cluster.apply(
        r#"apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: a-in, namespace: "x"}
spec:
  podSelector: {matchLabels: {pod: a}}
  ingress:
  - from: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: "y"}}}]
    ports: [{port: 80, protocol: TCP}]
  - from: [{podSelector: {matchLabels: {pod: b}}}]
    ports: [{port: 81}, {port: 81, protocol: UDP}]
"#,
    );
    assert_table(&cluster, &ips, "x/a open to y on TCP 80 and to x/b on 81", |(from, to, port, proto)| {
        match to.as_str() {
            "x/a" => (ns_of(from) == "y" && *port == 80 && *proto == "tcp") || (from == "x/b" && *port == 81),
            to => ns_of(to) != "x",
        }
    });

    // Egress of z denied except to x and y's pods labelled pod=c on 80 (ingress rules of x still apply).
    cluster.apply(
        r#"apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: z-out, namespace: "z"}
spec:
  podSelector: {}
  policyTypes: [Egress]
  egress: [{to: [{namespaceSelector: {}, podSelector: {matchLabels: {pod: c}}}], ports: [{port: 80, protocol: TCP}, {port: 80, protocol: UDP}]}]
"#,
    );
    assert_table(&cluster, &ips, "egress of z only to pods c on 80", |(from, to, port, proto)| {
        let ingress = match to.as_str() {
            "x/a" => (ns_of(from) == "y" && *port == 80 && *proto == "tcp") || (from == "x/b" && *port == 81),
            to => ns_of(to) != "x",
        };
        let egress = ns_of(from) != "z" || (to.ends_with("/c") && *port == 80);
        ingress && egress
    });

    cluster.kubectl_ok(&["delete", "networkpolicy", "--all", "-n", "x"]);
    cluster.kubectl_ok(&["delete", "networkpolicy", "--all", "-n", "z"]);
    assert_table(&cluster, &ips, "policies deleted", |_| true);

    ip_blocks(&cluster, &ips);
    named_ports_and_ranges(&cluster, &ips);
}

/// `ipBlock` with `except`, judged on real source and destination addresses across nodes: x/a admits every
/// address but node2's podCIDR (so the pods of node1 only), and z's pods may send anywhere but to x/b.
fn ip_blocks(cluster: &Cluster, ips: &BTreeMap<String, String>) {
    let node2_pods = workloads::pod_cidrs(cluster, "node2")[0];
    let on_node2 = |pod: &str| node2_pods.contains(&ips[pod].parse::<std::net::IpAddr>().expect("pod IP"));
    cluster.apply(&format!(
        r#"apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {{name: a-from-node1, namespace: "x"}}
spec:
  podSelector: {{matchLabels: {{pod: a}}}}
  ingress: [{{from: [{{ipBlock: {{cidr: 0.0.0.0/0, except: ["{node2_pods}"]}}}}]}}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {{name: z-not-to-xb, namespace: "z"}}
spec:
  podSelector: {{}}
  policyTypes: [Egress]
  egress: [{{to: [{{ipBlock: {{cidr: 0.0.0.0/0, except: ["{}/32"]}}}}]}}]
"#,
        ips["x/b"]
    ));
    assert_table(cluster, ips, "x/a from all but node2's pods; z to all but x/b", |(from, to, _, _)| {
        let ingress = to != "x/a" || !on_node2(from);
        let egress = ns_of(from) != "z" || to != "x/b";
        ingress && egress
    });
    cluster.kubectl_ok(&["delete", "networkpolicy", "-n", "x", "a-from-node1"]);
    cluster.kubectl_ok(&["delete", "networkpolicy", "-n", "z", "z-not-to-xb"]);
}

/// Named ports resolved per pod from its containers' ports, and `endPort` ranges judged at both ends: y's pods
/// admit `serve-80-tcp` and `serve-81-udp` (a name given with the other protocol, `serve-81-tcp` over UDP,
/// and a name no container declares match nothing); x/b admits TCP 79-80 and UDP 81-90.
fn named_ports_and_ranges(cluster: &Cluster, ips: &BTreeMap<String, String>) {
    cluster.apply(
        r#"apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: by-name, namespace: "y"}
spec:
  podSelector: {}
  ingress:
  - ports: [{port: serve-80-tcp}, {port: serve-81-udp, protocol: UDP}, {port: serve-81-tcp, protocol: UDP}, {port: nobody-serves, protocol: TCP}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: b-ranges, namespace: "x"}
spec:
  podSelector: {matchLabels: {pod: b}}
  ingress:
  - ports: [{port: 79, endPort: 80, protocol: TCP}, {port: 81, endPort: 90, protocol: UDP}]
"#,
    );
    assert_table(cluster, ips, "y by port names; x/b by port ranges", |(_, to, port, proto)| {
        match (ns_of(to), to.as_str()) {
            ("y", _) | (_, "x/b") => matches!((*port, *proto), (80, "tcp") | (81, "udp")),
            _ => true,
        }
    });
    cluster.kubectl_ok(&["delete", "networkpolicy", "-n", "y", "by-name"]);
    cluster.kubectl_ok(&["delete", "networkpolicy", "-n", "x", "b-ranges"]);
    assert_table(cluster, ips, "open again", |_| true);
}
