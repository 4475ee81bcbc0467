//! The bad-input cases of bandwidth.

use super::*;

pub(crate) fn bandwidth_base(rig: &Rig) -> Value {
    json!({
        "cniVersion": "1.0.0",
        "name": NETWORK,
        "type": "bandwidth",
        "ingressRate": 1_000_000,
        "ingressBurst": 100_000,
        "egressRate": 2_000_000,
        "egressBurst": 200_000,
        "prevResult": rig.prev_result("1.0.0")
    })
}

pub(crate) fn bandwidth_cases(rig: &Rig) -> Vec<Case> {
    let base = bandwidth_base(rig);
    let add = |name: &str, key: &str, value: Value, needle: &str| {
        Case::conf(name, "ADD", &with(&base, key, value), INVALID_CONFIG).needle(needle)
    };
    let only = |fields: Value| {
        let mut conf = base.clone();
        for key in ["ingressRate", "ingressBurst", "egressRate", "egressBurst"] {
            if let Some(o) = conf.as_object_mut() {
                o.remove(key);
            }
        }
        for (k, v) in fields.as_object().expect("object") {
            conf[k] = v.clone();
        }
        conf
    };
    let limits =
        |name: &str, fields: Value, needle: &str| Case::conf(name, "ADD", &only(fields), INVALID_CONFIG).needle(needle);
    let mut cases = common_cases(&base, true);
    cases.extend(prev_result_cases(&base));
    cases.extend([
        limits("ingressRate without burst", json!({"ingressRate": 1_000_000}), "burst"),
        limits("ingressBurst without rate", json!({"ingressBurst": 1_000_000}), "rate"),
        limits("egressRate without burst", json!({"egressRate": 1_000_000}), "burst"),
        limits("egressBurst without rate", json!({"egressBurst": 1_000_000}), "rate"),
        limits("ingressRate 0 with a burst", json!({"ingressRate": 0, "ingressBurst": 100}), "rate"),
        limits("rate below 8 bit/s", json!({"egressRate": 4, "egressBurst": 8000}), "rate"),
        limits("burst below 8 bits", json!({"egressRate": 8000, "egressBurst": 4}), "burst"),
        limits("burst over 4 GB", json!({"ingressRate": 8000, "ingressBurst": 34_359_738_368u64}), "4GB"),
        limits("rate u64 max", json!({"ingressRate": u64::MAX, "ingressBurst": 8000}), "ingress"),
        limits("rate negative", json!({"ingressRate": -1, "ingressBurst": 8000}), "ingressRate"),
        limits("rate a float", json!({"ingressRate": 1.5e6, "ingressBurst": 8000}), "ingressRate"),
        limits("rate a string", json!({"egressRate": "1M", "egressBurst": 8000}), "egressRate"),
        limits("rate beyond u64", json!({"egressRate": 1e30, "egressBurst": 8000}), "egressRate"),
        // The reference's messages, word for word.
        limits("ingressRate 8000 alone", json!({"ingressRate": 8000}), "burst must also be set"),
        limits("ingressBurst alone", json!({"ingressBurst": 80_000}), "rate must also be set"),
        limits("egressBurst 0 with a rate", json!({"egressRate": 8000, "egressBurst": 0}), "burst must also be set"),
        limits("egressRate 0 with a burst", json!({"egressRate": 0, "egressBurst": 80_000}), "rate must also be set"),
        limits("ingressRate 7", json!({"ingressRate": 7, "ingressBurst": 80_000}), "at least 8 bits per second"),
        limits("egressBurst 7", json!({"egressRate": 8000, "egressBurst": 7}), "at least 8 bits"),
        limits("ingressBurst of 4 GiB", json!({"ingressRate": 8000, "ingressBurst": 34_359_738_360u64}), "more than 4GB"),
        limits("egressRate u64 max", json!({"egressRate": u64::MAX, "egressBurst": 80_000}), "exceeds 4GB"),
        limits("ingressRate negative", json!({"ingressRate": -8000, "ingressBurst": 80_000}), "ingressRate"),
        limits("ingressRate a string", json!({"ingressRate": "1M", "ingressBurst": 80_000}), "ingressRate"),
        limits("ingressRate a float", json!({"ingressRate": 1.5e6, "ingressBurst": 80_000}), "ingressRate"),
        Case::conf(
            "runtimeConfig.bandwidth a list",
            "ADD",
            &with(&only(json!({})), "runtimeConfig", json!({"bandwidth": [1000]})),
            INVALID_CONFIG,
        )
        .needle("bandwidth"),
        Case::conf(
            "runtimeConfig.bandwidth rate without burst",
            "ADD",
            &with(&only(json!({})), "runtimeConfig", json!({"bandwidth": {"egressRate": 8000}})),
            INVALID_CONFIG,
        )
        .needle("burst must also be set"),
        add("missing prevResult", "prevResult", Value::Null, "prevResult"),
        Case::conf(
            "prevResult without interfaces",
            "ADD",
            &with(&base, "prevResult", json!({"cniVersion": "1.0.0", "ips": [{"address": "10.77.0.2/24"}]})),
            INVALID_CONFIG,
        )
        .needle("interfaces"),
        Case::conf("pod interface missing", "ADD", &base, INTERNAL).env("CNI_IFNAME", Some("eth7")).needle("eth7"),
        Case::conf("pod interface's peer not on the host", "ADD", &base, INTERNAL).env("CNI_IFNAME", Some("eth1")).needle("host"),
        Case::conf(
            "host veth not in prevResult",
            "ADD",
            &with(&base, "prevResult", json!({"cniVersion": "1.0.0", "interfaces": [{"name": "other0"}, {"name": "eth0", "sandbox": rig.pod.path}], "ips": []})),
            INTERNAL,
        )
        .needle("no veth peer"),
        Case::conf(
            "prevResult with only the pod interface",
            "ADD",
            &with(&base, "prevResult", json!({"cniVersion": "1.0.0", "interfaces": [{"name": "eth0", "sandbox": rig.pod.path}], "ips": [{"address": "10.77.0.2/24", "interface": 0}]})),
            INTERNAL,
        )
        .needle("no veth peer"),
        Case::conf("CHECK with bad limits", "CHECK", &only(json!({"ingressRate": 5})), INVALID_CONFIG).needle("burst"),
    ]);
    cases
}

#[test]
fn bandwidth() {
    let rig = Rig::new();
    let cases = bandwidth_cases(&rig);
    run_group_then_valid("bandwidth", "eth0", &rig, cases, &bandwidth_base(&rig));
}
