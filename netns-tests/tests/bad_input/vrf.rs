//! The bad-input cases of vrf. On a kernel without VRF support the valid config is itself a case: a clear
//! error naming `CONFIG_NET_VRF`, the pod unchanged.

use netns_tests::linkrig::kernel_has_kind;

use super::*;

pub(crate) fn vrf_base(rig: &Rig) -> Value {
    json!({"cniVersion": "1.0.0", "name": NETWORK, "type": "vrf", "vrfname": "blue",
        "prevResult": rig.prev_result("1.0.0")})
}

pub(crate) fn vrf_cases(rig: &Rig) -> Vec<Case> {
    let base = vrf_base(rig);
    let add = |name: &str, key: &str, value: Value, needle: &str| {
        Case::conf(name, "ADD", &with(&base, key, value), INVALID_CONFIG).needle(needle)
    };
    let mut cases = common_cases(&base, true);
    cases.extend(prev_result_cases(&base));
    cases.extend([
        add("missing prevResult", "prevResult", Value::Null, "prevResult"),
        add("vrfname missing", "vrfname", Value::Null, "vrf name"),
        add("vrfname with a slash", "vrfname", json!("a/b"), "vrfname"),
        add("vrfname of 16 bytes", "vrfname", json!("abcdefghijklmnop"), "vrfname"),
        add("vrfname a number", "vrfname", json!(1), "vrfname"),
        add("table negative", "table", json!(-1), "table"),
        add("table a string", "table", json!("10"), "table"),
        Case::conf("vrfname of a veth", "ADD", &with(&base, "vrfname", json!("eth1")), INTERNAL).needle("not a VRF"),
        Case::conf("CHECK without the VRF", "CHECK", &base, INTERNAL).needle("not found"),
    ]);
    if !kernel_has_kind("vrf") {
        cases.push(Case::conf("no VRF in this kernel", "ADD", &base, INTERNAL).needle("CONFIG_NET_VRF"));
    }
    cases
}

#[test]
fn vrf() {
    let rig = Rig::new();
    let cases = vrf_cases(&rig);
    run_group("vrf", "eth0", &rig, cases);
    rig.run_plugin("vrf", "eth0", &Case::conf("valid", "DEL", &vrf_base(&rig), 0)).expect_ok();
}
