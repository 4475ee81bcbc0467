//! The flannel CNI plugin (issues 23 and 24) on a node namespace, with a `subnet.env` the test writes as flanneld
//! writes it (no node agent needed): IPv4, dual-stack and IPv6-only, driven by our cnitool and by upstream
//! cnitool (libcni 1.1.2), which shares the result cache with ours (it sees it as /var/lib/cni).
//!
//! Each session adds two pods, which get one address of each family of the file, inside the node's subnets, with
//! routes to the cluster networks through the bridge; they ping each other in every family; CHECK passes; the
//! delegate's config is saved under `dataDir`, named by container ID. Our cnitool's GC keeps the valid pods and
//! releases a pod whose namespace vanished without a DEL (its lease and saved config); upstream cnitool has no GC
//! verb (libcni 1.1.2 predates it). DEL leaves nothing but
//! the bridge (as the reference bridge, it stays): no veth, address, route, rule, lease, saved config or
//! cached result, and a second DEL succeeds.
//!
//! Not here: takeover with flannel's own plugin (flannel-io/cni-plugin). No binary of it is on this machine
//! (Debian's containernetworking-plugins 1.1.1 no longer ships `flannel`), so the saved config is compared with
//! flannel's instead, in the plugin's unit tests (`plugins/flannel/src/delegate.rs`, pinned against flannel's
//! own test expectations). Hostile `subnet.env` files are in the bad-input corpus (`bad_input/flannel.rs`).
//!
//! Build the binaries first: `cargo build -p flannel -p bridge -p host-local -p cnitool`.

use std::collections::BTreeSet;
use std::fs;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ipnet::IpNet;
use netns_tests::runtimes::eventually;
use netns_tests::snapshot::NodeSnapshot;
use netns_tests::upstream::{clean_command, output, plugin_dir, upstream_cnitool, with_var_lib_cni, VarLibCni};
use netns_tests::{bin, json, unique_name, Node, PluginOutput, TestNetns, Value};

const NETWORK: &str = "flannel-net";
const MTU: u32 = 1450;

/// The node's part of the cluster, in the families a `subnet.env` names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stack {
    V4,
    Dual,
    V6,
}

/// (cluster network, node subnet, bridge gateway) of each family.
const V4: (&str, &str, &str) = ("10.247.0.0/16", "10.247.3.0/24", "10.247.3.1");
const V6: (&str, &str, &str) = ("fd47::/56", "fd47:0:0:3::/64", "fd47:0:0:3::1");

impl Stack {
    fn families(self) -> Vec<(&'static str, &'static str, &'static str)> {
        match self {
            Stack::V4 => vec![V4],
            Stack::Dual => vec![V4, V6],
            Stack::V6 => vec![V6],
        }
    }

    /// The file as flanneld's WriteSubnetFile writes it: each family's network and first address, then the
    /// MTU and whether flannel masquerades. Only the IPv6-only node masquerades itself: on the others the bridge
    /// does, in both families (its rules must go too).
    fn subnet_env(self) -> String {
        let mut text = String::new();
        if self != Stack::V6 {
            text.push_str("FLANNEL_NETWORK=10.247.0.0/16\nFLANNEL_SUBNET=10.247.3.1/24\n");
        }
        if self != Stack::V4 {
            text.push_str("FLANNEL_IPV6_NETWORK=fd47::/56\nFLANNEL_IPV6_SUBNET=fd47:0:0:3::1/64\n");
        }
        text.push_str(&format!("FLANNEL_MTU={MTU}\nFLANNEL_IPMASQ={}\n", self == Stack::V6));
        text
    }
}

/// The runner of a session.
#[derive(Clone, Debug)]
enum Tool {
    Ours,
    Upstream(PathBuf),
}

/// A node with a `subnet.env`, a conflist whose only plugin is flannel, our flannel, bridge and host-local as
/// CNI_PATH, and every state directory in the node's temporary directory.
struct Lab {
    node: Node,
    conf_dir: PathBuf,
    cni_path: PathBuf,
    /// flannel's `dataDir`: the delegate's saved configs.
    saved_dir: PathBuf,
    /// host-local's `dataDir`.
    lease_dir: PathBuf,
    cache: VarLibCni,
    bridge: String,
    stack: Stack,
    baseline: NodeSnapshot,
}

impl Lab {
    fn new(stack: Stack, version: &str) -> Lab {
        let node = Node::new();
        let dir = node.dir().to_path_buf();
        let (flannel, bridge, host_local) = (bin("flannel"), bin("bridge"), bin("host-local"));
        let cni_path =
            plugin_dir(&dir.join("bin"), &[("flannel", &flannel), ("bridge", &bridge), ("host-local", &host_local)]);
        let subnet_file = dir.join("run-flannel").join("subnet.env");
        fs::create_dir_all(subnet_file.parent().unwrap()).expect("subnet.env dir");
        fs::write(&subnet_file, stack.subnet_env()).expect("write subnet.env");
        let conf_dir = dir.join("net.d");
        fs::create_dir_all(&conf_dir).expect("conf dir");
        let (saved_dir, lease_dir) = (dir.join("flannel"), dir.join("ipam"));
        let bridge = unique_name("fl");
        // As flannel's manifests install it, with every path in the test's directory.
        let conflist = json!({
            "name": NETWORK, "cniVersion": version,
            "plugins": [{
                "type": "flannel", "subnetFile": subnet_file, "dataDir": saved_dir,
                "delegate": { "bridge": bridge, "hairpinMode": true, "isDefaultGateway": false },
                "ipam": { "dataDir": lease_dir }
            }]
        });
        fs::write(conf_dir.join("10-flannel.conflist"), conflist.to_string()).expect("write conflist");
        let cache = VarLibCni::new(&dir);
        let baseline = NodeSnapshot::settled(&node, &[], Duration::from_secs(4));
        Lab { node, conf_dir, cni_path, saved_dir, lease_dir, cache, bridge, stack, baseline }
    }

    fn cnitool(&self, tool: &Tool, args: &[&str]) -> PluginOutput {
        let mut command = match tool {
            Tool::Ours => {
                let mut command = clean_command(&self.node, bin("cnitool"));
                command.env("CNI_CACHE_DIR", self.cache.path());
                command
            }
            Tool::Upstream(path) => {
                let mut command = clean_command(&self.node, path);
                with_var_lib_cni(&mut command, &self.cache);
                command
            }
        };
        command.args(args).env("NETCONFPATH", &self.conf_dir).env("CNI_PATH", &self.cni_path);
        output(&mut command, b"")
    }

    fn ok(&self, tool: &Tool, args: &[&str]) -> Value {
        let out = self.cnitool(tool, args);
        assert!(
            out.success(),
            "{tool:?} {args:?} failed ({}): stdout {} stderr {}",
            out.status,
            out.stdout_text,
            out.stderr
        );
        out.stdout
    }

    /// The names of the files directly in `dir` (none when it is missing).
    fn files(dir: &Path) -> BTreeSet<String> {
        let Ok(entries) = fs::read_dir(dir) else { return BTreeSet::new() };
        entries.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect()
    }

    fn saved(&self) -> BTreeSet<String> {
        Lab::files(&self.saved_dir)
    }

    /// host-local's leases of the network (files named by an address).
    fn leases(&self) -> Vec<IpAddr> {
        Lab::files(&self.lease_dir.join(NETWORK)).iter().filter_map(|name| name.parse().ok()).collect()
    }

    fn cached_results(&self) -> BTreeSet<String> {
        Lab::files(&self.cache.path().join("results"))
    }

    /// Adds `pod` and checks what it got; returns its addresses and its container ID (the name of the saved
    /// config that appeared).
    fn add(&self, tool: &Tool, pod: &TestNetns) -> (Vec<IpAddr>, String) {
        let before = self.saved();
        let result = self.ok(tool, &["add", NETWORK, path_str(&pod.path)]);
        let new: Vec<String> = self.saved().difference(&before).cloned().collect();
        assert_eq!(new.len(), 1, "one saved config per pod: {new:?}");
        let saved: Value = serde_json::from_slice(&fs::read(self.saved_dir.join(&new[0])).unwrap()).unwrap();
        self.assert_saved_config(&saved);
        let addresses = self.assert_pod_configured(pod, &result);
        (addresses, new[0].clone())
    }

    /// The saved config is the completed delegate: this node's subnets as ranges, the cluster networks as routes.
    fn assert_saved_config(&self, saved: &Value) {
        let families = self.stack.families();
        let ranges: Vec<Value> = families.iter().map(|(_, subnet, _)| json!([{ "subnet": subnet }])).collect();
        let routes: Vec<Value> = families.iter().map(|(network, _, _)| json!({ "dst": network })).collect();
        assert_eq!(saved["ipam"]["ranges"], json!(ranges), "{saved}");
        assert_eq!(saved["ipam"]["routes"], json!(routes), "{saved}");
        assert_eq!(
            (&saved["type"], &saved["name"], &saved["mtu"], &saved["bridge"], &saved["ipMasq"]),
            (&json!("bridge"), &json!(NETWORK), &json!(MTU), &json!(self.bridge), &json!(self.stack != Stack::V6)),
        );
    }

    /// One address per family, inside the node's subnet, on the pod's eth0 with flannel's MTU, and a route
    /// to each cluster network through the bridge's gateway. Returns the addresses, IPv4 first.
    fn assert_pod_configured(&self, pod: &TestNetns, result: &Value) -> Vec<IpAddr> {
        let ips: Vec<IpNet> = result["ips"]
            .as_array()
            .unwrap_or_else(|| panic!("no ips in {result}"))
            .iter()
            .map(|ip| ip["address"].as_str().unwrap().parse().unwrap())
            .collect();
        let families = self.stack.families();
        assert_eq!(ips.len(), families.len(), "one address per family: {result}");
        let eth0 = pod.ip(&["-d", "addr", "show", "eth0"]);
        assert!(eth0.contains(&format!("mtu {MTU}")), "{eth0}");
        for (ip, (network, subnet, gateway)) in ips.iter().zip(&families) {
            assert!(subnet.parse::<IpNet>().unwrap().contains(&ip.addr()), "{ip} outside {subnet}");
            assert!(eth0.contains(&ip.to_string()), "{ip} not on eth0: {eth0}");
            let family = if ip.addr().is_ipv4() { "-4" } else { "-6" };
            let routes = pod.ip(&[family, "route", "show", network]);
            assert!(routes.contains(&format!("{network} via {gateway} dev eth0")), "no route to {network}: {routes}");
        }
        ips.iter().map(IpNet::addr).collect()
    }

    /// The node's nat rules that name `ip` (the bridge's masquerade of a pod).
    fn masquerade_rules(&self, ip: IpAddr) -> Vec<String> {
        let save = if ip.is_ipv4() { "iptables-save" } else { "ip6tables-save" };
        let out = self.node.exec(save, &["-t", "nat"], &[], b"");
        assert!(out.status.success(), "{save}: {}", String::from_utf8_lossy(&out.stderr));
        let needle = format!("{ip}/");
        String::from_utf8_lossy(&out.stdout).lines().filter(|l| l.contains(&needle)).map(str::to_string).collect()
    }

    /// Nothing of the pods (`pod_addresses`) is left on the node: compared with the node before the first ADD,
    /// only the bridge is new (with its addresses and routes); no lease, saved config or cached result.
    fn assert_clean(&self, pod_addresses: &[IpAddr]) {
        let after = NodeSnapshot::settled(&self.node, &[], Duration::from_secs(4));
        let mut problems = Vec::new();
        for section in ["links", "addresses", "routes", "tc", "iptables", "ip6tables", "nftables"] {
            let before: BTreeSet<&String> = self.baseline.section(section).iter().collect();
            let now: BTreeSet<&String> = after.section(section).iter().collect();
            problems.extend(before.difference(&now).map(|gone| format!("{section}: - {gone}")));
            for new in now.difference(&before) {
                let allowed = match section {
                    "links" | "addresses" => new.starts_with(&format!("{} ", self.bridge)),
                    "tc" => new.starts_with(&format!("qdisc {} ", self.bridge)),
                    // Subnet-router anycast routes come with IPv6 forwarding, which the bridge turns on.
                    "routes" => new.contains(&format!(" dev {}", self.bridge)) || new.starts_with("anycast "),
                    // The nat table the bridge's masquerade made stays, as with the reference: nothing in it
                    // may name a pod or be a per-pod chain.
                    _ => !new.contains("CNI-") && !pod_addresses.iter().any(|a| new.contains(&a.to_string())),
                };
                if !allowed {
                    problems.push(format!("{section}: + {new}"));
                }
            }
        }
        assert!(problems.is_empty(), "left on the node after DEL:\n  {}", problems.join("\n  "));
        assert_eq!(self.leases(), Vec::<IpAddr>::new(), "leases left");
        assert_eq!(self.saved(), BTreeSet::new(), "saved configs left");
        assert_eq!(self.cached_results(), BTreeSet::new(), "cached results left");
    }
}

fn path_str(path: &Path) -> &str {
    path.to_str().expect("utf-8 path")
}

/// Pings `to` from `from` until it answers (an IPv6 address is usable once duplicate address detection ends).
fn assert_reaches(from: &TestNetns, to: IpAddr) {
    eventually(Duration::from_secs(5), || if from.ping(to) { Ok(()) } else { Err(format!("{to} never answered")) })
        .unwrap_or_else(|e| panic!("from {}: {e}", from.name));
}

/// Two pods added with `tool`, checked, reaching each other in every family, deleted (twice); with our cnitool
/// also GC: the valid pods kept, a third pod whose namespace vanished without DEL released.
fn session(stack: Stack, tool: Tool) {
    let version = match tool {
        Tool::Ours => "1.1.0",
        // libcni 1.1.2 speaks up to 1.0.0.
        Tool::Upstream(_) => "1.0.0",
    };
    let lab = Lab::new(stack, version);
    let pods = [lab.node.pod_netns(), lab.node.pod_netns()];
    let added: Vec<(Vec<IpAddr>, String)> = pods.iter().map(|pod| lab.add(&tool, pod)).collect();
    assert_eq!(lab.leases().len(), 2 * stack.families().len());
    for (index, family) in stack.families().iter().enumerate() {
        let (a, b) = (added[0].0[index], added[1].0[index]);
        assert_ne!(a, b, "two pods, one {} address", family.0);
        assert_reaches(&pods[0], b);
        assert_reaches(&pods[1], a);
    }
    for pod in &pods {
        lab.ok(&tool, &["check", NETWORK, path_str(&pod.path)]);
    }
    // Where flannel does not masquerade, the bridge does, for each family of the pod.
    for ip in &added[0].0 {
        let rules = lab.masquerade_rules(*ip);
        assert_eq!(rules.is_empty(), stack == Stack::V6, "masquerade rules of {ip}: {rules:?}");
    }
    let mut gone_ips = Vec::new();
    if let Tool::Ours = tool {
        // A pod whose namespace went away without a DEL, and whose cached result is lost too (the runner would
        // otherwise DEL it from the cache first): only the plugins' GC can release what it held.
        let gone = lab.node.pod_netns();
        let gone_id;
        (gone_ips, gone_id) = lab.add(&tool, &gone);
        drop(gone);
        let cached = lab.cache.path().join("results").join(format!("{NETWORK}-{gone_id}-eth0"));
        fs::remove_file(&cached).unwrap_or_else(|e| panic!("remove {}: {e}", cached.display()));
        let valid: Vec<String> = added.iter().map(|(_, id)| format!("--valid={id}:eth0")).collect();
        let mut args = vec!["gc", NETWORK];
        args.extend(valid.iter().map(String::as_str));
        lab.ok(&tool, &args);
        assert!(!lab.saved().contains(&gone_id), "the vanished pod's saved config is forgotten");
        assert!(gone_ips.iter().all(|ip| !lab.leases().contains(ip)), "the vanished pod's leases are released");
        assert_eq!(lab.saved().len(), 2, "the valid pods' saved configs stay");
        assert_eq!(lab.leases().len(), 2 * stack.families().len(), "the valid pods' leases stay");
        assert_reaches(&pods[0], added[1].0[0]);
    }
    for pod in &pods {
        lab.ok(&tool, &["del", NETWORK, path_str(&pod.path)]);
        assert!(!pod.links().contains(&"eth0".to_string()), "eth0 left in {}", pod.name);
        lab.ok(&tool, &["del", NETWORK, path_str(&pod.path)]);
    }
    let addresses: Vec<IpAddr> = added.iter().flat_map(|(ips, _)| ips.clone()).chain(gone_ips).collect();
    lab.assert_clean(&addresses);
}

fn upstream() -> Option<Tool> {
    upstream_cnitool().map(Tool::Upstream)
}

#[test]
fn ipv4_through_our_cnitool() {
    session(Stack::V4, Tool::Ours);
}

#[test]
fn dual_stack_through_our_cnitool() {
    session(Stack::Dual, Tool::Ours);
}

#[test]
fn ipv6_only_through_our_cnitool() {
    session(Stack::V6, Tool::Ours);
}

#[test]
fn ipv4_through_upstream_cnitool() {
    let Some(tool) = upstream() else { return };
    session(Stack::V4, tool);
}

#[test]
fn dual_stack_through_upstream_cnitool() {
    let Some(tool) = upstream() else { return };
    session(Stack::Dual, tool);
}

#[test]
fn ipv6_only_through_upstream_cnitool() {
    let Some(tool) = upstream() else { return };
    session(Stack::V6, tool);
}

/// A dual-stack pod added by one runner is checked and deleted by the other (the result cache and the saved
/// config are all they share), both ways.
#[test]
fn dual_stack_pods_move_between_runners() {
    let Some(upstream) = upstream() else { return };
    let lab = Lab::new(Stack::Dual, "1.0.0");
    let mut addresses = Vec::new();
    for (adder, remover) in [(&upstream, &Tool::Ours), (&Tool::Ours, &upstream)] {
        let pod = lab.node.pod_netns();
        addresses.extend(lab.add(adder, &pod).0);
        lab.ok(remover, &["check", NETWORK, path_str(&pod.path)]);
        lab.ok(remover, &["del", NETWORK, path_str(&pod.path)]);
        assert!(!pod.links().contains(&"eth0".to_string()), "eth0 left after {remover:?} deleted {adder:?}'s pod");
    }
    lab.assert_clean(&addresses);
}
