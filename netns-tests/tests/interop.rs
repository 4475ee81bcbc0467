//! Interop suite (issue 6): the example conflists of `conf/` end to end, driven by real clients (upstream
//! cnitool, built from libcni 1.1.2, and our runner), also mixed with the reference plugins (/usr/lib/cni).
//!
//! Each test has one lab:
//!
//! ```text
//!   pod (eth0 10.244.1.x) --veth-- node (cbr0 10.244.1.1 | up0 192.168.77.1, fd77::1) --veth-- wan (192.168.77.2, fd77::2)
//! ```
//!
//! The node's default routes go via the wan namespace; the clients and plugins run in the node namespace;
//! state (host-local's dataDir, the result cache, which upstream cnitool sees as /var/lib/cni) lives in the
//! node's temporary directory. Every pod runs a small TCP server on port 80 answering with its name.
//!
//! What "nothing left" means after DEL (see [`assert_node_clean`]): compared with the node before the first
//! ADD, the only new links, addresses, routes and qdiscs are the bridge's (the reference keeps `cbr0` too);
//! sysctls may differ (forwarding, route_localnet stay on, as with the reference). Firewall state may keep the
//! shared structure the reference leaves behind — the `CNI-HOSTPORT-*` chains and their jumps in `nat`, and
//! our nftables tables with their fixed chains and empty maps and sets — but nothing that names a pod: no pod
//! address, no container ID, no per-pod chain (`CNI-DN-*`, `CNI-<hash>`), no set or map element. host-local
//! keeps its `lock`, `last_reserved_ip.*` and index files, but no lease; the cache keeps no result.
//!
//! Build the binaries first (`cargo build --workspace --bins`). Tests that need upstream cnitool are skipped
//! (with a message) when it has not been built.

use std::collections::BTreeSet;
use std::fs;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use cnicore::netlink::AddressOptions;
use cnicore::tc::QdiscKind;
use ipnet::IpNet;
use netns_tests::snapshot::NodeSnapshot;
use netns_tests::traffic::{tcp_ask, TcpServer};
use netns_tests::upstream::{
    clean_command, output, plugin_dir, reference, upstream_cnitool, with_var_lib_cni, VarLibCni,
};
use netns_tests::{bin, ip, json, net, result_addresses, unique_name, Node, PluginOutput, TestNetns, Value};

// ---------------------------------------------------------------------------------------------------------
// The lab
// ---------------------------------------------------------------------------------------------------------

const KUBENET: &str = "kubenet";
const DUALSTACK: &str = "kubenet-dualstack";
const NFT: &str = "kubenet-nft";
const LOOPBACK: &str = "cni-loopback";

const NODE_UPLINK_V4: &str = "192.168.77.1";
const NODE_UPLINK_V6: &str = "fd77::1";
const GATEWAY_V4: &str = "10.244.1.1";
const GATEWAY_V6: &str = "fd00:10:244:1::1";
const WAN_V4: &str = "192.168.77.2";
const WAN_V6: &str = "fd77::2";
/// Port of every pod's server.
const POD_PORT: u16 = 80;

/// Rates and bursts of the pods that are shaped (bits per second, bits).
const INGRESS_RATE: u64 = 8_000_000;
const INGRESS_BURST: u64 = 800_000;
const EGRESS_RATE: u64 = 16_000_000;
const EGRESS_BURST: u64 = 1_600_000;

fn path_str(path: &Path) -> &str {
    path.to_str().expect("utf-8 path")
}

/// The implementation serving one plugin type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Impl {
    Ours,
    Reference,
}

/// Which binaries a CNI_PATH holds.
#[derive(Clone, Copy, Debug)]
struct Plugins {
    bridge: Impl,
    host_local: Impl,
    portmap: Impl,
    bandwidth: Impl,
    loopback: Impl,
}

impl Plugins {
    const OURS: Plugins = Plugins::all(Impl::Ours);
    const REFERENCE: Plugins = Plugins::all(Impl::Reference);

    const fn all(which: Impl) -> Plugins {
        Plugins { bridge: which, host_local: which, portmap: which, bandwidth: which, loopback: which }
    }
}

/// The client that runs the conflists.
#[derive(Clone, Debug)]
enum Tool {
    /// Upstream cnitool (libcni 1.1.2), with the lab's cache mounted on /var/lib/cni.
    Upstream(PathBuf),
    /// Our cnitool, with CNI_CACHE_DIR pointing at the same cache.
    Ours,
}

impl Tool {
    fn name(&self) -> &'static str {
        match self {
            Tool::Upstream(_) => "upstream cnitool",
            Tool::Ours => "our cnitool",
        }
    }
}

/// A node with an uplink to a "wan" namespace, a NETCONFPATH, a host-local data dir, a result cache, and
/// plugin directories.
struct Lab {
    node: Node,
    wan: TestNetns,
    conf_dir: PathBuf,
    data_dir: PathBuf,
    cache: VarLibCni,
    /// The CNI_PATH in use.
    cni_path: PathBuf,
    /// The node before any CNI call, for [`assert_node_clean`].
    baseline: NodeSnapshot,
}

impl Lab {
    fn new(plugins: Plugins) -> Lab {
        let node = Node::new();
        let wan = TestNetns::new("wan");
        uplink(&node, &wan);
        node.ip(&["route", "add", "default", "via", WAN_V4]);
        node.ip(&["-6", "route", "add", "default", "via", WAN_V6]);
        let dir = node.dir().to_path_buf();
        let conf_dir = dir.join("net.d");
        fs::create_dir_all(&conf_dir).expect("conf dir");
        let cache = VarLibCni::new(&dir);
        let baseline = NodeSnapshot::settled(&node, &[], Duration::from_secs(4));
        let mut lab =
            Lab { data_dir: dir.join("ipam"), cni_path: PathBuf::new(), node, wan, conf_dir, cache, baseline };
        lab.use_plugins(plugins);
        lab
    }

    /// Makes a new plugin directory holding `plugins` and uses it as CNI_PATH from now on.
    fn use_plugins(&mut self, plugins: Plugins) {
        let pick = |which: Impl, name: &str| match which {
            Impl::Ours => bin(name),
            Impl::Reference => reference(name),
        };
        let binaries = [
            ("bridge", pick(plugins.bridge, "bridge")),
            ("host-local", pick(plugins.host_local, "host-local")),
            ("portmap", pick(plugins.portmap, "portmap")),
            ("bandwidth", pick(plugins.bandwidth, "bandwidth")),
            ("loopback", pick(plugins.loopback, "loopback")),
        ];
        let links: Vec<(&str, &Path)> = binaries.iter().map(|(n, p)| (*n, p.as_path())).collect();
        self.cni_path = plugin_dir(&self.node.dir().join(unique_name("bin-")), &links);
    }

    /// Copies `conf/<file>` into the NETCONFPATH, with `cniVersion` set to `version` (when given) and the
    /// lab's `dataDir` in every host-local section. Returns the network's name.
    fn install_conf(&self, file: &str, version: Option<&str>) -> String {
        let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("../conf").join(file);
        let text = fs::read(&source).unwrap_or_else(|e| panic!("read {}: {e}", source.display()));
        let mut conf: Value = serde_json::from_slice(&text).unwrap_or_else(|e| panic!("{}: {e}", source.display()));
        if let Some(version) = version {
            conf["cniVersion"] = json!(version);
        }
        let data_dir = json!(self.data_dir);
        if let Some(plugins) = conf["plugins"].as_array_mut() {
            for plugin in plugins {
                if plugin["ipam"]["type"] == "host-local" {
                    plugin["ipam"]["dataDir"] = data_dir.clone();
                }
            }
        }
        let target = self.conf_dir.join(file);
        fs::write(&target, serde_json::to_vec_pretty(&conf).expect("json")).expect("write conf");
        conf["name"].as_str().expect("network name").to_string()
    }

    /// Runs `tool verb net netns` in the node with CNI_IFNAME `ifname` and CAP_ARGS `cap_args` (when given).
    fn cnitool(&self, tool: &Tool, args: &[&str], ifname: &str, cap_args: Option<&Value>) -> PluginOutput {
        let mut command = match tool {
            Tool::Upstream(path) => clean_command(&self.node, path),
            Tool::Ours => {
                let mut command = clean_command(&self.node, bin("cnitool"));
                command.env("CNI_CACHE_DIR", self.cache.path());
                command
            }
        };
        command.args(args).env("NETCONFPATH", &self.conf_dir).env("CNI_PATH", &self.cni_path).env("CNI_IFNAME", ifname);
        if let Some(cap_args) = cap_args {
            command.env("CAP_ARGS", cap_args.to_string());
        }
        if let Tool::Upstream(_) = tool {
            with_var_lib_cni(&mut command, &self.cache);
        }
        output(&mut command, b"")
    }

    /// The cache's result files.
    fn cached_results(&self) -> Vec<String> {
        let dir = self.cache.path().join("results");
        match fs::read_dir(&dir) {
            Ok(entries) => entries.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect(),
            Err(_) => Vec::new(),
        }
    }

    /// The lease files of `network` (files named by an address).
    fn leases(&self, network: &str) -> Vec<IpAddr> {
        let dir = self.data_dir.join(network);
        let Ok(entries) = fs::read_dir(&dir) else { return Vec::new() };
        entries.flatten().filter_map(|e| e.file_name().to_str().and_then(|n| n.parse().ok())).collect()
    }
}

/// The node's uplink `up0` to `wan0` in the wan namespace, with the lab's addresses. Its IPv6 link-local
/// address skips duplicate address detection, so that the node's baseline is settled at once.
fn uplink(node: &Node, wan: &TestNetns) {
    let mut netlink = node.netlink();
    let up0 = netlink.create_veth("up0", "wan0", &wan.netns(), None, None).expect("uplink veth");
    node.run(|| cnicore::sysctl::write("net/ipv6/conf/up0/accept_dad", "0")).expect("accept_dad");
    let mut wan_netlink = wan.netlink();
    let wan0 = wan_netlink.require_link("wan0").expect("wan0");
    let ends =
        [(&mut netlink, up0.index, [NODE_UPLINK_V4, NODE_UPLINK_V6]), (&mut wan_netlink, wan0.index, [WAN_V4, WAN_V6])];
    for (netlink, index, [v4, v6]) in ends {
        for addr in [net(&format!("{v4}/24")), net(&format!("{v6}/64"))] {
            let options = AddressOptions { nodad: true, ..AddressOptions::default() };
            netlink.add_address_with(index, addr, options).unwrap_or_else(|e| panic!("add {addr}: {e}"));
        }
        netlink.set_up(index).expect("uplink up");
    }
}

fn ok(out: &PluginOutput, what: &str) -> Value {
    assert!(out.success(), "{what} failed ({}): stdout {} stderr {}", out.status, out.stdout_text, out.stderr);
    out.stdout.clone()
}

fn failed(out: &PluginOutput, what: &str) {
    assert!(!out.success(), "{what} unexpectedly succeeded: stdout {}", out.stdout_text);
}

/// upstream cnitool's container ID for a netns path: `cnitool-` and the first 20 hex digits of its SHA-512,
/// computed with coreutils so that the test shares no code with the runner.
fn container_id(netns: &Path) -> String {
    let out = output(&mut Command::new("sha512sum"), path_str(netns).as_bytes());
    assert!(out.success(), "sha512sum: {}", out.stderr);
    format!("cnitool-{}", &out.stdout_text[..20])
}

// ---------------------------------------------------------------------------------------------------------
// Pods
// ---------------------------------------------------------------------------------------------------------

/// A TCP server in a namespace answering `<label>` to each client, stopped on drop.
fn label_server(ns: &TestNetns, label: String) -> TcpServer {
    TcpServer::start(ns, POD_PORT, move |_| label.clone())
}

/// True when `from` gets a ping answer from `to` within a few tries (IPv6 neighbour discovery may still
/// be settling right after an ADD).
fn pings(from: &TestNetns, to: IpAddr) -> bool {
    (0..4).any(|_| from.ping(to))
}

fn assert_pings(from: &TestNetns, to: IpAddr, what: &str) {
    assert!(pings(from, to), "{what}: no ping answer from {to} in {}", from.name);
}

/// A pod: its namespace, its server, and what ADD returned.
struct Pod {
    ns: TestNetns,
    label: String,
    host_port: u16,
    shaped: bool,
    result: Value,
    _server: TcpServer,
}

impl Pod {
    fn new(lab: &Lab, host_port: u16, shaped: bool) -> Pod {
        let ns = lab.node.pod_netns();
        let label = format!("pod {}", ns.name);
        let server = label_server(&ns, label.clone());
        Pod { ns, label, host_port, shaped, result: Value::Null, _server: server }
    }

    fn netns(&self) -> &str {
        path_str(&self.ns.path)
    }

    fn container_id(&self) -> String {
        container_id(&self.ns.path)
    }

    /// The capability arguments a runtime passes for this pod on ADD, CHECK and DEL.
    fn cap_args(&self) -> Value {
        let mut args =
            json!({"portMappings": [{"hostPort": self.host_port, "containerPort": POD_PORT, "protocol": "tcp"}]});
        if self.shaped {
            args["bandwidth"] = json!({"ingressRate": INGRESS_RATE, "ingressBurst": INGRESS_BURST,
                                       "egressRate": EGRESS_RATE, "egressBurst": EGRESS_BURST});
        }
        args
    }

    /// The pod's addresses from the ADD result, with their prefix.
    fn addresses(&self) -> Vec<IpNet> {
        result_addresses(&self.result)
    }

    fn v4(&self) -> IpAddr {
        self.addresses().iter().map(IpNet::addr).find(IpAddr::is_ipv4).expect("an IPv4 address")
    }

    fn v6(&self) -> IpAddr {
        self.addresses().iter().map(IpNet::addr).find(IpAddr::is_ipv6).expect("an IPv6 address")
    }

    /// The host end of the pod's veth (the bridge's result lists bridge, host veth, pod interface).
    fn host_veth(&self) -> String {
        let interfaces =
            self.result["interfaces"].as_array().unwrap_or_else(|| panic!("no interfaces in {}", self.result));
        let host = interfaces.iter().find(|i| i["sandbox"].as_str().is_none_or(str::is_empty) && i["name"] != "cbr0");
        host.and_then(|i| i["name"].as_str()).unwrap_or_else(|| panic!("no host veth in {}", self.result)).to_string()
    }
}

/// ADD of `pod` to `network` (and of the loopback attachment, as the kubelet does) with `tool`.
fn add(lab: &Lab, tool: &Tool, network: &str, pod: &mut Pod) {
    ok(&lab.cnitool(tool, &["add", LOOPBACK, pod.netns()], "lo", None), &format!("{} add {LOOPBACK}", tool.name()));
    let what = format!("{} add {network} {}", tool.name(), pod.ns.name);
    pod.result = ok(&lab.cnitool(tool, &["add", network, pod.netns()], "eth0", Some(&pod.cap_args())), &what);
}

fn check(lab: &Lab, tool: &Tool, network: &str, pod: &Pod) -> PluginOutput {
    lab.cnitool(tool, &["check", network, pod.netns()], "eth0", Some(&pod.cap_args()))
}

fn del(lab: &Lab, tool: &Tool, network: &str, pod: &Pod) {
    let what = format!("{} del {network} {}", tool.name(), pod.ns.name);
    ok(&lab.cnitool(tool, &["del", network, pod.netns()], "eth0", Some(&pod.cap_args())), &what);
    ok(&lab.cnitool(tool, &["del", LOOPBACK, pod.netns()], "lo", None), &format!("{} del {LOOPBACK}", tool.name()));
}

// ---------------------------------------------------------------------------------------------------------
// What a user checks
// ---------------------------------------------------------------------------------------------------------

/// The pod's own view: its addresses on eth0, lo up, the routes host-local gave it.
fn assert_pod_configured(pod: &Pod, version: &str) {
    assert_eq!(pod.result["cniVersion"], version, "{}", pod.result);
    let links = pod.ns.ip_json(&["addr", "show", "dev", "eth0"]);
    let on_eth0: Vec<String> = links[0]["addr_info"]
        .as_array()
        .unwrap_or_else(|| panic!("no addr_info: {links}"))
        .iter()
        .map(|a| format!("{}/{}", a["local"].as_str().unwrap_or("?"), a["prefixlen"]))
        .collect();
    for address in pod.addresses() {
        assert!(on_eth0.contains(&address.to_string()), "{address} not on eth0: {on_eth0:?}");
    }
    assert!(pod.ns.netlink().require_link("lo").expect("lo").up, "lo not up in {}", pod.ns.name);
    assert_routes(pod, "-4", GATEWAY_V4, "10.244.1.0/24");
    if pod.addresses().iter().any(|a| a.addr().is_ipv6()) {
        assert_routes(pod, "-6", GATEWAY_V6, "fd00:10:244:1::/64");
    }
}

/// The pod has a default route via `gateway` and its subnet's route, both on eth0.
fn assert_routes(pod: &Pod, family: &str, gateway: &str, subnet: &str) {
    let routes = pod.ns.ip_json(&[family, "route", "show", "dev", "eth0"]);
    let routes: Vec<(String, String)> = routes
        .as_array()
        .unwrap_or_else(|| panic!("routes: {routes}"))
        .iter()
        .map(|r| (r["dst"].as_str().unwrap_or("").to_string(), r["gateway"].as_str().unwrap_or("").to_string()))
        .collect();
    assert!(routes.contains(&("default".into(), gateway.into())), "no default route via {gateway}: {routes:?}");
    assert!(routes.iter().any(|(dst, _)| dst == subnet), "no route to {subnet}: {routes:?}");
}

/// Connectivity of the running pods: to the gateway, to each other, out to the wan (masqueraded), and their
/// host ports from the wan, from the node's localhost, from another pod, and from the pod itself (hairpin).
fn assert_pods_work(lab: &Lab, pods: &[&Pod]) {
    let dual = pods[0].addresses().iter().any(|a| a.addr().is_ipv6());
    for (i, pod) in pods.iter().enumerate() {
        let other = pods[(i + 1) % pods.len()];
        assert_pings(&pod.ns, ip(GATEWAY_V4), "pod to gateway");
        assert_pings(&pod.ns, other.v4(), "pod to pod");
        // The wan has no route to the pods: an answer proves the masquerade.
        assert_pings(&pod.ns, ip(WAN_V4), "pod to wan");
        let v4_port = |host: &str| SocketAddr::new(ip(host), pod.host_port);
        let expected = Some(pod.label.clone());
        assert_eq!(tcp_ask(&lab.wan, v4_port(NODE_UPLINK_V4)), expected, "host port {} from the wan", pod.host_port);
        assert_eq!(
            tcp_ask(&lab.node, v4_port("127.0.0.1")),
            expected,
            "host port {} from the node's localhost",
            pod.host_port
        );
        assert_eq!(
            tcp_ask(&other.ns, v4_port(NODE_UPLINK_V4)),
            expected,
            "host port {} from another pod",
            pod.host_port
        );
        assert_eq!(
            tcp_ask(&pod.ns, v4_port(NODE_UPLINK_V4)),
            expected,
            "host port {} from the pod itself (hairpin)",
            pod.host_port
        );
        if dual {
            assert_pings(&pod.ns, ip(GATEWAY_V6), "pod to v6 gateway");
            assert_pings(&pod.ns, other.v6(), "pod to pod over v6");
            assert_pings(&lab.node, pod.v6(), "node to pod over v6");
            assert_pings(&pod.ns, ip(WAN_V6), "pod to wan over v6");
            let v6_port = SocketAddr::new(ip(NODE_UPLINK_V6), pod.host_port);
            assert_eq!(tcp_ask(&lab.wan, v6_port), expected, "host port {} over v6 from the wan", pod.host_port);
            assert_eq!(tcp_ask(&other.ns, v6_port), expected, "host port {} over v6 from another pod", pod.host_port);
        }
    }
}

/// The pod's shaping on the node: a tbf for ingress at the root of its host veth, and its egress redirected
/// from the veth's ingress qdisc to its ifb, which has a tbf; none of it when the pod is not shaped.
fn assert_shaping(lab: &Lab, pod: &Pod) {
    let mut netlink = lab.node.netlink();
    let veth = netlink.require_link(&pod.host_veth()).expect("host veth");
    let qdiscs = netlink.qdiscs(Some(veth.index)).expect("qdiscs");
    let root_rate = qdiscs.iter().find(|q| q.is_root()).and_then(|q| match &q.kind {
        QdiscKind::Tbf(Some(tbf)) => Some(tbf.rate),
        _ => None,
    });
    let ingress = qdiscs.iter().find(|q| q.is_ingress_like());
    if !pod.shaped {
        assert_eq!(root_rate, None, "tbf on an unshaped pod's veth: {qdiscs:?}");
        return;
    }
    assert_eq!(root_rate, Some(INGRESS_RATE / 8), "ingress tbf of {}: {qdiscs:?}", veth.name);
    let ingress = ingress.unwrap_or_else(|| panic!("no ingress qdisc on {}: {qdiscs:?}", veth.name));
    let parent = ingress.ingress_filter_parent().expect("filter parent");
    let filters = netlink.filters(veth.index, parent).expect("filters");
    let ifb_index = filters.iter().flat_map(|f| f.redirects.iter()).map(|r| r.ifindex).next();
    let ifb_index = ifb_index.unwrap_or_else(|| panic!("no redirect on {}: {filters:?}", veth.name));
    let ifb = netlink.link_by_index(ifb_index).expect("ifb lookup").expect("ifb exists");
    assert_eq!(ifb.kind.as_deref(), Some("ifb"), "{ifb:?}");
    assert!(ifb.name.starts_with("bwp"), "ifb name {}", ifb.name);
    let ifb_rate =
        netlink.qdiscs(Some(ifb.index)).expect("ifb qdiscs").iter().find(|q| q.is_root()).and_then(|q| match &q.kind {
            QdiscKind::Tbf(Some(tbf)) => Some(tbf.rate),
            _ => None,
        });
    assert_eq!(ifb_rate, Some(EGRESS_RATE / 8), "egress tbf on {}", ifb.name);
}

/// Words of a firewall dump line that name a per-pod chain: `CNI-<anything>` but the shared `CNI-HOSTPORT-*`.
fn per_pod_chains(line: &str) -> Vec<&str> {
    line.split(|c: char| c.is_whitespace() || c == '"' || c == ':')
        .filter(|w| w.starts_with("CNI-") && !w.starts_with("CNI-HOSTPORT-"))
        .collect()
}

/// After the DEL of every pod, compares the node with its state before the first ADD (see the module doc).
fn assert_node_clean(lab: &Lab, pods: &[&Pod], networks: &[&str]) {
    let after = NodeSnapshot::settled(&lab.node, &[], Duration::from_secs(3));
    // What names a pod: its addresses and its container ID.
    let mut names: Vec<String> = pods.iter().map(|p| p.container_id()).collect();
    for pod in pods {
        names.extend(pod.addresses().iter().map(|a| a.addr().to_string()));
    }
    let mut problems = Vec::new();
    for section in ["links", "addresses", "routes", "tc", "sysctls", "iptables", "ip6tables", "nftables"] {
        let before: BTreeSet<&String> = lab.baseline.section(section).iter().collect();
        let now: BTreeSet<&String> = after.section(section).iter().collect();
        if section == "sysctls" {
            continue;
        }
        for gone in before.difference(&now) {
            problems.push(format!("{section}: - {gone}"));
        }
        for new in now.difference(&before) {
            let allowed = match section {
                "links" | "addresses" => new.starts_with("cbr0 "),
                "tc" => new.starts_with("qdisc cbr0 ") || new.starts_with("filter cbr0 "),
                // Subnet-router anycast routes appear on every link once IPv6 forwarding is on (a sysctl
                // the bridge sets, as the reference does).
                "routes" => new.contains(" dev cbr0") || new.starts_with("anycast "),
                _ => {
                    !names.iter().any(|n| new.contains(n.as_str()))
                        && per_pod_chains(new).is_empty()
                        && !new.contains("elements")
                }
            };
            if !allowed {
                problems.push(format!("{section}: + {new}"));
            }
        }
    }
    assert!(problems.is_empty(), "left on the node after DEL:\n  {}", problems.join("\n  "));
    assert!(lab.cached_results().is_empty(), "cached results left: {:?}", lab.cached_results());
    for network in networks {
        assert!(lab.leases(network).is_empty(), "leases of {network} left: {:?}", lab.leases(network));
    }
}

/// One user's session with a network: two pods (the first shaped) added with `tool`, checked, used, and
/// deleted, then the node is clean. `version` is the conflist's, and what the results must say.
fn kubenet_session(lab: &Lab, tool: &Tool, network: &str, version: &str) {
    // libcni refuses CHECK before 0.4.0.
    let check_error = (version == "0.3.1").then_some("does not support the CHECK command");
    kubenet_session_expecting(lab, tool, network, version, check_error);
}

/// [`kubenet_session`], where CHECK fails with `check_error` (when given) instead of succeeding.
fn kubenet_session_expecting(lab: &Lab, tool: &Tool, network: &str, version: &str, check_error: Option<&str>) {
    let mut pods = [Pod::new(lab, 8080, true), Pod::new(lab, 8081, false)];
    for pod in &mut pods {
        add(lab, tool, network, pod);
        assert_pod_configured(pod, version);
    }
    assert_ne!(pods[0].v4(), pods[1].v4(), "two pods, one address");
    for pod in &pods {
        let out = check(lab, tool, network, pod);
        match check_error {
            Some(error) => {
                failed(&out, &format!("check of {network}"));
                assert!(out.stderr.contains(error), "check: expected {error:?}, got {}", out.stderr);
            }
            None => _ = ok(&out, &format!("{} check {network}", tool.name())),
        }
        assert_shaping(lab, pod);
    }
    assert_pods_work(lab, &[&pods[0], &pods[1]]);
    for pod in &pods {
        del(lab, tool, network, pod);
        assert!(!pod.ns.links().iter().any(|l| l == "eth0"), "eth0 left in {}", pod.ns.name);
    }
    assert_node_clean(lab, &[&pods[0], &pods[1]], &[network]);
}

/// A lab with `plugins` and upstream cnitool, or None (the test is skipped) when it has not been built.
fn upstream_lab(plugins: Plugins) -> Option<(Lab, Tool)> {
    let tool = Tool::Upstream(upstream_cnitool()?);
    Some((Lab::new(plugins), tool))
}

// ---------------------------------------------------------------------------------------------------------
// 1 and 2: upstream cnitool drives our binaries, in every version libcni 1.1.2 speaks; 1.1.0 through ours
// ---------------------------------------------------------------------------------------------------------

fn upstream_drives_ours(version: &str) {
    let Some((lab, tool)) = upstream_lab(Plugins::OURS) else { return };
    let network = lab.install_conf("10-kubenet.conflist", Some(version));
    lab.install_conf("99-loopback.conf", Some(version));
    kubenet_session(&lab, &tool, &network, version);
}

#[test]
fn upstream_cnitool_drives_our_kubenet_chain_1_0_0() {
    upstream_drives_ours("1.0.0");
}

#[test]
fn upstream_cnitool_drives_our_kubenet_chain_0_4_0() {
    upstream_drives_ours("0.4.0");
}

#[test]
fn upstream_cnitool_drives_our_kubenet_chain_0_3_1() {
    upstream_drives_ours("0.3.1");
}

/// 1.1.0 (beyond libcni 1.1.2) through our runner, with GC and STATUS.
#[test]
fn our_cnitool_drives_our_kubenet_chain_1_1_0_with_gc_and_status() {
    let lab = Lab::new(Plugins::OURS);
    let network = lab.install_conf("10-kubenet.conflist", Some("1.1.0"));
    lab.install_conf("99-loopback.conf", Some("1.1.0"));
    assert_eq!(network, KUBENET);
    let tool = Tool::Ours;
    ok(&lab.cnitool(&tool, &["status", KUBENET], "eth0", None), "status before any pod");

    // A stale pod, which GC must remove completely while the listed ones keep working.
    let mut stale = Pod::new(&lab, 8082, true);
    add(&lab, &tool, KUBENET, &mut stale);
    assert_shaping(&lab, &stale);
    kubenet_session_with_gc(&lab, &tool, stale);
}

fn kubenet_session_with_gc(lab: &Lab, tool: &Tool, stale: Pod) {
    let mut pods = [Pod::new(lab, 8080, true), Pod::new(lab, 8081, false)];
    for pod in &mut pods {
        add(lab, tool, KUBENET, pod);
        assert_pod_configured(pod, "1.1.0");
    }
    let valid: Vec<String> = pods.iter().map(|p| format!("{}:eth0", p.container_id())).collect();
    let gc = ["gc", KUBENET, "--valid", &valid[0], "--valid", &valid[1]];
    ok(&lab.cnitool(tool, &gc, "eth0", None), "gc");
    // The stale pod's attachment is gone: its veth, ifb, lease, host port and cached result.
    assert!(!stale.ns.links().iter().any(|l| l == "eth0"), "gc left the stale pod's eth0");
    assert!(!lab.leases(KUBENET).contains(&stale.v4()), "gc left the stale pod's lease");
    assert!(lab.node.netlink().link_by_name(&stale.host_veth()).expect("lookup").is_none(), "gc left the veth");
    let stale_port = SocketAddr::new(ip(NODE_UPLINK_V4), stale.host_port);
    assert_eq!(tcp_ask(&lab.wan, stale_port), None, "the stale pod's host port still answers");
    ok(&lab.cnitool(tool, &["status", KUBENET], "eth0", None), "status");
    for pod in &pods {
        ok(&check(lab, tool, KUBENET, pod), "check after gc");
        assert_shaping(lab, pod);
    }
    assert_pods_work(lab, &[&pods[0], &pods[1]]);
    // The loopback attachment of the stale pod is another network's: GC of kubenet left it.
    ok(&lab.cnitool(tool, &["del", LOOPBACK, stale.netns()], "lo", None), "del of the stale pod's loopback");
    for pod in &pods {
        del(lab, tool, KUBENET, pod);
    }
    assert_node_clean(lab, &[&pods[0], &pods[1], &stale], &[KUBENET]);
}

// ---------------------------------------------------------------------------------------------------------
// 3: takeover through the result cache
// ---------------------------------------------------------------------------------------------------------

#[test]
fn upstream_cnitool_and_ours_take_over_each_others_attachments() {
    let Some((lab, upstream)) = upstream_lab(Plugins::OURS) else { return };
    lab.install_conf("10-kubenet.conflist", None);
    lab.install_conf("99-loopback.conf", None);
    let ours = Tool::Ours;
    let mut by_upstream = Pod::new(&lab, 8080, true);
    let mut by_ours = Pod::new(&lab, 8081, true);
    add(&lab, &upstream, KUBENET, &mut by_upstream);
    add(&lab, &ours, KUBENET, &mut by_ours);
    assert_eq!(lab.cached_results().len(), 4, "two attachments per pod: {:?}", lab.cached_results());
    // Each checks the other's (CHECK needs the cached result as prevResult).
    ok(&check(&lab, &ours, KUBENET, &by_upstream), "our check of upstream's attachment");
    ok(&check(&lab, &upstream, KUBENET, &by_ours), "upstream check of our attachment");
    for pod in [&by_upstream, &by_ours] {
        assert_shaping(&lab, pod);
    }
    assert_pods_work(&lab, &[&by_upstream, &by_ours]);
    // And deletes it.
    del(&lab, &ours, KUBENET, &by_upstream);
    del(&lab, &upstream, KUBENET, &by_ours);
    assert_node_clean(&lab, &[&by_upstream, &by_ours], &[KUBENET]);
}

// ---------------------------------------------------------------------------------------------------------
// 4: mixed chains with the reference plugins
// ---------------------------------------------------------------------------------------------------------

fn mixed_chain(plugins: Plugins) {
    let Some((lab, tool)) = upstream_lab(plugins) else { return };
    lab.install_conf("10-kubenet.conflist", None);
    lab.install_conf("99-loopback.conf", None);
    // The reference portmap (v1.1.1) checks its ip6tables chain even for a pod without an IPv6 address, so
    // its CHECK of an IPv4-only pod always fails (containernetworking/plugins#819, fixed after v1.1.1).
    let check_error = (plugins.portmap == Impl::Reference).then_some("could not check ipv6 dnat");
    kubenet_session_expecting(&lab, &tool, KUBENET, "1.0.0", check_error);
}

#[test]
fn mixed_reference_bridge_with_our_host_local() {
    mixed_chain(Plugins { bridge: Impl::Reference, ..Plugins::OURS });
}

#[test]
fn mixed_our_bridge_with_reference_host_local() {
    mixed_chain(Plugins { host_local: Impl::Reference, ..Plugins::OURS });
}

#[test]
fn mixed_reference_portmap_and_bandwidth_after_our_bridge() {
    mixed_chain(Plugins { portmap: Impl::Reference, bandwidth: Impl::Reference, ..Plugins::OURS });
}

/// A node whose pods were added by the reference plugins moves to ours: ours adds a pod next to them
/// (a distinct address, after the reference's last reserved one), and deletes them all cleanly.
#[test]
fn node_moves_from_reference_plugins_to_ours_with_pods_running() {
    let Some((mut lab, tool)) = upstream_lab(Plugins::REFERENCE) else { return };
    lab.install_conf("10-kubenet.conflist", None);
    lab.install_conf("99-loopback.conf", None);
    let mut old = [Pod::new(&lab, 8080, true), Pod::new(&lab, 8081, false)];
    for pod in &mut old {
        add(&lab, &tool, KUBENET, pod);
    }
    let last_reserved = fs::read_to_string(lab.data_dir.join(KUBENET).join("last_reserved_ip.0"))
        .expect("reference's last_reserved_ip");

    lab.use_plugins(Plugins::OURS);
    let mut new = Pod::new(&lab, 8082, true);
    add(&lab, &tool, KUBENET, &mut new);
    assert_pod_configured(&new, "1.0.0");
    assert!(old.iter().all(|p| p.v4() != new.v4()), "address collision: {}", new.v4());
    let expected_next = match ip(last_reserved.trim()) {
        IpAddr::V4(v4) => IpAddr::V4((u32::from(v4) + 1).into()),
        other => panic!("last_reserved_ip {other}"),
    };
    assert_eq!(new.v4(), expected_next, "ours does not continue after the reference's last reserved address");
    // The reference ignores `nonMasqueradeCIDRs`: its pods masquerade everything leaving their subnet, and
    // our CHECK says so. Without the field, our CHECK accepts everything the reference made.
    for pod in &old {
        let out = check(&lab, &tool, KUBENET, pod);
        failed(&out, "our check of a reference pod with nonMasqueradeCIDRs");
        let said = format!("{}{}", out.stdout_text, out.stderr);
        assert!(said.contains("ipMasq") && said.contains("10.244.0.0/16"), "{said}");
    }
    let installed = lab.conf_dir.join("10-kubenet.conflist");
    let shipped = fs::read(&installed).expect("read conf");
    let mut conf: Value = serde_json::from_slice(&shipped).expect("json");
    conf["plugins"][0].as_object_mut().expect("bridge").remove("nonMasqueradeCIDRs");
    fs::write(&installed, serde_json::to_vec_pretty(&conf).expect("json")).expect("write conf");
    for pod in &old {
        ok(&check(&lab, &tool, KUBENET, pod), "our check of a reference pod");
    }
    fs::write(&installed, shipped).expect("write conf");
    assert_shaping(&lab, &old[0]);
    assert_shaping(&lab, &new);
    assert_pods_work(&lab, &[&old[0], &old[1], &new]);

    for pod in &old {
        del(&lab, &tool, KUBENET, pod);
    }
    // The reference pods are gone without a trace while ours still works.
    let leases = lab.leases(KUBENET);
    assert_eq!(leases, vec![new.v4()], "leases after deleting the reference's pods");
    assert_eq!(tcp_ask(&lab.wan, SocketAddr::new(ip(NODE_UPLINK_V4), new.host_port)), Some(new.label.clone()));
    del(&lab, &tool, KUBENET, &new);
    assert_node_clean(&lab, &[&old[0], &old[1], &new], &[KUBENET]);
}

// ---------------------------------------------------------------------------------------------------------
// 5: the dual-stack and nftables examples
// ---------------------------------------------------------------------------------------------------------

#[test]
fn dualstack_example_end_to_end() {
    let Some((lab, tool)) = upstream_lab(Plugins::OURS) else { return };
    let network = lab.install_conf("20-kubenet-dualstack.conflist", None);
    lab.install_conf("99-loopback.conf", None);
    assert_eq!(network, DUALSTACK);
    kubenet_session(&lab, &tool, DUALSTACK, "1.0.0");
}

/// The nftables example is 1.1.0: our runner. Host ports and masquerade go through nft, not iptables.
#[test]
fn nftables_example_end_to_end() {
    let lab = Lab::new(Plugins::OURS);
    let network = lab.install_conf("30-kubenet-nftables.conflist", None);
    lab.install_conf("99-loopback.conf", None);
    assert_eq!(network, NFT);
    let tool = Tool::Ours;
    let mut pods = [Pod::new(&lab, 8080, true), Pod::new(&lab, 8081, false)];
    for pod in &mut pods {
        add(&lab, &tool, NFT, pod);
        assert_pod_configured(pod, "1.1.0");
        ok(&check(&lab, &tool, NFT, pod), "check");
        assert_shaping(&lab, pod);
    }
    // The pods are in our nft tables, and iptables holds nothing of CNI.
    let ruleset = lab.node.exec("nft", &["list", "ruleset"], &[], b"");
    let ruleset = String::from_utf8_lossy(&ruleset.stdout);
    assert!(ruleset.contains("table inet cni_portmap") && ruleset.contains("table inet cni_ipmasq"), "{ruleset}");
    for pod in &pods {
        assert!(ruleset.contains(&pod.v4().to_string()), "{} not in the nft ruleset:\n{ruleset}", pod.v4());
    }
    let iptables = lab.node.exec("iptables-save", &[], &[], b"");
    let iptables = String::from_utf8_lossy(&iptables.stdout);
    assert!(!iptables.contains("CNI"), "iptables rules with the nftables backend:\n{iptables}");

    assert_pods_work(&lab, &[&pods[0], &pods[1]]);
    for pod in &pods {
        del(&lab, &tool, NFT, pod);
    }
    assert_node_clean(&lab, &[&pods[0], &pods[1]], &[NFT]);
}
