//! The tuning plugin against the real kernel: each setting applied, checked and restored; CHECK finding drift;
//! hostile sysctl keys and a failing ADD changing nothing; the sysctl allow-list; takeover both ways with the
//! reference plugin (/usr/lib/cni/tuning, 1.1.1); DEL with things gone; and the chain `podman network create`
//! writes, through our cnitool and upstream cnitool.
//!
//! Topology per test: pod (eth0 10.1.0.2) ⇄ veth ⇄ node (10.1.0.1). The plugin runs in the node namespace;
//! its `dataDir` is in the node's temporary directory.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use cnicore::netlink::Link;
use netns_tests::snapshot::{assert_unchanged, NodeSnapshot};
use netns_tests::upstream::{
    clean_command, output, plugin_dir, reference, upstream_cnitool, with_bind_mount, with_var_lib_cni, VarLibCni,
};
use netns_tests::{bin, bin_dir, json, unique_name, Node, PluginOutput, TestNetns, Value};

const CONTAINER: &str = "tuned1";
const POD_MAC: &str = "02:00:00:00:00:02";

/// Which binary serves `tuning`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Impl {
    Ours,
    Reference,
}

impl Impl {
    fn path(self) -> PathBuf {
        match self {
            Impl::Ours => bin("tuning"),
            Impl::Reference => reference("tuning"),
        }
    }
}

/// A node and one pod whose `eth0` is a veth to the node, as the main plugin of a chain leaves it.
struct Rig {
    node: Node,
    pod: TestNetns,
    data_dir: PathBuf,
}

impl Rig {
    fn new() -> Rig {
        let node = Node::new();
        let pod = node.pod_with_eth0(&unique_name("hv"), "10.1.0.1/24", "10.1.0.2/24");
        let data_dir = node.dir().join("tuning");
        fs::create_dir_all(&data_dir).expect("data dir");
        let rig = Rig { node, pod, data_dir };
        rig.pod.ip(&["link", "set", "eth0", "address", POD_MAC]);
        rig
    }

    /// A tuning config with `settings`, chained after a prevResult that describes the pod's eth0.
    fn conf(&self, settings: Value) -> Value {
        let mut conf = json!({
            "cniVersion": "1.0.0", "name": "tuned", "type": "tuning", "dataDir": self.data_dir,
            "prevResult": {
                "cniVersion": "1.0.0",
                "interfaces": [{"name": "eth0", "mac": POD_MAC, "sandbox": self.pod.path}],
                "ips": [{"address": "10.1.0.2/24", "gateway": "10.1.0.1", "interface": 0}]
            }
        });
        for (key, value) in settings.as_object().expect("settings object") {
            conf[key] = value.clone();
        }
        conf
    }

    fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("CNI_CONTAINERID", CONTAINER.to_string()),
            ("CNI_NETNS", self.pod.path.display().to_string()),
            ("CNI_IFNAME", "eth0".to_string()),
            ("CNI_PATH", bin_dir().display().to_string()),
        ]
    }

    /// Runs `which` tuning with `verb` in the node.
    fn run(&self, which: Impl, verb: &str, conf: &Value) -> PluginOutput {
        let mut command = clean_command(&self.node, which.path());
        command.env("CNI_COMMAND", verb).envs(self.env());
        output(&mut command, conf.to_string().as_bytes())
    }

    fn ours(&self, verb: &str, conf: &Value) -> PluginOutput {
        self.run(Impl::Ours, verb, conf)
    }

    fn eth0(&self) -> Link {
        self.pod.netlink().require_link("eth0").expect("eth0 in the pod")
    }

    fn saved_file(&self) -> PathBuf {
        self.data_dir.join(format!("{CONTAINER}_eth0.json"))
    }

    /// The pod and the tuning state directory now.
    fn snapshot(&self) -> NodeSnapshot {
        NodeSnapshot::settled(&self.pod, &[&self.data_dir], Duration::from_secs(3))
    }
}

fn ok<'a>(out: &'a PluginOutput, what: &str) -> &'a Value {
    assert!(out.success(), "{what} failed ({}): {} {}", out.status, out.stdout_text, out.stderr);
    &out.stdout
}

fn failed<'a>(out: &'a PluginOutput, what: &str) -> &'a Value {
    assert!(!out.success(), "{what} unexpectedly succeeded: {}", out.stdout_text);
    &out.stdout
}

/// The mode of a file.
fn mode(path: &Path) -> u32 {
    fs::metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())).permissions().mode() & 0o777
}

// ---------------------------------------------------------------------------------------------------------
// Each setting: applied, CHECK passes, DEL puts the pod back exactly as it was
// ---------------------------------------------------------------------------------------------------------

/// Applies `settings`, asserts `applied` on the pod, CHECKs, DELs, and asserts the pod is as before.
fn applied_and_restored(settings: Value, applied: impl Fn(&Rig, &Value)) {
    let rig = Rig::new();
    let before = rig.snapshot();
    let conf = rig.conf(settings.clone());
    let result = ok(&rig.ours("ADD", &conf), &format!("ADD {settings}")).clone();
    applied(&rig, &result);
    let mut checked = conf.clone();
    checked["prevResult"] = result;
    ok(&rig.ours("CHECK", &checked), &format!("CHECK {settings}"));
    ok(&rig.ours("DEL", &conf), &format!("DEL {settings}"));
    assert!(!rig.saved_file().exists(), "DEL left {}", rig.saved_file().display());
    assert_unchanged(&before, &rig.snapshot());
}

#[test]
fn mac_applied_reported_and_restored() {
    applied_and_restored(json!({"mac": "C2:11:22:33:44:55"}), |rig, result| {
        assert_eq!(rig.eth0().mac, Some([0xc2, 0x11, 0x22, 0x33, 0x44, 0x55]));
        assert_eq!(result["interfaces"][0]["mac"], "c2:11:22:33:44:55", "{result}");
        // What the reference would have saved, byte for byte, mode 0600.
        let saved = fs::read_to_string(rig.saved_file()).expect("saved settings");
        assert_eq!(saved, format!("{{\n \"mac\": \"{POD_MAC}\"\n}}"));
        assert_eq!(mode(&rig.saved_file()), 0o600);
    });
}

#[test]
fn mtu_applied_and_restored() {
    applied_and_restored(json!({"mtu": 1400}), |rig, _| assert_eq!(rig.eth0().mtu, 1400));
}

#[test]
fn promisc_applied_and_restored() {
    applied_and_restored(json!({"promisc": true}), |rig, _| assert!(rig.eth0().promisc));
}

#[test]
fn allmulti_applied_and_restored() {
    applied_and_restored(json!({"allmulti": true}), |rig, _| assert!(rig.eth0().allmulti));
}

#[test]
fn txqlen_applied_and_restored() {
    applied_and_restored(json!({"txQLen": 77}), |rig, _| assert_eq!(rig.eth0().txqlen, 77));
}

#[test]
fn sysctls_applied_and_restored() {
    let settings = json!({"sysctl": {"net.ipv4.conf.IFNAME.arp_filter": "1", "net/core/somaxconn": "512"}});
    applied_and_restored(settings, |rig, _| {
        assert_eq!(rig.pod.sysctl("net/ipv4/conf/eth0/arp_filter"), "1");
        assert_eq!(rig.pod.sysctl("net/core/somaxconn"), "512");
        // Only the pod's namespace: the node keeps its own value.
        assert_ne!(rig.node.sysctl("net/core/somaxconn"), "512");
    });
}

#[test]
fn everything_from_args_applied_and_restored() {
    let args = json!({"args": {"cni": {"mac": "c2:11:22:33:44:66", "mtu": 1300, "promisc": true, "allmulti": true,
        "txQLen": 5, "sysctl": {"net.ipv4.conf.eth0.arp_filter": "1"}}}});
    applied_and_restored(args, |rig, _| {
        let eth0 = rig.eth0();
        assert_eq!((eth0.mtu, eth0.promisc, eth0.allmulti, eth0.txqlen), (1300, true, true, 5));
        assert_eq!(eth0.mac, Some([0xc2, 0x11, 0x22, 0x33, 0x44, 0x66]));
        assert_eq!(rig.pod.sysctl("net/ipv4/conf/eth0/arp_filter"), "1");
    });
}

#[test]
fn mac_capability_and_cni_args() {
    // runtimeConfig.mac (the `mac` capability) wins over CNI_ARGS MAC, which wins over the config's mac.
    let rig = Rig::new();
    let conf = rig.conf(json!({"mac": "02:00:00:00:00:0a", "runtimeConfig": {"mac": "02:00:00:00:00:0c"}}));
    let mut command = clean_command(&rig.node, bin("tuning"));
    command.env("CNI_COMMAND", "ADD").envs(rig.env()).env("CNI_ARGS", "IgnoreUnknown=1;MAC=02:00:00:00:00:0b");
    ok(&output(&mut command, conf.to_string().as_bytes()), "ADD");
    assert_eq!(rig.eth0().mac, Some([2, 0, 0, 0, 0, 0x0c]));
    ok(&rig.ours("DEL", &conf), "DEL");
    let mut command = clean_command(&rig.node, bin("tuning"));
    let conf = rig.conf(json!({"mac": "02:00:00:00:00:0a"}));
    command.env("CNI_COMMAND", "ADD").envs(rig.env()).env("CNI_ARGS", "IgnoreUnknown=1;MAC=02:00:00:00:00:0b");
    ok(&output(&mut command, conf.to_string().as_bytes()), "ADD");
    assert_eq!(rig.eth0().mac, Some([2, 0, 0, 0, 0, 0x0b]));
    ok(&rig.ours("DEL", &conf), "DEL");
    assert_eq!(rig.eth0().mac, Some([2, 0, 0, 0, 0, 2]));
}

// ---------------------------------------------------------------------------------------------------------
// CHECK finds drift
// ---------------------------------------------------------------------------------------------------------

#[test]
fn check_finds_drift_in_every_setting() {
    let rig = Rig::new();
    let conf = rig.conf(json!({"mac": "c2:11:22:33:44:55", "mtu": 1400, "promisc": true, "allmulti": true,
        "txQLen": 77, "sysctl": {"net.ipv4.conf.IFNAME.arp_filter": "1"}}));
    let result = ok(&rig.ours("ADD", &conf), "ADD").clone();
    let mut checked = conf.clone();
    checked["prevResult"] = result;
    ok(&rig.ours("CHECK", &checked), "CHECK after ADD");
    let drifts: [(&[&str], &[&str], &str); 5] = [
        (
            &["link", "set", "eth0", "address", "02:00:00:00:00:09"],
            &["link", "set", "eth0", "address", "c2:11:22:33:44:55"],
            "Ethernet",
        ),
        (&["link", "set", "eth0", "mtu", "1500"], &["link", "set", "eth0", "mtu", "1400"], "MTU"),
        (&["link", "set", "eth0", "promisc", "off"], &["link", "set", "eth0", "promisc", "on"], "promisc"),
        (
            &["link", "set", "eth0", "allmulticast", "off"],
            &["link", "set", "eth0", "allmulticast", "on"],
            "all-multicast",
        ),
        (
            &["link", "set", "eth0", "txqueuelen", "1000"],
            &["link", "set", "eth0", "txqueuelen", "77"],
            "Transmit Queue",
        ),
    ];
    for (drift, back, named) in drifts {
        rig.pod.ip(drift);
        let error = failed(&rig.ours("CHECK", &checked), &format!("CHECK after ip {drift:?}")).clone();
        assert!(error["msg"].as_str().unwrap_or_default().contains(named), "{error}");
        rig.pod.ip(back);
        ok(&rig.ours("CHECK", &checked), "CHECK after putting it back");
    }
    rig.pod.run(|| cnicore::sysctl::write("net/ipv4/conf/eth0/arp_filter", "0")).expect("sysctl");
    let error = failed(&rig.ours("CHECK", &checked), "CHECK after a sysctl drift").clone();
    assert!(error["msg"].as_str().unwrap_or_default().contains("arp_filter"), "{error}");
    // The sysctl drifted: DEL restores the link settings and leaves the sysctl that someone else changed.
    ok(&rig.ours("DEL", &conf), "DEL");
    assert_eq!(rig.eth0().mtu, 1500);
}

// ---------------------------------------------------------------------------------------------------------
// Nothing changes when a key is hostile or a later step fails
// ---------------------------------------------------------------------------------------------------------

#[test]
fn a_failed_add_puts_back_what_it_changed() {
    let rig = Rig::new();
    let before = rig.snapshot();
    // Sysctls and the MAC are changed before the MTU, which a veth refuses above 65535.
    let conf = rig.conf(json!({"mac": "c2:11:22:33:44:55", "mtu": 70000, "sysctl": {"net.core.somaxconn": "999"}}));
    let error = failed(&rig.ours("ADD", &conf), "ADD with an impossible MTU").clone();
    assert!(error["msg"].as_str().unwrap_or_default().contains("MTU"), "{error}");
    assert!(!rig.saved_file().exists());
    assert_unchanged(&before, &rig.snapshot());
    // A sysctl that does not exist fails before anything is changed.
    let conf = rig.conf(json!({"mtu": 1300, "sysctl": {"net.ipv4.conf.IFNAME.no_such_thing": "1"}}));
    failed(&rig.ours("ADD", &conf), "ADD with a missing sysctl");
    assert_unchanged(&before, &rig.snapshot());
}

#[test]
fn the_allow_list_is_honoured() {
    // The reference reads the fixed path /etc/cni/tuning/allowlist.conf. The test's own directory is mounted
    // over /etc/cni in a private mount namespace of the plugin's process: the host's /etc is never written.
    let rig = Rig::new();
    let etc_cni = rig.node.dir().join("etc-cni");
    fs::create_dir_all(etc_cni.join("tuning")).expect("allow-list dir");
    fs::write(
        etc_cni.join("tuning/allowlist.conf"),
        "^net\\.core\\.somaxconn$\n^net\\.ipv4\\.conf\\.IFNAME\\.[a-z_]*$\n",
    )
    .expect("allow-list");
    let run = |conf: &Value, verb: &str| {
        let mut command = clean_command(&rig.node, bin("tuning"));
        command.env("CNI_COMMAND", verb).envs(rig.env());
        with_bind_mount(&mut command, &etc_cni, Path::new("/etc/cni"));
        output(&mut command, conf.to_string().as_bytes())
    };
    let before = rig.snapshot();
    let refused = rig.conf(json!({"sysctl": {"net.core.somaxconn": "600", "net.ipv4.ip_forward": "1"}}));
    let error = failed(&run(&refused, "ADD"), "ADD of a sysctl not on the allow-list").clone();
    assert!(error["msg"].as_str().unwrap_or_default().contains("not allowed"), "{error}");
    assert_unchanged(&before, &rig.snapshot());
    let allowed = rig.conf(json!({"sysctl": {"net.core.somaxconn": "600", "net.ipv4.conf.IFNAME.arp_filter": "1"}}));
    ok(&run(&allowed, "ADD"), "ADD of allowed sysctls");
    assert_eq!(rig.pod.sysctl("net/core/somaxconn"), "600");
    ok(&run(&allowed, "DEL"), "DEL");
    assert_unchanged(&before, &rig.snapshot());
    // Without the file (the host has none), every net. key is allowed.
    assert!(!Path::new("/etc/cni/tuning/allowlist.conf").exists());
    ok(&rig.ours("ADD", &refused), "ADD without an allow-list");
    ok(&rig.ours("DEL", &refused), "DEL");
}

// ---------------------------------------------------------------------------------------------------------
// DEL with things gone; takeover with the reference
// ---------------------------------------------------------------------------------------------------------

#[test]
fn del_tolerates_what_is_gone() {
    let rig = Rig::new();
    let conf = rig.conf(json!({"mtu": 1400}));
    ok(&rig.ours("DEL", &conf), "DEL before any ADD");
    ok(&rig.ours("ADD", &conf), "ADD");
    ok(&rig.ours("DEL", &conf), "DEL");
    ok(&rig.ours("DEL", &conf), "second DEL");

    // The interface is gone (the main plugin's DEL ran first): the file goes too.
    ok(&rig.ours("ADD", &conf), "ADD");
    rig.pod.ip(&["link", "del", "eth0"]);
    ok(&rig.ours("DEL", &conf), "DEL without eth0");
    assert!(!rig.saved_file().exists());

    // The netns is gone, and DEL has only the config it needs (no prevResult, a broken runtimeConfig).
    let rig = Rig::new();
    let conf = rig.conf(json!({"mtu": 1400}));
    ok(&rig.ours("ADD", &conf), "ADD");
    let mut command = clean_command(&rig.node, bin("tuning"));
    command.env("CNI_COMMAND", "DEL").envs(rig.env()).env("CNI_NETNS", "/run/netns/no-such-pod");
    let bare = json!({"cniVersion": "1.0.0", "name": "tuned", "type": "tuning", "dataDir": rig.data_dir,
        "runtimeConfig": {"mac": 5}});
    ok(&output(&mut command, bare.to_string().as_bytes()), "DEL without the netns");
    assert!(!rig.saved_file().exists());

    // An unreadable saved file is discarded, not an error.
    fs::create_dir_all(&rig.data_dir).expect("data dir");
    fs::write(rig.saved_file(), "{not json").expect("garbage");
    ok(&rig.ours("DEL", &conf), "DEL with a corrupt file");
    assert!(!rig.saved_file().exists());
}

/// ADD by `adder`, DEL by `deleter`: the pod ends as it began. `txQLen` is left out: the reference 1.1.1 does
/// not know it (it came in a later version).
fn takeover(adder: Impl, deleter: Impl) {
    let rig = Rig::new();
    let before = rig.snapshot();
    let conf = rig.conf(json!({"mac": "c2:11:22:33:44:55", "mtu": 1400, "promisc": true, "allmulti": true}));
    ok(&rig.run(adder, "ADD", &conf), &format!("ADD by {adder:?}"));
    let eth0 = rig.eth0();
    assert_eq!((eth0.mtu, eth0.promisc, eth0.allmulti), (1400, true, true));
    assert_eq!(eth0.mac, Some([0xc2, 0x11, 0x22, 0x33, 0x44, 0x55]));
    ok(&rig.run(deleter, "DEL", &conf), &format!("DEL by {deleter:?}"));
    assert!(!rig.saved_file().exists(), "{deleter:?} left the file of {adder:?}");
    assert_unchanged(&before, &rig.snapshot());
}

#[test]
fn reference_del_restores_what_ours_saved() {
    takeover(Impl::Ours, Impl::Reference);
}

#[test]
fn our_del_restores_what_the_reference_saved() {
    takeover(Impl::Reference, Impl::Ours);
}

// ---------------------------------------------------------------------------------------------------------
// The chain `podman network create` writes
// ---------------------------------------------------------------------------------------------------------

/// The plugins of a podman network (4.3, CNI backend) after bridge + host-local, one line each. The tuning
/// entry sets something, so that the chain shows it ran; podman itself writes `{"type": "tuning"}`.
/// The firewall entry keeps its records in the test's directory (podman writes no `dataDir`).
fn podman_chain_plugins(dir: &Path) -> Vec<Value> {
    vec![
        json!({"type": "portmap", "capabilities": {"portMappings": true}}),
        json!({"type": "firewall", "backend": "", "dataDir": dir.join("firewall")}),
        json!({"type": "tuning", "capabilities": {"mac": true}, "mtu": 1400, "txQLen": 500,
            "sysctl": {"net.ipv4.conf.IFNAME.arp_notify": "1"}}),
    ]
}

fn podman_chain(tool: Option<&Path>) {
    let node = Node::new();
    let dir = node.dir().to_path_buf();
    let conf_dir = dir.join("net.d");
    fs::create_dir_all(&conf_dir).expect("conf dir");
    let mut plugins = vec![json!({
        "type": "bridge", "bridge": "cni-podman1", "isGateway": true, "ipMasq": true, "hairpinMode": true,
        "ipam": {"type": "host-local", "dataDir": dir.join("ipam"), "routes": [{"dst": "0.0.0.0/0"}],
            "ranges": [[{"subnet": "10.89.0.0/24", "gateway": "10.89.0.1"}]]}
    })];
    plugins.extend(podman_chain_plugins(&dir));
    let types: Vec<String> = plugins.iter().map(|p| p["type"].as_str().expect("type").to_string()).collect();
    let conflist = json!({"cniVersion": "0.4.0", "name": "podnet", "plugins": plugins});
    fs::write(conf_dir.join("podnet.conflist"), conflist.to_string()).expect("conflist");
    let mut binaries: Vec<(String, PathBuf)> = types.iter().map(|t| (t.clone(), bin(t))).collect();
    binaries.push(("host-local".into(), bin("host-local")));
    let links: Vec<(&str, &Path)> = binaries.iter().map(|(n, p)| (n.as_str(), p.as_path())).collect();
    let cni_path = plugin_dir(&dir.join("bin"), &links);
    let cache = VarLibCni::new(&dir);
    let pod = node.pod_netns();
    let baseline = NodeSnapshot::settled(&node, &[], Duration::from_secs(3));
    let cnitool = |verb: &str| {
        let mut command = match tool {
            Some(upstream) => {
                let mut command = clean_command(&node, upstream);
                with_var_lib_cni(&mut command, &cache);
                command
            }
            None => {
                let mut command = clean_command(&node, bin("cnitool"));
                command.env("CNI_CACHE_DIR", cache.path());
                command
            }
        };
        command
            .args([verb, "podnet", pod.path.to_str().expect("utf-8")])
            .env("NETCONFPATH", &conf_dir)
            .env("CNI_PATH", &cni_path)
            // firewall's "backend": "" asks the system bus whether firewalld runs: never the machine's.
            .env("DBUS_SYSTEM_BUS_ADDRESS", format!("unix:path={}", dir.join("no-bus").display()))
            .env(
                "CAP_ARGS",
                json!({"mac": "c2:11:22:33:44:55",
                "portMappings": [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}]})
                .to_string(),
            );
        output(&mut command, b"")
    };
    let result = ok(&cnitool("add"), "cnitool add").clone();
    let eth0 = pod.netlink().require_link("eth0").expect("eth0");
    assert_eq!(eth0.mac, Some([0xc2, 0x11, 0x22, 0x33, 0x44, 0x55]));
    assert_eq!((eth0.mtu, eth0.txqlen), (1400, 500));
    assert_eq!(pod.sysctl("net/ipv4/conf/eth0/arp_notify"), "1");
    let reported = result["interfaces"].as_array().expect("interfaces").iter().find(|i| i["name"] == "eth0").cloned();
    assert_eq!(reported.expect("eth0 in the result")["mac"], "c2:11:22:33:44:55", "{result}");
    assert!(pod.ping("10.89.0.1".parse().unwrap()), "the pod cannot reach its gateway");
    ok(&cnitool("check"), "cnitool check");
    ok(&cnitool("del"), "cnitool del");
    // The pod's namespace is the runtime's to delete; on the node, only the bridge (which DEL keeps, as the
    // reference does) and the firewall structure the reference leaves may remain.
    let after = NodeSnapshot::settled(&node, &[], Duration::from_secs(3));
    for section in ["iptables", "nftables"] {
        for line in after.section(section).iter().filter(|l| !baseline.section(section).contains(l)) {
            assert!(!line.contains("10.89.0.") || line.contains("10.89.0.0/24"), "{section} keeps {line}");
        }
    }
    let leases = fs::read_dir(dir.join("ipam/podnet"))
        .map(|d| d.flatten().filter(|e| e.file_name().to_string_lossy().starts_with("10.")).count());
    assert_eq!(leases.unwrap_or(0), 0, "a lease is left");
    assert!(fs::read_dir(cache.path().join("results")).map(|d| d.count()).unwrap_or(0) == 0, "a cached result is left");
    assert_eq!(pod.netlink().link_by_name("eth0").expect("links"), None, "eth0 is left in the pod");
}

#[test]
fn podman_chain_through_our_cnitool() {
    podman_chain(None);
}

#[test]
fn podman_chain_through_upstream_cnitool() {
    let Some(upstream) = upstream_cnitool() else { return };
    podman_chain(Some(&upstream));
}
