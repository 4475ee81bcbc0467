//! What the Kubernetes tests run and check on a [`crate::cluster::Cluster`]: agnhost workloads and Services as
//! manifests, pod-to-pod reachability with the source address checked, and what a node must not hold once its
//! pods are gone.

use std::net::IpAddr;
use std::time::Duration;

use crate::cluster::{Cluster, Pod, AGNHOST};
use crate::{eventually, net};

pub const POD_TIMEOUT: Duration = Duration::from_secs(120);
pub const REACH_TIMEOUT: Duration = Duration::from_secs(30);

/// A Deployment of agnhost netexec (HTTP on 8080: /hostname, /clientip), `replicas` pods spread over the nodes.
pub fn web_deployment(name: &str, replicas: usize) -> String {
    format!(
        r#"apiVersion: apps/v1
kind: Deployment
metadata: {{name: {name}}}
spec:
  replicas: {replicas}
  selector: {{matchLabels: {{app: {name}}}}}
  template:
    metadata: {{labels: {{app: {name}}}}}
    spec:
      terminationGracePeriodSeconds: 1
      topologySpreadConstraints:
      - {{maxSkew: 1, topologyKey: kubernetes.io/hostname, whenUnsatisfiable: DoNotSchedule, labelSelector: {{matchLabels: {{app: {name}}}}}}}
      containers:
      - name: netexec
        image: {AGNHOST}
        args: ["netexec", "--http-port=8080", "--udp-port=8081"]
        ports: [{{containerPort: 8080, name: http}}]
"#
    )
}

/// A Service of `kind` in front of pods labelled `selector` (key=value), port 80 -> 8080.
pub fn service(name: &str, kind: &str, selector: &str, families: &str) -> String {
    let (key, value) = selector.split_once('=').expect("key=value");
    format!(
        r#"apiVersion: v1
kind: Service
metadata: {{name: {name}}}
spec:
  type: {kind}
  {families}
  selector: {{{key}: "{value}"}}
  ports: [{{port: 80, targetPort: 8080, protocol: TCP}}]
"#
    )
}

/// The node's podCIDRs, from its Node object, once kube-controller-manager has allocated them.
pub fn pod_cidrs(cluster: &Cluster, node: &str) -> Vec<ipnet::IpNet> {
    let cidrs = eventually(Duration::from_secs(60), || {
        let node = cluster.get_json(&["node", node]);
        match node["spec"]["podCIDRs"].as_array() {
            Some(cidrs) if !cidrs.is_empty() => Ok(cidrs.iter().map(|c| net(c.as_str().expect("cidr"))).collect()),
            _ => Err(node["spec"].clone()),
        }
    });
    cidrs.unwrap_or_else(|spec| panic!("{node} has no podCIDRs after 60 s: {spec}"))
}

/// `url` with an address in it (IPv6 bracketed).
pub fn http(addr: IpAddr, port: u16, path: &str) -> String {
    match addr {
        IpAddr::V4(a) => format!("http://{a}:{port}{path}"),
        IpAddr::V6(a) => format!("http://[{a}]:{port}{path}"),
    }
}

/// `from` reaches `to` on every address of `to`, and `to` sees `from`'s own address of that family as the source.
pub fn assert_pod_to_pod(cluster: &Cluster, from: &Pod, to: &Pod) {
    for to_ip in &to.ips {
        let from_ip = from.ips.iter().find(|ip| ip.is_ipv4() == to_ip.is_ipv4()).expect("an address of the family");
        let seen = eventually(REACH_TIMEOUT, || cluster.pod_get(&from.name, &http(*to_ip, 8080, "/clientip")))
            .unwrap_or_else(|e| panic!("{} ({}) -> {} {to_ip}: {e}", from.name, from.node, to.name));
        let (seen_ip, _) = seen.trim().rsplit_once(':').expect("ip:port");
        assert_eq!(
            seen_ip.trim_matches(['[', ']']),
            from_ip.to_string(),
            "{} -> {}: source address kept",
            from.name,
            to.name
        );
    }
}

/// What a node holds of pods: veths, ifbs, host-local leases, cached results, the plugins' iptables chains and
/// tc qdiscs. Empty once every pod of the node is gone.
pub fn pod_leftovers(cluster: &Cluster, node: &str) -> Vec<String> {
    let script = r#"
ip -o link show type veth | grep -v ': eth0@' | sed 's/^/link: /'
ip -o link show type ifb | sed 's/^/ifb: /'
for d in /var/lib/cni/networks/*; do [ -d "$d" ] && ls "$d" | grep -v -e '^last_reserved_ip' -e '^lock$' | sed "s|^|lease $d: |"; done
ls /var/lib/cni/results 2>/dev/null | sed 's/^/cache: /'
for t in iptables ip6tables; do $t-save -t nat 2>/dev/null | grep -E '^-A (CNI-DN-|CNI-HOSTPORT-DNAT |CNI-[0-9a-f]{24} )' | sed "s/^/$t: /"; done
tc qdisc show | grep -E 'tbf|ingress' | sed 's/^/qdisc: /'
"#;
    let output = cluster.node_exec(node, &["sh", "-c", script]);
    String::from_utf8_lossy(&output.stdout).lines().map(str::to_string).filter(|l| !l.is_empty()).collect()
}

/// Every node's leftovers, awaited (a pod's deletion is asynchronous), as `node: what` lines.
pub fn assert_nothing_left(cluster: &Cluster) {
    let left = eventually(Duration::from_secs(60), || {
        let all: Vec<String> = cluster
            .nodes()
            .iter()
            .flat_map(|node| pod_leftovers(cluster, node).into_iter().map(move |l| format!("{node}: {l}")))
            .collect();
        if all.is_empty() {
            Ok(())
        } else {
            Err(all)
        }
    });
    if let Err(left) = left {
        panic!("left on the nodes after every pod was deleted:\n{}", left.join("\n"));
    }
}

pub fn by_node<'a>(pods: &'a [Pod], node: &str) -> Vec<&'a Pod> {
    pods.iter().filter(|p| p.node == node).collect()
}

/// A pod pinned to `node` with a hostPort, and optional bandwidth annotations.
pub fn pinned_pod(name: &str, node: &str, host_port: Option<u16>, bandwidth: Option<&str>) -> String {
    let annotations = bandwidth
        .map(|rate| {
            format!(
                "\n  annotations: {{kubernetes.io/ingress-bandwidth: {rate}, kubernetes.io/egress-bandwidth: {rate}}}"
            )
        })
        .unwrap_or_default();
    let host_port = host_port.map(|p| format!(", hostPort: {p}")).unwrap_or_default();
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
  labels: {{app: {name}}}{annotations}
spec:
  nodeName: {node}
  terminationGracePeriodSeconds: 1
  containers:
  - name: netexec
    image: {AGNHOST}
    args: ["netexec", "--http-port=8080"]
    ports: [{{containerPort: 8080{host_port}}}]
"#
    )
}

/// Pods of a Deployment over every node: Running, addressed from their node's podCIDR, reaching each other.
pub fn deployment_spreads_and_connects(cluster: &Cluster) -> Vec<Pod> {
    let replicas = 2 * cluster.config.nodes;
    cluster.apply(&web_deployment("web", replicas));
    let pods = cluster.running_pods("app=web", replicas, POD_TIMEOUT);
    for node in cluster.nodes() {
        let cidrs = pod_cidrs(cluster, &node);
        let here = by_node(&pods, &node);
        assert_eq!(here.len(), 2, "2 of the Deployment's pods on {node}: {pods:?}");
        for pod in here {
            for ip in &pod.ips {
                assert!(cidrs.iter().any(|c| c.contains(ip)), "{} on {node}: {ip} in {cidrs:?}", pod.name);
            }
        }
    }
    let node1 = by_node(&pods, "node1");
    assert_pod_to_pod(cluster, node1[0], node1[1]);
    let node2 = by_node(&pods, "node2");
    assert_pod_to_pod(cluster, node1[0], node2[0]);
    assert_pod_to_pod(cluster, node2[1], node1[1]);
    pods
}

pub fn service_ip(cluster: &Cluster, name: &str) -> Vec<IpAddr> {
    let svc = cluster.get_json(&["service", name]);
    svc["spec"]["clusterIPs"]
        .as_array()
        .expect("clusterIPs")
        .iter()
        .map(|ip| ip.as_str().unwrap().parse().unwrap())
        .collect()
}

/// A ClusterIP Service reached from pods on every node (kube-proxy's DNAT, answers from several pods), and a
/// pod reaching itself through a Service that selects only it (hairpin).
pub fn services_from_pods(cluster: &Cluster, pods: &[Pod], families: &str) {
    cluster.apply(&service("web", "ClusterIP", "app=web", families));
    for ip in service_ip(cluster, "web") {
        for client in [by_node(pods, "node1")[0], by_node(pods, "node2")[0]] {
            let url = http(ip, 80, "/hostname");
            let answer = eventually(REACH_TIMEOUT, || cluster.pod_get(&client.name, &url))
                .unwrap_or_else(|e| panic!("{} -> Service {url}: {e}", client.name));
            assert!(pods.iter().any(|p| p.name == answer.trim()), "a web pod answered: {answer}");
        }
    }
    let me = by_node(pods, "node1")[1];
    cluster.kubectl_ok(&["label", "pod", &me.name, "hairpin=yes"]);
    cluster.apply(&service("hairpin", "ClusterIP", "hairpin=yes", families));
    for ip in service_ip(cluster, "hairpin") {
        let url = http(ip, 80, "/hostname");
        let answer = eventually(REACH_TIMEOUT, || cluster.pod_get(&me.name, &url))
            .unwrap_or_else(|e| panic!("{} -> its own Service {url} (hairpin): {e}", me.name));
        assert_eq!(answer.trim(), me.name, "the pod reached itself through its Service");
    }
}

/// A NodePort reached from the wan on every node's address.
pub fn node_port_from_wan(cluster: &Cluster, families: &str) {
    cluster.apply(&service("web-np", "NodePort", "app=web", families));
    let svc = cluster.get_json(&["service", "web-np"]);
    let port = svc["spec"]["ports"][0]["nodePort"].as_u64().expect("nodePort") as u16;
    for node in cluster.nodes() {
        let obj = cluster.get_json(&["node", &node]);
        for addr in obj["status"]["addresses"].as_array().expect("addresses") {
            if addr["type"] != "InternalIP" {
                continue;
            }
            let ip: IpAddr = addr["address"].as_str().unwrap().parse().unwrap();
            let url = http(ip, port, "/hostname");
            eventually(REACH_TIMEOUT, || cluster.node_get("wan", &url))
                .unwrap_or_else(|e| panic!("wan -> NodePort {url} on {node}: {e}"));
        }
    }
}

/// The Deployment and Services of these checks deleted: nothing of their pods is left on any node.
pub fn delete_everything(cluster: &Cluster) {
    cluster.kubectl_ok(&["delete", "deployment", "web", "--wait=true"]);
    cluster.kubectl_ok(&["delete", "service", "web", "web-np", "hairpin", "--ignore-not-found"]);
    cluster.kubectl_ok(&["wait", "--for=delete", "pod", "-l", "app=web", "--timeout=90s"]);
    assert_nothing_left(cluster);
}

/// The wan's address of `family` (IPv6 when `v6`), outside the cluster.
fn wan_address(v6: bool) -> IpAddr {
    let text = if v6 { "fd00:172:31::1" } else { "172.31.0.1" };
    text.parse().expect("wan address")
}

/// A node's InternalIP addresses, from its Node object.
pub fn node_addresses(cluster: &Cluster, node: &str) -> Vec<IpAddr> {
    let obj = cluster.get_json(&["node", node]);
    let addresses = obj["status"]["addresses"].as_array().cloned().unwrap_or_default();
    addresses.iter().filter(|a| a["type"] == "InternalIP").filter_map(|a| a["address"].as_str()?.parse().ok()).collect()
}

/// Only traffic leaving the cluster is masqueraded (the Kubernetes network model; pod to pod keeps its address,
/// [`assert_pod_to_pod`]): `pod` asks a server on the wan, in each of its families, and every connection the
/// server accepted came from the address of the pod's node of that family.
pub fn assert_outside_sees_the_node(cluster: &Cluster, pod: &Pod) {
    let node = node_addresses(cluster, &pod.node);
    for (port, ip) in (9100u16..).zip(&pod.ips) {
        let server = WanServer::start(cluster, port);
        let url = http(wan_address(ip.is_ipv6()), port, "/");
        let asked = eventually(REACH_TIMEOUT, || cluster.pod_get(&pod.name, &url));
        let log = server.finish();
        asked.unwrap_or_else(|e| panic!("{} ({ip}) -> the wan at {url}: {e}\nthe wan's server:\n{log}", pod.name));
        let peers = peers_of(&log);
        let expected = node.iter().find(|a| a.is_ipv6() == ip.is_ipv6()).expect("the node's address");
        assert!(!peers.is_empty(), "socat on the wan logged no peer:\n{log}");
        for peer in peers {
            assert_eq!(&peer, expected, "{} ({ip}) -> the wan: seen from its node {}'s address", pod.name, pod.node);
        }
    }
}

/// socat on the wan answering HTTP requests on `port` of both families, its log (`-d -d`: the peer of each
/// connection) kept; in a process group of its own, ended with it. Each answer has a length and the request is
/// read to its end, so closing never resets the connection under the client's feet.
struct WanServer {
    child: Option<std::process::Child>,
}

impl WanServer {
    fn start(cluster: &Cluster, port: u16) -> WanServer {
        use std::os::unix::process::CommandExt;
        let listen = format!("TCP6-LISTEN:{port},ipv6only=0,reuseaddr,fork");
        // A script, since socat's address syntax takes quotes and backslashes itself.
        let script = cluster.paths().dir.join("wan-reply.sh");
        let body = "#!/bin/sh\nprintf 'HTTP/1.0 200 OK\\r\\nContent-Length: 3\\r\\n\\r\\nok\\n'\nexec cat >/dev/null\n";
        std::fs::write(&script, body).expect("the wan's reply script");
        std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).expect("chmod");
        let reply = format!("EXEC:{}", script.display());
        let mut command =
            crate::cluster::script_command(&cluster.name, &["exec", "wan", "socat", "-d", "-d", &listen, &reply]);
        let child = command
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .process_group(0)
            .spawn()
            .expect("socat on the wan");
        WanServer { child: Some(child) }
    }

    /// Ends the whole group: cluster.sh, nsenter and socat.
    fn kill(child: &std::process::Child) {
        let group = nix::unistd::Pid::from_raw(child.id() as i32);
        let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
    }

    /// Its log, once it is ended.
    fn finish(mut self) -> String {
        let child = self.child.take().expect("a running server");
        WanServer::kill(&child);
        let output = child.wait_with_output().expect("socat's log");
        String::from_utf8_lossy(&output.stderr).into_owned()
    }
}

impl Drop for WanServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            WanServer::kill(&child);
            let _ = child.wait();
        }
    }
}

/// The client addresses in socat's `-d -d` log ("accepting connection from AF=10 [::ffff:172.31.0.11]:40312"),
/// IPv4-mapped ones as IPv4.
fn peers_of(log: &str) -> Vec<IpAddr> {
    let peer = |line: &str| -> Option<IpAddr> {
        let field = line.split_whitespace().skip_while(|w| !w.starts_with("AF=")).nth(1)?;
        let host = field.rsplit_once(':')?.0.trim_start_matches('[').trim_end_matches(']');
        let ip: IpAddr = host.parse().ok()?;
        Some(match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        })
    };
    log.lines().filter(|l| l.contains("accepting connection from")).filter_map(peer).collect()
}
