//! `CNI_ARGS` parsing: the plugins' (`parse_cni_args`, `IgnoreUnknown`, known keys) and the runner's
//! (`cnitool::libcni::parse_args`), and message truncation of hostile values.
#![no_main]

use cni_fuzz::check_error;
use cnicore::spec::{parse_cni_args, truncate_for_msg, Version};
use cnitool::libcni::parse_args;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(raw) = std::str::from_utf8(data) else {
        return;
    };
    match parse_cni_args(raw) {
        Err(e) => check_error(&e, Version::LATEST),
        Ok(args) => {
            for (k, v) in &args.0 {
                assert!(!k.is_empty() && !k.contains([';', '=']), "key {k:?}");
                assert!(!v.contains([';', '=']), "value {v:?}");
            }
            // Written back as K=V;K=V it parses to the same pairs.
            let joined: Vec<String> = args.0.iter().map(|(k, v)| format!("{k}={v}")).collect();
            assert_eq!(parse_cni_args(&joined.join(";")).ok().as_ref(), Some(&args));
            let _ = args.ignore_unknown();
            if let Err(e) = args.check_known(&["IP", "MAC"]) {
                check_error(&e, Version::LATEST);
            }
        }
    }
    match parse_args(raw) {
        Err(e) => assert!(!e.msg.is_empty()),
        Ok(pairs) => {
            for (k, v) in &pairs {
                assert!(
                    !k.is_empty()
                        && !v.is_empty()
                        && !k.contains([';', '='])
                        && !v.contains([';', '='])
                );
            }
        }
    }
    let cut = truncate_for_msg(raw);
    assert!(
        cut.len() <= 80 + '…'.len_utf8(),
        "truncated to {} bytes",
        cut.len()
    );
    assert!(raw.starts_with(cut.trim_end_matches('…')));
});
