//! The ipvlan plugin against the real kernel. This kernel may lack ipvlan (CONFIG_IPVLAN): then ADD must
//! fail with an error naming the missing support and leave the node and the pod unchanged (tested here on
//! every kernel without it), and the traffic tests print that they were skipped. With ipvlan: pods on l2 and
//! l3 links of the node's uplink reach the lan, CHECK, DEL leaves nothing, every spec version, the chained
//! form (master and addresses from prevResult), takeover both ways with the reference ipvlan 1.1.1.

use netns_tests::linkrig::{link_details, skip_with_kind, skip_without_kind, Impl, LinkRig, LAN_HOST, UPLINK};
use netns_tests::{assert_ping, json, Value};

const SUBNET: &str = "10.30.0.0/24";

fn conf(rig: &LinkRig, version: &str, extra: Value) -> Value {
    let mut conf = json!({
        "cniVersion": version, "name": rig.network, "type": "ipvlan", "master": UPLINK, "ipam": rig.ipam(SUBNET),
    });
    for (key, value) in extra.as_object().expect("object") {
        conf[key] = value.clone();
    }
    conf
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
fn takeover_both_ways_with_the_reference() {
    if skip_without_kind("ipvlan", "CONFIG_IPVLAN") {
        return;
    }
    let rig = LinkRig::new("ipvlan");
    let conf = conf(&rig, "1.0.0", json!({}));
    rig.takeover_both_ways(&conf, |_, _| (), |_, _| ());
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
