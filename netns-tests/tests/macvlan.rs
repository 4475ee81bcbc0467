//! The macvlan plugin against the real kernel: pods on macvlan links of the node's uplink (a veth to a "lan"
//! namespace) reach each other and the lan; modes, MTU, MAC (config, CNI_ARGS, capability), bcqueuelen, the
//! default-route master, linkInContainer, layer 2 only, dual stack; CHECK (and drift); DEL leaves nothing and is
//! idempotent (also without netns); every spec version; a failed ADD leaves the node unchanged; takeover both
//! ways with the reference macvlan 1.1.1 (/usr/lib/cni).

use netns_tests::linkrig::{link_details, pod_link_mode, with_fields, Impl, LinkRig, LAN_HOST, UPLINK};
use netns_tests::snapshot::{assert_unchanged, NodeSnapshot};
use netns_tests::{assert_ping, json, veth_between, TestNetns, Value};

const SUBNET: &str = "10.30.0.0/24";

fn conf(rig: &LinkRig, version: &str, extra: Value) -> Value {
    let conf = json!({
        "cniVersion": version, "name": rig.network, "type": "macvlan", "master": UPLINK,
        "ipam": rig.ipam(SUBNET),
    });
    with_fields(conf, &extra)
}

fn pod_address(result: &Value) -> String {
    let ip = result["ips"][0]["address"].as_str().expect("address in result");
    ip.split('/').next().expect("address").to_string()
}

fn macvlan_mode(pod: &TestNetns) -> String {
    pod_link_mode(pod, "macvlan")
}

#[test]
fn pods_reach_each_other_and_the_lan_then_del_leaves_nothing() {
    let rig = LinkRig::new("macvlan");
    let conf = conf(&rig, "1.1.0", json!({}));
    let (pod1, pod2) = (rig.node.pod_netns(), rig.node.pod_netns());
    // Settled: the uplink's IPv6 link-local address appears a moment after the rig brought it up.
    let before = NodeSnapshot::settled(&rig.node, &[], std::time::Duration::from_secs(5));
    let r1 = rig.add(Impl::Ours, &pod1, "c1", &conf);
    let r2 = rig.add(Impl::Ours, &pod2, "c2", &conf);

    // The result: the pod interface only, its MAC and sandbox, every IP on it.
    assert_eq!(r1["interfaces"].as_array().map(Vec::len), Some(1), "{r1}");
    assert_eq!(r1["interfaces"][0]["name"], "eth0");
    assert_eq!(r1["interfaces"][0]["sandbox"], pod1.path.display().to_string());
    let mac = link_details(&pod1, "eth0").expect("eth0")["address"].clone();
    assert_eq!(r1["interfaces"][0]["mac"], mac);
    assert_eq!(r1["ips"][0]["interface"], 0);
    assert_eq!(macvlan_mode(&pod1), "bridge");

    assert_ping(&pod1, LAN_HOST.parse().unwrap());
    assert_ping(&pod1, pod_address(&r2).parse().unwrap());
    assert_ping(&pod2, pod_address(&r1).parse().unwrap());

    for (pod, id, result) in [(&pod1, "c1", &r1), (&pod2, "c2", &r2)] {
        rig.check(Impl::Ours, pod, id, &conf, result).expect_ok();
    }
    assert_eq!(rig.leases().len(), 2);
    rig.del(Impl::Ours, Some(&pod1.path), "c1", &conf, &r1);
    assert!(!pod1.links().contains(&"eth0".to_string()));
    // Idempotent, and with the netns gone or not given (containerd's later DELs).
    rig.del(Impl::Ours, Some(&pod1.path), "c1", &conf, &r1);
    rig.del(Impl::Ours, None, "c2", &conf, &r2);
    assert!(pod2.links().contains(&"eth0".to_string()), "DEL without netns cannot reach the link");
    let pod2_path = pod2.path.clone();
    drop(pod2);
    rig.del(Impl::Ours, Some(&pod2_path), "c2", &conf, &r2);
    assert!(rig.leases().is_empty(), "{:?}", rig.leases());
    assert_unchanged(&before, &NodeSnapshot::take(&rig.node, &[]));
}

#[test]
fn every_spec_version() {
    let rig = LinkRig::new("macvlan");
    for version in ["0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"] {
        let conf = conf(&rig, version, json!({}));
        let pod = rig.node.pod_netns();
        let result = rig.add(Impl::Ours, &pod, "v", &conf);
        assert_eq!(result["cniVersion"], version);
        if version < "0.3.0" {
            assert!(result["ip4"]["ip"].is_string(), "{version}: {result}");
        } else {
            assert_eq!(result["interfaces"][0]["name"], "eth0", "{version}: {result}");
        }
        assert_ping(&pod, LAN_HOST.parse().unwrap());
        if version >= "0.4.0" {
            rig.check(Impl::Ours, &pod, "v", &conf, &result).expect_ok();
        }
        rig.del(Impl::Ours, Some(&pod.path), "v", &conf, &result);
        assert!(!pod.links().contains(&"eth0".to_string()), "{version}");
        if version >= "1.1.0" {
            let status = rig.run(Impl::Ours, "STATUS", None, "", &conf, "");
            status.expect_ok();
            let mut gc = conf.clone();
            gc["cni.dev/valid-attachments"] = json!([]);
            rig.run(Impl::Ours, "GC", None, "", &gc, "").expect_ok();
        }
    }
    assert!(rig.leases().is_empty());
}

#[test]
fn modes_mtu_mac_and_bcqueuelen() {
    let rig = LinkRig::new("macvlan");
    for mode in ["private", "vepa", "bridge"] {
        let conf = conf(&rig, "1.0.0", json!({"mode": mode}));
        let pod = rig.node.pod_netns();
        let result = rig.add(Impl::Ours, &pod, "m", &conf);
        assert_eq!(macvlan_mode(&pod), mode);
        rig.check(Impl::Ours, &pod, "m", &conf, &result).expect_ok();
        rig.del(Impl::Ours, Some(&pod.path), "m", &conf, &result);
    }
    // MTU and MAC from the config, overridden by CNI_ARGS, overridden by the capability.
    let mut with_mac = conf(&rig, "1.0.0", json!({"mtu": 1400, "mac": "02:00:00:00:00:01", "bcqueuelen": 2000}));
    let pod = rig.node.pod_netns();
    let result = rig.run(Impl::Ours, "ADD", Some(&pod.path), "mac", &with_mac, "IgnoreUnknown=1;MAC=02:00:00:00:00:02");
    let result = result.expect_ok().clone();
    let details = link_details(&pod, "eth0").expect("eth0");
    assert_eq!((details["mtu"].as_u64(), details["address"].as_str()), (Some(1400), Some("02:00:00:00:00:02")));
    assert_eq!(details["linkinfo"]["info_data"]["bcqueuelen"].as_u64(), Some(2000), "{details}");
    assert_eq!(result["interfaces"][0]["mac"], "02:00:00:00:00:02");
    rig.del(Impl::Ours, Some(&pod.path), "mac", &with_mac, &result);
    with_mac["runtimeConfig"] = json!({"mac": "02:00:00:00:00:03"});
    let result = rig.run(Impl::Ours, "ADD", Some(&pod.path), "mac", &with_mac, "IgnoreUnknown=1;MAC=02:00:00:00:00:02");
    assert_eq!(result.expect_ok()["interfaces"][0]["mac"], "02:00:00:00:00:03");
    rig.del(Impl::Ours, Some(&pod.path), "mac", &with_mac, &result.stdout);
}

#[test]
fn passthru_takes_the_master_alone() {
    let rig = LinkRig::new("macvlan");
    let conf = conf(&rig, "1.0.0", json!({"mode": "passthru"}));
    let pod = rig.node.pod_netns();
    let result = rig.add(Impl::Ours, &pod, "p", &conf);
    assert_eq!(macvlan_mode(&pod), "passthru");
    assert_ping(&pod, LAN_HOST.parse().unwrap());
    rig.check(Impl::Ours, &pod, "p", &conf, &result).expect_ok();
    rig.del(Impl::Ours, Some(&pod.path), "p", &conf, &result);
}

#[test]
fn master_defaults_to_the_default_route_interface_and_layer2_only() {
    let rig = LinkRig::new("macvlan");
    rig.node.ip(&["addr", "add", "10.30.0.1/24", "dev", UPLINK]);
    rig.node.ip(&["route", "add", "default", "via", LAN_HOST]);
    let conf = conf(&rig, "1.0.0", json!({"master": null, "ipam": null}));
    let pod = rig.node.pod_netns();
    let result = rig.add(Impl::Ours, &pod, "l2", &conf);
    assert!(result["ips"].is_null() || result["ips"].as_array().is_some_and(Vec::is_empty), "{result}");
    let details = link_details(&pod, "eth0").expect("eth0");
    assert!(details["flags"].as_array().expect("flags").iter().any(|f| f == "UP"), "{details}");
    let uplink_index = link_details(&rig.node, UPLINK).expect("uplink")["ifindex"].clone();
    assert_eq!(details["link_index"], uplink_index, "{details}");
    rig.check(Impl::Ours, &pod, "l2", &conf, &result).expect_ok();
    rig.del(Impl::Ours, Some(&pod.path), "l2", &conf, &result);
    assert!(!pod.links().contains(&"eth0".to_string()));
}

#[test]
fn link_in_container_uses_a_master_of_the_pod() {
    let rig = LinkRig::new("macvlan");
    let pod = rig.node.pod_netns();
    let lan2 = TestNetns::new("lan2");
    veth_between(&pod, &lan2, "m0", "eth0", &[], &["10.31.0.254/24".parse().unwrap()]);
    let mut conf = conf(&rig, "1.0.0", json!({"master": "m0", "linkInContainer": true}));
    conf["ipam"] = rig.ipam("10.31.0.0/24");
    let result = rig.add(Impl::Ours, &pod, "lic", &conf);
    assert_ping(&pod, "10.31.0.254".parse().unwrap());
    rig.check(Impl::Ours, &pod, "lic", &conf, &result).expect_ok();
    rig.del(Impl::Ours, Some(&pod.path), "lic", &conf, &result);
    assert!(pod.links().contains(&"m0".to_string()) && !pod.links().contains(&"eth0".to_string()));
}

#[test]
fn a_node_link_named_like_the_pod_interface_is_no_obstacle() {
    let rig = LinkRig::new("macvlan");
    // The node has an "eth0" of its own: the link is created in the pod directly under its name.
    let other = TestNetns::new("oth");
    veth_between(&rig.node, &other, "eth0", "x0", &[], &[]);
    let conf = conf(&rig, "1.0.0", json!({}));
    let pod = rig.node.pod_netns();
    let result = rig.add(Impl::Ours, &pod, "n", &conf);
    assert_ping(&pod, LAN_HOST.parse().unwrap());
    rig.del(Impl::Ours, Some(&pod.path), "n", &conf, &result);
}

#[test]
fn check_finds_drift() {
    let rig = LinkRig::new("macvlan");
    let conf = conf(&rig, "1.0.0", json!({}));
    let pod = rig.node.pod_netns();
    let result = rig.add(Impl::Ours, &pod, "d", &conf);
    let other_mode = conf.clone();
    let mut private = other_mode;
    private["mode"] = "private".into();
    let err = rig.check(Impl::Ours, &pod, "d", &private, &result);
    assert!(err.expect_err()["msg"].as_str().unwrap().contains("mode bridge"), "{}", err.stdout_text);
    let mut wrong_mac = result.clone();
    wrong_mac["interfaces"][0]["mac"] = "02:11:11:11:11:11".into();
    rig.check(Impl::Ours, &pod, "d", &conf, &wrong_mac).expect_err();
    let address = result["ips"][0]["address"].as_str().unwrap().to_string();
    pod.ip(&["addr", "del", &address, "dev", "eth0"]);
    let err = rig.check(Impl::Ours, &pod, "d", &conf, &result);
    assert!(err.expect_err()["msg"].as_str().unwrap().contains(&address), "{}", err.stdout_text);
    rig.run(Impl::Ours, "CHECK", Some(&pod.path), "d", &conf, "").expect_err();
    rig.del(Impl::Ours, Some(&pod.path), "d", &conf, &result);
}

#[test]
fn failed_adds_leave_node_and_pod_unchanged() {
    let rig = LinkRig::new("macvlan");
    let pod = rig.node.pod_netns();
    let ipam_dir = rig.ipam_dir();
    // host-local's directory is left out: it keeps its lock and last-reserved files, as the reference does.
    let settle = std::time::Duration::from_secs(5);
    let before = (NodeSnapshot::settled(&rig.node, &[], settle), NodeSnapshot::settled(&pod, &[], settle));
    let full = json!({"type": "host-local", "dataDir": ipam_dir, "ranges": [[{"subnet": "10.30.0.0/30"}]]});
    let cases = [
        (json!({"master": "nosuch0"}), "nosuch0"),
        (json!({"mtu": 9000}), "invalid MTU 9000"),
        (json!({"mode": "l3"}), "unknown macvlan mode"),
        (json!({"ipam": {"type": "no-such-ipam"}}), "no-such-ipam"),
        // The range has one address (host-local keeps .1 for the gateway): the first ADD takes it, the second
        // fails after the link was made.
        (json!({"ipam": full}), "no IP addresses available"),
    ];
    for (extra, message) in cases {
        let conf = conf(&rig, "1.0.0", extra.clone());
        let mut results = Vec::new();
        if extra.get("ipam") == Some(&full) {
            let p = rig.node.pod_netns();
            results.push((p.path.clone(), "f1", rig.add(Impl::Ours, &p, "f1", &conf), p));
        }
        let out = rig.run(Impl::Ours, "ADD", Some(&pod.path), "bad", &conf, "");
        let msg = out.expect_err()["msg"].as_str().unwrap_or_default().to_string();
        assert!(msg.contains(message), "{extra}: {}", out.stdout_text);
        for (path, id, result, _pod) in &results {
            rig.del(Impl::Ours, Some(path), id, &conf, result);
        }
        assert_unchanged(&before.1, &NodeSnapshot::take(&pod, &[]));
    }
    assert_unchanged(&before.0, &NodeSnapshot::take(&rig.node, &[]));
    assert!(rig.leases().is_empty(), "{:?}", rig.leases());
}

#[test]
fn takeover_both_ways_with_the_reference() {
    let rig = LinkRig::new("macvlan");
    let conf = conf(&rig, "1.0.0", json!({}));
    rig.takeover_both_ways(&conf, |_, pod| assert_ping(pod, LAN_HOST.parse().unwrap()), |_, _| ());
}

#[test]
fn dual_stack() {
    let rig = LinkRig::new("macvlan");
    rig.lan.ip(&["addr", "add", "fd30::fe/64", "dev", "eth0", "nodad"]);
    let mut conf = conf(&rig, "1.0.0", json!({}));
    conf["ipam"]["ranges"] = json!([[{"subnet": SUBNET}], [{"subnet": "fd30::/64"}]]);
    let (pod1, pod2) = (rig.node.pod_netns(), rig.node.pod_netns());
    let r1 = rig.add(Impl::Ours, &pod1, "d1", &conf);
    let r2 = rig.add(Impl::Ours, &pod2, "d2", &conf);
    let v6 = |r: &Value| r["ips"][1]["address"].as_str().unwrap().split('/').next().unwrap().to_string();
    assert_ping(&pod1, "fd30::fe".parse().unwrap());
    assert_ping(&pod1, v6(&r2).parse().unwrap());
    rig.check(Impl::Ours, &pod2, "d2", &conf, &r2).expect_ok();
    rig.del(Impl::Ours, Some(&pod1.path), "d1", &conf, &r1);
    rig.del(Impl::Ours, Some(&pod2.path), "d2", &conf, &r2);
    assert!(rig.leases().is_empty());
}
