//! Kubernetes judging the cluster with its own tools: a subset of its e2e suite (`e2e.test` of the v1.28.7 tree,
//! through `scripts/conformance.sh --cluster`) on our plugins with cni-netpol and kube-dns, and the cluster DNS
//! that `scripts/cluster.sh up` deploys, asked from a pod on every node with `dig` as a user's pod asks it. The
//! whole suite, every column, is `scripts/conformance.sh` (docs/conformance.md).

use std::net::IpAddr;
use std::path::Path;
use std::time::Duration;

use netns_tests::cluster::{self, Cluster, ClusterConfig, Pod};
use netns_tests::eventually;
use netns_tests::workloads::{self, POD_TIMEOUT};

/// The specs the test command runs (the rest is `scripts/conformance.sh`): pod-to-pod and node-to-pod on both
/// protocols, hostPort, a DNS spec that resolves Services by name, and a NetworkPolicy spec.
const SUBSET: &[&str] = &[
    "Networking Granular Checks: Pods should function for intra-pod communication: http",
    "Networking Granular Checks: Pods should function for intra-pod communication: udp",
    "Networking Granular Checks: Pods should function for node-pod communication: http",
    "Networking Granular Checks: Pods should function for node-pod communication: udp",
    "HostPort validates that there is no conflict between pods with same hostPort but different hostIP and protocol",
    "DNS should provide DNS for services",
    "Netpol NetworkPolicy between server and client should support a 'default-deny-ingress' policy",
];

#[test]
fn kubernetes_e2e_subset_passes_on_our_plugins() {
    if !cluster::available() || !e2e_available() {
        return;
    }
    let cluster = Cluster::up(ClusterConfig { network_policy: true, dns: true, ..ClusterConfig::default() });
    let out = tempfile_dir(&cluster.name);
    let focus = SUBSET.iter().map(|s| regex_quote(s)).collect::<Vec<_>>().join("|");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/conformance.sh");
    let run = std::process::Command::new("bash")
        .arg(script)
        .args(["--suites", "conformance", "--columns", "ours", "--cluster", &cluster.name, "--focus", &focus])
        .arg("--out")
        .arg(&out)
        .output()
        .expect("run scripts/conformance.sh");
    let stderr = String::from_utf8_lossy(&run.stderr);
    let tsv = std::fs::read_to_string(out.join("conformance/conformance.ours.tsv")).unwrap_or_default();
    let _ = std::fs::remove_dir_all(&out);
    for spec in SUBSET {
        let row = tsv.lines().find(|l| l.contains(spec));
        let row = row.unwrap_or_else(|| panic!("{spec}: did not run\n{stderr}\n{}", cluster.logs()));
        assert!(row.split('\t').nth(1) == Some("passed"), "{spec}: {row}\n{stderr}");
    }
    assert!(run.status.success(), "conformance.sh failed:\n{stderr}");
}

/// What `dig` finds from a pod on every node of a dual-stack cluster: Services by short, namespaced and full
/// name in both families, a headless Service's pods, SRV records of a named port, a pod's A record, an
/// ExternalName as a CNAME, and a name outside the cluster answered by the nodes' resolver through kube-dns.
#[test]
fn cluster_dns_from_every_node() {
    if !cluster::available() {
        return;
    }
    let cluster = Cluster::up(ClusterConfig { dual_stack: true, dns: true, ..ClusterConfig::default() });
    cluster.apply(&workloads::web_deployment("web", 2));
    cluster.apply(&services());
    let pods = cluster.running_pods("app=web", 2, POD_TIMEOUT);
    let svc = cluster.get_json(&["service", "web"]);
    let cluster_ips: Vec<IpAddr> = svc["spec"]["clusterIPs"]
        .as_array()
        .expect("clusterIPs")
        .iter()
        .map(|ip| ip.as_str().expect("ip").parse().expect("ip"))
        .collect();
    assert_eq!(cluster_ips.len(), 2, "web has an address of each family: {svc}");
    for pod in &pods {
        resolv_conf_names_the_cluster_dns(&cluster, pod);
        for name in ["web", "web.default", "web.default.svc", "web.default.svc.cluster.local"] {
            expect_answer(&cluster, pod, &[name, "A"], &[&cluster_ips[0].to_string()]);
            expect_answer(&cluster, pod, &[name, "AAAA"], &[&cluster_ips[1].to_string()]);
        }
        let mut pod_ips: Vec<String> = pods.iter().flat_map(|p| p.ips.iter().map(IpAddr::to_string)).collect();
        pod_ips.sort();
        let (v4, v6): (Vec<&str>, Vec<&str>) = pod_ips.iter().map(String::as_str).partition(|ip| !ip.contains(':'));
        expect_answer(&cluster, pod, &["web-headless.default.svc.cluster.local", "A"], &v4);
        // kube-dns reads Endpoints, which hold a Service's primary family alone: IPv6 pods through an IPv6
        // headless Service.
        expect_answer(&cluster, pod, &["web-headless6.default.svc.cluster.local", "AAAA"], &v6);
        // SRV of the named port: "PRIORITY WEIGHT PORT TARGET", the Service's port and name.
        expect_lines(&cluster, pod, &["_http._tcp.web.default.svc.cluster.local", "SRV"], |lines| {
            lines.len() == 1 && lines[0].ends_with(" 80 web.default.svc.cluster.local.")
        });
        let other = pods.iter().find(|p| p.name != pod.name).expect("a pod on the other node");
        let other_v4 = other.ips.iter().find(|ip| ip.is_ipv4()).expect("an IPv4 address").to_string();
        let dashed = format!("{}.default.pod.cluster.local", other_v4.replace('.', "-"));
        expect_answer(&cluster, pod, &[&dashed, "A"], &[&other_v4]);
        expect_answer(&cluster, pod, &["ext.default.svc.cluster.local", "CNAME"], &["outside.cni-rs.test."]);
        expect_answer(&cluster, pod, &["outside.cni-rs.test", "A"], &["172.31.0.1"]);
        expect_answer(&cluster, pod, &["outside.cni-rs.test", "AAAA"], &["fd00:172:31::1"]);
        // The cluster DNS over its IPv6 Service address too.
        expect_answer(
            &cluster,
            pod,
            &["@fd00:10:96::a", "web.default.svc.cluster.local", "A"],
            &[&cluster_ips[0].to_string()],
        );
    }
}

fn services() -> String {
    r#"apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  ipFamilyPolicy: RequireDualStack
  selector: {app: web}
  ports: [{name: http, port: 80, targetPort: 8080, protocol: TCP}]
---
apiVersion: v1
kind: Service
metadata: {name: web-headless}
spec:
  clusterIP: None
  ipFamilyPolicy: RequireDualStack
  selector: {app: web}
  ports: [{name: http, port: 80, targetPort: 8080, protocol: TCP}]
---
apiVersion: v1
kind: Service
metadata: {name: web-headless6}
spec:
  clusterIP: None
  ipFamilyPolicy: SingleStack
  ipFamilies: [IPv6]
  selector: {app: web}
  ports: [{name: http, port: 80, targetPort: 8080, protocol: TCP}]
---
apiVersion: v1
kind: Service
metadata: {name: ext}
spec:
  type: ExternalName
  externalName: outside.cni-rs.test
"#
    .to_string()
}

/// The pod's resolv.conf: the cluster DNS first (both families), the namespace's search path.
fn resolv_conf_names_the_cluster_dns(cluster: &Cluster, pod: &Pod) {
    let out = cluster.kubectl_ok(&["exec", &pod.name, "--", "cat", "/etc/resolv.conf"]);
    assert!(out.contains("nameserver 10.96.0.10"), "{}'s resolv.conf: {out}", pod.name);
    assert!(out.contains("search default.svc.cluster.local svc.cluster.local cluster.local"), "{out}");
}

/// `dig +short +search ARGS` in `pod` answers exactly `want` (sorted), within a few seconds (kube-dns follows
/// the API).
fn expect_answer(cluster: &Cluster, pod: &Pod, args: &[&str], want: &[&str]) {
    let mut want: Vec<String> = want.iter().map(|s| s.to_string()).collect();
    want.sort();
    expect_lines(cluster, pod, args, |got| got == want.as_slice());
}

/// `dig +short +search ARGS` in `pod` (its resolv.conf's search path, as the e2e DNS specs ask) gives lines
/// (sorted) that `good` accepts, within 30 s.
fn expect_lines(cluster: &Cluster, pod: &Pod, args: &[&str], good: impl Fn(&[String]) -> bool) {
    let mut command = vec!["exec", &pod.name, "--", "dig", "+short", "+search", "+time=2", "+tries=2"];
    command.extend_from_slice(args);
    let seen = eventually(Duration::from_secs(30), || {
        let out = cluster.kubectl(&command);
        let mut got: Vec<String> = String::from_utf8_lossy(&out.stdout).lines().map(str::to_string).collect();
        got.sort();
        if good(&got) {
            Ok(())
        } else {
            Err(format!("{got:?} {}", String::from_utf8_lossy(&out.stderr)))
        }
    });
    if let Err(got) = seen {
        panic!("dig {args:?} from {} ({}): got {got}\n{}", pod.name, pod.node, cluster.logs());
    }
}

/// e2e.test, built by `scripts/cluster.sh build` beside kubectl.
fn e2e_available() -> bool {
    let e2e = cluster::kubectl().with_file_name("e2e.test");
    netns_tests::require("Kubernetes' e2e.test", e2e.is_file(), "scripts/cluster.sh build builds it")
}

/// A directory of the test's own for the script's results.
fn tempfile_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("cni-rs-conformance-{name}"));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

/// `text` as a regular expression matching itself (RE2: the metacharacters escaped).
fn regex_quote(text: &str) -> String {
    text.chars().fold(String::new(), |mut out, c| {
        if "\\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
        out
    })
}
