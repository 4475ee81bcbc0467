//! host-local: real processes on a per-test data dir. IPAM needs no network namespace, so these tests run
//! the binary directly (CNI_NETNS is only checked for presence).
//!
//! Interop tests use Debian's reference binary at /usr/lib/cni/host-local (containernetworking-plugins).

use netns_tests::upstream;
use netns_tests::{bin, json, result_addresses, unique_name, Value};
use std::collections::HashSet;
use std::fs;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, SystemTime};

const ALL_VERSIONS: &[&str] = &["0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];

/// A data dir for one test, removed on drop.
struct DataDir(PathBuf);

impl DataDir {
    fn new() -> DataDir {
        let dir = std::env::temp_dir().join(format!("cni-hl-{}", unique_name("t")));
        DataDir(dir)
    }
    fn path(&self) -> &str {
        self.0.to_str().expect("utf-8 temp dir")
    }
    fn net(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
    /// The lease files of network `name`: address → content.
    fn leases(&self, name: &str) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = match fs::read_dir(self.net(name)) {
            Err(_) => return Vec::new(),
            Ok(entries) => entries
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .filter(|n| n.parse::<std::net::IpAddr>().is_ok())
                .map(|n| {
                    let content = fs::read_to_string(self.net(name).join(&n)).unwrap();
                    (n, content)
                })
                .collect(),
        };
        out.sort();
        out
    }
}

impl Drop for DataDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// One plugin invocation.
struct Call<'a> {
    binary: PathBuf,
    command: &'a str,
    id: &'a str,
    ifname: &'a str,
    cni_args: &'a str,
}

fn call<'a>(command: &'a str, id: &'a str) -> Call<'a> {
    Call { binary: bin("host-local"), command, id, ifname: "eth0", cni_args: "" }
}

impl<'a> Call<'a> {
    fn reference(mut self) -> Self {
        self.binary = reference();
        self
    }
    fn ifname(mut self, ifname: &'a str) -> Self {
        self.ifname = ifname;
        self
    }
    fn args(mut self, cni_args: &'a str) -> Self {
        self.cni_args = cni_args;
        self
    }
    fn spawn(&self, stdin: &Value) -> Child {
        let mut cmd = Command::new(&self.binary);
        cmd.env_clear()
            .env("CNI_COMMAND", self.command)
            .env("CNI_CONTAINERID", self.id)
            .env("CNI_NETNS", "/var/run/netns/hl-test")
            .env("CNI_IFNAME", self.ifname)
            .env("CNI_PATH", "/nonexistent")
            .env("CNI_ARGS", self.cni_args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().unwrap_or_else(|e| panic!("run {}: {e}", self.binary.display()));
        let _ = child.stdin.take().unwrap().write_all(stdin.to_string().as_bytes());
        child
    }
    fn run(&self, stdin: &Value) -> Out {
        Out::from(self.spawn(stdin).wait_with_output().unwrap())
    }
    fn ok(&self, stdin: &Value) -> Value {
        self.run(stdin).ok()
    }
    /// Runs, expects a CNI error, returns (code, msg).
    fn err(&self, stdin: &Value) -> (u64, String) {
        self.run(stdin).err()
    }
}

struct Out {
    success: bool,
    stdout: String,
    stderr: String,
}

impl From<Output> for Out {
    fn from(o: Output) -> Out {
        Out {
            success: o.status.success(),
            stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        }
    }
}

impl Out {
    fn ok(&self) -> Value {
        assert!(self.success, "plugin failed: {} {}", self.stdout, self.stderr);
        if self.stdout.trim().is_empty() {
            return Value::Null;
        }
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| panic!("bad JSON {:?}: {e}", self.stdout))
    }
    fn err(&self) -> (u64, String) {
        assert!(!self.success, "plugin unexpectedly succeeded: {}", self.stdout);
        let v: Value =
            serde_json::from_str(&self.stdout).unwrap_or_else(|e| panic!("bad error JSON {:?}: {e}", self.stdout));
        (v["code"].as_u64().expect("error code"), v["msg"].as_str().expect("error msg").to_string())
    }
}

fn reference() -> PathBuf {
    upstream::reference("host-local")
}

/// A network config around `ipam` (dataDir added), named `name`.
fn conf(version: &str, name: &str, dd: &DataDir, mut ipam: Value) -> Value {
    ipam["type"] = "host-local".into();
    ipam["dataDir"] = dd.path().into();
    json!({"cniVersion": version, "name": name, "type": "bridge", "ipam": ipam})
}

fn v4_conf(dd: &DataDir, subnet: &str) -> Value {
    conf("1.0.0", "net", dd, json!({"ranges": [[{"subnet": subnet}]]}))
}

fn addresses(result: &Value) -> Vec<String> {
    result_addresses(result).iter().map(ToString::to_string).collect()
}

fn first_address(result: &Value) -> String {
    addresses(result).into_iter().next().expect("an address")
}

#[test]
fn add_check_del_v4_with_routes_and_dns() {
    let dd = DataDir::new();
    fs::create_dir_all(&dd.0).unwrap();
    let resolv = dd.0.join("resolv.conf");
    fs::write(
        &resolv,
        "# x\nnameserver 10.96.0.10\nnameserver 1.1.1.1\ndomain cluster.local\nsearch a.svc b.svc\noptions ndots:5\n",
    )
    .unwrap();
    let c = conf(
        "1.0.0",
        "net",
        &dd,
        json!({"ranges": [[{"subnet": "10.10.0.0/24"}]], "routes": [{"dst": "0.0.0.0/0"}, {"dst": "192.168.0.0/16", "gw": "10.10.0.254"}],
               "resolvConf": resolv.to_str().unwrap()}),
    );
    let r = call("ADD", "c1").ok(&c);
    assert_eq!(r["cniVersion"], "1.0.0");
    assert_eq!(r["ips"], json!([{"address": "10.10.0.2/24", "gateway": "10.10.0.1"}]));
    assert_eq!(r["routes"], json!([{"dst": "0.0.0.0/0"}, {"dst": "192.168.0.0/16", "gw": "10.10.0.254"}]));
    assert_eq!(
        r["dns"],
        json!({"nameservers": ["10.96.0.10", "1.1.1.1"], "domain": "cluster.local", "search": ["a.svc", "b.svc"], "options": ["ndots:5"]})
    );
    // The on-disk contract.
    let net = dd.net("net");
    assert_eq!(fs::read(net.join("10.10.0.2")).unwrap(), b"c1\r\neth0");
    assert_eq!(fs::metadata(net.join("10.10.0.2")).unwrap().permissions().mode() & 0o777, 0o600);
    assert_eq!(fs::read(net.join("last_reserved_ip.0")).unwrap(), b"10.10.0.2");
    assert!(net.join("lock").is_file());
    call("CHECK", "c1").ok(&c);
    let (_, msg) = call("CHECK", "c1").ifname("eth1").err(&c);
    assert!(msg.contains("failed to find"), "{msg}");
    call("DEL", "c1").ok(&c);
    assert!(dd.leases("net").is_empty());
    call("DEL", "c1").ok(&c); // Nothing left: still fine.
    call("CHECK", "c1").err(&c);
    // No temporary files left behind.
    let stray: Vec<String> = fs::read_dir(&net)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".tmp"))
        .collect();
    assert!(stray.is_empty(), "{stray:?}");
}

#[test]
fn ipv6_dual_stack_and_legacy_subnet() {
    let dd = DataDir::new();
    let c = conf(
        "1.0.0",
        "ds",
        &dd,
        json!({"subnet": "10.20.0.0/16", "rangeStart": "10.20.5.10", "gateway": "10.20.0.254",
               "ranges": [[{"subnet": "fd00:20::/64"}]]}),
    );
    let r = call("ADD", "c1").ok(&c);
    assert_eq!(
        r["ips"],
        json!([{"address": "10.20.5.10/16", "gateway": "10.20.0.254"}, {"address": "fd00:20::2/64", "gateway": "fd00:20::1"}])
    );
    assert_eq!(fs::read(dd.net("ds").join("fd00:20::2")).unwrap(), b"c1\r\neth0");
    assert_eq!(fs::read(dd.net("ds").join("last_reserved_ip.1")).unwrap(), b"fd00:20::2");
    // Same container, another interface: its own leases.
    let r = call("ADD", "c1").ifname("net1").ok(&c);
    assert_eq!(addresses(&r), ["10.20.5.11/16", "fd00:20::3/64"]);
    call("DEL", "c1").ok(&c);
    assert_eq!(dd.leases("ds").len(), 2);
    call("DEL", "c1").ifname("net1").ok(&c);
    assert!(dd.leases("ds").is_empty());

    // IPv6 alone, several ranges in one set, and a custom gateway inside the range.
    let c = conf(
        "1.0.0",
        "v6",
        &dd,
        json!({"ranges": [[{"subnet": "fd00:30::/126"}, {"subnet": "fd00:31::/64", "rangeStart": "fd00:31::10", "rangeEnd": "fd00:31::11", "gateway": "fd00:31::10"}]]}),
    );
    let got: Vec<String> = (0..3).map(|i| first_address(&call("ADD", &format!("v{i}")).ok(&c))).collect();
    assert_eq!(got, ["fd00:30::2/126", "fd00:30::3/126", "fd00:31::11/64"]);
    let (_, msg) = call("ADD", "v9").err(&c);
    assert!(msg.contains("no IP addresses available"), "{msg}");
}

#[test]
fn every_spec_version() {
    let dd = DataDir::new();
    for (i, v) in ALL_VERSIONS.iter().enumerate() {
        let c = conf(
            v,
            "ver",
            &dd,
            json!({"ranges": [[{"subnet": "10.30.0.0/24"}], [{"subnet": "fd00:30::/64"}]], "routes": [{"dst": "0.0.0.0/0"}]}),
        );
        let id = format!("c{i}");
        let r = call("ADD", &id).ok(&c);
        assert_eq!(r["cniVersion"], *v);
        if *v == "0.1.0" || *v == "0.2.0" {
            assert_eq!(r["ip4"]["ip"], format!("10.30.0.{}/24", i + 2));
            assert_eq!(r["ip4"]["gateway"], "10.30.0.1");
            assert_eq!(r["ip4"]["routes"][0]["dst"], "0.0.0.0/0");
            assert_eq!(r["ip6"]["ip"], format!("fd00:30::{}/64", i + 2));
        } else {
            assert_eq!(addresses(&r), [format!("10.30.0.{}/24", i + 2), format!("fd00:30::{}/64", i + 2)]);
            assert_eq!(r["ips"][0].get("version").is_some(), *v < "1.0.0", "{v}");
        }
        if *v >= "0.4.0" {
            call("CHECK", &id).ok(&c);
        }
        call("DEL", &id).ok(&c);
    }
    assert!(dd.leases("ver").is_empty());
    // 0.2.0 results carry one address per family.
    let c = conf("0.2.0", "ver", &dd, json!({"ranges": [[{"subnet": "10.31.0.0/24"}], [{"subnet": "10.32.0.0/24"}]]}));
    let (code, msg) = call("ADD", "x").err(&c);
    assert!(msg.contains("more than 1 address per family"), "{code} {msg}");
    // GC and STATUS need 1.1.0.
    let c = v4_conf(&dd, "10.33.0.0/24");
    assert_eq!(call("STATUS", "x").err(&c).0, 1);
}

#[test]
fn defaults_round_robin_and_exhaustion() {
    let dd = DataDir::new();
    // The end of a /24: .254 is the last one handed out, never .255 (broadcast) nor .0.
    let c = conf("1.0.0", "rr", &dd, json!({"ranges": [[{"subnet": "10.40.0.0/24", "rangeStart": "10.40.0.252"}]]}));
    let a = first_address(&call("ADD", "a").ok(&c));
    let b = first_address(&call("ADD", "b").ok(&c));
    let c3 = first_address(&call("ADD", "c").ok(&c));
    assert_eq!([a.as_str(), b.as_str(), c3.as_str()], ["10.40.0.252/24", "10.40.0.253/24", "10.40.0.254/24"]);
    let (code, msg) = call("ADD", "d").err(&c);
    assert_eq!(code, 999);
    assert_eq!(msg, "failed to allocate for range 0: no IP addresses available in range set: 10.40.0.252-10.40.0.254");
    // Freed addresses are reused, in round-robin order (after the last reserved one).
    call("DEL", "b").ok(&c);
    assert_eq!(first_address(&call("ADD", "d").ok(&c)), "10.40.0.253/24");
    call("DEL", "a").ok(&c);
    call("DEL", "c").ok(&c);
    assert_eq!(first_address(&call("ADD", "e").ok(&c)), "10.40.0.254/24");
    assert_eq!(first_address(&call("ADD", "f").ok(&c)), "10.40.0.252/24");

    // The smallest range, a /30: one address besides the gateway.
    let c = conf("1.0.0", "small", &dd, json!({"ranges": [[{"subnet": "10.41.0.0/30"}]]}));
    assert_eq!(first_address(&call("ADD", "a").ok(&c)), "10.41.0.2/30");
    call("ADD", "b").err(&c);
    call("DEL", "a").ok(&c);
    assert_eq!(first_address(&call("ADD", "b").ok(&c)), "10.41.0.2/30");
}

#[test]
fn duplicate_add_is_refused() {
    let dd = DataDir::new();
    let c = v4_conf(&dd, "10.42.0.0/24");
    call("ADD", "a").ok(&c);
    let (_, msg) = call("ADD", "a").err(&c);
    assert!(msg.contains("duplicate allocation is not allowed"), "{msg}");
    assert_eq!(dd.leases("net").len(), 1);
}

#[test]
fn requested_addresses_and_their_priority() {
    let dd = DataDir::new();
    let base = json!({"ranges": [[{"subnet": "10.50.0.0/24"}], [{"subnet": "fd00:50::/64"}]]});
    let c = conf("1.0.0", "req", &dd, base.clone());
    // CNI_ARGS IP=, several, comma-separated.
    let r = call("ADD", "a").args("IgnoreUnknown=1;K8S_POD_NAME=x;IP=10.50.0.7,fd00:50::7").ok(&c);
    assert_eq!(addresses(&r), ["10.50.0.7/24", "fd00:50::7/64"]);
    assert_eq!(fs::read(dd.net("req").join("last_reserved_ip.0")).unwrap(), b"10.50.0.7");
    // Taken.
    let (_, msg) = call("ADD", "b").args("IP=10.50.0.7").err(&c);
    assert!(msg.contains("10.50.0.7") && msg.contains("not available"), "{msg}");
    // Every source counts, as in the reference (v1.1.1 to v1.9): CNI_ARGS, args.cni.ips and runtimeConfig.ips
    // combined; two of them in one range set is an error.
    let mut with_args = c.clone();
    with_args["args"] = json!({"cni": {"ips": ["10.50.0.8"]}});
    assert_eq!(addresses(&call("ADD", "b").args("IP=fd00:50::9").ok(&with_args)), ["10.50.0.8/24", "fd00:50::9/64"]);
    let mut with_runtime = c.clone();
    with_runtime["runtimeConfig"] = json!({"ips": ["10.50.0.10/24"]});
    assert_eq!(first_address(&call("ADD", "c").ok(&with_runtime)), "10.50.0.10/24");
    with_runtime["args"] = json!({"cni": {"ips": ["10.50.0.12"]}});
    let (_, msg) = call("ADD", "e").err(&with_runtime);
    assert!(msg.contains("one address per range set"), "{msg}");
    // Dynamic allocation continues after the last reserved address.
    assert_eq!(first_address(&call("ADD", "d").ok(&c)), "10.50.0.11/24");

    let before = dd.leases("req");
    for (args, runtime_ips, want) in [
        ("IP=10.99.0.1", json!(null), "not in any range"),
        ("IP=10.50.0.1", json!(null), "gateway"),
        ("IP=10.50.0.255", json!(null), "not in any range"),
        ("IP=10.50.0.20,10.50.0.21", json!(null), "one address per range set"),
        ("IP=nonsense", json!(null), "not an IP address"),
        ("", json!(["10.50.0.x"]), "not an IP address"),
        ("UnknownKey=1", json!(null), "unknown"),
    ] {
        let mut c2 = c.clone();
        if !runtime_ips.is_null() {
            c2["runtimeConfig"] = json!({"ips": runtime_ips});
        }
        let (code, msg) = call("ADD", "z").args(args).err(&c2);
        assert!(msg.contains(want), "{args} {runtime_ips}: {code} {msg}");
        assert!([4, 7].contains(&code), "{args}: code {code}");
    }
    assert_eq!(dd.leases("req"), before, "failed requests leave no lease");
    // A failure in the second range set gives back the first set's address.
    let (_, msg) = call("ADD", "y").args("IP=fd00:50::7").err(&c);
    assert!(msg.contains("fd00:50::7"), "{msg}");
    assert_eq!(dd.leases("req"), before);
}

#[test]
fn runtime_ip_ranges_come_before_the_configured_ranges() {
    // As the reference (v1.1.1 to v1.9): runtimeConfig.ipRanges are put before the configured ranges.
    let dd = DataDir::new();
    let mut c = v4_conf(&dd, "10.60.0.0/24");
    c["runtimeConfig"] = json!({"ipRanges": [[{"subnet": "fd61::/64", "rangeStart": "fd61::100"}]]});
    assert_eq!(addresses(&call("ADD", "a").ok(&c)), ["fd61::100/64", "10.60.0.2/24"]);
    // The same range as the config's overlaps it: an error, as in the reference.
    c["runtimeConfig"] = json!({"ipRanges": [[{"subnet": "10.60.0.0/24"}]]});
    let (_, msg) = call("ADD", "b").err(&c);
    assert!(msg.contains("overlaps"), "{msg}");
}

#[test]
fn concurrent_adds_and_dels() {
    let dd = DataDir::new();
    let c = v4_conf(&dd, "10.70.0.0/16");
    let ids: Vec<String> = (0..200).map(|i| format!("ctr{i:03}")).collect();
    let children: Vec<Child> = ids.iter().map(|id| call("ADD", id).spawn(&c)).collect();
    let mut seen = HashSet::new();
    for child in children {
        let r = Out::from(child.wait_with_output().unwrap()).ok();
        assert!(seen.insert(first_address(&r)), "address given twice: {r}");
    }
    assert_eq!(seen.len(), 200);
    let leases = dd.leases("net");
    assert_eq!(leases.len(), 200);
    let owners: HashSet<&str> = leases.iter().map(|(_, c)| c.as_str()).collect();
    assert_eq!(owners.len(), 200);
    let children: Vec<Child> = ids.iter().map(|id| call("DEL", id).spawn(&c)).collect();
    for child in children {
        Out::from(child.wait_with_output().unwrap()).ok();
    }
    assert!(dd.leases("net").is_empty(), "{:?}", dd.leases("net"));
}

/// Leases made by the reference are honoured by ours (never given twice, released by our DEL), and ours by
/// the reference, with both interleaved on one network.
#[test]
fn interop_with_the_reference_both_ways() {
    let dd = DataDir::new();
    let c = conf("1.0.0", "mix", &dd, json!({"ranges": [[{"subnet": "10.80.0.0/28"}], [{"subnet": "fd00:80::/124"}]]}));
    let mut all = HashSet::new();
    for i in 0..6 {
        let id = format!("c{i}");
        let r = if i % 2 == 0 { call("ADD", &id).reference().ok(&c) } else { call("ADD", &id).ok(&c) };
        for a in addresses(&r) {
            assert!(all.insert(a.clone()), "{a} given twice");
        }
    }
    assert_eq!(dd.leases("mix").len(), 12);
    // Duplicate detection across implementations.
    assert!(call("ADD", "c0").err(&c).1.contains("duplicate"));
    assert!(call("ADD", "c1").reference().err(&c).1.contains("duplicate"));
    // Requested address held by the other implementation.
    let held = dd.leases("mix")[0].0.clone();
    call("ADD", "z").args(&format!("IP={held}")).err(&c);
    // CHECK across.
    call("CHECK", "c0").ok(&c);
    call("CHECK", "c1").reference().ok(&c);
    // DEL across: ours releases the reference's leases and the reverse.
    call("DEL", "c0").ok(&c);
    call("DEL", "c1").reference().ok(&c);
    call("DEL", "c2").ok(&c);
    call("DEL", "c3").reference().ok(&c);
    let left: HashSet<String> = dd.leases("mix").into_iter().map(|(_, c)| c).collect();
    assert_eq!(left, HashSet::from(["c4\r\neth0".to_string(), "c5\r\neth0".to_string()]));
    // Fill the rest with both: an address held by one is never given by the other.
    let mut held: HashSet<String> = dd.leases("mix").into_iter().map(|(ip, _)| ip).collect();
    let mut i = 10;
    loop {
        let id = format!("f{i}");
        let out = if i % 2 == 0 { call("ADD", &id).reference().run(&c) } else { call("ADD", &id).run(&c) };
        if !out.success {
            break;
        }
        for a in addresses(&out.ok()) {
            let ip = a.split('/').next().unwrap().to_string();
            assert!(held.insert(ip), "{a} given twice");
        }
        i += 1;
    }
    let v4: Vec<String> = dd.leases("mix").into_iter().map(|(ip, _)| ip).filter(|ip| ip.starts_with("10.")).collect();
    assert_eq!(v4.len(), 13, "a /28 has 13 addresses besides network, gateway and broadcast: {v4:?}");
    assert!(call("ADD", "zz").reference().err(&c).1.contains("no IP addresses available"));
    assert!(call("ADD", "zz").err(&c).1.contains("no IP addresses available"));
    // Release everything with alternating implementations.
    for (k, id) in ["c4", "c5"].iter().map(|s| s.to_string()).chain((10..i).map(|n| format!("f{n}"))).enumerate() {
        if k % 2 == 0 {
            call("DEL", &id).reference().ok(&c)
        } else {
            call("DEL", &id).ok(&c)
        };
    }
    assert!(dd.leases("mix").is_empty(), "{:?}", dd.leases("mix"));
}

/// Round robin continues across implementations through `last_reserved_ip.<n>`.
#[test]
fn interop_round_robin_position() {
    let dd = DataDir::new();
    let c = v4_conf(&dd, "10.81.0.0/24");
    assert_eq!(first_address(&call("ADD", "a").reference().ok(&c)), "10.81.0.2/24");
    call("DEL", "a").reference().ok(&c);
    assert_eq!(first_address(&call("ADD", "b").ok(&c)), "10.81.0.3/24");
    call("DEL", "b").ok(&c);
    assert_eq!(first_address(&call("ADD", "c").reference().ok(&c)), "10.81.0.4/24");
}

#[test]
fn legacy_leases_with_container_id_only() {
    let dd = DataDir::new();
    let c = v4_conf(&dd, "10.82.0.0/24");
    call("ADD", "first").ok(&c);
    fs::write(dd.net("net").join("10.82.0.3"), "old").unwrap();
    // Never handed out again, and the old container's ADD is a duplicate.
    assert_eq!(first_address(&call("ADD", "x").ok(&c)), "10.82.0.4/24");
    assert!(call("ADD", "old").err(&c).1.contains("duplicate"));
    call("CHECK", "old").ok(&c);
    call("DEL", "old").ok(&c);
    assert!(!dd.net("net").join("10.82.0.3").exists());
}

fn set_old(path: &Path) {
    let old = SystemTime::now() - Duration::from_secs(3600);
    fs::File::options().write(true).open(path).unwrap().set_times(fs::FileTimes::new().set_modified(old)).unwrap();
}

#[test]
fn empty_lease_files_are_garbage() {
    let dd = DataDir::new();
    let c = conf("1.1.0", "net", &dd, json!({"ranges": [[{"subnet": "10.83.0.0/29"}]]}));
    call("ADD", "a").ok(&c);
    // A crash of the reference between creating and writing leaves an empty file.
    let empty = dd.net("net").join("10.83.0.3");
    fs::write(&empty, "").unwrap();
    // A fresh one may belong to a writer that does not lock: left alone.
    assert_eq!(first_address(&call("ADD", "b").ok(&c)), "10.83.0.4/29");
    call("GC", "").ok(&json!({"cniVersion": "1.1.0", "name": "net", "ipam": c["ipam"], "cni.dev/valid-attachments": [
        {"containerID": "a", "ifname": "eth0"}, {"containerID": "b", "ifname": "eth0"}]}));
    assert!(empty.exists());
    // An old one is reclaimed by ADD (the next round-robin pass) ...
    set_old(&empty);
    for id in ["c", "d", "e"] {
        call("ADD", id).ok(&c);
    }
    assert_eq!(fs::read(&empty).unwrap(), b"e\r\neth0");
    // ... and by GC.
    let other = dd.net("net").join("10.83.0.6");
    call("DEL", "d").ok(&c);
    fs::write(&other, "").unwrap();
    set_old(&other);
    fs::write(dd.net("net").join(".tmp-lease-99999"), "x\r\neth0").unwrap();
    set_old(&dd.net("net").join(".tmp-lease-99999"));
    call("GC", "").ok(&json!({"cniVersion": "1.1.0", "name": "net", "ipam": c["ipam"]}));
    assert!(!other.exists());
    assert!(!dd.net("net").join(".tmp-lease-99999").exists());
    assert_eq!(dd.leases("net").len(), 4, "without a list, GC keeps every owned lease");
}

#[test]
fn gc_removes_leases_of_invalid_attachments() {
    let dd = DataDir::new();
    let c = conf("1.1.0", "gc", &dd, json!({"ranges": [[{"subnet": "10.84.0.0/24"}], [{"subnet": "fd00:84::/64"}]]}));
    for (id, ifname) in [("a", "eth0"), ("a", "net1"), ("b", "eth0"), ("c", "eth0")] {
        call("ADD", id).ifname(ifname).ok(&c);
    }
    fs::write(dd.net("gc").join("10.84.0.200"), "legacy").unwrap();
    fs::write(dd.net("gc").join("10.84.0.201"), "b").unwrap();
    let mut gc = c.clone();
    gc["cni.dev/valid-attachments"] =
        json!([{"containerID": "a", "ifname": "eth0"}, {"containerID": "b", "ifname": "eth0"}]);
    call("GC", "").ok(&gc);
    let mut owners: Vec<String> = dd.leases("gc").into_iter().map(|(_, c)| c).collect();
    owners.sort();
    assert_eq!(owners, ["a\r\neth0", "a\r\neth0", "b", "b\r\neth0", "b\r\neth0"]);
    // The older key, and an empty list: nothing is valid.
    let mut gc = c.clone();
    gc["cni.dev/attachments"] = json!([]);
    call("GC", "").ok(&gc);
    assert!(dd.leases("gc").is_empty());
    // The index follows: a new ADD for a collected attachment works.
    call("ADD", "a").ok(&c);
}

#[test]
fn status_reports_unavailable() {
    let dd = DataDir::new();
    let c = conf("1.1.0", "st", &dd, json!({"ranges": [[{"subnet": "10.85.0.0/30"}], [{"subnet": "fd00:85::/64"}]]}));
    call("STATUS", "").ok(&c);
    call("ADD", "a").ok(&c);
    let (code, msg) = call("STATUS", "").err(&c);
    assert_eq!(code, 50);
    assert!(msg.contains("range set 0") && msg.contains("no free address"), "{msg}");
    call("DEL", "a").ok(&c);
    call("STATUS", "").ok(&c);
    // A data dir that cannot be created (its parent is a file).
    fs::create_dir_all(&dd.0).unwrap();
    fs::write(dd.0.join("file"), "").unwrap();
    let mut c = c.clone();
    c["ipam"]["dataDir"] = dd.0.join("file").to_str().unwrap().into();
    let (code, msg) = call("STATUS", "").err(&c);
    assert_eq!(code, 50);
    assert!(msg.contains("cannot be written"), "{msg}");
}

/// Changes made behind our back (an operator, the reference) are seen: the index is rebuilt.
#[test]
fn foreign_changes_and_a_damaged_index() {
    let dd = DataDir::new();
    let c = v4_conf(&dd, "10.86.0.0/24");
    call("ADD", "a").ok(&c);
    let net = dd.net("net");
    fs::write(net.join("10.86.0.50"), "m\r\neth0").unwrap();
    call("CHECK", "m").ok(&c);
    assert!(call("ADD", "m").err(&c).1.contains("duplicate"));
    call("DEL", "m").ok(&c);
    assert!(!net.join("10.86.0.50").exists());
    // A lease removed by hand: its owner is not found any more.
    fs::remove_file(net.join("10.86.0.2")).unwrap();
    call("CHECK", "a").err(&c);
    call("ADD", "a").ok(&c);
    // Garbage in the index directory does not break anything.
    for entry in fs::read_dir(net.join(".host-local-index")).unwrap() {
        let path = entry.unwrap().path();
        if path.file_name().unwrap() != "stamp" {
            fs::write(path, "garbage \u{1} line\n").unwrap();
        }
    }
    call("CHECK", "a").ok(&c);
    call("DEL", "a").ok(&c);
    assert!(dd.leases("net").is_empty());
}

/// Both implementations at once on one network: the lock and the index stamp keep them consistent.
#[test]
fn interop_concurrent_mixed() {
    let dd = DataDir::new();
    let c = conf("1.0.0", "both", &dd, json!({"ranges": [[{"subnet": "10.87.0.0/24"}], [{"subnet": "fd00:87::/64"}]]}));
    let ids: Vec<String> = (0..60).map(|i| format!("m{i:02}")).collect();
    let spawn = |verb: &'static str, i: usize, id: &String| {
        let c2 = call(verb, id);
        if i.is_multiple_of(2) {
            c2.reference().spawn(&c)
        } else {
            c2.spawn(&c)
        }
    };
    let children: Vec<Child> = ids.iter().enumerate().map(|(i, id)| spawn("ADD", i, id)).collect();
    let mut seen = HashSet::new();
    for child in children {
        for a in addresses(&Out::from(child.wait_with_output().unwrap()).ok()) {
            assert!(seen.insert(a.clone()), "{a} given twice");
        }
    }
    assert_eq!(dd.leases("both").len(), 120);
    // Each releases the other's half.
    let children: Vec<Child> = ids.iter().enumerate().map(|(i, id)| spawn("DEL", i + 1, id)).collect();
    for child in children {
        Out::from(child.wait_with_output().unwrap()).ok();
    }
    assert!(dd.leases("both").is_empty(), "{:?}", dd.leases("both"));
}

/// Lease file names are the addresses as Go prints them, so both implementations name the same lease alike.
#[test]
fn ipv6_names_match_the_reference() {
    let dd = DataDir::new();
    for (i, subnet) in ["fd00:0:5:1::/64", "2001:db8:0:0:1::/80", "fd00:ab:0:1:0:0:0:0/112"].iter().enumerate() {
        let c = conf("1.0.0", &format!("n{i}"), &dd, json!({"ranges": [[{"subnet": subnet}]]}));
        let theirs = first_address(&call("ADD", "r").reference().ok(&c));
        let ours = first_address(&call("ADD", "o").ok(&c));
        let names: Vec<String> = dd.leases(&format!("n{i}")).into_iter().map(|(ip, _)| ip).collect();
        assert!(names.contains(&theirs.split('/').next().unwrap().to_string()), "{theirs} {names:?}");
        assert!(names.contains(&ours.split('/').next().unwrap().to_string()), "{ours} {names:?}");
        assert_ne!(theirs, ours);
    }
}

/// When this machine booted (`btime` of /proc/stat).
fn boot_time() -> SystemTime {
    let stat = fs::read_to_string("/proc/stat").unwrap();
    let seconds: u64 = stat.lines().find_map(|l| l.strip_prefix("btime ")).unwrap().trim().parse().unwrap();
    SystemTime::UNIX_EPOCH + Duration::from_secs(seconds)
}

/// Makes a lease look written in an earlier boot, as after an unclean reboot that sent no DEL.
fn set_before_boot(path: &Path) {
    let earlier = boot_time() - Duration::from_secs(3600);
    fs::File::options().write(true).open(path).unwrap().set_times(fs::FileTimes::new().set_modified(earlier)).unwrap();
}

#[test]
fn a_full_range_reclaims_leases_of_an_earlier_boot() {
    let dd = DataDir::new();
    let c = conf("1.0.0", "boot", &dd, json!({"ranges": [[{"subnet": "10.42.0.0/29"}]]}));
    // .2 to .6: five addresses besides the gateway.
    for id in ["a", "b", "c", "d", "e"] {
        call("ADD", id).ok(&c);
    }
    let (code, msg) = call("ADD", "x").err(&c);
    assert_eq!((code, msg.contains("no IP addresses available")), (999, true), "{msg}");

    // The node reboots uncleanly: a, b and d died with it (no DEL); c and e are this boot's pods.
    for ip in ["10.42.0.2", "10.42.0.3", "10.42.0.5"] {
        set_before_boot(&dd.net("boot").join(ip));
    }
    let out = call("ADD", "new1").run(&c);
    let got = first_address(&out.ok());
    assert_eq!(got, "10.42.0.2/29", "the first freed address, in allocation order");
    assert!(out.stderr.contains("freed 3 leases written before this boot"), "{}", out.stderr);
    // Every earlier-boot lease is freed at once; this boot's leases are untouched.
    let held: Vec<(String, String)> = dd.leases("boot");
    let expect = |ip: &str, id: &str| (ip.to_string(), format!("{id}\r\neth0"));
    assert_eq!(held, vec![expect("10.42.0.2", "new1"), expect("10.42.0.4", "c"), expect("10.42.0.6", "e")]);
    assert_eq!(first_address(&call("ADD", "new2").ok(&c)), "10.42.0.3/29");
    assert_eq!(first_address(&call("ADD", "new3").ok(&c)), "10.42.0.5/29");
    // Full again, and nothing is from an earlier boot: a clear error, no lease taken from a live pod.
    let (code, _) = call("ADD", "y").err(&c);
    assert_eq!(code, 999);
    assert_eq!(dd.leases("boot").len(), 5);
    // A DEL of a pod whose lease was reclaimed (a runtime's late cleanup) leaves the new holder alone.
    call("DEL", "a").ok(&c);
    assert_eq!(dd.leases("boot").len(), 5);
    // The reference plugin reads the state as it is.
    call("DEL", "new2").reference().ok(&c);
    assert!(!dd.net("boot").join("10.42.0.3").exists());
}
