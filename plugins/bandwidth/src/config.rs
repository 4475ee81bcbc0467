//! The plugin's configuration: rates and bursts from the config itself or from `runtimeConfig.bandwidth`
//! (the `bandwidth` capability, fed by the Kubernetes ingress/egress-bandwidth annotations).

use cnicore::spec::{codes, Context, Error, Result};
use cnicore::tc::Tbf;
use serde_json::{Map, Value};

/// One set of limits, as in the config and in `runtimeConfig.bandwidth`: bits per second and bits.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct BandwidthEntry {
    pub ingress_rate: u64,
    pub ingress_burst: u64,
    pub egress_rate: u64,
    pub egress_burst: u64,
    /// Only in later reference versions (HTB based); refused rather than silently ignored.
    pub subnets: bool,
}

impl BandwidthEntry {
    /// Reads the entry's fields from a JSON object; a field that is not a non-negative integer is an
    /// error naming it (serde's own message would not).
    fn from_object(object: &Map<String, Value>, place: &str) -> Result<BandwidthEntry> {
        let number = |key: &str| -> Result<u64> {
            match object.get(key) {
                None | Some(Value::Null) => Ok(0),
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
        let subnets = ["unshapedSubnets", "shapedSubnets"]
            .iter()
            .any(|k| object.get(*k).is_some_and(|v| !v.is_null() && v.as_array().is_none_or(|a| !a.is_empty())));
        Ok(BandwidthEntry {
            ingress_rate: number("ingressRate")?,
            ingress_burst: number("ingressBurst")?,
            egress_rate: number("egressRate")?,
            egress_burst: number("egressBurst")?,
            subnets,
        })
    }
}

/// Keys that make the config's own entry win over `runtimeConfig.bandwidth` (the reference embeds the
/// entry as a pointer, allocated as soon as one of its fields appears).
const ENTRY_KEYS: [&str; 6] =
    ["ingressRate", "ingressBurst", "egressRate", "egressBurst", "unshapedSubnets", "shapedSubnets"];

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
/// `runtimeConfig.bandwidth`, else none.
pub fn entry(ctx: &Context) -> Result<Option<BandwidthEntry>> {
    let raw: Value = ctx.parse_conf()?;
    let Some(conf) = raw.as_object() else { return Err(Error::config("the network config must be a JSON object")) };
    if ENTRY_KEYS.iter().any(|k| conf.contains_key(*k)) {
        return BandwidthEntry::from_object(conf, "").map(Some);
    }
    match conf.get("runtimeConfig").and_then(|r| r.get("bandwidth")) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(entry)) => BandwidthEntry::from_object(entry, "runtimeConfig.bandwidth.").map(Some),
        Some(_) => Err(Error::config("runtimeConfig.bandwidth must be an object")),
    }
}

/// Validates the entry in effect and computes the tbf of each shaped direction.
pub fn limits(ctx: &Context) -> Result<Limits> {
    let Some(entry) = entry(ctx)? else { return Ok(Limits::default()) };
    if entry.subnets {
        return Err(Error::new(
            codes::UNSUPPORTED_FIELD,
            "unshapedSubnets and shapedSubnets are not supported: the whole pod traffic is shaped",
        ));
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
    use cnicore::spec::{CniArgs, Command, Env, NetConf, Version};

    fn ctx(json: &str) -> Context {
        Context {
            env: Env {
                command: Command::Add,
                container_id: "c".into(),
                netns: None,
                ifname: "eth0".into(),
                args: CniArgs::default(),
                args_raw: String::new(),
                path: vec![],
            },
            stdin: json.as_bytes().to_vec(),
            conf: NetConf::default(),
            version: Version::V110,
        }
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
        let e = limits(&ctx(
            r#"{"runtimeConfig":{"bandwidth":{"ingressRate":8000,"ingressBurst":800,"shapedSubnets":["10.0.0.0/8"]}}}"#,
        ))
        .unwrap_err();
        assert_eq!(e.code, codes::UNSUPPORTED_FIELD);
    }
}
