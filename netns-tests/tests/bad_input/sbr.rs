//! The bad-input cases of sbr.

use super::*;

pub(crate) fn sbr_base(rig: &Rig) -> Value {
    json!({"cniVersion": "1.0.0", "name": NETWORK, "type": "sbr", "prevResult": rig.prev_result("1.0.0")})
}

pub(crate) fn sbr_cases(rig: &Rig) -> Vec<Case> {
    let base = sbr_base(rig);
    let add = |name: &str, key: &str, value: Value, needle: &str| {
        Case::conf(name, "ADD", &with(&base, key, value), INVALID_CONFIG).needle(needle)
    };
    let mut cases = common_cases(&base, true);
    cases.extend(prev_result_cases(&base));
    cases.extend([
        add("missing prevResult", "prevResult", Value::Null, "chained"),
        add("prevResult without addresses", "prevResult/ips", json!([]), "No IP addresses"),
        add("table 0", "table", json!(0), "table"),
        add("table negative", "table", json!(-1), "table"),
        add("table beyond u32", "table", json!(1u64 << 32), "table"),
        add("table a string", "table", json!("100"), "table"),
        Case::conf("pod interface missing", "ADD", &base, INTERNAL).env("CNI_IFNAME", Some("eth7")).needle("eth7"),
        // After the rule: it is removed again.
        Case::conf(
            "gateway the pod cannot reach",
            "ADD",
            &with(
                &base,
                "prevResult/ips",
                json!([{"address": "10.77.0.2/24", "gateway": "10.98.0.1", "interface": 1}]),
            ),
            INTERNAL,
        )
        .needle("route"),
    ]);
    cases
}

#[test]
fn sbr() {
    let rig = Rig::new();
    let cases = sbr_cases(&rig);
    run_group("sbr", "eth0", &rig, cases);
    let base = sbr_base(&rig);
    rig.run_plugin("sbr", "eth0", &Case::conf("valid", "ADD", &base, 0)).expect_ok();
    rig.run_plugin("sbr", "eth0", &Case::conf("valid", "DEL", &base, 0)).expect_ok();
}
