//! The bad-input cases of loopback.

use super::*;

pub(crate) fn loopback_base() -> Value {
    json!({"cniVersion": "1.0.0", "name": NETWORK, "type": "loopback"})
}

pub(crate) fn loopback_cases() -> Vec<Case> {
    let base = loopback_base();
    let mut cases = common_cases(&base, true);
    cases.extend(prev_result_cases(&base));
    cases
}

#[test]
fn loopback() {
    let rig = Rig::new();
    run_group("loopback", "lo", &rig, loopback_cases());
    // The base config is valid: the cases failed for their own reason.
    let valid = Case::conf("valid", "ADD", &loopback_base(), 0);
    rig.run_plugin("loopback", "lo", &valid).expect_ok();
}
