//! The bridge's network config: parsed and fully validated before anything on the node is touched.

use cnicore::spec::{validate_ifname, Context, Dns, Error, Result};
use ipnet::IpNet;
use serde::Deserialize;
use serde_json::Value;

use cnicore::firewall::masq::Attachment as Masq;
use cnicore::firewall::Backend;

const DEFAULT_BRIDGE: &str = "cni0";
/// The MTU range Linux accepts for Ethernet-like links (IPv4 needs at least 68).
const MTU_RANGE: std::ops::RangeInclusive<i64> = 68..=65535;
/// 802.1Q VLAN IDs usable on a bridge port (0 means "no VLAN").
const VLAN_MAX: i64 = 4094;

/// The config as written (field names and defaults of the reference plugin).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawConf {
    #[serde(default)]
    bridge: Option<String>,
    #[serde(default)]
    is_gateway: bool,
    #[serde(default)]
    is_default_gateway: bool,
    #[serde(default)]
    force_address: bool,
    #[serde(default)]
    ip_masq: bool,
    #[serde(default)]
    ip_masq_backend: Option<String>,
    /// Destinations whose traffic keeps the pod's address besides its own subnet (the cluster CIDR).
    #[serde(default, rename = "nonMasqueradeCIDRs")]
    non_masquerade_cidrs: Option<Vec<String>>,
    /// 0 (the reference's "unset") or absent: inferred.
    #[serde(default)]
    mtu: Option<i64>,
    #[serde(default)]
    hairpin_mode: bool,
    #[serde(default)]
    promisc_mode: bool,
    #[serde(default)]
    vlan: Option<i64>,
    #[serde(default)]
    vlan_trunk: Option<Vec<VlanTrunk>>,
    /// Reference v1.8+ (containernetworking/plugins#1181): false unless set, so a VLAN port is isolated from the
    /// bridge's default VLAN (v1.3-v1.7 defaulted to true).
    #[serde(default)]
    preserve_default_vlan: bool,
    #[serde(default, rename = "enabledad")]
    enable_dad: bool,
    #[serde(default, rename = "macspoofchk")]
    mac_spoof_check: bool,
    #[serde(default)]
    disable_container_interface: bool,
    #[serde(default)]
    port_isolation: bool,
}

/// One `vlanTrunk` entry: a single `id` and/or a `minID`..`maxID` range.
#[derive(Debug, Deserialize)]
struct VlanTrunk {
    #[serde(default, rename = "minID")]
    min_id: Option<i64>,
    #[serde(default, rename = "maxID")]
    max_id: Option<i64>,
    #[serde(default)]
    id: Option<i64>,
}

/// The validated config.
#[derive(Debug, Clone)]
pub struct Config {
    pub network: String,
    pub bridge: String,
    pub is_gateway: bool,
    pub is_default_gateway: bool,
    pub force_address: bool,
    pub ip_masq: bool,
    pub masq_backend: Option<Backend>,
    /// `nonMasqueradeCIDRs`: with ipMasq, traffic to these prefixes is not masqueraded (either family; an
    /// entry is used for the pod addresses of its family).
    pub non_masquerade: Vec<IpNet>,
    /// Explicit MTU; `None` means "infer it from the node" (see [`crate::mtu`]).
    pub mtu: Option<u32>,
    pub hairpin: bool,
    pub promisc: bool,
    /// Access VLAN of the pod's port.
    pub vlan: Option<u16>,
    /// Tagged VLANs of the pod's port, sorted and unique.
    pub trunk: Vec<u16>,
    pub preserve_default_vlan: bool,
    pub enable_dad: bool,
    pub mac_spoof_check: bool,
    pub disable_container_interface: bool,
    pub port_isolation: bool,
    /// MAC of the pod interface: `runtimeConfig.mac`, else `args.cni.mac`, else `CNI_ARGS` `MAC`.
    pub mac: Option<[u8; 6]>,
    /// An IPAM plugin is configured (layer 3); without one the pod gets a bare layer-2 port.
    pub layer3: bool,
    /// `dns` of the config, which takes precedence over IPAM's.
    pub dns: Option<Dns>,
}

/// `mtu`: 0 or absent leaves the kernel's.
fn parse_mtu(mtu: Option<i64>) -> Result<Option<u32>> {
    match mtu {
        None | Some(0) => Ok(None),
        Some(m) if MTU_RANGE.contains(&m) => Ok(Some(m as u32)),
        Some(m) => Err(Error::config(format!("invalid MTU {m}: must be between 68 and 65535"))),
    }
}

/// `vlan`: 0 or absent is none.
fn parse_vlan(vlan: Option<i64>) -> Result<Option<u16>> {
    match vlan {
        None | Some(0) => Ok(None),
        Some(v) if (1..=VLAN_MAX).contains(&v) => Ok(Some(v as u16)),
        Some(v) => Err(Error::config(format!("invalid VLAN ID {v} (must be between 0 and 4094)"))),
    }
}

/// The options that need an IPAM section have one, and the one that excludes it has none.
fn check_layer3(raw: &RawConf, layer3: bool, is_gateway: bool) -> Result<()> {
    if !layer3 {
        let needs_ipam =
            [(is_gateway, "isGateway/isDefaultGateway"), (raw.ip_masq, "ipMasq"), (raw.force_address, "forceAddress")];
        if let Some((_, what)) = needs_ipam.iter().find(|(set, _)| *set) {
            return Err(Error::config(format!("{what} needs an ipam section with a type")));
        }
    }
    if layer3 && raw.disable_container_interface {
        return Err(Error::config("cannot use IPAM when disableContainerInterface is set"));
    }
    Ok(())
}

impl Config {
    pub fn load(ctx: &Context) -> Result<Config> {
        let raw: RawConf = ctx.parse_conf()?;
        ctx.env.args.check_known(&["MAC"])?;
        let bridge = raw.bridge.clone().filter(|b| !b.is_empty()).unwrap_or_else(|| DEFAULT_BRIDGE.to_string());
        validate_ifname(&bridge).map_err(|e| Error::config(format!("invalid bridge name: {}", e.msg)))?;

        let mtu = parse_mtu(raw.mtu)?;
        let vlan = parse_vlan(raw.vlan)?;
        // Since reference v1.8 (containernetworking/plugins#1180) `vlan` with `vlanTrunk` is a trunk whose
        // native VLAN is `vlan` (before: "cannot set vlan and vlanTrunk at the same time").
        let trunk = collect_trunk(raw.vlan_trunk.as_deref().unwrap_or_default())?;
        if raw.hairpin_mode && raw.promisc_mode {
            return Err(Error::config("cannot set hairpin mode and promiscuous mode at the same time"));
        }
        let masq_backend = raw
            .ip_masq_backend
            .as_deref()
            .map(|b| Backend::parse(b).map_err(|e| Error::config(format!("ipMasqBackend: {}", e.msg))))
            .transpose()?;

        let non_masquerade = parse_non_masquerade(raw.non_masquerade_cidrs.as_deref().unwrap_or_default())?;

        let layer3 = cnicore::podlink::ipam_configured(ctx)?;
        let is_gateway = raw.is_gateway || raw.is_default_gateway;
        check_layer3(&raw, layer3, is_gateway)?;
        if vlan.is_some() && is_gateway && bridge.len() + 1 + digits(vlan.unwrap_or(0)) > 15 {
            return Err(Error::config(format!(
                "bridge name {bridge:?} is too long to name its VLAN gateway interface \"{bridge}.<vlan>\" (15 bytes at most)"
            )));
        }

        Ok(Config {
            network: ctx.conf.name.clone(),
            bridge,
            is_gateway,
            is_default_gateway: raw.is_default_gateway,
            force_address: raw.force_address,
            ip_masq: raw.ip_masq,
            masq_backend,
            non_masquerade,
            mtu,
            hairpin: raw.hairpin_mode,
            promisc: raw.promisc_mode,
            vlan,
            trunk,
            preserve_default_vlan: raw.preserve_default_vlan,
            enable_dad: raw.enable_dad,
            mac_spoof_check: raw.mac_spoof_check,
            disable_container_interface: raw.disable_container_interface,
            port_isolation: raw.port_isolation,
            mac: requested_mac(ctx)?,
            layer3,
            dns: ctx.conf.dns.clone().filter(|d| !d.is_empty()),
        })
    }

    pub fn uses_vlans(&self) -> bool {
        self.vlan.is_some() || !self.trunk.is_empty()
    }

    /// The masquerade of the attachment of `container_id` with the pod addresses `ips`.
    pub fn masq<'a>(&'a self, container_id: &'a str, ips: &'a [IpNet]) -> Masq<'a> {
        Masq { network: &self.network, container_id, ips, non_masquerade: &self.non_masquerade }
    }
}

/// At most this many `nonMasqueradeCIDRs` (each is a rule per pod).
const MAX_NON_MASQUERADE: usize = 256;

/// The prefixes of `nonMasqueradeCIDRs`, as Go's `net.ParseCIDR` reads them (host bits are allowed and
/// dropped).
fn parse_non_masquerade(entries: &[String]) -> Result<Vec<IpNet>> {
    if entries.len() > MAX_NON_MASQUERADE {
        return Err(Error::config(format!(
            "nonMasqueradeCIDRs has {} entries, at most {MAX_NON_MASQUERADE} are allowed",
            entries.len()
        )));
    }
    entries
        .iter()
        .map(|entry| {
            entry.parse::<IpNet>().map(|net| net.trunc()).map_err(|_| {
                Error::config(format!(
                    "nonMasqueradeCIDRs: {:?} is not a prefix such as \"10.244.0.0/16\" or \"fd00:10:244::/56\"",
                    cnicore::spec::truncate_for_msg(entry)
                ))
            })
        })
        .collect()
}

fn digits(n: u16) -> usize {
    n.to_string().len()
}

/// The VLAN IDs of `vlanTrunk`, sorted and unique, validated as the reference does.
fn collect_trunk(items: &[VlanTrunk]) -> Result<Vec<u16>> {
    let valid = |v: i64, what: &str| -> Result<u16> {
        if (1..=VLAN_MAX).contains(&v) {
            Ok(v as u16)
        } else {
            Err(Error::config(format!("incorrect trunk {what} parameter {v} (must be between 1 and 4094)")))
        }
    };
    let mut vlans = Vec::new();
    for item in items {
        match (item.min_id, item.max_id) {
            (Some(min), Some(max)) => {
                let (min, max) = (valid(min, "minID")?, valid(max, "maxID")?);
                if max < min {
                    return Err(Error::config("minID is greater than maxID in trunk parameter"));
                }
                vlans.extend(min..=max);
            }
            (None, Some(_)) => {
                return Err(Error::config("minID and maxID should be configured simultaneously, minID is missing"))
            }
            (Some(_), None) => {
                return Err(Error::config("minID and maxID should be configured simultaneously, maxID is missing"))
            }
            (None, None) => {}
        }
        if let Some(id) = item.id {
            vlans.push(valid(id, "id")?);
        }
    }
    vlans.sort_unstable();
    vlans.dedup();
    Ok(vlans)
}

/// The pod MAC asked for, by precedence: `runtimeConfig.mac`, `args.cni.mac`, `CNI_ARGS` `MAC`.
fn requested_mac(ctx: &Context) -> Result<Option<[u8; 6]>> {
    let from_json = |v: Option<&Value>, what: &str| -> Result<Option<String>> {
        match v {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) if s.is_empty() => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(Error::config(format!("{what} must be a string"))),
        }
    };
    let chosen = match from_json(ctx.conf.runtime("mac"), "runtimeConfig.mac")? {
        Some(m) => Some(m),
        None => match from_json(ctx.conf.args_cni("mac"), "args.cni.mac")? {
            Some(m) => Some(m),
            None => ctx.env.args.get("MAC").filter(|m| !m.is_empty()).map(str::to_string),
        },
    };
    chosen.map(|m| parse_mac(&m)).transpose()
}

pub use cnicore::mac::{format as format_mac, parse as parse_mac};

#[cfg(test)]
mod tests {
    use super::*;
    use cnicore::spec::{codes, Command};

    fn ctx(conf: Value) -> Context {
        ctx_args(conf, "")
    }

    fn ctx_args(conf: Value, args: &str) -> Context {
        Context::for_test(Command::Add, serde_json::to_vec(&conf).unwrap(), args)
    }

    fn base() -> Value {
        serde_json::json!({"cniVersion":"1.1.0","name":"n","type":"bridge","ipam":{"type":"host-local"}})
    }

    fn with(key: &str, v: Value) -> Value {
        let mut c = base();
        c[key] = v;
        c
    }

    fn err(conf: Value) -> Error {
        Config::load(&ctx(conf)).unwrap_err()
    }

    #[test]
    fn defaults() {
        let c = Config::load(&ctx(base())).unwrap();
        assert_eq!(c.bridge, "cni0");
        assert!(c.layer3 && !c.preserve_default_vlan && c.mtu.is_none() && c.vlan.is_none());
        assert!(Config::load(&ctx(with("mtu", 0.into()))).unwrap().mtu.is_none());
        assert!(Config::load(&ctx(with("isDefaultGateway", true.into()))).unwrap().is_gateway);
    }

    #[test]
    fn bad_inputs_are_config_errors() {
        let cases = [
            with("bridge", "averyverylongbridgename".into()),
            with("bridge", "br/0".into()),
            with("bridge", "br 0".into()),
            with("mtu", 67.into()),
            with("mtu", 65536.into()),
            with("mtu", (-1).into()),
            with("mtu", "1500".into()),
            with("vlan", 4095.into()),
            with("vlan", (-1).into()),
            with("vlanTrunk", serde_json::json!([{"minID": 10}])),
            with("vlanTrunk", serde_json::json!([{"maxID": 10}])),
            with("vlanTrunk", serde_json::json!([{"minID": 20, "maxID": 10}])),
            with("vlanTrunk", serde_json::json!([{"minID": 0, "maxID": 10}])),
            with("vlanTrunk", serde_json::json!([{"id": 5000}])),
            with("ipMasqBackend", "ebtables".into()),
            with("nonMasqueradeCIDRs", "10.244.0.0/16".into()),
            with("nonMasqueradeCIDRs", serde_json::json!(["10.244.0.0"])),
            with("nonMasqueradeCIDRs", serde_json::json!(["10.244.0.0/33"])),
            with("nonMasqueradeCIDRs", serde_json::json!(["cluster"])),
            with("nonMasqueradeCIDRs", serde_json::json!([16])),
            with("nonMasqueradeCIDRs", serde_json::json!(vec!["10.0.0.0/8"; 257])),
            with("ipam", serde_json::json!({"subnet": "10.0.0.0/24"})),
            with("ipam", serde_json::json!({"type": "../x"})),
            with("ipam", "host-local".into()),
        ];
        for conf in cases {
            let e = err(conf.clone());
            assert_eq!(e.code, codes::INVALID_CONFIG, "{conf}: {e:?}");
        }
        let mut hp = with("hairpinMode", true.into());
        hp["promiscMode"] = true.into();
        assert!(err(hp).msg.contains("hairpin"));
        let mut l2 = base();
        l2.as_object_mut().unwrap().remove("ipam");
        l2["ipMasq"] = true.into();
        assert!(err(l2).msg.contains("ipMasq"));
        assert!(err(with("disableContainerInterface", true.into())).msg.contains("IPAM"));
    }

    #[test]
    fn vlan_semantics_of_reference_v1_8() {
        let mut both = with("vlan", 5.into());
        both["vlanTrunk"] = serde_json::json!([{"id": 6}, {"minID": 8, "maxID": 9}]);
        let c = Config::load(&ctx(both.clone())).unwrap();
        assert_eq!((c.vlan, c.trunk.clone(), c.preserve_default_vlan), (Some(5), vec![6, 8, 9], false));
        assert!(c.uses_vlans());
        both["preserveDefaultVlan"] = true.into();
        assert!(Config::load(&ctx(both)).unwrap().preserve_default_vlan);
    }

    #[test]
    fn non_masquerade_cidrs() {
        assert!(Config::load(&ctx(base())).unwrap().non_masquerade.is_empty());
        assert!(Config::load(&ctx(with("nonMasqueradeCIDRs", Value::Null))).unwrap().non_masquerade.is_empty());
        let c =
            Config::load(&ctx(with("nonMasqueradeCIDRs", serde_json::json!(["10.244.7.1/16", "fd00:10:244::/56"]))))
                .unwrap();
        let want: Vec<IpNet> = vec!["10.244.0.0/16".parse().unwrap(), "fd00:10:244::/56".parse().unwrap()];
        assert_eq!(c.non_masquerade, want);
        // Go's key matching: any case.
        let c = Config::load(&ctx(with("nonmasqueradecidrs", serde_json::json!(["10.244.0.0/16"])))).unwrap();
        assert_eq!(c.non_masquerade, want[..1]);
        let e = err(with("nonMasqueradeCIDRs", serde_json::json!(["10.244.0.0"])));
        assert!(e.msg.contains("nonMasqueradeCIDRs") && e.msg.contains("10.244.0.0"), "{}", e.msg);
    }

    #[test]
    fn trunk_ranges() {
        let c =
            Config::load(&ctx(with("vlanTrunk", serde_json::json!([{"minID": 3, "maxID": 5}, {"id": 4}, {"id": 9}]))))
                .unwrap();
        assert_eq!(c.trunk, vec![3, 4, 5, 9]);
    }

    #[test]
    fn layer2_without_ipam() {
        let mut c = base();
        c.as_object_mut().unwrap().remove("ipam");
        assert!(!Config::load(&ctx(c.clone())).unwrap().layer3);
        c["ipam"] = serde_json::json!({});
        assert!(!Config::load(&ctx(c)).unwrap().layer3);
    }

    #[test]
    fn mac_precedence() {
        let mut c = base();
        c["args"] = serde_json::json!({"cni": {"mac": "02:00:00:00:00:02"}});
        let got = Config::load(&ctx_args(c.clone(), "MAC=02:00:00:00:00:03")).unwrap().mac;
        assert_eq!(got, Some([2, 0, 0, 0, 0, 2]));
        c["runtimeConfig"] = serde_json::json!({"mac": "02-00-00-00-00-01"});
        assert_eq!(Config::load(&ctx(c)).unwrap().mac, Some([2, 0, 0, 0, 0, 1]));
        assert_eq!(Config::load(&ctx_args(base(), "MAC=02:00:00:00:00:03")).unwrap().mac, Some([2, 0, 0, 0, 0, 3]));
        for bad in ["01:00:00:00:00:01", "00:00:00:00:00:00", "zz:00:00:00:00:01", "02:00:00:00:00"] {
            assert!(Config::load(&ctx_args(base(), &format!("MAC={bad}"))).is_err(), "{bad}");
        }
        assert!(Config::load(&ctx_args(base(), "FOO=1")).is_err());
        assert!(Config::load(&ctx_args(base(), "FOO=1;IgnoreUnknown=1")).is_ok());
    }

    #[test]
    fn go_spellings_of_the_config_and_mac_capability() {
        let c = Config::load(&ctx(serde_json::json!({"cniVersion":"1.1.0","name":"n","type":"bridge",
            "IPAM":{"Type":"host-local"},"Bridge":"cbr0","IsGateway":true,"IPMasq":true,"MTU":1460,
            "HairpinMode":true,"RuntimeConfig":{"MAC":"02:00:00:00:00:07"}})))
        .unwrap();
        assert_eq!(
            (c.bridge.as_str(), c.is_gateway, c.ip_masq, c.mtu, c.hairpin),
            ("cbr0", true, true, Some(1460), true)
        );
        assert!(c.layer3);
        assert_eq!(c.mac, Some([2, 0, 0, 0, 0, 7]));
        let c = Config::load(&ctx(with("args", serde_json::json!({"CNI":{"Mac":"02:00:00:00:00:08"}})))).unwrap();
        assert_eq!(c.mac, Some([2, 0, 0, 0, 0, 8]));
    }

    #[test]
    fn del_ignores_a_bad_mac_capability() {
        let conf = with("runtimeConfig", serde_json::json!({"mac": "nonsense"}));
        assert!(Config::load(&ctx(conf.clone())).is_err());
        let del = Context::for_test(Command::Del, serde_json::to_vec(&conf).unwrap(), "MAC=zz");
        assert!(del.load_for_teardown(Config::load).unwrap().mac.is_none());
    }
}
