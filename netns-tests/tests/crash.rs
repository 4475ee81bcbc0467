//! Crash consistency (issue 7): a plugin killed with SIGKILL after any step of ADD leaves a node from which
//! DEL removes everything of the pod, after which a new ADD of the same pod works.
//!
//! The binaries must be built with `--features cnicore/failpoints` (as `scripts/test.sh` does): a process
//! whose `CNI_FAILPOINT` names a fail point it reaches (`cnicore::failpoint::hit`) SIGKILLs itself there.
//! Our cnitool passes the variable to every plugin of the chain, and the bridge to host-local, so one name
//! stops exactly one process at exactly one step.
//!
//! Each fail point is one test on a fresh node, with the kubenet chain of `conf/` (bridge + host-local,
//! portmap with a TCP and a UDP host port, bandwidth both ways) run by our cnitool, as a runtime would:
//! 1. snapshot the node; ADD with the fail point: the named process must die by SIGKILL (cnitool reports the
//!    signal of a plugin; cnitool's own death is its exit status) and the node must have changed;
//! 2. no state file is half-written: every lease holds a whole `<containerID>\r\n<ifname>`, every cache entry
//!    is a whole cache record (temporary files may exist: they are not leases or entries);
//! 3. DEL with the same config and CAP_ARGS; as the ADD never finished there is no cached result, so every
//!    plugin gets no `prevResult` and must find its state from the container ID and the netns;
//! 4. the node must hold nothing of the pod compared with step 1, beyond the shared state a complete
//!    ADD + DEL also leaves (the bridge, node sysctls, the shared empty chains, host-local's bookkeeping):
//!    see `netns_tests::kubenet` for exactly what is excluded and why;
//! 5. a new ADD of the same pod succeeds and the pod pings its gateway; its DEL leaves the node as in 4.
//!
//! host-local's fail points are also tested with host-local run on its own (its ADD killed, then its DEL and
//! a new ADD), since under the bridge a killed host-local makes the bridge roll back rather than die.
//!
//! macvlan and ptp are killed at each of their fail points when run on their own (`link_plugin_crash`): the DEL
//! that follows must leave node and pod exactly as before (lease and masquerade rules included).

use netns_tests::kubenet;

use std::net::IpAddr;
use std::os::unix::process::ExitStatusExt;

use kubenet::{cap_args, result_ips, Kubenet, GATEWAY_V4};
use netns_tests::snapshot::NodeSnapshot;
use netns_tests::{assert_ping, json, Node, PluginOutput, Value};

const KUBENET: &str = "10-kubenet.conflist";
const KUBENET_NFT: &str = "30-kubenet-nftables.conflist";
const KUBENET_DUALSTACK: &str = "20-kubenet-dualstack.conflist";
const SIGKILL: i32 = 9;
const HOST_PORT: u16 = 8080;

/// Panics unless `out` (of our cnitool's ADD) shows that `victim` (a plugin, or `cnitool` itself) was killed
/// by SIGKILL.
fn assert_killed(out: &PluginOutput, victim: &str, failpoint: &str) {
    let not_built = "are the binaries built with --features cnicore/failpoints (scripts/test.sh)?";
    assert!(!out.success(), "ADD with CNI_FAILPOINT={failpoint} succeeded: {not_built}");
    if victim == "cnitool" {
        assert_eq!(out.status.signal(), Some(SIGKILL), "cnitool not killed at {failpoint}: {} {not_built}", out.stderr);
    } else {
        // libcni-style report of a plugin that died: `plugin <path>/<name> failed (signal: 9 (SIGKILL))`.
        let report = format!("/{victim} failed (signal: {SIGKILL}");
        assert!(
            out.stderr.contains(&report),
            "{victim} not killed at {failpoint} ({not_built}); cnitool said: {}{}",
            out.stdout_text,
            out.stderr
        );
    }
}

/// No lease or cache entry is half-written: leases hold `<containerID>\r\n<ifname>` of a cnitool container,
/// cache entries a whole `cniCacheV1` record. Temporary (`.tmp-*`) files may exist; they are neither.
fn assert_state_files_whole(k: &Kubenet) {
    for (ip, content) in k.leases() {
        let text = String::from_utf8_lossy(&content);
        let whole = text.split_once("\r\n").is_some_and(|(id, ifname)| id.starts_with("cnitool-") && ifname == "eth0");
        assert!(whole, "lease {ip} is not whole: {text:?}");
    }
    for name in k.cache_files().iter().filter(|n| !n.starts_with(".tmp-")) {
        let path = k.cache_dir.join("results").join(name);
        let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
        let record: Value =
            serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("cache entry {name} is torn: {e}"));
        assert_eq!(record["kind"], "cniCacheV1", "cache entry {name}: {record}");
    }
}

/// The whole scenario of the module doc for one fail point of the chain in `conf/<file>` (changed by
/// `tweak`), where `victim` is the process that must die.
fn crash_and_recover(file: &str, tweak: impl FnOnce(&mut Value), failpoint: &str, victim: &str) {
    let k = Kubenet::new(file, tweak);
    let pod = k.node.pod_netns();
    let caps = cap_args(HOST_PORT);
    let before = k.snapshot();

    let out = k.cnitool("add", &pod, &caps, Some(failpoint));
    assert_killed(&out, victim, failpoint);
    let crashed = NodeSnapshot::take(&k.node, &k.state_dirs());
    let changed = before.diff(&crashed).is_some();
    assert!(changed, "{failpoint}: the killed ADD changed nothing: is the fail point after a step?");
    assert_state_files_whole(&k);
    if victim == "cnitool" {
        // Killed between writing the cache entry's temporary file and renaming it: no entry, only that file.
        let files = k.cache_files();
        assert!(!files.is_empty() && files.iter().all(|f| f.starts_with(".tmp-")), "{failpoint}: cache {files:?}");
    }

    k.del(&pod, &caps);
    k.assert_no_residue(&before, &k.snapshot(), &format!("{failpoint}: after the killed ADD and a DEL"));
    assert!(!pod.links().contains(&"eth0".to_string()), "{failpoint}: eth0 left in the pod");

    let result = k.add(&pod, &caps);
    let ips = result_ips(&result);
    assert!(!ips.is_empty(), "{failpoint}: no address in the new ADD's result {result}");
    assert_ping(&pod, GATEWAY_V4.parse().expect("constant"));
    k.del(&pod, &caps);
    k.assert_no_residue(&before, &k.snapshot(), &format!("{failpoint}: after a new ADD and DEL"));
}

/// One test per fail point: `test: "fail point" in conflist, tweak of the conflist, kills "process that dies";`.
macro_rules! crash_tests {
    ($($test:ident: $failpoint:literal in $file:expr, $tweak:expr, kills $victim:literal;)*) => {$(
        #[test]
        fn $test() {
            crash_and_recover($file, $tweak, $failpoint, $victim);
        }
    )*};
}

fn as_is(_: &mut Value) {}

/// The bridge of the conflist with `macspoofchk` on (the only step the conflists do not exercise).
fn with_spoof_check(conf: &mut Value) {
    conf["plugins"][0]["macspoofchk"] = json!(true);
}

crash_tests! {
    // IPAM runs in a thread while the links are made: killed when the lease is back, links made or not.
    bridge_after_ipam: "bridge/after-ipam" in KUBENET, as_is, kills "bridge";
    bridge_after_bridge: "bridge/after-bridge" in KUBENET, as_is, kills "bridge";
    bridge_after_veth: "bridge/after-veth" in KUBENET, as_is, kills "bridge";
    bridge_after_port: "bridge/after-port" in KUBENET, as_is, kills "bridge";
    bridge_after_spoofchk: "bridge/after-spoofchk" in KUBENET, with_spoof_check, kills "bridge";
    bridge_after_pod_addresses: "bridge/after-pod-addresses" in KUBENET, as_is, kills "bridge";
    bridge_after_gateway: "bridge/after-gateway" in KUBENET, as_is, kills "bridge";
    bridge_after_sysctls: "bridge/after-sysctls" in KUBENET, as_is, kills "bridge";
    bridge_after_masq_iptables: "bridge/after-masq" in KUBENET, as_is, kills "bridge";
    bridge_after_masq_nftables: "bridge/after-masq" in KUBENET_NFT, as_is, kills "bridge";

    host_local_after_temp_lease_in_chain: "host-local/after-temp-lease" in KUBENET, as_is, kills "host-local";
    host_local_after_lease_in_chain: "host-local/after-lease" in KUBENET, as_is, kills "host-local";
    host_local_after_last_reserved_in_chain: "host-local/after-last-reserved" in KUBENET, as_is, kills "host-local";
    host_local_after_index_in_chain: "host-local/after-index" in KUBENET, as_is, kills "host-local";

    portmap_after_localnet: "portmap/after-localnet" in KUBENET, as_is, kills "portmap";
    portmap_after_iptables: "portmap/after-iptables" in KUBENET, as_is, kills "portmap";
    portmap_after_conntrack_iptables: "portmap/after-conntrack" in KUBENET, as_is, kills "portmap";
    portmap_after_nftables: "portmap/after-nftables" in KUBENET_NFT, as_is, kills "portmap";
    portmap_after_conntrack_nftables: "portmap/after-conntrack" in KUBENET_NFT, as_is, kills "portmap";

    bandwidth_after_ingress_tbf: "bandwidth/after-ingress-tbf" in KUBENET, as_is, kills "bandwidth";
    bandwidth_after_ifb: "bandwidth/after-ifb" in KUBENET, as_is, kills "bandwidth";
    bandwidth_after_ifb_tbf: "bandwidth/after-ifb-tbf" in KUBENET, as_is, kills "bandwidth";
    bandwidth_after_ingress_qdisc: "bandwidth/after-ingress-qdisc" in KUBENET, as_is, kills "bandwidth";
    bandwidth_after_filter: "bandwidth/after-filter" in KUBENET, as_is, kills "bandwidth";

    // Dual stack: both families everywhere; portmap dies after the first of its two iptables-restore (one per
    // family), so DEL must clean a pod half set up.
    dualstack_bridge_after_gateway: "bridge/after-gateway" in KUBENET_DUALSTACK, as_is, kills "bridge";
    dualstack_bridge_after_masq: "bridge/after-masq" in KUBENET_DUALSTACK, as_is, kills "bridge";
    dualstack_portmap_after_iptables: "portmap/after-iptables" in KUBENET_DUALSTACK, as_is, kills "portmap";

    runner_before_cache_rename: "state/before-rename" in KUBENET, as_is, kills "cnitool";
}

// ---- host-local on its own ----

const CONTAINER: &str = "crash-test-container";

fn host_local_conf(data_dir: &std::path::Path) -> Value {
    json!({
        "cniVersion": "1.0.0",
        "name": "crashnet",
        "ipam": {"type": "host-local", "dataDir": data_dir, "ranges": [[{"subnet": "10.9.0.0/29"}]]}
    })
}

fn host_local(node: &Node, verb: &str, conf: &Value, failpoint: Option<&str>) -> PluginOutput {
    let mut env = vec![("CNI_CONTAINERID", CONTAINER), ("CNI_IFNAME", "eth0"), ("CNI_NETNS", "/proc/self/ns/net")];
    if let Some(name) = failpoint {
        env.push(("CNI_FAILPOINT", name));
    }
    node.run_plugin("host-local", verb, &env, conf)
}

/// The entries of host-local's network directory other than its bookkeeping (lock, last_reserved_ip.*,
/// the index): leases and temporary files.
fn lease_dir_entries(dir: &std::path::Path) -> Vec<(String, Vec<u8>)> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut out: Vec<(String, Vec<u8>)> = entries
        .flatten()
        .map(|e| (e.file_name().to_string_lossy().into_owned(), e.path()))
        .filter(|(name, _)| name != "lock" && !name.starts_with("last_reserved_ip.") && name != ".host-local-index")
        .map(|(name, path)| (name, std::fs::read(path).unwrap_or_default()))
        .collect();
    out.sort();
    out
}

/// host-local killed after `failpoint`: a lease, if any, is whole; DEL removes it (and any temporary file);
/// a new ADD succeeds.
fn host_local_crash(failpoint: &str) {
    let node = Node::new();
    let data_dir = node.dir().join("ipam");
    let net_dir = data_dir.join("crashnet");
    let conf = host_local_conf(&data_dir);

    let out = host_local(&node, "ADD", &conf, Some(failpoint));
    let killed = out.status.signal() == Some(SIGKILL);
    assert!(killed, "host-local not killed at {failpoint} (built with failpoints?): {out:?}");
    let left = lease_dir_entries(&net_dir);
    assert!(!left.is_empty(), "{failpoint}: the killed ADD left no file: is the fail point after a write?");
    for (name, content) in &left {
        if name.parse::<IpAddr>().is_ok() {
            assert_eq!(content, format!("{CONTAINER}\r\neth0").as_bytes(), "{failpoint}: lease {name} is not whole");
        } else {
            assert!(name.starts_with(".tmp-"), "{failpoint}: unexpected file {name}");
        }
    }

    let out = host_local(&node, "DEL", &conf, None);
    assert!(out.success(), "{failpoint}: DEL failed: {out:?}");
    assert_eq!(lease_dir_entries(&net_dir), vec![], "{failpoint}: DEL left leases or temporary files");

    // Any address of the range: the round-robin position may have moved on with the killed ADD.
    let out = host_local(&node, "ADD", &conf, None);
    let result = out.expect_ok();
    let address = result["ips"][0]["address"].as_str().unwrap_or_default();
    assert!(address.starts_with("10.9.0.") && address.ends_with("/29"), "{failpoint}: {result}");
    let out = host_local(&node, "DEL", &conf, None);
    assert!(out.success(), "{failpoint}: DEL failed: {out:?}");
    assert_eq!(lease_dir_entries(&net_dir), vec![], "{failpoint}: DEL left leases or temporary files");
}

#[test]
fn host_local_after_temp_lease() {
    host_local_crash("host-local/after-temp-lease");
}

#[test]
fn host_local_after_lease() {
    host_local_crash("host-local/after-lease");
}

#[test]
fn host_local_after_last_reserved() {
    host_local_crash("host-local/after-last-reserved");
}

#[test]
fn host_local_after_index() {
    host_local_crash("host-local/after-index");
}

/// The residue check used above sees every kind of state a live pod has (so that "no residue" means
/// something): its veth and ifb, qdiscs, firewall rules or set elements, lease, cache entry and index entry.
fn residue_check_sees_a_live_pod(file: &str, firewall: &[(&str, &str)]) {
    let k = Kubenet::new(file, as_is);
    let pod = k.node.pod_netns();
    let caps = cap_args(HOST_PORT);
    let before = k.snapshot();
    k.add(&pod, &caps);
    let problems = k.residue(&before, &NodeSnapshot::take(&k.node, &k.state_dirs())).join("\n");
    let common = [
        ("host veth", "links: + veth"),
        ("ifb", "links: + bwp"),
        ("tbf on the veth", "tc: + qdisc veth"),
        ("lease", "/10.244.1.2 file"),
        ("cache entry", "results/kubenet"),
        ("index entry", "host-local index: 10.244.1.2 cnitool-"),
    ];
    for (what, needle) in common.iter().chain(firewall) {
        assert!(problems.contains(needle), "the residue check misses the {what} ({needle}):\n{problems}");
    }
    k.del(&pod, &caps);
    k.assert_no_residue(&before, &k.snapshot(), "after ADD and DEL");
}

#[test]
fn residue_check_sees_a_live_pod_iptables() {
    residue_check_sees_a_live_pod(
        KUBENET,
        &[("masquerade jump", "iptables: + -A POSTROUTING -s 10.244.1.2/32"), ("DNAT chain", "iptables: + -A CNI-DN-")],
    );
}

#[test]
fn residue_check_sees_a_live_pod_nftables() {
    residue_check_sees_a_live_pod(
        KUBENET_NFT,
        &[
            ("masquerade set element", "nftables: + elements = { 10.244.1.2"),
            ("host port element", "nftables: + elements = { tcp . 8080"),
        ],
    );
}

// ---- The link plugins (macvlan, ptp) on their own, as a runtime calls them ----

/// A macvlan or ptp ADD killed at `failpoint`: the node (and the pod) changed; DEL without prevResult (the ADD
/// never answered) puts both back as they were, lease and masquerade rules included; a new ADD works (the pod
/// reaches its peer) and its DEL leaves nothing either.
fn link_plugin_crash(plugin: &str, failpoint: &str) {
    use netns_tests::linkrig::{Impl, LinkRig, LAN_HOST, UPLINK};
    use std::time::Duration;

    let rig = LinkRig::new(plugin);
    let mut conf = json!({"cniVersion": "1.0.0", "name": rig.network, "type": plugin});
    let peer: IpAddr = if plugin == "ptp" {
        // ADD turns ip_forward on and leaves it (as the reference does): on before the snapshot.
        rig.node.run(|| cnicore_sysctl_on("net/ipv4/ip_forward"));
        // The nat table exists before (DEL leaves it, empty).
        for op in ["-A", "-D"] {
            let args = ["-t", "nat", op, "POSTROUTING", "-j", "RETURN"];
            assert!(rig.node.exec("iptables", &args, &[], b"").status.success());
        }
        conf["ipMasq"] = json!(true);
        conf["ipam"] = rig.ipam("10.40.0.0/24");
        "10.40.0.1".parse().expect("constant")
    } else {
        conf["master"] = json!(UPLINK);
        conf["ipam"] = rig.ipam("10.30.0.0/24");
        LAN_HOST.parse().expect("constant")
    };
    let pod = rig.node.pod_netns();
    let settle = Duration::from_secs(5);
    let before = (NodeSnapshot::settled(&rig.node, &[], settle), NodeSnapshot::settled(&pod, &[], settle));

    let out = rig.add_at_failpoint(&pod, "crash", &conf, failpoint);
    assert_eq!(
        out.status.signal(),
        Some(SIGKILL),
        "{plugin} not killed at {failpoint} (built with --features cnicore/failpoints?): {}",
        out.stdout_text
    );
    let changed = NodeSnapshot::take(&rig.node, &[]) != before.0
        || NodeSnapshot::take(&pod, &[]) != before.1
        || !rig.leases().is_empty();
    assert!(changed, "{failpoint}: the killed ADD changed nothing (is the fail point after a change?)");

    rig.run(Impl::Ours, "DEL", Some(&pod.path), "crash", &conf, "").expect_ok();
    let after = (NodeSnapshot::settled(&rig.node, &[], settle), NodeSnapshot::settled(&pod, &[], settle));
    netns_tests::snapshot::assert_unchanged(&before.0, &after.0);
    netns_tests::snapshot::assert_unchanged(&before.1, &after.1);
    assert!(rig.leases().is_empty(), "{failpoint}: leases left {:?}", rig.leases());

    let result = rig.add(Impl::Ours, &pod, "crash", &conf);
    assert_ping(&pod, peer);
    rig.del(Impl::Ours, Some(&pod.path), "crash", &conf, &result);
    netns_tests::snapshot::assert_unchanged(&before.0, &NodeSnapshot::settled(&rig.node, &[], settle));
    assert!(rig.leases().is_empty());
}

fn cnicore_sysctl_on(name: &str) {
    netns_tests::cnicore::sysctl::write(name, "1").unwrap_or_else(|e| panic!("{name}: {e}"));
}

macro_rules! link_crash_tests {
    ($($test:ident: $plugin:literal at $failpoint:literal;)*) => {$(
        #[test]
        fn $test() {
            link_plugin_crash($plugin, $failpoint);
        }
    )*};
}

link_crash_tests! {
    macvlan_after_link: "macvlan" at "macvlan/after-link";
    macvlan_after_ipam: "macvlan" at "macvlan/after-ipam";
    ptp_after_ipam: "ptp" at "ptp/after-ipam";
    ptp_after_veth: "ptp" at "ptp/after-veth";
    ptp_after_pod: "ptp" at "ptp/after-pod";
    ptp_after_host: "ptp" at "ptp/after-host";
    ptp_after_masq: "ptp" at "ptp/after-masq";
}
