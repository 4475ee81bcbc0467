//! The bridge plugin against the real kernel: pods on a bridge in a test "node" namespace, real packets
//! between pods, the gateway and a "wan" namespace beyond the node's uplink; MTU, dual stack, every spec
//! version, rollback, DEL without netns, 64 concurrent ADD/DEL, bad input, and cleanup across ours and the
//! reference plugin (/usr/lib/cni/bridge v1.1.1).
//!
//! IPAM is host-local from CNI_PATH: ours by default; `BRIDGE_TEST_IPAM=reference` uses
//! /usr/lib/cni/host-local instead (which only speaks up to 1.0.0).

use std::collections::HashSet;
use std::net::IpAddr;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use netns_tests::linkrig::skip_with_kind;
use netns_tests::upstream::{clean_command, have_reference, output};
use netns_tests::{
    assert_no_ping, assert_ping, bin, ip, json, result_ips, unique_name, veth_between, wait_for, Node, PluginOutput,
    TestNetns, Value,
};

const REFERENCE_DIR: &str = "/usr/lib/cni";
const SUBNET: &str = "10.22.0.0/24";
const GATEWAY: &str = "10.22.0.1";
const SUBNET6: &str = "fd22::/64";
const GATEWAY6: &str = "fd22::1";

/// Deep-merges `extra` into `base` (objects merge, everything else replaces; null removes the key).
fn merge(base: &mut Value, extra: &Value) {
    match (base, extra) {
        (Value::Object(b), Value::Object(e)) => {
            for (k, v) in e {
                if v.is_null() {
                    b.remove(k);
                } else {
                    merge(b.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        (b, e) => *b = e.clone(),
    }
}

/// A node namespace with a CNI_PATH holding our bridge (or the reference one) and a host-local.
struct Net {
    node: Node,
    /// CNI_PATH with our bridge.
    ours: PathBuf,
    /// CNI_PATH with the reference bridge and host-local.
    reference: PathBuf,
    name: String,
}

impl Net {
    fn new() -> Net {
        let node = Node::new();
        let ours = node.dir().join("cni-ours");
        let reference = node.dir().join("cni-reference");
        std::fs::create_dir_all(&ours).expect("cni dir");
        std::fs::create_dir_all(&reference).expect("cni dir");
        symlink(bin("bridge"), ours.join("bridge")).expect("link bridge");
        let ipam = match std::env::var("BRIDGE_TEST_IPAM").as_deref() {
            Ok("reference") => PathBuf::from(REFERENCE_DIR).join("host-local"),
            _ => bin("host-local"),
        };
        symlink(&ipam, ours.join("host-local")).expect("link host-local");
        for plugin in ["bridge", "host-local"] {
            symlink(Path::new(REFERENCE_DIR).join(plugin), reference.join(plugin)).expect("link reference");
        }
        Net { node, ours, reference, name: unique_name("net") }
    }

    /// A kubenet-like config on bridge `cbr0` with a host-local range in the node's temporary directory,
    /// with `extra` merged in.
    fn conf(&self, extra: Value) -> Value {
        let mut conf = json!({
            "cniVersion": "1.0.0",
            "name": self.name,
            "type": "bridge",
            "bridge": "cbr0",
            "isGateway": true,
            "isDefaultGateway": true,
            "ipam": {
                "type": "host-local",
                "dataDir": self.node.dir().join("ipam"),
                "ranges": [[{"subnet": SUBNET}]],
            },
        });
        merge(&mut conf, &extra);
        conf
    }

    fn run_with(&self, cni_path: &Path, command: &str, pod: Option<&Path>, id: &str, conf: &Value) -> PluginOutput {
        let program = cni_path.join("bridge");
        let mut cmd = clean_command(&self.node, &program);
        cmd.env("CNI_COMMAND", command).env("CNI_CONTAINERID", id).env("CNI_IFNAME", "eth0").env("CNI_PATH", cni_path);
        if let Some(pod) = pod {
            cmd.env("CNI_NETNS", pod);
        }
        output(&mut cmd, conf.to_string().as_bytes())
    }

    fn run(&self, command: &str, pod: Option<&TestNetns>, id: &str, conf: &Value) -> PluginOutput {
        self.run_with(&self.ours, command, pod.map(|p| p.path.as_path()), id, conf)
    }

    fn add(&self, pod: &TestNetns, id: &str, conf: &Value) -> Value {
        self.run("ADD", Some(pod), id, conf).expect_ok().clone()
    }

    /// DEL with the ADD's result as prevResult, as a runtime does.
    fn del(&self, pod: Option<&TestNetns>, id: &str, conf: &Value, result: &Value) {
        let mut conf = conf.clone();
        conf["prevResult"] = result.clone();
        self.run("DEL", pod, id, &conf).expect_ok();
    }

    /// Links of the node other than `lo`, sorted.
    fn node_links(&self) -> Vec<String> {
        let mut links: Vec<String> = self.node.links().into_iter().filter(|l| l != "lo").collect();
        links.sort();
        links
    }

    fn nat_rules(&self) -> String {
        let out = self.node.exec("iptables-save", &["-t", "nat"], &[], b"");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Host-local's lease files (one per leased address).
    fn leases(&self) -> Vec<String> {
        let dir = self.node.dir().join("ipam").join(&self.name);
        let Ok(entries) = std::fs::read_dir(&dir) else { return Vec::new() };
        entries
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.parse::<IpAddr>().is_ok())
            .collect()
    }
}

fn first_v4(result: &Value) -> IpAddr {
    *result_ips(result).iter().find(|a| a.is_ipv4()).expect("an IPv4 address")
}

/// Link details (`ip -d -j link show <name>`) in `ns`.
fn link_json(ns: &TestNetns, name: &str) -> Value {
    ns.ip_json(&["-d", "link", "show", name])[0].clone()
}

fn mtu_of(ns: &TestNetns, name: &str) -> u64 {
    link_json(ns, name)["mtu"].as_u64().expect("mtu")
}

/// A "wan" namespace behind a node uplink `up` (192.168.77.1 ⇄ 192.168.77.2) that knows no route back
/// to the pods: only masqueraded pod traffic can get answers.
fn wan_behind(net: &Net) -> TestNetns {
    let wan = TestNetns::new("wan");
    veth_between(
        &net.node,
        &wan,
        &unique_name("up"),
        "eth0",
        &[netns_tests::net("192.168.77.1/24")],
        &[netns_tests::net("192.168.77.2/24")],
    );
    wan
}

#[test]
fn two_pods_reach_each_other_and_the_gateway() {
    let net = Net::new();
    let conf = net.conf(json!({}));
    let (pod1, pod2) = (net.node.pod_netns(), net.node.pod_netns());
    let r1 = net.add(&pod1, "pod1", &conf);
    let r2 = net.add(&pod2, "pod2", &conf);

    // Result: bridge, host veth, pod interface; IPs on the pod interface with the gateway.
    let interfaces = r1["interfaces"].as_array().expect("interfaces");
    assert_eq!(interfaces.len(), 3, "{r1}");
    assert_eq!(interfaces[0]["name"], "cbr0");
    let host = interfaces[1]["name"].as_str().expect("host veth");
    assert!(host.len() == 12 && host.starts_with("veth") && host[4..].chars().all(|c| c.is_ascii_hexdigit()), "{host}");
    assert_eq!(interfaces[2]["name"], "eth0");
    assert_eq!(interfaces[2]["sandbox"], pod1.path.display().to_string());
    assert_eq!(interfaces[2]["mac"], link_json(&pod1, "eth0")["address"]);
    assert_eq!(interfaces[1]["mac"], link_json(&net.node, host)["address"]);
    assert_eq!(interfaces[0]["mac"], link_json(&net.node, "cbr0")["address"]);
    assert_eq!(r1["ips"][0]["gateway"], GATEWAY);
    assert_eq!(r1["ips"][0]["interface"], 2);
    assert_eq!(r1["routes"][0]["dst"], "0.0.0.0/0");
    assert_eq!(link_json(&net.node, host)["master"], "cbr0");

    let (ip1, ip2) = (first_v4(&r1), first_v4(&r2));
    assert_ne!(ip1, ip2);
    assert_ping(&pod1, ip2);
    assert_ping(&pod2, ip1);
    assert_ping(&pod1, ip(GATEWAY));
    assert_ping(&net.node, ip1);
    assert_eq!(net.node.sysctl("net/ipv4/ip_forward"), "1");
    assert_eq!(net.node.sysctl("net/bridge/bridge-nf-call-iptables"), "1");

    // CHECK passes with the result; fails once an address is gone.
    let mut check = conf.clone();
    check["prevResult"] = r1.clone();
    net.run("CHECK", Some(&pod1), "pod1", &check).expect_ok();
    pod1.ip(&["addr", "del", &format!("{ip1}/24"), "dev", "eth0"]);
    let err = net.run("CHECK", Some(&pod1), "pod1", &check);
    assert!(err.expect_err()["msg"].as_str().unwrap_or("").contains(&ip1.to_string()), "{}", err.stdout_text);

    net.del(Some(&pod1), "pod1", &conf, &r1);
    net.del(Some(&pod2), "pod2", &conf, &r2);
    assert_eq!(net.node_links(), vec!["cbr0"]);
    assert!(net.leases().is_empty(), "{:?}", net.leases());
    assert!(!pod1.links().contains(&"eth0".to_string()));
    // A second DEL succeeds.
    net.del(Some(&pod1), "pod1", &conf, &r1);
}

#[test]
fn masquerade_to_wan() {
    let net = Net::new();
    let wan = wan_behind(&net);
    let wan_ip = ip("192.168.77.2");
    let masq = net.conf(json!({"ipMasq": true}));
    let plain = net.conf(json!({}));
    let (pod1, pod2) = (net.node.pod_netns(), net.node.pod_netns());
    let r1 = net.add(&pod1, "masq-pod", &masq);
    let r2 = net.add(&pod2, "plain-pod", &plain);
    assert_ping(&pod1, wan_ip);
    // The wan has no route to the pods: without masquerade there is no answer.
    assert_no_ping(&pod2, wan_ip);
    // Pod to pod is not masqueraded: pod2 sees pod1's own address (it answers pod1 directly).
    assert_ping(&pod1, first_v4(&r2));

    let rules = net.nat_rules();
    let comment = format!("name: \\\"{}\\\" id: \\\"masq-pod\\\"", net.name);
    assert!(rules.contains(&format!("-A POSTROUTING -s {}/32", first_v4(&r1))), "{rules}");
    assert!(rules.contains(&comment) || rules.contains(&comment.replace("\\\"", "\"")), "{rules}");
    assert!(rules.contains("MASQUERADE"), "{rules}");
    assert!(rules.contains("224.0.0.0/4"), "multicast is not masqueraded: {rules}");

    net.del(Some(&pod1), "masq-pod", &masq, &r1);
    net.del(Some(&pod2), "plain-pod", &plain, &r2);
    let rules = net.nat_rules();
    assert!(!rules.contains("CNI-"), "rules left behind: {rules}");
    drop(wan);
}

#[test]
fn hairpin_lets_a_pod_reach_itself_through_a_service_address() {
    for hairpin in [true, false] {
        let net = Net::new();
        let conf = net.conf(json!({"hairpinMode": hairpin}));
        let pod = net.node.pod_netns();
        let r = net.add(&pod, "hairpin", &conf);
        let host = r["interfaces"][1]["name"].as_str().expect("host veth").to_string();
        assert_eq!(link_json(&net.node, &host)["linkinfo"]["info_slave_data"]["hairpin"], hairpin);
        // kube-proxy's shape: a service address DNATed to the pod, hairpin traffic masqueraded.
        let pod_ip = first_v4(&r).to_string();
        let rules = format!(
            "*nat\n-A PREROUTING -d 10.96.0.10/32 -j DNAT --to-destination {pod_ip}\n\
             -A POSTROUTING -s {pod_ip}/32 -d {pod_ip}/32 -j MASQUERADE\nCOMMIT\n"
        );
        let out = net.node.exec("iptables-restore", &["--noflush"], &[], rules.as_bytes());
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(pod.ping(ip("10.96.0.10")), hairpin, "hairpin {hairpin}");
        net.del(Some(&pod), "hairpin", &conf, &r);
    }
}

#[test]
fn mtu_explicit() {
    let net = Net::new();
    let _wan = wan_behind(&net);
    let conf = net.conf(json!({"mtu": 1400}));
    let pod = net.node.pod_netns();
    let r = net.add(&pod, "mtu", &conf);
    let host = r["interfaces"][1]["name"].as_str().expect("host veth").to_string();
    assert_eq!(mtu_of(&pod, "eth0"), 1400);
    assert_eq!(mtu_of(&net.node, &host), 1400);
    assert_eq!(mtu_of(&net.node, "cbr0"), 1400);
    // A full-size packet passes, one byte more does not (don't fragment).
    assert!(pod.exec("ping", &["-c1", "-W1", "-M", "do", "-s", "1372", GATEWAY], &[], b"").status.success());
    assert!(!pod.exec("ping", &["-c1", "-W1", "-M", "do", "-s", "1373", GATEWAY], &[], b"").status.success());
    net.del(Some(&pod), "mtu", &conf, &r);
}

#[test]
fn mtu_inferred_from_the_node_uplinks() {
    // Without uplinks: 1500.
    let net = Net::new();
    let conf = net.conf(json!({}));
    let pod = net.node.pod_netns();
    let r = net.add(&pod, "mtu-default", &conf);
    assert_eq!(mtu_of(&pod, "eth0"), 1500);
    net.del(Some(&pod), "mtu-default", &conf, &r);

    // Uplinks of 9000 and 1450 count; a down link, a bridge, an ifb and the pods' own ports do not.
    let net = Net::new();
    let (wan1, wan2) = (TestNetns::new("wan"), TestNetns::new("wan"));
    let up1 = unique_name("up");
    let up2 = unique_name("up");
    for (wan, up, subnet) in [(&wan1, &up1, 77), (&wan2, &up2, 78)] {
        let ends = |host: u8| [netns_tests::net(&format!("192.168.{subnet}.{host}/24"))];
        veth_between(&net.node, wan, up, "eth0", &ends(1), &ends(2));
    }
    net.node.ip(&["link", "set", &up1, "mtu", "9000"]);
    net.node.ip(&["link", "set", &up2, "mtu", "1450"]);
    net.node.ip(&["link", "add", "down0", "mtu", "1300", "type", "veth", "peer", "name", "down1", "mtu", "1300"]);
    net.node.ip(&["link", "add", "br-other", "mtu", "1000", "type", "bridge"]);
    net.node.ip(&["link", "set", "br-other", "up"]);
    net.node.ip(&["link", "add", "ifb7", "mtu", "1100", "type", "ifb"]);
    net.node.ip(&["link", "set", "ifb7", "up"]);
    let conf = net.conf(json!({}));
    let pods: Vec<TestNetns> = (0..2).map(|_| net.node.pod_netns()).collect();
    let mut results = Vec::new();
    for (i, pod) in pods.iter().enumerate() {
        let r = net.add(pod, &format!("mtu{i}"), &conf);
        let host = r["interfaces"][1]["name"].as_str().expect("host veth").to_string();
        assert_eq!(mtu_of(pod, "eth0"), 1450);
        assert_eq!(mtu_of(&net.node, &host), 1450);
        results.push(r);
    }
    assert_eq!(mtu_of(&net.node, "cbr0"), 1450);
    for (i, (pod, r)) in pods.iter().zip(&results).enumerate() {
        net.del(Some(pod), &format!("mtu{i}"), &conf, r);
    }
}

#[test]
fn dual_stack() {
    let net = Net::new();
    let conf = net.conf(json!({"ipam": {"ranges": [[{"subnet": SUBNET}], [{"subnet": SUBNET6}]]}}));
    let (pod1, pod2) = (net.node.pod_netns(), net.node.pod_netns());
    let r1 = net.add(&pod1, "ds1", &conf);
    let r2 = net.add(&pod2, "ds2", &conf);
    let v6 = |r: &Value| *result_ips(r).iter().find(|a| a.is_ipv6()).expect("an IPv6 address");
    assert_eq!(r1["ips"][1]["gateway"], GATEWAY6);
    assert!(r1["routes"].as_array().expect("routes").iter().any(|r| r["dst"] == "::/0"), "{r1}");
    assert_ping(&pod1, v6(&r2));
    assert_ping(&pod1, ip(GATEWAY6));
    assert_ping(&pod2, first_v4(&r1));
    assert_eq!(net.node.sysctl("net/ipv6/conf/all/forwarding"), "1");
    // The pod's IPv6 address is usable at once (no DAD unless enabledad).
    let addrs = pod1.ip(&["-6", "addr", "show", "dev", "eth0"]);
    assert!(!addrs.contains("tentative"), "{addrs}");
    let mut check = conf.clone();
    check["prevResult"] = r1.clone();
    net.run("CHECK", Some(&pod1), "ds1", &check).expect_ok();
    net.del(Some(&pod1), "ds1", &conf, &r1);
    net.del(Some(&pod2), "ds2", &conf, &r2);
    assert_eq!(net.node_links(), vec!["cbr0"]);
}

#[test]
fn enabledad_waits_for_duplicate_address_detection() {
    let net = Net::new();
    let conf = net.conf(json!({"enabledad": true, "ipam": {"ranges": [[{"subnet": SUBNET6}]]}}));
    let pod = net.node.pod_netns();
    let r = net.add(&pod, "dad", &conf);
    let addrs = pod.ip(&["-6", "addr", "show", "dev", "eth0"]);
    assert!(addrs.contains("fd22::") && !addrs.contains("tentative"), "{addrs}");
    assert_eq!(pod.sysctl("net/ipv6/conf/eth0/accept_dad"), "1");
    net.del(Some(&pod), "dad", &conf, &r);
}

#[test]
fn every_spec_version() {
    let versions = ["0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];
    let net = Net::new();
    for (i, version) in versions.iter().enumerate() {
        let conf = net.conf(json!({"cniVersion": version}));
        let pod = net.node.pod_netns();
        let id = format!("v{i}");
        let r = net.add(&pod, &id, &conf);
        assert_eq!(r["cniVersion"], *version);
        let legacy = version.starts_with("0.1") || version.starts_with("0.2");
        if legacy {
            assert_eq!(r["ip4"]["gateway"], GATEWAY, "{r}");
            assert!(r.get("interfaces").is_none());
        } else {
            assert_eq!(r["interfaces"].as_array().map(Vec::len), Some(3), "{r}");
            assert_eq!(r["ips"][0]["interface"], 2);
            assert_eq!(r["ips"][0].get("version").is_some(), version.starts_with("0."), "{r}");
            // One Go type serves 1.0.0 and 1.1.0 results in libcni 1.2+ (reference v1.6+): mtu in both.
            assert_eq!(r["interfaces"][2].get("mtu").is_some(), !version.starts_with("0."), "{r}");
        }
        assert_ping(&pod, ip(GATEWAY));
        let mut with_prev = conf.clone();
        with_prev["prevResult"] = r.clone();
        if !version.starts_with("0.1") && !version.starts_with("0.2") && !version.starts_with("0.3") {
            net.run("CHECK", Some(&pod), &id, &with_prev).expect_ok();
        } else {
            let e = net.run("CHECK", Some(&pod), &id, &with_prev);
            assert_eq!(e.expect_err()["code"], 1, "{}", e.stdout_text);
        }
        if *version == "1.1.0" {
            net.run("STATUS", None, &id, &conf).expect_ok();
            let mut gc = conf.clone();
            gc["cni.dev/valid-attachments"] = json!([{"containerID": id, "ifname": "eth0"}]);
            net.run("GC", None, &id, &gc).expect_ok();
            assert_eq!(net.leases().len(), 1, "GC keeps the valid attachment's lease");
        }
        net.del(Some(&pod), &id, &conf, &r);
        assert!(net.leases().is_empty(), "{version}: {:?}", net.leases());
    }
    assert_eq!(net.node_links(), vec!["cbr0"]);
}

#[test]
fn rollback_on_ipam_failure_leaves_nothing() {
    let net = Net::new();
    // One address in the range: the second ADD finds it exhausted.
    let conf = net.conf(json!({"ipMasq": true, "ipam": {"ranges": [[{"subnet": SUBNET, "rangeStart": "10.22.0.10", "rangeEnd": "10.22.0.10"}]]}}));
    let (pod1, pod2) = (net.node.pod_netns(), net.node.pod_netns());
    let r1 = net.add(&pod1, "first", &conf);
    let links_before = net.node_links();
    let rules_before = net.nat_rules();
    let out = net.run("ADD", Some(&pod2), "second", &conf);
    out.expect_err();
    assert_eq!(net.node_links(), links_before, "{}", out.stdout_text);
    assert!(!pod2.links().contains(&"eth0".to_string()));
    assert_eq!(net.leases().len(), 1);
    assert_eq!(net.nat_rules().matches("CNI-").count(), rules_before.matches("CNI-").count());

    // A failure after IPAM (a route whose gateway is not on-link) releases the lease and the rules too.
    let conf2 = net.conf(json!({"ipMasq": true, "ipam": {"ranges": [[{"subnet": "10.23.0.0/24"}]],
        "routes": [{"dst": "10.99.0.0/16", "gw": "192.0.2.1"}]}}));
    let pod3 = net.node.pod_netns();
    let out = net.run("ADD", Some(&pod3), "third", &conf2);
    assert!(out.expect_err()["msg"].as_str().unwrap_or("").contains("route"), "{}", out.stdout_text);
    assert_eq!(net.node_links(), links_before);
    assert_eq!(net.leases().len(), 1, "{:?}", net.leases());
    assert!(!pod3.links().contains(&"eth0".to_string()));
    assert_eq!(net.nat_rules().matches("CNI-").count(), rules_before.matches("CNI-").count());

    net.del(Some(&pod1), "first", &conf, &r1);
}

#[test]
fn del_without_netns_releases_ipam_and_rules() {
    let net = Net::new();
    let _wan = wan_behind(&net);
    let conf = net.conf(json!({"ipMasq": true}));
    let pod = net.node.pod_netns();
    let r = net.add(&pod, "gone", &conf);
    assert!(net.nat_rules().contains("CNI-"));
    let path = pod.path.clone();
    drop(pod);
    assert!(!path.exists());
    // The pod's end dies with its namespace (the kernel cleans namespaces up asynchronously), and the host
    // end with it.
    // The kernel dismantles a deleted namespace asynchronously.
    let gone = wait_for(Duration::from_secs(5), || net.node_links().len() == 2);
    assert!(gone.is_some(), "{:?}", net.node_links()); // cbr0 and the uplink
    let mut del = conf.clone();
    del["prevResult"] = r.clone();
    net.run_with(&net.ours, "DEL", Some(&path), "gone", &del).expect_ok();
    assert!(net.leases().is_empty());
    assert!(!net.nat_rules().contains("CNI-"), "{}", net.nat_rules());
    // Again, and without CNI_NETNS at all.
    net.run_with(&net.ours, "DEL", Some(&path), "gone", &del).expect_ok();
    net.run_with(&net.ours, "DEL", None, "gone", &del).expect_ok();
}

#[test]
fn concurrent_adds_and_dels() {
    const PODS: usize = 64;
    let net = Arc::new(Net::new());
    let conf = Arc::new(net.conf(json!({})));
    let pods: Vec<Arc<TestNetns>> = (0..PODS).map(|_| Arc::new(net.node.pod_netns())).collect();
    let handles: Vec<_> = pods
        .iter()
        .enumerate()
        .map(|(i, pod)| {
            let (net, conf, pod) = (Arc::clone(&net), Arc::clone(&conf), Arc::clone(pod));
            std::thread::spawn(move || net.run("ADD", Some(&pod), &format!("c{i}"), &conf))
        })
        .collect();
    let results: Vec<Value> = handles.into_iter().map(|h| h.join().expect("thread").expect_ok().clone()).collect();
    let ips: HashSet<IpAddr> = results.iter().map(first_v4).collect();
    assert_eq!(ips.len(), PODS);
    assert_eq!(net.node_links().len(), PODS + 1);
    assert_ping(&pods[0], first_v4(&results[PODS - 1]));

    let handles: Vec<_> = pods
        .iter()
        .zip(results)
        .enumerate()
        .map(|(i, (pod, result))| {
            let (net, conf, pod) = (Arc::clone(&net), Arc::clone(&conf), Arc::clone(pod));
            std::thread::spawn(move || {
                let mut del = (*conf).clone();
                del["prevResult"] = result;
                net.run("DEL", Some(&pod), &format!("c{i}"), &del)
            })
        })
        .collect();
    for h in handles {
        h.join().expect("thread").expect_ok();
    }
    assert_eq!(net.node_links(), vec!["cbr0"]);
    assert!(net.leases().is_empty());
}

/// An interface already named CNI_IFNAME in the pod is an error, not a takeover, and the DEL that follows leaves
/// it (the bad configs are in the bad-input corpus).
#[test]
fn del_after_a_refused_add_leaves_the_pods_own_interface() {
    let net = Net::new();
    let pod = net.node.pod_netns();
    // An interface already named CNI_IFNAME in the pod: an error, not a takeover.
    pod.ip(&["link", "add", "eth0", "type", "veth", "peer", "name", "other"]);
    let out = net.run("ADD", Some(&pod), "bad", &net.conf(json!({})));
    assert!(out.expect_err()["msg"].as_str().unwrap_or("").contains("already exists"), "{}", out.stdout_text);
    assert!(net.node_links().iter().all(|l| !l.starts_with("veth")), "{:?}", net.node_links());
    assert!(net.leases().is_empty());
    // DEL of that failed attachment leaves the pod's own eth0 alone.
    net.run("DEL", Some(&pod), "bad", &net.conf(json!({}))).expect_ok();
    assert!(pod.links().contains(&"eth0".to_string()));
}

#[test]
fn vlan_options_need_vlan_filtering() {
    // The kernels with VLAN filtering (the VM lane's) run tests/bridge_vlan.rs instead.
    if skip_with_kind("bridge_vlan_filtering", "bridge VLAN filtering") {
        return;
    }
    let net = Net::new();
    let pod = net.node.pod_netns();
    for extra in [json!({"vlan": 100}), json!({"vlanTrunk": [{"minID": 100, "maxID": 110}]})] {
        let out = net.run("ADD", Some(&pod), "vlan", &net.conf(extra.clone()));
        let msg = out.expect_err()["msg"].as_str().unwrap_or("").to_string();
        assert!(msg.contains("VLAN filtering"), "{extra}: {msg}");
        assert!(net.node_links().iter().all(|l| !l.starts_with("veth")), "{:?}", net.node_links());
        assert_eq!(pod.links(), vec!["lo"]);
        assert!(net.leases().is_empty());
    }
    // The same with a bridge that already exists without VLAN filtering: the port refuses the VLAN.
    let pod2 = net.node.pod_netns();
    let plain = net.conf(json!({}));
    let r = net.add(&pod2, "plain", &plain);
    let out = net.run("ADD", Some(&pod), "vlan", &net.conf(json!({"vlan": 100})));
    assert!(out.expect_err()["msg"].as_str().unwrap_or("").contains("VLAN filtering"), "{}", out.stdout_text);
    assert_eq!(net.node_links().len(), 2, "{:?}", net.node_links());
    assert_eq!(net.leases().len(), 1);
    net.del(Some(&pod2), "plain", &plain, &r);
}

#[test]
fn mac_options_and_spoof_check() {
    let net = Net::new();
    let conf = net.conf(json!({"macspoofchk": true, "runtimeConfig": {"mac": "02:42:0a:16:00:63"}}));
    let pod = net.node.pod_netns();
    let r = net.add(&pod, "mac", &conf);
    assert_eq!(r["interfaces"][2]["mac"], "02:42:0a:16:00:63");
    assert_eq!(link_json(&pod, "eth0")["address"], "02:42:0a:16:00:63");
    assert_ping(&pod, ip(GATEWAY));
    // A pod that changes its MAC is cut off.
    pod.ip(&["link", "set", "eth0", "address", "02:42:0a:16:00:64"]);
    pod.ip(&["neigh", "flush", "all"]);
    assert_no_ping(&pod, ip(GATEWAY));
    let tables = String::from_utf8_lossy(&net.node.exec("nft", &["list", "table", "bridge", "nat"], &[], b"").stdout)
        .into_owned();
    assert!(tables.contains("cni-br-iface-mac-eth0"), "{tables}");
    net.del(Some(&pod), "mac", &conf, &r);
    let tables = String::from_utf8_lossy(&net.node.exec("nft", &["list", "table", "bridge", "nat"], &[], b"").stdout)
        .into_owned();
    assert!(!tables.contains("cni-br-iface"), "{tables}");

    // CNI_ARGS MAC= (with IgnoreUnknown for the Kubernetes keys).
    let pod = net.node.pod_netns();
    let conf = net.conf(json!({}));
    let mut cmd = clean_command(&net.node, net.ours.join("bridge"));
    cmd.env("CNI_COMMAND", "ADD")
        .env("CNI_CONTAINERID", "args")
        .env("CNI_NETNS", &pod.path)
        .env("CNI_IFNAME", "eth0")
        .env("CNI_PATH", &net.ours)
        .env("CNI_ARGS", "IgnoreUnknown=1;K8S_POD_NAME=x;MAC=02:42:0a:16:00:65");
    let r = output(&mut cmd, conf.to_string().as_bytes()).expect_ok().clone();
    assert_eq!(r["interfaces"][2]["mac"], "02:42:0a:16:00:65");
    net.del(Some(&pod), "args", &conf, &r);
}

#[test]
fn layer2_only_and_disabled_container_interface() {
    let net = Net::new();
    let l2 = net.conf(json!({"ipam": null, "isGateway": false, "isDefaultGateway": false}));
    let pod = net.node.pod_netns();
    let r = net.add(&pod, "l2", &l2);
    assert!(r.get("ips").is_none(), "{r}");
    assert!(link_json(&pod, "eth0")["flags"].as_array().expect("flags").contains(&json!("UP")));
    net.del(Some(&pod), "l2", &l2, &r);

    let off = net
        .conf(json!({"ipam": null, "isGateway": false, "isDefaultGateway": false, "disableContainerInterface": true}));
    let r = net.add(&pod, "off", &off);
    assert!(!link_json(&pod, "eth0")["flags"].as_array().expect("flags").contains(&json!("UP")));
    net.del(Some(&pod), "off", &off, &r);
    assert_eq!(net.node_links(), vec!["cbr0"]);
}

#[test]
fn cleanup_across_ours_and_the_reference() {
    if !have_reference("bridge") {
        return;
    }
    let net = Net::new();
    let _wan = wan_behind(&net);
    let conf = net.conf(json!({"ipMasq": true}));
    // Reference ADD, our DEL.
    let pod = net.node.pod_netns();
    let r = net.run_with(&net.reference, "ADD", Some(&pod.path), "ref-add", &conf).expect_ok().clone();
    assert_ping(&pod, ip("192.168.77.2"));
    assert!(net.nat_rules().contains("CNI-"));
    let mut del = conf.clone();
    del["prevResult"] = r.clone();
    net.run_with(&net.ours, "DEL", Some(&pod.path), "ref-add", &del).expect_ok();
    assert!(!net.nat_rules().contains("CNI-"), "{}", net.nat_rules());
    assert_eq!(net.node_links().len(), 2, "{:?}", net.node_links());

    // Our ADD, reference DEL (the reference needs the pod's netns to find the rules).
    let pod = net.node.pod_netns();
    let r = net.run_with(&net.ours, "ADD", Some(&pod.path), "our-add", &conf).expect_ok().clone();
    assert_ping(&pod, ip("192.168.77.2"));
    let mut del = conf.clone();
    del["prevResult"] = r;
    net.run_with(&net.reference, "DEL", Some(&pod.path), "our-add", &del).expect_ok();
    assert!(!net.nat_rules().contains("CNI-"), "{}", net.nat_rules());
    assert_eq!(net.node_links().len(), 2, "{:?}", net.node_links());
}

#[test]
fn port_isolation() {
    let net = Net::new();
    let conf = net.conf(json!({"portIsolation": true}));
    let (pod1, pod2) = (net.node.pod_netns(), net.node.pod_netns());
    let r1 = net.add(&pod1, "iso1", &conf);
    let r2 = net.add(&pod2, "iso2", &conf);
    let host = r1["interfaces"][1]["name"].as_str().expect("host veth").to_string();
    assert_eq!(link_json(&net.node, &host)["linkinfo"]["info_slave_data"]["isolated"], true);
    // Isolated ports reach the bridge (the gateway) but not each other.
    assert_ping(&pod1, ip(GATEWAY));
    assert_no_ping(&pod1, first_v4(&r2));
    net.del(Some(&pod1), "iso1", &conf, &r1);
    net.del(Some(&pod2), "iso2", &conf, &r2);
}

#[test]
fn gc_removes_stale_masquerade_rules_and_leases() {
    let net = Net::new();
    let conf = net.conf(json!({"cniVersion": "1.1.0", "ipMasq": true}));
    let (pod1, pod2) = (net.node.pod_netns(), net.node.pod_netns());
    let r1 = net.add(&pod1, "keep", &conf);
    let _r2 = net.add(&pod2, "stale", &conf);
    let rules = net.nat_rules();
    assert!(rules.contains("id: \\\"stale\\\"") || rules.contains("id: \"stale\""), "{rules}");
    let mut gc = conf.clone();
    gc["cni.dev/valid-attachments"] = json!([{"containerID": "keep", "ifname": "eth0"}]);
    net.run("GC", None, "", &gc).expect_ok();
    let rules = net.nat_rules();
    assert!(!rules.contains("stale"), "{rules}");
    assert!(rules.contains("keep"), "{rules}");
    assert_eq!(net.leases().len(), 1);
    net.del(Some(&pod1), "keep", &conf, &r1);
    assert!(!net.nat_rules().contains("CNI-"));
}

#[test]
fn check_accepts_what_the_reference_made() {
    if !have_reference("bridge") {
        return;
    }
    let net = Net::new();
    let conf = net.conf(json!({}));
    let pod = net.node.pod_netns();
    let r = net.run_with(&net.reference, "ADD", Some(&pod.path), "ref", &conf).expect_ok().clone();
    let mut check = conf.clone();
    check["prevResult"] = r.clone();
    net.run("CHECK", Some(&pod), "ref", &check).expect_ok();
    net.del(Some(&pod), "ref", &conf, &r);
    assert_eq!(net.node_links(), vec!["cbr0"]);
}

#[test]
fn masquerade_with_nftables() {
    let net = Net::new();
    let _wan = wan_behind(&net);
    let conf = net.conf(json!({"ipMasq": true, "ipMasqBackend": "nftables"}));
    let pod = net.node.pod_netns();
    let r = net.add(&pod, "nft-pod", &conf);
    assert_ping(&pod, ip("192.168.77.2"));
    assert!(!net.nat_rules().contains("CNI-"), "the nftables backend adds no iptables rules");
    let list =
        |ns: &TestNetns| String::from_utf8_lossy(&ns.exec("nft", &["list", "ruleset"], &[], b"").stdout).into_owned();
    assert!(list(&net.node).contains("masquerade"), "{}", list(&net.node));
    let pod_ip = first_v4(&r).to_string();
    assert!(list(&net.node).contains(&pod_ip), "{}", list(&net.node));
    net.del(Some(&pod), "nft-pod", &conf, &r);
    // Whatever the layout, nothing about the pod is left.
    assert!(!list(&net.node).contains(&pod_ip), "{}", list(&net.node));
}
