//! static IPAM: the same answer as the reference 1.1.1 `static` (= v1.9's logic) for configs, `CNI_ARGS`,
//! `args.cni.ips` and `runtimeConfig.ips` in every spec version; and a real pod through our bridge with static
//! IPAM (the address on eth0, the gateway reached, CHECK, DEL).

use std::path::PathBuf;

use netns_tests::cnicore::spec::SUPPORTED_VERSIONS;
use netns_tests::upstream::reference;
use netns_tests::{bin, json, run_binary, Node, PluginOutput, Value};

fn run(node: &Node, binary: PathBuf, verb: &str, conf: &Value, cni_args: &str) -> PluginOutput {
    let env = [
        ("CNI_CONTAINERID", "static1"),
        ("CNI_NETNS", "/proc/self/ns/net"),
        ("CNI_IFNAME", "eth0"),
        ("CNI_ARGS", cni_args),
    ];
    run_binary(node, &binary, verb, &env, conf)
}

fn ipam_conf(version: &str, ipam: Value, extra: Value) -> Value {
    let mut conf = json!({"cniVersion": version, "name": "static-net", "type": "bridge", "ipam": ipam});
    conf.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    conf
}

#[test]
fn same_answers_as_the_reference() {
    let node = Node::new();
    let full = json!({"type": "static",
        "addresses": [{"address": "10.10.0.1/24", "gateway": "10.10.0.254"}, {"address": "3ffe:ffff:0:01ff::1/64"}],
        "routes": [{"dst": "0.0.0.0/0"}, {"dst": "192.168.0.0/16", "gw": "10.10.5.1"}],
        "dns": {"nameservers": ["8.8.8.8"], "domain": "example.com", "search": ["example.com"]}});
    let one = json!({"type": "static", "addresses": [{"address": "10.10.0.1/24", "gateway": "10.10.0.254"}]});
    let cases: Vec<(Value, Value, &str)> = vec![
        (full.clone(), json!({}), ""),
        (one.clone(), json!({}), ""),
        (one.clone(), json!({}), "IP=10.10.1.2/24,10.10.2.2/24;GATEWAY=10.10.1.1"),
        (one.clone(), json!({}), "IgnoreUnknown=1;IP=10.10.1.2/24;FOO=bar"),
        (one.clone(), json!({"args": {"cni": {"ips": ["10.20.0.2/16"]}}}), "IP=10.10.1.2/24"),
        (one.clone(), json!({"runtimeConfig": {"ips": ["10.30.0.3/8", "fd00::3/64"]}}), ""),
        (json!({"type": "static"}), json!({}), ""),
        (one.clone(), json!({}), "IP=10.10.1.2"),
        (one.clone(), json!({}), "FOO=bar"),
        (json!({"type": "static", "addresses": [{"address": "10.0.0.1"}]}), json!({}), ""),
        (one.clone(), json!({"runtimeConfig": {"ips": ["nope"]}}), ""),
    ];
    for version in SUPPORTED_VERSIONS {
        for (ipam, extra, cni_args) in &cases {
            let conf = ipam_conf(version, ipam.clone(), extra.clone());
            let ours = run(&node, bin("static"), "ADD", &conf, cni_args);
            // 1.1.1 predates spec 1.1.0, whose result shape is 1.0.0's: compared with its 1.0.0 answer.
            let mut theirs_conf = conf.clone();
            if *version == "1.1.0" {
                theirs_conf["cniVersion"] = json!("1.0.0");
            }
            let mut theirs = run(&node, reference("static"), "ADD", &theirs_conf, cni_args);
            if theirs.success() {
                theirs.stdout["cniVersion"] = json!(version);
            }
            let what = format!("{version} {conf} CNI_ARGS={cni_args}");
            assert_eq!(ours.success(), theirs.success(), "{what}: ours {} theirs {}", ours.stdout, theirs.stdout);
            if ours.success() {
                assert_eq!(ours.stdout, theirs.stdout, "{what}");
            }
            assert!(run(&node, bin("static"), "DEL", &conf, cni_args).success(), "{what}: DEL");
        }
    }
}

#[test]
fn check_against_the_result() {
    let node = Node::new();
    let ipam = json!({"type": "static", "addresses": [{"address": "10.10.0.1/24", "gateway": "10.10.0.254"}]});
    let mut conf = ipam_conf("1.0.0", ipam, json!({}));
    let result = run(&node, bin("static"), "ADD", &conf, "").expect_ok().clone();
    conf["prevResult"] = result.clone();
    run(&node, bin("static"), "CHECK", &conf, "").expect_ok();
    conf["prevResult"]["ips"][0]["gateway"] = json!("10.10.0.9");
    let e = run(&node, bin("static"), "CHECK", &conf, "").expect_err().clone();
    assert!(e["msg"].as_str().unwrap().contains("Failed to match addr"), "{e}");
    conf.as_object_mut().unwrap().remove("prevResult");
    assert!(run(&node, bin("static"), "CHECK", &conf, "").expect_err()["msg"].as_str().unwrap().contains("prevResult"));
}

#[test]
fn a_pod_on_our_bridge_with_static_addresses() {
    let node = Node::new();
    let pod = node.pod_netns();
    let bridge = netns_tests::unique_name("sb");
    for version in ["0.3.1", "1.1.0"] {
        let conf = json!({"cniVersion": version, "name": "static-net", "type": "bridge", "bridge": bridge,
            "isGateway": true,
            "ipam": {"type": "static", "addresses": [{"address": "10.49.0.5/24", "gateway": "10.49.0.1"}],
                "routes": [{"dst": "0.0.0.0/0"}]}});
        let env = [("CNI_CONTAINERID", "static1"), ("CNI_NETNS", pod.path.to_str().unwrap()), ("CNI_IFNAME", "eth0")];
        let result = node.run_plugin("bridge", "ADD", &env, &conf).expect_ok().clone();
        let pod_ip = result["ips"].as_array().unwrap().iter().find(|ip| ip["address"] == "10.49.0.5/24");
        assert!(pod_ip.is_some(), "{result}");
        assert!(pod.ip(&["-4", "addr", "show", "dev", "eth0"]).contains("10.49.0.5/24"));
        assert!(pod.ip(&["route"]).contains("default via 10.49.0.1 dev eth0"));
        assert!(pod.ping("10.49.0.1".parse().unwrap()), "the pod cannot reach its gateway");
        let mut check = conf.clone();
        check["prevResult"] = result;
        if version != "0.3.1" {
            node.run_plugin("bridge", "CHECK", &env, &check).expect_ok();
        }
        node.run_plugin("bridge", "DEL", &env, &conf).expect_ok();
        assert!(pod.netlink().link_by_name("eth0").unwrap().is_none());
    }
}
