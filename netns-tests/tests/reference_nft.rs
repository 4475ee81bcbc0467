//! A node moved from the reference plugins v1.6-v1.9 with their nftables backends (bridge `ipMasqBackend:
//! nftables`, portmap `backend: nftables`) to ours, with pods running. Their rules are loaded from fixtures
//! rendered from their source (`netns-tests/fixtures/reference-v1.9-*.nft`: the transactions their ADD runs,
//! as knftables writes them), since their v1.9 binaries cannot be installed here (Debian has 1.1.1):
//!
//! ```text
//!   pods A, C (their rules) and B (ours) --cbr0-- node (10.22.0.1 | 192.168.50.1) --veth-- wan (192.168.50.2)
//! ```
//!
//! What a user sees: their pod keeps its hostPorts and its masquerade while ours are added beside it; our
//! CHECK accepts it; our DEL removes its rules; our GC removes those of a pod whose DEL never came.

use std::path::Path;
use std::time::Duration;

use cnicore::firewall::reference_nft;
use ipnet::IpNet;
use netns_tests::traffic::{tcp_ask_once, TcpServer};
use netns_tests::{json, require_programs, veth_between, Node, PluginOutput, TestNetns, Value};

const NETWORK: &str = "refnft";
const NODE_WAN: &str = "192.168.50.1";

/// A TCP server in a namespace answering "<label> <peer address>".
fn server(ns: &TestNetns, port: u16, label: &'static str) -> TcpServer {
    TcpServer::start(ns, port, move |peer| format!("{label} {peer}"))
}

fn ask(ns: &TestNetns, to: &str) -> Option<String> {
    tcp_ask_once(ns, to.parse().expect("socket address"), Duration::from_secs(2))
}

struct Lab {
    node: Node,
    wan: TestNetns,
}

/// One pod: its netns, container ID and the bridge's ADD result.
struct Pod {
    ns: TestNetns,
    id: &'static str,
    result: Value,
}

impl Pod {
    fn ip(&self) -> IpNet {
        self.result["ips"][0]["address"].as_str().expect("address").parse().expect("cidr")
    }
}

impl Lab {
    fn new() -> Lab {
        let node = Node::new();
        let wan = TestNetns::new("wan");
        let net = |s: &str| s.parse::<IpNet>().expect("net");
        veth_between(&node, &wan, "up0", "wan0", &[net("192.168.50.1/24")], &[net("192.168.50.2/24")]);
        Lab { node, wan }
    }

    fn bridge_conf(&self, ip_masq: bool) -> Value {
        json!({"cniVersion": "1.1.0", "name": NETWORK, "type": "bridge", "bridge": "cbr0", "isDefaultGateway": true, "hairpinMode": true,
               "ipMasq": ip_masq, "ipMasqBackend": "nftables",
               "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.22.0.0/24"}]],
                        "dataDir": self.node.dir().join("ipam")}})
    }

    fn portmap_conf(&self, pod: &Pod, mappings: Value) -> Value {
        json!({"cniVersion": "1.1.0", "name": NETWORK, "type": "portmap", "backend": "nftables",
               "runtimeConfig": {"portMappings": mappings}, "prevResult": pod.result})
    }

    fn run(&self, plugin: &str, command: &str, pod: &Pod, conf: &Value) -> PluginOutput {
        let netns = pod.ns.path.to_string_lossy().into_owned();
        let env = [("CNI_CONTAINERID", pod.id), ("CNI_NETNS", netns.as_str()), ("CNI_IFNAME", "eth0")];
        self.node.run_plugin(plugin, command, &env, conf)
    }

    /// A pod on cbr0 (our bridge, without masquerade: the firewall part comes from elsewhere).
    fn pod(&self, id: &'static str, ip_masq: bool) -> Pod {
        let mut pod = Pod { ns: self.node.pod_netns(), id, result: Value::Null };
        pod.result = self.run("bridge", "ADD", &pod, &self.bridge_conf(ip_masq)).expect_ok().clone();
        pod
    }

    /// Runs a fixture in the node with `nft -f -`, its placeholders filled in.
    fn load_fixture(&self, name: &str, values: &[(&str, String)]) {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures").join(name);
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let mut text: String = text.lines().filter(|l| !l.starts_with('#')).map(|l| format!("{l}\n")).collect();
        for (key, value) in values {
            text = text.replace(&format!("${{{key}}}"), value);
        }
        assert!(!text.contains("${"), "unfilled placeholder in {name}");
        let out = self.node.exec("nft", &["-f", "-"], &[], text.as_bytes());
        assert!(out.status.success(), "nft -f {name}: {}", String::from_utf8_lossy(&out.stderr));
    }

    /// What the reference's ADD leaves for a pod: its ipMasq rule and its portmap rules.
    fn their_add(&self, pod: &Pod, host_port: u16, hostip_port: u16) {
        let ip = pod.ip();
        let comment = reference_nft::ipmasq_comment(NETWORK, "eth0", pod.id);
        self.load_fixture(
            "reference-v1.9-ipmasq-nftables.nft",
            &[("POD_IP", ip.addr().to_string()), ("POD_SUBNET", ip.trunc().to_string()), ("COMMENT", comment)],
        );
        self.load_fixture(
            "reference-v1.9-portmap-nftables.nft",
            &[
                ("POD_IP", ip.addr().to_string()),
                ("CONTAINER_ID", pod.id.to_string()),
                ("HOST_PORT", host_port.to_string()),
                ("HOSTIP_PORT", hostip_port.to_string()),
                ("HOST_IP", NODE_WAN.to_string()),
            ],
        );
    }

    /// The node's ruleset lines that name `text` (a container ID or an address).
    fn rules_naming(&self, text: &str) -> Vec<String> {
        let out = self.node.exec("nft", &["list", "ruleset"], &[], b"");
        assert!(out.status.success());
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.contains(text))
            .map(|l| l.trim().to_string())
            .collect()
    }
}

fn their_mappings(host_port: u16, hostip_port: u16) -> Value {
    json!([{"hostPort": host_port, "containerPort": 80, "protocol": "tcp"},
           {"hostPort": hostip_port, "containerPort": 81, "protocol": "tcp", "hostIP": NODE_WAN}])
}

#[test]
fn a_node_moved_from_the_reference_nftables_backends_keeps_working() {
    if !require_programs(&["nft"], "run scripts/setup.sh (installs nftables)") {
        return;
    }
    let lab = Lab::new();
    // Pods A and C were set up by the reference plugins (v1.9, nftables backends) before the move.
    let a = lab.pod("theirs-a", false);
    let c = lab.pod("theirs-c", false);
    lab.their_add(&a, 8080, 8081);
    lab.their_add(&c, 8090, 8091);
    let a_ip = a.ip().addr().to_string();
    let c_ip = c.ip().addr().to_string();
    let _a80 = server(&a.ns, 80, "a");
    let _a81 = server(&a.ns, 81, "a81");
    let _wan = server(&lab.wan, 7000, "wan");
    let wan_service = "192.168.50.2:7000";
    assert_eq!(ask(&lab.wan, "192.168.50.1:8080").as_deref(), Some("a 192.168.50.2"), "their hostPort before the move");
    assert_eq!(ask(&a.ns, wan_service).as_deref(), Some("wan 192.168.50.1"), "their masquerade before the move");

    // Our CHECK accepts their pod: bridge (ipMasq nftables) and portmap (backend nftables).
    lab.run("bridge", "CHECK", &a, &{
        let mut conf = lab.bridge_conf(true);
        conf["prevResult"] = a.result.clone();
        conf
    })
    .expect_ok();
    lab.run("portmap", "CHECK", &a, &lab.portmap_conf(&a, their_mappings(8080, 8081))).expect_ok();
    // ... and not a pod with a mapping nobody made (their rules are counted per chain, as their CHECK does).
    let mut more = their_mappings(8080, 8081);
    more.as_array_mut().unwrap().push(json!({"hostPort": 8082, "containerPort": 82, "protocol": "tcp"}));
    let missing = lab.run("portmap", "CHECK", &a, &lab.portmap_conf(&a, more));
    assert!(!missing.success(), "CHECK passed for a mapping nobody made: {}", missing.stdout_text);

    // A new pod of ours, beside theirs.
    let their_rules_before = lab.rules_naming("theirs-a");
    let b = lab.pod("ours-b", true);
    lab.run(
        "portmap",
        "ADD",
        &b,
        &lab.portmap_conf(&b, json!([{"hostPort": 9080, "containerPort": 80, "protocol": "tcp"}])),
    )
    .expect_ok();
    let _b80 = server(&b.ns, 80, "b");
    assert_eq!(lab.rules_naming("theirs-a"), their_rules_before, "our ADD changed their rules");
    assert_eq!(ask(&lab.wan, "192.168.50.1:8080").as_deref(), Some("a 192.168.50.2"), "their hostPort beside ours");
    assert_eq!(
        ask(&lab.wan, "192.168.50.1:8081").as_deref(),
        Some("a81 192.168.50.2"),
        "their hostIP port beside ours"
    );
    assert_eq!(ask(&lab.wan, "192.168.50.1:9080").as_deref(), Some("b 192.168.50.2"), "our hostPort");
    assert_eq!(ask(&a.ns, wan_service).as_deref(), Some("wan 192.168.50.1"), "their masquerade beside ours");
    assert_eq!(ask(&b.ns, wan_service).as_deref(), Some("wan 192.168.50.1"), "our masquerade");
    // Hairpin through their rules: pod A to its own host port.
    assert_eq!(ask(&a.ns, "192.168.50.1:8080").as_deref().map(|s| s.starts_with("a ")), Some(true), "their hairpin");

    // Our DEL removes their rules of pod A (ipMasq and portmap), and only those.
    lab.run("portmap", "DEL", &a, &lab.portmap_conf(&a, their_mappings(8080, 8081))).expect_ok();
    lab.run("bridge", "DEL", &a, &lab.bridge_conf(true)).expect_ok();
    assert_eq!(lab.rules_naming("theirs-a"), Vec::<String>::new(), "their rules of A after our DEL");
    assert_eq!(lab.rules_naming(&format!("{a_ip} ")), Vec::<String>::new(), "rules naming A's address after our DEL");
    assert_eq!(ask(&lab.wan, "192.168.50.1:8080"), None, "A's hostPort still answered after DEL");
    assert!(!lab.rules_naming("theirs-c").is_empty(), "our DEL of A removed C's rules");
    // A second DEL is fine.
    lab.run("portmap", "DEL", &a, &lab.portmap_conf(&a, their_mappings(8080, 8081))).expect_ok();
    lab.run("bridge", "DEL", &a, &lab.bridge_conf(true)).expect_ok();

    // GC with only B valid removes C's rules (its DEL never came), ours of B stay.
    let valid = json!([{"containerID": "ours-b", "ifname": "eth0"}]);
    let mut gc_bridge = lab.bridge_conf(true);
    gc_bridge["cni.dev/valid-attachments"] = valid.clone();
    let gc_portmap = json!({"cniVersion": "1.1.0", "name": NETWORK, "type": "portmap", "backend": "nftables",
                            "cni.dev/valid-attachments": valid});
    let nobody = Pod { ns: lab.node.pod_netns(), id: "", result: Value::Null };
    lab.run("bridge", "GC", &nobody, &gc_bridge).expect_ok();
    lab.run("portmap", "GC", &nobody, &gc_portmap).expect_ok();
    assert_eq!(lab.rules_naming("theirs-c"), Vec::<String>::new(), "their rules of C after our GC");
    assert_eq!(lab.rules_naming(&format!("{c_ip} ")), Vec::<String>::new(), "rules naming C's address after GC");
    assert_eq!(ask(&lab.wan, "192.168.50.1:9080").as_deref(), Some("b 192.168.50.2"), "our pod after GC");
    assert_eq!(ask(&b.ns, wan_service).as_deref(), Some("wan 192.168.50.1"), "our masquerade after GC");
}

/// DEL asks the kernel over netlink which tables exist before running `nft` at all
/// (`cnicore::firewall::nft_tables`): the dump names every table with its family, as `nft list tables` does.
#[test]
fn nf_tables_tables_are_listed_over_netlink() {
    let ns = TestNetns::new("nftls");
    let listed = || {
        let mut tables = ns.run(cnicore::firewall::nfnl::tables).expect("table dump");
        tables.sort();
        tables
    };
    assert_eq!(listed(), Vec::<(String, String)>::new(), "a new namespace has no tables");
    let script = "table inet cni_plugins_masquerade {}\ntable ip6 cni_hostport {}\ntable ip cni_hostport {}\n";
    let out = ns.exec("nft", &["-f", "-"], &[], script.as_bytes());
    assert!(out.status.success(), "nft -f: {}", String::from_utf8_lossy(&out.stderr));
    let pair = |family: &str, name: &str| (family.to_string(), name.to_string());
    assert_eq!(
        listed(),
        vec![pair("inet", "cni_plugins_masquerade"), pair("ip", "cni_hostport"), pair("ip6", "cni_hostport")]
    );
    assert!(ns.run(|| cnicore::firewall::nfnl::table_exists("ip6", "cni_hostport")).expect("dump"));
    assert!(!ns.run(|| cnicore::firewall::nfnl::table_exists("inet", "cni_hostport")).expect("dump"));
}
