//! vrf against the real kernel. On a kernel without VRF support (`CONFIG_NET_VRF`, as on the machines this
//! project is built on) ADD must fail with an error naming it and leave the pod unchanged, and DEL must succeed;
//! that is always tested. On a kernel with VRF support the full path runs instead: the VRF created on the first
//! free table, the pod's eth0 enslaved with its routes moved, CHECK, DEL removing the VRF with its last
//! interface, a second interface sharing the VRF, two VRFs side by side with traffic through each, and the
//! reference 1.1.1 taking over; otherwise the test says plainly that it was skipped (the VM lane runs it).

use std::path::PathBuf;
use std::time::Duration;

use netns_tests::linkrig::{ping_via, skip_with_kind, skip_without_kind};
use netns_tests::snapshot::{assert_unchanged, NodeSnapshot};
use netns_tests::upstream::reference;
use netns_tests::{bin, ip, json, net, pod_rig, unique_name, veth_between, NodeWithPod, PluginOutput, Value};

const POD_IP: &str = "10.47.0.5";

pod_rig!(Rig);

impl Rig {
    fn new() -> Rig {
        Rig { lab: NodeWithPod::with_eth0(&unique_name("vr"), "10.47.0.1/24", &format!("{POD_IP}/24")) }
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
        self.run(&binary, verb, ("vrf1", ifname), None, conf)
    }

    fn ours(&self, verb: &str, conf: &Value) -> PluginOutput {
        self.call(bin("vrf"), verb, conf, "eth0")
    }

    /// A second pod interface `eth1` (10.48.0.5/24, the node's end 10.48.0.1) and the config that puts it
    /// into `vrfname`.
    fn second_interface(&self, vrfname: &str) -> Value {
        veth_between(&self.node, &self.pod, &unique_name("vs"), "eth1", &[net("10.48.0.1/24")], &[net("10.48.0.5/24")]);
        json!({"cniVersion": "1.0.0", "name": "vrf-net", "type": "vrf", "vrfname": vrfname,
            "prevResult": {"cniVersion": "1.0.0",
                "interfaces": [{"name": "eth1", "sandbox": self.pod.path.display().to_string()}],
                "ips": [{"address": "10.48.0.5/24", "interface": 0}]}})
    }

    fn ours_on(&self, ifname: &str, verb: &str, conf: &Value) -> PluginOutput {
        self.call(bin("vrf"), verb, conf, ifname)
    }

    /// The VRF table of `vrf` in the pod, or None when there is no such VRF.
    fn table_of(&self, vrf: &str) -> Option<u64> {
        let out = self.pod.exec("ip", &["-d", "-j", "link", "show", "dev", vrf], &[], b"");
        if !out.status.success() {
            return None;
        }
        let links: Value = serde_json::from_slice(&out.stdout).expect("ip -j");
        links[0]["linkinfo"]["info_data"]["table"].as_u64()
    }

    fn master_of(&self, ifname: &str) -> Value {
        self.pod.ip_json(&["link", "show", ifname])[0]["master"].clone()
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

#[test]
fn two_vrfs_side_by_side_with_traffic_through_each() {
    if skip_without_kind("vrf", "CONFIG_NET_VRF") {
        return;
    }
    let rig = Rig::new();
    let red = rig.second_interface("red");
    let settle = Duration::from_secs(5);
    let before = NodeSnapshot::settled(&rig.pod, &[], settle);
    let blue = rig.conf(json!({}));
    rig.ours("ADD", &blue).expect_ok();
    rig.ours_on("eth1", "ADD", &red).expect_ok();
    // Each VRF on its own first free table, each interface in its VRF, its subnet's route in the VRF's table.
    assert_eq!((rig.table_of("blue"), rig.table_of("red")), (Some(1), Some(2)));
    assert_eq!((rig.master_of("eth0"), rig.master_of("eth1")), (json!("blue"), json!("red")));
    assert!(rig.pod.ip(&["route", "show", "table", "1"]).contains("10.47.0.0/24"));
    assert!(rig.pod.ip(&["route", "show", "table", "2"]).contains("10.48.0.0/24"));
    assert!(!rig.pod.ip(&["route", "show", "table", "main"]).contains("10.4"), "routes left in main");
    // Traffic: each node end is reached through its VRF and only through it.
    assert!(ping_via(&rig.pod, "blue", ip("10.47.0.1")), "no answer through VRF blue");
    assert!(ping_via(&rig.pod, "red", ip("10.48.0.1")), "no answer through VRF red");
    assert!(!ping_via(&rig.pod, "blue", ip("10.48.0.1")), "red's subnet answered through blue");
    assert!(!rig.pod.ping(ip("10.47.0.1")), "the main table reached into VRF blue");
    rig.ours("CHECK", &blue).expect_ok();
    rig.ours_on("eth1", "CHECK", &red).expect_ok();
    // CHECK of the wrong VRF for an interface.
    rig.ours_on("eth1", "CHECK", &blue).expect_err();

    rig.ours("DEL", &blue).expect_ok();
    assert_eq!((rig.table_of("blue"), rig.table_of("red")), (None, Some(2)), "DEL of blue touched red");
    assert!(ping_via(&rig.pod, "red", ip("10.48.0.1")));
    rig.ours_on("eth1", "DEL", &red).expect_ok();
    assert_eq!(rig.table_of("red"), None);
    assert!(rig.pod.ping(ip("10.47.0.1")) && rig.pod.ping(ip("10.48.0.1")), "routes back in main after DEL");
    assert_unchanged(&before, &NodeSnapshot::settled(&rig.pod, &[], settle));
}

#[test]
fn del_removes_the_vrf_with_its_last_interface() {
    if skip_without_kind("vrf", "CONFIG_NET_VRF") {
        return;
    }
    let rig = Rig::new();
    let second = rig.second_interface("blue");
    let first = rig.conf(json!({"table": 42}));
    rig.ours("ADD", &first).expect_ok();
    rig.ours_on("eth1", "ADD", &second).expect_ok();
    assert_eq!(rig.table_of("blue"), Some(42));
    assert_eq!((rig.master_of("eth0"), rig.master_of("eth1")), (json!("blue"), json!("blue")));
    let routes = rig.pod.ip(&["route", "show", "table", "42"]);
    assert!(routes.contains("10.47.0.0/24") && routes.contains("10.48.0.0/24"), "{routes}");
    // A different table for an existing VRF is refused and changes nothing.
    let err = rig.ours_on("eth1", "ADD", &rig.conf(json!({"table": 43}))).expect_err().clone();
    assert!(err["msg"].as_str().unwrap().contains("different routing table 42"), "{err}");
    rig.ours("DEL", &first).expect_ok();
    assert_eq!(rig.table_of("blue"), Some(42), "VRF deleted while eth1 is in it");
    assert!(rig.master_of("eth0").is_null());
    assert!(ping_via(&rig.pod, "blue", ip("10.48.0.1")));
    rig.ours_on("eth1", "DEL", &second).expect_ok();
    assert_eq!(rig.table_of("blue"), None, "VRF left after its last interface");
    rig.ours_on("eth1", "DEL", &second).expect_ok();
}
