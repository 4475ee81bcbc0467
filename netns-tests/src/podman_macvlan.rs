//! podman's macvlan networks (`podman network create -d macvlan`, CNI backend) on our plugins or the
//! reference's, in steps a test composes: [`MacvlanPodman::new`] (a node whose macvlan master is a veth to a
//! "lan" netns, podman behind a call recorder), [`MacvlanPodman::create_network`] (with the `network create`
//! arguments of the variant: `--subnet` for host-local; none for dhcp, with a dhcp server on the lan and the
//! dhcp daemon started by the test), [`MacvlanPodman::run_container`] (busybox httpd, its IP on the container's
//! eth0, reached from the lan) and [`MacvlanPodman::remove_container`] (nothing of it left on the node, no
//! failed plugin call).

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use cnicore::netlink::Netlink;
use cnicore::netns::NetNs;

use crate::daemon::http_get;
use crate::images::INDEX_HTML;
use crate::podman::Podman;
use crate::recorder::Recorder;
use crate::runtimes::{eventually, summaries};
use crate::snapshot::NodeSnapshot;
use crate::{veth_between, Node, TestNetns, Value};

/// The macvlan master: the node's end of a veth to the lan.
pub const MASTER: &str = "mv0";
/// The lan's end of it holds this address (and is where a dhcp server would listen).
pub const LAN_IP: &str = "10.91.0.254";
pub const LAN_SUBNET: &str = "10.91.0.0/24";
/// Every plugin the recorder stands in for (what podman's macvlan networks can name).
pub const RECORDED: &[&str] = &["macvlan", "host-local", "dhcp", "tuning", "loopback", "firewall", "portmap"];
/// The container's name.
const CONTAINER: &str = "web";

pub struct MacvlanPodman {
    pub node: Node,
    pub lan: TestNetns,
    pub recorder: Recorder,
    pub podman: Podman,
    /// The network's name (set by [`MacvlanPodman::create_network`]).
    pub network: String,
    before: Option<NodeSnapshot>,
}

impl MacvlanPodman {
    /// A node with the master veth to a lan netns, podman using the plugins of `plugin_dir` through a recorder.
    pub fn new(plugin_dir: &Path) -> MacvlanPodman {
        let node = Node::new();
        let lan = TestNetns::new("lan");
        let lan_net = format!("{LAN_IP}/24").parse().expect("constant");
        veth_between(&node, &lan, MASTER, "eth0", &[], &[lan_net]);
        let recorder = Recorder::new(node.dir(), plugin_dir, RECORDED);
        let podman = Podman::new(&node, &recorder.dir);
        MacvlanPodman { node, lan, recorder, podman, network: String::new(), before: None }
    }

    /// The directories podman's plugins keep state in (host-local's default dataDir, the result cache).
    pub fn state_dirs(&self) -> Vec<PathBuf> {
        vec![self.podman.var_lib_cni.join("networks"), self.podman.var_lib_cni.clone()]
    }

    /// `podman network create -d macvlan -o parent=<master> <extra> <name>`; checks that podman lists it (its
    /// plugins passed podman's VERSION calls) and returns the conflist podman wrote. Snapshots the node.
    pub fn create_network(&mut self, name: &str, extra: &[&str]) -> Value {
        let parent = format!("parent={MASTER}");
        let mut args = vec!["network", "create", "-d", "macvlan", "-o", &parent];
        args.extend_from_slice(extra);
        args.push(name);
        self.podman.ok(&args);
        self.network = name.to_string();
        let path = self.podman.net_dir.join(format!("{name}.conflist"));
        let conf: Value = serde_json::from_slice(&std::fs::read(&path).expect("podman's conflist")).expect("json");
        let listed = self.podman.ok(&["network", "ls", "--format", "{{.Name}}"]);
        assert!(
            listed.lines().any(|l| l == name),
            "podman network ls lists {name}: {listed}\nconflist {conf}\ncalls:\n  {}",
            summaries(&self.recorder.calls())
        );
        let dirs = self.state_dirs();
        let dirs: Vec<&Path> = dirs.iter().map(PathBuf::as_path).collect();
        self.before = Some(NodeSnapshot::settled(&self.node, &dirs, Duration::from_secs(3)));
        self.recorder.clear();
        conf
    }

    /// `podman run -d` of busybox httpd on the network: no plugin call failed, the container's IP (as podman
    /// reports it) is on its eth0, a macvlan link, and httpd answers on it from the lan. Returns the IP.
    pub fn run_container(&self) -> IpAddr {
        self.podman.run_httpd(CONTAINER, &["--network", &self.network], || {
            format!("plugin calls:\n  {}", summaries(&self.recorder.calls()))
        });
        let adds = self.recorder.calls();
        assert!(adds.iter().all(|c| c.exit == 0), "a plugin call failed:\n  {}", summaries(&adds));
        assert!(adds.iter().any(|c| c.plugin == "macvlan" && c.command() == "ADD"), "{}", summaries(&adds));

        let settings = self.podman.inspect(CONTAINER)["NetworkSettings"].clone();
        let ip =
            settings["Networks"][&self.network]["IPAddress"].as_str().unwrap_or_else(|| panic!("no IP: {settings}"));
        let ip: IpAddr = ip.parse().expect("IP");
        let sandbox = settings["SandboxKey"].as_str().expect("SandboxKey");
        let netns = NetNs::open(self.podman.path_in_daemon(sandbox)).expect("the container's netns");
        let mut nl = Netlink::in_netns(&netns).expect("netlink in the container");
        let eth0 = nl.require_link("eth0").expect("eth0 in the container");
        assert_eq!(eth0.kind.as_deref(), Some("macvlan"), "{eth0:?}");
        let addrs = nl.addresses(Some(eth0.index)).expect("addresses");
        assert!(addrs.iter().any(|a| a.addr.addr() == ip), "{ip} on the container's eth0: {addrs:?}");
        let body = eventually(Duration::from_secs(10), || http_get(&self.lan, SocketAddr::new(ip, 80), "/"))
            .expect("httpd from the lan");
        assert_eq!(body, INDEX_HTML);
        ip
    }

    /// `podman rm -f`: DEL ran and succeeded, podman's netns is gone, and the node is as before the container
    /// (links, addresses, routes, rules, leases and cache entries).
    pub fn remove_container(&self) {
        self.recorder.clear();
        // -t 0: httpd as PID 1 ignores SIGTERM.
        self.podman.ok(&["rm", "-f", "-t", "0", CONTAINER]);
        let dels = self.recorder.calls();
        assert!(dels.iter().any(|c| c.plugin == "macvlan" && c.command() == "DEL"), "{}", summaries(&dels));
        assert!(dels.iter().all(|c| c.exit == 0), "a plugin call failed:\n  {}", summaries(&dels));
        assert_eq!(self.podman.netns_names(), Vec::<String>::new(), "container netns removed");
        let dirs = self.state_dirs();
        let dirs: Vec<&Path> = dirs.iter().map(PathBuf::as_path).collect();
        let after = NodeSnapshot::settled(&self.node, &dirs, Duration::from_secs(3));
        let before = self.before.as_ref().expect("create_network first");
        let problems = crate::kubenet::residue(before, &after, &dirs);
        assert!(problems.is_empty(), "left on the node:\n  {}", problems.join("\n  "));
    }
}
