//! The bad-input cases of firewall.

use super::*;

pub(crate) fn firewall_base(rig: &Rig) -> Value {
    json!({
        "cniVersion": "1.0.0",
        "name": NETWORK,
        "type": "firewall",
        // Explicit: "" would look for firewalld on the machine's system bus, which tests never touch.
        "backend": "iptables",
        "dataDir": rig.state.join("firewall"),
        "prevResult": rig.prev_result("1.0.0")
    })
}

pub(crate) fn firewall_cases(rig: &Rig) -> Vec<Case> {
    let base = firewall_base(rig);
    let add = |name: &str, key: &str, value: Value, needle: &str| {
        Case::conf(name, "ADD", &with(&base, key, value), INVALID_CONFIG).needle(needle)
    };
    let same_bridge = with(&base, "ingressPolicy", json!("same-bridge"));
    let bridge_named = |name: &str| {
        let mut conf = same_bridge.clone();
        conf["prevResult"]["interfaces"][0]["name"] = json!(name);
        conf
    };
    let mut cases = common_cases(&base, false);
    cases.extend(prev_result_cases(&base));
    cases.extend(chain_name_cases(&base, "iptablesAdminChainName"));
    cases.extend([
        add("unknown backend", "backend", json!("ipfw"), "ipfw"),
        add("backend a number", "backend", json!(1), "backend"),
        add("unknown ingressPolicy", "ingressPolicy", json!("closed"), "closed"),
        add("ingressPolicy a list", "ingressPolicy", json!(["same-bridge"]), "ingressPolicy"),
        add("firewalldZone with NUL", "firewalldZone", json!("a\u{0}b"), "firewalldZone"),
        add("firewalldZone a number", "firewalldZone", json!(7), "firewalldZone"),
        add("dataDir relative", "dataDir", json!("var/lib/cni"), "dataDir"),
        Case::conf(
            "same-bridge, bridge name injection",
            "ADD",
            &bridge_named("br0\n-A INPUT -j ACCEPT"),
            INVALID_CONFIG,
        )
        .needle("bridge name"),
        Case::conf("same-bridge, bridge name with quote", "ADD", &bridge_named("br\"0"), INVALID_CONFIG)
            .needle("bridge name"),
        Case::conf("same-bridge, bridge name of 16 bytes", "ADD", &bridge_named(&"b".repeat(16)), INVALID_CONFIG)
            .needle("bridge name"),
        Case::conf("same-bridge, empty bridge name", "ADD", &bridge_named(""), INVALID_CONFIG).needle("same-bridge"),
        Case::conf(
            "isolated, bridge name injection",
            "ADD",
            &with(&bridge_named("br0 -j ACCEPT"), "ingressPolicy", json!("isolated")),
            INVALID_CONFIG,
        )
        .needle("bridge name"),
        Case::conf(
            "isolated, empty bridge name",
            "ADD",
            &with(&bridge_named(""), "ingressPolicy", json!("isolated")),
            INVALID_CONFIG,
        )
        .needle("isolated"),
        Case::conf("missing prevResult", "ADD", &with(&base, "prevResult", Value::Null), INVALID_CONFIG)
            .needle("prevResult"),
        Case::conf("CHECK missing prevResult", "CHECK", &with(&base, "prevResult", Value::Null), INVALID_CONFIG)
            .needle("prevResult"),
        Case::conf("DEL with unknown backend", "DEL", &with(&base, "backend", json!("ipfw")), INVALID_CONFIG),
    ]);
    cases.extend(gc_cases(&base));
    cases
}

#[test]
fn firewall() {
    let rig = Rig::new();
    let cases = firewall_cases(&rig);
    run_group_then_valid("firewall", "eth0", &rig, cases, &firewall_base(&rig));
}
