//! The NetworkPolicy agent's rig (issue 37): a kubenet node whose pods are the netpol suite's (`a`, `b`, `c`
//! in namespaces `x`, `y`, `z`, serving TCP and UDP on ports 80 and 81), the agent run inside the node with
//! a static cluster file, and probes from every pod to every other in parallel.
//!
//! The cluster file is the API's JSON (`{"namespaces", "pods", "policies"}`), written atomically: the
//! agent applies each new content. Pods carry the suite's labels (`pod=<name>`, namespaces `ns=<name>`) and
//! named container ports (`serve-80-tcp`, `serve-80-udp`, `serve-81-tcp`, `serve-81-udp`).

use std::collections::BTreeMap;
use std::fs;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::daemon::Daemon;
use crate::kubenet::{Kubenet, SUBNET_V4, SUBNET_V4_B, SUBNET_V6, SUBNET_V6_B};
use crate::traffic::{tcp_ask_once, TcpServer};
use crate::{bin, json, result_ips, TestNetns, Value};

pub const NAMESPACES: [&str; 3] = ["x", "y", "z"];
pub const PODS: [&str; 3] = ["a", "b", "c"];
pub const PORTS: [u16; 2] = [80, 81];

/// TCP or UDP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Proto {
    Tcp,
    Udp,
}

impl Proto {
    pub const ALL: [Proto; 2] = [Proto::Tcp, Proto::Udp];

    pub fn number(self) -> u8 {
        match self {
            Proto::Tcp => 6,
            Proto::Udp => 17,
        }
    }
}

/// One probe: from pod to pod (by "ns/name"), over one address family, protocol and port.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Probe {
    pub src: String,
    pub dst: String,
    pub v6: bool,
    pub proto: Proto,
    pub port: u16,
}

/// A pod of the node with its servers.
pub struct Pod {
    pub namespace: String,
    pub name: String,
    pub netns: TestNetns,
    pub ips: Vec<IpAddr>,
    _servers: Vec<TcpServer>,
    _udp: Vec<UdpEcho>,
}

impl Pod {
    pub fn id(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// The pod's address of the family.
    pub fn ip(&self, v6: bool) -> IpAddr {
        *self.ips.iter().find(|ip| ip.is_ipv6() == v6).expect("an address of the family")
    }

    /// The pod as the API's JSON.
    pub fn json(&self) -> Value {
        pod_json(&self.namespace, &self.name, &self.ips)
    }
}

/// A pod's JSON: the suite's labels and named ports, running with `ips`.
pub fn pod_json(namespace: &str, name: &str, ips: &[IpAddr]) -> Value {
    let ports: Vec<Value> = PORTS
        .iter()
        .flat_map(|port| {
            [("TCP", "tcp"), ("UDP", "udp")]
                .map(|(proto, lower)| json!({"name": format!("serve-{port}-{lower}"), "containerPort": port, "protocol": proto}))
        })
        .collect();
    let pod_ips: Vec<Value> = ips.iter().map(|ip| json!({"ip": ip.to_string()})).collect();
    json!({
        "metadata": {"name": name, "namespace": namespace, "labels": {"pod": name}},
        "spec": {"containers": [{"name": "c", "ports": ports}]},
        "status": {"phase": "Running", "podIPs": pod_ips}
    })
}

/// The namespaces' JSON.
pub fn namespaces_json() -> Vec<Value> {
    NAMESPACES
        .iter()
        .map(|ns| json!({"metadata": {"name": ns, "labels": {"ns": ns, "kubernetes.io/metadata.name": ns}}}))
        .collect()
}

/// A policy's JSON.
pub fn policy(namespace: &str, name: &str, spec: Value) -> Value {
    json!({"metadata": {"namespace": namespace, "name": name}, "spec": spec})
}

/// A UDP server answering each datagram with "ok"; stopped on drop.
pub struct UdpEcho {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl UdpEcho {
    pub fn start(ns: &TestNetns, port: u16) -> UdpEcho {
        let any = SocketAddr::new("::".parse().expect("constant"), port);
        let socket = ns.run(|| UdpSocket::bind(any)).unwrap_or_else(|e| panic!("udp {port} in {}: {e}", ns.name));
        socket.set_read_timeout(Some(Duration::from_millis(50))).expect("timeout");
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut buf = [0u8; 64];
            while !stopped.load(Ordering::Relaxed) {
                if let Ok((_, peer)) = socket.recv_from(&mut buf) {
                    let _ = socket.send_to(b"ok", peer);
                }
            }
        });
        UdpEcho { stop, thread: Some(thread) }
    }
}

impl Drop for UdpEcho {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Whether a UDP datagram from `ns` to `to` is answered by `to` within `wait`. The socket is connected to
/// `to`, so that only `to`'s datagrams reach it: an unconnected one also took a late answer to an earlier probe
/// whose closed socket had the same port, and counted a denied flow as reached.
pub fn udp_answered(ns: &TestNetns, to: SocketAddr, wait: Duration) -> bool {
    let local = if to.is_ipv6() { "[::]:0" } else { "0.0.0.0:0" };
    let Ok(socket) = ns.run(|| UdpSocket::bind(local)) else { return false };
    let _ = socket.set_read_timeout(Some(wait));
    let mut buf = [0u8; 8];
    socket.connect(to).is_ok() && socket.send(b"hi").is_ok() && socket.recv(&mut buf).is_ok()
}

/// Whether one new connection (TCP) or datagram (UDP) from `from` reaches `to` within `wait`.
pub fn reaches(from: &TestNetns, to: SocketAddr, proto: Proto, wait: Duration) -> bool {
    match proto {
        Proto::Tcp => tcp_ask_once(from, to, wait).is_some(),
        Proto::Udp => udp_answered(from, to, wait),
    }
}

/// A kubenet node (the dual-stack conflist) with the suite's pods and the agent's files.
pub struct PolicyNode {
    pub kubenet: Kubenet,
    /// The node's pod CIDRs, given to the agent.
    pub pod_cidrs: [String; 2],
    pub pods: Vec<Pod>,
    pub cluster_file: PathBuf,
    pub log_file: PathBuf,
    /// The agent's run directory (its drop log and view), in the test's directory.
    pub run_dir: PathBuf,
}

impl PolicyNode {
    /// The node with the nine pods added by cnitool, serving on 80 and 81 (TCP and UDP).
    pub fn new() -> PolicyNode {
        let mut node = PolicyNode::empty(false);
        for namespace in NAMESPACES {
            for name in PODS {
                let pod = node.add_pod(namespace, name);
                node.pods.push(pod);
            }
        }
        node
    }

    /// The node without pods: the first node's pod subnets, or the second's ([`crate::kubenet::second_node`]).
    pub fn empty(second: bool) -> PolicyNode {
        let kubenet = Kubenet::new("20-kubenet-dualstack.conflist", |conf| {
            if second {
                crate::kubenet::second_node(conf);
            }
        });
        let dir = kubenet.node.dir().to_path_buf();
        let pod_cidrs = if second { [SUBNET_V4_B, SUBNET_V6_B] } else { [SUBNET_V4, SUBNET_V6] }.map(String::from);
        let (cluster_file, log_file, run_dir) = (dir.join("cluster.json"), dir.join("agent.log"), dir.join("run"));
        PolicyNode { kubenet, pod_cidrs, pods: Vec::new(), cluster_file, log_file, run_dir }
    }

    /// A new pod attached by cnitool, with its servers (not in the cluster file until written there).
    pub fn add_pod(&self, namespace: &str, name: &str) -> Pod {
        self.add_pod_with(namespace, name, &json!({}))
    }

    /// [`PolicyNode::add_pod`] with the runtime's capability arguments (e.g. `portMappings`).
    pub fn add_pod_with(&self, namespace: &str, name: &str, cap_args: &Value) -> Pod {
        let netns = TestNetns::new("pod");
        let result = self.kubenet.add(&netns, cap_args);
        let ips = result_ips(&result);
        let servers = PORTS.iter().map(|&port| TcpServer::start(&netns, port, |_| "ok".to_string())).collect();
        let udp = PORTS.iter().map(|&port| UdpEcho::start(&netns, port)).collect();
        Pod { namespace: namespace.into(), name: name.into(), netns, ips, _servers: servers, _udp: udp }
    }

    pub fn pod(&self, id: &str) -> &Pod {
        self.pods.iter().find(|p| p.id() == id).unwrap_or_else(|| panic!("no pod {id}"))
    }

    /// The cluster view of these pods (and `extra`) with `policies`, as the agent reads it.
    pub fn cluster(&self, extra: &[&Pod], policies: &[Value]) -> Value {
        let pods: Vec<Value> = self.pods.iter().chain(extra.iter().copied()).map(Pod::json).collect();
        json!({"namespaces": namespaces_json(), "pods": pods, "policies": policies})
    }

    /// Writes the cluster file atomically (the agent never reads half of it).
    pub fn write_cluster(&self, cluster: &Value) {
        let tmp = self.cluster_file.with_extension("tmp");
        fs::write(&tmp, serde_json::to_vec_pretty(cluster).expect("json")).expect("write cluster");
        fs::rename(&tmp, &self.cluster_file).expect("rename cluster");
    }

    /// Starts the agent in the node, reading the cluster file every 50 ms; its stderr goes to the log. With
    /// `CNI_NETPOL_TEST_DROP_LOG_RATE=N` in the environment (for investigating, not set by the test command),
    /// drops are also logged at N per second.
    pub fn start_agent(&self) -> Daemon {
        let file = self.cluster_file.display().to_string();
        let mut args = vec!["run", "--static", &file, "--interval-ms", "50"];
        let rate = std::env::var("CNI_NETPOL_TEST_DROP_LOG_RATE").unwrap_or_default();
        if !rate.is_empty() {
            args.extend(["--drop-log-rate", &rate]);
        }
        self.start_agent_with(&args)
    }

    /// What the node's conntrack table holds (`conntrack -L`), for a failure's message.
    pub fn conntrack(&self) -> String {
        let out = self.kubenet.node.exec("conntrack", &["-L"], &[], b"");
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
    }

    /// Starts the agent in the node with `args` (and the node's pod CIDRs and the test's run directory); its
    /// stderr goes to the log.
    pub fn start_agent_with(&self, args: &[&str]) -> Daemon {
        self.start_agent_with_env(&[], args)
    }

    /// [`PolicyNode::start_agent_with`], with `env` added to the agent's environment.
    pub fn start_agent_with_env(&self, env: &[(&str, &str)], args: &[&str]) -> Daemon {
        let log = fs::OpenOptions::new().create(true).append(true).open(&self.log_file).expect("log");
        let mut command = self.kubenet.node.command(bin("cni-netpol"));
        command
            .envs(env.iter().copied())
            .args(args)
            .args(["--pod-cidr", &self.pod_cidrs[0], "--pod-cidr", &self.pod_cidrs[1]])
            .arg("--run-dir")
            .arg(&self.run_dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        Daemon::spawn(&mut command)
    }

    /// The agent's log.
    pub fn log(&self) -> String {
        fs::read_to_string(&self.log_file).unwrap_or_default()
    }

    /// How many transactions the agents have applied (their log lines).
    pub fn applied(&self) -> usize {
        let applied = |l: &&str| ["Replaced(", "Elements(", "Rules("].iter().any(|kind| l.contains(kind));
        self.log().lines().filter(applied).count()
    }

    /// Writes `cluster` and waits until the running agent has applied it (one more transaction); nothing
    /// when the file holds it already.
    pub fn apply(&self, cluster: &Value) {
        let current: Option<Value> = fs::read(&self.cluster_file).ok().and_then(|b| serde_json::from_slice(&b).ok());
        if current.as_ref() == Some(cluster) {
            return;
        }
        let before = self.applied();
        self.write_cluster(cluster);
        let applied = crate::wait_for(Duration::from_secs(10), || self.applied() > before);
        assert!(applied.is_some(), "the agent did not apply the change:\n{}", self.log());
    }

    /// Every probe between two different pods of the suite, in parallel; a failed probe is tried once more
    /// (a lost first packet on a busy machine), so that a `false` means dropped twice.
    pub fn probe_all(&self) -> BTreeMap<Probe, bool> {
        let mut probes = Vec::new();
        for src in &self.pods {
            for dst in &self.pods {
                if src.id() == dst.id() {
                    continue;
                }
                for v6 in [false, true] {
                    for proto in Proto::ALL {
                        for port in PORTS {
                            probes.push(Probe { src: src.id(), dst: dst.id(), v6, proto, port });
                        }
                    }
                }
            }
        }
        let wait = Duration::from_millis(700);
        let run = |probe: &Probe| {
            let to = SocketAddr::new(self.pod(&probe.dst).ip(probe.v6), probe.port);
            reaches(&self.pod(&probe.src).netns, to, probe.proto, wait)
        };
        // 96 probes at a time; the probes that failed run once more, so a denial is one seen twice.
        let run_all = |probes: &[Probe], out: &mut BTreeMap<Probe, bool>| {
            for chunk in probes.chunks(96) {
                std::thread::scope(|scope| {
                    let handles: Vec<_> =
                        chunk.iter().map(|probe| scope.spawn(move || (probe.clone(), run(probe)))).collect();
                    for handle in handles {
                        let (probe, reached) = handle.join().expect("probe thread");
                        out.insert(probe, reached);
                    }
                });
            }
        };
        let mut out = BTreeMap::new();
        run_all(&probes, &mut out);
        let failed: Vec<Probe> = out.iter().filter(|(_, ok)| !**ok).map(|(p, _)| p.clone()).collect();
        run_all(&failed, &mut out);
        out
    }
}

impl Default for PolicyNode {
    fn default() -> Self {
        PolicyNode::new()
    }
}
