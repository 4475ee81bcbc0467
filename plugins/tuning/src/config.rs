//! The plugin's configuration, read as the reference reads it: the config's own fields, then `CNI_ARGS`
//! (`MAC=`), then `runtimeConfig.mac` (the `mac` capability), then `args.cni` (the conventions' per-attachment
//! args), each later source overriding the earlier. Everything is validated here, before anything is changed.

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

use cnicore::spec::{gojson, truncate_for_msg, Context, ConventionArgs, Error, Result};
use serde::de::{self, IgnoredAny, MapAccess, Visitor};
use serde::Deserialize;

/// Where the reference keeps what ADD changed (`dataDir` overrides it).
pub const DEFAULT_DATA_DIR: &str = "/run/cni/tuning";
/// The reference's allow-list of sysctls: one Go regular expression a line; when the file exists, every
/// configured sysctl key must match one of them.
pub const ALLOWLIST: &str = "/etc/cni/tuning/allowlist.conf";

/// The settings, as the config has them at its top level and `args.cni` per attachment.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawSettings {
    #[serde(default)]
    sysctl: Option<BTreeMap<String, String>>,
    #[serde(default)]
    mac: Option<String>,
    #[serde(default)]
    promisc: Option<bool>,
    #[serde(default)]
    mtu: Option<i64>,
    #[serde(default)]
    allmulti: Option<bool>,
    #[serde(default, rename = "txQLen")]
    tx_q_len: Option<i64>,
}

/// The rest of the config, read from the same bytes as a second view.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawConf {
    #[serde(default)]
    data_dir: Option<String>,
    #[serde(default)]
    runtime_config: Option<RawRuntimeConfig>,
    #[serde(default)]
    args: Option<ConventionArgs<RawSettings>>,
}

#[derive(Debug, Default, Deserialize)]
struct RawRuntimeConfig {
    #[serde(default)]
    mac: Option<String>,
}

/// One sysctl to set in the pod's netns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sysctl {
    /// The key as the config wrote it (what the allow-list and messages see).
    pub key: String,
    /// Its name under /proc/sys, slash form, with `IFNAME` replaced by the interface's name.
    pub name: String,
    pub value: String,
}

/// What one attachment asks for, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tuning {
    pub data_dir: PathBuf,
    pub sysctls: Vec<Sysctl>,
    pub mac: Option<[u8; 6]>,
    /// Only `true` does anything: the reference has no way to turn promiscuous mode off.
    pub promisc: bool,
    pub mtu: Option<u32>,
    pub allmulti: Option<bool>,
    pub txqlen: Option<u32>,
}

impl Tuning {
    /// Reads and validates the config of `ctx`, with the allow-list at [`ALLOWLIST`].
    pub fn load(ctx: &Context) -> Result<Tuning> {
        Tuning::load_with_allowlist(ctx, Path::new(ALLOWLIST))
    }

    pub fn load_with_allowlist(ctx: &Context, allowlist: &Path) -> Result<Tuning> {
        let settings: RawSettings = ctx.parse_conf()?;
        let raw: RawConf = ctx.parse_conf()?;
        refuse_duplicate_sysctl_keys(&ctx.stdin)?;
        let args = ConventionArgs::cni(raw.args).unwrap_or_default();

        let mut mac = settings.mac.filter(|m| !m.is_empty());
        if !ctx.env.args_raw.is_empty() {
            ctx.env.args.check_known(&["MAC"])?;
            if let Some(m) = ctx.env.args.get("MAC").filter(|m| !m.is_empty()) {
                mac = Some(m.to_string());
            }
        }
        if let Some(m) = raw.runtime_config.and_then(|r| r.mac).filter(|m| !m.is_empty()) {
            mac = Some(m);
        }
        // args.cni.mac overrides even with an empty string, as the reference's pointer field does.
        if let Some(m) = args.mac {
            mac = Some(m).filter(|m| !m.is_empty());
        }
        let mac = mac.map(|m| cnicore::mac::parse(&m)).transpose()?;

        let mut keys = settings.sysctl.unwrap_or_default();
        keys.extend(args.sysctl.unwrap_or_default());
        let mtu = args.mtu.or(settings.mtu).filter(|&m| m != 0).map(|m| whole("mtu", m)).transpose()?;
        let txqlen = args.tx_q_len.or(settings.tx_q_len).map(|q| whole("txQLen", q)).transpose()?;

        check_allowlist(&keys, allowlist)?;
        let ifname = &ctx.env.ifname;
        let sysctls: Vec<Sysctl> = keys
            .into_iter()
            .map(|(key, value)| Ok(Sysctl { name: sysctl_name(&key, ifname)?, key, value }))
            .collect::<Result<_>>()?;
        let mut names = HashSet::new();
        if let Some(twice) = sysctls.iter().find(|s| !names.insert(&s.name)) {
            return Err(Error::config(format!("sysctl {} is configured twice, under two spellings", twice.name)));
        }
        Ok(Tuning {
            data_dir: PathBuf::from(raw.data_dir.filter(|d| !d.is_empty()).unwrap_or_else(|| DEFAULT_DATA_DIR.into())),
            sysctls,
            mac,
            promisc: args.promisc.or(settings.promisc).unwrap_or(false),
            mtu,
            allmulti: args.allmulti.or(settings.allmulti),
            txqlen,
        })
    }

    /// True when a setting of the interface itself (not a sysctl) is asked for.
    pub fn touches_link(&self) -> bool {
        self.mac.is_some() || self.promisc || self.mtu.is_some() || self.allmulti.is_some() || self.txqlen.is_some()
    }

    pub fn is_empty(&self) -> bool {
        self.sysctls.is_empty() && !self.touches_link()
    }
}

/// Only `dataDir`: all DEL needs, so that a DEL succeeds whatever else the config holds.
pub fn data_dir(ctx: &Context) -> Result<PathBuf> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct DataDir {
        #[serde(default)]
        data_dir: Option<String>,
    }
    let conf: DataDir = ctx.parse_conf()?;
    Ok(PathBuf::from(conf.data_dir.filter(|d| !d.is_empty()).unwrap_or_else(|| DEFAULT_DATA_DIR.into())))
}

fn whole(field: &str, value: i64) -> Result<u32> {
    u32::try_from(value)
        .map_err(|_| Error::config(format!("{field} must be a whole number from 0 to {}, not {value}", u32::MAX)))
}

/// The /proc/sys name of a configured key: either separator (see [`cnicore::sysctl::slash_form`]), the first
/// `IFNAME` replaced by the interface's name, and nothing but plain components under `net/`: a key that leaves
/// the pod's network namespace (`kernel.*`, `net/../kernel/...`) is refused before anything is written.
pub fn sysctl_name(key: &str, ifname: &str) -> Result<String> {
    let name = cnicore::sysctl::slash_form(key).replacen("IFNAME", ifname, 1);
    let parts: Vec<&str> = name.split('/').filter(|p| !p.is_empty()).collect();
    let plain = parts.iter().all(|p| *p != "." && *p != ".." && !p.chars().any(char::is_control));
    if parts.len() < 2 || parts[0] != "net" || !plain {
        return Err(Error::config(format!(
            "invalid net sysctl key {:?}: only keys under net. (the pod's network namespace) can be set",
            truncate_for_msg(key)
        )));
    }
    Ok(parts.join("/"))
}

/// The reference's allow-list: when the file exists, each key (as written) must match one of its regular
/// expressions (unanchored, as Go's `regexp.MatchString`).
fn check_allowlist(keys: &BTreeMap<String, String>, allowlist: &Path) -> Result<()> {
    if keys.is_empty() {
        return Ok(());
    }
    let text = match std::fs::read_to_string(allowlist) {
        Ok(text) => text,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(Error::io(format!("reading the sysctl allow-list {}: {e}", allowlist.display()))),
    };
    let patterns: Vec<&str> = text.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    let regexes = patterns
        .iter()
        .map(|p| {
            regex_lite::Regex::new(p).map_err(|e| {
                Error::config(format!(
                    "{}: invalid regular expression {:?}: {e}",
                    allowlist.display(),
                    truncate_for_msg(p)
                ))
            })
        })
        .collect::<Result<Vec<_>>>()?;
    match keys.keys().find(|key| !regexes.iter().any(|r| r.is_match(key))) {
        None => Ok(()),
        Some(key) => Err(Error::config(format!(
            "sysctl {:?} is not allowed: {} allows only {}",
            truncate_for_msg(key),
            allowlist.display(),
            truncate_for_msg(&patterns.join(" "))
        ))),
    }
}

/// JSON allows an object to name a key twice and a decoder then keeps one silently; the reference refuses
/// a `sysctl` object that does, and so do we.
fn refuse_duplicate_sysctl_keys(stdin: &[u8]) -> Result<()> {
    struct Config;
    struct Sysctls;

    impl<'de> Visitor<'de> for Config {
        type Value = Option<String>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a JSON object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Option<String>, A::Error> {
            let mut seen = HashSet::new();
            let mut twice = None;
            while let Some(key) = map.next_key::<String>()? {
                if gojson::fold_eq(&key, "sysctl") {
                    let keys = map.next_value_seed(Sysctls)?;
                    twice = twice.or(keys.into_iter().find(|k| !seen.insert(k.clone())));
                } else {
                    map.next_value::<IgnoredAny>()?;
                }
            }
            Ok(twice)
        }
    }

    impl<'de> de::DeserializeSeed<'de> for Sysctls {
        type Value = Vec<String>;
        fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<Vec<String>, D::Error> {
            deserializer.deserialize_any(self)
        }
    }

    impl<'de> Visitor<'de> for Sysctls {
        type Value = Vec<String>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("an object of sysctl names and values")
        }
        fn visit_unit<E>(self) -> Result<Vec<String>, E> {
            Ok(Vec::new())
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Vec<String>, A::Error> {
            let mut keys = Vec::new();
            while let Some(key) = map.next_key::<String>()? {
                map.next_value::<IgnoredAny>()?;
                keys.push(key);
            }
            Ok(keys)
        }
    }

    let mut deserializer = serde_json::Deserializer::from_slice(stdin);
    match de::Deserializer::deserialize_map(&mut deserializer, Config) {
        Ok(None) => Ok(()),
        Ok(Some(key)) => {
            Err(Error::config(format!("duplicated sysctl keys are not allowed: {:?}", truncate_for_msg(&key))))
        }
        Err(e) => Err(cnicore::spec::json_error_in("invalid network config", &e, stdin)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cnicore::spec::{codes, Command};
    use serde_json::{json, Value};

    fn load(conf: Value, cni_args: &str) -> Result<Tuning> {
        load_raw(&conf.to_string(), cni_args)
    }

    fn load_raw(conf: &str, cni_args: &str) -> Result<Tuning> {
        let ctx = Context::for_test(Command::Add, conf, cni_args);
        Tuning::load_with_allowlist(&ctx, Path::new("/nonexistent/allowlist.conf"))
    }

    fn base() -> Value {
        json!({"cniVersion": "0.4.0", "name": "n", "type": "tuning"})
    }

    fn with(pairs: Value) -> Value {
        let mut conf = base();
        for (k, v) in pairs.as_object().unwrap() {
            conf[k] = v.clone();
        }
        conf
    }

    #[test]
    fn podman_writes_nothing_to_do() {
        let t = load(base(), "IgnoreUnknown=1;K8S_POD_NAME=x").unwrap();
        assert!(t.is_empty());
        assert_eq!(t.data_dir, PathBuf::from("/run/cni/tuning"));
    }

    #[test]
    fn every_field() {
        let conf = with(json!({"mac": "C2:11:22:33:44:55", "mtu": 1400, "promisc": true, "allmulti": false,
            "txQLen": 0, "dataDir": "/tmp/t", "sysctl": {"net.ipv4.conf.IFNAME.arp_filter": "1"}}));
        let t = load(conf, "").unwrap();
        assert_eq!(t.mac, Some([0xc2, 0x11, 0x22, 0x33, 0x44, 0x55]));
        assert_eq!((t.mtu, t.promisc, t.allmulti, t.txqlen), (Some(1400), true, Some(false), Some(0)));
        assert_eq!(t.data_dir, PathBuf::from("/tmp/t"));
        assert_eq!(t.sysctls[0].name, "net/ipv4/conf/eth0/arp_filter");
        assert!(t.touches_link());
    }

    #[test]
    fn go_key_matching_and_null() {
        let t = load(with(json!({"MTU": 1300, "TxQLen": 5, "Promisc": null})), "").unwrap();
        assert_eq!((t.mtu, t.txqlen, t.promisc), (Some(1300), Some(5), false));
    }

    #[test]
    fn mac_precedence_as_the_reference() {
        let conf = with(json!({"mac": "02:00:00:00:00:01"}));
        assert_eq!(load(conf.clone(), "").unwrap().mac.unwrap()[5], 1);
        assert_eq!(load(conf.clone(), "IgnoreUnknown=1;MAC=02:00:00:00:00:02").unwrap().mac.unwrap()[5], 2);
        let mut runtime = conf.clone();
        runtime["runtimeConfig"] = json!({"mac": "02:00:00:00:00:03"});
        assert_eq!(load(runtime.clone(), "MAC=02:00:00:00:00:02").unwrap().mac.unwrap()[5], 3);
        runtime["args"] = json!({"cni": {"mac": "02:00:00:00:00:04"}});
        assert_eq!(load(runtime, "MAC=02:00:00:00:00:02").unwrap().mac.unwrap()[5], 4);
        // CNI_ARGS keys other than MAC need IgnoreUnknown, as libcni's LoadArgs wants.
        assert_eq!(load(conf, "FOO=1").unwrap_err().code, codes::INVALID_ENV);
    }

    #[test]
    fn args_override_the_config() {
        let conf = with(json!({"mtu": 1400, "promisc": false, "sysctl": {"net.core.somaxconn": "100"},
            "args": {"cni": {"mtu": 1300, "promisc": true, "allmulti": true, "txQLen": 9,
                "sysctl": {"net.core.somaxconn": "200", "net.ipv4.ip_forward": "1"}}}}));
        let t = load(conf, "").unwrap();
        assert_eq!((t.mtu, t.promisc, t.allmulti, t.txqlen), (Some(1300), true, Some(true), Some(9)));
        let values: Vec<(&str, &str)> = t.sysctls.iter().map(|s| (s.name.as_str(), s.value.as_str())).collect();
        assert_eq!(values, [("net/core/somaxconn", "200"), ("net/ipv4/ip_forward", "1")]);
        // The reference panics on args.cni.sysctl without a sysctl in the config; here it just applies.
        let t = load(with(json!({"args": {"cni": {"sysctl": {"net.core.somaxconn": "5"}}}})), "").unwrap();
        assert_eq!(t.sysctls.len(), 1);
    }

    #[test]
    fn hostile_sysctl_keys() {
        for key in [
            "kernel.hostname",
            "net/../kernel/hostname",
            "net.ipv4/../../kernel",
            "net",
            "net.",
            "../net/core",
            "./net/core/x",
            "vm.swappiness",
            "net.core.IFNAME",
        ] {
            let conf = with(json!({"sysctl": {key: "1"}}));
            match load(conf, "") {
                Err(e) => assert_eq!(e.code, codes::INVALID_CONFIG, "{key}: {e:?}"),
                // IFNAME replaced by eth0 is a plain name under net/: allowed (the kernel says whether it exists).
                Ok(t) => assert_eq!((key, t.sysctls[0].name.as_str()), ("net.core.IFNAME", "net/core/eth0")),
            }
        }
        assert_eq!(
            sysctl_name("net/ipv4/conf/eth0.100/rp_filter", "eth0").unwrap(),
            "net/ipv4/conf/eth0.100/rp_filter"
        );
        assert_eq!(
            sysctl_name("net.ipv4.conf.IFNAME.rp_filter", "eth0.100").unwrap(),
            "net/ipv4/conf/eth0.100/rp_filter"
        );
    }

    #[test]
    fn duplicated_sysctl_keys() {
        let conf = r#"{"cniVersion":"0.4.0","name":"n","type":"tuning",
            "sysctl":{"net.ipv4.conf.all.log_martians":"1","net.ipv4.conf.all.log_martians":"0"}}"#;
        let e = load_raw(conf, "").unwrap_err();
        assert!(e.msg.contains("duplicated"), "{e:?}");
        let spelled_twice = with(json!({"sysctl": {"net.core.somaxconn": "1", "net/core/somaxconn": "2"}}));
        assert_eq!(load(spelled_twice, "").unwrap_err().code, codes::INVALID_CONFIG);
        assert!(load_raw(r#"{"cniVersion":"0.4.0","name":"n","sysctl":null}"#, "").unwrap().is_empty());
    }

    #[test]
    fn bad_values() {
        for bad in [
            json!({"mtu": -1}),
            json!({"mtu": 1500.5}),
            json!({"mtu": "1500"}),
            json!({"txQLen": -1}),
            json!({"txQLen": 1u64 << 33}),
            json!({"mac": "01:00:5e:00:00:01"}),
            json!({"mac": "nope"}),
            json!({"promisc": "yes"}),
            json!({"sysctl": {"net.core.somaxconn": 5}}),
            json!({"sysctl": ["net.core.somaxconn"]}),
            json!({"runtimeConfig": {"mac": 5}}),
        ] {
            let e = load(with(bad.clone()), "").unwrap_err();
            assert!(e.code == codes::INVALID_CONFIG || e.code == codes::DECODE, "{bad}: {e:?}");
        }
    }

    #[test]
    fn allowlist() {
        let dir = std::env::temp_dir().join(format!("tuning-allowlist-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("allowlist.conf");
        std::fs::write(&file, "^net\\.ipv4\\.conf\\.all\\.[a-z_]*$\n\n  ^net\\.core\\.somaxconn$  \n").unwrap();
        let ctx = |key: &str| Context::for_test(Command::Add, with(json!({"sysctl": {key: "1"}})).to_string(), "");
        assert!(Tuning::load_with_allowlist(&ctx("net.ipv4.conf.all.log_martians"), &file).is_ok());
        assert!(Tuning::load_with_allowlist(&ctx("net.core.somaxconn"), &file).is_ok());
        let e = Tuning::load_with_allowlist(&ctx("net.ipv4.conf.other.log_martians"), &file).unwrap_err();
        assert!(e.msg.contains("not allowed"), "{e:?}");
        std::fs::write(&file, "^net\\.(\n").unwrap();
        assert_eq!(
            Tuning::load_with_allowlist(&ctx("net.core.somaxconn"), &file).unwrap_err().code,
            codes::INVALID_CONFIG
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
