//! The bad-input cases of ptp.

use super::*;

pub(crate) fn ptp_base(rig: &Rig) -> Value {
    json!({
        "cniVersion": "1.0.0",
        "name": NETWORK,
        "type": "ptp",
        "ipMasq": true,
        "ipam": {"type": "host-local", "dataDir": rig.data_dir(), "subnet": "10.87.0.0/24"}
    })
}

pub(crate) fn ptp_cases(rig: &Rig) -> Vec<Case> {
    let base = ptp_base(rig);
    let add = |name: &str, key: &str, value: Value, needle: &str| {
        Case::conf(name, "ADD", &with(&base, key, value), INVALID_CONFIG).needle(needle)
    };
    let mut cases = common_cases(&base, true);
    cases.extend([
        add("no ipam", "ipam", Value::Null, "ipam"),
        add("ipam empty", "ipam", json!({}), "ipam"),
        add("ipam without type", "ipam", json!({"subnet": "10.87.0.0/24"}), "type"),
        add("ipam type ../", "ipam", json!({"type": "../../bin/sh"}), "../../bin/sh"),
        add("ipam plugin not found", "ipam", json!({"type": "no-such-ipam"}), "no-such-ipam"),
        add(
            "ipam refuses its config",
            "ipam",
            json!({"type": "host-local", "dataDir": rig.data_dir(), "subnet": "10.87.0.0/31"}),
            "too small",
        ),
        add("mtu 67", "mtu", json!(67), "mtu"),
        add("mtu negative", "mtu", json!(-1), "mtu"),
        add("mtu a string", "mtu", json!("1500"), "mtu"),
        add("mtu 65536", "mtu", json!(65536), "mtu"),
        add("unknown ipMasqBackend", "ipMasqBackend", json!("ebtables"), "ebtables"),
        add("ipMasqBackend a number", "ipMasqBackend", json!(1), "ipMasqBackend"),
        add("ipMasq a string", "ipMasq", json!("yes"), "ipMasq"),
        Case::conf("CNI_IFNAME already in the pod", "ADD", &base, INTERNAL)
            .env("CNI_IFNAME", Some("eth0"))
            .needle("already exists"),
        status_with_bad_ipam(&base),
    ]);
    cases
}

#[test]
fn ptp() {
    let rig = Rig::new();
    run_group("ptp", "eth6", &rig, ptp_cases(&rig));
    let base = ptp_base(&rig);
    rig.run_plugin("ptp", "eth6", &Case::conf("valid", "ADD", &base, 0)).expect_ok();
    rig.run_plugin("ptp", "eth6", &Case::conf("valid", "DEL", &base, 0)).expect_ok();
}
