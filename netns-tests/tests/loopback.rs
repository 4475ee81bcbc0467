//! loopback in real namespaces: ADD brings `lo` up and reports it in every spec version, CHECK sees it up or down,
//! DEL sets it down and tolerates a vanished netns, a chained call passes `prevResult` through.

use netns_tests::cnicore::spec::SUPPORTED_VERSIONS;
use netns_tests::{json, Node, PluginOutput, TestNetns, Value};
use std::path::Path;

const CONTAINER_ID: &str = "loopback-test";

fn conf(version: &str) -> Value {
    json!({"cniVersion": version, "name": "lo-net", "type": "loopback"})
}

fn run(node: &Node, command: &str, netns: &Path, stdin: &Value) -> PluginOutput {
    let netns = netns.to_str().expect("utf-8 netns path");
    let env = [("CNI_CONTAINERID", CONTAINER_ID), ("CNI_NETNS", netns), ("CNI_IFNAME", "lo")];
    node.run_plugin("loopback", command, &env, stdin)
}

fn lo_is_up(pod: &TestNetns) -> bool {
    pod.netlink().require_link("lo").expect("lo").up
}

/// A pod namespace as a runtime hands it over: `lo` down (the rig brings it up in every namespace it makes).
fn fresh_pod(node: &Node) -> TestNetns {
    let pod = node.pod_netns();
    let mut netlink = pod.netlink();
    let lo = netlink.require_link("lo").expect("lo");
    netlink.set_down(lo.index).expect("set lo down");
    assert!(!lo_is_up(&pod));
    pod
}

fn is_legacy(version: &str) -> bool {
    version == "0.1.0" || version == "0.2.0"
}

#[test]
fn add_brings_lo_up_and_reports_it_in_every_version() {
    let node = Node::new();
    for version in SUPPORTED_VERSIONS {
        let pod = fresh_pod(&node);
        let out = run(&node, "ADD", &pod.path, &conf(version));
        let result = out.expect_ok();
        assert!(lo_is_up(&pod), "{version}: lo still down after ADD");
        assert_eq!(result["cniVersion"], *version);
        if is_legacy(version) {
            assert_eq!(result["ip4"]["ip"], "127.0.0.1/8", "{version}: {result}");
            assert_eq!(result["ip6"]["ip"], "::1/128", "{version}: {result}");
            assert!(result.get("interfaces").is_none() && result.get("ips").is_none(), "{version}: {result}");
            continue;
        }
        let sandbox = pod.path.display().to_string();
        assert_eq!(
            result["interfaces"],
            json!([{"name": "lo", "mac": "00:00:00:00:00:00", "sandbox": sandbox}]),
            "{version}"
        );
        let ips = result["ips"].as_array().expect("ips");
        let addresses: Vec<&str> = ips.iter().filter_map(|ip| ip["address"].as_str()).collect();
        assert_eq!(addresses, ["127.0.0.1/8", "::1/128"], "{version}");
        for ip in ips {
            assert_eq!(ip["interface"], 0, "{version}: {ip}");
            assert!(ip.get("gateway").is_none(), "{version}: {ip}");
            // `version` exists in 0.3.x and 0.4.0 results only.
            let expected = match (version.starts_with('0'), ip["address"].as_str()) {
                (true, Some("127.0.0.1/8")) => json!("4"),
                (true, _) => json!("6"),
                (false, _) => Value::Null,
            };
            assert_eq!(ip.get("version").cloned().unwrap_or(Value::Null), expected, "{version}: {ip}");
        }
    }
}

#[test]
fn add_refuses_a_lo_with_non_loopback_addresses_as_the_reference() {
    // Reference v1.1 to v1.9 check every address on `lo` (127.0.0.0/8 and ::1 only).
    let node = Node::new();
    for (extra, shown) in [("10.9.8.7/32", "10.9.8.7"), ("fd00:9::7/128", "fd00:9::7")] {
        let pod = fresh_pod(&node);
        pod.ip(&["addr", "add", extra, "dev", "lo"]);
        let err = run(&node, "ADD", &pod.path, &conf("1.0.0")).expect_err().clone();
        let msg = err["msg"].as_str().unwrap_or_default();
        assert!(msg.contains("non-loopback address") && msg.contains(shown), "{err}");
        assert!(!lo_is_up(&pod), "a refused ADD changes nothing");
        // Other loopback addresses are fine.
        pod.ip(&["addr", "del", extra, "dev", "lo"]);
        pod.ip(&["addr", "add", "127.0.0.53/8", "dev", "lo"]);
        run(&node, "ADD", &pod.path, &conf("1.0.0")).expect_ok();
        assert!(lo_is_up(&pod));
    }
}

#[test]
fn ifname_is_ignored_as_by_the_reference() {
    // cnitool passes its default `eth0`: the plugin still acts on `lo` only, and says so.
    let node = Node::new();
    let pod = fresh_pod(&node);
    let netns = pod.path.to_str().expect("utf-8");
    let env = [("CNI_CONTAINERID", CONTAINER_ID), ("CNI_NETNS", netns), ("CNI_IFNAME", "eth0")];
    let out = node.run_plugin("loopback", "ADD", &env, &conf("1.1.0"));
    assert_eq!(out.expect_ok()["interfaces"][0]["name"], "lo");
    assert!(lo_is_up(&pod));
    let out = node.run_plugin("loopback", "DEL", &env, &conf("1.1.0"));
    out.expect_ok();
    assert!(!lo_is_up(&pod));
}

#[test]
fn check_sees_lo_up_and_down() {
    let node = Node::new();
    for version in ["0.4.0", "1.0.0", "1.1.0"] {
        let pod = fresh_pod(&node);
        run(&node, "ADD", &pod.path, &conf(version)).expect_ok();
        let out = run(&node, "CHECK", &pod.path, &conf(version));
        out.expect_ok();
        assert!(out.stdout_text.is_empty(), "CHECK printed {:?}", out.stdout_text);

        let mut netlink = pod.netlink();
        let lo = netlink.require_link("lo").expect("lo");
        netlink.set_down(lo.index).expect("set lo down");
        let out = run(&node, "CHECK", &pod.path, &conf(version));
        let err = out.expect_err();
        assert_eq!(err["cniVersion"], version);
        assert!(err["msg"].as_str().is_some_and(|m| m.contains("down")), "{err}");
    }
}

#[test]
fn del_sets_lo_down_and_is_idempotent() {
    let node = Node::new();
    for version in SUPPORTED_VERSIONS {
        let pod = fresh_pod(&node);
        run(&node, "ADD", &pod.path, &conf(version)).expect_ok();
        for attempt in 1..=2 {
            let out = run(&node, "DEL", &pod.path, &conf(version));
            out.expect_ok();
            assert!(out.stdout_text.is_empty(), "{version}: DEL printed {:?}", out.stdout_text);
            assert!(!lo_is_up(&pod), "{version}: lo up after DEL #{attempt}");
        }
    }
}

#[test]
fn del_succeeds_when_the_netns_is_gone() {
    let node = Node::new();
    let pod = fresh_pod(&node);
    let path = pod.path.clone();
    run(&node, "ADD", &path, &conf("1.0.0")).expect_ok();
    drop(pod);
    assert!(!path.exists());
    run(&node, "DEL", &path, &conf("1.0.0")).expect_ok();

    // Without CNI_NETNS at all (allowed for DEL) there is nothing to do either.
    let env = [("CNI_CONTAINERID", CONTAINER_ID), ("CNI_IFNAME", "lo")];
    node.run_plugin("loopback", "DEL", &env, &conf("1.0.0")).expect_ok();
}

#[test]
fn add_and_check_with_a_missing_netns_are_unknown_container() {
    let node = Node::new();
    let missing = Path::new("/run/netns").join(netns_tests::unique_name("cnt-missing-"));
    for (command, version) in [("ADD", "1.0.0"), ("ADD", "0.2.0"), ("CHECK", "1.1.0")] {
        let out = run(&node, command, &missing, &conf(version));
        let err = out.expect_err();
        assert_eq!(err["code"], 3, "{command}: {err}");
        assert_eq!(err["cniVersion"], version, "{command}: {err}");
    }
}

#[test]
fn add_with_a_netns_path_that_is_not_a_netns_fails_cleanly() {
    let node = Node::new();
    let file = node.dir().join("not-a-netns");
    std::fs::write(&file, b"").expect("write");
    let err = run(&node, "ADD", &file, &conf("1.0.0")).expect_err().clone();
    assert!(err["msg"].as_str().is_some_and(|m| m.contains("not a network namespace")), "{err}");
}

/// A result as a main plugin would return it, in `version`.
fn main_plugin_result(version: &str) -> Value {
    if is_legacy(version) {
        return json!({
            "cniVersion": version,
            "ip4": {"ip": "10.22.0.5/24", "gateway": "10.22.0.1", "routes": [{"dst": "0.0.0.0/0", "gw": "10.22.0.1"}]},
            "dns": {"nameservers": ["10.22.0.53"]}
        });
    }
    let mut ip = json!({"address": "10.22.0.5/24", "gateway": "10.22.0.1", "interface": 1});
    if version.starts_with('0') {
        ip["version"] = "4".into();
    }
    json!({
        "cniVersion": version,
        "interfaces": [
            {"name": "cni0", "mac": "0a:58:0a:16:00:01"},
            {"name": "eth0", "mac": "0a:58:0a:16:00:05", "sandbox": "/run/netns/whatever"}
        ],
        "ips": [ip],
        "routes": [{"dst": "0.0.0.0/0", "gw": "10.22.0.1"}],
        "dns": {"nameservers": ["10.22.0.53"], "search": ["cluster.local"]}
    })
}

#[test]
fn chained_add_passes_prev_result_through() {
    let node = Node::new();
    for version in SUPPORTED_VERSIONS {
        let pod = fresh_pod(&node);
        let prev = main_plugin_result(version);
        let mut stdin = conf(version);
        stdin["prevResult"] = prev.clone();
        let out = run(&node, "ADD", &pod.path, &stdin);
        assert_eq!(*out.expect_ok(), prev, "{version}");
        assert!(lo_is_up(&pod), "{version}: chained ADD must still bring lo up");
    }
}

#[test]
fn chained_add_converts_an_older_prev_result_to_the_config_version() {
    let node = Node::new();
    let pod = fresh_pod(&node);
    let mut stdin = conf("1.0.0");
    stdin["prevResult"] = main_plugin_result("0.2.0");
    let out = run(&node, "ADD", &pod.path, &stdin);
    let result = out.expect_ok();
    assert_eq!(result["cniVersion"], "1.0.0");
    assert_eq!(result["ips"], json!([{"address": "10.22.0.5/24", "gateway": "10.22.0.1"}]));
    assert_eq!(result["routes"], json!([{"dst": "0.0.0.0/0", "gw": "10.22.0.1"}]));
}

#[test]
fn a_bad_prev_result_changes_nothing() {
    let node = Node::new();
    let pod = fresh_pod(&node);
    let mut stdin = conf("1.0.0");
    stdin["prevResult"] = json!({"cniVersion": "1.0.0", "ips": [{"address": "not-an-address"}]});
    let err = run(&node, "ADD", &pod.path, &stdin).expect_err().clone();
    assert_eq!(err["code"], 6, "{err}");
    assert!(!lo_is_up(&pod), "lo brought up although the request was refused");
}
