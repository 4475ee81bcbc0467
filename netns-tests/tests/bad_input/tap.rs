//! The bad-input cases of tap.

use super::*;

pub(crate) fn tap_base() -> Value {
    json!({"cniVersion": "1.0.0", "name": NETWORK, "type": "tap", "multiQueue": true, "mtu": 1400,
        "ipam": {"type": "static", "addresses": [{"address": "10.78.0.5/24"}]}})
}

pub(crate) fn tap_cases() -> Vec<Case> {
    let base = tap_base();
    let add = |name: &str, key: &str, value: Value, needle: &str| {
        Case::conf(name, "ADD", &with(&base, key, value), INVALID_CONFIG).needle(needle)
    };
    let mut cases = common_cases(&base, true);
    // Its route case fails after the interface is made: the tap is deleted again.
    cases.extend(pod_interface_cases(&base));
    cases.extend([
        add("mtu below 68", "mtu", json!(20), "mtu"),
        add("mtu above the tap's maximum", "mtu", json!(70000), "mtu"),
        add("mtu a string", "mtu", json!("1400"), "mtu"),
        add("mac not a MAC", "mac", json!("nope"), "MAC"),
        add("mac multicast", "mac", json!("01:00:5e:00:00:01"), "multicast"),
        add("runtimeConfig.mac not a MAC", "runtimeConfig", json!({"mac": "x"}), "MAC"),
        add("owner negative", "owner", json!(-1), "owner"),
        add("group beyond u32", "group", json!(1u64 << 33), "group"),
        add("multiQueue a string", "multiQueue", json!("yes"), "multiQueue"),
        add("args a number", "args", json!(3), "args"),
        add("bridge with a slash", "bridge", json!("br/0"), "bridge"),
        add("bridge missing in the pod", "bridge", json!("nobr0"), "nobr0"),
        add("bridge that is a veth", "bridge", json!("eth1"), "not a bridge"),
        Case::conf("CNI_ARGS MAC not a MAC", "ADD", &base, INVALID_CONFIG)
            .env("CNI_ARGS", Some("IgnoreUnknown=1;MAC=zz"))
            .needle("MAC"),
        Case::conf("CNI_ARGS unknown key", "ADD", &base, INVALID_ENV).env("CNI_ARGS", Some("FOO=1")).needle("FOO"),
    ]);
    cases
}

#[test]
fn tap() {
    let rig = Rig::new();
    run_group("tap", "tap0", &rig, tap_cases());
    let base = tap_base();
    rig.run_plugin("tap", "tap0", &Case::conf("valid", "ADD", &base, 0)).expect_ok();
    rig.run_plugin("tap", "tap0", &Case::conf("valid", "DEL", &base, 0)).expect_ok();
}
