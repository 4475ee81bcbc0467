//! The ipvlan plugin against the real kernel. This kernel may lack ipvlan (CONFIG_IPVLAN): then ADD must
//! fail with an error naming the missing support and leave the node and the pod unchanged (tested here on
//! every kernel without it), and the kernel tests print that they were skipped (the VM lane runs them). With
//! ipvlan: in each mode (l2, l3, l3s) pods on the node's uplink reach each other and, in l2, the lan; CHECK;
//! DEL leaves the node as it was; every spec version; the chained form (master and addresses from
//! prevResult); `linkInContainer`; takeover both ways with the reference ipvlan 1.1.1.

use std::time::Duration;

use netns_tests::linkrig::{
    link_details, pod_link_mode, result_address, skip_with_kind, skip_without_kind, with_fields, Impl, LinkRig,
    LAN_HOST, UPLINK,
};
use netns_tests::snapshot::{assert_unchanged, NodeSnapshot};
use netns_tests::{assert_ping, json, veth_between, TestNetns, Value};

const SUBNET: &str = "10.30.0.0/24";

fn conf(rig: &LinkRig, version: &str, extra: Value) -> Value {
    let conf = json!({
        "cniVersion": version, "name": rig.network, "type": "ipvlan", "master": UPLINK, "ipam": rig.ipam(SUBNET),
    });
    with_fields(conf, &extra)
}

#[test]
fn without_kernel_support_add_is_a_clear_error_and_changes_nothing() {
    if skip_with_kind("ipvlan", "ipvlan") {
        return;
    }
    let rig = LinkRig::new("ipvlan");
    let conf = |version: &str| conf(&rig, version, json!({"mode": "l3"}));
    rig.assert_missing_support("this kernel has no ipvlan support (CONFIG_IPVLAN)", conf);
}

#[test]
fn pods_reach_the_lan_check_and_del_in_every_version() {
    if skip_without_kind("ipvlan", "CONFIG_IPVLAN") {
        return;
    }
    let rig = LinkRig::new("ipvlan");
    for (version, mode) in [("0.3.1", "l2"), ("0.4.0", "l3"), ("1.0.0", "l3s"), ("1.1.0", "l2")] {
        let conf = conf(&rig, version, json!({"mode": mode}));
        let pod = rig.node.pod_netns();
        let result = rig.add(Impl::Ours, &pod, "v", &conf);
        assert_eq!(link_details(&pod, "eth0").expect("eth0")["linkinfo"]["info_kind"], "ipvlan");
        if mode == "l2" {
            assert_ping(&pod, LAN_HOST.parse().unwrap());
        }
        if version >= "0.4.0" {
            rig.check(Impl::Ours, &pod, "v", &conf, &result).expect_ok();
        }
        rig.del(Impl::Ours, Some(&pod.path), "v", &conf, &result);
        rig.del(Impl::Ours, Some(&pod.path), "v", &conf, &result);
        assert!(!pod.links().contains(&"eth0".to_string()));
    }
    assert!(rig.leases().is_empty());
}

#[test]
fn del_without_the_link_or_the_netns_succeeds() {
    let rig = LinkRig::new("ipvlan");
    let conf = conf(&rig, "1.1.0", json!({}));
    let pod = rig.node.pod_netns();
    rig.run(Impl::Ours, "DEL", Some(&pod.path), "x", &conf, "").expect_ok();
    rig.run(Impl::Ours, "DEL", None, "x", &conf, "").expect_ok();
    let path = pod.path.clone();
    drop(pod);
    rig.run(Impl::Ours, "DEL", Some(&path), "x", &conf, "").expect_ok();
    rig.run(Impl::Ours, "STATUS", None, "", &conf, "").expect_ok();
}

fn ipvlan_mode(pod: &TestNetns) -> String {
    pod_link_mode(pod, "ipvlan")
}

#[test]
fn each_mode_pods_reach_each_other_and_del_leaves_the_node_as_it_was() {
    if skip_without_kind("ipvlan", "CONFIG_IPVLAN") {
        return;
    }
    let rig = LinkRig::new("ipvlan");
    let before = NodeSnapshot::settled(&rig.node, &[], Duration::from_secs(5));
    for mode in ["l2", "l3", "l3s"] {
        let conf = conf(&rig, "1.1.0", json!({"mode": mode}));
        let (pod1, pod2) = (rig.node.pod_netns(), rig.node.pod_netns());
        let r1 = rig.add(Impl::Ours, &pod1, "c1", &conf);
        let r2 = rig.add(Impl::Ours, &pod2, "c2", &conf);
        assert_eq!(ipvlan_mode(&pod1), mode);
        assert_eq!(r1["interfaces"][0]["sandbox"], pod1.path.display().to_string());
        assert_ping(&pod1, result_address(&r2, 0));
        assert_ping(&pod2, result_address(&r1, 0));
        if mode == "l2" {
            // Only l2 answers ARP for the pods: in l3 and l3s the lan would need routes to them.
            assert_ping(&pod1, LAN_HOST.parse().unwrap());
        }
        for (pod, id, result) in [(&pod1, "c1", &r1), (&pod2, "c2", &r2)] {
            rig.check(Impl::Ours, pod, id, &conf, result).expect_ok();
        }
        let other = if mode == "l2" { "l3" } else { "l2" };
        let mut other_mode = conf.clone();
        other_mode["mode"] = other.into();
        let err = rig.check(Impl::Ours, &pod1, "c1", &other_mode, &r1);
        assert!(err.expect_err()["msg"].as_str().unwrap().contains(mode), "{}", err.stdout_text);
        rig.del(Impl::Ours, Some(&pod1.path), "c1", &conf, &r1);
        rig.del(Impl::Ours, Some(&pod2.path), "c2", &conf, &r2);
        assert!(!pod1.links().contains(&"eth0".to_string()), "{mode}");
        assert!(rig.leases().is_empty(), "{mode}: {:?}", rig.leases());
    }
    assert_unchanged(&before, &NodeSnapshot::take(&rig.node, &[]));
}

#[test]
fn chained_takes_master_and_addresses_from_prev_result() {
    if skip_without_kind("ipvlan", "CONFIG_IPVLAN") {
        return;
    }
    let rig = LinkRig::new("ipvlan");
    let mut conf = conf(&rig, "1.0.0", json!({}));
    let object = conf.as_object_mut().unwrap();
    object.remove("ipam");
    object.remove("master");
    let prev = json!({"cniVersion": "1.0.0", "interfaces": [{"name": UPLINK}],
        "ips": [{"address": "10.30.0.77/24", "interface": 0}]});
    let pod = rig.node.pod_netns();
    let result = rig.run(Impl::Ours, "ADD", Some(&pod.path), "ch", &LinkRig::with_prev(&conf, &prev), "");
    let result = result.expect_ok().clone();
    let details = link_details(&pod, "eth0").expect("eth0");
    let uplink = link_details(&rig.node, UPLINK).expect("uplink");
    assert_eq!(details["link_index"], uplink["ifindex"], "{details}");
    assert_eq!(result["ips"][0]["address"], "10.30.0.77/24", "{result}");
    assert_eq!(result["interfaces"][0]["name"], "eth0", "{result}");
    assert_ping(&pod, LAN_HOST.parse().unwrap());
    rig.check(Impl::Ours, &pod, "ch", &conf, &result).expect_ok();
    rig.del(Impl::Ours, Some(&pod.path), "ch", &conf, &result);
    assert!(!pod.links().contains(&"eth0".to_string()));
    assert!(rig.leases().is_empty());
}

#[test]
fn link_in_container_uses_a_master_of_the_pod() {
    if skip_without_kind("ipvlan", "CONFIG_IPVLAN") {
        return;
    }
    let rig = LinkRig::new("ipvlan");
    let pod = rig.node.pod_netns();
    let lan2 = TestNetns::new("lan2");
    veth_between(&pod, &lan2, "m0", "eth0", &[], &["10.31.0.254/24".parse().unwrap()]);
    let before = NodeSnapshot::settled(&rig.node, &[], Duration::from_secs(5));
    let mut conf = conf(&rig, "1.0.0", json!({"master": "m0", "linkInContainer": true}));
    conf["ipam"] = rig.ipam("10.31.0.0/24");
    let result = rig.add(Impl::Ours, &pod, "lic", &conf);
    let details = link_details(&pod, "eth0").expect("eth0");
    // A parent in the same namespace is shown by name.
    assert_eq!(details["link"], "m0", "{details}");
    assert_ping(&pod, "10.31.0.254".parse().unwrap());
    rig.check(Impl::Ours, &pod, "lic", &conf, &result).expect_ok();
    rig.del(Impl::Ours, Some(&pod.path), "lic", &conf, &result);
    assert!(pod.links().contains(&"m0".to_string()) && !pod.links().contains(&"eth0".to_string()));
    assert_unchanged(&before, &NodeSnapshot::take(&rig.node, &[]));
}

#[test]
fn takeover_both_ways_in_each_mode() {
    if skip_without_kind("ipvlan", "CONFIG_IPVLAN") {
        return;
    }
    let rig = LinkRig::new("ipvlan");
    let before = NodeSnapshot::settled(&rig.node, &[], Duration::from_secs(5));
    for mode in ["l2", "l3", "l3s"] {
        let conf = conf(&rig, "1.0.0", json!({"mode": mode}));
        let after_add = |adder: Impl, pod: &TestNetns| {
            assert_eq!(ipvlan_mode(pod), mode, "{adder:?}");
            if mode == "l2" {
                assert_ping(pod, LAN_HOST.parse().unwrap());
            }
        };
        rig.takeover_both_ways(&conf, after_add, |_, _| ());
    }
    assert_unchanged(&before, &NodeSnapshot::take(&rig.node, &[]));
}

#[test]
fn a_master_has_one_mode_and_check_sees_another_plugin_change_it() {
    if skip_without_kind("ipvlan", "CONFIG_IPVLAN") {
        return;
    }
    // The kernel keeps the mode per master, and the last link made sets it for all (it refuses nothing). Ours
    // refuses a pod in l3 beside an l2 pod (kernel_refusals has the message); the reference makes it, which
    // turns the l2 pod's link into l3, and CHECK of the older pod reports the change.
    let rig = LinkRig::new("ipvlan");
    let (l2, l3) = (conf(&rig, "1.0.0", json!({"mode": "l2"})), conf(&rig, "1.0.0", json!({"mode": "l3"})));
    let (pod1, pod2) = (rig.node.pod_netns(), rig.node.pod_netns());
    let r1 = rig.add(Impl::Ours, &pod1, "m1", &l2);
    rig.check(Impl::Ours, &pod1, "m1", &l2, &r1).expect_ok();
    let refused = rig.run(Impl::Ours, "ADD", Some(&pod2.path), "m2", &l3, "");
    assert!(
        refused.expect_err()["msg"].as_str().unwrap().contains("ipvlan mode l3 refused"),
        "{}",
        refused.stdout_text
    );
    rig.run(Impl::Ours, "DEL", Some(&pod2.path), "m2", &l3, "").expect_ok();
    assert_eq!(ipvlan_mode(&pod1), "l2", "the refused ADD changed the older pod");
    let r2 = rig.add(Impl::Reference, &pod2, "m2", &l3);
    assert_eq!(ipvlan_mode(&pod1), "l3", "the kernel kept a mode per link");
    let err = rig.check(Impl::Ours, &pod1, "m1", &l2, &r1);
    assert!(err.expect_err()["msg"].as_str().unwrap().contains("l3"), "{}", err.stdout_text);
    rig.del(Impl::Reference, Some(&pod2.path), "m2", &l3, &r2);
    rig.del(Impl::Ours, Some(&pod1.path), "m1", &l2, &r1);
    assert!(rig.leases().is_empty());
}
