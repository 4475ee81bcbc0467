//! Network configurations: the fields every plugin shares, and conflists.

use super::env::truncate;
use super::error::{codes, Error, Result};
use super::gojson;
use super::result::Dns;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// The conventions' `args` section as a plugin declares it: `args.cni`, of the plugin's own type `T`.
#[derive(Debug, Default, Deserialize)]
pub struct ConventionArgs<T> {
    #[serde(default = "Option::default")]
    pub cni: Option<T>,
}

impl<T> ConventionArgs<T> {
    /// `args.cni` of an optional `args` section.
    pub fn cni(args: Option<Self>) -> Option<T> {
        args.and_then(|a| a.cni)
    }
}

/// Requested addresses as `args.cni` and `runtimeConfig` (capability `ips`) carry them: `ips`, as text.
#[derive(Debug, Default, Deserialize)]
pub struct IpsArg {
    #[serde(default)]
    pub ips: Option<Vec<String>>,
}

/// The fields of a network config every plugin reads. Plugin-specific fields are parsed by the plugin from the
/// same bytes (see [`super::Context::parse_conf`]).
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NetConf {
    #[serde(default)]
    pub cni_version: String,
    #[serde(default)]
    pub name: String,
    #[serde(default, rename = "type")]
    pub plugin_type: String,
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub capabilities: Map<String, Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipam: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dns: Option<Dns>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prev_result: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_config: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub args: Option<Value>,
}

/// `runtimeConfig`, as far as the shared code needs it; plugins read their own keys from the raw value.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct RuntimeConfig {
    #[serde(default)]
    pub ips: Vec<String>,
    #[serde(default)]
    pub mac: Option<String>,
}

impl NetConf {
    /// The `ipam.type` of the config, validated as a plugin name.
    pub fn ipam_type(&self) -> Result<&str> {
        let t = self
            .ipam
            .as_ref()
            .and_then(|i| gojson::field(i, "type"))
            .and_then(Value::as_str)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| Error::config("IPAM config missing 'type' key"))?;
        validate_plugin_type(t)?;
        Ok(t)
    }

    /// The `ipam.type` of a plugin for which IPAM is optional: `None` without an `ipam` section or with an empty
    /// type, as the reference's `IPAM.Type == ""`.
    pub fn ipam_type_if_any(&self) -> Result<Option<&str>> {
        let has_type = self.ipam.as_ref().and_then(|i| gojson::field(i, "type")).is_some_and(|t| t != "");
        if has_type {
            self.ipam_type().map(Some)
        } else {
            Ok(None)
        }
    }

    /// A key of `runtimeConfig`, when present (matched as Go matches a struct field).
    pub fn runtime(&self, key: &str) -> Option<&Value> {
        self.runtime_config.as_ref().and_then(|r| gojson::field(r, key))
    }

    /// A key of `args.cni` (the conventions' `args` section), when present.
    pub fn args_cni(&self, key: &str) -> Option<&Value> {
        self.args.as_ref().and_then(|a| gojson::field(a, "cni")).and_then(|c| gojson::field(c, key))
    }
}

/// A conflist: a named list of plugin configs run in order.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NetConfList {
    #[serde(default)]
    pub cni_version: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cni_versions: Option<Vec<String>>,
    pub name: String,
    #[serde(default)]
    pub disable_check: bool,
    #[serde(default)]
    pub disable_gc: bool,
    pub plugins: Vec<Value>,
}

/// Network names, as the spec requires: `^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$`. They become file names (host-local)
/// and firewall comments, so nothing else is accepted.
pub fn validate_network_name(name: &str) -> Result<()> {
    let mut bytes = name.bytes();
    let ok = bytes.next().is_some_and(|b| b.is_ascii_alphanumeric())
        && bytes.all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
        && name.len() <= 128;
    if !ok {
        return Err(Error::new(
            codes::INVALID_CONFIG,
            format!(
                "invalid network name {:?}: must start with a letter or digit, contain only letters, digits, '_', '.' and '-', and be at most 128 characters",
                truncate(name)
            ),
        ));
    }
    Ok(())
}

/// Plugin type names are looked up as files in `CNI_PATH`: no separators, no dot-only names.
pub fn validate_plugin_type(t: &str) -> Result<()> {
    if t.is_empty() || t == "." || t == ".." || t.contains('/') || t.chars().any(char::is_control) || t.len() > 255 {
        return Err(Error::config(format!("invalid plugin type {:?}", truncate(t))));
    }
    Ok(())
}

/// Maps a serde_json error to the spec's codes: unparseable JSON is a decoding failure (6); JSON that parses
/// but is not a valid config (wrong types, missing fields) is an invalid config (7).
pub fn json_error(what: &str, e: &serde_json::Error) -> Error {
    use serde_json::error::Category;
    let code = match e.classify() {
        Category::Data => codes::INVALID_CONFIG,
        Category::Io | Category::Syntax | Category::Eof => codes::DECODE,
    };
    Error::new(code, format!("{what}: {}", gojson::shorten_json_error(e)))
}

/// [`json_error`] for an error in `input`, with the text just before the error's position, so that a message
/// about a wrong type names the field (serde's own says only "invalid type: string, expected i64 at column
/// 181"). The excerpt is at most 40 bytes of that line, with control characters replaced: hostile input
/// cannot flood or break the message.
pub fn json_error_in(what: &str, e: &serde_json::Error, input: &[u8]) -> Error {
    let mut error = json_error(what, e);
    if let Some(excerpt) = json_error_excerpt(e, input) {
        error.msg.push_str(&format!(" (near `{excerpt}`)"));
    }
    error
}

fn json_error_excerpt(e: &serde_json::Error, input: &[u8]) -> Option<String> {
    const MAX_EXCERPT: usize = 40;
    if e.line() == 0 || e.classify() == serde_json::error::Category::Eof {
        return None;
    }
    let line = input.split(|&b| b == b'\n').nth(e.line() - 1)?;
    let end = e.column().min(line.len());
    let start = end.saturating_sub(MAX_EXCERPT);
    let excerpt: String = String::from_utf8_lossy(&line[start..end])
        .chars()
        .map(|c| if c.is_control() || c == '`' { '?' } else { c })
        .collect();
    // The cut may split a character: its remains are not worth showing.
    let excerpt = excerpt.trim_start_matches('\u{FFFD}').trim();
    (!excerpt.is_empty()).then(|| excerpt.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn convention_args_with_go_key_matching() {
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Conf {
            #[serde(default)]
            args: Option<ConventionArgs<IpsArg>>,
            #[serde(default)]
            runtime_config: Option<IpsArg>,
        }
        let conf: Conf = gojson::from_slice(
            br#"{"Args": {"CNI": {"IPS": ["10.0.0.5"]}}, "RuntimeConfig": {"ips": ["10.0.0.6/24"]}}"#,
        )
        .unwrap();
        assert_eq!(ConventionArgs::cni(conf.args).and_then(|c| c.ips), Some(vec!["10.0.0.5".to_string()]));
        assert_eq!(conf.runtime_config.and_then(|r| r.ips), Some(vec!["10.0.0.6/24".to_string()]));
        let empty: Conf = gojson::from_slice(br#"{"args": {"cni": null}}"#).unwrap();
        assert!(ConventionArgs::cni(empty.args).is_none() && empty.runtime_config.is_none());
    }

    #[test]
    fn network_names() {
        for ok in ["cbr0", "kubenet", "my-net_1.0", "A"] {
            validate_network_name(ok).unwrap();
        }
        for bad in ["", "..", "../x", "a/b", "-a", "a b", "a\nb", "a\0", &"x".repeat(200)] {
            assert_eq!(validate_network_name(bad).unwrap_err().code, codes::INVALID_CONFIG, "{bad:?}");
        }
    }

    #[test]
    fn ipam_type() {
        let c: NetConf = serde_json::from_str(r#"{"ipam":{"type":"host-local"}}"#).unwrap();
        assert_eq!(c.ipam_type().unwrap(), "host-local");
        let c: NetConf = serde_json::from_str(r#"{"ipam":{"type":"../evil"}}"#).unwrap();
        assert!(c.ipam_type().is_err());
        let c: NetConf = serde_json::from_str(r#"{"ipam":{}}"#).unwrap();
        assert!(c.ipam_type().is_err());
    }

    #[test]
    fn json_error_names_the_field() {
        let input = br#"{"cniVersion":"1.0.0","name":"n","mtu":"1500"}"#;
        #[derive(Debug, serde::Deserialize)]
        #[allow(dead_code)]
        struct Mtu {
            mtu: Option<i64>,
        }
        let e = serde_json::from_slice::<Mtu>(input).unwrap_err();
        let error = json_error_in("invalid network config", &e, input);
        assert_eq!(error.code, codes::INVALID_CONFIG);
        assert!(error.msg.ends_with(r#","mtu":"1500"`)"#), "{}", error.msg);
        let hostile = b"{\"name\": \"\x1b[2J\n\n";
        let e = serde_json::from_slice::<NetConf>(hostile).unwrap_err();
        let error = json_error_in("x", &e, hostile);
        assert!(!error.msg.contains('\x1b') && error.msg.len() < 200, "{}", error.msg);
    }

    #[test]
    fn json_errors_do_not_quote_hostile_values_whole() {
        let input = format!(r#"{{"cniVersion":"1.0.0","name":"n","dns":"{}"}}"#, "é".repeat(100_000));
        let e = serde_json::from_str::<NetConf>(&input).unwrap_err();
        let error = json_error_in("invalid network config", &e, input.as_bytes());
        assert!(error.msg.len() < 400, "{} bytes: {}", error.msg.len(), error.msg);
        assert!(error.msg.contains("expected struct Dns at line 1 column"), "{}", error.msg);
    }

    #[test]
    fn json_error_codes() {
        let e = serde_json::from_str::<NetConf>("{").unwrap_err();
        assert_eq!(json_error("x", &e).code, codes::DECODE);
        let e = serde_json::from_str::<NetConf>(r#"{"name": 5}"#).unwrap_err();
        assert_eq!(json_error("x", &e).code, codes::INVALID_CONFIG);
    }
}
