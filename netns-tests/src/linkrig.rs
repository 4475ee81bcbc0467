//! The rig of the link plugins' tests (macvlan, ipvlan, vlan, dummy, ptp): a node whose uplink is a veth to a
//! "lan" namespace (the other end holds [`LAN_HOST`]), a plugin directory with our binaries or the reference
//! ones, host-local state in the node's temporary directory, and helpers to run one plugin as a runtime does.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::snapshot::{assert_unchanged, NodeSnapshot};
use crate::upstream::{clean_command, output, plugin_dir, reference};
use crate::{bin, json, unique_name, veth_between, Node, PluginOutput, TestNetns, Value};

/// The lan's subnet; the node's uplink has no address of its own.
pub const LAN_SUBNET: &str = "10.30.0.0/24";
/// The address of the lan namespace's end of the uplink.
pub const LAN_HOST: &str = "10.30.0.254";
/// The uplink's name in the node namespace (the `master` of macvlan and friends).
pub const UPLINK: &str = "uplink0";

/// Which binaries serve a plugin.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Impl {
    Ours,
    Reference,
}

/// A node, the lan beyond its uplink, and plugin directories for ours and the reference.
pub struct LinkRig {
    pub node: Node,
    pub lan: TestNetns,
    pub ours: PathBuf,
    pub reference: PathBuf,
    /// The network name of the configs (unique per test).
    pub network: String,
}

impl LinkRig {
    /// `plugin` with our host-local (ours) or the reference host-local (reference).
    pub fn new(plugin: &str) -> LinkRig {
        LinkRig::with_reference(plugin, true)
    }

    /// Like [`LinkRig::new`] for a plugin the reference 1.1.1 does not have (its directory is left empty).
    pub fn new_ours_only(plugin: &str) -> LinkRig {
        LinkRig::with_reference(plugin, false)
    }

    fn with_reference(plugin: &str, with_reference: bool) -> LinkRig {
        let node = Node::new();
        let lan = TestNetns::new("lan");
        veth_between(&node, &lan, UPLINK, "eth0", &[], &[format!("{LAN_HOST}/24").parse().expect("lan address")]);
        let ours =
            plugin_dir(&node.dir().join("cni-ours"), &[(plugin, &bin(plugin)), ("host-local", &bin("host-local"))]);
        let theirs = if with_reference {
            vec![(plugin, reference(plugin)), ("host-local", reference("host-local"))]
        } else {
            vec![]
        };
        let theirs: Vec<(&str, &Path)> = theirs.iter().map(|(name, path)| (*name, path.as_path())).collect();
        let reference = plugin_dir(&node.dir().join("cni-reference"), &theirs);
        LinkRig { node, lan, ours, reference, network: unique_name("net") }
    }

    /// host-local's data directory.
    pub fn ipam_dir(&self) -> PathBuf {
        self.node.dir().join("ipam")
    }

    /// A host-local IPAM section on `subnet` whose state is in the node's directory.
    pub fn ipam(&self, subnet: &str) -> Value {
        json!({"type": "host-local", "dataDir": self.ipam_dir(), "ranges": [[{"subnet": subnet}]]})
    }

    pub fn cni_path(&self, which: Impl) -> &Path {
        match which {
            Impl::Ours => &self.ours,
            Impl::Reference => &self.reference,
        }
    }

    /// Runs the plugin of `conf["type"]` from `which`'s directory in the node namespace: `command` for
    /// container `id` on `CNI_IFNAME=eth0`, with `CNI_NETNS` set to `netns` (empty string if None) and `args`.
    pub fn run(
        &self,
        which: Impl,
        command: &str,
        netns: Option<&Path>,
        id: &str,
        conf: &Value,
        args: &str,
    ) -> PluginOutput {
        let mut cmd = self.command(which, command, netns, id, conf);
        if !args.is_empty() {
            cmd.env("CNI_ARGS", args);
        }
        output(&mut cmd, conf.to_string().as_bytes())
    }

    /// Our plugin's ADD into `pod` with `failpoint` armed (`CNI_FAILPOINT`, a failpoints build).
    pub fn add_at_failpoint(&self, pod: &TestNetns, id: &str, conf: &Value, failpoint: &str) -> PluginOutput {
        let mut cmd = self.command(Impl::Ours, "ADD", Some(&pod.path), id, conf);
        cmd.env("CNI_FAILPOINT", failpoint);
        output(&mut cmd, conf.to_string().as_bytes())
    }

    /// The plugin's process as [`LinkRig::run`] starts it, without `CNI_ARGS`.
    fn command(&self, which: Impl, command: &str, netns: Option<&Path>, id: &str, conf: &Value) -> Command {
        let plugin = conf["type"].as_str().expect("config type");
        let cni_path = self.cni_path(which);
        let mut cmd = clean_command(&self.node, cni_path.join(plugin));
        cmd.env("CNI_COMMAND", command)
            .env("CNI_CONTAINERID", id)
            .env("CNI_IFNAME", "eth0")
            .env("CNI_PATH", cni_path)
            .env("CNI_NETNS", netns.map(|p| p.as_os_str().to_owned()).unwrap_or_default());
        cmd
    }

    /// ADD into `pod`; panics on failure.
    pub fn add(&self, which: Impl, pod: &TestNetns, id: &str, conf: &Value) -> Value {
        self.run(which, "ADD", Some(&pod.path), id, conf, "").expect_ok().clone()
    }

    /// `conf` with `result` as its prevResult (as a runtime sends CHECK and DEL).
    pub fn with_prev(conf: &Value, result: &Value) -> Value {
        crate::with_prev(conf, result)
    }

    /// CHECK of `pod` with `result` as prevResult.
    pub fn check(&self, which: Impl, pod: &TestNetns, id: &str, conf: &Value, result: &Value) -> PluginOutput {
        self.run(which, "CHECK", Some(&pod.path), id, &LinkRig::with_prev(conf, result), "")
    }

    /// DEL of `pod`'s attachment; panics on failure.
    pub fn del(&self, which: Impl, netns: Option<&Path>, id: &str, conf: &Value, result: &Value) {
        self.run(which, "DEL", netns, id, &LinkRig::with_prev(conf, result), "").expect_ok();
    }

    /// Takeover both ways: an attachment ADDed by one implementation is CHECKed and DELeted by the other, which
    /// leaves neither the pod's `eth0` nor a lease. `after_add(adder, pod)` tests the pod before the other side
    /// takes over (traffic); `after_del(adder, other)` asserts what else must be gone.
    pub fn takeover_both_ways(
        &self,
        conf: &Value,
        after_add: impl Fn(Impl, &TestNetns),
        after_del: impl Fn(Impl, Impl),
    ) {
        for (adder, other) in [(Impl::Reference, Impl::Ours), (Impl::Ours, Impl::Reference)] {
            let pod = self.node.pod_netns();
            let id = unique_name("t");
            let result = self.add(adder, &pod, &id, conf);
            after_add(adder, &pod);
            self.check(other, &pod, &id, conf, &result).expect_ok();
            self.del(other, Some(&pod.path), &id, conf, &result);
            assert!(!pod.links().contains(&"eth0".to_string()), "{adder:?} then {other:?}");
            assert!(self.leases().is_empty(), "{adder:?} then {other:?}: {:?}", self.leases());
            after_del(adder, other);
        }
    }

    /// On a kernel without the plugin's link kind: ADD answers `expected` (code 999) in every version, a DEL of
    /// the failed attachment succeeds (a runtime's rollback), and node and pod are unchanged, no lease left.
    /// `conf(version)` is the plugin's config.
    pub fn assert_missing_support(&self, expected: &str, conf: impl Fn(&str) -> Value) {
        let pod = self.node.pod_netns();
        let settle = std::time::Duration::from_secs(5);
        let before = (NodeSnapshot::settled(&self.node, &[], settle), NodeSnapshot::settled(&pod, &[], settle));
        for version in ["0.3.1", "1.0.0", "1.1.0"] {
            let conf = conf(version);
            let out = self.run(Impl::Ours, "ADD", Some(&pod.path), "k", &conf, "");
            let err = out.expect_err();
            assert_eq!(err["msg"], expected, "{}", out.stdout_text);
            assert_eq!((err["code"].as_u64(), err["cniVersion"].as_str()), (Some(999), Some(version)));
            self.run(Impl::Ours, "DEL", Some(&pod.path), "k", &conf, "").expect_ok();
        }
        assert_unchanged(&before.0, &NodeSnapshot::take(&self.node, &[]));
        assert_unchanged(&before.1, &NodeSnapshot::take(&pod, &[]));
        assert!(self.leases().is_empty(), "{:?}", self.leases());
    }

    /// ADD of `conf` into a fresh pod fails with a message that holds every one of `needles` (what the kernel
    /// refused and why); a DEL of the failed attachment succeeds (a runtime's rollback); node and pod are as
    /// they were, no lease left. Returns the message.
    pub fn assert_refused(&self, conf: &Value, needles: &[&str]) -> String {
        let pod = self.node.pod_netns();
        let settle = std::time::Duration::from_secs(5);
        let before = (NodeSnapshot::settled(&self.node, &[], settle), NodeSnapshot::settled(&pod, &[], settle));
        let out = self.run(Impl::Ours, "ADD", Some(&pod.path), "r", conf, "");
        let msg = out.expect_err()["msg"].as_str().unwrap_or_default().to_string();
        for needle in needles {
            assert!(msg.contains(needle), "{needle:?} not in the error: {}", out.stdout_text);
        }
        eprintln!("refused as expected: {msg}");
        self.run(Impl::Ours, "DEL", Some(&pod.path), "r", conf, "").expect_ok();
        assert_unchanged(&before.0, &NodeSnapshot::take(&self.node, &[]));
        assert_unchanged(&before.1, &NodeSnapshot::take(&pod, &[]));
        assert!(self.leases().is_empty(), "{:?}", self.leases());
        msg
    }

    /// The lease files host-local keeps for the network (empty when none).
    pub fn leases(&self) -> Vec<String> {
        let dir = self.ipam_dir().join(&self.network);
        let Ok(entries) = std::fs::read_dir(&dir) else { return Vec::new() };
        let mut names: Vec<String> = entries
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.parse::<std::net::IpAddr>().is_ok())
            .collect();
        names.sort();
        names
    }
}

/// `ip -d -j link show <name>` in `ns`: the link's JSON (with `linkinfo`), or None when it does not exist.
pub fn link_details(ns: &TestNetns, name: &str) -> Option<Value> {
    let out = ns.exec("ip", &["-d", "-j", "link", "show", "dev", name], &[], b"");
    if !out.status.success() {
        return None;
    }
    let parsed: Value = serde_json::from_slice(&out.stdout).ok()?;
    parsed.as_array()?.first().cloned()
}

/// The running kernel's release, for the messages of skipped tests.
pub fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim().to_string()
}

/// True inside the VM lane (scripts/vm-lane.sh sets `CNI_TEST_KERNEL_LANE=1`): its kernels have every kind
/// below, so a test that needs one never skips there.
pub fn in_kernel_lane() -> bool {
    std::env::var_os("CNI_TEST_KERNEL_LANE").is_some_and(|v| v == "1")
}

/// True, after saying the test is skipped, when this kernel has no links of `kind` (`config`: the kernel option
/// that brings them): for the tests that need the kind. In the VM lane a missing kind fails the test instead.
pub fn skip_without_kind(kind: &str, config: &str) -> bool {
    if kernel_has_kind(kind) {
        return false;
    }
    assert!(!in_kernel_lane(), "the VM lane's kernel ({}) has no {kind} support ({config})", kernel_release());
    eprintln!("skipped: this kernel ({}) has no {kind} support ({config})", kernel_release());
    true
}

/// True, after saying the test is skipped, when this kernel has links of `kind` (`has`: how to say so): for the
/// tests of the missing-support path (they run on the host's kernel, which lacks the kind).
pub fn skip_with_kind(kind: &str, has: &str) -> bool {
    if !kernel_has_kind(kind) {
        return false;
    }
    eprintln!("skipped: this kernel ({}) has {has}; the missing-support path is not reachable", kernel_release());
    true
}

/// True when this kernel can make what `kind` names (checked in a namespace of its own, removed again): a link
/// kind (`dummy`, `vlan`, `ipvlan`, `macvlan`, `vrf`, `wireguard`, `ipip`) or `bridge_vlan_filtering`.
pub fn kernel_has_kind(kind: &str) -> bool {
    let ns = TestNetns::new("kind");
    let mut args = vec!["link", "add"];
    match kind {
        "dummy" | "wireguard" => args.extend(["probe0", "type", kind]),
        "vrf" => args.extend(["probe0", "type", "vrf", "table", "10"]),
        "ipip" => args.extend(["probe0", "type", "ipip", "local", "192.0.2.1"]),
        "bridge_vlan_filtering" => args.extend(["probe0", "type", "bridge", "vlan_filtering", "1"]),
        "vlan" | "ipvlan" | "macvlan" => {
            let parent = ns.exec("ip", &["link", "add", "probep", "type", "veth", "peer", "name", "probeq"], &[], b"");
            assert!(parent.status.success(), "veth for the {kind} probe");
            args.extend(["link", "probep", "name", "probe0", "type", kind]);
            if kind == "vlan" {
                args.extend(["id", "2"]);
            }
        }
        other => panic!("no probe for {other}"),
    }
    ns.exec("ip", &args, &[], b"").status.success()
}

/// The address (without its prefix) of `result["ips"][index]`.
pub fn result_address(result: &Value, index: usize) -> std::net::IpAddr {
    let address = result["ips"][index]["address"].as_str().unwrap_or_else(|| panic!("no ips[{index}] in {result}"));
    address.split('/').next().unwrap_or_default().parse().unwrap_or_else(|e| panic!("{address}: {e}"))
}

/// True if one ping from `from` out of `dev` (bound to it, as `ping -I`) to `addr` is answered within a second.
pub fn ping_via(from: &TestNetns, dev: &str, addr: std::net::IpAddr) -> bool {
    from.exec("ping", &["-c1", "-W1", "-I", dev, &addr.to_string()], &[], b"").status.success()
}

/// A peer on VLAN `id` of the lan: a vlan link on the lan's end of the uplink, moved into a namespace of its
/// own as its `eth0` with `address` (a prefix length included). Each peer is alone on its VLAN, so an
/// answer proves that the tagged frames reached it and no other VLAN's.
pub fn lan_vlan_peer(lan: &TestNetns, id: u16, address: &str) -> TestNetns {
    let peer = TestNetns::new("vp");
    let name = format!("v{id}");
    lan.ip(&["link", "add", "link", "eth0", "name", &name, "type", "vlan", "id", &id.to_string()]);
    lan.ip(&["link", "set", &name, "netns", &peer.name]);
    peer.ip(&["link", "set", &name, "name", "eth0"]);
    peer.ip(&["addr", "add", address, "dev", "eth0"]);
    peer.ip(&["link", "set", "eth0", "up"]);
    peer
}

/// The VLANs of `dev` on its bridge as `bridge -j vlan show` reads them in `ns`: "100 pvid untagged",
/// "200" (tagged), one line per VLAN (ranges expanded), in the kernel's order; empty when `dev` has none.
pub fn bridge_vlans(ns: &TestNetns, dev: &str) -> Vec<String> {
    let out = ns.exec("bridge", &["-j", "vlan", "show", "dev", dev], &[], b"");
    assert!(out.status.success(), "bridge vlan show dev {dev}: {}", String::from_utf8_lossy(&out.stderr));
    let parsed: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    let mut lines = Vec::new();
    for port in parsed.as_array().into_iter().flatten().filter(|p| p["ifname"] == dev) {
        for vlan in port["vlans"].as_array().into_iter().flatten() {
            let first = vlan["vlan"].as_u64().expect("vlan id");
            let last = vlan["vlanEnd"].as_u64().unwrap_or(first);
            let flags: Vec<&str> = vlan["flags"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
            let mut suffix = String::new();
            if flags.contains(&"PVID") {
                suffix.push_str(" pvid");
            }
            if flags.contains(&"Egress Untagged") {
                suffix.push_str(" untagged");
            }
            lines.extend((first..=last).map(|vid| format!("{vid}{suffix}")));
        }
    }
    lines
}

/// `conf` with the keys of `extra` set (a null removes the key): a test's variation of its base config.
pub fn with_fields(mut conf: Value, extra: &Value) -> Value {
    let object = conf.as_object_mut().expect("config object");
    for (key, value) in extra.as_object().expect("object of fields") {
        if value.is_null() {
            object.remove(key);
        } else {
            object.insert(key.clone(), value.clone());
        }
    }
    conf
}

/// The mode of the pod's `eth0`, a link of `kind` (macvlan or ipvlan), as `ip -d link` shows it.
pub fn pod_link_mode(pod: &TestNetns, kind: &str) -> String {
    let details = link_details(pod, "eth0").expect("eth0 in the pod");
    assert_eq!(details["linkinfo"]["info_kind"], kind, "{details}");
    details["linkinfo"]["info_data"]["mode"].as_str().expect("mode").to_string()
}
