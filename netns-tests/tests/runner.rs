//! Our cnitool in real namespaces: a chain (the reference bridge with host-local, the reference firewall, our
//! loopback) added, checked and deleted in every version libcni speaks, the result cache written and read back,
//! GC and STATUS; and takeover of attachments between our cnitool and upstream cnitool through the cache.
//!
//! The firewall plugin makes the cache observable: its DEL removes the pod's rules only when it gets the pod's
//! addresses in `prevResult`, which the runner takes from the cache.

use netns_tests::upstream::{
    clean_command, output, plugin_dir, reference, upstream_cnitool, with_var_lib_cni, VarLibCni,
};
use netns_tests::{bin, json, result_ips, Node, PluginOutput, TestNetns, Value};
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

const BRIDGE_NET: &str = "runner-net";
const LOOPBACK_NET: &str = "lo-net";

/// A node with a conf dir, a plugin dir (reference bridge, host-local and firewall, our loopback), a host-local
/// data dir, and the result cache, which upstream cnitool sees as /var/lib/cni.
struct Rig {
    node: Node,
    conf_dir: PathBuf,
    plugins: PathBuf,
    data_dir: PathBuf,
    cache: VarLibCni,
}

impl Rig {
    fn new() -> Rig {
        let node = Node::new();
        let dir = node.dir().to_path_buf();
        let conf_dir = dir.join("net.d");
        fs::create_dir_all(&conf_dir).expect("conf dir");
        let (bridge, host_local, firewall) = (reference("bridge"), reference("host-local"), reference("firewall"));
        let loopback = bin("loopback");
        let plugins = plugin_dir(
            &dir.join("bin"),
            &[("bridge", &bridge), ("host-local", &host_local), ("firewall", &firewall), ("loopback", &loopback)],
        );
        let cache = VarLibCni::new(&dir);
        Rig { data_dir: dir.join("ipam"), node, conf_dir, plugins, cache }
    }

    /// Writes `conf` into the conf dir as `file`; returns the bytes written.
    fn write_conf(&self, file: &str, conf: &Value) -> Vec<u8> {
        let bytes = serde_json::to_vec_pretty(conf).expect("json");
        fs::write(self.conf_dir.join(file), &bytes).expect("write conf");
        bytes
    }

    /// The kubenet-like chain: bridge with host-local, firewall (from 0.4.0 on: the reference firewall speaks no
    /// older version), loopback (ours, passing the result through).
    fn bridge_chain(&self, version: &str) -> Vec<u8> {
        let bridge = json!({"type": "bridge", "bridge": "cni0", "isGateway": true,
            "ipam": {"type": "host-local", "subnet": "10.88.0.0/24", "dataDir": self.data_dir,
                     "routes": [{"dst": "0.0.0.0/0"}]}});
        let plugins = if has_firewall(version) {
            json!([bridge, {"type": "firewall"}, {"type": "loopback"}])
        } else {
            json!([bridge, {"type": "loopback"}])
        };
        let conf = json!({"cniVersion": version, "name": BRIDGE_NET, "plugins": plugins});
        self.write_conf("10-runner.conflist", &conf)
    }

    /// A list of our loopback twice, in any version (the reference plugins stop at 1.0.0).
    fn loopback_chain(&self, version: &str) -> Vec<u8> {
        let conf = json!({
            "cniVersion": version,
            "name": LOOPBACK_NET,
            "plugins": [{"type": "loopback"}, {"type": "loopback"}]
        });
        self.write_conf("20-lo.conflist", &conf)
    }

    fn env<'a>(&'a self, ifname: &'a str) -> Vec<(&'a str, &'a Path)> {
        vec![
            ("NETCONFPATH", self.conf_dir.as_path()),
            ("CNI_PATH", self.plugins.as_path()),
            ("CNI_IFNAME", Path::new(ifname)),
        ]
    }

    /// Our cnitool in the node namespace, with its cache in the test's directory.
    fn ours(&self, args: &[&str]) -> PluginOutput {
        self.ours_with(args, "eth0", |_| {})
    }

    fn ours_with(&self, args: &[&str], ifname: &str, tweak: impl FnOnce(&mut Command)) -> PluginOutput {
        let mut command = clean_command(&self.node, bin("cnitool"));
        command.args(args).envs(self.env(ifname)).env("CNI_CACHE_DIR", self.cache.path());
        tweak(&mut command);
        output(&mut command, b"")
    }

    /// Upstream cnitool in the node namespace, seeing the same cache as /var/lib/cni.
    fn upstream(&self, tool: &Path, args: &[&str]) -> PluginOutput {
        let mut command = clean_command(&self.node, tool);
        command.args(args).envs(self.env("eth0"));
        with_var_lib_cni(&mut command, &self.cache);
        output(&mut command, b"")
    }

    fn cache_file(&self, net: &str, pod: &TestNetns, ifname: &str) -> PathBuf {
        self.cache.path().join("results").join(format!("{net}-{}-{ifname}", container_id(&pod.path)))
    }

    fn lease(&self, ip: &str) -> PathBuf {
        self.data_dir.join(BRIDGE_NET).join(ip)
    }

    /// The node's iptables filter rules that name `ip` (the firewall plugin's per-pod rules).
    fn firewall_rules_for(&self, ip: &str) -> Vec<String> {
        let out = self.node.exec("iptables-save", &["-t", "filter"], &[], b"");
        assert!(out.status.success(), "iptables-save: {}", String::from_utf8_lossy(&out.stderr));
        let needle = format!("{ip}/32");
        String::from_utf8_lossy(&out.stdout).lines().filter(|l| l.contains(&needle)).map(str::to_string).collect()
    }
}

fn has_firewall(version: &str) -> bool {
    !version.starts_with("0.3")
}

fn path_str(path: &Path) -> &str {
    path.to_str().expect("utf-8 path")
}

fn ok(out: &PluginOutput, what: &str) {
    assert!(out.success(), "{what} failed ({}): stdout {} stderr {}", out.status, out.stdout_text, out.stderr);
}

fn failed(out: &PluginOutput, what: &str) {
    assert!(!out.success(), "{what} unexpectedly succeeded: stdout {}", out.stdout_text);
}

/// upstream cnitool's container ID: `cnitool-` and the first 20 hex digits of the SHA-512 of the netns path,
/// computed here with coreutils so that the test does not share code with the runner.
fn container_id(netns: &Path) -> String {
    let mut sha = Command::new("sha512sum");
    let out = netns_tests::upstream::output(&mut sha, path_str(netns).as_bytes());
    assert!(out.success(), "sha512sum: {}", out.stderr);
    format!("cnitool-{}", &out.stdout_text[..20])
}

fn base64(bytes: &[u8]) -> String {
    let out = netns_tests::upstream::output(Command::new("base64").arg("-w0"), bytes);
    assert!(out.success(), "base64: {}", out.stderr);
    out.stdout_text
}

fn pod_ip(result: &Value) -> String {
    result_ips(result)[0].to_string()
}

fn lo_is_up(pod: &TestNetns) -> bool {
    pod.netlink().require_link("lo").expect("lo").up
}

fn set_lo_down(pod: &TestNetns) {
    let mut netlink = pod.netlink();
    let lo = netlink.require_link("lo").expect("lo");
    netlink.set_down(lo.index).expect("set lo down");
}

/// The attachment made by the bridge chain is all there: pod interface and address, host veth, lease,
/// firewall rules (when the chain has the firewall), lo up.
fn assert_attached(rig: &Rig, pod: &TestNetns, ip: &str, firewall: bool) {
    let addrs = pod.ip_json(&["addr", "show", "dev", "eth0"]);
    assert!(addrs.to_string().contains(&format!("\"local\":\"{ip}\"")), "pod eth0: {addrs}");
    assert!(rig.lease(ip).is_file(), "no lease for {ip}");
    assert_eq!(rig.firewall_rules_for(ip).len(), if firewall { 2 } else { 0 }, "firewall rules for {ip}");
    assert!(lo_is_up(pod), "lo not up: loopback did not run");
}

/// Everything of the attachment is gone (except, when `rules_left`, the firewall rules, which need prevResult).
fn assert_detached(rig: &Rig, pod: &TestNetns, ip: &str, rules_left: bool) {
    assert!(!pod.links().contains(&"eth0".to_string()), "pod eth0 still there");
    assert!(!rig.lease(ip).exists(), "lease for {ip} still there");
    assert!(!rig.node.links().iter().any(|l| l.starts_with("veth")), "veth left: {:?}", rig.node.links());
    assert_eq!(rig.firewall_rules_for(ip).is_empty(), !rules_left, "rules {:?}", rig.firewall_rules_for(ip));
    assert!(!lo_is_up(pod), "lo still up: loopback DEL did not run");
}

#[test]
fn chain_add_check_del_in_every_libcni_version() {
    for version in ["0.3.1", "0.4.0", "1.0.0"] {
        let rig = Rig::new();
        let conflist = rig.bridge_chain(version);
        let pod = rig.node.pod_netns();
        set_lo_down(&pod);
        let netns = path_str(&pod.path);

        let add = rig.ours(&["add", BRIDGE_NET, netns]);
        ok(&add, &format!("{version} add"));
        let result = &add.stdout;
        assert_eq!(result["cniVersion"], version);
        let names: Vec<&str> =
            result["interfaces"].as_array().expect("interfaces").iter().filter_map(|i| i["name"].as_str()).collect();
        assert_eq!(names.len(), 3, "{result}");
        assert_eq!((names[0], names[2]), ("cni0", "eth0"), "{result}");
        assert_eq!(result["interfaces"][2]["sandbox"], netns);
        assert_eq!(result["ips"][0]["gateway"], "10.88.0.1");
        assert_eq!(result["ips"][0]["interface"], 2);
        let expected_ip_version = if version == "1.0.0" { Value::Null } else { json!("4") };
        assert_eq!(result["ips"][0].get("version").cloned().unwrap_or(Value::Null), expected_ip_version, "{result}");
        let ip = pod_ip(result);
        assert_attached(&rig, &pod, &ip, has_firewall(version));

        // The cache: libcni's format, file and directory modes, the container ID upstream derives.
        let cache_file = rig.cache_file(BRIDGE_NET, &pod, "eth0");
        let mode =
            |p: &Path| fs::metadata(p).unwrap_or_else(|e| panic!("{}: {e}", p.display())).permissions().mode() & 0o777;
        assert_eq!(mode(&cache_file), 0o600, "{}", cache_file.display());
        assert_eq!(mode(cache_file.parent().expect("results dir")), 0o700);
        let cached: Value = serde_json::from_slice(&fs::read(&cache_file).expect("read cache")).expect("cache json");
        assert_eq!(cached["kind"], "cniCacheV1");
        assert_eq!(cached["containerId"], container_id(&pod.path));
        assert_eq!(cached["ifName"], "eth0");
        assert_eq!(cached["networkName"], BRIDGE_NET);
        assert_eq!(cached["config"], base64(&conflist), "config: the conflist file's bytes, base64");
        assert_eq!(cached["result"], *result);

        let check = rig.ours(&["check", BRIDGE_NET, netns]);
        if version == "0.3.1" {
            failed(&check, "check on 0.3.1");
            assert!(check.stderr.contains("CHECK"), "{}", check.stderr);
        } else {
            ok(&check, &format!("{version} check"));
        }

        ok(&rig.ours(&["del", BRIDGE_NET, netns]), &format!("{version} del"));
        assert!(!cache_file.exists(), "cache left after DEL");
        // The firewall removes the pod's rules only if DEL carries the cached result as prevResult.
        assert_detached(&rig, &pod, &ip, false);
        ok(&rig.ours(&["del", BRIDGE_NET, netns]), &format!("{version} second del"));
    }
}

/// A pod our runner attached with the bridge chain at 1.0.0, and the ADD's output.
fn attached_on_the_bridge_chain(rig: &Rig) -> (TestNetns, PluginOutput) {
    rig.bridge_chain("1.0.0");
    let pod = rig.node.pod_netns();
    let add = rig.ours(&["add", BRIDGE_NET, path_str(&pod.path)]);
    ok(&add, "add");
    (pod, add)
}

#[test]
fn del_without_a_cached_result_passes_no_prev_result() {
    let rig = Rig::new();
    let (pod, add) = attached_on_the_bridge_chain(&rig);
    let netns = path_str(&pod.path);
    let ip = pod_ip(&add.stdout);
    fs::remove_file(rig.cache_file(BRIDGE_NET, &pod, "eth0")).expect("remove cache");
    ok(&rig.ours(&["del", BRIDGE_NET, netns]), "del");
    // Proof that the rules are normally removed through the cache: without it the firewall keeps them.
    assert_detached(&rig, &pod, &ip, true);
}

#[test]
fn check_uses_the_cached_result() {
    let rig = Rig::new();
    let (pod, _) = attached_on_the_bridge_chain(&rig);
    let netns = path_str(&pod.path);
    ok(&rig.ours(&["check", BRIDGE_NET, netns]), "check");

    // The pod loses its address: the bridge's CHECK compares the pod with the cached result and says so.
    pod.ip(&["addr", "flush", "dev", "eth0"]);
    let check = rig.ours(&["check", BRIDGE_NET, netns]);
    failed(&check, "check after the address was removed");
    assert!(check.stderr.contains("type=\"bridge\""), "{}", check.stderr);

    // Without a cache there is nothing to check against.
    fs::remove_file(rig.cache_file(BRIDGE_NET, &pod, "eth0")).expect("remove cache");
    let check = rig.ours(&["check", BRIDGE_NET, netns]);
    failed(&check, "check without a cache");
    assert!(check.stderr.contains("cached result"), "{}", check.stderr);
}

#[test]
fn version_1_1_0_through_our_loopback_chain_with_status() {
    let rig = Rig::new();
    rig.loopback_chain("1.1.0");
    let pod = rig.node.pod_netns();
    set_lo_down(&pod);
    let netns = path_str(&pod.path);

    let add = rig.ours_with(&["add", LOOPBACK_NET, netns], "lo", |_| {});
    ok(&add, "add");
    assert_eq!(add.stdout["cniVersion"], "1.1.0");
    assert_eq!(add.stdout["interfaces"], json!([{"name": "lo", "mac": "00:00:00:00:00:00", "sandbox": netns}]));
    assert_eq!(
        add.stdout["ips"],
        json!([{"address": "127.0.0.1/8", "interface": 0}, {"address": "::1/128", "interface": 0}])
    );
    assert!(lo_is_up(&pod));
    let cache_file = rig.cache_file(LOOPBACK_NET, &pod, "lo");
    assert!(cache_file.is_file());

    ok(&rig.ours_with(&["check", LOOPBACK_NET, netns], "lo", |_| {}), "check");
    let status = rig.ours(&["status", LOOPBACK_NET]);
    ok(&status, "status");
    assert_eq!(status.stdout_text, "");

    set_lo_down(&pod);
    failed(&rig.ours_with(&["check", LOOPBACK_NET, netns], "lo", |_| {}), "check with lo down");

    ok(&rig.ours_with(&["del", LOOPBACK_NET, netns], "lo", |_| {}), "del");
    assert!(!cache_file.exists());
    assert!(!lo_is_up(&pod));
}

#[test]
fn status_reports_a_plugin_that_cannot_run() {
    let rig = Rig::new();
    rig.bridge_chain("1.0.0");
    // Before 1.1.0 there is no STATUS to ask: ready.
    ok(&rig.ours(&["status", BRIDGE_NET]), "status of a 1.0.0 list");
    rig.write_conf(
        "30-broken.conflist",
        &json!({
            "cniVersion": "1.1.0", "name": "broken", "plugins": [{"type": "loopback"}, {"type": "no-such-plugin"}]
        }),
    );
    let status = rig.ours(&["status", "broken"]);
    failed(&status, "status with a missing plugin");
    assert!(status.stderr.contains("no-such-plugin"), "{}", status.stderr);
    failed(&rig.ours(&["status", "no-such-net"]), "status of an unknown network");
}

#[test]
fn gc_deletes_cached_attachments_not_in_the_valid_list() {
    let rig = Rig::new();
    rig.bridge_chain("1.0.0");
    let pods: Vec<TestNetns> = (0..3).map(|_| rig.node.pod_netns()).collect();
    let ips: Vec<String> = pods
        .iter()
        .map(|pod| {
            let add = rig.ours(&["add", BRIDGE_NET, path_str(&pod.path)]);
            ok(&add, "add");
            pod_ip(&add.stdout)
        })
        .collect();
    let keep = format!("{}:eth0", container_id(&pods[0].path));
    let other_ifname = format!("{}:eth1", container_id(&pods[1].path));
    ok(&rig.ours(&["gc", BRIDGE_NET, "--valid", &keep, "--valid", &other_ifname]), "gc");

    assert_attached(&rig, &pods[0], &ips[0], true);
    assert!(rig.cache_file(BRIDGE_NET, &pods[0], "eth0").is_file());
    for (pod, ip) in pods.iter().zip(&ips).skip(1) {
        assert!(!rig.cache_file(BRIDGE_NET, pod, "eth0").exists());
        // GC's DEL carries the cached result too: the firewall rules go as well.
        assert!(!pod.links().contains(&"eth0".to_string()));
        assert!(!rig.lease(ip).exists());
        assert!(rig.firewall_rules_for(ip).is_empty());
    }

    // Without a valid list, everything goes.
    ok(&rig.ours(&["gc", BRIDGE_NET]), "gc of everything");
    assert_detached(&rig, &pods[0], &ips[0], false);
    failed(&rig.ours(&["gc", BRIDGE_NET, "--valid", "no-colon"]), "gc with a malformed --valid");
}

#[test]
fn gc_in_1_1_0_only_touches_its_own_network() {
    let rig = Rig::new();
    rig.loopback_chain("1.1.0");
    rig.write_conf(
        "25-other.conflist",
        &json!({"cniVersion": "1.1.0", "name": "other", "plugins": [{"type": "loopback"}]}),
    );
    let (kept, stale, other) = (rig.node.pod_netns(), rig.node.pod_netns(), rig.node.pod_netns());
    for (net, pod) in [(LOOPBACK_NET, &kept), (LOOPBACK_NET, &stale), ("other", &other)] {
        ok(&rig.ours_with(&["add", net, path_str(&pod.path)], "lo", |_| {}), "add");
    }
    let valid = format!("{}:lo", container_id(&kept.path));
    ok(&rig.ours(&["gc", LOOPBACK_NET, "--valid", &valid]), "gc");
    assert!(lo_is_up(&kept) && rig.cache_file(LOOPBACK_NET, &kept, "lo").is_file());
    assert!(!lo_is_up(&stale) && !rig.cache_file(LOOPBACK_NET, &stale, "lo").exists());
    assert!(lo_is_up(&other) && rig.cache_file("other", &other, "lo").is_file());
}

#[test]
fn a_relative_netns_path_gives_the_same_container_id() {
    let rig = Rig::new();
    rig.loopback_chain("1.0.0");
    let pod = rig.node.pod_netns();
    let relative = format!("../netns/./{}", pod.name);
    let add = rig.ours_with(&["add", LOOPBACK_NET, &relative], "lo", |c| {
        c.current_dir("/run/netns");
    });
    ok(&add, "add with a relative path");
    assert_eq!(add.stdout["interfaces"][0]["sandbox"], path_str(&pod.path));
    assert!(rig.cache_file(LOOPBACK_NET, &pod, "lo").is_file());
    ok(&rig.ours_with(&["del", LOOPBACK_NET, path_str(&pod.path)], "lo", |_| {}), "del with the absolute path");
    assert!(!rig.cache_file(LOOPBACK_NET, &pod, "lo").exists());
}

#[test]
fn plugin_errors_are_reported_with_their_code() {
    let rig = Rig::new();
    rig.loopback_chain("1.0.0");
    let missing = Path::new("/run/netns").join(netns_tests::unique_name("cnt-gone-"));
    let add = rig.ours(&["add", LOOPBACK_NET, path_str(&missing)]);
    failed(&add, "add to a missing netns");
    assert!(add.stderr.contains("type=\"loopback\"") && add.stderr.contains("(code 3)"), "{}", add.stderr);
    assert_eq!(add.stdout_text, "");
    assert!(
        fs::read_dir(rig.cache.path().join("results")).map_or(true, |mut d| d.next().is_none()),
        "cache written for a failed ADD"
    );

    let bad_ifname = rig.ours_with(&["add", LOOPBACK_NET, "/run/netns/x"], "a/b", |_| {});
    failed(&bad_ifname, "add with a bad CNI_IFNAME");
    failed(&rig.ours(&["add", "no-such-net", "/run/netns/x"]), "add to an unknown network");
}

/// Our cnitool and upstream cnitool (libcni 1.1.2) take over each other's attachments through the cache.
#[test]
fn upstream_cnitool_and_ours_take_over_each_other() {
    let Some(upstream) = upstream_cnitool() else { return };
    let rig = Rig::new();
    rig.bridge_chain("1.0.0");

    // Upstream adds, ours checks and deletes (the firewall rules go: prevResult came from upstream's cache).
    let pod = rig.node.pod_netns();
    let netns = path_str(&pod.path);
    let add = rig.upstream(&upstream, &["add", BRIDGE_NET, netns]);
    ok(&add, "upstream add");
    let ip = pod_ip(&add.stdout);
    assert_attached(&rig, &pod, &ip, true);
    let cache_file = rig.cache_file(BRIDGE_NET, &pod, "eth0");
    assert!(cache_file.is_file(), "upstream wrote no cache where ours reads it");
    ok(&rig.ours(&["check", BRIDGE_NET, netns]), "our check of upstream's attachment");
    ok(&rig.ours(&["del", BRIDGE_NET, netns]), "our del of upstream's attachment");
    assert!(!cache_file.exists());
    assert_detached(&rig, &pod, &ip, false);

    // Ours adds, upstream checks and deletes.
    let pod = rig.node.pod_netns();
    let netns = path_str(&pod.path);
    let add = rig.ours(&["add", BRIDGE_NET, netns]);
    ok(&add, "our add");
    let ip = pod_ip(&add.stdout);
    let cache_file = rig.cache_file(BRIDGE_NET, &pod, "eth0");
    assert!(cache_file.is_file());
    ok(&rig.upstream(&upstream, &["check", BRIDGE_NET, netns]), "upstream check of our attachment");
    ok(&rig.upstream(&upstream, &["del", BRIDGE_NET, netns]), "upstream del of our attachment");
    assert!(!cache_file.exists(), "upstream did not find our cache");
    assert_detached(&rig, &pod, &ip, false);
}

/// The host's mounts on /var/lib or below (other tests add and remove netns mounts meanwhile: not those).
fn var_lib_mounts() -> Vec<String> {
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    // Field 5 is the mount point.
    mountinfo
        .lines()
        .filter(|l| l.split(' ').nth(4).is_some_and(|m| m.starts_with("/var/lib")))
        .map(str::to_string)
        .collect()
}

/// Upstream cnitool's view of /var/lib/cni is the test's directory, and the host's mount table is untouched.
#[test]
fn upstream_cnitool_runs_with_a_private_var_lib_cni() {
    let Some(upstream) = upstream_cnitool() else { return };
    let rig = Rig::new();
    rig.loopback_chain("1.0.0");
    let mounts_before = var_lib_mounts();
    let pod = rig.node.pod_netns();
    ok(&rig.upstream(&upstream, &["add", LOOPBACK_NET, path_str(&pod.path)]), "upstream add");
    // Upstream's default CNI_IFNAME is eth0; our loopback acts on lo whatever the name.
    assert!(rig.cache_file(LOOPBACK_NET, &pod, "eth0").is_file());
    assert!(!Path::new("/var/lib/cni/results")
        .join(format!("{LOOPBACK_NET}-{}-eth0", container_id(&pod.path)))
        .exists());
    assert_eq!(var_lib_mounts(), mounts_before, "a mount leaked into the host's namespace");
    ok(&rig.ours(&["del", LOOPBACK_NET, path_str(&pod.path)]), "our del");
    assert!(!rig.cache_file(LOOPBACK_NET, &pod, "eth0").exists());
}
