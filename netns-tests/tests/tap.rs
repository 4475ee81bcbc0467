//! tap against the real kernel: ADD makes a persistent tap in the pod with the requested flags, owner, group,
//! MTU and MAC (read back with `ip -d link`), addresses from static IPAM, or as a port of a bridge inside the pod;
//! CHECK passes and sees drift; DEL removes it, twice and without the netns; every spec version; a failed ADD
//! and bad configs leave the pod unchanged. (The reference 1.1.1 has no tap: no takeover test.)

use netns_tests::cnicore::spec::SUPPORTED_VERSIONS;
use netns_tests::snapshot::{assert_unchanged, NodeSnapshot};
use netns_tests::{bin, json, pod_rig, with_prev, NodeWithPod, PluginOutput, Value};

const CONTAINER: &str = "tap1";
const POD_ADDR: &str = "10.45.0.5/24";
const UID: u32 = 54321;
const GID: u32 = 54322;

pod_rig!(Rig);

impl Rig {
    fn new() -> Rig {
        Rig { lab: NodeWithPod::new() }
    }

    fn call(&self, verb: &str, conf: &Value, netns: Option<&str>, ifname: &str) -> PluginOutput {
        self.run(&bin("tap"), verb, (CONTAINER, ifname), netns, conf)
    }

    fn ours(&self, verb: &str, conf: &Value) -> PluginOutput {
        self.call(verb, conf, None, "tap0")
    }

    fn details(&self, name: &str) -> Value {
        self.pod.ip_json(&["-d", "link", "show", "dev", name])[0].clone()
    }
}

fn conf(version: &str) -> Value {
    json!({"cniVersion": version, "name": "tap-net", "type": "tap",
        "ipam": {"type": "static", "addresses": [{"address": POD_ADDR}]}})
}

#[test]
fn tap_with_options_and_addresses() {
    let rig = Rig::new();
    let mut conf = conf("1.1.0");
    conf["multiQueue"] = json!(true);
    conf["owner"] = json!(UID);
    conf["group"] = json!(GID);
    conf["mtu"] = json!(1400);
    conf["mac"] = json!("02:11:22:33:44:55");
    let result = rig.ours("ADD", &conf).expect_ok().clone();
    assert_eq!(
        result["interfaces"],
        json!([{"name": "tap0", "mac": "02:11:22:33:44:55", "sandbox": rig.pod.path.display().to_string()}])
    );
    assert_eq!(result["ips"], json!([{"address": POD_ADDR, "interface": 0}]));
    let link = rig.details("tap0");
    let info = &link["linkinfo"];
    assert_eq!(info["info_kind"], "tun", "{link}");
    let data = &info["info_data"];
    assert_eq!(
        (&data["type"], &data["pi"], &data["vnet_hdr"], &data["multi_queue"], &data["persist"]),
        (&json!("tap"), &json!(false), &json!(true), &json!(true), &json!(true)),
        "{data}"
    );
    assert_eq!((&data["user"], &data["group"]), (&json!(UID), &json!(GID)), "{data}");
    assert_eq!(link["mtu"], 1400);
    assert!(link["flags"].as_array().unwrap().contains(&json!("UP")), "{link}");
    assert!(rig.pod.ip(&["-4", "addr", "show", "dev", "tap0"]).contains(POD_ADDR));

    rig.ours("CHECK", &with_prev(&conf, &result)).expect_ok();
    rig.pod.ip(&["link", "set", "tap0", "address", "02:11:22:33:44:66"]);
    let e = rig.ours("CHECK", &with_prev(&conf, &result)).expect_err().clone();
    assert!(e["msg"].as_str().unwrap().contains("Mac"), "{e}");

    rig.ours("DEL", &conf).expect_ok();
    assert!(rig.pod.netlink().link_by_name("tap0").unwrap().is_none(), "tap left after DEL");
    rig.ours("DEL", &conf).expect_ok();
    rig.call("DEL", &conf, Some(""), "tap0").expect_ok();
    rig.call("DEL", &conf, Some("/run/netns/no-such-netns"), "tap0").expect_ok();
}

#[test]
fn tap_without_ipam_as_a_bridge_port_in_the_pod() {
    let rig = Rig::new();
    rig.pod.ip(&["link", "add", "br0", "type", "bridge"]);
    let conf = json!({"cniVersion": "1.0.0", "name": "tap-net", "type": "tap", "bridge": "br0"});
    let result = rig.ours("ADD", &conf).expect_ok().clone();
    assert!(result.get("ips").is_none(), "{result}");
    let link = rig.details("tap0");
    assert_eq!(link["master"], "br0", "{link}");
    let data = &link["linkinfo"]["info_data"];
    assert_eq!((&data["pi"], &data["vnet_hdr"], &data["multi_queue"]), (&json!(false), &json!(false), &json!(false)));
    rig.ours("CHECK", &with_prev(&conf, &result)).expect_ok();
    rig.ours("DEL", &conf).expect_ok();
    assert!(rig.pod.netlink().link_by_name("tap0").unwrap().is_none());
    assert!(rig.pod.netlink().link_by_name("br0").unwrap().is_some(), "the pod's bridge stays");
}

#[test]
fn every_spec_version() {
    let rig = Rig::new();
    for version in SUPPORTED_VERSIONS {
        let conf = conf(version);
        let result = rig.ours("ADD", &conf).expect_result_in(version);
        if !["0.1.0", "0.2.0", "0.3.0", "0.3.1"].contains(version) {
            rig.ours("CHECK", &with_prev(&conf, &result)).expect_ok();
        }
        rig.ours("DEL", &conf).expect_ok();
        assert!(rig.pod.netlink().link_by_name("tap0").unwrap().is_none(), "{version}");
    }
}

#[test]
fn failures_leave_the_pod_unchanged() {
    let rig = Rig::new();
    let pod_before = NodeSnapshot::take(&rig.pod, &[]);
    let node_before = NodeSnapshot::take(&rig.node, &[]);
    let mut unreachable = conf("1.0.0");
    unreachable["ipam"]["routes"] = json!([{"dst": "10.99.0.0/16", "gw": "10.98.0.1"}]);
    let cases: Vec<(Value, &str)> = vec![
        (unreachable, "route"),
        (json!({"cniVersion": "1.0.0", "name": "t", "type": "tap", "bridge": "nobr"}), "nobr"),
        (json!({"cniVersion": "1.0.0", "name": "t", "type": "tap", "mtu": 10}), "mtu"),
        (json!({"cniVersion": "1.0.0", "name": "t", "type": "tap", "mac": "zz"}), "MAC"),
        (json!({"cniVersion": "1.0.0", "name": "t", "type": "tap", "ipam": {"type": "no-such-ipam"}}), "no-such-ipam"),
    ];
    for (conf, needle) in cases {
        let e = rig.ours("ADD", &conf).expect_err().clone();
        assert!(e["msg"].as_str().unwrap_or_default().contains(needle), "{conf}: {e}");
        assert_unchanged(&pod_before, &NodeSnapshot::take(&rig.pod, &[]));
    }
    assert_unchanged(&node_before, &NodeSnapshot::take(&rig.node, &[]));
    // A link of that name that is not a tap: ADD refuses, DEL leaves it.
    rig.pod.ip(&["link", "add", "tap0", "type", "bridge"]);
    let e = rig.ours("ADD", &conf("1.0.0")).expect_err().clone();
    assert!(e["msg"].as_str().unwrap().contains("already exists"), "{e}");
    rig.ours("DEL", &conf("1.0.0")).expect_ok();
    assert!(rig.pod.netlink().link_by_name("tap0").unwrap().is_some());
}
