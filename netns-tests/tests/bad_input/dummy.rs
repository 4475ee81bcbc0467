//! The bad-input cases of dummy. Where the kernel has no dummy links, a valid config is one more case: the
//! error names the missing support and nothing changes.

use netns_tests::linkrig::kernel_has_kind;

use super::*;

pub(crate) fn dummy_base(rig: &Rig) -> Value {
    json!({
        "cniVersion": "1.0.0",
        "name": NETWORK,
        "type": "dummy",
        "ipam": {"type": "host-local", "dataDir": rig.data_dir(), "subnet": "10.88.0.0/24"}
    })
}

pub(crate) fn dummy_cases(rig: &Rig) -> Vec<Case> {
    let base = dummy_base(rig);
    let add = |name: &str, key: &str, value: Value, needle: &str| {
        Case::conf(name, "ADD", &with(&base, key, value), INVALID_CONFIG).needle(needle)
    };
    let mut cases = common_cases(&base, true);
    cases.extend([
        add("no ipam", "ipam", Value::Null, "IPAM"),
        add("ipam a string", "ipam", json!("host-local"), "ipam"),
        add("ipam without type", "ipam", json!({"subnet": "10.88.0.0/24"}), "type"),
        add("ipam type ../", "ipam", json!({"type": "../../bin/sh"}), "../../bin/sh"),
        add("ipam plugin not found", "ipam", json!({"type": "no-such-ipam"}), "no-such-ipam"),
        Case::conf("CNI_IFNAME already in the pod", "ADD", &base, INTERNAL)
            .env("CNI_IFNAME", Some("eth0"))
            .needle("already exists"),
        Case::conf("CHECK without prevResult", "CHECK", &base, INVALID_CONFIG).needle("prevResult"),
    ]);
    if !kernel_has_kind("dummy") {
        cases.push(Case::conf("kernel without dummy links", "ADD", &base, INTERNAL).needle("CONFIG_DUMMY"));
    }
    cases
}

#[test]
fn dummy() {
    let rig = Rig::new();
    run_group("dummy", "eth5", &rig, dummy_cases(&rig));
}
