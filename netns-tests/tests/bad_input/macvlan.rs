//! The bad-input cases of macvlan (the master is the node's end of the pod's veth).

use super::*;

pub(crate) fn macvlan_base(rig: &Rig) -> Value {
    json!({
        "cniVersion": "1.0.0",
        "name": NETWORK,
        "type": "macvlan",
        "master": HOST_VETH,
        "ipam": {"type": "host-local", "dataDir": rig.data_dir(), "subnet": "10.88.0.0/24"}
    })
}

pub(crate) fn macvlan_cases(rig: &Rig) -> Vec<Case> {
    let base = macvlan_base(rig);
    let add = |name: &str, key: &str, value: Value, needle: &str| {
        Case::conf(name, "ADD", &with(&base, key, value), INVALID_CONFIG).needle(needle)
    };
    let mut cases = common_cases(&base, true);
    cases.extend(link_plugin_cases(&base, rig));
    cases.extend([
        add("mode l3", "mode", json!("l3"), "mode"),
        add("mode a number", "mode", json!(4), "mode"),
        add("mode with newline", "mode", json!("bridge\n"), "mode"),
        add("mac not a MAC", "mac", json!("nope"), "MAC"),
        add("mac multicast", "mac", json!("01:00:5e:00:00:01"), "multicast"),
        add("mac all zero", "mac", json!("00:00:00:00:00:00"), "zero"),
        add("runtimeConfig.mac a number", "runtimeConfig", json!({"mac": 5}), "mac"),
        add("runtimeConfig.mac not a MAC", "runtimeConfig", json!({"mac": "02:00"}), "MAC"),
        add("bcqueuelen negative", "bcqueuelen", json!(-1), "bcqueuelen"),
        add("bcqueuelen beyond u32", "bcqueuelen", json!(1u64 << 33), "bcqueuelen"),
        add("linkInContainer a string", "linkInContainer", json!("yes"), "linkInContainer"),
        Case::conf("CNI_ARGS MAC not a MAC", "ADD", &base, INVALID_CONFIG)
            .env("CNI_ARGS", Some("IgnoreUnknown=1;MAC=zz"))
            .needle("MAC"),
        Case::conf("CNI_ARGS unknown key", "ADD", &base, INVALID_ENV).env("CNI_ARGS", Some("FOO=1")).needle("FOO"),
        Case::conf(
            "master not in the pod with linkInContainer",
            "ADD",
            &with(&base, "linkInContainer", json!(true)),
            INTERNAL,
        )
        .needle(HOST_VETH),
        Case::conf("CHECK without prevResult", "CHECK", &with(&base, "ipam", Value::Null), INVALID_CONFIG)
            .needle("prevResult"),
        Case::conf(
            "CHECK of another mode",
            "CHECK",
            &with(
                &with(&with(&base, "ipam", Value::Null), "mode", json!("vepa")),
                "prevResult",
                rig.prev_result("1.0.0"),
            ),
            INTERNAL,
        )
        .env("CNI_IFNAME", Some("eth0"))
        .needle("macvlan"),
    ]);
    cases
}

/// The cases every plugin with a `master` shares (macvlan, ipvlan, vlan): the master's name and existence,
/// MTU, IPAM, an interface already in the pod, rollback when IPAM refuses after the link was made.
pub(crate) fn link_plugin_cases(base: &Value, rig: &Rig) -> Vec<Case> {
    let add = |name: &str, key: &str, value: Value, needle: &str| {
        Case::conf(name, "ADD", &with(base, key, value), INVALID_CONFIG).needle(needle)
    };
    vec![
        add("master of 16 bytes", "master", json!("abcdefghijklmnop"), "master"),
        add("master ../", "master", json!("../eth0"), "master"),
        add("master with space", "master", json!("eth 0"), "master"),
        add("master with NUL", "master", json!("eth\u{0}"), "master"),
        add("master a number", "master", json!(5), "master"),
        add("mtu negative", "mtu", json!(-1), "mtu"),
        add("mtu a string", "mtu", json!("1500"), "mtu"),
        add("mtu huge", "mtu", json!(1u64 << 40), "mtu"),
        add("mtu above the master's", "mtu", json!(9000), "master MTU"),
        add("ipam without type", "ipam", json!({"subnet": "10.88.0.0/24"}), "type"),
        add("ipam type ../", "ipam", json!({"type": "../../bin/sh"}), "../../bin/sh"),
        add("ipam plugin not found", "ipam", json!({"type": "no-such-ipam"}), "no-such-ipam"),
        add(
            "ipam refuses its config after the link was made",
            "ipam",
            json!({"type": "host-local", "dataDir": rig.data_dir(), "subnet": "10.88.0.0/31"}),
            "too small",
        ),
        Case::conf("master that does not exist", "ADD", &with(base, "master", json!("nosuch0")), INTERNAL)
            .needle("nosuch0"),
        Case::conf("CNI_IFNAME already in the pod", "ADD", base, INTERNAL)
            .env("CNI_IFNAME", Some("eth0"))
            .needle("already exists"),
    ]
}

#[test]
fn macvlan() {
    let rig = Rig::new();
    run_group("macvlan", "eth5", &rig, macvlan_cases(&rig));
    let base = macvlan_base(&rig);
    rig.run_plugin("macvlan", "eth5", &Case::conf("valid", "ADD", &base, 0)).expect_ok();
    rig.run_plugin("macvlan", "eth5", &Case::conf("valid", "DEL", &base, 0)).expect_ok();
}
