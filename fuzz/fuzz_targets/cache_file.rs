//! The runner's on-disk inputs: result cache files (`CachedAttachment::parse`, libcni's `cniCacheV1`, written
//! by us or by any libcni runtime), the config they embed in base64, and config lists and single configs from
//! the conf dir (`ConfList::from_bytes`, `ConfList::from_single_conf`).
#![no_main]

use cnicore::spec::{gojson, validate_container_id, validate_ifname, validate_network_name};
use cnitool::base64;
use cnitool::libcni::{CachedAttachment, CniConfig, ConfList};
use libfuzzer_sys::fuzz_target;
use std::path::Path;

/// What a parsed list guarantees to the code that runs it. It may have no plugins: as in libcni 1.3, they can
/// come from the network's directory, and `load_conf_list` refuses a list that ends up with none.
fn check_list(list: &ConfList) {
    validate_network_name(&list.name).expect("a loaded list has a valid name");
    for plugin in &list.plugins {
        let t = gojson::member(plugin, "type").and_then(|t| t.as_str()).unwrap_or("");
        assert!(!t.is_empty(), "a loaded plugin has a type");
    }
}

fuzz_target!(|data: &[u8]| {
    if let Some(cached) = CachedAttachment::parse(data) {
        assert!(
            !cached.network.is_empty()
                && !cached.rt.container_id.is_empty()
                && !cached.rt.ifname.is_empty()
        );
        // GC deletes with the config the cache holds: it must load as a list or be ignored.
        if let Some(Ok(list)) = cached.config.as_deref().map(ConfList::from_bytes) {
            check_list(&list);
        }
        // The cache path of an attachment that passes the runner's checks stays in the results directory.
        let valid = validate_network_name(&cached.network).is_ok()
            && validate_container_id(&cached.rt.container_id).is_ok()
            && validate_ifname(&cached.rt.ifname).is_ok();
        if valid {
            let cni = CniConfig {
                path: vec![],
                cache_dir: "/cache".into(),
            };
            let path = cni.cache_path(&cached.network, &cached.rt);
            assert_eq!(path.parent(), Some(Path::new("/cache/results")), "{path:?}");
        }
    }
    for loaded in [ConfList::from_bytes(data), ConfList::from_single_conf(data)] {
        match loaded {
            Ok(list) => check_list(&list),
            Err(e) => assert!(!e.msg.is_empty()),
        }
    }
    if let Ok(text) = std::str::from_utf8(data) {
        if let Some(bytes) = base64::decode(text) {
            let _ = base64::encode(&bytes);
        }
    }
    assert_eq!(
        base64::decode(&base64::encode(data)).as_deref(),
        Some(data),
        "base64 round trip"
    );
});
