//! host-device, static, sbr and tap in conflists, driven by our cnitool and by upstream cnitool (libcni 1.1.2):
//! `host-device` (static IPAM) + `sbr`, and `tap` (static IPAM). ADD, CHECK (from the runner's cached result) and
//! DEL through each runner, the kernel state read back after each, nothing left after DEL.

use std::fs;
use std::path::{Path, PathBuf};

use netns_tests::upstream::{clean_command, output, plugin_dir, upstream_cnitool, with_var_lib_cni, VarLibCni};
use netns_tests::{bin, json, unique_name, veth_between, Node, PluginOutput, TestNetns, Value};

const POD_IP: &str = "10.51.0.5";

struct Lab {
    node: Node,
    pod: TestNetns,
    conf_dir: PathBuf,
    cni_path: PathBuf,
    cache: VarLibCni,
}

impl Lab {
    fn new(plugins: &[&str]) -> Lab {
        let node = Node::new();
        let pod = node.pod_netns();
        let dir = node.dir().to_path_buf();
        let conf_dir = dir.join("net.d");
        fs::create_dir_all(&conf_dir).expect("conf dir");
        let binaries: Vec<(String, PathBuf)> = plugins.iter().map(|p| (p.to_string(), bin(p))).collect();
        let links: Vec<(&str, &Path)> = binaries.iter().map(|(n, p)| (n.as_str(), p.as_path())).collect();
        let cni_path = plugin_dir(&dir.join("bin"), &links);
        let cache = VarLibCni::new(&dir);
        Lab { node, pod, conf_dir, cni_path, cache }
    }

    fn write(&self, name: &str, plugins: Vec<Value>) {
        let conflist = json!({"cniVersion": "1.0.0", "name": name, "plugins": plugins});
        fs::write(self.conf_dir.join(format!("{name}.conflist")), conflist.to_string()).expect("conflist");
    }

    fn cnitool(&self, upstream: Option<&Path>, verb: &str, network: &str, ifname: &str) -> PluginOutput {
        let mut command = match upstream {
            Some(tool) => {
                let mut command = clean_command(&self.node, tool);
                with_var_lib_cni(&mut command, &self.cache);
                command
            }
            None => {
                let mut command = clean_command(&self.node, bin("cnitool"));
                command.env("CNI_CACHE_DIR", self.cache.path());
                command
            }
        };
        command
            .args([verb, network, self.pod.path.to_str().expect("utf-8")])
            .env("NETCONFPATH", &self.conf_dir)
            .env("CNI_PATH", &self.cni_path)
            .env("CNI_IFNAME", ifname);
        output(&mut command, b"")
    }
}

fn ok(out: &PluginOutput, what: &str) -> Value {
    assert!(out.success(), "{what} failed: stdout {} stderr {}", out.stdout_text, out.stderr);
    out.stdout.clone()
}

fn host_device_and_sbr(upstream: Option<&Path>) {
    let lab = Lab::new(&["host-device", "static", "sbr"]);
    let wan = TestNetns::new("wan");
    let device = unique_name("md");
    veth_between(&lab.node, &wan, &device, &unique_name("mw"), &[], &["10.51.0.1/24".parse().unwrap()]);
    lab.write(
        "hdnet",
        vec![
            json!({"type": "host-device", "device": device, "dataDir": lab.node.dir().join("host-device"),
                "ipam": {"type": "static",
                "addresses": [{"address": format!("{POD_IP}/24"), "gateway": "10.51.0.1"}]}}),
            json!({"type": "sbr"}),
        ],
    );
    let result = ok(&lab.cnitool(upstream, "add", "hdnet", "eth0"), "add");
    assert_eq!(result["ips"][0]["address"], format!("{POD_IP}/24"), "{result}");
    assert!(lab.pod.ip(&["rule"]).contains(&format!("from {POD_IP} lookup 100")));
    assert!(lab.pod.ip(&["route", "show", "table", "100"]).contains("default via 10.51.0.1 dev eth0"));
    let ping = lab.pod.exec("ping", &["-c", "1", "-W", "2", "-I", POD_IP, "10.51.0.1"], &[], b"");
    assert!(ping.status.success(), "no traffic through the moved device");
    ok(&lab.cnitool(upstream, "check", "hdnet", "eth0"), "check");
    ok(&lab.cnitool(upstream, "del", "hdnet", "eth0"), "del");
    assert!(!lab.pod.ip(&["rule"]).contains(POD_IP), "rule left");
    assert!(lab.pod.netlink().link_by_name("eth0").unwrap().is_none(), "device left in the pod");
    assert!(lab.node.netlink().link_by_name(&device).unwrap().is_some(), "device not back in the node");
}

fn tap(upstream: Option<&Path>) {
    let lab = Lab::new(&["tap", "static"]);
    lab.write(
        "tapnet",
        vec![json!({"type": "tap", "multiQueue": true, "mtu": 1400,
            "ipam": {"type": "static", "addresses": [{"address": format!("{POD_IP}/24")}]}})],
    );
    let result = ok(&lab.cnitool(upstream, "add", "tapnet", "tap0"), "add");
    assert_eq!(result["interfaces"][0]["name"], "tap0", "{result}");
    let link = lab.pod.ip_json(&["-d", "link", "show", "tap0"])[0].clone();
    assert_eq!(link["linkinfo"]["info_data"]["multi_queue"], true, "{link}");
    assert_eq!(link["mtu"], 1400);
    ok(&lab.cnitool(upstream, "check", "tapnet", "tap0"), "check");
    ok(&lab.cnitool(upstream, "del", "tapnet", "tap0"), "del");
    assert!(lab.pod.netlink().link_by_name("tap0").unwrap().is_none(), "tap left");
}

fn upstream() -> Option<PathBuf> {
    let tool = upstream_cnitool();
    if tool.is_none() {
        assert!(std::env::var("CI").as_deref() != Ok("true"), "upstream cnitool is missing in CI");
    }
    tool
}

#[test]
fn host_device_static_sbr_through_our_cnitool() {
    host_device_and_sbr(None);
}

#[test]
fn host_device_static_sbr_through_upstream_cnitool() {
    if let Some(tool) = upstream() {
        host_device_and_sbr(Some(&tool));
    }
}

#[test]
fn tap_static_through_our_cnitool() {
    tap(None);
}

#[test]
fn tap_static_through_upstream_cnitool() {
    if let Some(tool) = upstream() {
        tap(Some(&tool));
    }
}

/// VERSION as podman asks it (`CNI_NETNS=dummy CNI_PATH=dummy`): every spec version, for each plugin.
#[test]
fn version_of_each_plugin_as_podman_asks() {
    let node = Node::new();
    let env = [("CNI_COMMAND", "VERSION"), ("CNI_NETNS", "dummy"), ("CNI_PATH", "dummy"), ("CNI_IFNAME", "dummy")];
    for plugin in ["static", "host-device", "tap", "sbr", "vrf"] {
        let out = netns_tests::upstream::run_raw(&node, bin(plugin), &[], &env, br#"{"cniVersion":"0.4.0"}"#);
        let answer = ok(&out, plugin);
        assert_eq!(answer["cniVersion"], "0.4.0", "{plugin}: {answer}");
        let versions = answer["supportedVersions"].as_array().expect("supportedVersions");
        assert_eq!(versions.len(), netns_tests::cnicore::spec::SUPPORTED_VERSIONS.len(), "{plugin}: {answer}");
    }
}
