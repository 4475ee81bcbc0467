//! Properties every fuzz target checks, shared so that each target states them the same way.

use cnicore::spec::{codes, CniResult, Error, Version, SUPPORTED_VERSIONS};
use serde_json::Value;

/// Every version this suite speaks, parsed.
pub fn versions() -> impl Iterator<Item = Version> {
    SUPPORTED_VERSIONS
        .iter()
        .map(|v| Version::parse(v).expect("SUPPORTED_VERSIONS parse"))
}

/// The codes a plugin may answer with: the spec's reserved ones and the reference's 999.
const KNOWN_CODES: &[u32] = &[
    codes::INCOMPATIBLE_VERSION,
    codes::UNSUPPORTED_FIELD,
    codes::UNKNOWN_CONTAINER,
    codes::INVALID_ENV,
    codes::IO,
    codes::DECODE,
    codes::INVALID_CONFIG,
    codes::TRY_AGAIN,
    codes::NOT_AVAILABLE,
    codes::LIMITED_CONNECTIVITY,
    codes::INTERNAL,
];

/// Longest error message accepted: hostile input must be cut (see `truncate_for_msg`), never echoed whole.
pub const MAX_MSG: usize = 2048;

/// A CNI error a person can act on: a known code, a short non-empty message, and an error object that renders.
pub fn check_error(e: &Error, version: Version) {
    assert!(
        KNOWN_CODES.contains(&e.code),
        "unknown error code {}: {e:?}",
        e.code
    );
    assert!(!e.msg.trim().is_empty(), "empty error message: {e:?}");
    assert!(
        e.msg.len() <= MAX_MSG,
        "error message of {} bytes: {:?}",
        e.msg.len(),
        &e.msg[..200]
    );
    let object = e.to_json(&version.to_string());
    let text = serde_json::to_string(&object).expect("error object serialises");
    let back: Value = serde_json::from_str(&text).expect("error object parses");
    assert_eq!(
        Error::from_json(&back).as_ref(),
        Some(e),
        "error object round trip"
    );
}

/// A result rendered in `version` must be one that this library reads back, and reading it back and rendering
/// it again must give the same JSON (the conversion is a fixed point after one step).
pub fn check_rendered_result(rendered: &Value, version: Version) {
    assert_eq!(
        rendered["cniVersion"],
        version.to_string(),
        "result not in the asked version: {rendered}"
    );
    let text = serde_json::to_string(rendered).expect("result serialises");
    let reparsed: Value = serde_json::from_str(&text).expect("result text parses");
    let back = CniResult::from_json(&reparsed)
        .unwrap_or_else(|e| panic!("own {version} result unreadable: {e:?}: {text}"));
    let again = back
        .to_json(version)
        .unwrap_or_else(|e| panic!("re-rendering {version} failed: {e:?}: {text}"));
    assert_eq!(
        &again, rendered,
        "render(parse(render(r))) != render(r) in {version}"
    );
}
