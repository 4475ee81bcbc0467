//! ptp and macvlan in conflists, driven by our cnitool and by upstream cnitool (libcni 1.1.2): ptp (ipMasq) +
//! loopback and macvlan + loopback, with our plugins and with the reference ones (1.1.1), added, checked and
//! deleted in the spec versions each runner speaks (the pod reaches its peer, DEL leaves no link, lease, rule
//! or cache entry); and each runner taking over the other's attachments through the result cache.

use std::fs;
use std::net::IpAddr;
use std::path::PathBuf;

use netns_tests::linkrig::{LAN_HOST, UPLINK};
use netns_tests::upstream::{
    clean_command, output, plugin_dir, reference, upstream_cnitool, with_var_lib_cni, VarLibCni,
};
use netns_tests::{assert_ping, bin, json, veth_between, Node, PluginOutput, TestNetns, Value};

const PTP_NET: &str = "ptp-net";
const MACVLAN_NET: &str = "mv-net";
const PTP_GATEWAY: &str = "10.60.0.1";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Plugins {
    Ours,
    Reference,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Runner {
    Ours,
    Upstream,
}

/// A node with an uplink to a lan, a conf dir, a plugin dir and the result cache (upstream cnitool sees it as
/// /var/lib/cni).
struct Rig {
    node: Node,
    _lan: TestNetns,
    conf_dir: PathBuf,
    plugins: PathBuf,
    data_dir: PathBuf,
    cache: VarLibCni,
}

impl Rig {
    fn new(plugins: Plugins) -> Rig {
        let node = Node::new();
        let lan = TestNetns::new("lan");
        veth_between(&node, &lan, UPLINK, "eth0", &[], &[format!("{LAN_HOST}/24").parse().expect("net")]);
        let dir = node.dir().to_path_buf();
        let conf_dir = dir.join("net.d");
        fs::create_dir_all(&conf_dir).expect("conf dir");
        let pick = |name: &str| match plugins {
            Plugins::Ours => bin(name),
            Plugins::Reference => reference(name),
        };
        let (ptp, macvlan, host_local) = (pick("ptp"), pick("macvlan"), pick("host-local"));
        let loopback = bin("loopback");
        let plugins = plugin_dir(
            &dir.join("bin"),
            &[("ptp", &ptp), ("macvlan", &macvlan), ("host-local", &host_local), ("loopback", &loopback)],
        );
        let cache = VarLibCni::new(&dir);
        Rig { data_dir: dir.join("ipam"), node, _lan: lan, conf_dir, plugins, cache }
    }

    /// Writes both conflists in `version`.
    fn write_confs(&self, version: &str) {
        let ptp = json!({"cniVersion": version, "name": PTP_NET, "plugins": [
            {"type": "ptp", "ipMasq": true,
             "ipam": {"type": "host-local", "subnet": "10.60.0.0/24", "dataDir": self.data_dir,
                      "routes": [{"dst": "0.0.0.0/0"}]}},
            {"type": "loopback"}]});
        let macvlan = json!({"cniVersion": version, "name": MACVLAN_NET, "plugins": [
            {"type": "macvlan", "master": UPLINK,
             "ipam": {"type": "host-local", "subnet": "10.30.0.0/24", "dataDir": self.data_dir}},
            {"type": "loopback"}]});
        for (file, conf) in [("10-ptp.conflist", ptp), ("20-macvlan.conflist", macvlan)] {
            fs::write(self.conf_dir.join(file), serde_json::to_vec_pretty(&conf).expect("json")).expect("write");
        }
    }

    fn run(&self, runner: Runner, args: &[&str]) -> PluginOutput {
        let program = match runner {
            Runner::Ours => bin("cnitool"),
            Runner::Upstream => upstream_cnitool().expect("upstream cnitool"),
        };
        let mut command = clean_command(&self.node, program);
        command.args(args).env("NETCONFPATH", &self.conf_dir).env("CNI_PATH", &self.plugins).env("CNI_IFNAME", "eth0");
        match runner {
            Runner::Ours => {
                command.env("CNI_CACHE_DIR", self.cache.path());
            }
            Runner::Upstream => {
                with_var_lib_cni(&mut command, &self.cache);
            }
        }
        output(&mut command, b"")
    }

    fn ok(&self, runner: Runner, args: &[&str]) -> Value {
        let out = self.run(runner, args);
        assert!(out.success(), "{runner:?} {args:?}: stdout {} stderr {}", out.stdout_text, out.stderr);
        out.stdout
    }

    fn leases(&self, net: &str) -> usize {
        let Ok(entries) = fs::read_dir(self.data_dir.join(net)) else { return 0 };
        entries.flatten().filter(|e| e.file_name().to_string_lossy().parse::<IpAddr>().is_ok()).count()
    }

    fn cache_entries(&self) -> usize {
        fs::read_dir(self.cache.path().join("results")).map(|d| d.count()).unwrap_or(0)
    }

    fn nat_has_cni_rules(&self) -> bool {
        let out = self.node.exec("iptables-save", &["-t", "nat"], &[], b"");
        String::from_utf8_lossy(&out.stdout).contains("CNI-")
    }
}

fn netns(pod: &TestNetns) -> &str {
    pod.path.to_str().expect("utf-8 path")
}

/// Adds a pod to each network with `runner`, pings, checks (0.4.0+), deletes; nothing is left.
fn add_check_del(rig: &Rig, runner: Runner, version: &str) {
    rig.write_confs(version);
    for (net, peer) in [(PTP_NET, PTP_GATEWAY), (MACVLAN_NET, LAN_HOST)] {
        let pod = TestNetns::new("pod");
        let result = rig.ok(runner, &["add", net, netns(&pod)]);
        assert_eq!(result["cniVersion"], version, "{runner:?} {net}: {result}");
        assert_ping(&pod, peer.parse().expect("constant"));
        if version != "0.3.1" {
            rig.ok(runner, &["check", net, netns(&pod)]);
        }
        rig.ok(runner, &["del", net, netns(&pod)]);
        assert!(!pod.links().contains(&"eth0".to_string()), "{runner:?} {version} {net}");
        assert_eq!(rig.leases(net), 0, "{runner:?} {version} {net}");
    }
    assert_eq!(rig.cache_entries(), 0, "{runner:?} {version}");
    assert!(!rig.nat_has_cni_rules(), "{runner:?} {version}");
}

#[test]
fn our_cnitool_drives_our_plugins_in_every_version() {
    let rig = Rig::new(Plugins::Ours);
    for version in ["0.3.1", "0.4.0", "1.0.0", "1.1.0"] {
        add_check_del(&rig, Runner::Ours, version);
    }
}

#[test]
fn upstream_cnitool_drives_our_plugins() {
    if upstream_cnitool().is_none() {
        return;
    }
    let rig = Rig::new(Plugins::Ours);
    for version in ["0.3.1", "0.4.0", "1.0.0"] {
        add_check_del(&rig, Runner::Upstream, version);
    }
}

#[test]
fn both_runners_drive_the_reference_plugins_on_the_same_conflists() {
    let rig = Rig::new(Plugins::Reference);
    add_check_del(&rig, Runner::Ours, "1.0.0");
    if upstream_cnitool().is_some() {
        add_check_del(&rig, Runner::Upstream, "1.0.0");
    }
}

#[test]
fn the_runners_take_over_each_other_through_the_cache() {
    if upstream_cnitool().is_none() {
        return;
    }
    let rig = Rig::new(Plugins::Ours);
    rig.write_confs("1.0.0");
    for (adder, other) in [(Runner::Upstream, Runner::Ours), (Runner::Ours, Runner::Upstream)] {
        for net in [PTP_NET, MACVLAN_NET] {
            let pod = TestNetns::new("pod");
            rig.ok(adder, &["add", net, netns(&pod)]);
            rig.ok(other, &["check", net, netns(&pod)]);
            rig.ok(other, &["del", net, netns(&pod)]);
            assert!(!pod.links().contains(&"eth0".to_string()), "{adder:?} then {other:?}: {net}");
            assert_eq!(rig.leases(net), 0);
        }
    }
    assert_eq!(rig.cache_entries(), 0);
    assert!(!rig.nat_has_cni_rules());
}
