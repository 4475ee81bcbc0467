//! The plugin's configuration: rates and bursts from the config itself or from `runtimeConfig.bandwidth`
//! (the `bandwidth` capability, fed by the Kubernetes ingress/egress-bandwidth annotations).

use cnicore::spec::{Context, Error, Result};
use cnicore::tc::Tbf;
use serde::Deserialize;
use serde_json::Value;

/// One set of limits, as in the config and in `runtimeConfig.bandwidth`: bits per second and bits.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct BandwidthEntry {
    pub ingress_rate: u64,
    pub ingress_burst: u64,
    pub egress_rate: u64,
    pub egress_burst: u64,
    /// `shapedSubnets` / `unshapedSubnets` of reference v1.5 (HTB based, reverted in v1.6): ignored with a
    /// warning, as v1.6 to v1.9 ignore them (there the whole pod traffic is shaped).
    pub subnets: bool,
}

/// An entry as written, read with Go's key matching; values are checked one by one so that a bad one is
/// named with what it should be.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawEntry {
    #[serde(default)]
    ingress_rate: Option<Value>,
    #[serde(default)]
    ingress_burst: Option<Value>,
    #[serde(default)]
    egress_rate: Option<Value>,
    #[serde(default)]
    egress_burst: Option<Value>,
    #[serde(default)]
    unshaped_subnets: Option<Value>,
    #[serde(default)]
    shaped_subnets: Option<Value>,
}

/// `runtimeConfig`, for the `bandwidth` capability.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawConf {
    #[serde(default)]
    runtime_config: Option<RawRuntimeConfig>,
}

#[derive(Debug, Default, Deserialize)]
struct RawRuntimeConfig {
    #[serde(default)]
    bandwidth: Option<RawEntry>,
}

impl RawEntry {
    /// The reference embeds the entry in its config as a pointer, allocated as soon as one of its fields appears
    /// (v1.6 to v1.9 have no subnet fields: those alone do not make an entry).
    fn is_present(&self) -> bool {
        [&self.ingress_rate, &self.ingress_burst, &self.egress_rate, &self.egress_burst]
            .into_iter()
            .any(Option::is_some)
    }

    fn has_subnets(&self) -> bool {
        [&self.unshaped_subnets, &self.shaped_subnets].into_iter().flatten().any(|v| !v.is_null())
    }
}

impl BandwidthEntry {
    /// Checks the entry's fields; a field that is not a non-negative integer is an error naming it.
    fn from_raw(raw: RawEntry, place: &str) -> Result<BandwidthEntry> {
        let number = |key: &str, value: Option<Value>| -> Result<u64> {
            match value {
                None => Ok(0),
                Some(value) => value.as_u64().ok_or_else(|| {
                    Error::config(format!(
                        "{place}{key} must be a whole number from 0 to {} ({}), not {}",
                        u64::MAX,
                        if key.ends_with("Rate") { "bits per second" } else { "bits" },
                        cnicore::spec::truncate_for_msg(&value.to_string())
                    ))
                }),
            }
        };
        let subnets = raw.has_subnets();
        Ok(BandwidthEntry {
            ingress_rate: number("ingressRate", raw.ingress_rate)?,
            ingress_burst: number("ingressBurst", raw.ingress_burst)?,
            egress_rate: number("egressRate", raw.egress_rate)?,
            egress_burst: number("egressBurst", raw.egress_burst)?,
            subnets,
        })
    }
}

/// What to install: a tbf per shaped direction, with the reference's buffer and limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Limits {
    /// Traffic into the pod: tbf at the root of the host veth.
    pub ingress: Option<Tbf>,
    /// Traffic out of the pod: tbf on the ifb the host veth's incoming traffic is redirected to.
    pub egress: Option<Tbf>,
}

impl Limits {
    pub fn is_empty(&self) -> bool {
        self.ingress.is_none() && self.egress.is_none()
    }
}

/// The bandwidth entry in effect: the config's own fields when any is present, else
/// `runtimeConfig.bandwidth` (containerd spells its keys as Go field names: `IngressRate`), else none.
pub fn entry(ctx: &Context) -> Result<Option<BandwidthEntry>> {
    // The config's own fields and runtimeConfig are read from the same bytes, as two views.
    let own: RawEntry = ctx.parse_conf()?;
    let own_subnets = own.has_subnets();
    if own.is_present() {
        return BandwidthEntry::from_raw(own, "").map(Some);
    }
    let raw: RawConf = ctx.parse_conf()?;
    match raw.runtime_config.and_then(|r| r.bandwidth) {
        Some(entry) => BandwidthEntry::from_raw(entry, "runtimeConfig.bandwidth.").map(|mut e| {
            e.subnets |= own_subnets;
            Some(e)
        }),
        None => {
            if own_subnets {
                cnicore::warn!("{SUBNETS_IGNORED}");
            }
            Ok(None)
        }
    }
}

/// The warning for a v1.5 config: reference v1.6 to v1.9 ignore these fields, and so do we (on stderr, so the
/// operator learns that the pod's whole traffic is shaped).
pub const SUBNETS_IGNORED: &str =
    "shapedSubnets and unshapedSubnets are ignored (as by the reference plugins since v1.6): the whole pod traffic is shaped";

/// Validates the entry in effect and computes the tbf of each shaped direction.
pub fn limits(ctx: &Context) -> Result<Limits> {
    let Some(entry) = entry(ctx)? else { return Ok(Limits::default()) };
    if entry.subnets {
        cnicore::warn!("{SUBNETS_IGNORED}");
    }
    Ok(Limits {
        ingress: direction("ingress", entry.ingress_rate, entry.ingress_burst)?,
        egress: direction("egress", entry.egress_rate, entry.egress_burst)?,
    })
}

/// One direction: both zero means unshaped; a rate needs a burst and the reverse; both must fit the
/// kernel's fields.
fn direction(name: &str, rate: u64, burst: u64) -> Result<Option<Tbf>> {
    let problem = match (rate, burst) {
        (0, 0) => return Ok(None),
        (_, 0) => "if rate is set, burst must also be set".to_string(),
        (0, _) => "if burst is set, rate must also be set".to_string(),
        _ => match Tbf::like_reference(rate, burst) {
            Ok(tbf) => return Ok(Some(tbf)),
            Err(e) => e.to_string(),
        },
    };
    Err(Error::config(format!("invalid {name} bandwidth ({name}Rate {rate}, {name}Burst {burst}): {problem}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use cnicore::spec::{codes, Command};

    fn ctx(json: &str) -> Context {
        Context::for_test(Command::Add, json, "")
    }

    #[test]
    fn config_wins_over_runtime_config() {
        let c = ctx(r#"{"ingressRate":8000,"ingressBurst":800,
            "runtimeConfig":{"bandwidth":{"egressRate":16000,"egressBurst":1600}}}"#);
        let l = limits(&c).unwrap();
        assert_eq!(l.ingress.unwrap().rate, 1000);
        assert!(l.egress.is_none());
        let c = ctx(r#"{"runtimeConfig":{"bandwidth":{"egressRate":16000,"egressBurst":1600}}}"#);
        let l = limits(&c).unwrap();
        assert!(l.ingress.is_none());
        assert_eq!(l.egress.unwrap().rate, 2000);
        assert!(limits(&ctx("{}")).unwrap().is_empty());
        assert!(limits(&ctx(r#"{"ingressRate":0,"ingressBurst":0}"#)).unwrap().is_empty());
    }

    #[test]
    fn containerd_go_field_names() {
        // go-cni's BandwidthEntry has no json tags; a pod without a burst annotation gets MaxUint32.
        let c = ctx(r#"{"runtimeConfig":{"bandwidth":{"IngressRate":10000000,"IngressBurst":4294967295,
            "EgressRate":10000000,"EgressBurst":4294967295}}}"#);
        let l = limits(&c).unwrap();
        assert_eq!(l.ingress.unwrap().rate, 10_000_000 / 8);
        assert_eq!(l.egress.unwrap().rate, 10_000_000 / 8);
        let c = ctx(r#"{"IngressRate":8000,"INGRESSBURST":800,"runtimeConfig":{"bandwidth":null}}"#);
        assert_eq!(limits(&c).unwrap().ingress.unwrap().rate, 1000);
    }

    #[test]
    fn bad_pairs() {
        for (json, needle) in [
            (r#"{"ingressRate":8000}"#, "burst must also be set"),
            (r#"{"egressBurst":8000}"#, "rate must also be set"),
            (r#"{"egressRate":4,"egressBurst":8000}"#, "at least 8 bits per second"),
            (r#"{"egressRate":8000,"egressBurst":4}"#, "at least 8 bits"),
            (r#"{"ingressRate":8000,"ingressBurst":34359738360}"#, "more than 4GB"),
            (r#"{"ingressRate":18446744073709551615,"ingressBurst":8000}"#, "exceeds 4GB"),
        ] {
            let e = limits(&ctx(json)).unwrap_err();
            assert_eq!(e.code, codes::INVALID_CONFIG, "{json}");
            assert!(e.msg.contains(needle), "{json}: {}", e.msg);
        }
        for json in [
            r#"{"ingressRate":-1,"ingressBurst":8}"#,
            r#"{"ingressRate":1.5e6,"ingressBurst":8}"#,
            r#"{"ingressRate":"1M","ingressBurst":8}"#,
            r#"{"ingressRate":18446744073709551616,"ingressBurst":8}"#,
        ] {
            let e = limits(&ctx(json)).unwrap_err();
            assert_eq!(e.code, codes::INVALID_CONFIG, "{json}");
            assert!(e.msg.contains("ingressRate must be a whole number"), "{json}: {}", e.msg);
        }
    }

    #[test]
    fn v1_5_subnets_are_ignored_as_v1_6_to_v1_9_do() {
        let l = limits(&ctx(
            r#"{"runtimeConfig":{"bandwidth":{"ingressRate":8000,"ingressBurst":800,"shapedSubnets":["10.0.0.0/8"]}}}"#,
        ))
        .unwrap();
        assert_eq!(l.ingress.unwrap().rate, 1000);
        assert!(
            entry(&ctx(r#"{"unshapedSubnets":["10.0.0.0/8"],"egressRate":8000,"egressBurst":800}"#))
                .unwrap()
                .unwrap()
                .subnets
        );
        // Subnets alone are no entry (v1.9 does not know the fields): runtimeConfig still applies.
        let c = ctx(
            r#"{"shapedSubnets":["10.0.0.0/8"],"runtimeConfig":{"bandwidth":{"egressRate":16000,"egressBurst":1600}}}"#,
        );
        let e = entry(&c).unwrap().unwrap();
        assert!(e.subnets && e.egress_rate == 16000);
        assert!(limits(&ctx(r#"{"shapedSubnets":["10.0.0.0/8"]}"#)).unwrap().is_empty());
    }
}
