//! The bad-input cases of ipvlan. Where the kernel has no ipvlan, a valid config is one more case: the error
//! names the missing support and nothing changes.

use netns_tests::linkrig::kernel_has_kind;

use super::macvlan::link_plugin_cases;
use super::*;

pub(crate) fn ipvlan_base(rig: &Rig) -> Value {
    json!({
        "cniVersion": "1.0.0",
        "name": NETWORK,
        "type": "ipvlan",
        "master": HOST_VETH,
        "mode": "l3",
        "ipam": {"type": "host-local", "dataDir": rig.data_dir(), "subnet": "10.88.0.0/24"}
    })
}

pub(crate) fn ipvlan_cases(rig: &Rig) -> Vec<Case> {
    let base = ipvlan_base(rig);
    let add = |name: &str, key: &str, value: Value, needle: &str| {
        Case::conf(name, "ADD", &with(&base, key, value), INVALID_CONFIG).needle(needle)
    };
    let mut cases = common_cases(&base, true);
    cases.extend(link_plugin_cases(&base, rig).into_iter().filter(|c| {
        !c.name.contains("master MTU") && !c.name.contains("after the link") && !c.name.contains("above the master")
    }));
    cases.extend([
        add("mode bridge", "mode", json!("bridge"), "mode"),
        add("mode a number", "mode", json!(1), "mode"),
        add("no ipam and no prevResult", "ipam", Value::Null, "prevResult"),
        Case::conf(
            "chained without master and prevResult of two interfaces",
            "ADD",
            &with(
                &with(&with(&base, "master", Value::Null), "ipam", Value::Null),
                "prevResult",
                rig.prev_result("1.0.0"),
            ),
            INVALID_CONFIG,
        )
        .needle("single named interface"),
    ]);
    if !kernel_has_kind("ipvlan") {
        cases.push(Case::conf("kernel without ipvlan", "ADD", &base, INTERNAL).needle("CONFIG_IPVLAN"));
    }
    cases
}

#[test]
fn ipvlan() {
    let rig = Rig::new();
    run_group("ipvlan", "eth5", &rig, ipvlan_cases(&rig));
}
