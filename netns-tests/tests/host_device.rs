//! host-device (with static IPAM) against the real kernel. The "device" is one end of a veth pair between the
//! test's node and a "wan" namespace, so the moved device carries real traffic: ADD moves it into the pod as
//! `eth0` with the static address, the pod pings the wan through it, CHECK passes, DEL brings it back to the
//! node under its name with its address and up state (no alias left, no record left), a second DEL and a DEL without the
//! netns succeed. Also: every spec version, selection by MAC, a failed ADD (the device back with its addresses
//! and up state), bad selectors (node unchanged), and takeover both ways with the reference 1.1.1 binary.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use netns_tests::cnicore::spec::SUPPORTED_VERSIONS;
use netns_tests::snapshot::{assert_unchanged, NodeSnapshot};
use netns_tests::upstream::reference;
use netns_tests::{
    assert_ping, bin, json, net, pod_rig, unique_name, veth_between, with_prev, NodeWithPod, PluginOutput, TestNetns,
    Value,
};

const CONTAINER: &str = "hostdev1";
const NODE_ADDR: &str = "10.44.0.2/24";
const WAN_ADDR: &str = "10.44.0.1";
const POD_ADDR: &str = "10.44.0.5/24";

pod_rig!(Rig {
    wan: TestNetns,
    /// The device's name in the node.
    device: String,
});

impl Rig {
    fn new() -> Rig {
        let lab = NodeWithPod::new();
        let wan = TestNetns::new("wan");
        let device = unique_name("hd");
        veth_between(
            &lab.node,
            &wan,
            &device,
            &unique_name("hw"),
            &[net(NODE_ADDR)],
            &[net(&format!("{WAN_ADDR}/24"))],
        );
        Rig { lab, wan, device }
    }

    fn conf(&self, version: &str) -> Value {
        json!({"cniVersion": version, "name": "hd-net", "type": "host-device", "device": self.device,
            "dataDir": self.data_dir(),
            "ipam": {"type": "static", "addresses": [{"address": POD_ADDR}]},
            "dns": {"nameservers": ["10.44.0.53"]}})
    }

    fn call(&self, binary: PathBuf, verb: &str, conf: &Value, netns: Option<&str>) -> PluginOutput {
        self.run(&binary, verb, (CONTAINER, "eth0"), netns, conf)
    }

    fn ours(&self, verb: &str, conf: &Value) -> PluginOutput {
        self.call(bin("host-device"), verb, conf, None)
    }

    /// The alias of `name` in `ns` (`ip -j link` shows `ifalias`).
    fn alias(ns: &TestNetns, name: &str) -> Option<String> {
        let links = ns.ip_json(&["link", "show", "dev", name]);
        links[0]["ifalias"].as_str().map(str::to_string)
    }

    fn assert_in_pod(&self) {
        let link = self.pod.netlink().require_link("eth0").expect("eth0 in the pod");
        assert!(link.up, "eth0 down in the pod");
        assert_eq!(Rig::alias(&self.pod, "eth0").as_deref(), Some(self.device.as_str()), "alias holds the name");
        assert!(self.node.netlink().link_by_name(&self.device).unwrap().is_none(), "device still in the node");
    }

    fn data_dir(&self) -> PathBuf {
        self.node.dir().join("host-device")
    }

    /// Back in the node under its name, without alias; as it was (up, its address) when our ADD recorded it.
    fn assert_back_in_node(&self) {
        self.assert_back_as(true);
        let addresses = self.node.ip(&["-4", "addr", "show", "dev", &self.device]);
        assert!(addresses.contains(NODE_ADDR), "the device's address not given back: {addresses}");
        let records = std::fs::read_dir(self.data_dir()).map(|d| d.count()).unwrap_or(0);
        assert_eq!(records, 0, "a record left in {}", self.data_dir().display());
    }

    fn assert_back_as(&self, up: bool) {
        assert!(self.pod.netlink().link_by_name("eth0").unwrap().is_none(), "eth0 still in the pod");
        let link = self.node.netlink().require_link(&self.device).expect("device back in the node");
        assert_eq!(link.up, up, "up state of the device back in the node");
        assert_eq!(Rig::alias(&self.node, &self.device), None, "alias cleared");
    }
}

#[test]
fn moves_the_device_in_and_back() {
    let rig = Rig::new();
    let conf = rig.conf("1.1.0");
    let result = rig.ours("ADD", &conf).expect_ok().clone();
    rig.assert_in_pod();
    let mac = rig.pod.netlink().require_link("eth0").unwrap().mac.map(|m| netns_tests::cnicore::mac::format(&m));
    assert_eq!(
        result["interfaces"],
        json!([{"name": "eth0", "mac": mac.unwrap(), "sandbox": rig.pod.path.display().to_string()}])
    );
    assert_eq!(result["ips"], json!([{"address": POD_ADDR, "interface": 0}]));
    assert_eq!(result["dns"], json!({"nameservers": ["10.44.0.53"]}));
    assert!(rig.pod.ip(&["-4", "addr", "show", "dev", "eth0"]).contains(POD_ADDR));
    assert_ping(&rig.pod, WAN_ADDR.parse::<IpAddr>().unwrap());

    rig.ours("CHECK", &with_prev(&conf, &result)).expect_ok();
    // CHECK sees the address go.
    rig.pod.ip(&["addr", "del", POD_ADDR, "dev", "eth0"]);
    let e = rig.ours("CHECK", &with_prev(&conf, &result)).expect_err().clone();
    assert!(e["msg"].as_str().unwrap().contains("Failed to match addr"), "{e}");

    rig.ours("DEL", &conf).expect_ok();
    rig.assert_back_in_node();
    rig.ours("DEL", &conf).expect_ok();
    rig.call(bin("host-device"), "DEL", &conf, Some("")).expect_ok();
    rig.call(bin("host-device"), "DEL", &conf, Some("/run/netns/no-such-netns")).expect_ok();
}

#[test]
fn every_spec_version() {
    let rig = Rig::new();
    for version in SUPPORTED_VERSIONS {
        let conf = rig.conf(version);
        let result = rig.ours("ADD", &conf).expect_result_in(version);
        let address = if version.starts_with("0.1") || version.starts_with("0.2") {
            &result["ip4"]["ip"]
        } else {
            &result["ips"][0]["address"]
        };
        assert_eq!(address, POD_ADDR, "{version}: {result}");
        rig.assert_in_pod();
        if !["0.1.0", "0.2.0", "0.3.0", "0.3.1"].contains(version) {
            rig.ours("CHECK", &with_prev(&conf, &result)).expect_ok();
        }
        rig.ours("DEL", &conf).expect_ok();
        rig.assert_back_in_node();
    }
}

#[test]
fn selects_by_mac_without_ipam() {
    let rig = Rig::new();
    let mac = rig.node.netlink().require_link(&rig.device).unwrap().mac.unwrap();
    let mac = netns_tests::cnicore::mac::format(&mac);
    let conf = json!({"cniVersion": "1.0.0", "name": "hd-net", "type": "host-device", "hwaddr": mac.to_uppercase(),
        "dataDir": rig.data_dir()});
    let result = rig.ours("ADD", &conf).expect_ok().clone();
    rig.assert_in_pod();
    assert_eq!(result["interfaces"][0]["mac"], mac);
    assert!(result.get("ips").is_none(), "{result}");
    rig.ours("DEL", &conf).expect_ok();
    rig.assert_back_in_node();
}

#[test]
fn a_failed_add_leaves_the_node_unchanged() {
    let rig = Rig::new();
    let before = NodeSnapshot::settled(&rig.node, &[], Duration::from_secs(5));
    let pod_before = NodeSnapshot::settled(&rig.pod, &[], Duration::from_secs(5));
    // An IPAM result the pod cannot take: the route's gateway is unreachable from the address.
    let mut conf = rig.conf("1.0.0");
    conf["ipam"]["routes"] = json!([{"dst": "10.99.0.0/16", "gw": "10.98.0.1"}]);
    let e = rig.ours("ADD", &conf).expect_err().clone();
    assert!(e["msg"].as_str().unwrap().contains("route"), "{e}");
    assert_unchanged(&before, &NodeSnapshot::take(&rig.node, &[]));
    assert_unchanged(&pod_before, &NodeSnapshot::take(&rig.pod, &[]));
    assert_eq!(Rig::alias(&rig.node, &rig.device), None);

    let cases = [
        json!({"device": "no-such-dev"}),
        json!({"hwaddr": "02:de:ad:be:ef:01"}),
        json!({"kernelpath": "/sys/devices/no/such/device"}),
        json!({"pciBusID": "0000:ff:1f.7"}),
        json!({"kernelpath": "/etc/passwd"}),
        json!({"device": "lo"}),
        json!({}),
    ];
    for case in cases {
        let mut conf =
            json!({"cniVersion": "1.0.0", "name": "hd-net", "type": "host-device", "dataDir": rig.data_dir()});
        conf.as_object_mut().unwrap().extend(case.as_object().unwrap().clone());
        let e = rig.ours("ADD", &conf).expect_err().clone();
        eprintln!("{case}: {e}");
        assert_unchanged(&before, &NodeSnapshot::take(&rig.node, &[]));
    }
    // CNI_IFNAME already taken in the pod.
    rig.pod.ip(&["link", "add", "eth0", "type", "bridge"]);
    let e = rig.ours("ADD", &rig.conf("1.0.0")).expect_err().clone();
    assert!(e["msg"].as_str().unwrap().contains("already exists"), "{e}");
    assert_unchanged(&before, &NodeSnapshot::take(&rig.node, &[]));
}

#[test]
fn takeover_both_ways_with_the_reference() {
    let rig = Rig::new();
    let conf = json!({"cniVersion": "0.4.0", "name": "hd-net", "type": "host-device", "device": rig.device,
        "dataDir": rig.data_dir()});
    let theirs = reference("host-device");
    // Theirs moved it in: ours CHECKs and moves it back.
    let result = rig.call(theirs.clone(), "ADD", &conf, None).expect_ok().clone();
    rig.assert_in_pod();
    rig.ours("CHECK", &with_prev(&conf, &result)).expect_ok();
    rig.ours("DEL", &conf).expect_ok();
    // No record of ours: down and bare, as the reference brings it back.
    rig.assert_back_as(false);
    // Ours moved it in: theirs CHECKs and moves it back (1.1.1 leaves the alias on the device).
    let result = rig.ours("ADD", &conf).expect_ok().clone();
    rig.call(theirs.clone(), "CHECK", &with_prev(&conf, &result), None).expect_ok();
    rig.call(theirs, "DEL", &conf, None).expect_ok();
    assert!(rig.node.netlink().link_by_name(&rig.device).unwrap().is_some(), "device back in the node");
    assert!(rig.pod.netlink().link_by_name("eth0").unwrap().is_none());
    drop(rig.wan);
}

#[test]
fn gc_removes_the_records_of_attachments_that_are_gone() {
    let rig = Rig::new();
    let conf = rig.conf("1.1.0");
    rig.ours("ADD", &conf).expect_ok();
    let records = || std::fs::read_dir(rig.data_dir()).map(|d| d.count()).unwrap_or(0);
    assert_eq!(records(), 1);
    let mut gc = conf.clone();
    gc["cni.dev/valid-attachments"] = json!([{"containerID": CONTAINER, "ifname": "eth0"}]);
    rig.ours("GC", &gc).expect_ok();
    assert_eq!(records(), 1, "the record of a valid attachment is kept");
    gc["cni.dev/valid-attachments"] = json!([]);
    rig.ours("GC", &gc).expect_ok();
    assert_eq!(records(), 0, "the record of an attachment not in the list is removed");
    // Without its record, DEL brings the device back as the reference would: down and bare.
    rig.ours("DEL", &conf).expect_ok();
    rig.assert_back_as(false);
}
