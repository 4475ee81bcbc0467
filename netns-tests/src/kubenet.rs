//! The kubenet chain of `conf/` (bridge + host-local, portmap, bandwidth) run by our cnitool on a test node,
//! and what "nothing of the pods is left on the node" means. Shared by `crash.rs`, `churn.rs` and `kubenet.rs`.
//!
//! # What may stay on the node after every pod was deleted
//!
//! The node is compared with a snapshot taken before its first ADD ([`NodeSnapshot`]: links, addresses,
//! routes, tc, sysctls, iptables, ip6tables, nft ruleset, files of host-local's dataDir and of the result
//! cache). Exactly these differences are allowed ([`residue`] reports every other one), because a complete
//! ADD + DEL also leaves them, by design and as the reference plugins do:
//!
//! - **The bridge `cbr0`**: its link, its gateway address, its routes (`dev cbr0`: the subnet route and the
//!   IPv6 link-local and multicast routes) and its qdisc. It is shared by every pod and DEL never removes it.
//! - **Node-wide sysctls** (`ip_forward`, `conf/{all,default}/*`, `bridge-nf-call-*`, and `forwarding` of
//!   every link, e.g. `lo`, which `ip_forward` switches) and those of `cbr0` (`accept_ra`, `route_localnet`):
//!   switched on for all pods, never switched back.
//! - **Shared firewall structure** in iptables, ip6tables and nftables: tables, the built-in chains, portmap's
//!   `CNI-HOSTPORT-*` chains with their fixed rules and jumps, our nftables tables with their fixed chains and
//!   empty sets and maps. A line is *not* shared (so it is residue) when it names a pod: a container ID (ours
//!   all start with `cnitool-`), a pod address (a host address of the pod subnet other than the gateway), a
//!   per-pod chain (`CNI-<hash>`, `CNI-DN-<hash>`, ...: any `CNI-` name but `CNI-HOSTPORT-*`), a host veth
//!   (`veth*`) or ifb (`bwp*`), or a set or map element (`elements = ...`).
//! - **host-local's bookkeeping**: the network directory, its `lock`, `last_reserved_ip.*` (the round-robin
//!   position) and `.host-local-index/` (a cache of the leases, validated by a stamp before use; checked
//!   separately to hold no entry of any pod, see [`Kubenet::index_entries`]). Lease files, `.tmp-*` files
//!   and anything else are residue.
//! - **The result cache's `results/` directory**, without any entry (an entry or a `.tmp-*` file is residue).

use std::collections::HashMap;
use std::fs;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::snapshot::NodeSnapshot;
use crate::upstream::{clean_command, output};
use crate::{bin, json, Node, PluginOutput, TestNetns, Value};
use ipnet::IpNet;

/// The bridge of the conflists.
pub const BRIDGE: &str = "cbr0";
/// The pod subnet and gateway of the conflists.
pub const SUBNET_V4: &str = "10.244.1.0/24";
pub const GATEWAY_V4: &str = "10.244.1.1";
pub const SUBNET_V6: &str = "fd00:10:244:1::/64";
pub const GATEWAY_V6: &str = "fd00:10:244:1::1";
/// The pod subnet and gateway of a second node (the conflists with their subnets changed, see
/// [`second_node`]).
pub const SUBNET_V4_B: &str = "10.244.2.0/24";
pub const GATEWAY_V4_B: &str = "10.244.2.1";
pub const SUBNET_V6_B: &str = "fd00:10:244:2::/64";
pub const GATEWAY_V6_B: &str = "fd00:10:244:2::1";

/// Turns a conflist of `conf/` into the second node's: its pod subnets are the `_B` ones (the cluster CIDR
/// in `nonMasqueradeCIDRs` stays).
pub fn second_node(conf: &mut Value) {
    let text = conf.to_string().replace(SUBNET_V4, SUBNET_V4_B).replace(SUBNET_V6, SUBNET_V6_B);
    *conf = serde_json::from_str(&text).expect("json");
}

/// A test node with a conflist of `conf/` installed, the host-local dataDir and the result cache in the
/// node's temporary directory.
pub struct Kubenet {
    pub node: Node,
    /// The network name of the conflist.
    pub net: String,
    conf_dir: PathBuf,
    pub data_dir: PathBuf,
    pub cache_dir: PathBuf,
}

impl Kubenet {
    /// A fresh node with `conf/<file>` installed (its host-local `dataDir` pointed into the node's directory),
    /// changed by `tweak` (e.g. an extra option of one plugin).
    pub fn new(file: &str, tweak: impl FnOnce(&mut Value)) -> Kubenet {
        let node = Node::new();
        let dir = node.dir().to_path_buf();
        let conf_dir = dir.join("net.d");
        fs::create_dir_all(&conf_dir).expect("conf dir");
        let data_dir = dir.join("ipam");
        let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("../conf").join(file);
        let text = fs::read(&source).unwrap_or_else(|e| panic!("read {}: {e}", source.display()));
        let mut conf: Value = serde_json::from_slice(&text).unwrap_or_else(|e| panic!("{}: {e}", source.display()));
        for plugin in conf["plugins"].as_array_mut().expect("plugins") {
            if plugin["ipam"]["type"] == "host-local" {
                plugin["ipam"]["dataDir"] = json!(data_dir);
            }
        }
        tweak(&mut conf);
        fs::write(conf_dir.join(file), serde_json::to_vec_pretty(&conf).expect("json")).expect("write conf");
        let net = conf["name"].as_str().expect("network name").to_string();
        Kubenet { node, net, conf_dir, data_dir, cache_dir: dir.join("cache") }
    }

    /// The directories whose files the snapshots record.
    pub fn state_dirs(&self) -> [&Path; 2] {
        [&self.data_dir, &self.cache_dir]
    }

    /// The node now; after a short settling (IPv6 addresses and routes of a new link appear a moment later).
    pub fn snapshot(&self) -> NodeSnapshot {
        NodeSnapshot::settled(&self.node, &self.state_dirs(), Duration::from_secs(3))
    }

    /// Runs our cnitool `verb` (add, del, check) for `pod` in the node, with `CAP_ARGS` and, when given, the
    /// fail point `CNI_FAILPOINT` (which cnitool passes on to every plugin, and they to IPAM).
    pub fn cnitool(&self, verb: &str, pod: &TestNetns, cap_args: &Value, failpoint: Option<&str>) -> PluginOutput {
        let netns = pod.path.to_str().expect("utf-8 netns path");
        let mut command = clean_command(&self.node, bin("cnitool"));
        command
            .args([verb, &self.net, netns])
            .env("NETCONFPATH", &self.conf_dir)
            .env("CNI_PATH", crate::bin_dir())
            .env("CNI_CACHE_DIR", &self.cache_dir)
            .env("CAP_ARGS", cap_args.to_string());
        if let Some(name) = failpoint {
            command.env("CNI_FAILPOINT", name);
        }
        output(&mut command, b"")
    }

    fn conflist_path(&self) -> PathBuf {
        fs::read_dir(&self.conf_dir).expect("conf dir").flatten().next().expect("a conflist").path()
    }

    /// The installed conflist.
    pub fn conflist(&self) -> Value {
        serde_json::from_slice(&fs::read(self.conflist_path()).expect("read conf")).expect("json")
    }

    /// Changes the installed conflist with `tweak`.
    pub fn rewrite(&self, tweak: impl FnOnce(&mut Value)) {
        let mut conf = self.conflist();
        tweak(&mut conf);
        fs::write(self.conflist_path(), serde_json::to_vec_pretty(&conf).expect("json")).expect("write conf");
    }

    /// Our cnitool GC of the network, with the attachments (`containerID:ifname`) that stay valid.
    pub fn gc(&self, valid: &[&str]) -> PluginOutput {
        let mut command = clean_command(&self.node, bin("cnitool"));
        command.args(["gc", &self.net]);
        for attachment in valid {
            command.args(["--valid", attachment]);
        }
        command
            .env("NETCONFPATH", &self.conf_dir)
            .env("CNI_PATH", crate::bin_dir())
            .env("CNI_CACHE_DIR", &self.cache_dir);
        output(&mut command, b"")
    }

    /// Our cnitool ADD that must succeed; returns the result.
    pub fn add(&self, pod: &TestNetns, cap_args: &Value) -> Value {
        let out = self.cnitool("add", pod, cap_args, None);
        assert!(out.success(), "cnitool add failed ({}): {}{}", out.status, out.stdout_text, out.stderr);
        out.stdout
    }

    /// Our cnitool DEL that must succeed.
    pub fn del(&self, pod: &TestNetns, cap_args: &Value) {
        let out = self.cnitool("del", pod, cap_args, None);
        assert!(out.success(), "cnitool del failed ({}): {}{}", out.status, out.stdout_text, out.stderr);
    }

    /// The network's directory in host-local's dataDir.
    pub fn network_dir(&self) -> PathBuf {
        self.data_dir.join(&self.net)
    }

    /// The lease files of the network (named by an address) with their content.
    pub fn leases(&self) -> Vec<(IpAddr, Vec<u8>)> {
        let Ok(entries) = fs::read_dir(self.network_dir()) else { return Vec::new() };
        entries
            .flatten()
            .filter_map(|e| {
                let ip = e.file_name().to_str()?.parse().ok()?;
                Some((ip, fs::read(e.path()).unwrap_or_default()))
            })
            .collect()
    }

    /// The lines of host-local's index (`<ip> <containerID> <ifname>`).
    pub fn index_entries(&self) -> Vec<String> {
        let dir = self.network_dir().join(".host-local-index");
        let Ok(entries) = fs::read_dir(&dir) else { return Vec::new() };
        entries
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("b-"))
            .flat_map(|e| {
                let text = fs::read_to_string(e.path()).unwrap_or_default();
                text.lines().filter(|l| !l.is_empty()).map(String::from).collect::<Vec<_>>()
            })
            .collect()
    }

    /// The names of the files in the result cache (entries and temporary files).
    pub fn cache_files(&self) -> Vec<String> {
        let Ok(entries) = fs::read_dir(self.cache_dir.join("results")) else { return Vec::new() };
        entries.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect()
    }

    /// Everything that differs between `before` and `after` beyond what may stay (see the module doc), plus
    /// any index entry: empty when nothing of any pod is left.
    pub fn residue(&self, before: &NodeSnapshot, after: &NodeSnapshot) -> Vec<String> {
        let mut problems = residue(before, after, &self.state_dirs());
        problems.extend(self.index_entries().into_iter().map(|l| format!("host-local index: {l}")));
        problems
    }

    /// Panics, listing them, when [`Kubenet::residue`] finds anything.
    pub fn assert_no_residue(&self, before: &NodeSnapshot, after: &NodeSnapshot, when: &str) {
        let problems = self.residue(before, after);
        assert!(problems.is_empty(), "{when}: left on the node:\n  {}", problems.join("\n  "));
    }
}

/// `CAP_ARGS` of one pod: two host port mappings (TCP and UDP, the latter makes portmap flush conntrack) and
/// bandwidth limits in both directions (so bandwidth makes a tbf on the host veth and an ifb).
pub fn cap_args(host_port: u16) -> Value {
    json!({
        "portMappings": [
            {"hostPort": host_port, "containerPort": 80, "protocol": "tcp"},
            {"hostPort": host_port, "containerPort": 53, "protocol": "udp"}
        ],
        "bandwidth": {
            "ingressRate": 100_000_000u64, "ingressBurst": 1_000_000u64,
            "egressRate": 100_000_000u64, "egressBurst": 1_000_000u64
        }
    })
}

pub use crate::result_ips;

/// Whether `line` names a pod (see the module doc).
pub fn names_a_pod(line: &str) -> bool {
    let words = || line.split(|c: char| c.is_whitespace() || matches!(c, '"' | ',' | '{' | '}' | '(' | ')' | ';'));
    line.contains("cnitool-")
        || line.contains("elements")
        || words().any(|w| {
            let w = w.trim_end_matches(':');
            (w.starts_with("CNI-") && !w.starts_with("CNI-HOSTPORT-"))
                || w.starts_with("veth")
                || w.starts_with("bwp")
                || is_pod_address(w)
        })
}

/// A host address of a pod subnet other than its gateway (a word such as `10.244.1.7` or `10.244.1.7/32`).
fn is_pod_address(word: &str) -> bool {
    let addr = word.split('/').next().unwrap_or(word);
    let Ok(ip) = addr.parse::<IpAddr>() else { return false };
    let nodes =
        [(SUBNET_V4, GATEWAY_V4), (SUBNET_V6, GATEWAY_V6), (SUBNET_V4_B, GATEWAY_V4_B), (SUBNET_V6_B, GATEWAY_V6_B)];
    nodes.iter().any(|(subnet, gateway)| {
        let subnet: IpNet = subnet.parse().expect("constant");
        subnet.contains(&ip) && ip != subnet.network() && ip.to_string() != *gateway && ip != subnet.broadcast()
    })
}

/// Whether a new or changed line of `section` is shared state that may stay (see the module doc).
fn may_stay(section: &str, line: &str, state_dirs: &[&Path]) -> bool {
    match section {
        "links" | "addresses" => line.starts_with(&format!("{BRIDGE} ")),
        "routes" => line.contains(&format!(" dev {BRIDGE} ")) || line.ends_with(&format!(" dev {BRIDGE}")),
        "tc" => line.starts_with(&format!("qdisc {BRIDGE} ")) || line.starts_with(&format!("filter {BRIDGE} ")),
        "sysctls" => {
            let name = line.split('=').next().unwrap_or(line);
            match name.split_once("/conf/") {
                None => true,
                // `ip_forward` switches `forwarding` of every link (e.g. `lo`) too.
                Some((_, rest)) => {
                    ["all/", "default/", &format!("{BRIDGE}/")].iter().any(|p| rest.starts_with(p))
                        || rest.ends_with("/forwarding")
                }
            }
        }
        "iptables" | "ip6tables" | "nftables" => !names_a_pod(line),
        "files" => state_dirs.iter().any(|dir| bookkeeping_file(dir, line)),
        _ => false,
    }
}

/// A line of the `files` section that is host-local's or the cache's bookkeeping under `dir`.
fn bookkeeping_file(dir: &Path, line: &str) -> bool {
    let Some(rest) = line.strip_prefix(&dir.display().to_string()) else { return false };
    // `<dir>: NotFound` before the first ADD, the directories themselves, and these files.
    let path = rest.split(' ').next().unwrap_or(rest).trim_end_matches(':');
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    match parts.as_slice() {
        [] => true,
        ["results"] => line.contains(" dir "),
        [_net] => line.contains(" dir "),
        [_net, "lock"] => true,
        [_net, file] if file.starts_with("last_reserved_ip.") => true,
        [_net, ".host-local-index", ..] => true,
        _ => false,
    }
}

/// Every line gone from or new in a section between `before` and `after` that is not allowed to differ.
pub fn residue(before: &NodeSnapshot, after: &NodeSnapshot, state_dirs: &[&Path]) -> Vec<String> {
    let mut problems = Vec::new();
    for section in ["links", "addresses", "routes", "tc", "sysctls", "iptables", "ip6tables", "nftables", "files"] {
        let (old, new) = (count(before.section(section)), count(after.section(section)));
        for (line, n) in &old {
            if new.get(line).copied().unwrap_or(0) < *n && !may_stay(section, line, state_dirs) {
                problems.push(format!("{section}: - {line}"));
            }
        }
        for (line, n) in &new {
            if old.get(line).copied().unwrap_or(0) < *n && !may_stay(section, line, state_dirs) {
                problems.push(format!("{section}: + {line}"));
            }
        }
    }
    problems
}

fn count(lines: &[String]) -> HashMap<&str, usize> {
    let mut counts = HashMap::new();
    for line in lines {
        *counts.entry(line.as_str()).or_default() += 1;
    }
    counts
}
