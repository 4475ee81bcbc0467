//! sbr against the real kernel, chained after an interface plugin's result (the pod's eth0, a veth to the
//! node, built by the test): ADD adds "from <address> lookup 100" with table 100 holding the default route via
//! the gateway and the subnet route, the main table loses eth0's routes, traffic from the address still flows;
//! the next table without a rule is taken when 100 has one; `table` adds the rules only; DEL removes the rules, twice
//! and without the netns; every spec version; failures leave the pod unchanged; takeover both ways with the
//! reference 1.1.1.

use std::path::PathBuf;
use std::time::Duration;

use netns_tests::cnicore::spec::SUPPORTED_VERSIONS;
use netns_tests::snapshot::{assert_unchanged, NodeSnapshot};
use netns_tests::upstream::reference;
use netns_tests::{bin, json, pod_rig, unique_name, NodeWithPod, PluginOutput, Value};

const CONTAINER: &str = "sbr1";
const POD_IP: &str = "10.46.0.5";
const GATEWAY: &str = "10.46.0.1";

pod_rig!(Rig);

impl Rig {
    fn new() -> Rig {
        Rig { lab: NodeWithPod::with_eth0(&unique_name("sb"), &format!("{GATEWAY}/24"), &format!("{POD_IP}/24")) }
    }

    fn prev(&self, version: &str) -> Value {
        if version == "0.1.0" || version == "0.2.0" {
            return json!({"cniVersion": version, "ip4": {"ip": format!("{POD_IP}/24"), "gateway": GATEWAY}});
        }
        let mut ip = json!({"address": format!("{POD_IP}/24"), "gateway": GATEWAY, "interface": 0});
        if version.starts_with("0.") {
            ip["version"] = json!("4");
        }
        json!({"cniVersion": version, "interfaces": [{"name": "eth0", "sandbox": self.pod.path.display().to_string()}],
            "ips": [ip]})
    }

    fn conf(&self, version: &str) -> Value {
        json!({"cniVersion": version, "name": "sbr-net", "type": "sbr", "prevResult": self.prev(version)})
    }

    fn call(&self, binary: PathBuf, verb: &str, conf: &Value, netns: Option<&str>) -> PluginOutput {
        self.run(&binary, verb, (CONTAINER, "eth0"), netns, conf)
    }

    fn ours(&self, verb: &str, conf: &Value) -> PluginOutput {
        self.call(bin("sbr"), verb, conf, None)
    }

    /// `ip rule` lines of the pod that name a source address.
    fn source_rules(&self) -> Vec<String> {
        self.pod.ip(&["rule", "show"]).lines().filter(|l| l.contains(POD_IP)).map(|l| l.trim().to_string()).collect()
    }

    fn table(&self, table: &str) -> String {
        self.pod.ip(&["-4", "route", "show", "table", table])
    }

    /// Routes as before an ADD: the subnet route back in main, table 100 empty (DEL leaves both, as the
    /// reference's does: the interface plugin's DEL that follows removes the link and its routes).
    fn reset_routes(&self) {
        self.pod.ip(&[
            "route",
            "replace",
            "10.46.0.0/24",
            "dev",
            "eth0",
            "proto",
            "kernel",
            "scope",
            "link",
            "src",
            POD_IP,
        ]);
        self.pod.ip(&["-4", "route", "flush", "table", "100"]);
        self.pod.ip(&["-6", "route", "flush", "table", "100"]);
    }

    fn ping_from_pod_address(&self) -> bool {
        let out = self.pod.exec("ping", &["-c", "1", "-W", "2", "-I", POD_IP, GATEWAY], &[], b"");
        out.status.success()
    }
}

#[test]
fn rule_and_table_per_address() {
    let rig = Rig::new();
    let conf = rig.conf("1.1.0");
    let result = rig.ours("ADD", &conf).expect_ok().clone();
    assert_eq!(result["ips"], conf["prevResult"]["ips"], "the result is prevResult");
    assert_eq!(rig.source_rules(), [format!("32765:\tfrom {POD_IP} lookup 100")]);
    let table = rig.table("100");
    assert!(table.contains(&format!("default via {GATEWAY} dev eth0")), "{table}");
    assert!(table.contains("10.46.0.0/24 dev eth0"), "{table}");
    let main = rig.pod.ip(&["route", "show", "table", "main"]);
    assert!(!main.contains("eth0"), "eth0's routes left in main: {main}");
    assert!(rig.ping_from_pod_address(), "no traffic from the pod's address through table 100");
    rig.ours("CHECK", &conf).expect_ok();

    rig.ours("DEL", &conf).expect_ok();
    assert!(rig.source_rules().is_empty(), "{:?}", rig.source_rules());
    rig.ours("DEL", &conf).expect_ok();
    rig.call(bin("sbr"), "DEL", &conf, Some("")).expect_ok();
    rig.call(bin("sbr"), "DEL", &conf, Some("/run/netns/no-such-netns")).expect_ok();
    let e = rig.ours("CHECK", &conf).expect_err().clone();
    assert!(e["msg"].as_str().unwrap().contains("no rule"), "{e}");
    // ADD again on the same interface (its routes are in table 100 now, as the reference leaves them).
    rig.ours("ADD", &conf).expect_ok();
    assert_eq!(rig.source_rules(), [format!("32765:\tfrom {POD_IP} lookup 100")]);
    assert!(rig.ping_from_pod_address(), "no traffic after a second ADD");
    rig.ours("DEL", &conf).expect_ok();
}

#[test]
fn next_free_table_and_table_config() {
    let rig = Rig::new();
    rig.pod.ip(&["rule", "add", "from", "192.0.2.1", "lookup", "100"]);
    rig.pod.ip(&["route", "add", "198.51.100.0/24", "dev", "eth0", "table", "101"]);
    rig.ours("ADD", &rig.conf("1.0.0")).expect_ok();
    // As the reference: a table is taken when a rule names it; routes alone do not count.
    assert!(rig.source_rules()[0].ends_with("lookup 101"), "{:?}", rig.source_rules());
    rig.ours("DEL", &rig.conf("1.0.0")).expect_ok();

    let main_before = rig.pod.ip(&["route", "show", "table", "main"]);
    let mut conf = rig.conf("1.0.0");
    conf["table"] = json!(500);
    rig.ours("ADD", &conf).expect_ok();
    assert!(rig.source_rules()[0].ends_with(&format!("from {POD_IP} lookup 500")), "{:?}", rig.source_rules());
    assert_eq!(rig.pod.ip(&["route", "show", "table", "main"]), main_before, "routes stay with table");
    rig.ours("CHECK", &conf).expect_ok();
    rig.ours("DEL", &conf).expect_ok();
    assert!(rig.source_rules().is_empty());
}

#[test]
fn every_spec_version() {
    let rig = Rig::new();
    for version in SUPPORTED_VERSIONS {
        let conf = rig.conf(version);
        rig.ours("ADD", &conf).expect_result_in(version);
        assert_eq!(rig.source_rules().len(), 1, "{version}");
        rig.ours("DEL", &conf).expect_ok();
        assert!(rig.source_rules().is_empty(), "{version}");
        // The routes moved to table 100 are not put back by DEL (as the reference): the next ADD finds none.
        rig.reset_routes();
    }
}

#[test]
fn failures_leave_the_pod_unchanged() {
    let rig = Rig::new();
    let before = NodeSnapshot::settled(&rig.pod, &[], Duration::from_secs(5));
    let mut no_prev = rig.conf("1.0.0");
    no_prev.as_object_mut().unwrap().remove("prevResult");
    let mut no_ips = rig.conf("1.0.0");
    no_ips["prevResult"]["ips"] = json!([]);
    let mut bad_table = rig.conf("1.0.0");
    bad_table["table"] = json!(-3);
    let mut unreachable_gw = rig.conf("1.0.0");
    unreachable_gw["prevResult"]["ips"][0]["gateway"] = json!("10.99.0.1");
    for (conf, needle) in
        [(no_prev, "chained"), (no_ips, "No IP addresses"), (bad_table, "table"), (unreachable_gw, "route")]
    {
        let e = rig.ours("ADD", &conf).expect_err().clone();
        assert!(e["msg"].as_str().unwrap_or_default().contains(needle), "{e}");
        assert_unchanged(&before, &NodeSnapshot::take(&rig.pod, &[]));
    }
    let mut conf = rig.conf("1.0.0");
    conf["prevResult"]["interfaces"][0]["name"] = json!("eth9");
    let out = rig.call(bin("sbr"), "ADD", &conf, None);
    assert!(out.success(), "an address on no interface of that name is the reference's getIPCfgs' business");
    rig.ours("DEL", &conf).expect_ok();
}

#[test]
fn takeover_both_ways_with_the_reference() {
    let rig = Rig::new();
    let conf = rig.conf("0.4.0");
    let theirs = reference("sbr");
    rig.call(theirs.clone(), "ADD", &conf, None).expect_ok();
    let their_rules = rig.source_rules();
    let their_table = rig.table("100");
    rig.ours("CHECK", &conf).expect_ok();
    rig.ours("DEL", &conf).expect_ok();
    assert!(rig.source_rules().is_empty());
    rig.reset_routes();

    rig.ours("ADD", &conf).expect_ok();
    assert_eq!(rig.source_rules(), their_rules, "the same rule as the reference's");
    assert_eq!(rig.table("100"), their_table, "the same table as the reference's");
    rig.call(theirs, "DEL", &conf, None).expect_ok();
    assert!(rig.source_rules().is_empty());
}
