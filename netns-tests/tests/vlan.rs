//! The vlan plugin against the real kernel. This kernel may lack 802.1Q (CONFIG_VLAN_8021Q): then ADD must
//! fail with an error naming the missing support and leave the node and the pod unchanged (tested here on every
//! kernel without it), and the traffic tests print that they were skipped. With 8021q: a pod on VLAN 100 of the
//! node's uplink reaches the lan's VLAN 100 interface, MTU, CHECK (and a wrong vlanId), DEL leaves nothing,
//! every spec version, tagged traffic reaching a peer on the same VLAN id and not one on another id (each
//! peer alone in a namespace on its own vlan link of the lan), `linkInContainer`, takeover both ways with the
//! reference vlan 1.1.1 (with traffic), DEL leaving the node as it was.

use std::time::Duration;

use netns_tests::linkrig::{
    lan_vlan_peer, link_details, skip_with_kind, skip_without_kind, with_fields, Impl, LinkRig, UPLINK,
};
use netns_tests::snapshot::{assert_unchanged, NodeSnapshot};
use netns_tests::{assert_no_ping, assert_ping, json, veth_between, TestNetns, Value};

const SUBNET: &str = "10.30.100.0/24";
const LAN_VLAN_HOST: &str = "10.30.100.254";

fn conf(rig: &LinkRig, version: &str, extra: Value) -> Value {
    let conf = json!({
        "cniVersion": version, "name": rig.network, "type": "vlan", "master": UPLINK, "vlanId": 100,
        "ipam": rig.ipam(SUBNET),
    });
    with_fields(conf, &extra)
}

#[test]
fn without_kernel_support_add_is_a_clear_error_and_changes_nothing() {
    if skip_with_kind("vlan", "8021q") {
        return;
    }
    let rig = LinkRig::new("vlan");
    let conf = |version: &str| conf(&rig, version, json!({"mtu": 1400}));
    rig.assert_missing_support("this kernel has no vlan support (CONFIG_VLAN_8021Q)", conf);
}

#[test]
fn master_and_mtu_are_checked_before_anything_changes() {
    let rig = LinkRig::new("vlan");
    let pod = rig.node.pod_netns();
    let settle = std::time::Duration::from_secs(5);
    let before = (NodeSnapshot::settled(&rig.node, &[], settle), NodeSnapshot::settled(&pod, &[], settle));
    for (extra, message) in [
        (json!({"master": "nosuch0"}), "failed to lookup master \"nosuch0\""),
        (json!({"mtu": 9000}), "invalid MTU 9000, must be [0, master MTU(1500)]"),
        (json!({"vlanId": 5000}), "invalid VLAN ID 5000"),
    ] {
        let out = rig.run(Impl::Ours, "ADD", Some(&pod.path), "b", &conf(&rig, "1.0.0", extra.clone()), "");
        assert!(out.expect_err()["msg"].as_str().unwrap().contains(message), "{extra}: {}", out.stdout_text);
    }
    assert_unchanged(&before.0, &NodeSnapshot::take(&rig.node, &[]));
    assert_unchanged(&before.1, &NodeSnapshot::take(&pod, &[]));
}

#[test]
fn a_pod_on_vlan_100_reaches_the_lan_in_every_version() {
    if skip_without_kind("vlan", "CONFIG_VLAN_8021Q") {
        return;
    }
    let rig = LinkRig::new("vlan");
    rig.lan.ip(&["link", "add", "link", "eth0", "name", "eth0.100", "type", "vlan", "id", "100"]);
    rig.lan.ip(&["addr", "add", &format!("{LAN_VLAN_HOST}/24"), "dev", "eth0.100"]);
    rig.lan.ip(&["link", "set", "eth0.100", "up"]);
    for version in ["0.3.1", "0.4.0", "1.0.0", "1.1.0"] {
        let config = conf(&rig, version, json!({"mtu": 1400}));
        let pod = rig.node.pod_netns();
        let result = rig.add(Impl::Ours, &pod, "v", &config);
        let details = link_details(&pod, "eth0").expect("eth0");
        assert_eq!(details["linkinfo"]["info_data"]["id"].as_u64(), Some(100), "{details}");
        assert_eq!(details["mtu"].as_u64(), Some(1400));
        assert_ping(&pod, LAN_VLAN_HOST.parse().unwrap());
        if version >= "0.4.0" {
            rig.check(Impl::Ours, &pod, "v", &config, &result).expect_ok();
            let other = conf(&rig, version, json!({"mtu": 1400, "vlanId": 101}));
            rig.check(Impl::Ours, &pod, "v", &other, &result).expect_err();
        }
        rig.del(Impl::Ours, Some(&pod.path), "v", &config, &result);
        rig.del(Impl::Ours, Some(&pod.path), "v", &config, &result);
        assert!(!pod.links().contains(&"eth0".to_string()));
    }
    assert!(rig.leases().is_empty());
}

#[test]
fn takeover_both_ways_with_the_reference() {
    if skip_without_kind("vlan", "CONFIG_VLAN_8021Q") {
        return;
    }
    let rig = LinkRig::new("vlan");
    let _peer = lan_vlan_peer(&rig.lan, 100, &format!("{LAN_VLAN_HOST}/24"));
    let before = NodeSnapshot::settled(&rig.node, &[], Duration::from_secs(5));
    let conf = conf(&rig, "1.0.0", json!({"mtu": 1400}));
    let after_add = |adder: Impl, pod: &TestNetns| {
        let details = link_details(pod, "eth0").expect("eth0");
        assert_eq!(details["linkinfo"]["info_data"]["id"].as_u64(), Some(100), "{adder:?}: {details}");
        assert_eq!(details["mtu"].as_u64(), Some(1400), "{adder:?}");
        assert_ping(pod, LAN_VLAN_HOST.parse().unwrap());
    };
    rig.takeover_both_ways(&conf, after_add, |_, _| ());
    assert_unchanged(&before, &NodeSnapshot::take(&rig.node, &[]));
}

#[test]
fn tagged_traffic_reaches_its_vlan_only() {
    if skip_without_kind("vlan", "CONFIG_VLAN_8021Q") {
        return;
    }
    let rig = LinkRig::new("vlan");
    // Two peers in the same subnet, one on VLAN 100, one on VLAN 200: only the tag tells them apart.
    let _peer100 = lan_vlan_peer(&rig.lan, 100, "10.30.100.254/24");
    let _peer200 = lan_vlan_peer(&rig.lan, 200, "10.30.100.253/24");
    let before = NodeSnapshot::settled(&rig.node, &[], Duration::from_secs(5));
    let conf100 = conf(&rig, "1.1.0", json!({}));
    let conf200 = conf(&rig, "1.1.0", json!({"vlanId": 200}));
    let (pod100, pod200) = (rig.node.pod_netns(), rig.node.pod_netns());
    let r100 = rig.add(Impl::Ours, &pod100, "a", &conf100);
    let r200 = rig.add(Impl::Ours, &pod200, "b", &conf200);
    assert_ping(&pod100, "10.30.100.254".parse().unwrap());
    assert_no_ping(&pod100, "10.30.100.253".parse().unwrap());
    assert_ping(&pod200, "10.30.100.253".parse().unwrap());
    assert_no_ping(&pod200, "10.30.100.254".parse().unwrap());
    // The two pods share a subnet but not a VLAN.
    let addr200 = r200["ips"][0]["address"].as_str().unwrap().split('/').next().unwrap().to_string();
    assert_no_ping(&pod100, addr200.parse().unwrap());
    // The vlan links live in the pods: the node's uplink carries no vlan link of its own.
    let node_links = rig.node.links();
    assert_eq!(node_links.iter().filter(|l| l.as_str() != "lo").count(), 1, "{node_links:?}");
    rig.del(Impl::Ours, Some(&pod100.path), "a", &conf100, &r100);
    rig.del(Impl::Ours, Some(&pod200.path), "b", &conf200, &r200);
    assert!(rig.leases().is_empty());
    assert_unchanged(&before, &NodeSnapshot::take(&rig.node, &[]));
}

#[test]
fn link_in_container_uses_a_master_of_the_pod() {
    if skip_without_kind("vlan", "CONFIG_VLAN_8021Q") {
        return;
    }
    let rig = LinkRig::new("vlan");
    let pod = rig.node.pod_netns();
    let lan2 = TestNetns::new("lan2");
    veth_between(&pod, &lan2, "m0", "eth0", &[], &[]);
    let _peer = lan_vlan_peer(&lan2, 100, &format!("{LAN_VLAN_HOST}/24"));
    let before = NodeSnapshot::settled(&rig.node, &[], Duration::from_secs(5));
    let conf = conf(&rig, "1.0.0", json!({"master": "m0", "linkInContainer": true, "mtu": 1400}));
    let result = rig.add(Impl::Ours, &pod, "lic", &conf);
    let details = link_details(&pod, "eth0").expect("eth0");
    // A parent in the same namespace is shown by name.
    assert_eq!(details["link"], "m0", "{details}");
    assert_eq!(details["mtu"].as_u64(), Some(1400));
    assert_ping(&pod, LAN_VLAN_HOST.parse().unwrap());
    rig.check(Impl::Ours, &pod, "lic", &conf, &result).expect_ok();
    rig.del(Impl::Ours, Some(&pod.path), "lic", &conf, &result);
    assert!(pod.links().contains(&"m0".to_string()) && !pod.links().contains(&"eth0".to_string()));
    assert_unchanged(&before, &NodeSnapshot::take(&rig.node, &[]));
}
