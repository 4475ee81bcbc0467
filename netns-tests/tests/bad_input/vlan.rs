//! The bad-input cases of vlan. Where the kernel has no 802.1Q, a valid config is one more case: the error
//! names the missing support and nothing changes.

use netns_tests::linkrig::kernel_has_kind;

use super::macvlan::link_plugin_cases;
use super::*;

pub(crate) fn vlan_base(rig: &Rig) -> Value {
    json!({
        "cniVersion": "1.0.0",
        "name": NETWORK,
        "type": "vlan",
        "master": HOST_VETH,
        "vlanId": 100,
        "ipam": {"type": "host-local", "dataDir": rig.data_dir(), "subnet": "10.88.0.0/24"}
    })
}

pub(crate) fn vlan_cases(rig: &Rig) -> Vec<Case> {
    let base = vlan_base(rig);
    let add = |name: &str, key: &str, value: Value, needle: &str| {
        Case::conf(name, "ADD", &with(&base, key, value), INVALID_CONFIG).needle(needle)
    };
    let mut cases = common_cases(&base, true);
    cases.extend(link_plugin_cases(&base, rig).into_iter().filter(|c| !c.name.contains("after the link")));
    cases.extend([
        add("no master", "master", Value::Null, "master"),
        add("vlanId 4095", "vlanId", json!(4095), "VLAN ID"),
        add("vlanId negative", "vlanId", json!(-1), "VLAN ID"),
        add("vlanId a string", "vlanId", json!("100"), "vlanId"),
        add("no ipam", "ipam", Value::Null, "ipam"),
    ]);
    if !kernel_has_kind("vlan") {
        cases.push(Case::conf("kernel without 8021q", "ADD", &base, INTERNAL).needle("CONFIG_VLAN_8021Q"));
    }
    cases
}

#[test]
fn vlan() {
    let rig = Rig::new();
    run_group("vlan", "eth5", &rig, vlan_cases(&rig));
}
