//! A cluster of "node" namespaces on an underlay, for fabricd: an infra namespace holding the underlay
//! bridges and etcd, optional router and wan namespaces, one fabricd per node, pods attached by our runner
//! with the conflist the agent wrote. Everything (namespaces, etcd, agents, temp dirs) is removed on drop.

use std::collections::BTreeSet;
use std::fs;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use ipnet::IpNet;

use crate::daemon::http_get;
use crate::upstream::{clean_command, output};
use crate::{bin, bin_dir, unique_name, veth_between, Node, PluginOutput, TestNetns, Value};

/// Where the rig's agents serve their metrics, in each node's own loopback (fabricd serves none by default).
pub const METRICS_ADDR: &str = "127.0.0.1:9799";

pub use crate::{wait_for, Daemon};

/// Panics unless `tool` is installed. The rig's policy ([`crate::require`]) skips a test outside CI, but a
/// cluster's guard cannot skip the test that makes it: a missing tool fails it everywhere.
pub fn require_tool(tool: &str) {
    assert!(crate::on_path(tool), "{tool} not installed (scripts/setup.sh installs etcd-server and openssl)");
}

/// TLS files for etcd and its clients, made with openssl: a CA, a server certificate for `server_ip`, a
/// client certificate, and a client certificate of another CA (to be refused).
pub struct TlsFiles {
    pub ca: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
    pub rogue_cert: PathBuf,
    pub rogue_key: PathBuf,
}

impl TlsFiles {
    pub fn make(dir: &Path, server_ip: Ipv4Addr) -> TlsFiles {
        require_tool("openssl");
        let run = |args: &[&str]| {
            let out = Command::new("openssl").args(args).current_dir(dir).output().expect("openssl");
            assert!(out.status.success(), "openssl {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
        };
        let ca = |name: &str| {
            run(&[
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-nodes",
                "-days",
                "2",
                "-subj",
                &format!("/CN={name}"),
                "-keyout",
                &format!("{name}.key"),
                "-out",
                &format!("{name}.crt"),
            ]);
        };
        let leaf = |name: &str, ca: &str, ext: &str| {
            run(&[
                "req",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-nodes",
                "-subj",
                &format!("/CN={name}"),
                "-keyout",
                &format!("{name}.key"),
                "-out",
                &format!("{name}.csr"),
            ]);
            fs::write(dir.join(format!("{name}.ext")), ext).unwrap();
            run(&[
                "x509",
                "-req",
                "-in",
                &format!("{name}.csr"),
                "-CA",
                &format!("{ca}.crt"),
                "-CAkey",
                &format!("{ca}.key"),
                "-CAcreateserial",
                "-days",
                "2",
                "-extfile",
                &format!("{name}.ext"),
                "-out",
                &format!("{name}.crt"),
            ]);
        };
        ca("ca");
        ca("rogue-ca");
        leaf(
            "server",
            "ca",
            &format!("subjectAltName=IP:{server_ip},IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n"),
        );
        leaf("client", "ca", "extendedKeyUsage=clientAuth\n");
        leaf("rogue", "rogue-ca", "extendedKeyUsage=clientAuth\n");
        let p = |name: &str| dir.join(name);
        TlsFiles {
            ca: p("ca.crt"),
            server_cert: p("server.crt"),
            server_key: p("server.key"),
            client_cert: p("client.crt"),
            client_key: p("client.key"),
            rogue_cert: p("rogue.crt"),
            rogue_key: p("rogue.key"),
        }
    }
}

/// etcd (Debian's etcd-server) in the infra namespace, on a temp data dir.
pub struct Etcd {
    daemon: Daemon,
    pub endpoint: String,
    ip: Ipv4Addr,
    data_dir: PathBuf,
    tls: bool,
    infra: PathBuf,
    ctl_tls: Vec<String>,
}

impl Etcd {
    pub fn start(infra: &TestNetns, ip: Ipv4Addr, dir: &Path, tls: Option<&TlsFiles>) -> Etcd {
        require_tool("etcd");
        require_tool("etcdctl");
        let scheme = if tls.is_some() { "https" } else { "http" };
        let endpoint = format!("{scheme}://{ip}:2379");
        let mut etcd = Etcd {
            daemon: Daemon { child: None },
            endpoint,
            ip,
            data_dir: dir.join("etcd"),
            tls: tls.is_some(),
            infra: infra.path.clone(),
            ctl_tls: Vec::new(),
        };
        let mut args: Vec<String> = Vec::new();
        if let Some(tls) = tls {
            args.extend(
                [
                    "--cert-file",
                    tls.server_cert.to_str().unwrap(),
                    "--key-file",
                    tls.server_key.to_str().unwrap(),
                    "--trusted-ca-file",
                    tls.ca.to_str().unwrap(),
                    "--client-cert-auth",
                ]
                .map(String::from),
            );
            etcd.ctl_tls = vec![
                format!("--cacert={}", tls.ca.display()),
                format!("--cert={}", tls.client_cert.display()),
                format!("--key={}", tls.client_key.display()),
            ];
        }
        etcd.spawn(infra, &args);
        etcd
    }

    fn spawn(&mut self, infra: &TestNetns, extra: &[String]) {
        let log = fs::File::create(self.data_dir.with_extension("log")).unwrap();
        let mut command = clean_command(infra, "etcd");
        command
            .args(["--data-dir", self.data_dir.to_str().unwrap()])
            .args(["--name", "infra"])
            .args(["--listen-client-urls", &self.endpoint, "--advertise-client-urls", &self.endpoint])
            .args([
                "--listen-peer-urls",
                "http://127.0.0.1:2380",
                "--initial-advertise-peer-urls",
                "http://127.0.0.1:2380",
            ])
            .args(["--initial-cluster", "infra=http://127.0.0.1:2380"])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(log);
        self.daemon = Daemon::spawn(&mut command);
        let ready = wait_for(Duration::from_secs(15), || self.ctl_in(infra, &["get", "/ready-probe"]).status.success());
        assert!(
            ready.is_some(),
            "etcd did not start: {}",
            fs::read_to_string(self.data_dir.with_extension("log")).unwrap_or_default()
        );
    }

    /// etcdctl against this etcd.
    pub fn ctl_in(&self, infra: &TestNetns, args: &[&str]) -> Output {
        self.ctl_command(infra, args).output().expect("etcdctl")
    }

    /// etcdctl with `stdin` (`put <key>` reads the value there: values larger than an argument can be).
    pub fn ctl_in_with_stdin(&self, infra: &TestNetns, args: &[&str], stdin: &[u8]) -> Output {
        crate::run_with_stdin(&mut self.ctl_command(infra, args), stdin)
    }

    fn ctl_command(&self, infra: &TestNetns, args: &[&str]) -> Command {
        let mut command = clean_command(infra, "etcdctl");
        command.env("ETCDCTL_API", "3").arg(format!("--endpoints={}", self.endpoint)).args(&self.ctl_tls).args(args);
        command
    }

    /// etcd's Prometheus metrics (plain HTTP only).
    pub fn metrics(&self, infra: &TestNetns) -> String {
        assert!(!self.tls, "metrics of a TLS etcd are not needed by the tests");
        http_get(infra, SocketAddr::new(self.ip.into(), 2379), "/metrics").unwrap_or_default()
    }

    pub fn ip(&self) -> Ipv4Addr {
        self.ip
    }

    /// The etcd process's PID (0 once killed): for its RSS in the benchmark.
    pub fn pid(&self) -> u32 {
        self.daemon.id()
    }

    pub fn kill(&mut self) {
        self.daemon.stop(nix::sys::signal::Signal::SIGKILL);
    }

    pub fn restart(&mut self, infra: &TestNetns) {
        assert!(!self.tls, "restart of a TLS etcd is not needed by the tests");
        assert_eq!(infra.path, self.infra);
        self.spawn(infra, &[]);
    }
}

/// One node: its namespace (with a temp dir), its underlay address, its agent and its pods.
pub struct FabricNode {
    pub node: Node,
    pub ip: Ipv4Addr,
    /// Its IPv6 underlay address, in a cluster made with [`Cluster::dual`].
    pub ip6: Option<Ipv6Addr>,
    pub agent: Option<Daemon>,
    pub args: Vec<String>,
    /// Environment of the agent (`NODE_NAME` in Kubernetes mode).
    pub env: Vec<(String, String)>,
    pods: usize,
}

impl FabricNode {
    pub fn conf_dir(&self) -> PathBuf {
        self.node.dir().join("net.d")
    }

    pub fn subnet_file(&self) -> PathBuf {
        self.node.dir().join("subnet.env")
    }

    pub fn log_path(&self) -> PathBuf {
        self.node.dir().join("fabricd.log")
    }

    pub fn log(&self) -> String {
        fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// The common flags: where this node's files go, then `args`.
    fn command(&self, extra: &[&str]) -> Command {
        self.command_after(&[], extra)
    }

    /// `fabricd <first> <the common flags> <extra>`.
    fn command_after(&self, first: &[&str], extra: &[&str]) -> Command {
        let mut command = clean_command(&self.node, bin("fabricd"));
        command
            .args(first)
            .arg(format!("--subnet-file={}", self.subnet_file().display()))
            .arg(format!("--cni-conf-dir={}", self.conf_dir().display()))
            .arg(format!("--cni-ipam-data-dir={}", self.node.dir().join("ipam").display()))
            .args(&self.args)
            .args(extra)
            .envs(self.env.iter().map(|(k, v)| (k, v)));
        command
    }

    /// Starts the agent (stderr appended to the node's log), serving its metrics on [`METRICS_ADDR`] in the
    /// node unless the test gave its own `--metrics-addr`.
    pub fn start(&mut self) {
        let log = fs::OpenOptions::new().create(true).append(true).open(self.log_path()).unwrap();
        let metrics = format!("--metrics-addr={METRICS_ADDR}");
        let own = self.args.iter().any(|a| a.starts_with("--metrics-addr"));
        let extra = [metrics.as_str()];
        let mut command = self.command(if own { &[] } else { &extra });
        command.stdout(Stdio::null()).stderr(log);
        self.agent = Some(Daemon::spawn(&mut command));
    }

    pub fn stop(&mut self, signal: nix::sys::signal::Signal) {
        if let Some(mut agent) = self.agent.take() {
            agent.stop(signal);
        }
    }

    /// The agent's Prometheus metrics (on [`METRICS_ADDR`] in the node).
    pub fn metrics(&self) -> String {
        http_get(&self.node, METRICS_ADDR.parse().unwrap(), "/metrics").unwrap_or_default()
    }

    /// Runs `fabricd <extra>` to completion (status, cleanup).
    pub fn run(&self, extra: &[&str]) -> PluginOutput {
        output(&mut self.command(extra), b"")
    }

    /// Runs `fabricd <subcommand> <the node's flags> <extra>`: the flags after the subcommand.
    pub fn run_subcommand(&self, subcommand: &str, extra: &[&str]) -> PluginOutput {
        output(&mut self.command_after(&[subcommand], extra), b"")
    }

    /// Waits for the agent to write the conflist; its subnet.
    pub fn wait_ready(&self, timeout: Duration) -> IpNet {
        let path = self.conf_dir().join("10-fabric.conflist");
        let exited = || self.agent.as_ref().is_some_and(Daemon::has_exited);
        // An agent that exited will write nothing: fail at once, with its log.
        wait_for(timeout, || path.is_file() || exited());
        let why = if exited() { "exited".to_string() } else { format!("wrote no conflist within {timeout:?}") };
        assert!(path.is_file(), "{}: fabricd {why}; its log:\n{}", self.node.name, self.log());
        self.subnet().or_else(|| self.subnet6()).expect("subnet.env")
    }

    /// The subnet in the node's subnet.env.
    pub fn subnet(&self) -> Option<IpNet> {
        let text = fs::read_to_string(self.subnet_file()).ok()?;
        let line = text.lines().find_map(|l| l.strip_prefix("FLANNEL_SUBNET="))?;
        Some(line.parse::<IpNet>().ok()?.trunc())
    }

    /// The IPv6 subnet in the node's subnet.env.
    pub fn subnet6(&self) -> Option<IpNet> {
        let text = fs::read_to_string(self.subnet_file()).ok()?;
        let line = text.lines().find_map(|l| l.strip_prefix("FLANNEL_IPV6_SUBNET="))?;
        Some(line.parse::<IpNet>().ok()?.trunc())
    }

    /// The routes fabricd made (`proto 75`) as "dst via gw dev" lines.
    pub fn fabric_routes(&self) -> Vec<String> {
        self.node
            .ip(&["route", "show", "proto", "75"])
            .lines()
            .map(|l| l.trim().to_string())
            .filter(|l| !l.is_empty())
            .collect()
    }

    /// Attaches a pod with our runner and the conflist the agent wrote; the pod and its address.
    pub fn add_pod(&mut self) -> (TestNetns, IpAddr) {
        let (pod, ips) = self.add_pod_all();
        (pod, ips[0])
    }

    /// Attaches a pod; the pod and its addresses (one per family of the node's subnets, IPv4 first).
    pub fn add_pod_all(&mut self) -> (TestNetns, Vec<IpAddr>) {
        let pod = TestNetns::new("pod");
        self.pods += 1;
        let out = self.cnitool(&["add", "kubenet", pod.path.to_str().unwrap()]);
        let result = out.expect_ok();
        let ips = result["ips"]
            .as_array()
            .expect("ips")
            .iter()
            .map(|ip| ip["address"].as_str().expect("address").parse::<IpNet>().expect("address").addr())
            .collect();
        (pod, ips)
    }

    /// The routes fabricd made (`proto 75`) of IPv6, as "dst via gw dev" lines.
    pub fn fabric_routes6(&self) -> Vec<String> {
        self.node
            .ip(&["-6", "route", "show", "proto", "75"])
            .lines()
            .map(|l| l.trim().to_string())
            .filter(|l| !l.is_empty())
            .collect()
    }

    pub fn cnitool(&self, args: &[&str]) -> PluginOutput {
        self.cnitool_in(&self.conf_dir(), args)
    }

    /// Our runner with the conflists of `conf_dir`.
    pub fn cnitool_in(&self, conf_dir: &Path, args: &[&str]) -> PluginOutput {
        let mut command = clean_command(&self.node, bin("cnitool"));
        command
            .args(args)
            .env("NETCONFPATH", conf_dir)
            .env("CNI_PATH", bin_dir())
            .env("CNI_IFNAME", "eth0")
            .env("CNI_CACHE_DIR", self.node.dir().join("cache"));
        output(&mut command, b"")
    }
}

/// The underlay: an infra namespace with one bridge per L2 segment; segment `n` is 192.168.(50+n).0/24 with
/// the infra namespace at .254 (segment 0 only) and, when there is more than one segment, a router
/// namespace at .1 on each.
pub struct Cluster {
    pub infra: TestNetns,
    pub router: Option<TestNetns>,
    pub wan: TestNetns,
    pub nodes: Vec<FabricNode>,
    pub etcd: Option<Etcd>,
    pub dir: PathBuf,
    segments: usize,
    next_host: Vec<u8>,
    /// The underlay has IPv6 too (segment `n`: fd00:192:168:(50+n)::/64).
    ipv6: bool,
}

pub const WAN_IP: Ipv4Addr = Ipv4Addr::new(192, 168, 50, 200);

pub fn segment_ip(segment: usize, host: u8) -> Ipv4Addr {
    Ipv4Addr::new(192, 168, 50 + segment as u8, host)
}

/// The IPv6 address of `host` on `segment` (fd00:192:168:50::a for host 10 of segment 0).
pub fn segment_ip6(segment: usize, host: u8) -> Ipv6Addr {
    Ipv6Addr::new(0xfd00, 0x192, 0x168, 0x50 + segment as u16, 0, 0, 0, host as u16)
}

pub fn wan_ip6() -> Ipv6Addr {
    segment_ip6(0, 200)
}

impl Cluster {
    /// The underlay with `segments` L2 segments, a wan namespace on segment 0 (no route to pods).
    pub fn new(segments: usize) -> Cluster {
        Cluster::build(segments, false)
    }

    /// The underlay with IPv4 and IPv6 on each segment (routed both ways), the wan too.
    pub fn dual(segments: usize) -> Cluster {
        Cluster::build(segments, true)
    }

    fn build(segments: usize, ipv6: bool) -> Cluster {
        let infra = TestNetns::new("infra");
        let v6 = |segment: usize, host: u8| -> Vec<IpNet> {
            if ipv6 {
                vec![format!("{}/64", segment_ip6(segment, host)).parse().unwrap()]
            } else {
                Vec::new()
            }
        };
        let dir = std::env::temp_dir().join(format!("cni-{}", unique_name("fab")));
        fs::create_dir_all(&dir).unwrap();
        for segment in 0..segments {
            // No multicast snooping: IPv6 neighbour discovery between nodes must not wait for MLD reports.
            infra.ip(&["link", "add", &format!("seg{segment}"), "type", "bridge", "mcast_snooping", "0"]);
            infra.ip(&["link", "set", &format!("seg{segment}"), "up"]);
        }
        infra.ip(&["addr", "add", &format!("{}/24", segment_ip(0, 254)), "dev", "seg0"]);
        if ipv6 {
            infra.ip(&["addr", "add", &format!("{}/64", segment_ip6(0, 254)), "dev", "seg0", "nodad"]);
        }
        let router = (segments > 1).then(|| {
            let router = TestNetns::new("rtr");
            for segment in 0..segments {
                let name = format!("r{segment}");
                let mut addresses = vec![format!("{}/24", segment_ip(segment, 1)).parse().unwrap()];
                addresses.extend(v6(segment, 1));
                veth_between(&router, &infra, &name, &format!("rs{segment}"), &addresses, &[]);
                infra.ip(&["link", "set", &format!("rs{segment}"), "master", &format!("seg{segment}")]);
            }
            crate::TestNetns::run(&router, || cnicore::sysctl::write("net/ipv4/ip_forward", "1")).unwrap();
            infra.ip(&["route", "add", "192.168.0.0/16", "via", &segment_ip(0, 1).to_string()]);
            if ipv6 {
                crate::TestNetns::run(&router, || cnicore::sysctl::write("net/ipv6/conf/all/forwarding", "1")).unwrap();
                infra.ip(&["-6", "route", "add", "fd00:192:168::/48", "via", &segment_ip6(0, 1).to_string()]);
            }
            router
        });
        let wan = TestNetns::new("wan");
        let mut wan_addresses = vec![format!("{WAN_IP}/24").parse().unwrap()];
        wan_addresses.extend(v6(0, 200));
        veth_between(&wan, &infra, "eth0", "wan0", &wan_addresses, &[]);
        infra.ip(&["link", "set", "wan0", "master", "seg0"]);
        Cluster {
            infra,
            router,
            wan,
            nodes: Vec::new(),
            etcd: None,
            dir,
            segments,
            next_host: vec![10; segments],
            ipv6,
        }
    }

    /// Starts etcd in the infra namespace (at 192.168.50.254:2379) and writes the network config.
    pub fn start_etcd(&mut self, config: &Value, tls: Option<&TlsFiles>) {
        let etcd = Etcd::start(&self.infra, segment_ip(0, 254), &self.dir, tls);
        let out = etcd.ctl_in(&self.infra, &["put", "/coreos.com/network/config", &config.to_string()]);
        assert!(out.status.success(), "etcdctl put: {}", String::from_utf8_lossy(&out.stderr));
        self.etcd = Some(etcd);
    }

    pub fn etcdctl(&self, args: &[&str]) -> Output {
        self.etcd.as_ref().expect("etcd started").ctl_in(&self.infra, args)
    }

    /// Adds a node on `segment` (default route via the router, or the infra namespace), not started. Its
    /// agent gets `--etcd-endpoints` when etcd runs, and `args`.
    pub fn add_node(&mut self, segment: usize, args: &[&str]) -> usize {
        assert!(segment < self.segments);
        let node = Node::new();
        let host = self.next_host[segment];
        self.next_host[segment] += 1;
        let ip = segment_ip(segment, host);
        let index = self.nodes.len();
        let infra_end = format!("n{index}");
        let ip6 = self.ipv6.then(|| segment_ip6(segment, host));
        let mut addresses: Vec<IpNet> = vec![format!("{ip}/24").parse().unwrap()];
        addresses.extend(ip6.map(|ip6| format!("{ip6}/64").parse::<IpNet>().unwrap()));
        veth_between(&node, &self.infra, "eth0", &infra_end, &addresses, &[]);
        self.infra.ip(&["link", "set", &infra_end, "master", &format!("seg{segment}")]);
        let gateway = if self.router.is_some() { segment_ip(segment, 1) } else { segment_ip(0, 254) };
        node.ip(&["route", "add", "default", "via", &gateway.to_string()]);
        if self.ipv6 {
            let gateway6 = if self.router.is_some() { segment_ip6(segment, 1) } else { segment_ip6(0, 254) };
            node.ip(&["-6", "route", "add", "default", "via", &gateway6.to_string()]);
        }
        let mut all_args: Vec<String> = Vec::new();
        if let Some(etcd) = &self.etcd {
            all_args.push(format!("--etcd-endpoints={}", etcd.endpoint));
        }
        all_args.extend(args.iter().map(|a| a.to_string()));
        self.nodes.push(FabricNode { node, ip, ip6, agent: None, args: all_args, env: Vec::new(), pods: 0 });
        index
    }

    /// Every node's pods reach every other node's pods, and the receiver sees the sender pod's own address.
    pub fn assert_full_mesh(&self, pods: &[(usize, &TestNetns, IpAddr)]) {
        for (from_node, from, from_ip) in pods {
            for (to_node, to, to_ip) in pods {
                if from_node == to_node {
                    continue;
                }
                let seen = tcp_source(from, to, *to_ip);
                assert_eq!(
                    seen,
                    Some(*from_ip),
                    "pod {from_ip} on node {from_node} -> pod {to_ip} on node {to_node}: source seen {seen:?}"
                );
            }
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            node.stop(nix::sys::signal::Signal::SIGKILL);
        }
        self.etcd = None;
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// Opens a TCP connection from namespace `from` to a listener in `to` on `to_ip`; the source address the
/// listener saw (None when no connection was made within 2 s).
pub fn tcp_source(from: &TestNetns, to: &TestNetns, to_ip: IpAddr) -> Option<IpAddr> {
    let listener = to.run(|| TcpListener::bind(SocketAddr::new(to_ip, 0))).ok()?;
    let port = listener.local_addr().ok()?.port();
    listener.set_nonblocking(true).ok()?;
    let connected = from.run(|| TcpStream::connect_timeout(&SocketAddr::new(to_ip, port), Duration::from_secs(2)));
    let stream = connected.ok()?;
    let mut seen = None;
    wait_for(Duration::from_secs(1), || match listener.accept() {
        Ok((_, peer)) => {
            seen = Some(peer.ip());
            true
        }
        Err(_) => false,
    });
    drop(stream);
    seen
}

/// The value of the unlabelled sample `name` in a Prometheus text exposition.
pub fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines().find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

// What the fabric test files share: the config, starting a cluster, waiting for routes, pods and their mesh.

/// How long a node may take to write its conflist.
pub const READY: Duration = Duration::from_secs(15);
/// Generous bounds for what the goals put at one second (the figures are in docs/benchmarks.md).
pub const CONVERGE: Duration = Duration::from_secs(3);

/// An IPv4 cluster's network config on `backend`.
pub fn config(backend: Value) -> Value {
    serde_json::json!({ "Network": "10.244.0.0/16", "SubnetLen": 24, "Backend": backend })
}

/// Starts every node's agent and waits until each wrote its conflist and routes to all the others.
pub fn start_all(cluster: &mut Cluster) -> Vec<ipnet::IpNet> {
    for node in &mut cluster.nodes {
        node.start();
    }
    let subnets: Vec<_> = cluster.nodes.iter().map(|n| n.wait_ready(READY)).collect();
    let distinct: BTreeSet<_> = subnets.iter().collect();
    assert_eq!(distinct.len(), subnets.len(), "subnets {subnets:?}");
    subnets
}

pub fn wait_routes(cluster: &Cluster, count: usize) {
    for node in &cluster.nodes {
        let done = wait_for(CONVERGE, || node.fabric_routes().len() == count);
        assert!(
            done.is_some(),
            "{}: routes {:?}, wanted {count}\n{}",
            node.node.name,
            node.fabric_routes(),
            node.log()
        );
    }
}

pub fn pods(cluster: &mut Cluster) -> Vec<(usize, TestNetns, IpAddr)> {
    let mut pods = Vec::new();
    for (index, node) in cluster.nodes.iter_mut().enumerate() {
        let (pod, ip) = node.add_pod();
        pods.push((index, pod, ip));
    }
    pods
}

pub fn mesh(cluster: &Cluster, pods: &[(usize, TestNetns, IpAddr)]) {
    let refs: Vec<(usize, &TestNetns, IpAddr)> = pods.iter().map(|(i, p, ip)| (*i, p, *ip)).collect();
    cluster.assert_full_mesh(&refs);
}

pub fn ping(from: &TestNetns, to: IpAddr, extra: &[&str]) -> std::process::Output {
    let mut args = vec!["-c1", "-W1"];
    args.extend_from_slice(extra);
    let to = to.to_string();
    args.push(&to);
    from.exec("ping", &args, &[], b"")
}

/// A dual-stack cluster's network config on `backend`.
pub fn dual_config(backend: Value) -> Value {
    serde_json::json!({ "EnableIPv6": true, "Network": "10.244.0.0/16", "SubnetLen": 24, "IPv6Network": "fd00:10:244::/56",
            "Backend": backend })
}

/// Waits until every node has `count` IPv6 routes of fabricd's.
pub fn wait_routes6(cluster: &Cluster, count: usize) {
    for node in &cluster.nodes {
        let done = wait_for(CONVERGE, || node.fabric_routes6().len() == count);
        assert!(
            done.is_some(),
            "{}: IPv6 routes {:?}, wanted {count}\n{}",
            node.node.name,
            node.fabric_routes6(),
            node.log()
        );
    }
}

/// One pod per node, with its addresses (IPv4 first in a dual-stack cluster).
pub fn pods_all(cluster: &mut Cluster) -> Vec<(usize, TestNetns, Vec<IpAddr>)> {
    cluster
        .nodes
        .iter_mut()
        .enumerate()
        .map(|(index, node)| {
            let (pod, ips) = node.add_pod_all();
            (index, pod, ips)
        })
        .collect()
}

/// Pod to pod across nodes in each family the pods have, the receiver seeing the sender pod's own address.
/// IPv6 neighbour discovery along the path settles first (each pod pings each other pod, up to 5 s).
pub fn mesh_all(cluster: &Cluster, pods: &[(usize, TestNetns, Vec<IpAddr>)], families: usize) {
    for (_, from, _) in pods {
        for (_, _, ips) in pods {
            for to in ips.iter().filter(|ip| ip.is_ipv6()) {
                let settled = wait_for(Duration::from_secs(5), || ping(from, *to, &[]).status.success());
                assert!(settled.is_some(), "no IPv6 path to {to}");
            }
        }
    }
    for family in 0..families {
        let refs: Vec<(usize, &TestNetns, IpAddr)> = pods.iter().map(|(i, p, ips)| (*i, p, ips[family])).collect();
        // Dual stack: IPv4 first, then IPv6; an IPv6-only pod has one IPv6 address.
        let wanted_v6 = family == 1 || families == 1;
        assert!(refs.iter().all(|(_, _, ip)| ip.is_ipv6() == wanted_v6), "family {family} of {families}");
        cluster.assert_full_mesh(&refs);
    }
}

pub fn vtep_mac(ip: IpAddr) -> String {
    let tail: Vec<u8> = match ip {
        IpAddr::V4(ip) => [&[0x0e, 0xfa][..], &ip.octets()[..]].concat(),
        // fabricd's: an FNV-1a hash of the IPv6 address.
        IpAddr::V6(ip) => {
            let hash = ip.octets().iter().fold(0x811c_9dc5u32, |h, b| (h ^ u32::from(*b)).wrapping_mul(0x0100_0193));
            [&[0x0e, 0xfb][..], &hash.to_be_bytes()[..]].concat()
        }
    };
    tail.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":")
}
