//! The dummy plugin against the real kernel. This kernel may lack dummy links (CONFIG_DUMMY): then ADD must
//! fail with an error naming the missing support and leave the node and the pod unchanged (tested here on every
//! kernel without it), and the other tests print that they were skipped. With dummy links: the pod's address
//! on a dummy link, CHECK (and a link set down, an address gone), DEL leaves node and pod as they were, every
//! spec version, dual stack with IPAM's routes. (The reference 1.1.1 has no dummy plugin, the reference added
//! it in v1.5: no takeover test.)

use std::time::Duration;

use netns_tests::linkrig::{link_details, result_address, skip_with_kind, skip_without_kind, Impl, LinkRig};
use netns_tests::snapshot::{assert_unchanged, NodeSnapshot};
use netns_tests::{assert_ping, json, Value};

const SUBNET: &str = "10.50.0.0/24";

fn conf(rig: &LinkRig, version: &str) -> Value {
    json!({"cniVersion": version, "name": rig.network, "type": "dummy", "ipam": rig.ipam(SUBNET)})
}

/// Our dummy with our host-local (the reference 1.1.1 has no dummy plugin).
fn rig() -> LinkRig {
    LinkRig::new_ours_only("dummy")
}

#[test]
fn without_kernel_support_add_is_a_clear_error_and_changes_nothing() {
    if skip_with_kind("dummy", "dummy links") {
        return;
    }
    let rig = rig();
    rig.assert_missing_support("this kernel has no dummy support (CONFIG_DUMMY)", |version| conf(&rig, version));
}

#[test]
fn add_check_del_in_every_version() {
    if skip_without_kind("dummy", "CONFIG_DUMMY") {
        return;
    }
    let rig = rig();
    for version in ["0.3.1", "0.4.0", "1.0.0", "1.1.0"] {
        let conf = conf(&rig, version);
        let pod = rig.node.pod_netns();
        let result = rig.add(Impl::Ours, &pod, "v", &conf);
        assert_eq!(link_details(&pod, "eth0").expect("eth0")["linkinfo"]["info_kind"], "dummy");
        let ip = result["ips"][0]["address"].as_str().unwrap().split('/').next().unwrap().to_string();
        assert_ping(&pod, ip.parse().unwrap());
        if version >= "0.4.0" {
            rig.check(Impl::Ours, &pod, "v", &conf, &result).expect_ok();
            pod.ip(&["link", "set", "eth0", "down"]);
            rig.check(Impl::Ours, &pod, "v", &conf, &result).expect_err();
        }
        rig.del(Impl::Ours, Some(&pod.path), "v", &conf, &result);
        rig.del(Impl::Ours, Some(&pod.path), "v", &conf, &result);
        assert!(!pod.links().contains(&"eth0".to_string()));
    }
    assert!(rig.leases().is_empty());
}

#[test]
fn ipam_is_required_and_del_always_succeeds() {
    let rig = rig();
    let pod = rig.node.pod_netns();
    let mut bare = conf(&rig, "1.0.0");
    bare.as_object_mut().unwrap().remove("ipam");
    let out = rig.run(Impl::Ours, "ADD", Some(&pod.path), "x", &bare, "");
    assert_eq!(out.expect_err()["msg"], "dummy interface requires an IPAM configuration");
    rig.run(Impl::Ours, "DEL", Some(&pod.path), "x", &bare, "").expect_ok();
    rig.run(Impl::Ours, "DEL", None, "x", &conf(&rig, "1.1.0"), "").expect_ok();
    rig.run(Impl::Ours, "STATUS", None, "", &conf(&rig, "1.1.0"), "").expect_ok();
}

#[test]
fn dual_stack_addresses_and_routes_then_del_leaves_node_and_pod_as_they_were() {
    if skip_without_kind("dummy", "CONFIG_DUMMY") {
        return;
    }
    let rig = rig();
    let mut conf = conf(&rig, "1.1.0");
    conf["ipam"]["ranges"] = json!([[{"subnet": SUBNET}], [{"subnet": "fd50::/64"}]]);
    conf["ipam"]["routes"] = json!([{"dst": "10.51.0.0/16"}, {"dst": "fd51::/64"}]);
    let pod = rig.node.pod_netns();
    let settle = Duration::from_secs(5);
    let before = (NodeSnapshot::settled(&rig.node, &[], settle), NodeSnapshot::settled(&pod, &[], settle));
    let result = rig.add(Impl::Ours, &pod, "ds", &conf);
    let (v4, v6) = (result_address(&result, 0), result_address(&result, 1));
    assert!(v4.is_ipv4() && v6.is_ipv6(), "{result}");
    let addresses = pod.ip(&["addr", "show", "dev", "eth0"]);
    assert!(addresses.contains(&format!("{v4}/24")) && addresses.contains(&format!("{v6}/64")), "{addresses}");
    assert!(pod.ip(&["route", "show", "dev", "eth0"]).contains("10.51.0.0/16"));
    assert!(pod.ip(&["-6", "route", "show", "dev", "eth0"]).contains("fd51::/64"));
    assert_ping(&pod, v4);
    rig.check(Impl::Ours, &pod, "ds", &conf, &result).expect_ok();
    pod.ip(&["addr", "del", &format!("{v4}/24"), "dev", "eth0"]);
    let err = rig.check(Impl::Ours, &pod, "ds", &conf, &result);
    assert!(err.expect_err()["msg"].as_str().unwrap().contains(&v4.to_string()), "{}", err.stdout_text);
    rig.del(Impl::Ours, Some(&pod.path), "ds", &conf, &result);
    assert!(rig.leases().is_empty(), "{:?}", rig.leases());
    assert_unchanged(&before.0, &NodeSnapshot::take(&rig.node, &[]));
    assert_unchanged(&before.1, &NodeSnapshot::take(&pod, &[]));
}
