//! Crash consistency of host-device, tap and sbr (as `crash.rs` for the kubenet chain): the plugin killed with
//! SIGKILL at each fail point of its ADD (binaries built with `--features cnicore/failpoints`), then DEL must
//! leave nothing of the attachment, and a new ADD and DEL of the same pod must work. vrf's fail points come
//! after the VRF is created, which this kernel cannot do: they are exercised where the kernel has VRF.

use std::os::unix::process::ExitStatusExt;
use std::time::Duration;

use netns_tests::snapshot::{assert_unchanged, NodeSnapshot};
use netns_tests::{bin, json, run_binary, unique_name, veth_between, Node, PluginOutput, TestNetns, Value};

const SIGKILL: i32 = 9;
const POD_IP: &str = "10.52.0.5";

struct Rig {
    node: Node,
    pod: TestNetns,
    /// host-device's device in the node.
    device: String,
}

impl Rig {
    /// A node with a veth to a "wan" (the device host-device moves), and a pod whose eth0 is a veth to the node
    /// (what sbr works on).
    fn new(wan: &TestNetns) -> Rig {
        let node = Node::new();
        let pod = node.pod_netns();
        let device = unique_name("cd");
        veth_between(&node, wan, &device, &unique_name("cw"), &[], &["10.53.0.1/24".parse().unwrap()]);
        veth_between(
            &node,
            &pod,
            &unique_name("cp"),
            "eth0",
            &["10.52.0.1/24".parse().unwrap()],
            &[format!("{POD_IP}/24").parse().unwrap()],
        );
        Rig { node, pod, device }
    }

    fn call(&self, plugin: &str, verb: &str, conf: &Value, ifname: &str, failpoint: Option<&str>) -> PluginOutput {
        let netns = self.pod.path.display().to_string();
        let mut env = vec![("CNI_CONTAINERID", "crash1"), ("CNI_NETNS", netns.as_str()), ("CNI_IFNAME", ifname)];
        env.extend(failpoint.map(|point| ("CNI_FAILPOINT", point)));
        run_binary(&self.node, &bin(plugin), verb, &env, conf)
    }

    fn settled(&self) -> (NodeSnapshot, NodeSnapshot) {
        let timeout = Duration::from_secs(5);
        (NodeSnapshot::settled(&self.node, &[], timeout), NodeSnapshot::settled(&self.pod, &[], timeout))
    }
}

fn assert_killed(out: &PluginOutput, failpoint: &str) {
    assert_eq!(
        out.status.signal(),
        Some(SIGKILL),
        "not killed at {failpoint} (built with --features cnicore/failpoints?): {} {}",
        out.stdout_text,
        out.stderr
    );
}

/// Kills `plugin`'s ADD at `failpoint`, DELs, and checks the attachment is gone with `gone`; then a whole ADD
/// and DEL.
fn crash(plugin: &str, ifname: &str, conf: impl Fn(&Rig) -> Value, failpoint: &str, gone: impl Fn(&Rig)) {
    let wan = TestNetns::new("wan");
    let rig = Rig::new(&wan);
    let conf = conf(&rig);
    assert_killed(&rig.call(plugin, "ADD", &conf, ifname, Some(failpoint)), failpoint);
    let del = rig.call(plugin, "DEL", &conf, ifname, None);
    assert!(del.success(), "{failpoint}: DEL after the crash failed: {}", del.stdout_text);
    gone(&rig);
    let out = rig.call(plugin, "ADD", &conf, ifname, None);
    assert!(out.success(), "{failpoint}: ADD after the crash and DEL failed: {}", out.stdout_text);
    assert!(rig.call(plugin, "DEL", &conf, ifname, None).success(), "{failpoint}: last DEL");
    gone(&rig);
}

fn host_device_conf(rig: &Rig) -> Value {
    json!({"cniVersion": "1.0.0", "name": "crash-net", "type": "host-device", "device": rig.device,
        "dataDir": rig.node.dir().join("host-device"),
        "ipam": {"type": "static", "addresses": [{"address": "10.53.0.5/24"}]}})
}

fn host_device_gone(rig: &Rig) {
    assert!(rig.pod.netlink().link_by_name("net1").unwrap().is_none(), "device left in the pod");
    assert!(rig.node.netlink().link_by_name(&rig.device).unwrap().is_some(), "device not back in the node");
    let alias = rig.node.ip_json(&["link", "show", "dev", &rig.device])[0]["ifalias"].clone();
    assert_eq!(alias, Value::Null, "alias left on the device");
    let records = std::fs::read_dir(rig.node.dir().join("host-device")).map(|d| d.count()).unwrap_or(0);
    assert_eq!(records, 0, "a record left");
}

#[test]
fn host_device_killed_at_each_step() {
    for point in ["after-ipam", "after-alias", "after-move", "after-addresses"] {
        crash("host-device", "net1", host_device_conf, &format!("host-device/{point}"), host_device_gone);
    }
    // DEL killed after the move back, before the alias is cleared: a second DEL clears it.
    let wan = TestNetns::new("wan");
    let rig = Rig::new(&wan);
    let conf = host_device_conf(&rig);
    assert!(rig.call("host-device", "ADD", &conf, "net1", None).success());
    let point = "host-device/del-after-move";
    assert_killed(&rig.call("host-device", "DEL", &conf, "net1", Some(point)), point);
    assert!(rig.call("host-device", "DEL", &conf, "net1", None).success());
    host_device_gone(&rig);
}

fn tap_conf(_: &Rig) -> Value {
    json!({"cniVersion": "1.0.0", "name": "crash-net", "type": "tap", "multiQueue": true,
        "ipam": {"type": "static", "addresses": [{"address": "10.54.0.5/24"}]}})
}

#[test]
fn tap_killed_at_each_step() {
    for point in ["after-ipam", "after-create", "after-addresses"] {
        crash("tap", "tap0", tap_conf, &format!("tap/{point}"), |rig| {
            assert!(rig.pod.netlink().link_by_name("tap0").unwrap().is_none(), "tap left in the pod");
        });
    }
}

fn sbr_conf(rig: &Rig) -> Value {
    json!({"cniVersion": "1.0.0", "name": "crash-net", "type": "sbr", "prevResult": {"cniVersion": "1.0.0",
        "interfaces": [{"name": "eth0", "sandbox": rig.pod.path.display().to_string()}],
        "ips": [{"address": format!("{POD_IP}/24"), "gateway": "10.52.0.1", "interface": 0}]}})
}

#[test]
fn sbr_killed_at_each_step() {
    for point in ["after-rule", "after-routes"] {
        crash("sbr", "eth0", sbr_conf, &format!("sbr/{point}"), |rig| {
            assert!(!rig.pod.ip(&["rule"]).contains(POD_IP), "rule left");
            // The routes copied to table 100 stay, as the reference leaves them: the link's deletion by the
            // interface plugin's DEL removes them, and a new ADD reuses the table.
        });
    }
}

#[test]
fn tap_crash_leaves_the_node_unchanged() {
    let wan = TestNetns::new("wan");
    let rig = Rig::new(&wan);
    let (node_before, pod_before) = rig.settled();
    assert_killed(&rig.call("tap", "ADD", &tap_conf(&rig), "tap0", Some("tap/after-create")), "tap/after-create");
    assert!(rig.call("tap", "DEL", &tap_conf(&rig), "tap0", None).success());
    let (node_after, pod_after) = rig.settled();
    assert_unchanged(&node_before, &node_after);
    assert_unchanged(&pod_before, &pod_after);
}
