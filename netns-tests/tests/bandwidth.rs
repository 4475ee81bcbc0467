//! The bandwidth plugin against the real kernel: shaped TCP throughput between a pod and a "wan"
//! namespace beyond the node, cleanup across ours and the reference plugin (/usr/lib/cni/bandwidth),
//! coexistence with other tc users, CHECK, DEL, GC and bad input.
//!
//! Topology per test: pod (eth0 10.1.0.2) ⇄ veth ⇄ node (host veth 10.1.0.1, uplink 10.2.0.1) ⇄ wan
//! (10.2.0.2). The pod veth is made by the test (as the main plugin would) and described in prevResult.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use netns_tests::upstream::{self, clean_command, output};
use netns_tests::{ip, json, unique_name, veth_between, wait_for, Node, PluginOutput, TestNetns, Value};

const REFERENCE: &str = "/usr/lib/cni/bandwidth";
const POD_IP: &str = "10.1.0.2";
const WAN_IP: &str = "10.2.0.2";
const MBIT: u64 = 1_000_000;

/// A node with one pod attached by a veth and a wan namespace behind an uplink.
struct Rig {
    node: Node,
    pod: TestNetns,
    wan: TestNetns,
    host_veth: String,
}

impl Rig {
    fn new() -> Rig {
        let node = Node::new();
        let pod = node.pod_netns();
        let wan = TestNetns::new("wan");
        let host_veth = unique_name("hv");
        veth_between(
            &node,
            &pod,
            &host_veth,
            "eth0",
            &["10.1.0.1/24".parse().unwrap()],
            &[format!("{POD_IP}/24").parse().unwrap()],
        );
        veth_between(
            &node,
            &wan,
            &unique_name("up"),
            "eth0",
            &["10.2.0.1/24".parse().unwrap()],
            &[format!("{WAN_IP}/24").parse().unwrap()],
        );
        pod.ip(&["route", "add", "default", "via", "10.1.0.1"]);
        wan.ip(&["route", "add", "10.1.0.0/24", "via", "10.2.0.1"]);
        node.run(|| cnicore::sysctl::write("net/ipv4/ip_forward", "1")).expect("ip_forward in the node");
        Rig { node, pod, wan, host_veth }
    }

    /// A prevResult as the bridge plugin would give it: host veth without sandbox, pod interface with.
    fn prev_result(&self) -> Value {
        json!({
            "cniVersion": "1.0.0",
            "interfaces": [
                {"name": self.host_veth, "mac": "02:00:00:00:00:01"},
                {"name": "eth0", "mac": "02:00:00:00:00:02", "sandbox": self.pod.path.display().to_string()}
            ],
            "ips": [{"address": format!("{POD_IP}/24"), "interface": 1}]
        })
    }

    /// A config with the given limit fields (config-level), chained after `prev_result`.
    fn conf(&self, limits: Value) -> Value {
        let mut conf = json!({"cniVersion": "1.0.0", "name": "bwnet", "type": "bandwidth",
            "prevResult": self.prev_result()});
        merge(&mut conf, limits);
        conf
    }

    fn run(&self, plugin: &str, command: &str, container_id: &str, conf: &Value) -> PluginOutput {
        let netns = self.pod.path.display().to_string();
        let env = [("CNI_CONTAINERID", container_id), ("CNI_NETNS", netns.as_str()), ("CNI_IFNAME", "eth0")];
        if plugin == REFERENCE {
            run_reference(&self.node, command, &env, conf)
        } else {
            self.node.run_plugin(plugin, command, &env, conf)
        }
    }

    fn ours(&self, command: &str, conf: &Value) -> PluginOutput {
        self.run("bandwidth", command, "ctr1", conf)
    }

    /// `tc -j <args>` in the node, parsed.
    fn tc_json(&self, args: &[&str]) -> Vec<Value> {
        let mut all = vec!["-j"];
        all.extend_from_slice(args);
        let output = self.node.exec("tc", &all, &[], b"");
        assert!(output.status.success(), "tc {all:?}: {}", String::from_utf8_lossy(&output.stderr));
        let text = String::from_utf8_lossy(&output.stdout);
        if text.trim().is_empty() {
            return Vec::new();
        }
        serde_json::from_str::<Value>(&text).expect("tc json").as_array().cloned().unwrap_or_default()
    }

    fn tc(&self, args: &[&str]) {
        let output = self.node.exec("tc", args, &[], b"");
        assert!(output.status.success(), "tc {args:?}: {}", String::from_utf8_lossy(&output.stderr));
    }

    /// The u32 match nodes at `parent` of `dev`: (priority, has actions).
    fn filter_nodes(&self, dev: &str, parent: &str) -> Vec<(u64, bool)> {
        self.tc_json(&["filter", "show", "dev", dev, "parent", parent])
            .iter()
            .filter(|f| f["options"]["match"].is_object())
            .map(|f| (f["pref"].as_u64().unwrap_or_default(), f["options"]["actions"].is_array()))
            .collect()
    }

    /// Kinds of the qdiscs of `dev` other than the kernel's default one.
    fn qdisc_kinds(&self, dev: &str) -> Vec<String> {
        self.tc_json(&["qdisc", "show", "dev", dev])
            .iter()
            .filter(|q| q["handle"] != "0:")
            .map(|q| q["kind"].as_str().unwrap_or_default().to_string())
            .collect()
    }

    /// The ifb devices of the node.
    fn ifbs(&self) -> Vec<String> {
        let links = self.node.ip_json(&["-d", "link", "show", "type", "ifb"]);
        links.as_array().into_iter().flatten().filter_map(|l| l["ifname"].as_str().map(str::to_string)).collect()
    }

    /// The shaping state left on the node: qdiscs of the host veth and ifb devices.
    fn assert_clean(&self) {
        assert_eq!(self.qdisc_kinds(&self.host_veth), Vec::<String>::new(), "qdiscs left on the host veth");
        assert_eq!(self.ifbs(), Vec::<String>::new(), "ifb devices left");
    }
}

fn merge(target: &mut Value, extra: Value) {
    if let (Some(target), Value::Object(extra)) = (target.as_object_mut(), extra) {
        target.extend(extra);
    }
}

/// Runs the reference plugin in the node, with the same environment the rig gives ours.
fn run_reference(node: &Node, command: &str, env: &[(&str, &str)], conf: &Value) -> PluginOutput {
    let mut cmd = clean_command(node, REFERENCE);
    cmd.env("CNI_COMMAND", command).env("CNI_PATH", "/usr/lib/cni").envs(env.iter().copied());
    output(&mut cmd, conf.to_string().as_bytes())
}

fn have_reference() -> bool {
    upstream::have_reference("bandwidth")
}

/// Limits for both directions at `rate` bit/s. The burst is 25 ms worth of the rate (at least 4 full
/// frames): small against the measured window, while the queue limit the reference formula derives
/// (25 ms + burst) still absorbs TCP's bursts.
fn both(rate: u64) -> Value {
    let burst = burst_for(rate);
    json!({"ingressRate": rate, "ingressBurst": burst, "egressRate": rate, "egressBurst": burst})
}

fn burst_for(rate: u64) -> u64 {
    (rate / 40).max(4 * 1514 * 8)
}

// ---------------------------------------------------------------------------------------------------
// Throughput

/// Time to let the bucket's initial burst and TCP's slow start pass before measuring.
const WARMUP: Duration = Duration::from_millis(600);
/// Measured window.
const WINDOW: Duration = Duration::from_millis(2000);

/// Goodput in bit/s of one TCP stream from `sender` to a listener on `addr` in `receiver`, measured
/// at the receiver over [`WINDOW`] after [`WARMUP`].
fn throughput(sender: &TestNetns, receiver: &TestNetns, addr: &str) -> f64 {
    let listener = receiver.run(|| TcpListener::bind((ip(addr), 0))).expect("listen");
    let target = SocketAddr::new(ip(addr), listener.local_addr().expect("port").port());
    let stream = sender.run(|| TcpStream::connect_timeout(&target, Duration::from_secs(3))).expect("connect");
    let (mut conn, _) = listener.accept().expect("accept");
    let deadline = Instant::now() + WARMUP + WINDOW + Duration::from_secs(3);
    let writer = std::thread::spawn(move || {
        let mut stream = stream;
        let chunk = vec![0x5a; 64 * 1024];
        stream.set_write_timeout(Some(Duration::from_millis(500))).ok();
        // Stops when the receiver closes or at the deadline.
        while Instant::now() < deadline {
            match stream.write(&chunk) {
                Ok(_) => {}
                Err(e) if retryable(&e) => {}
                Err(_) => break,
            }
        }
    });
    conn.set_read_timeout(Some(Duration::from_millis(200))).expect("read timeout");
    let start = Instant::now();
    let mut buf = vec![0; 256 * 1024];
    let mut total: u64 = 0;
    let mut at_warmup: Option<(Instant, u64)> = None;
    let result = loop {
        match conn.read(&mut buf) {
            Ok(0) => panic!("sender stopped early"),
            Ok(n) => total += n as u64,
            Err(e) if retryable(&e) => {}
            Err(e) => panic!("read: {e}"),
        }
        let now = Instant::now();
        match at_warmup {
            None if now - start >= WARMUP => at_warmup = Some((now, total)),
            Some((t0, bytes0)) if now - t0 >= WINDOW => {
                break (total - bytes0) as f64 * 8.0 / (now - t0).as_secs_f64();
            }
            _ => {}
        }
    };
    drop(conn);
    writer.join().expect("sender thread");
    result
}

/// Socket errors that only mean "nothing happened yet".
fn retryable(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::{Interrupted, TimedOut, WouldBlock};
    matches!(e.kind(), WouldBlock | TimedOut | Interrupted)
}

fn assert_rate(what: &str, measured: f64, rate: u64) {
    let ratio = measured / rate as f64;
    eprintln!(
        "{what}: {:.2} Mbit/s for {:.0} Mbit/s requested ({:.0}%)",
        measured / 1e6,
        rate as f64 / 1e6,
        ratio * 100.0
    );
    assert!(ratio <= 1.10, "{what}: {measured:.0} bit/s exceeds {rate} bit/s by more than 10%");
    assert!(ratio >= 0.60, "{what}: {measured:.0} bit/s is below 60% of {rate} bit/s");
}

/// Both directions shaped at `rate`: traffic into the pod (wan → pod) and out of it (pod → wan).
fn shaped_both_ways(rate: u64) {
    let rig = Rig::new();
    rig.ours("ADD", &rig.conf(both(rate))).expect_ok();
    assert_rate("ingress (wan → pod)", throughput(&rig.wan, &rig.pod, POD_IP), rate);
    assert_rate("egress (pod → wan)", throughput(&rig.pod, &rig.wan, WAN_IP), rate);
    rig.ours("DEL", &rig.conf(both(rate))).expect_ok();
    rig.assert_clean();
}

#[test]
fn shapes_1_mbit_both_ways() {
    shaped_both_ways(MBIT);
}

#[test]
fn shapes_10_mbit_both_ways() {
    shaped_both_ways(10 * MBIT);
}

#[test]
fn shapes_50_mbit_both_ways() {
    shaped_both_ways(50 * MBIT);
}

#[test]
fn unshaped_direction_stays_unshaped() {
    let rig = Rig::new();
    let rate = 10 * MBIT;
    let burst = burst_for(rate);
    let ingress_only = rig.conf(json!({"ingressRate": rate, "ingressBurst": burst}));
    rig.ours("ADD", &ingress_only).expect_ok();
    assert!(rig.ifbs().is_empty(), "no ifb without egress shaping");
    let egress = throughput(&rig.pod, &rig.wan, WAN_IP);
    eprintln!("unshaped egress: {:.0} Mbit/s", egress / 1e6);
    assert!(egress > 5.0 * rate as f64, "egress {egress:.0} bit/s looks shaped");
    rig.ours("DEL", &ingress_only).expect_ok();
    rig.assert_clean();

    // Egress only, from runtimeConfig (the `bandwidth` capability).
    let mut egress_only = rig.conf(json!({}));
    egress_only["runtimeConfig"] = json!({"bandwidth": {"egressRate": rate, "egressBurst": burst}});
    rig.ours("ADD", &egress_only).expect_ok();
    assert_eq!(rig.qdisc_kinds(&rig.host_veth), vec!["ingress".to_string()], "only the redirect on the host veth");
    let ingress = throughput(&rig.wan, &rig.pod, POD_IP);
    eprintln!("unshaped ingress: {:.0} Mbit/s", ingress / 1e6);
    assert!(ingress > 5.0 * rate as f64, "ingress {ingress:.0} bit/s looks shaped");
    rig.ours("DEL", &egress_only).expect_ok();
    rig.assert_clean();
}

// ---------------------------------------------------------------------------------------------------
// ADD, CHECK, DEL, GC

#[test]
fn add_result_check_and_del() {
    let rig = Rig::new();
    let conf = rig.conf(json!({"ingressRate": 8 * MBIT, "ingressBurst": 800_000,
        "egressRate": 8 * MBIT, "egressBurst": 800_000}));
    let result = rig.ours("ADD", &conf).expect_ok().clone();
    let ifb = result["interfaces"][2]["name"].as_str().expect("ifb in the result").to_string();
    assert!(ifb.starts_with("bwp") && ifb.len() == 15, "{ifb}");
    assert_eq!(rig.ifbs(), vec![ifb.clone()]);
    assert_eq!(result["ips"], rig.prev_result()["ips"], "prevResult passes through");

    // tbf values as the reference computes them: 1 MB/s, limit 25 ms + burst.
    let tbf = &rig.tc_json(&["qdisc", "show", "dev", &rig.host_veth])[0];
    assert_eq!(tbf["kind"], "tbf");
    assert_eq!(tbf["options"]["rate"], 1_000_000);
    assert_eq!(tbf["options"]["burst"], 100_000);
    assert_eq!(tbf["options"]["lat"], 25_000, "{tbf}");

    let mut check = conf.clone();
    check["prevResult"] = result.clone();
    rig.ours("CHECK", &check).expect_ok();
    if have_reference() {
        rig.run(REFERENCE, "CHECK", "ctr1", &check).expect_ok();
    }
    // CHECK notices a changed rate and a missing ifb.
    rig.tc(&[
        "qdisc",
        "replace",
        "dev",
        &rig.host_veth,
        "root",
        "handle",
        "1:",
        "tbf",
        "rate",
        "2mbit",
        "burst",
        "100000",
        "latency",
        "25ms",
    ]);
    let err = rig.ours("CHECK", &check).expect_err().clone();
    assert!(err["msg"].as_str().unwrap_or_default().contains("rate"), "{err}");
    rig.ours("ADD", &conf).expect_ok(); // ADD again puts it right
    rig.ours("CHECK", &check).expect_ok();
    rig.node.ip(&["link", "del", &ifb]);
    let err = rig.ours("CHECK", &check).expect_err().clone();
    assert!(err["msg"].as_str().unwrap_or_default().contains(&ifb), "{err}");

    // DEL removes everything, and succeeds again when there is nothing left.
    rig.ours("DEL", &conf).expect_ok();
    rig.assert_clean();
    rig.ours("DEL", &conf).expect_ok();
}

#[test]
fn add_is_repeatable_and_answers_in_the_config_version() {
    let rig = Rig::new();
    for version in ["0.3.1", "0.4.0", "1.0.0", "1.1.0"] {
        let mut conf = rig.conf(both(4 * MBIT));
        conf["cniVersion"] = json!(version);
        // A second ADD of the same pod (e.g. after an ADD that was killed half-way) replaces the first.
        let result = rig.ours("ADD", &conf).expect_ok().clone();
        assert_eq!(result["cniVersion"], version);
        assert_eq!(rig.ifbs().len(), 1);
        let filters = rig.tc_json(&["filter", "show", "dev", &rig.host_veth, "parent", "ffff:"]);
        let redirects = filters.iter().filter(|f| f["options"]["actions"].is_array()).count();
        assert_eq!(redirects, 1, "one redirect filter: {filters:?}");
    }
    rig.ours("DEL", &rig.conf(both(4 * MBIT))).expect_ok();
    rig.assert_clean();
}

#[test]
fn del_when_the_pod_is_gone_or_without_prev_result() {
    let rig = Rig::new();
    let conf = rig.conf(both(4 * MBIT));
    rig.ours("ADD", &conf).expect_ok();
    // Without prevResult (spec < 0.4.0 DELs): the pod's veth is found from the netns.
    let mut bare = conf.clone();
    bare.as_object_mut().unwrap().remove("prevResult");
    rig.ours("DEL", &bare).expect_ok();
    rig.assert_clean();

    rig.ours("ADD", &conf).expect_ok();
    let Rig { node, pod, wan, host_veth } = rig;
    let pod_path = pod.path.display().to_string();
    drop(pod); // the veth goes with it; the ifb stays until DEL
    let env = [("CNI_CONTAINERID", "ctr1"), ("CNI_NETNS", pod_path.as_str()), ("CNI_IFNAME", "eth0")];
    node.run_plugin("bandwidth", "DEL", &env, &conf).expect_ok();
    let ifbs = node.ip_json(&["link", "show", "type", "ifb"]);
    assert_eq!(ifbs.as_array().map(Vec::len), Some(0), "ifb left: {ifbs}");
    node.run_plugin("bandwidth", "DEL", &env, &conf).expect_ok();
    drop((wan, host_veth));
}

#[test]
fn gc_removes_ifbs_of_invalid_attachments_only() {
    let rig = Rig::new();
    // A second pod on the same node.
    let pod2 = rig.node.pod_netns();
    let veth2 = unique_name("hv");
    veth_between(&rig.node, &pod2, &veth2, "eth0", &[], &[]);
    let egress = json!({"egressRate": 4 * MBIT, "egressBurst": burst_for(4 * MBIT)});
    let keep = rig.run("bandwidth", "ADD", "keep", &rig.conf(egress.clone())).expect_ok()["interfaces"][2]["name"]
        .as_str()
        .expect("ifb in the result")
        .to_string();
    let mut conf2 = rig.conf(egress.clone());
    conf2["prevResult"]["interfaces"] =
        json!([{"name": veth2}, {"name": "eth0", "sandbox": pod2.path.display().to_string()}]);
    let path2 = pod2.path.display().to_string();
    let env2 = [("CNI_CONTAINERID", "gone"), ("CNI_NETNS", path2.as_str()), ("CNI_IFNAME", "eth0")];
    rig.node.run_plugin("bandwidth", "ADD", &env2, &conf2).expect_ok();
    // An ifb of another network, made by hand with our tag: not this GC's business.
    rig.node.ip(&["link", "add", "bwpforeign00000", "type", "ifb"]);
    rig.node.ip(&["link", "set", "bwpforeign00000", "alias", "cni-bandwidth othernet gone"]);
    assert_eq!(rig.ifbs().len(), 3);

    let gc = json!({"cniVersion": "1.1.0", "name": "bwnet", "type": "bandwidth",
        "cni.dev/valid-attachments": [{"containerID": "keep", "ifname": "eth0"}]});
    rig.node.run_plugin("bandwidth", "GC", &[], &gc).expect_ok();
    let mut left = rig.ifbs();
    left.sort();
    let mut expected = vec![keep, "bwpforeign00000".to_string()];
    expected.sort();
    assert_eq!(left, expected);
}

// ---------------------------------------------------------------------------------------------------
// Interop with the reference plugin

#[test]
fn reference_add_is_cleaned_up_by_our_del() {
    if !have_reference() {
        return;
    }
    let rig = Rig::new();
    let conf = rig.conf(both(4 * MBIT));
    let result = rig.run(REFERENCE, "ADD", "ctr1", &conf).expect_ok().clone();
    let mut check = conf.clone();
    check["prevResult"] = result;
    rig.ours("CHECK", &check).expect_ok();
    rig.ours("DEL", &check).expect_ok();
    rig.assert_clean();
}

#[test]
fn our_add_is_cleaned_up_by_the_reference_del() {
    if !have_reference() {
        return;
    }
    let rig = Rig::new();
    let conf = rig.conf(both(4 * MBIT));
    rig.ours("ADD", &conf).expect_ok();
    rig.run(REFERENCE, "DEL", "ctr1", &conf).expect_ok();
    // The reference deletes the ifb and leaves the host veth's qdiscs to the veth's deletion by the main
    // plugin, which comes next in a chain's DEL.
    assert_eq!(rig.ifbs(), Vec::<String>::new());
    let Rig { node, pod, wan, host_veth } = rig;
    drop(pod);
    // The kernel dismantles a deleted namespace asynchronously.
    wait_for(Duration::from_secs(10), || !node.links().contains(&host_veth));
    let links = node.links();
    assert!(!links.contains(&host_veth), "{links:?}");
    assert!(links.iter().all(|l| !l.starts_with("bwp")), "{links:?}");
    drop(wan);
}

#[test]
fn reference_leftovers_after_its_del_are_taken_over() {
    if !have_reference() {
        return;
    }
    let rig = Rig::new();
    let conf = rig.conf(both(4 * MBIT));
    // The reference's DEL deletes only the ifb: its filter now redirects to a device that is gone.
    rig.run(REFERENCE, "ADD", "ctr1", &conf).expect_ok();
    rig.run(REFERENCE, "DEL", "ctr1", &conf).expect_ok();
    assert_eq!(rig.qdisc_kinds(&rig.host_veth), vec!["tbf".to_string(), "ingress".to_string()]);
    let result = rig.ours("ADD", &conf).expect_ok().clone();
    assert_eq!(rig.filter_nodes(&rig.host_veth, "ffff:"), vec![(1, true)], "the dangling redirect is replaced");
    let mut check = conf.clone();
    check["prevResult"] = result;
    rig.ours("CHECK", &check).expect_ok();
    rig.ours("DEL", &conf).expect_ok();
    rig.assert_clean();
    rig.run(REFERENCE, "ADD", "ctr1", &conf).expect_ok();
    rig.ours("DEL", &conf).expect_ok();
    rig.assert_clean();
}

/// cnicore::tc directly: tbf options (with a 64-bit rate), ingress and clsact qdiscs, the redirect filter
/// with its cookie, listing and deleting.
#[test]
fn tc_api_round_trip() {
    use cnicore::tc::{handle, QdiscKind, Tbf};
    let node = Node::new();
    let pod = node.pod_netns();
    let dev = unique_name("hv");
    let (index, _) = veth_between(&node, &pod, &dev, "eth0", &[], &[]);
    let mut nl = node.netlink();
    let ifb = nl.create_ifb(&unique_name("ifb"), None).expect("ifb");

    let fast = Tbf { rate: 5_000_000_000, buffer: 1000, limit: 100_000, burst: None };
    nl.add_tbf(index, handle::make(1, 0), handle::ROOT, &fast, false).expect("add tbf");
    let root = nl.root_qdisc(index).expect("list").expect("root qdisc");
    assert_eq!((root.handle, root.kind.clone()), (handle::make(1, 0), QdiscKind::Tbf(Some(fast))));
    assert!(nl.add_tbf(index, handle::make(1, 0), handle::ROOT, &fast, false).is_err(), "EEXIST without replace");
    let slow = Tbf::like_reference(MBIT, 80_000).expect("tbf");
    nl.add_tbf(index, handle::make(1, 0), handle::ROOT, &slow, true).expect("replace tbf");
    assert_eq!(nl.root_qdisc(index).unwrap().unwrap().kind, QdiscKind::Tbf(Some(slow)));

    nl.add_ingress_qdisc(index).expect("ingress");
    assert!(nl.add_clsact_qdisc(index).is_err(), "one ingress-like qdisc per device");
    let cookie = b"0123456789abcdef";
    nl.add_redirect_filter(index, handle::INGRESS, 3, ifb.index, Some(cookie)).expect("filter");
    let filters = nl.filters(index, handle::INGRESS).expect("filters");
    let node_filter = filters.iter().find(|f| !f.redirects.is_empty()).expect("a redirect node");
    assert_eq!((node_filter.prio, node_filter.protocol, node_filter.kind.as_str()), (3, 0x0003, "u32"));
    assert_eq!(node_filter.redirects[0].ifindex, ifb.index);
    assert!(node_filter.redirects[0].egress_redirect);
    assert_eq!(node_filter.redirects[0].cookie, cookie.to_vec());
    // Deleting the last node of a priority removes the whole classifier instance.
    nl.delete_filter(node_filter).expect("delete node");
    assert!(nl.filters(index, handle::INGRESS).unwrap().is_empty());
    nl.add_redirect_filter(index, handle::INGRESS, 3, ifb.index, None).expect("filter");
    nl.delete_filter_prio(index, handle::INGRESS, 3, 0x0003).expect("delete prio");
    assert!(nl.filters(index, handle::INGRESS).unwrap().is_empty());
    assert!(nl.delete_filter_prio(index, handle::INGRESS, 0, 0x0003).is_err(), "prio 0 is refused");

    let ingress = nl.ingress_qdisc(index).unwrap().expect("ingress qdisc");
    assert!(nl.delete_qdisc_if_present(&ingress).unwrap());
    assert!(!nl.delete_qdisc_if_present(&ingress).unwrap(), "already gone");
    nl.add_clsact_qdisc(index).expect("clsact");
    let clsact = nl.ingress_qdisc(index).unwrap().expect("clsact qdisc");
    assert_eq!(clsact.kind, QdiscKind::Clsact);
    assert_eq!(clsact.ingress_filter_parent(), Some(handle::CLSACT_INGRESS));
    nl.add_redirect_filter(index, handle::CLSACT_INGRESS, 1, ifb.index, None).expect("filter on clsact");
    assert_eq!(
        nl.filters(index, handle::CLSACT_INGRESS).unwrap().iter().filter(|f| !f.redirects.is_empty()).count(),
        1
    );
    let root = nl.root_qdisc(index).unwrap().unwrap();
    nl.delete_qdisc(index, root.handle, root.parent).expect("delete root");
    assert_eq!(nl.root_qdisc(index).unwrap(), None);
    assert_eq!(nl.qdiscs(None).unwrap().iter().filter(|q| q.index == index && q.handle != 0).count(), 1);
}

// ---------------------------------------------------------------------------------------------------
// Coexistence with other tc users

#[test]
fn coexists_with_a_pre_existing_ingress_qdisc() {
    let rig = Rig::new();
    let dev = rig.host_veth.clone();
    // Another tool's ingress qdisc with its own filter at priority 1 (it only looks at 192.0.2.1).
    rig.tc(&["qdisc", "add", "dev", &dev, "ingress"]);
    rig.tc(&[
        "filter",
        "add",
        "dev",
        &dev,
        "parent",
        "ffff:",
        "protocol",
        "ip",
        "prio",
        "1",
        "u32",
        "match",
        "ip",
        "dst",
        "192.0.2.1/32",
        "flowid",
        "1:2",
    ]);
    let rate = 10 * MBIT;
    let conf = rig.conf(both(rate));
    rig.ours("ADD", &conf).expect_ok();
    assert_eq!(
        rig.filter_nodes(&dev, "ffff:"),
        vec![(1, false), (2, true)],
        "theirs at 1, ours at the next free priority"
    );
    assert_rate("egress through a shared ingress qdisc", throughput(&rig.pod, &rig.wan, WAN_IP), rate);
    rig.ours("DEL", &conf).expect_ok();
    // Their qdisc and filter stay; ours is gone, and so are the ifb and the root tbf.
    assert_eq!(rig.qdisc_kinds(&dev), vec!["ingress".to_string()]);
    assert_eq!(rig.filter_nodes(&dev, "ffff:"), vec![(1, false)]);
    assert!(rig.ifbs().is_empty());
}

#[test]
fn coexists_with_a_pre_existing_clsact_qdisc() {
    let rig = Rig::new();
    let dev = rig.host_veth.clone();
    rig.tc(&["qdisc", "add", "dev", &dev, "clsact"]);
    let conf = rig.conf(both(4 * MBIT));
    let result = rig.ours("ADD", &conf).expect_ok().clone();
    let filters = rig.tc_json(&["filter", "show", "dev", &dev, "ingress"]);
    assert!(
        filters.iter().any(|f| f["options"]["actions"].is_array()),
        "our filter on the clsact ingress hook: {filters:?}"
    );
    let mut check = conf.clone();
    check["prevResult"] = result;
    rig.ours("CHECK", &check).expect_ok();
    rig.ours("DEL", &conf).expect_ok();
    assert_eq!(rig.qdisc_kinds(&dev), vec!["clsact".to_string()]);
    assert!(rig.tc_json(&["filter", "show", "dev", &dev, "ingress"]).is_empty());
    assert!(rig.ifbs().is_empty());
}

// ---------------------------------------------------------------------------------------------------
// Bad input

#[test]
fn v1_5_subnet_fields_are_ignored_with_a_warning() {
    // Reference v1.5 shaped only (or all but) some subnets with HTB; v1.6 reverted it and v1.6-v1.9 ignore
    // the fields. A v1.5 config must work: the whole pod traffic is shaped, and stderr says so.
    let rig = Rig::new();
    let mut limits = both(MBIT);
    limits["shapedSubnets"] = json!(["10.0.0.0/8"]);
    limits["unshapedSubnets"] = json!(["192.168.0.0/16"]);
    let conf = rig.conf(limits);
    let out = rig.ours("ADD", &conf);
    out.expect_ok();
    assert!(out.stderr.contains("shapedSubnets and unshapedSubnets are ignored"), "stderr: {}", out.stderr);
    assert_eq!(rig.qdisc_kinds(&rig.host_veth).iter().filter(|k| *k == "tbf").count(), 1);
    assert_eq!(rig.ifbs().len(), 1);
    rig.ours("CHECK", &conf).expect_ok();
    rig.ours("DEL", &conf).expect_ok();
    rig.assert_clean();
}

/// What cannot be shaped is refused with nothing changed (the bad configs are in the bad-input corpus).
#[test]
fn refuses_what_it_cannot_shape_and_changes_nothing() {
    let rig = Rig::new();
    // A pod interface that is not a veth.
    rig.pod.ip(&["link", "add", "notveth0", "type", "bridge"]);
    let netns = rig.pod.path.display().to_string();
    let env = [("CNI_CONTAINERID", "ctr1"), ("CNI_NETNS", netns.as_str()), ("CNI_IFNAME", "notveth0")];
    let err = rig.node.run_plugin("bandwidth", "ADD", &env, &rig.conf(both(MBIT))).expect_err().clone();
    assert!(err["msg"].as_str().unwrap_or_default().contains("notveth0 has no veth peer"), "{err}");
    rig.assert_clean();
    // Another tool's root qdisc is not replaced.
    rig.tc(&["qdisc", "add", "dev", &rig.host_veth, "root", "handle", "5:", "htb"]);
    let err = rig.ours("ADD", &rig.conf(both(MBIT))).expect_err().clone();
    assert!(err["msg"].as_str().unwrap_or_default().contains("already has a root qdisc htb"), "{err}");
    assert_eq!(rig.qdisc_kinds(&rig.host_veth), vec!["htb".to_string()]);
    assert!(rig.ifbs().is_empty());
}
