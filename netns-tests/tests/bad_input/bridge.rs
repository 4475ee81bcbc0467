//! The bad-input cases of bridge.

use super::*;

pub(crate) fn bridge_base(rig: &Rig) -> Value {
    json!({
        "cniVersion": "1.0.0",
        "name": NETWORK,
        "type": "bridge",
        "bridge": "cbr-bad",
        "isGateway": true,
        "ipMasq": true,
        "ipam": {"type": "host-local", "dataDir": rig.data_dir(), "subnet": "10.89.0.0/24"}
    })
}

pub(crate) fn bridge_cases(rig: &Rig) -> Vec<Case> {
    let base = bridge_base(rig);
    let add = |name: &str, key: &str, value: Value, needle: &str| {
        Case::conf(name, "ADD", &with(&base, key, value), INVALID_CONFIG).needle(needle)
    };
    let mut cases = common_cases(&base, true);
    cases.extend([
        add("ipam without type", "ipam", json!({"subnet": "10.89.0.0/24"}), "type"),
        add("ipam a string", "ipam", json!("host-local"), "ipam"),
        add("ipam type ../", "ipam", json!({"type": "../../bin/sh"}), "../../bin/sh"),
        add("ipam type with NUL", "ipam", json!({"type": "host-local\u{0}"}), "type"),
        add("bridge name of 16 bytes", "bridge", json!("cbr-0123456789ab"), "bridge"),
        add("bridge name ../", "bridge", json!("../cbr0"), "bridge"),
        add("bridge name ..", "bridge", json!(".."), "bridge"),
        add("bridge name with space", "bridge", json!("cbr 0"), "bridge"),
        add("bridge name with newline", "bridge", json!("cbr\n0"), "bridge"),
        add("bridge name with NUL", "bridge", json!("cbr\u{0}"), "bridge"),
        add("bridge name with colon", "bridge", json!("cbr:0"), "bridge"),
        add("bridge name a number", "bridge", json!(0), "bridge"),
        add("mtu 67", "mtu", json!(67), "mtu"),
        add("mtu 65536", "mtu", json!(65536), "mtu"),
        add("mtu negative", "mtu", json!(-1500), "mtu"),
        add("mtu a string", "mtu", json!("1500"), "mtu"),
        add("mtu a 100 KiB string", "mtu", json!("9".repeat(100 * 1024)), "expected i64"),
        add("mtu huge", "mtu", json!(1u64 << 40), "mtu"),
        add("vlan 4095", "vlan", json!(4095), "vlan"),
        add("vlan negative", "vlan", json!(-1), "vlan"),
        add("vlanTrunk minID above maxID", "vlanTrunk", json!([{"minID": 20, "maxID": 10}]), "minID"),
        add("vlanTrunk minID alone", "vlanTrunk", json!([{"minID": 20}]), "maxID"),
        add("vlanTrunk maxID alone", "vlanTrunk", json!([{"maxID": 20}]), "minID"),
        add("vlanTrunk id 0", "vlanTrunk", json!([{"id": 0}]), "trunk"),
        add("vlanTrunk id 5000", "vlanTrunk", json!([{"id": 5000}]), "trunk"),
        add("vlanTrunk not a list", "vlanTrunk", json!({"id": 5}), "vlanTrunk"),
        add("unknown ipMasqBackend", "ipMasqBackend", json!("ebtables"), "ebtables"),
        add("nonMasqueradeCIDRs not a list", "nonMasqueradeCIDRs", json!("10.244.0.0/16"), "nonMasqueradeCIDRs"),
        add(
            "nonMasqueradeCIDRs an object",
            "nonMasqueradeCIDRs",
            json!({"cidr": "10.244.0.0/16"}),
            "nonMasqueradeCIDRs",
        ),
        add("nonMasqueradeCIDRs entry a number", "nonMasqueradeCIDRs", json!([16]), "nonMasqueradeCIDRs"),
        add("nonMasqueradeCIDRs entry without length", "nonMasqueradeCIDRs", json!(["10.244.0.0"]), "10.244.0.0"),
        add("nonMasqueradeCIDRs entry /33", "nonMasqueradeCIDRs", json!(["10.244.0.0/33"]), "10.244.0.0/33"),
        add("nonMasqueradeCIDRs entry /129", "nonMasqueradeCIDRs", json!(["fd00::/129"]), "fd00::/129"),
        add("nonMasqueradeCIDRs entry a name", "nonMasqueradeCIDRs", json!(["cluster"]), "cluster"),
        add(
            "nonMasqueradeCIDRs entry with newline",
            "nonMasqueradeCIDRs",
            json!(["10.0.0.0/8\n-j ACCEPT"]),
            "nonMasqueradeCIDRs",
        ),
        add(
            "nonMasqueradeCIDRs entry a 100 KiB string",
            "nonMasqueradeCIDRs",
            json!(["1".repeat(100 * 1024)]),
            "nonMasqueradeCIDRs",
        ),
        add("nonMasqueradeCIDRs of 257 entries", "nonMasqueradeCIDRs", json!(vec!["10.0.0.0/8"; 257]), "at most"),
        add("isGateway a string", "isGateway", json!("yes"), "isGateway"),
        add("runtimeConfig.mac not a MAC", "runtimeConfig", json!({"mac": "not-a-mac"}), "MAC"),
        add("runtimeConfig.mac multicast", "runtimeConfig", json!({"mac": "01:00:5e:00:00:01"}), "multicast"),
        add("args.cni.mac a number", "args", json!({"cni": {"mac": 5}}), "mac"),
        Case::conf("CNI_ARGS MAC not a MAC", "ADD", &base, INVALID_CONFIG)
            .env("CNI_ARGS", Some("MAC=zz:zz:zz:zz:zz:zz"))
            .needle("MAC"),
        Case::conf("CNI_ARGS unknown key", "ADD", &base, INVALID_ENV).env("CNI_ARGS", Some("FOO=bar")).needle("FOO"),
        Case::conf(
            "hairpin and promisc",
            "ADD",
            &with(&with(&base, "hairpinMode", json!(true)), "promiscMode", json!(true)),
            INVALID_CONFIG,
        ),
        Case::conf("ipMasq without ipam", "ADD", &with(&base, "ipam", Value::Null), INVALID_CONFIG).needle("ipam"),
        Case::conf(
            "disableContainerInterface with ipam",
            "ADD",
            &with(&base, "disableContainerInterface", json!(true)),
            INVALID_CONFIG,
        ),
        Case::conf(
            "a non-bridge link has the bridge name",
            "ADD",
            &with(&base, "bridge", json!(HOST_VETH)),
            INVALID_CONFIG,
        )
        .needle("not a bridge"),
        Case::conf("CNI_IFNAME already in the pod", "ADD", &base, INTERNAL)
            .env("CNI_IFNAME", Some("eth0"))
            .needle("already exists"),
        // Each with its own bridge name: a bridge left behind by one must not hide one left by the other.
        Case::conf(
            "ipam plugin not found",
            "ADD",
            &with(&with(&base, "ipam", json!({"type": "no-such-ipam"})), "bridge", json!("cbr-bad1")),
            INVALID_CONFIG,
        )
        .needle("no-such-ipam"),
        Case::conf(
            "ipam refuses its config",
            "ADD",
            &with(
                &with(
                    &base,
                    "ipam",
                    json!({"type": "host-local", "dataDir": rig.data_dir(), "subnet": "10.89.0.0/31"}),
                ),
                "bridge",
                json!("cbr-bad2"),
            ),
            INVALID_CONFIG,
        )
        .needle("too small"),
        Case::conf(
            "CHECK with bad mtu",
            "CHECK",
            &with(&with(&base, "mtu", json!(1)), "prevResult", rig.prev_result("1.0.0")),
            INVALID_CONFIG,
        ),
        status_with_bad_ipam(&base),
    ]);
    cases
}

#[test]
fn bridge() {
    let rig = Rig::new();
    let cases = bridge_cases(&rig);
    run_group_then_valid("bridge", "eth9", &rig, cases, &bridge_base(&rig));
}
