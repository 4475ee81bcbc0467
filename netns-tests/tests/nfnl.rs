//! The nftables backends' usual ADD and DEL as one nf_tables netlink batch (`cnicore::firewall::nfnl`):
//!
//! - elements written over netlink are the elements `nft` writes: `nft -j list` shows them with their
//!   comment, and the read-back by tag deletes them; elements `nft` wrote are deleted over netlink;
//! - the kernel's refusals come back with the element refused and its errno, and change nothing;
//! - the read-back by tag over netlink (set dumps, deletion by the key bytes listed) deletes one tag's
//!   elements and leaves the others';
//! - bridge (ipMasq), portmap and firewall with the nftables backend: a node's first pod sets the tables up
//!   with `nft`, the next pod's ADD and DEL run no `nft` process at all (a wrapper on `PATH` logs every run),
//!   nor does a DEL without prevResult or netns (containerd's second and third), which finds them by tag;
//! - fabricd's node masquerade in flanneld's nftables layout, written over netlink, is flanneld's to the
//!   byte code: `nft --debug=netlink list ruleset` is the same as for flanneld's rules written by `nft`.

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

use cnicore::firewall::nfnl::{self, Batch, BatchError};
use cnicore::firewall::nftables::{self, Datum, Element, MapValue};
use netns_tests::{json, require_programs, Node, PluginOutput, TestNetns, Value};

const TABLE: &str = "nfnl_test";

/// Sets and maps of each key and value type the three backends use.
const SETS: &str = "table inet nfnl_test {
  set pods4 { type ipv4_addr ; }
  set local6 { type ipv6_addr . ipv6_addr ; }
  map nomasq4 { type ipv4_addr : verdict ; }
  map hostports4 { type inet_proto . inet_service : verdict ; }
  map hostip_dnat6 { type ipv6_addr . inet_proto . inet_service : ipv6_addr . inet_service ; }
  set same_bridge { type ifname . ifname ; }
  chain target { }
}
";

fn nft(ns: &TestNetns, args: &[&str], stdin: &str) -> String {
    let out = ns.exec("nft", args, &[], stdin.as_bytes());
    assert!(out.status.success(), "nft {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn ip(text: &str) -> Datum {
    Datum::Addr(text.parse().expect("address"))
}

/// One element of each set of [`SETS`], tagged `tag`.
fn one_of_each(tag: &str) -> Vec<Element> {
    let tcp = Datum::Proto { number: 6, name: "tcp" };
    let bridge = Datum::ifname("cni-podman0").expect("name");
    vec![
        Element::new("pods4", vec![ip("10.244.1.5")], None),
        Element::new("local6", vec![ip("fd00::5"), ip("fd00::")], None),
        Element::new("nomasq4", vec![ip("10.244.1.5")], Some(MapValue::Jump("target".into()))),
        Element::new("hostports4", vec![tcp.clone(), Datum::Port(8080)], Some(MapValue::Continue)),
        Element::new(
            "hostip_dnat6",
            vec![ip("fd00::1"), tcp, Datum::Port(443)],
            Some(MapValue::Data(vec![ip("fd22::5"), Datum::Port(8443)])),
        ),
        Element::new("same_bridge", vec![bridge.clone(), bridge], None),
    ]
    .into_iter()
    .map(|e| e.tagged(tag))
    .collect()
}

/// The elements of the test table as `nft -j list` reads them, in the test's namespace.
fn listed(ns: &TestNetns) -> Vec<nftables::Listed> {
    ns.run(|| nftables::table_elements(TABLE)).expect("listing").expect("the table")
}

#[test]
fn netlink_and_nft_elements_are_the_same_elements() {
    if !require_programs(&["nft"], "apt-get install nftables") {
        return;
    }
    let ns = TestNetns::new("nfnl");
    nft(&ns, &["-f", "-"], SETS);

    // Written over netlink: listed by nft with key, value and comment; deleted by the tag path.
    let ours = one_of_each("ours-1");
    let mut batch = Batch::inet(TABLE);
    for e in &ours {
        batch.add(e, true);
    }
    ns.run(|| batch.commit()).expect("the batch applies");
    let present = listed(&ns);
    for e in &ours {
        let found = present.iter().find(|p| p.is_key_of(e)).unwrap_or_else(|| panic!("{e:?} in {present:?}"));
        assert_eq!((found.value.clone(), found.comment.as_deref()), (e.value_text(), Some("ours-1")), "{e:?}");
    }
    // Adding the same elements again changes nothing and succeeds, as `nft add element` does.
    ns.run(|| batch.commit()).expect("the same elements again");
    ns.run(|| nftables::delete_tagged(TABLE, |c| c == "ours-1")).expect("deleted by tag");
    assert_eq!(listed(&ns), vec![]);

    // Written by nft: deleted over netlink, twice (the second time they are gone already).
    let theirs = one_of_each("nft-1");
    let out = ns.exec("nft", &["-f", "-"], &[], nftables::add_script(TABLE, &theirs).render().as_bytes());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(listed(&ns).len(), theirs.len());
    assert!(listed(&ns).iter().all(|p| p.comment.as_deref() == Some("nft-1")));
    for _ in 0..2 {
        let mut batch = Batch::inet(TABLE);
        for e in &theirs {
            batch.remove_if_present(e);
        }
        ns.run(|| batch.commit()).expect("removed over netlink");
        assert_eq!(listed(&ns), vec![]);
    }

    // Written by nft under two tags: the netlink read-back by tag deletes one tag's and leaves the other's.
    let mut both = one_of_each("nft-a");
    both.truncate(3);
    let others: Vec<Element> = one_of_each("nft-b").into_iter().skip(3).collect();
    both.extend(others);
    let out = ns.exec("nft", &["-f", "-"], &[], nftables::add_script(TABLE, &both).render().as_bytes());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let found = ns.run(|| nfnl::table_elements(TABLE)).expect("dump").expect("the table");
    assert_eq!(found.len(), 6, "{found:?}");
    ns.run(|| nfnl::delete_tagged(TABLE, &|c| c == "nft-a")).expect("deleted by tag over netlink");
    let left = listed(&ns);
    assert_eq!(left.len(), 3, "{left:?}");
    assert!(left.iter().all(|p| p.comment.as_deref() == Some("nft-b")), "{left:?}");
    ns.run(|| nfnl::delete_tagged(TABLE, &|c| c == "nft-a")).expect("nothing left to delete");
    assert_eq!(ns.run(|| nfnl::table_elements("nfnl_no_such_table")).expect("dump"), None);
    ns.run(|| nfnl::delete_tagged("nfnl_no_such_table", &|_| true)).expect("no table: nothing to delete");
}

#[test]
fn refusals_name_the_element_and_change_nothing() {
    if !require_programs(&["nft"], "apt-get install nftables") {
        return;
    }
    let ns = TestNetns::new("nfnl");
    nft(&ns, &["-f", "-"], SETS);
    let elements = one_of_each("t");
    let refused = |batch: &mut Batch| match ns.run(|| batch.commit()) {
        Err(BatchError::Refused { index, error }) => (index, error.raw_os_error()),
        other => panic!("expected a refusal: {other:?}"),
    };

    // A set that does not exist, as the second message: ENOENT for it, and the first not added either.
    let mut batch = Batch::inet(TABLE);
    batch.add(&elements[0], true).add(&Element::new("missing", vec![ip("10.0.0.1")], None), true);
    assert_eq!(refused(&mut batch), (Some(1), Some(libc::ENOENT)));
    assert_eq!(listed(&ns), vec![]);
    // A jump to a chain that does not exist.
    let mut batch = Batch::inet(TABLE);
    batch.add(&Element::new("nomasq4", vec![ip("10.0.0.1")], Some(MapValue::Jump("nowhere".into()))), true);
    assert_eq!(refused(&mut batch), (Some(0), Some(libc::ENOENT)));
    // A key holding another value: EEXIST, for an addition and for DEL's add-then-delete alike.
    let mut batch = Batch::inet(TABLE);
    batch.add(&elements[3], true);
    ns.run(|| batch.commit()).expect("added");
    let other = Element::new("hostports4", elements[3].key.clone(), Some(MapValue::Jump("target".into())));
    let mut batch = Batch::inet(TABLE);
    batch.add(&elements[0], true).add(&other, true);
    assert_eq!(refused(&mut batch), (Some(1), Some(libc::EEXIST)));
    let mut batch = Batch::inet(TABLE);
    batch.remove_if_present(&other);
    assert_eq!(refused(&mut batch), (Some(0), Some(libc::EEXIST)));
    assert_eq!(listed(&ns).len(), 1, "only the element added on its own");
    // A table that does not exist.
    let mut batch = Batch::inet("nfnl_no_such_table");
    batch.add(&elements[0], true);
    assert_eq!(refused(&mut batch), (Some(0), Some(libc::ENOENT)));
}

/// A directory holding an `nft` that logs its arguments to `log` and runs the real one.
fn logging_nft(node: &Node) -> (PathBuf, PathBuf) {
    let real = cnicore::firewall::find_binary("nft").expect("nft");
    let dir = node.dir().join("logging-bin");
    std::fs::create_dir_all(&dir).expect("mkdir");
    let log = node.dir().join("nft-runs.log");
    let script = format!("#!/bin/sh\necho \"$*\" >> {}\nexec {} \"$@\"\n", log.display(), real.display());
    let wrapper = dir.join("nft");
    std::fs::write(&wrapper, script).expect("write wrapper");
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    (dir, log)
}

struct Chain {
    node: Node,
    path: String,
    log: PathBuf,
}

impl Chain {
    fn new() -> Chain {
        let node = Node::new();
        let (dir, log) = logging_nft(&node);
        let path = format!("{}:/usr/sbin:/usr/bin:/sbin:/bin", dir.display());
        Chain { node, path, log }
    }

    fn run(&self, plugin: &str, verb: &str, pod: &TestNetns, id: &str, conf: &Value) -> PluginOutput {
        let netns = pod.path.display().to_string();
        let env = [("CNI_CONTAINERID", id), ("CNI_NETNS", &netns), ("CNI_IFNAME", "eth0"), ("PATH", &self.path)];
        self.node.run_plugin(plugin, verb, &env, conf)
    }

    fn bridge(&self) -> Value {
        json!({"cniVersion": "1.1.0", "name": "nfnl", "type": "bridge", "bridge": "cbr0", "isGateway": true,
               "ipMasq": true, "ipMasqBackend": "nftables",
               "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.33.0.0/24"}], [{"subnet": "fd33::/64"}]],
                        "dataDir": self.node.dir().join("ipam")}})
    }

    /// Host ports of their own for each pod (a host port of another pod would be taken over: not the
    /// usual ADD).
    fn portmap(result: &Value, host_port: u16) -> Value {
        json!({"cniVersion": "1.1.0", "name": "nfnl", "type": "portmap", "backend": "nftables", "snat": true,
               "runtimeConfig": {"portMappings": [{"hostPort": host_port, "containerPort": 80, "protocol": "tcp"},
                                                  {"hostPort": host_port + 1, "containerPort": 53, "protocol": "udp"}]},
               "prevResult": result})
    }

    fn firewall(&self, result: &Value) -> Value {
        json!({"cniVersion": "1.1.0", "name": "nfnl", "type": "firewall", "backend": "nftables",
               "ingressPolicy": "same-bridge", "dataDir": self.node.dir().join("firewall"), "prevResult": result})
    }

    /// bridge, portmap, firewall: the bridge's result.
    fn add(&self, pod: &TestNetns, id: &str, host_port: u16) -> Value {
        let result = self.run("bridge", "ADD", pod, id, &self.bridge()).expect_ok().clone();
        self.run("portmap", "ADD", pod, id, &Chain::portmap(&result, host_port)).expect_ok();
        self.run("firewall", "ADD", pod, id, &self.firewall(&result)).expect_ok();
        result
    }

    fn del(&self, pod: &TestNetns, id: &str, result: &Value, host_port: u16) {
        self.run("firewall", "DEL", pod, id, &self.firewall(result)).expect_ok();
        self.run("portmap", "DEL", pod, id, &Chain::portmap(result, host_port)).expect_ok();
        let mut bridge = self.bridge();
        bridge["prevResult"] = result.clone();
        self.run("bridge", "DEL", pod, id, &bridge).expect_ok();
    }

    /// DEL as containerd's second and third: no prevResult, `CNI_NETNS=""` (the elements found by their tag).
    fn del_bare(&self, id: &str) {
        let env = [("CNI_CONTAINERID", id), ("CNI_NETNS", ""), ("CNI_IFNAME", "eth0"), ("PATH", &self.path)];
        let without_prev = |mut conf: Value| {
            conf.as_object_mut().expect("object").remove("prevResult");
            conf
        };
        let firewall = without_prev(self.firewall(&Value::Null));
        self.node.run_plugin("firewall", "DEL", &env, &firewall).expect_ok();
        self.node.run_plugin("portmap", "DEL", &env, &without_prev(Chain::portmap(&Value::Null, 1))).expect_ok();
        self.node.run_plugin("bridge", "DEL", &env, &self.bridge()).expect_ok();
    }

    /// The `nft` runs logged since the last call.
    fn nft_runs(&self) -> Vec<String> {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let _ = std::fs::remove_file(&self.log);
        text.lines().map(str::to_string).collect()
    }

    fn ruleset(&self) -> String {
        nft(&self.node, &["list", "ruleset"], "")
    }
}

#[test]
fn the_usual_add_and_del_run_no_nft() {
    if !require_programs(&["nft"], "apt-get install nftables") {
        return;
    }
    let chain = Chain::new();
    let first = chain.node.pod_netns();
    let first_result = chain.add(&first, "nfnl-first", 8080);
    let runs = chain.nft_runs();
    assert!(!runs.is_empty(), "the first pod sets the tables up with nft");

    let second = chain.node.pod_netns();
    let result = chain.add(&second, "nfnl-second", 9090);
    assert_eq!(chain.nft_runs(), Vec::<String>::new(), "the second pod's ADD runs no nft");
    let ruleset = chain.ruleset();
    let ip = result["ips"][0]["address"].as_str().expect("address").split('/').next().expect("ip").to_string();
    for table in ["cni_ipmasq", "cni_portmap", "cni_firewall"] {
        assert!(ruleset.contains(&format!("table inet {table}")), "{ruleset}");
    }
    // Its elements, with their comments (owner tags), in the three tables.
    let tagged = ruleset.lines().filter(|l| l.contains(&ip) && l.contains("comment")).count();
    assert!(tagged >= 5, "{ruleset}");
    let tagged_of =
        |kind: &str| ruleset.lines().filter(|l| l.contains(&ip) && l.contains(&format!("\"{kind}-"))).count();
    assert!(tagged_of("masq") > 0 && tagged_of("pm") > 0 && tagged_of("fw") > 0, "{ruleset}");

    chain.del(&second, "nfnl-second", &result, 9090);
    assert_eq!(chain.nft_runs(), Vec::<String>::new(), "the second pod's DEL runs no nft");
    let ruleset = chain.ruleset();
    assert!(!ruleset.contains(&format!("{ip} ")) && !ruleset.contains(&format!("{ip},")), "{ruleset}");
    let first_ip = first_result["ips"][0]["address"].as_str().expect("address").split('/').next().expect("ip");
    assert!(ruleset.contains(first_ip), "the first pod's elements stay: {ruleset}");

    // A DEL without prevResult or netns finds the elements by their tag, over netlink too.
    let third = chain.node.pod_netns();
    let result = chain.add(&third, "nfnl-third", 7070);
    let third_ip = result["ips"][0]["address"].as_str().expect("address").split('/').next().expect("ip").to_string();
    assert!(chain.ruleset().contains(&third_ip));
    chain.nft_runs();
    chain.del_bare("nfnl-third");
    assert_eq!(chain.nft_runs(), Vec::<String>::new(), "a DEL by tag runs no nft");
    let ruleset = chain.ruleset();
    assert!(!ruleset.contains(&format!("{third_ip} ")) && !ruleset.contains(&format!("{third_ip},")), "{ruleset}");
    assert!(ruleset.contains(first_ip), "the first pod's elements stay: {ruleset}");

    chain.del(&first, "nfnl-first", &first_result, 8080);
    // A DEL again: everything is gone already, and that is fine.
    chain.del(&first, "nfnl-first", &first_result, 8080);
    let ruleset = chain.ruleset();
    assert!(!ruleset.contains(first_ip), "{ruleset}");
}

/// flanneld v0.28's nftables masquerade and forward rules (`pkg/trafficmngr/nftables`: initTable,
/// SetupAndEnsureMasqRules, addMasqRules, SetupAndEnsureForwardRules) for a dual-stack node, as `nft` text: the
/// reference written from flannel's source.
const FLANNELD_MASQ: &str = r#"add table ip flannel-ipv4 { comment "rules for flannel-ipv4"; }
add chain ip flannel-ipv4 postrtg { type nat hook postrouting priority srcnat; comment "chain to manage traffic masquerading by flannel"; }
add rule ip flannel-ipv4 postrtg meta mark 0x4000 return
add rule ip flannel-ipv4 postrtg ip saddr 10.244.3.0/24 ip daddr 10.244.0.0/16 return
add rule ip flannel-ipv4 postrtg ip saddr 10.244.0.0/16 ip daddr 10.244.3.0/24 return
add rule ip flannel-ipv4 postrtg ip saddr != 10.244.3.0/24 ip daddr 10.244.0.0/16 return
add rule ip flannel-ipv4 postrtg ip saddr 10.244.0.0/16 ip daddr != 224.0.0.0/4 masquerade fully-random
add rule ip flannel-ipv4 postrtg ip saddr != 10.244.0.0/16 ip daddr 10.244.0.0/16 masquerade fully-random
add chain ip flannel-ipv4 forward { type filter hook forward priority filter; comment "chain to accept flannel traffic"; }
add rule ip flannel-ipv4 forward ip saddr 10.244.0.0/16 accept
add rule ip flannel-ipv4 forward ip daddr 10.244.0.0/16 accept
add table ip6 flannel-ipv6 { comment "rules for flannel-ipv6"; }
add chain ip6 flannel-ipv6 postrtg { type nat hook postrouting priority srcnat; comment "chain to manage traffic masquerading by flannel"; }
add rule ip6 flannel-ipv6 postrtg meta mark 0x4000 return
add rule ip6 flannel-ipv6 postrtg ip6 saddr fd00:10:244:3::/64 ip6 daddr fd00:10:244::/56 return
add rule ip6 flannel-ipv6 postrtg ip6 saddr fd00:10:244::/56 ip6 daddr fd00:10:244:3::/64 return
add rule ip6 flannel-ipv6 postrtg ip6 saddr != fd00:10:244:3::/64 ip6 daddr fd00:10:244::/56 return
add rule ip6 flannel-ipv6 postrtg ip6 saddr fd00:10:244::/56 ip6 daddr != ff00::/8 masquerade fully-random
add rule ip6 flannel-ipv6 postrtg ip6 saddr != fd00:10:244::/56 ip6 daddr fd00:10:244::/56 masquerade fully-random
add chain ip6 flannel-ipv6 forward { type filter hook forward priority filter; comment "chain to accept flannel traffic"; }
add rule ip6 flannel-ipv6 forward ip6 saddr fd00:10:244::/56 accept
add rule ip6 flannel-ipv6 forward ip6 daddr fd00:10:244::/56 accept
"#;

#[test]
fn node_masquerade_over_netlink_is_flanneld_s_byte_code() {
    use cnicore::firewall::{node_masq, Backend};
    if !require_programs(&["nft"], "apt-get install nftables") {
        return;
    }
    let pairs: Vec<(ipnet::IpNet, ipnet::IpNet)> =
        [("10.244.0.0/16", "10.244.3.0/24"), ("fd00:10:244::/56", "fd00:10:244:3::/64")]
            .iter()
            .map(|(cluster, pods)| (cluster.parse().unwrap(), pods.parse().unwrap()))
            .collect();
    let flanneld = TestNetns::new("flanneld-nft");
    nft(&flanneld, &["-f", "-"], FLANNELD_MASQ);
    let ours = TestNetns::new("fabricd-nft");
    // What an older fabricd and a flanneld with other networks left behind: replaced in the same transaction.
    nft(
        &ours,
        &["-f", "-"],
        "add table inet fabricd\nadd table ip flannel-ipv4\nadd chain ip flannel-ipv4 postrtg\n\
        add rule ip flannel-ipv4 postrtg ip saddr 10.99.0.0/16 masquerade\n",
    );
    let forward: Vec<ipnet::IpNet> = pairs.iter().map(|(cluster, _)| *cluster).collect();
    let set_up = |pairs: &[(ipnet::IpNet, ipnet::IpNet)], forward: &[ipnet::IpNet]| {
        ours.run(|| node_masq::is_set_up(Backend::Nftables, pairs, forward)).expect("read back")
    };
    let setup = |pairs: &[(ipnet::IpNet, ipnet::IpNet)], forward: &[ipnet::IpNet]| {
        ours.run(|| node_masq::setup(Backend::Nftables, pairs, forward)).expect("setup over netlink")
    };
    assert!(!set_up(&pairs, &forward));
    setup(&pairs, &forward);
    assert!(set_up(&pairs, &forward), "set up, read back by netlink");
    assert!(!set_up(&pairs, &[]), "the forward chains are more than asked");
    // For information: the periodic check over netlink against one `nft -j list` of a table, as before.
    let started = std::time::Instant::now();
    for _ in 0..20 {
        set_up(&pairs, &forward);
    }
    let netlink = started.elapsed() / 20;
    let started = std::time::Instant::now();
    for _ in 0..20 {
        nft(&ours, &["-j", "list", "table", "ip", "flannel-ipv4"], "");
    }
    eprintln!(
        "masquerade check: {netlink:?} over netlink (both families), {:?} per nft -j list",
        started.elapsed() / 20
    );
    let code = |ns: &TestNetns| nft(ns, &["--debug=netlink", "list", "ruleset"], "");
    assert_eq!(code(&ours), code(&flanneld), "the byte code flanneld's rules compile to");
    let listing = nft(&ours, &["list", "ruleset"], "");
    assert!(listing.contains("comment \"rules for flannel-ipv4\"") && !listing.contains("fabricd"), "{listing}");
    // Again: one copy. Without forward rules, IPv4 only: the forward chains and the IPv6 table go.
    setup(&pairs, &forward);
    assert_eq!(code(&ours), code(&flanneld));
    setup(&pairs[..1], &[]);
    assert!(set_up(&pairs[..1], &[]));
    let listing = nft(&ours, &["list", "ruleset"], "");
    assert!(!listing.contains("flannel-ipv6") && !listing.contains("chain forward"), "{listing}");
    ours.run(node_masq::teardown).expect("teardown");
    assert_eq!(nft(&ours, &["list", "ruleset"], ""), "");
}
