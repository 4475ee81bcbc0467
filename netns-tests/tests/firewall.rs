//! The firewall plugin against the kernel, the reference plugin and a real firewalld, with real packets
//! between namespaces made per test:
//!
//! ```text
//!   pod a (10.88.1.2, fd88:1::2) --veth-- br-a (10.88.1.1) ┐
//!                                                          node (FORWARD policy DROP) --up0-- wan (192.168.60.2, fd60::2)
//!   pod b (10.88.2.2, fd88:2::2) --veth-- br-b (10.88.2.1) ┘
//! ```
//!
//! Plugins, iptables, nft and firewalld run inside the node namespace only; firewalld talks on a private
//! D-Bus bus of the test's own (`DBUS_SYSTEM_BUS_ADDRESS`), never the host's. Build first
//! (`cargo build -p firewall`).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use netns_tests::upstream::{clean_command, output, reference};
use netns_tests::{
    ip, json, net, require_programs, veth_between, wait_for, Daemon, Node, PluginOutput, TestNetns, Value,
};

const NETWORK: &str = "fwtest";

/// A pod on one of the node's bridges.
struct Pod {
    ns: TestNetns,
    bridge: &'static str,
    v4: &'static str,
    v6: &'static str,
}

struct Lab {
    node: Node,
    a: Pod,
    b: Pod,
    wan: TestNetns,
    /// The D-Bus system bus the plugins see: nothing there unless a test starts its own.
    bus: String,
}

impl Lab {
    /// The namespaces, bridges and routes; the node forwards, with FORWARD policy DROP when `drop` is set.
    fn new(drop: bool) -> Lab {
        let node = Node::new();
        let wan = TestNetns::new("wan");
        veth_between(
            &node,
            &wan,
            "up0",
            "wan0",
            &[net("192.168.60.1/24"), net("fd60::1/64")],
            &[net("192.168.60.2/24"), net("fd60::2/64")],
        );
        wan.ip(&["route", "add", "10.88.0.0/16", "via", "192.168.60.1"]);
        wan.ip(&["-6", "route", "add", "fd88::/16", "via", "fd60::1"]);
        let a = pod_on(&node, "br-a", "va", 1, "10.88.1.2", "fd88:1::2");
        let b = pod_on(&node, "br-b", "vb", 2, "10.88.2.2", "fd88:2::2");
        node.run(|| {
            cnicore::sysctl::write("net/ipv4/ip_forward", "1").expect("ip_forward");
            cnicore::sysctl::write("net/ipv6/conf/all/forwarding", "1").expect("ipv6 forwarding");
        });
        // Neighbours first: the first packets after the links come up can be lost to neighbour discovery.
        for (from, to) in [
            (&a.ns, "10.88.1.1"),
            (&a.ns, "fd88:1::1"),
            (&b.ns, "10.88.2.1"),
            (&b.ns, "fd88:2::1"),
            (&wan, "192.168.60.1"),
            (&wan, "fd60::1"),
        ] {
            assert!((0..5).any(|_| from.ping(ip(to))), "no ping answer from {to} in {}", from.name);
        }
        if drop {
            for binary in ["iptables", "ip6tables"] {
                let out = node.exec(binary, &["-P", "FORWARD", "DROP"], &[], b"");
                assert!(out.status.success(), "{binary} -P FORWARD DROP: {}", String::from_utf8_lossy(&out.stderr));
            }
        }
        let bus = format!("unix:path={}", node.dir().join("no-bus").display());
        Lab { node, a, b, wan, bus }
    }

    fn data_dir(&self) -> PathBuf {
        self.node.dir().join("firewall")
    }

    /// The pod's prevResult as the bridge plugin makes it: bridge, host veth, pod interface; both addresses.
    fn prev_result(&self, pod: &Pod) -> Value {
        json!({
            "cniVersion": "0.4.0",
            "interfaces": [{"name": pod.bridge}, {"name": "vethx"}, {"name": "eth0", "sandbox": pod.ns.path}],
            "ips": [{"version": "4", "address": format!("{}/24", pod.v4), "interface": 2},
                    {"version": "6", "address": format!("{}/64", pod.v6), "interface": 2}]
        })
    }

    fn conf(&self, pod: &Pod, backend: &str, extra: Value) -> Value {
        let mut conf = json!({
            "cniVersion": "0.4.0", "name": NETWORK, "type": "firewall", "backend": backend,
            "dataDir": self.data_dir(), "prevResult": self.prev_result(pod),
        });
        for (k, v) in extra.as_object().into_iter().flatten() {
            conf[k] = v.clone();
        }
        conf
    }

    /// The environment of a call; GC (an empty container ID) gets no attachment variables.
    fn env<'a>(&'a self, container_id: &'a str, pod: &'a Pod) -> Vec<(&'a str, String)> {
        let mut env = vec![("DBUS_SYSTEM_BUS_ADDRESS", self.bus.clone())];
        if !container_id.is_empty() {
            env.push(("CNI_CONTAINERID", container_id.to_string()));
            env.push(("CNI_NETNS", pod.ns.path.to_string_lossy().into_owned()));
            env.push(("CNI_IFNAME", "eth0".to_string()));
        }
        env
    }

    fn ours(&self, command: &str, container_id: &str, pod: &Pod, conf: &Value) -> PluginOutput {
        let env = self.env(container_id, pod);
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        self.node.run_plugin("firewall", command, &env, conf)
    }

    fn theirs(&self, command: &str, container_id: &str, pod: &Pod, conf: &Value) -> PluginOutput {
        let mut cmd = clean_command(&self.node, reference("firewall"));
        cmd.env("CNI_COMMAND", command).env("CNI_PATH", "/usr/lib/cni").envs(self.env(container_id, pod));
        output(&mut cmd, conf.to_string().as_bytes())
    }

    /// `iptables-save -t filter` and `ip6tables-save -t filter` of the node, without comments and counters.
    fn iptables(&self) -> String {
        let mut text = String::new();
        for binary in ["iptables-save", "ip6tables-save"] {
            let out = self.node.exec(binary, &["-t", "filter"], &[], b"");
            assert!(out.status.success(), "{binary}: {}", String::from_utf8_lossy(&out.stderr));
            for line in String::from_utf8_lossy(&out.stdout).lines().filter(|l| !l.starts_with('#')) {
                text.push_str(line);
                text.push('\n');
            }
        }
        text
    }

    fn nft(&self) -> String {
        let out = self.node.exec("nft", &["list", "ruleset"], &[], b"");
        assert!(out.status.success(), "nft: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Pod → wan in both families: true when both answer, false when neither does (anything else fails).
    fn reaches_wan(&self, pod: &Pod) -> bool {
        both(pod.ns.ping(ip("192.168.60.2")), pod.ns.ping(ip("fd60::2")), "pod to wan")
    }

    fn reaches(&self, from: &Pod, to: &Pod) -> bool {
        both(from.ns.ping(ip(to.v4)), from.ns.ping(ip(to.v6)), "pod to pod")
    }
}

/// A pod on bridge `bridge` (made with gateway 10.88.<n>.1 and fd88:<n>::1 when missing), through host veth
/// `veth`.
fn pod_on(node: &Node, bridge: &'static str, veth: &str, n: u8, v4: &'static str, v6: &'static str) -> Pod {
    let ns = node.pod_netns();
    if !node.links().iter().any(|l| l == bridge) {
        node.ip(&["link", "add", bridge, "type", "bridge"]);
        node.ip(&["addr", "add", &format!("10.88.{n}.1/24"), "dev", bridge]);
        node.ip(&["addr", "add", &format!("fd88:{n}::1/64"), "dev", bridge, "nodad"]);
        node.ip(&["link", "set", bridge, "up"]);
    }
    veth_between(node, &ns, veth, "eth0", &[], &[net(&format!("{v4}/24")), net(&format!("{v6}/64"))]);
    node.ip(&["link", "set", veth, "master", bridge]);
    ns.ip(&["route", "add", "default", "via", &format!("10.88.{n}.1")]);
    ns.ip(&["-6", "route", "add", "default", "via", &format!("fd88:{n}::1")]);
    Pod { ns, bridge, v4, v6 }
}

fn both(v4: bool, v6: bool, what: &str) -> bool {
    assert_eq!(v4, v6, "{what}: IPv4 answered {v4}, IPv6 answered {v6}");
    v4
}

fn code(out: &PluginOutput) -> u64 {
    out.expect_err()["code"].as_u64().unwrap_or(0)
}

fn gc_conf(lab: &Lab, backend: &str, valid: &[&str]) -> Value {
    let valid: Vec<Value> = valid.iter().map(|id| json!({"containerID": id, "ifname": "eth0"})).collect();
    json!({"cniVersion": "1.1.0", "name": NETWORK, "type": "firewall", "backend": backend,
           "dataDir": lab.data_dir(), "cni.dev/valid-attachments": valid})
}

/// The reference layout, exactly, after ADD of pod a (iptables, the backend chosen for "" without firewalld).
#[test]
fn iptables_opens_forwarding_for_the_pod_and_del_closes_it() {
    let lab = Lab::new(true);
    assert!(!lab.reaches_wan(&lab.a), "FORWARD policy DROP must stop the pod before ADD");
    let conf = lab.conf(&lab.a, "", json!({}));
    let result = lab.ours("ADD", "ca", &lab.a, &conf).expect_ok().clone();
    assert_eq!(result["ips"], lab.prev_result(&lab.a)["ips"], "prevResult is passed through");
    assert!(lab.reaches_wan(&lab.a), "ADD must let the pod's traffic and its replies through");
    assert!(!lab.wan.ping(ip(lab.a.v4)) && !lab.wan.ping(ip(lab.a.v6)), "new connections from outside stay refused");
    assert!(!lab.reaches_wan(&lab.b), "another pod is not opened");
    let saved = lab.iptables();
    // Saved output of both families: the shared rules twice, each address's once.
    for line in [
        "-A FORWARD -m comment --comment \"CNI firewall plugin rules\" -j CNI-FORWARD",
        "-A CNI-FORWARD -m comment --comment \"CNI firewall plugin admin overrides\" -j CNI-ADMIN",
    ] {
        assert_eq!(saved.matches(line).count(), 2, "{line} once per family in\n{saved}");
    }
    for line in [
        "-A CNI-FORWARD -d 10.88.1.2/32 -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
        "-A CNI-FORWARD -s 10.88.1.2/32 -j ACCEPT",
        "-A CNI-FORWARD -d fd88:1::2/128 -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
        "-A CNI-FORWARD -s fd88:1::2/128 -j ACCEPT",
    ] {
        assert_eq!(saved.matches(line).count(), 1, "{line} once in\n{saved}");
    }
    // A repeated ADD adds nothing; CHECK finds everything.
    lab.ours("ADD", "ca", &lab.a, &conf).expect_ok();
    assert_eq!(lab.iptables(), saved);
    lab.ours("CHECK", "ca", &lab.a, &conf).expect_ok();
    assert!(lab.data_dir().join(NETWORK).join("ca:eth0").is_file(), "the attachment is recorded");

    lab.ours("DEL", "ca", &lab.a, &conf).expect_ok();
    assert!(!lab.reaches_wan(&lab.a), "DEL must close the pod's forwarding again");
    let after = lab.iptables();
    assert!(!after.contains("10.88.1.2") && !after.contains("fd88:1::2"), "{after}");
    assert!(!lab.data_dir().join(NETWORK).join("ca:eth0").exists());
    let check = lab.ours("CHECK", "ca", &lab.a, &conf);
    assert_eq!(code(&check), 999, "CHECK after DEL: {}", check.stdout_text);
    // DEL is tolerant of everything already gone, and of no prevResult at all.
    lab.ours("DEL", "ca", &lab.a, &conf).expect_ok();
    let mut bare = conf.clone();
    bare.as_object_mut().expect("object").remove("prevResult");
    lab.ours("DEL", "ca", &lab.a, &bare).expect_ok();
    assert_eq!(lab.iptables(), after);
}

#[test]
fn same_bridge_isolates_bridges_from_each_other() {
    let lab = Lab::new(true);
    for (id, pod) in [("ca", &lab.a), ("cb", &lab.b)] {
        lab.ours("ADD", id, pod, &lab.conf(pod, "iptables", json!({}))).expect_ok();
    }
    assert!(lab.reaches(&lab.a, &lab.b) && lab.reaches(&lab.b, &lab.a), "open policy: bridges reach each other");
    for (id, pod) in [("ca", &lab.a), ("cb", &lab.b)] {
        lab.ours("DEL", id, pod, &lab.conf(pod, "iptables", json!({}))).expect_ok();
    }
    let isolated = |pod| lab.conf(pod, "iptables", json!({"ingressPolicy": "same-bridge"}));
    for (id, pod) in [("ca", &lab.a), ("cb", &lab.b)] {
        lab.ours("ADD", id, pod, &isolated(pod)).expect_ok();
        lab.ours("CHECK", id, pod, &isolated(pod)).expect_ok();
    }
    assert!(!lab.reaches(&lab.a, &lab.b) && !lab.reaches(&lab.b, &lab.a), "same-bridge: the bridges are isolated");
    assert!(lab.reaches_wan(&lab.a) && lab.reaches_wan(&lab.b), "same-bridge: the uplink is not a bridge of CNI");
    let saved = lab.iptables();
    assert_eq!(saved.matches("-j CNI-ISOLATION-STAGE-1").count(), 2, "one jump per family:\n{saved}");
    let forward: Vec<&str> = saved.lines().filter(|l| l.starts_with("-A FORWARD ")).collect();
    assert!(forward[0].ends_with("-j CNI-ISOLATION-STAGE-1"), "isolation comes first: {forward:?}");
    // DEL leaves the bridge's isolation rules (shared by its pods), as the reference does.
    lab.ours("DEL", "ca", &lab.a, &isolated(&lab.a)).expect_ok();
    assert!(lab.iptables().contains("-A CNI-ISOLATION-STAGE-2 -o br-a"));
    // A missing bridge name is a config error, before anything changes.
    let mut no_bridge = isolated(&lab.a);
    no_bridge["prevResult"]["interfaces"][0]["name"] = json!("");
    assert_eq!(code(&lab.ours("ADD", "cx", &lab.a, &no_bridge)), 7);
}

/// ingressPolicy "isolated" (v1.7): the pods of one bridge no longer reach each other, nor another bridge's,
/// and still reach the wan; with both backends. The node's bridge-nf-call sysctls are turned on (without them
/// traffic between two ports of a bridge never reaches the firewall).
#[test]
fn isolated_cuts_off_the_pods_of_one_bridge_from_each_other() {
    for backend in ["iptables", "nftables"] {
        let lab = Lab::new(backend == "iptables");
        let c = pod_on(&lab.node, "br-a", "vc", 1, "10.88.1.3", "fd88:1::3");
        for to in ["10.88.1.1", "fd88:1::1"] {
            assert!((0..5).any(|_| c.ns.ping(ip(to))), "no ping answer from {to} in {}", c.ns.name);
        }
        lab.node.run(|| {
            for name in ["net/bridge/bridge-nf-call-iptables", "net/bridge/bridge-nf-call-ip6tables"] {
                cnicore::sysctl::write(name, "0").expect(name);
            }
        });
        let open = |pod| lab.conf(pod, backend, json!({}));
        for (id, pod) in [("ca", &lab.a), ("cc", &c)] {
            lab.ours("ADD", id, pod, &open(pod)).expect_ok();
        }
        // Neighbours first: the first packets between two new neighbours can be lost to neighbour discovery.
        for to in [c.v4, c.v6] {
            assert!((0..5).any(|_| lab.a.ns.ping(ip(to))), "{backend}: no ping answer from {to}");
        }
        assert!(lab.reaches(&lab.a, &c) && lab.reaches(&c, &lab.a), "{backend}, open policy: one bridge's pods talk");
        for (id, pod) in [("ca", &lab.a), ("cc", &c)] {
            lab.ours("DEL", id, pod, &open(pod)).expect_ok();
        }

        let isolated = |pod| lab.conf(pod, backend, json!({"ingressPolicy": "isolated"}));
        for (id, pod) in [("ca", &lab.a), ("cc", &c), ("cb", &lab.b)] {
            lab.ours("ADD", id, pod, &isolated(pod)).expect_ok();
            lab.ours("CHECK", id, pod, &isolated(pod)).expect_ok();
        }
        let sysctls = lab.node.run(|| {
            ["net/bridge/bridge-nf-call-iptables", "net/bridge/bridge-nf-call-ip6tables"]
                .map(|name| cnicore::sysctl::read(name).expect(name))
        });
        assert_eq!(sysctls, ["1", "1"], "{backend}");
        assert!(!lab.reaches(&lab.a, &c) && !lab.reaches(&c, &lab.a), "{backend}, isolated: same-bridge pods cut off");
        assert!(!lab.reaches(&lab.a, &lab.b), "{backend}, isolated: bridges cut off");
        assert!(lab.reaches_wan(&lab.a) && lab.reaches_wan(&c), "{backend}, isolated: the wan is reachable");
        match backend {
            "iptables" => {
                let saved = lab.iptables();
                let stage1: Vec<&str> =
                    saved.lines().filter(|l| l.starts_with("-A CNI-ISOLATION-STAGE-1 -i br-a ")).collect();
                assert_eq!(stage1.len(), 4, "one drop and one across-bridges rule per family:\n{saved}");
                assert!(stage1[0].contains("-i br-a -o br-a ") && stage1[0].ends_with("-j DROP"), "{stage1:?}");
            }
            _ => assert!(lab.nft().contains("iifname . oifname @within_bridge drop"), "{}", lab.nft()),
        }
        // A missing bridge name is a config error that names the policy.
        let mut no_bridge = isolated(&lab.a);
        no_bridge["prevResult"]["interfaces"][0]["name"] = json!("");
        let error = lab.ours("ADD", "cx", &lab.a, &no_bridge).expect_err().clone();
        assert!(error["msg"].as_str().unwrap_or_default().contains("\"isolated\""), "{error}");
        // Unlike the reference, the drop goes with the bridge's last isolated attachment (DEL or GC), so a
        // same-bridge network on the bridge later is not cut off by it; the same-bridge rules stay.
        let drop_of_br_a = || match backend {
            "iptables" => lab.iptables().lines().any(|l| l.starts_with("-A CNI-ISOLATION-STAGE-1 -i br-a -o br-a ")),
            _ => {
                let out = lab.node.exec("nft", &["list", "set", "inet", "cni_firewall", "within_bridge"], &[], b"");
                String::from_utf8_lossy(&out.stdout).contains("\"br-a\" . \"br-a\"")
            }
        };
        lab.ours("DEL", "ca", &lab.a, &isolated(&lab.a)).expect_ok();
        assert!(drop_of_br_a(), "{backend}: pod c still wants the drop");
        lab.ours("DEL", "cc", &c, &isolated(&c)).expect_ok();
        assert!(!drop_of_br_a(), "{backend}: the drop outlived the bridge's last isolated attachment");
        let same_bridge = |pod| lab.conf(pod, backend, json!({"ingressPolicy": "same-bridge"}));
        for (id, pod) in [("ca", &lab.a), ("cc", &c)] {
            lab.ours("ADD", id, pod, &same_bridge(pod)).expect_ok();
        }
        assert!(lab.reaches(&lab.a, &c), "{backend}: same-bridge after isolated, the pods of br-a talk");
        for (id, pod) in [("ca", &lab.a), ("cc", &c)] {
            lab.ours("DEL", id, pod, &same_bridge(pod)).expect_ok();
        }
        // GC of an isolated attachment not valid any more removes the drop too.
        lab.ours("ADD", "ca", &lab.a, &isolated(&lab.a)).expect_ok();
        assert!(drop_of_br_a(), "{backend}");
        lab.ours("GC", "", &lab.a, &gc_conf(&lab, backend, &["cb"])).expect_ok();
        assert!(!drop_of_br_a(), "{backend}: GC left the drop");
        lab.ours("DEL", "cb", &lab.b, &isolated(&lab.b)).expect_ok();
    }
}

#[test]
fn nftables_backend_isolates_and_cleans_up() {
    let lab = Lab::new(false);
    let isolated = |pod| lab.conf(pod, "nftables", json!({"ingressPolicy": "same-bridge"}));
    assert!(lab.reaches(&lab.a, &lab.b));
    for (id, pod) in [("ca", &lab.a), ("cb", &lab.b)] {
        lab.ours("ADD", id, pod, &isolated(pod)).expect_ok();
        lab.ours("CHECK", id, pod, &isolated(pod)).expect_ok();
    }
    assert!(!lab.reaches(&lab.a, &lab.b), "same-bridge with nftables: the bridges are isolated");
    assert!(lab.reaches_wan(&lab.a));
    let ruleset = lab.nft();
    assert!(
        ruleset.contains("table inet cni_firewall") && ruleset.contains("10.88.1.2") && ruleset.contains("fd88:2::2"),
        "{ruleset}"
    );
    assert!(!lab.iptables().contains("CNI-"), "the nftables backend leaves iptables alone");
    lab.ours("DEL", "ca", &lab.a, &isolated(&lab.a)).expect_ok();
    let ruleset = lab.nft();
    assert!(
        !ruleset.contains("10.88.1.2") && !ruleset.contains("fd88:1::2") && ruleset.contains("10.88.2.2"),
        "{ruleset}"
    );
    assert_eq!(code(&lab.ours("CHECK", "ca", &lab.a, &isolated(&lab.a))), 999);
    lab.ours("DEL", "ca", &lab.a, &isolated(&lab.a)).expect_ok();
    // GC by the owner tags: b is not valid any more.
    lab.ours("GC", "", &lab.a, &gc_conf(&lab, "nftables", &["ca"])).expect_ok();
    assert!(!lab.nft().contains("10.88.2.2"), "{}", lab.nft());
}

#[test]
fn gc_removes_the_rules_of_attachments_not_valid() {
    let lab = Lab::new(true);
    for (id, pod) in [("ca", &lab.a), ("cb", &lab.b)] {
        lab.ours("ADD", id, pod, &lab.conf(pod, "iptables", json!({}))).expect_ok();
    }
    lab.ours("STATUS", "", &lab.a, &gc_conf(&lab, "iptables", &[])).expect_ok();
    lab.ours("GC", "", &lab.a, &gc_conf(&lab, "iptables", &["cb"])).expect_ok();
    assert!(!lab.reaches_wan(&lab.a), "GC closed the pod that is not valid");
    assert!(lab.reaches_wan(&lab.b), "GC kept the valid pod");
    let saved = lab.iptables();
    assert!(!saved.contains("10.88.1.2") && saved.contains("10.88.2.2"), "{saved}");
    assert!(!lab.data_dir().join(NETWORK).join("ca:eth0").exists());
    // DEL without prevResult finds the addresses in the record.
    let mut bare = lab.conf(&lab.b, "iptables", json!({}));
    bare.as_object_mut().expect("object").remove("prevResult");
    lab.ours("DEL", "cb", &lab.b, &bare).expect_ok();
    assert!(!lab.reaches_wan(&lab.b));
    assert!(!lab.iptables().contains("10.88.2.2"));
}

/// ADD by the reference, DEL by ours, and the other way round: nothing of the pod is left, and the rules
/// are the same text (so an ADD over the other's adds nothing).
#[test]
fn takeover_with_the_reference_plugin_both_ways() {
    let lab = Lab::new(true);
    let conf = |pod| lab.conf(pod, "iptables", json!({"ingressPolicy": "same-bridge"}));
    lab.theirs("ADD", "ca", &lab.a, &conf(&lab.a)).expect_ok();
    assert!(lab.reaches_wan(&lab.a));
    let theirs = lab.iptables();
    lab.ours("ADD", "ca", &lab.a, &conf(&lab.a)).expect_ok();
    assert_eq!(lab.iptables(), theirs, "our ADD over theirs adds nothing");
    lab.ours("CHECK", "ca", &lab.a, &conf(&lab.a)).expect_ok();
    lab.ours("DEL", "ca", &lab.a, &conf(&lab.a)).expect_ok();
    assert!(!lab.reaches_wan(&lab.a), "our DEL closes what theirs opened");
    assert!(!lab.iptables().contains("10.88.1.2"));

    lab.ours("ADD", "cb", &lab.b, &conf(&lab.b)).expect_ok();
    let ours = lab.iptables();
    lab.theirs("CHECK", "cb", &lab.b, &conf(&lab.b)).expect_ok();
    lab.theirs("ADD", "cb", &lab.b, &conf(&lab.b)).expect_ok();
    assert_eq!(lab.iptables(), ours, "their ADD over ours adds nothing");
    lab.theirs("DEL", "cb", &lab.b, &conf(&lab.b)).expect_ok();
    assert!(!lab.reaches_wan(&lab.b), "their DEL closes what ours opened");
    let after = lab.iptables();
    assert!(!after.contains("10.88.2.2") && !after.contains("fd88:2::2"), "{after}");
    assert!(!lab.reaches(&lab.a, &lab.b), "isolation of both bridges stays");
}

/// A firewalld of the test's own: a private D-Bus system bus in the node's directory, and firewalld in the
/// node namespace with its configuration in the node's directory. Both are ended by PID on drop, firewalld
/// first.
struct PrivateFirewalld {
    firewalld: Daemon,
    dbus: Daemon,
    address: String,
}

impl PrivateFirewalld {
    /// `None` (after saying why) when dbus-daemon or firewalld is not installed; a failure under CI=true.
    fn start(node: &Node) -> Option<PrivateFirewalld> {
        let tools = ["dbus-daemon", "firewalld", "dbus-send"];
        if !require_programs(&tools, "run scripts/setup.sh (installs firewalld and dbus-daemon)") {
            return None;
        }
        let dir = node.dir().join("firewalld");
        let etc = dir.join("etc");
        fs::create_dir_all(&etc).expect("firewalld dirs");
        fs::write(
            etc.join("firewalld.conf"),
            "DefaultZone=public\nCleanupOnExit=yes\nFirewallBackend=nftables\nIPv6_rpfilter=yes\n",
        )
        .expect("firewalld.conf");
        let socket = dir.join("bus.sock");
        let address = format!("unix:path={}", socket.display());
        let config = dir.join("bus.conf");
        fs::write(&config, bus_config(&socket)).expect("bus config");
        let log = |name: &str| Stdio::from(fs::File::create(dir.join(name)).expect("log file"));
        let dbus = Daemon::spawn(
            Command::new("dbus-daemon")
                .args(["--nofork", "--nopidfile", "--config-file"])
                .arg(&config)
                .stdout(log("dbus.log"))
                .stderr(log("dbus.err")),
        );
        assert!(wait_for(STARTUP, || socket.exists()).is_some(), "timed out waiting for the private bus socket");
        let firewalld = Daemon::spawn(
            node.command("firewalld")
                .args(["--nofork", "--nopid", "--log-target", "console", "--system-config"])
                .arg(&etc)
                .env_clear()
                .env("PATH", std::env::var_os("PATH").unwrap_or_default())
                .env("DBUS_SYSTEM_BUS_ADDRESS", &address)
                .stdout(log("firewalld.log"))
                .stderr(log("firewalld.err")),
        );
        let firewalld = PrivateFirewalld { firewalld, dbus, address };
        let address = firewalld.address.clone();
        let running = wait_for(STARTUP, || {
            let out = Command::new("dbus-send")
                .args([
                    &format!("--bus={address}"),
                    "--print-reply",
                    "--dest=org.freedesktop.DBus",
                    "/org/freedesktop/DBus",
                ])
                .args(["org.freedesktop.DBus.NameHasOwner", "string:org.fedoraproject.FirewallD1"])
                .output()
                .expect("dbus-send");
            String::from_utf8_lossy(&out.stdout).contains("boolean true")
        });
        assert!(running.is_some(), "timed out waiting for firewalld on the private bus");
        Some(firewalld)
    }

    /// Calls a firewalld method with string arguments on the private bus; its printed reply.
    fn call(&self, method: &str, args: &[&str]) -> String {
        let out = Command::new("dbus-send")
            .args([&format!("--bus={}", self.address), "--print-reply", "--dest=org.fedoraproject.FirewallD1"])
            .args(["/org/fedoraproject/FirewallD1", method])
            .args(args.iter().map(|a| format!("string:{a}")))
            .output()
            .expect("dbus-send");
        assert!(out.status.success(), "{method}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `querySource(zone, address)`.
    fn has_source(&self, zone: &str, address: &str) -> bool {
        self.call("org.fedoraproject.FirewallD1.zone.querySource", &[zone, address]).contains("boolean true")
    }
}

impl Drop for PrivateFirewalld {
    /// SIGTERM first: firewalld removes its rules on exit (CleanupOnExit).
    fn drop(&mut self) {
        self.firewalld.terminate(Duration::from_secs(5));
        self.dbus.terminate(Duration::from_secs(5));
    }
}

/// How long the private bus and firewalld may take to start.
const STARTUP: Duration = Duration::from_secs(30);

/// A system-bus-like configuration on a socket of the test's, for root only.
fn bus_config(socket: &Path) -> String {
    format!(
        r#"<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>system</type>
  <listen>unix:path={}</listen>
  <auth>EXTERNAL</auth>
  <policy user="root">
    <allow own="*"/>
    <allow send_destination="*"/>
    <allow receive_sender="*"/>
  </policy>
</busconfig>
"#,
        socket.display()
    )
}

#[test]
fn firewalld_backend_against_a_real_firewalld() {
    let mut lab = Lab::new(false);
    // Without firewalld: "firewalld" is a clear error, "" falls back to iptables; DEL has nothing to undo.
    let asked = lab.conf(&lab.a, "firewalld", json!({}));
    let out = lab.ours("ADD", "ca", &lab.a, &asked);
    assert_eq!(code(&out), 50, "{}", out.stdout_text);
    assert!(out.stdout_text.contains("firewalld is not running"), "{}", out.stdout_text);
    lab.ours("DEL", "ca", &lab.a, &asked).expect_ok();
    assert_eq!(code(&lab.ours("STATUS", "", &lab.a, &gc_conf(&lab, "firewalld", &[]))), 50);

    let Some(firewalld) = PrivateFirewalld::start(&lab.node) else { return };
    lab.bus = firewalld.address.clone();
    lab.ours("STATUS", "", &lab.a, &gc_conf(&lab, "firewalld", &[])).expect_ok();
    // The uplink in another zone: firewalld refuses forwarding from the default zone (br-a) to it.
    firewalld.call("org.fedoraproject.FirewallD1.zone.addInterface", &["dmz", "up0"]);
    assert!(!lab.reaches_wan(&lab.a), "firewalld refuses forwarding from the default zone to dmz");
    let auto = lab.conf(&lab.a, "", json!({}));
    lab.ours("ADD", "ca", &lab.a, &auto).expect_ok();
    assert!(firewalld.has_source("trusted", "10.88.1.2/32") && firewalld.has_source("trusted", "fd88:1::2/128"));
    assert!(lab.reaches_wan(&lab.a), "the trusted zone forwards the pod's traffic");
    assert!(!lab.iptables().contains("CNI-FORWARD"), "with firewalld running, \"\" chooses firewalld");
    lab.ours("ADD", "ca", &lab.a, &auto).expect_ok();
    lab.ours("CHECK", "ca", &lab.a, &auto).expect_ok();
    lab.ours("DEL", "ca", &lab.a, &auto).expect_ok();
    assert!(!firewalld.has_source("trusted", "10.88.1.2/32") && !firewalld.has_source("trusted", "fd88:1::2/128"));
    assert!(!lab.reaches_wan(&lab.a));
    assert_eq!(code(&lab.ours("CHECK", "ca", &lab.a, &auto)), 999);
    lab.ours("DEL", "ca", &lab.a, &auto).expect_ok();

    // Another zone, and takeover with the reference over the same bus both ways.
    let internal = lab.conf(&lab.b, "firewalld", json!({"firewalldZone": "internal"}));
    lab.theirs("ADD", "cb", &lab.b, &internal).expect_ok();
    assert!(firewalld.has_source("internal", "10.88.2.2/32"));
    lab.ours("DEL", "cb", &lab.b, &internal).expect_ok();
    assert!(!firewalld.has_source("internal", "10.88.2.2/32"));
    lab.ours("ADD", "cb", &lab.b, &internal).expect_ok();
    lab.theirs("CHECK", "cb", &lab.b, &internal).expect_ok();
    lab.theirs("DEL", "cb", &lab.b, &internal).expect_ok();
    assert!(!firewalld.has_source("internal", "fd88:2::2/128"));
    // An address already bound to another zone is refused, as by firewalld itself.
    lab.ours("ADD", "cb", &lab.b, &internal).expect_ok();
    let conflict = lab.ours("ADD", "cc", &lab.b, &lab.conf(&lab.b, "firewalld", json!({})));
    assert_eq!(code(&conflict), 999, "{}", conflict.stdout_text);
    assert!(conflict.stdout_text.contains("ZONE_CONFLICT"), "{}", conflict.stdout_text);
    // GC: cb is not valid.
    lab.ours("GC", "", &lab.a, &gc_conf(&lab, "firewalld", &[])).expect_ok();
    assert!(!firewalld.has_source("internal", "10.88.2.2/32"));
}
