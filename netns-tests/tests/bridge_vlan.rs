//! The bridge's VLAN options against a kernel with bridge VLAN filtering (the VM lane's; this machine's kernel
//! lacks it, and there tests/bridge.rs checks the clear error): `vlan` makes the pod's port an access port, so
//! pods on one VLAN reach each other and not another VLAN's pods in the same subnet; `vlanTrunk` makes a trunk
//! port that carries the listed VLANs tagged (a trunk pod with vlan sub-interfaces), with `vlan` as its native
//! VLAN; `preserveDefaultVlan` keeps or drops the bridge's default VLAN on the port (reference v1.8
//! semantics: dropped unless set), read back with `bridge -j vlan show`; DEL leaves the bridge's VLAN table as
//! it was; the reference bridge 1.1.1 (which knows `vlan` only) takes over our attachments and we take over
//! its. A bridge that exists without VLAN filtering would not keep VLANs apart: VLAN options on it are refused.

use std::net::IpAddr;
use std::time::Duration;

use netns_tests::linkrig::{
    bridge_vlans, link_details, ping_via, result_address, skip_without_kind, with_fields, Impl, LinkRig,
};
use netns_tests::snapshot::{assert_unchanged, NodeSnapshot};
use netns_tests::{assert_no_ping, assert_ping, ip, json, TestNetns, Value};

const BRIDGE: &str = "cbrv";
const SUBNET: &str = "10.60.0.0/24";
const CONFIG: &str = "CONFIG_BRIDGE_VLAN_FILTERING";

fn conf(rig: &LinkRig, extra: Value) -> Value {
    let conf = json!({"cniVersion": "1.0.0", "name": rig.network, "type": "bridge", "bridge": BRIDGE,
        "ipam": rig.ipam(SUBNET)});
    with_fields(conf, &extra)
}

/// The node's end of a pod's veth, from the bridge's result (bridge, host veth, pod interface).
fn host_port(result: &Value) -> String {
    result["interfaces"][1]["name"].as_str().unwrap_or_else(|| panic!("no host veth in {result}")).to_string()
}

/// The whole VLAN table of the node's bridges (`bridge -j vlan show`).
fn vlan_table(node: &TestNetns) -> String {
    let out = node.exec("bridge", &["-j", "vlan", "show"], &[], b"");
    assert!(out.status.success(), "bridge vlan show: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A tagged sub-interface `eth0.<id>` of the pod's eth0 with `address`.
fn sub_interface(pod: &TestNetns, id: u16, address: &str) {
    let name = format!("eth0.{id}");
    pod.ip(&["link", "add", "link", "eth0", "name", &name, "type", "vlan", "id", &id.to_string()]);
    pod.ip(&["addr", "add", address, "dev", &name]);
    pod.ip(&["link", "set", &name, "up"]);
}

struct Attached {
    pod: TestNetns,
    id: String,
    conf: Value,
    result: Value,
}

impl Attached {
    fn new(rig: &LinkRig, which: Impl, id: &str, conf: Value) -> Attached {
        let pod = rig.node.pod_netns();
        let result = rig.add(which, &pod, id, &conf);
        Attached { pod, id: id.to_string(), conf, result }
    }

    fn address(&self) -> IpAddr {
        result_address(&self.result, 0)
    }

    fn port_vlans(&self, rig: &LinkRig) -> Vec<String> {
        bridge_vlans(&rig.node, &host_port(&self.result))
    }

    fn del(self, rig: &LinkRig) {
        rig.check(Impl::Ours, &self.pod, &self.id, &self.conf, &self.result).expect_ok();
        rig.del(Impl::Ours, Some(&self.pod.path), &self.id, &self.conf, &self.result);
        assert!(!self.pod.links().contains(&"eth0".to_string()), "{}", self.id);
    }
}

#[test]
fn access_ports_reach_their_vlan_only_and_del_restores_the_vlan_table() {
    if skip_without_kind("bridge_vlan_filtering", CONFIG) {
        return;
    }
    let rig = LinkRig::new("bridge");
    let a = Attached::new(&rig, Impl::Ours, "a", conf(&rig, json!({"vlan": 100})));
    let bridge = link_details(&rig.node, BRIDGE).expect("bridge");
    assert_eq!(bridge["linkinfo"]["info_data"]["vlan_filtering"].as_u64(), Some(1), "{bridge}");
    let table = vlan_table(&rig.node);
    let before = NodeSnapshot::settled(&rig.node, &[], Duration::from_secs(5));
    let b = Attached::new(&rig, Impl::Ours, "b", conf(&rig, json!({"vlan": 100})));
    // Same subnet, another VLAN: only the bridge's VLAN filtering keeps it apart.
    let c = Attached::new(&rig, Impl::Ours, "c", conf(&rig, json!({"vlan": 200})));
    assert_eq!(a.port_vlans(&rig), ["100 pvid untagged"]);
    assert_eq!(c.port_vlans(&rig), ["200 pvid untagged"]);
    assert_ping(&a.pod, b.address());
    assert_ping(&b.pod, a.address());
    assert_no_ping(&a.pod, c.address());
    assert_no_ping(&c.pod, b.address());
    // Last in, first out: see trunk_ports_carry_the_listed_vlans.
    c.del(&rig);
    b.del(&rig);
    assert_eq!(vlan_table(&rig.node), table, "DEL changed the bridge's VLAN table");
    assert_unchanged(&before, &NodeSnapshot::take(&rig.node, &[]));
    a.del(&rig);
    assert!(rig.leases().is_empty(), "{:?}", rig.leases());
}

#[test]
fn trunk_ports_carry_the_listed_vlans() {
    if skip_without_kind("bridge_vlan_filtering", CONFIG) {
        return;
    }
    let rig = LinkRig::new("bridge");
    let a = Attached::new(&rig, Impl::Ours, "a", conf(&rig, json!({"vlan": 100})));
    let c = Attached::new(&rig, Impl::Ours, "c", conf(&rig, json!({"vlan": 200})));
    let d = Attached::new(&rig, Impl::Ours, "d", conf(&rig, json!({"vlan": 300})));
    let table = vlan_table(&rig.node);

    // A trunk of 100 and 200, layer 2 only: the pod tags its own traffic.
    let trunk = conf(&rig, json!({"vlanTrunk": [{"id": 100}, {"minID": 200, "maxID": 200}], "ipam": null}));
    let t = Attached::new(&rig, Impl::Ours, "t", trunk);
    assert_eq!(t.port_vlans(&rig), ["100", "200"]);
    sub_interface(&t.pod, 100, "10.60.0.250/24");
    sub_interface(&t.pod, 200, "10.60.0.251/24");
    sub_interface(&t.pod, 300, "10.60.0.252/24");
    assert!(ping_via(&t.pod, "eth0.100", a.address()), "VLAN 100 through the trunk");
    assert!(ping_via(&t.pod, "eth0.200", c.address()), "VLAN 200 through the trunk");
    assert!(!ping_via(&t.pod, "eth0.200", a.address()), "VLAN 100's pod answered on 200");
    assert!(!ping_via(&t.pod, "eth0.300", d.address()), "VLAN 300 is not on the trunk");
    t.del(&rig);

    // A trunk with a native VLAN: untagged traffic in 100, tagged 200 and 201.
    let native = conf(&rig, json!({"vlan": 100, "vlanTrunk": [{"minID": 200, "maxID": 201}]}));
    let n = Attached::new(&rig, Impl::Ours, "n", native);
    assert_eq!(n.port_vlans(&rig), ["100 pvid untagged", "200", "201"]);
    assert_ping(&n.pod, a.address());
    sub_interface(&n.pod, 200, "10.60.1.1/24");
    c.pod.ip(&["addr", "add", "10.60.1.2/24", "dev", "eth0"]);
    assert_ping(&n.pod, ip("10.60.1.2"));
    assert_no_ping(&n.pod, d.address());
    n.del(&rig);
    assert_eq!(vlan_table(&rig.node), table, "DEL changed the bridge's VLAN table");
    // Last in, first out: without a gateway address the bridge's MAC is its lowest port's (the kernel's rule,
    // which the reference keeps too), so CHECK matches each result only while the ports are those of its ADD.
    for pod in [d, c, a] {
        pod.del(&rig);
    }
    assert!(rig.leases().is_empty(), "{:?}", rig.leases());
}

#[test]
fn preserve_default_vlan_keeps_or_drops_the_default_vlan() {
    if skip_without_kind("bridge_vlan_filtering", CONFIG) {
        return;
    }
    let rig = LinkRig::new("bridge");
    for (extra, expected) in [
        (json!({"vlan": 100}), vec!["100 pvid untagged"]),
        (json!({"vlan": 100, "preserveDefaultVlan": false}), vec!["100 pvid untagged"]),
        (json!({"vlan": 100, "preserveDefaultVlan": true}), vec!["1 untagged", "100 pvid untagged"]),
        (json!({"vlanTrunk": [{"id": 7}], "preserveDefaultVlan": true}), vec!["1 pvid untagged", "7"]),
        (json!({"vlanTrunk": [{"id": 7}]}), vec!["7"]),
        (json!({}), vec!["1 pvid untagged"]),
    ] {
        let p = Attached::new(&rig, Impl::Ours, "p", conf(&rig, extra.clone()));
        assert_eq!(p.port_vlans(&rig), expected, "{extra}");
        p.del(&rig);
    }
    assert!(rig.leases().is_empty(), "{:?}", rig.leases());
}

#[test]
fn takeover_both_ways_with_the_reference() {
    if skip_without_kind("bridge_vlan_filtering", CONFIG) {
        return;
    }
    let rig = LinkRig::new("bridge");
    // A peer on VLAN 100 (its own network and range, so that the takeover's leases stay apart).
    let mut peer_conf = conf(&rig, json!({"vlan": 100}));
    peer_conf["name"] = format!("{}-peer", rig.network).into();
    peer_conf["ipam"]["ranges"] = json!([[{"subnet": SUBNET, "rangeStart": "10.60.0.200"}]]);
    let peer = Attached::new(&rig, Impl::Ours, "peer", peer_conf);
    let other = Attached::new(&rig, Impl::Ours, "other", {
        let mut c = peer.conf.clone();
        c["vlan"] = 200.into();
        c
    });
    let table = vlan_table(&rig.node);
    let conf = conf(&rig, json!({"vlan": 100}));
    let after_add = |adder: Impl, pod: &TestNetns| {
        assert_ping(pod, peer.address());
        assert_no_ping(pod, other.address());
        let _ = adder;
    };
    rig.takeover_both_ways(&conf, after_add, |_, _| assert_eq!(vlan_table(&rig.node), table));
    other.del(&rig);
    peer.del(&rig);
}

/// A bridge that exists without VLAN filtering (made by a network without VLANs, or by hand) does not keep
/// VLANs apart: `vlan` and `vlanTrunk` on it are refused before anything changes, and the bridge keeps its
/// setting. The reference makes such pods, and two of different VLANs reach each other.
#[test]
fn vlans_on_a_bridge_without_vlan_filtering_are_refused() {
    if skip_without_kind("bridge_vlan_filtering", CONFIG) {
        return;
    }
    let rig = LinkRig::new("bridge");
    // Another network on the same bridge, without VLANs: it makes the bridge (its lease is not the refused
    // ADDs' to leave behind).
    let plain = Attached::new(&rig, Impl::Ours, "plain", conf(&rig, json!({"name": "plain-net"})));
    for extra in [json!({"vlan": 100}), json!({"vlanTrunk": [{"id": 101}]})] {
        rig.assert_refused(&conf(&rig, extra), &["exists without VLAN filtering", "\"cbrv\"", "vlan_filtering 1"]);
    }
    let bridge = link_details(&rig.node, BRIDGE).expect("bridge");
    assert_eq!(bridge["linkinfo"]["info_data"]["vlan_filtering"].as_u64(), Some(0), "{bridge}");

    let reference = |id: &str, vlan: u16| Attached::new(&rig, Impl::Reference, id, conf(&rig, json!({"vlan": vlan})));
    let (a, c) = (reference("ra", 100), reference("rc", 200));
    assert_ping(&a.pod, c.address());
    for attached in [a, c] {
        rig.del(Impl::Reference, Some(&attached.pod.path), &attached.id, &attached.conf, &attached.result);
    }
    plain.del(&rig);
}
