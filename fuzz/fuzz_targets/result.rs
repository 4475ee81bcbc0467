//! Results of every version: parsing (`CniResult::from_json`), rendering in every version (`to_json`) and
//! conversion (`CniResult::convert`, what the runner and chained plugins do with `prevResult`), and the
//! error objects plugins print (`Error::from_json`).
#![no_main]

use cni_fuzz::{check_error, check_rendered_result, versions};
use cnicore::spec::{codes, CniResult, Error, Version};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

fuzz_target!(|data: &[u8]| {
    let Ok(value) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    let _ = Error::from_json(&value);
    let parsed = CniResult::from_json(&value);
    if let Err(e) = &parsed {
        check_error(e, Version::LATEST);
    }
    for version in versions() {
        let converted = CniResult::convert(&value, version);
        match (&parsed, &converted) {
            (Ok(result), Ok(json)) => {
                assert_eq!(
                    result.to_json(version).as_ref().ok(),
                    Some(json),
                    "convert != parse + render"
                );
                check_rendered_result(json, version);
            }
            (Ok(result), Err(e)) => {
                check_error(e, version);
                // Only the legacy versions can refuse a parsed result: one without any address.
                assert!(
                    version.legacy_result() && result.ips.is_empty(),
                    "{version} refused: {e:?}"
                );
                assert_eq!(e.code, codes::INCOMPATIBLE_VERSION);
            }
            (Err(_), Ok(json)) => panic!("convert accepted what from_json refused: {json}"),
            (Err(_), Err(e)) => check_error(e, version),
        }
    }
});
