//! The bad-input cases of portmap.

use super::*;

pub(crate) fn portmap_base(rig: &Rig) -> Value {
    json!({
        "cniVersion": "1.0.0",
        "name": NETWORK,
        "type": "portmap",
        "capabilities": {"portMappings": true},
        "runtimeConfig": {"portMappings": [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}]},
        "prevResult": rig.prev_result("1.0.0")
    })
}

pub(crate) fn portmap_cases(rig: &Rig) -> Vec<Case> {
    let base = portmap_base(rig);
    let add = |name: &str, key: &str, value: Value, needle: &str| {
        Case::conf(name, "ADD", &with(&base, key, value), INVALID_CONFIG).needle(needle)
    };
    let mapping = |m: Value| json!({"portMappings": [m]});
    let map = |name: &str, m: Value, needle: &str| add(name, "runtimeConfig", mapping(m), needle);
    let mut cases = common_cases(&base, false);
    cases.extend(prev_result_cases(&base));
    cases.extend(chain_name_cases(&base, "externalSetMarkChain"));
    cases.extend([
        map("hostPort 0", json!({"hostPort": 0, "containerPort": 80, "protocol": "tcp"}), "port"),
        map("hostPort 65536", json!({"hostPort": 65536, "containerPort": 80, "protocol": "tcp"}), "port"),
        map("containerPort negative", json!({"hostPort": 8080, "containerPort": -80, "protocol": "tcp"}), "port"),
        map("containerPort missing", json!({"hostPort": 8080, "protocol": "tcp"}), "container port"),
        map("hostPort a string", json!({"hostPort": "8080", "containerPort": 80, "protocol": "tcp"}), "hostPort"),
        map("hostPort a float", json!({"hostPort": 80.5, "containerPort": 80, "protocol": "tcp"}), "hostPort"),
        map("protocol icmp", json!({"hostPort": 8080, "containerPort": 80, "protocol": "icmp"}), "protocol"),
        map("protocol empty", json!({"hostPort": 8080, "containerPort": 80, "protocol": ""}), "protocol"),
        map(
            "protocol with newline",
            json!({"hostPort": 8080, "containerPort": 80, "protocol": "tcp\n-A INPUT"}),
            "protocol",
        ),
        map(
            "hostIP not an IP",
            json!({"hostPort": 8080, "containerPort": 80, "protocol": "tcp", "hostIP": "1.2.3"}),
            "hostIP",
        ),
        map(
            "hostIP a name",
            json!({"hostPort": 8080, "containerPort": 80, "protocol": "tcp", "hostIP": "localhost"}),
            "hostIP",
        ),
        map(
            "hostIP a CIDR",
            json!({"hostPort": 8080, "containerPort": 80, "protocol": "tcp", "hostIP": "10.0.0.0/8"}),
            "hostIP",
        ),
        add(
            "two mappings of one host port",
            "runtimeConfig",
            json!({"portMappings": [
                {"hostPort": 8080, "containerPort": 80, "protocol": "tcp"},
                {"hostPort": 8080, "containerPort": 81, "protocol": "TCP"}]}),
            "twice",
        ),
        add("portMappings an object", "runtimeConfig", json!({"portMappings": {"hostPort": 8080}}), "portMappings"),
        add("markMasqBit 32", "markMasqBit", json!(32), "markMasqBit"),
        add("markMasqBit negative", "markMasqBit", json!(-1), "markMasqBit"),
        add("markMasqBit a string", "markMasqBit", json!("13"), "markMasqBit"),
        Case::conf(
            "markMasqBit with externalSetMarkChain",
            "ADD",
            &with(&with(&base, "markMasqBit", json!(13)), "externalSetMarkChain", json!("KUBE-MARK-MASQ")),
            INVALID_CONFIG,
        )
        .needle("externalSetMarkChain"),
        add("unknown backend", "backend", json!("ebtables"), "ebtables"),
        add("backend a number", "backend", json!(1), "backend"),
        add("snat a string", "snat", json!("true"), "snat"),
        add("condition adds a target", "conditionsV4", json!(["-j", "ACCEPT"]), "-j"),
        add("condition adds a rule", "conditionsV4", json!(["-d", "10.0.0.0/8\n-A INPUT -j ACCEPT"]), "-d"),
        add(
            "condition match with a target",
            "conditionsV4",
            json!(["-m", "comment", "--comment", "x", "-j", "ACCEPT"]),
            "-j",
        ),
        add("condition with a goto", "conditionsV4", json!(["-s", "10.0.0.0/8", "-g", "KUBE-SERVICES"]), "-g"),
        add("condition with a table", "conditionsV4", json!(["-t", "filter"]), "-t"),
        add("nft condition ending the rule", "conditionsV4", json!(["ip", "daddr", "1.2.3.4", ";", "accept"]), ";"),
        add("nft condition with a verdict", "conditionsV4", json!(["ip", "daddr", "1.2.3.4", "accept"]), "accept"),
        add("nft condition setting the mark", "conditionsV6", json!(["meta", "mark", "set", "1"]), "set"),
        add("condition lone !", "conditionsV4", json!(["!"]), "!"),
        add("condition option without value", "conditionsV4", json!(["-d"]), "-d"),
        add("condition IPv6 address in V4", "conditionsV4", json!(["-d", "fd00::/64"]), "IPv4"),
        add("condition IPv4 address in V6", "conditionsV6", json!(["-s", "10.0.0.0/8"]), "IPv6"),
        add("condition bad interface", "conditionsV4", json!(["-i", "eth0\"; drop"]), "interface"),
        add("condition unknown addrtype", "conditionsV4", json!(["-m", "addrtype", "--dst-type", "EVIL"]), "EVIL"),
        add("conditions a string", "conditionsV4", json!("-d 10.0.0.0/8"), "conditionsV4"),
        Case::conf("missing prevResult", "ADD", &with(&base, "prevResult", Value::Null), INVALID_CONFIG)
            .needle("prevResult"),
        Case::conf(
            "missing prevResult, type a 100 KiB string",
            "ADD",
            &with(&with(&base, "prevResult", Value::Null), "type", json!("p".repeat(100 * 1024))),
            INVALID_CONFIG,
        )
        .needle("prevResult"),
        Case::conf("CHECK missing prevResult", "CHECK", &with(&base, "prevResult", Value::Null), INVALID_CONFIG)
            .needle("prevResult"),
        Case::conf("DEL with bad markMasqBit", "DEL", &with(&base, "markMasqBit", json!(99)), INVALID_CONFIG),
        Case::conf(
            "externalSetMarkChain with nftables",
            "ADD",
            &with(&with(&base, "backend", json!("nftables")), "externalSetMarkChain", json!("KUBE-MARK-MASQ")),
            INVALID_CONFIG,
        ),
    ]);
    cases.extend(gc_cases(&base));
    cases
}

#[test]
fn portmap() {
    let rig = Rig::new();
    let cases = portmap_cases(&rig);
    run_group_then_valid("portmap", "eth0", &rig, cases, &portmap_base(&rig));
}
