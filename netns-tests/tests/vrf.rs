//! vrf against the real kernel. On a kernel without VRF support (`CONFIG_NET_VRF`, as on the machines this
//! project is built on) ADD must fail with an error naming it and leave the pod unchanged, and DEL must succeed;
//! that is always tested. On a kernel with VRF support the full path runs instead: the VRF created on the first
//! free table, the pod's eth0 enslaved with its routes moved, CHECK, DEL removing the VRF with its last
//! interface, a second interface sharing the VRF, and the reference 1.1.1 taking over; otherwise the test says
//! plainly that it was skipped.

use std::path::PathBuf;
use std::time::Duration;

use netns_tests::linkrig::{skip_with_kind, skip_without_kind};
use netns_tests::snapshot::{assert_unchanged, NodeSnapshot};
use netns_tests::upstream::reference;
use netns_tests::{bin, json, run_for_pod, unique_name, Node, PluginOutput, TestNetns, Value};

const POD_IP: &str = "10.47.0.5";

struct Rig {
    node: Node,
    pod: TestNetns,
}

impl Rig {
    fn new() -> Rig {
        let node = Node::new();
        let pod = node.pod_with_eth0(&unique_name("vr"), "10.47.0.1/24", &format!("{POD_IP}/24"));
        Rig { node, pod }
    }

    fn conf(&self, extra: Value) -> Value {
        let mut conf = json!({"cniVersion": "1.0.0", "name": "vrf-net", "type": "vrf", "vrfname": "blue",
            "prevResult": {"cniVersion": "1.0.0",
                "interfaces": [{"name": "eth0", "sandbox": self.pod.path.display().to_string()}],
                "ips": [{"address": format!("{POD_IP}/24"), "interface": 0}]}});
        conf.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        conf
    }

    fn call(&self, binary: PathBuf, verb: &str, conf: &Value, ifname: &str) -> PluginOutput {
        run_for_pod(&self.node, &self.pod, &binary, verb, ("vrf1", ifname), None, conf)
    }

    fn ours(&self, verb: &str, conf: &Value) -> PluginOutput {
        self.call(bin("vrf"), verb, conf, "eth0")
    }
}

#[test]
fn without_kernel_support_a_clear_error_and_nothing_changed() {
    if skip_with_kind("vrf", "VRF support") {
        return;
    }
    let rig = Rig::new();
    let before = NodeSnapshot::settled(&rig.pod, &[], Duration::from_secs(5));
    for conf in [rig.conf(json!({})), rig.conf(json!({"table": 1000}))] {
        let e = rig.ours("ADD", &conf).expect_err().clone();
        let msg = e["msg"].as_str().unwrap();
        assert!(msg.contains("this kernel has no VRF support (CONFIG_NET_VRF)"), "{e}");
        assert_unchanged(&before, &NodeSnapshot::take(&rig.pod, &[]));
    }
    rig.ours("DEL", &rig.conf(json!({}))).expect_ok();
    assert!(rig.ours("CHECK", &rig.conf(json!({}))).expect_err()["msg"].as_str().unwrap().contains("not found"));
    // Refusals before the kernel is asked anything.
    for (conf, needle) in [
        (json!({"cniVersion": "1.0.0", "name": "vrf-net", "type": "vrf", "vrfname": "blue"}), "prevResult"),
        (rig.conf(json!({"vrfname": ""})), "vrf name"),
        (rig.conf(json!({"vrfname": "eth0"})), "not a VRF"),
    ] {
        let e = rig.ours("ADD", &conf).expect_err().clone();
        assert!(e["msg"].as_str().unwrap().contains(needle), "{e}");
        assert_unchanged(&before, &NodeSnapshot::take(&rig.pod, &[]));
    }
}

#[test]
fn with_kernel_support_the_interface_in_its_vrf() {
    if skip_without_kind("vrf", "CONFIG_NET_VRF") {
        return;
    }
    let rig = Rig::new();
    rig.pod.ip(&["route", "add", "10.48.0.0/16", "via", "10.47.0.1", "src", POD_IP]);
    let conf = rig.conf(json!({}));
    rig.ours("ADD", &conf).expect_ok();
    let vrf = rig.pod.ip_json(&["-d", "link", "show", "blue"]);
    assert_eq!(vrf[0]["linkinfo"]["info_data"]["table"], 1, "{vrf}");
    let eth0 = rig.pod.ip_json(&["link", "show", "eth0"]);
    assert_eq!(eth0[0]["master"], "blue");
    assert!(rig.pod.ip(&["route", "show", "table", "1"]).contains("10.48.0.0/16"));
    rig.ours("CHECK", &conf).expect_ok();
    rig.ours("DEL", &conf).expect_ok();
    assert!(rig.pod.netlink().link_by_name("blue").unwrap().is_none(), "VRF left after its last interface");
    rig.ours("DEL", &conf).expect_ok();

    // Takeover: the reference's VRF, our DEL; ours, the reference's DEL.
    let theirs = reference("vrf");
    rig.call(theirs.clone(), "ADD", &conf, "eth0").expect_ok();
    rig.ours("CHECK", &conf).expect_ok();
    rig.ours("DEL", &conf).expect_ok();
    assert!(rig.pod.netlink().link_by_name("blue").unwrap().is_none());
    rig.ours("ADD", &conf).expect_ok();
    rig.call(theirs, "DEL", &conf, "eth0").expect_ok();
    assert!(rig.pod.netlink().link_by_name("blue").unwrap().is_none());
}
