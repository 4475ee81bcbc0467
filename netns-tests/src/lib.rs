//! Test rig for every test that needs network namespaces.
//!
//! Each test makes its own uniquely named namespaces ([`TestNetns`], [`Node`]) and they are deleted when
//! dropped, also when the test panics; the root namespace is never touched. Namespaces left behind by a
//! test process that was killed are swept by the next test process (see [`TestNetns::new`]).
//!
//! Plugins are the workspace's built binaries ([`bin`]); build them first with
//! `cargo build --workspace --bins`.
//!
//! - [`linkrig`]: the link plugins' lab (a node with an uplink to a "lan" namespace); [`kubenet`]: the
//!   kubenet chain of `conf/` on a node; [`netpol`]: that node with the netpol suite's pods and the
//!   NetworkPolicy agent; [`fabric`]: a cluster of nodes on an underlay for fabricd;
//!   [`fabric_faults`]: what every backend's fabric must ride out (the store lost, a join and a leave);
//!   [`kubeapi`]: a bare control plane (etcd + kube-apiserver, flannel's RBAC) for fabricd's Kubernetes mode
//!   and the NetworkPolicy agent's watch, objects made through the API.
//! - [`snapshot`]: everything a plugin can change on a node, to prove a call changed nothing;
//!   [`traffic`]: TCP servers and clients between namespaces; [`capture`]: frames seen on an interface (a raw
//!   socket, no tcpdump), to show what crosses an underlay.
//! - [`upstream`]: the reference plugins and upstream cnitool; [`recorder`]: what a runtime sends its plugins.
//! - [`daemon`]: a daemon a test starts, in its own mount namespace, ended by PID; [`containerd`],
//!   [`podman`], [`podman_macvlan`]: those runtimes on a test node; [`runtimes`]: what their tests share;
//!   [`images`]: container images built offline.
//! - [`cluster`]: a local Kubernetes cluster of namespace nodes (`scripts/cluster.sh`), taken down on drop;
//!   [`workloads`]: the manifests its tests apply and the checks they make (reachability, nothing left).

use std::ffi::OsStr;
use std::fs;
use std::io::Write;
use std::net::IpAddr;
use std::ops::Deref;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Once;
use std::time::{Duration, Instant};

use cnicore::netlink::{AddressOptions, Netlink};
use cnicore::netns::NetNs;
use ipnet::IpNet;
use nix::sched::{setns, CloneFlags};

pub use cnicore;
pub mod capture;
pub mod cluster;
pub mod containerd;
pub mod daemon;
pub mod fabric;
pub mod fabric_faults;
pub mod images;
pub mod kubeapi;
pub mod kubenet;
pub mod linkrig;
pub mod netpol;
pub mod podman;
pub mod podman_macvlan;
pub mod recorder;
pub mod runtimes;
pub mod snapshot;
pub mod traffic;
pub mod upstream;
pub mod workloads;
pub use daemon::Daemon;
pub use serde_json::{json, Value};

/// Where `ip netns add` puts its namespaces.
const NETNS_DIR: &str = "/run/netns";
/// Every namespace of the rig is named `cnt-<prefix>-<pid>-<n>`, so stale ones can be recognised.
const NETNS_MARK: &str = "cnt-";

static COUNTER: AtomicUsize = AtomicUsize::new(0);

fn next_number() -> usize {
    COUNTER.fetch_add(1, Ordering::Relaxed)
}

/// A name unique across threads of this process and across processes: `<prefix><pid>-<n>`.
/// With a prefix of up to 4 characters it fits an interface name (15 characters).
pub fn unique_name(prefix: &str) -> String {
    format!("{prefix}{}-{}", std::process::id(), next_number())
}

/// Runs a command to completion and panics (naming it) if it fails to start.
fn output_of(command: &mut Command) -> Output {
    command.output().unwrap_or_else(|e| panic!("cannot run {command:?}: {e}"))
}

/// A network namespace made for one test (`ip netns add`), deleted on drop. `lo` is up in it.
pub struct TestNetns {
    /// The name under /run/netns.
    pub name: String,
    /// /run/netns/<name>, e.g. for CNI_NETNS.
    pub path: PathBuf,
}

impl TestNetns {
    /// Makes a namespace named `cnt-<prefix>-<pid>-<n>`.
    pub fn new(prefix: &str) -> TestNetns {
        static SWEEP: Once = Once::new();
        SWEEP.call_once(sweep_stale_namespaces);

        let name = format!("{NETNS_MARK}{prefix}-{}-{}", std::process::id(), next_number());
        let output = output_of(Command::new("ip").args(["netns", "add", &name]));
        assert!(output.status.success(), "ip netns add {name}: {}", String::from_utf8_lossy(&output.stderr));
        let netns = TestNetns { path: Path::new(NETNS_DIR).join(&name), name };
        let mut netlink = netns.netlink();
        let lo = netlink.require_link("lo").expect("lo in a new namespace");
        netlink.set_up(lo.index).expect("set lo up");
        netns
    }

    /// Opens the namespace.
    pub fn netns(&self) -> NetNs {
        NetNs::open(&self.path).unwrap_or_else(|e| panic!("open {}: {e}", self.path.display()))
    }

    /// A netlink socket inside the namespace.
    pub fn netlink(&self) -> Netlink {
        Netlink::in_netns(&self.netns()).unwrap_or_else(|e| panic!("netlink in {}: {e}", self.name))
    }

    /// Runs `f` with the calling thread inside the namespace.
    pub fn run<T>(&self, f: impl FnOnce() -> T) -> T {
        self.netns().run(f).unwrap_or_else(|e| panic!("enter {}: {e}", self.name))
    }

    /// A command that runs inside the namespace (the child enters it before exec).
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        let netns = self.netns();
        let mut command = Command::new(program);
        // SAFETY: setns is a plain system call, safe between fork and exec.
        unsafe {
            command.pre_exec(move || setns(netns.fd(), CloneFlags::CLONE_NEWNET).map_err(std::io::Error::from));
        }
        command
    }

    /// Runs `program args` inside the namespace with extra `env` and `stdin`, waiting for it to finish.
    pub fn exec(&self, program: impl AsRef<OsStr>, args: &[&str], env: &[(&str, &str)], stdin: &[u8]) -> Output {
        let mut command = self.command(program);
        command.args(args).envs(env.iter().copied());
        run_with_stdin(&mut command, stdin)
    }

    /// `ip <args>` inside the namespace; panics if it fails. Returns its stdout.
    pub fn ip(&self, args: &[&str]) -> String {
        let output = self.exec("ip", args, &[], b"");
        assert!(
            output.status.success(),
            "ip {} in {}: {}",
            args.join(" "),
            self.name,
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// `ip -j <args>` inside the namespace, parsed.
    pub fn ip_json(&self, args: &[&str]) -> Value {
        let mut all = vec!["-j"];
        all.extend_from_slice(args);
        let text = self.ip(&all);
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("ip {} output {text:?}: {e}", all.join(" ")))
    }

    /// The names of the links in the namespace.
    pub fn links(&self) -> Vec<String> {
        let links = self.netlink().links().unwrap_or_else(|e| panic!("links of {}: {e}", self.name));
        links.into_iter().map(|link| link.name).collect()
    }

    /// True if one ping from this namespace to `addr` is answered within a second.
    pub fn ping(&self, addr: IpAddr) -> bool {
        self.exec("ping", &["-c1", "-W1", &addr.to_string()], &[], b"").status.success()
    }

    /// Reads sysctl `name` (e.g. "net/ipv4/ip_forward") of the namespace.
    pub fn sysctl(&self, name: &str) -> String {
        self.run(|| cnicore::sysctl::read(name)).unwrap_or_else(|e| panic!("sysctl {name} in {}: {e}", self.name))
    }
}

impl Drop for TestNetns {
    fn drop(&mut self) {
        delete_namespace(&self.name);
    }
}

fn delete_namespace(name: &str) {
    match Command::new("ip").args(["netns", "delete", name]).output() {
        Ok(output) if output.status.success() => {}
        Ok(output) => eprintln!("ip netns delete {name}: {}", String::from_utf8_lossy(&output.stderr)),
        Err(e) => eprintln!("ip netns delete {name}: {e}"),
    }
}

/// Deletes rig namespaces whose test process no longer exists (killed before its drops ran).
fn sweep_stale_namespaces() {
    let Ok(entries) = fs::read_dir(NETNS_DIR) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix(NETNS_MARK) else {
            continue;
        };
        // cnt-<prefix>-<pid>-<n>
        let mut fields = rest.rsplitn(3, '-');
        let (_number, pid) = (fields.next(), fields.next());
        let Some(pid) = pid.and_then(|pid| pid.parse::<u32>().ok()) else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            delete_namespace(&name);
        }
    }
}

fn run_with_stdin(command: &mut Command, stdin: &[u8]) -> Output {
    command.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = command.spawn().unwrap_or_else(|e| panic!("cannot run {command:?}: {e}"));
    if let Some(mut pipe) = child.stdin.take() {
        // A child that exits without reading its input closes the pipe: not an error here.
        let _ = pipe.write_all(stdin);
    }
    child.wait_with_output().unwrap_or_else(|e| panic!("wait for {command:?}: {e}"))
}

/// A "node": the host side of a test, i.e. a namespace where plugins run, plus a temporary directory for
/// their state (data dirs, caches, locks), removed on drop.
pub struct Node {
    netns: TestNetns,
    dir: PathBuf,
}

impl Node {
    pub fn new() -> Node {
        let netns = TestNetns::new("node");
        let dir = std::env::temp_dir().join(format!("cni-{}", unique_name("test")));
        fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
        Node { netns, dir }
    }

    /// The node's temporary directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A new pod namespace (independent of the node's, deleted on drop like any [`TestNetns`]).
    pub fn pod_netns(&self) -> TestNetns {
        TestNetns::new("pod")
    }

    /// A new pod whose `eth0` is a veth to the node (`host_veth` there), with `node_addr` and `pod_addr` on its
    /// ends: the pod as an interface plugin leaves it for the plugins chained after it.
    pub fn pod_with_eth0(&self, host_veth: &str, node_addr: &str, pod_addr: &str) -> TestNetns {
        let pod = self.pod_netns();
        veth_between(self, &pod, host_veth, "eth0", &[net(node_addr)], &[net(pod_addr)]);
        pod
    }

    /// Runs `plugin` inside the node namespace, see [`run_plugin`].
    pub fn run_plugin(&self, plugin: &str, cni_command: &str, env: &[(&str, &str)], stdin: &Value) -> PluginOutput {
        run_plugin(self, plugin, cni_command, env, stdin)
    }
}

impl Default for Node {
    fn default() -> Node {
        Node::new()
    }
}

impl Deref for Node {
    type Target = TestNetns;
    fn deref(&self) -> &TestNetns {
        &self.netns
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Err(e) = fs::remove_dir_all(&self.dir) {
            eprintln!("remove {}: {e}", self.dir.display());
        }
    }
}

/// A node and a pod beside it: where a single plugin's test starts. A test adds what its plugin needs in a rig
/// of its own, declared with [`pod_rig!`].
pub struct NodeWithPod {
    pub node: Node,
    pub pod: TestNetns,
}

impl NodeWithPod {
    /// A node and an empty pod.
    pub fn new() -> NodeWithPod {
        let node = Node::new();
        let pod = node.pod_netns();
        NodeWithPod { node, pod }
    }

    /// A node and a pod whose `eth0` is a veth to it, see [`Node::pod_with_eth0`].
    pub fn with_eth0(host_veth: &str, node_addr: &str, pod_addr: &str) -> NodeWithPod {
        let node = Node::new();
        let pod = node.pod_with_eth0(host_veth, node_addr, pod_addr);
        NodeWithPod { node, pod }
    }

    /// Runs `binary` for the attachment (`container`, `ifname`) of the pod, see [`run_for_pod`].
    pub fn run(
        &self,
        binary: &Path,
        verb: &str,
        attachment: (&str, &str),
        netns: Option<&str>,
        conf: &Value,
    ) -> PluginOutput {
        run_for_pod(&self.node, &self.pod, binary, verb, attachment, netns, conf)
    }
}

impl Default for NodeWithPod {
    fn default() -> NodeWithPod {
        NodeWithPod::new()
    }
}

/// Declares a test's rig: a struct whose `lab` is a [`NodeWithPod`], with the test's own fields after it, that
/// reads as the lab (`rig.node`, `rig.pod`, `rig.run(..)`); the test gives it the methods its plugin needs in an
/// `impl` of its own. `pod_rig!(Rig)`, or `pod_rig!(Rig { wan: TestNetns })`.
#[macro_export]
macro_rules! pod_rig {
    ($(#[$meta:meta])* $name:ident $({ $($(#[$field_meta:meta])* $field:ident: $ty:ty),* $(,)? })?) => {
        $(#[$meta])*
        struct $name {
            lab: $crate::NodeWithPod,
            $($($(#[$field_meta])* $field: $ty,)*)?
        }

        impl ::std::ops::Deref for $name {
            type Target = $crate::NodeWithPod;
            fn deref(&self) -> &$crate::NodeWithPod {
                &self.lab
            }
        }
    };
}

/// Connects two test namespaces with a veth pair (`name_a` in `a`, `name_b` in `b`), both ends up, with
/// the given addresses (IPv6 ones without duplicate address detection, so usable at once).
/// Returns the link indexes in `a` and `b`.
pub fn veth_between(
    a: &TestNetns,
    b: &TestNetns,
    name_a: &str,
    name_b: &str,
    addrs_a: &[IpNet],
    addrs_b: &[IpNet],
) -> (u32, u32) {
    let mut netlink_a = a.netlink();
    let mut netlink_b = b.netlink();
    let end_a = netlink_a
        .create_veth(name_a, name_b, &b.netns(), None, None)
        .unwrap_or_else(|e| panic!("veth {name_a} in {} to {name_b} in {}: {e}", a.name, b.name));
    let end_b = netlink_b.require_link(name_b).unwrap_or_else(|e| panic!("{name_b} in {}: {e}", b.name));
    for (netlink, index, addrs) in [(&mut netlink_a, end_a.index, addrs_a), (&mut netlink_b, end_b.index, addrs_b)] {
        for addr in addrs {
            let options = AddressOptions { nodad: true, ..AddressOptions::default() };
            netlink.add_address_with(index, *addr, options).unwrap_or_else(|e| panic!("add {addr}: {e}"));
        }
        netlink.set_up(index).unwrap_or_else(|e| panic!("set up link {index}: {e}"));
    }
    // Carrier to operational state goes through the kernel's linkwatch, which a loaded machine delays: until
    // then the pair drops what it is given, and a test's first packet is lost.
    for (netlink, index) in [(&mut netlink_a, end_a.index), (&mut netlink_b, end_b.index)] {
        netlink.wait_oper_up(index, Duration::from_secs(5)).unwrap_or_else(|e| panic!("link {index} up: {e}"));
    }
    (end_a.index, end_b.index)
}

/// The names of the links in `ns`.
pub fn links_in(ns: &TestNetns) -> Vec<String> {
    ns.links()
}

/// Panics unless `from` gets an answer from `addr`.
pub fn assert_ping(from: &TestNetns, addr: IpAddr) {
    assert!(from.ping(addr), "no ping answer from {addr} in {}", from.name);
}

/// Panics if `from` gets an answer from `addr`.
pub fn assert_no_ping(from: &TestNetns, addr: IpAddr) {
    assert!(!from.ping(addr), "unexpected ping answer from {addr} in {}", from.name);
}

/// The directory of the workspace's built binaries: $CNI_BIN_DIR if set, else the profile directory this
/// test was built into (target/debug, honouring CARGO_TARGET_DIR), else <workspace>/target/debug.
pub fn bin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("CNI_BIN_DIR") {
        return PathBuf::from(dir);
    }
    // Test executables live in <target>/<profile>/deps.
    if let Ok(exe) = std::env::current_exe() {
        if let Some(deps) = exe.parent() {
            if deps.file_name() == Some(OsStr::new("deps")) {
                if let Some(profile_dir) = deps.parent() {
                    return profile_dir.to_path_buf();
                }
            }
        }
    }
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let target = match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => workspace.join(dir),
        None => workspace.join("target"),
    };
    target.join("debug")
}

/// The path of the workspace binary `name`; panics if it has not been built.
pub fn bin(name: &str) -> PathBuf {
    let path = bin_dir().join(name);
    assert!(
        path.is_file(),
        "binary {name} not built ({} missing): run cargo build --workspace --bins first",
        path.display()
    );
    path
}

/// What a plugin run produced.
#[derive(Debug)]
pub struct PluginOutput {
    pub status: ExitStatus,
    /// stdout parsed as JSON, `Value::Null` if empty or not JSON.
    pub stdout: Value,
    /// stdout as text, for messages.
    pub stdout_text: String,
    pub stderr: String,
}

impl PluginOutput {
    pub fn success(&self) -> bool {
        self.status.success()
    }

    /// The result of a successful run; panics with the plugin's output otherwise.
    pub fn expect_ok(&self) -> &Value {
        assert!(self.success(), "plugin failed ({}): stdout {} stderr {}", self.status, self.stdout_text, self.stderr);
        &self.stdout
    }

    /// The result of a successful run, which must be in `version` (as the request's `cniVersion` asks).
    pub fn expect_result_in(&self, version: &str) -> Value {
        let result = self.expect_ok();
        assert_eq!(result["cniVersion"], version, "result not in the version asked for: {result}");
        result.clone()
    }

    /// The CNI error of a failed run; panics if the run succeeded.
    pub fn expect_err(&self) -> &Value {
        assert!(!self.success(), "plugin unexpectedly succeeded: stdout {}", self.stdout_text);
        &self.stdout
    }
}

/// Runs the workspace binary `plugin` inside the node namespace as a CNI plugin: a clean environment with
/// PATH, CNI_COMMAND=`cni_command`, CNI_PATH=[`bin_dir`] and `env` (CNI_CONTAINERID, CNI_NETNS, ...),
/// and `stdin` as the network configuration.
pub fn run_plugin(node: &Node, plugin: &str, cni_command: &str, env: &[(&str, &str)], stdin: &Value) -> PluginOutput {
    run_binary(node, &bin(plugin), cni_command, env, stdin)
}

/// Like [`run_plugin`] for any plugin binary (a reference plugin, say), in any namespace of the test.
pub fn run_binary(
    ns: &TestNetns,
    binary: &Path,
    cni_command: &str,
    env: &[(&str, &str)],
    stdin: &Value,
) -> PluginOutput {
    let mut command = clean_command(ns, binary);
    command.env("CNI_COMMAND", cni_command).env("CNI_PATH", bin_dir()).envs(env.iter().copied());
    output(&mut command, stdin.to_string().as_bytes())
}

/// A command that runs in `ns` with an empty environment but `PATH`.
pub fn clean_command(ns: &TestNetns, program: impl AsRef<OsStr>) -> Command {
    let mut command = ns.command(program);
    command.env_clear().env("PATH", std::env::var_os("PATH").unwrap_or_else(|| "/usr/sbin:/usr/bin:/sbin:/bin".into()));
    command
}

/// Runs `command` to completion with `stdin` and collects what it printed.
pub fn output(command: &mut Command, stdin: &[u8]) -> PluginOutput {
    let output = run_with_stdin(command, stdin);
    let stdout_text = String::from_utf8_lossy(&output.stdout).into_owned();
    PluginOutput {
        status: output.status,
        stdout: serde_json::from_str(&stdout_text).unwrap_or(serde_json::Value::Null),
        stdout_text,
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// Runs `binary` in the node namespace as a runtime does for the attachment (`container`, `ifname`) of `pod`;
/// `netns` replaces the pod's path in `CNI_NETNS` (a DEL with "" or with a netns that is gone).
pub fn run_for_pod(
    node: &TestNetns,
    pod: &TestNetns,
    binary: &Path,
    verb: &str,
    (container, ifname): (&str, &str),
    netns: Option<&str>,
    conf: &Value,
) -> PluginOutput {
    let netns = netns.map(str::to_string).unwrap_or_else(|| pod.path.display().to_string());
    let env = [("CNI_CONTAINERID", container), ("CNI_NETNS", netns.as_str()), ("CNI_IFNAME", ifname)];
    run_binary(node, binary, verb, &env, conf)
}

/// `conf` with `result` as its prevResult (as a runtime sends CHECK and DEL, or the next plugin of a chain).
pub fn with_prev(conf: &Value, result: &Value) -> Value {
    let mut conf = conf.clone();
    conf["prevResult"] = result.clone();
    conf
}

/// An address written in a test, e.g. `ip("10.88.0.2")`.
pub fn ip(text: &str) -> IpAddr {
    text.parse().unwrap_or_else(|e| panic!("test address {text:?}: {e}"))
}

/// A prefix written in a test, e.g. `net("10.88.0.2/24")`.
pub fn net(text: &str) -> IpNet {
    text.parse().unwrap_or_else(|e| panic!("test prefix {text:?}: {e}"))
}

/// The addresses (with their prefix length) in a plugin or chain result of any version (`ips`, or 0.1/0.2's
/// `ip4`/`ip6`), in the result's order; panics when it has none.
pub fn result_addresses(result: &Value) -> Vec<IpNet> {
    let addresses: Vec<&str> = match result["ips"].as_array() {
        Some(ips) => ips.iter().filter_map(|i| i["address"].as_str()).collect(),
        None => ["ip4", "ip6"].iter().filter_map(|k| result[*k]["ip"].as_str()).collect(),
    };
    assert!(!addresses.is_empty(), "no addresses in {result}");
    addresses.into_iter().map(net).collect()
}

/// [`result_addresses`] without prefix length.
pub fn result_ips(result: &Value) -> Vec<IpAddr> {
    result_addresses(result).iter().map(IpNet::addr).collect()
}

/// How often [`eventually`] tries again: often enough that a time measured around a wait is this precise.
const POLL_INTERVAL: Duration = Duration::from_millis(10);

/// `timeout` stretched by `CNI_TEST_TIME_SCALE` (a whole number, default 1): the VM lane sets it, since under
/// emulation daemons (etcd, fabricd) take several times as long as here to answer.
pub fn scaled(timeout: Duration) -> Duration {
    let factor = std::env::var("CNI_TEST_TIME_SCALE").ok().and_then(|v| v.parse::<u32>().ok()).unwrap_or(1);
    timeout * factor.max(1)
}

/// The rig's one wait: polls `attempt` until it returns Ok or `timeout` ([`scaled`]) passes, then its last
/// error. For anything a test waits for (a daemon's socket, convergence, the kernel's asynchronous cleanup).
pub fn eventually<T, E>(timeout: Duration, mut attempt: impl FnMut() -> Result<T, E>) -> Result<T, E> {
    let deadline = Instant::now() + scaled(timeout);
    loop {
        match attempt() {
            Ok(value) => return Ok(value),
            Err(e) if Instant::now() >= deadline => return Err(e),
            Err(_) => std::thread::sleep(POLL_INTERVAL),
        }
    }
}

/// [`eventually`] for a condition: the time it took to become true, `None` if it did not within `timeout`.
pub fn wait_for(timeout: Duration, mut ready: impl FnMut() -> bool) -> Option<Duration> {
    let start = Instant::now();
    eventually(timeout, || if ready() { Ok(start.elapsed()) } else { Err(()) }).ok()
}

/// The rig's one policy for a tool a test needs: true if it is usable (`available`). When it is not, under
/// `CI=true` the test fails (panics, naming what to install); elsewhere it says why it is skipped and returns
/// false, and the test returns.
pub fn require(tool: &str, available: bool, install: &str) -> bool {
    if available {
        return true;
    }
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("{tool} is missing (CI=true: not skipping): {install}");
    }
    eprintln!("skipped: {tool} is missing ({install})");
    false
}

/// [`require`] for programs: every one of `programs` is found ([`on_path`]).
pub fn require_programs(programs: &[&str], install: &str) -> bool {
    require(&programs.join("/"), programs.iter().all(|p| on_path(p)), install)
}

/// True if `program` is an executable on PATH or in the sbin directories where firewall tools live
/// ([`cnicore::firewall::find_binary`]).
pub fn on_path(program: &str) -> bool {
    cnicore::firewall::find_binary(program).is_some()
}
