//! The portmap config, validated as a whole before anything is applied.

use std::net::IpAddr;

use cnicore::firewall::conditions::Conditions;
use cnicore::firewall::{validate_chain_name, validate_owner, Backend, Family};
use cnicore::spec::{truncate_for_msg, CniResult, Context, Error, Result};
use ipnet::IpNet;
use serde::Deserialize;

/// Kubernetes uses bits 14 and 15, Calico 20–31 (as the reference).
pub const DEFAULT_MARK_BIT: u32 = 13;

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawConf {
    #[serde(default)]
    snat: Option<bool>,
    #[serde(default, rename = "conditionsV4")]
    conditions_v4: Option<Vec<String>>,
    #[serde(default, rename = "conditionsV6")]
    conditions_v6: Option<Vec<String>>,
    #[serde(default)]
    masq_all: Option<bool>,
    #[serde(default)]
    mark_masq_bit: Option<i64>,
    #[serde(default)]
    external_set_mark_chain: Option<String>,
    #[serde(default)]
    backend: Option<String>,
    #[serde(default)]
    runtime_config: Option<RawRuntimeConfig>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawRuntimeConfig {
    #[serde(default)]
    port_mappings: Option<Vec<RawMapping>>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawMapping {
    #[serde(default)]
    host_port: Option<i64>,
    #[serde(default)]
    container_port: Option<i64>,
    #[serde(default)]
    protocol: Option<String>,
    #[serde(default, rename = "hostIP")]
    host_ip: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Protocol {
    Sctp,
    Tcp,
    Udp,
}

impl Protocol {
    fn parse(text: &str) -> Option<Protocol> {
        match text.to_ascii_lowercase().as_str() {
            "tcp" => Some(Protocol::Tcp),
            "udp" => Some(Protocol::Udp),
            "sctp" => Some(Protocol::Sctp),
            _ => None,
        }
    }

    /// The name iptables and nft use (also the reference's sort order: sctp < tcp < udp).
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
            Protocol::Sctp => "sctp",
        }
    }

    /// The IP protocol number (`inet_proto`).
    pub fn number(self) -> u8 {
        match self {
            Protocol::Tcp => 6,
            Protocol::Udp => 17,
            Protocol::Sctp => 132,
        }
    }
}

/// One `runtimeConfig.portMappings` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortMapping {
    pub host_port: u16,
    pub container_port: u16,
    pub protocol: Protocol,
    /// `hostIP`: limits the mapping to its family, and (unless unspecified, `0.0.0.0` / `::`) to that address.
    pub host_ip: Option<IpAddr>,
}

impl PortMapping {
    /// True when the mapping applies to container addresses of `family` (the reference skips a mapping whose
    /// hostIP is of the other family).
    pub fn applies_to(&self, family: Family) -> bool {
        self.host_ip.is_none_or(|ip| Family::of(ip) == family)
    }

    /// The destination address the mapping is limited to, if any.
    pub fn host_destination(&self) -> Option<IpAddr> {
        self.host_ip.filter(|ip| !ip.is_unspecified())
    }
}

/// The validated config.
#[derive(Debug, Clone)]
pub struct Config {
    pub network: String,
    pub container_id: String,
    pub backend: Backend,
    pub snat: bool,
    pub masq_all: bool,
    pub mark_bit: u32,
    pub external_set_mark_chain: Option<String>,
    pub conditions_v4: Conditions,
    pub conditions_v6: Conditions,
    pub mappings: Vec<PortMapping>,
}

impl Config {
    /// Parses and checks everything; nothing is applied before this succeeds.
    pub fn load(ctx: &Context) -> Result<Config> {
        let raw: RawConf = ctx.parse_conf()?;
        // STATUS (and GC) have no container; the entry point has validated the ID of the other verbs.
        if ctx.env.command.is_attachment_verb() {
            validate_owner(&ctx.conf.name, &ctx.env.container_id)?;
        }

        let conditions_v4 =
            Conditions::parse_any("conditionsV4", Family::V4, raw.conditions_v4.as_deref().unwrap_or_default())?;
        let conditions_v6 =
            Conditions::parse_any("conditionsV6", Family::V6, raw.conditions_v6.as_deref().unwrap_or_default())?;
        let backend = resolve_backend(raw.backend.as_deref(), [&conditions_v4, &conditions_v6])?;
        if raw.mark_masq_bit.is_some() && raw.external_set_mark_chain.is_some() {
            return Err(Error::config("cannot specify externalSetMarkChain and markMasqBit together"));
        }
        let mark_bit = match raw.mark_masq_bit {
            None => DEFAULT_MARK_BIT,
            Some(bit @ 0..=31) => bit as u32,
            Some(bit) => return Err(Error::config(format!("markMasqBit must be between 0 and 31, not {bit}"))),
        };
        if let Some(chain) = &raw.external_set_mark_chain {
            validate_chain_name("externalSetMarkChain", chain)?;
            if backend == Backend::Nftables {
                return Err(Error::config(
                    "externalSetMarkChain names an iptables chain and cannot be used with the nftables backend",
                ));
            }
        }
        let raw_mappings = raw.runtime_config.and_then(|r| r.port_mappings).unwrap_or_default();
        let mappings = raw_mappings.iter().map(parse_mapping).collect::<Result<Vec<_>>>()?;
        check_duplicates(&mappings)?;

        Ok(Config {
            network: ctx.conf.name.clone(),
            container_id: ctx.env.container_id.clone(),
            backend,
            snat: raw.snat.unwrap_or(true),
            masq_all: raw.masq_all.unwrap_or(false),
            mark_bit,
            external_set_mark_chain: raw.external_set_mark_chain,
            conditions_v4,
            conditions_v6,
            mappings,
        })
    }

    pub fn conditions(&self, family: Family) -> &Conditions {
        match family {
            Family::V4 => &self.conditions_v4,
            Family::V6 => &self.conditions_v6,
        }
    }

    /// The masquerade mark as (value, mask): both `1 << markMasqBit`.
    pub fn mark(&self) -> u32 {
        1u32 << self.mark_bit
    }
}

/// The backend: the configured one, else nftables when conditions are in nft syntax, else the machine's
/// default. Conditions that only one backend can use are refused with the other, as the reference refuses
/// backend-specific options for the wrong backend (iptables conditions with the nftables backend are translated
/// where they can be: addresses, interfaces, addrtype, mark).
fn resolve_backend(configured: Option<&str>, conditions: [&Conditions; 2]) -> Result<Backend> {
    let nft_syntax = conditions.iter().any(|c| c.is_nft());
    let backend = match configured {
        None if nft_syntax => Backend::Nftables,
        other => Backend::resolve(other)?,
    };
    let names = ["conditionsV4", "conditionsV6"];
    let wrong: Vec<&str> = match backend {
        Backend::Iptables => names.iter().zip(conditions).filter(|(_, c)| c.is_nft()).map(|(n, _)| *n).collect(),
        Backend::Nftables => {
            names.iter().zip(conditions).filter(|(_, c)| c.has_passthrough()).map(|(n, _)| *n).collect()
        }
    };
    if !wrong.is_empty() {
        let other = match backend {
            Backend::Iptables => "nftables",
            Backend::Nftables => "iptables",
        };
        return Err(Error::config(format!(
            "{backend} backend was requested but configuration contains {other}-specific options {wrong:?}"
        )));
    }
    Ok(backend)
}

fn port(what: &str, value: Option<i64>) -> Result<u16> {
    match value {
        Some(p @ 1..=65535) => Ok(p as u16),
        Some(p) => Err(Error::config(format!("invalid {what} number {p}: must be 1-65535"))),
        None => Err(Error::config(format!("port mapping without {what}"))),
    }
}

fn parse_mapping(raw: &RawMapping) -> Result<PortMapping> {
    let host_port = port("host port", raw.host_port)?;
    let container_port = port("container port", raw.container_port)?;
    let protocol_text = raw.protocol.as_deref().unwrap_or("");
    let protocol = Protocol::parse(protocol_text).ok_or_else(|| {
        Error::config(format!(
            "unknown protocol {:?} in port mapping: must be tcp, udp or sctp",
            truncate_for_msg(protocol_text)
        ))
    })?;
    let host_ip = match raw.host_ip.as_deref() {
        None | Some("") => None,
        Some(text) => Some(
            text.parse::<IpAddr>()
                .map_err(|_| Error::config(format!("invalid hostIP {:?} in port mapping", truncate_for_msg(text))))?,
        ),
    };
    Ok(PortMapping { host_port, container_port, protocol, host_ip })
}

/// Two mappings that would claim the same traffic (same protocol and host port, a family both apply to, and
/// the same address or one of them on every address).
fn check_duplicates(mappings: &[PortMapping]) -> Result<()> {
    for (i, a) in mappings.iter().enumerate() {
        for b in &mappings[i + 1..] {
            if a.protocol != b.protocol || a.host_port != b.host_port {
                continue;
            }
            let shared_family = [Family::V4, Family::V6].into_iter().any(|f| a.applies_to(f) && b.applies_to(f));
            let overlap = match (a.host_destination(), b.host_destination()) {
                (Some(x), Some(y)) => x == y,
                _ => true,
            };
            if shared_family && overlap {
                return Err(Error::config(format!(
                    "host port {}/{} is mapped twice",
                    a.protocol.as_str(),
                    a.host_port
                )));
            }
        }
    }
    Ok(())
}

/// The container's addresses (with prefix) as the reference picks them from prevResult: the first IPv4 and the
/// first IPv6 address that is not on a known non-sandbox interface or another interface than `ifname`.
pub fn container_ips(result: &CniResult, ifname: &str) -> Vec<IpNet> {
    let mut v4 = None;
    let mut v6 = None;
    for ip in &result.ips {
        let slot = match Family::of_net(&ip.address) {
            Family::V4 => &mut v4,
            Family::V6 => &mut v6,
        };
        if slot.is_some() {
            continue;
        }
        if let Some(interface) = ip.interface.and_then(|index| result.interfaces.get(index)) {
            if interface.name != ifname || interface.sandbox.is_empty() {
                continue;
            }
        }
        *slot = Some(ip.address);
    }
    v4.into_iter().chain(v6).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mapping(proto: Protocol, port: u16, host_ip: Option<&str>) -> PortMapping {
        PortMapping {
            host_port: port,
            container_port: 80,
            protocol: proto,
            host_ip: host_ip.map(|h| h.parse().unwrap()),
        }
    }

    #[test]
    fn duplicates() {
        let tcp = Protocol::Tcp;
        assert!(check_duplicates(&[mapping(tcp, 80, None), mapping(tcp, 80, None)]).is_err());
        assert!(check_duplicates(&[mapping(tcp, 80, None), mapping(tcp, 80, Some("10.0.0.1"))]).is_err());
        assert!(check_duplicates(&[mapping(tcp, 80, Some("10.0.0.1")), mapping(tcp, 80, Some("10.0.0.1"))]).is_err());
        check_duplicates(&[mapping(tcp, 80, None), mapping(Protocol::Udp, 80, None)]).unwrap();
        check_duplicates(&[mapping(tcp, 80, Some("10.0.0.1")), mapping(tcp, 80, Some("10.0.0.2"))]).unwrap();
        check_duplicates(&[mapping(tcp, 80, Some("0.0.0.0")), mapping(tcp, 80, Some("::"))]).unwrap();
        check_duplicates(&[mapping(tcp, 80, Some("10.0.0.1")), mapping(tcp, 80, Some("fd00::1"))]).unwrap();
    }

    #[test]
    fn mapping_fields() {
        let raw = |hp: i64, cp: i64, proto: &str, ip: &str| RawMapping {
            host_port: Some(hp),
            container_port: Some(cp),
            protocol: Some(proto.into()),
            host_ip: Some(ip.into()),
        };
        assert_eq!(parse_mapping(&raw(8080, 80, "TCP", "")).unwrap().protocol, Protocol::Tcp);
        for bad in [
            raw(0, 80, "tcp", ""),
            raw(70000, 80, "tcp", ""),
            raw(80, -1, "tcp", ""),
            raw(80, 80, "icmp", ""),
            raw(80, 80, "", ""),
            raw(80, 80, "tcp", "1.2.3"),
        ] {
            assert_eq!(parse_mapping(&bad).unwrap_err().code, cnicore::spec::codes::INVALID_CONFIG);
        }
        let m = parse_mapping(&raw(80, 80, "udp", "0.0.0.0")).unwrap();
        assert!(m.applies_to(Family::V4) && !m.applies_to(Family::V6) && m.host_destination().is_none());
    }

    #[test]
    fn containerd_go_field_names() {
        // go-cni's PortMapping has no json tags: containerd sends Go field names.
        let conf = r#"{"cniVersion":"1.0.0","name":"n","type":"portmap","backend":"iptables","runtimeConfig":{
            "portMappings":[{"HostPort":8082,"ContainerPort":80,"Protocol":"tcp","HostIP":""},
                            {"HostPort":5353,"ContainerPort":53,"Protocol":"UDP","HostIP":"10.0.0.1"}]}}"#;
        let c = Config::load(&Context::for_test(cnicore::spec::Command::Add, conf, "")).unwrap();
        assert_eq!(
            c.mappings,
            vec![
                mapping(Protocol::Tcp, 8082, None),
                PortMapping {
                    host_port: 5353,
                    container_port: 53,
                    protocol: Protocol::Udp,
                    host_ip: Some("10.0.0.1".parse().unwrap())
                },
            ]
        );
        let conf =
            r#"{"cniVersion":"1.0.0","name":"n","type":"portmap","SNAT":false,"MarkMasqBit":5,"Backend":"iptables"}"#;
        let c = Config::load(&Context::for_test(cnicore::spec::Command::Add, conf, "")).unwrap();
        assert_eq!((c.snat, c.mark_bit), (false, 5));
    }

    #[test]
    fn conditions_choose_and_bind_the_backend() {
        let load = |extra: &str| {
            let conf = format!(r#"{{"cniVersion":"1.0.0","name":"n","type":"portmap"{extra}}}"#);
            Config::load(&Context::for_test(cnicore::spec::Command::Add, conf, ""))
        };
        // nft syntax (reference v1.6+): the nftables backend, the text kept for its DNAT chain.
        let c = load(r#","conditionsV4":["ip","saddr","!=","192.0.2.0/24"]"#).unwrap();
        assert_eq!(c.backend, Backend::Nftables);
        assert_eq!(c.conditions_v4.nft().unwrap(), " ip saddr != 192.0.2.0/24");
        let e = load(r#","backend":"iptables","conditionsV6":["ip6","saddr","fd00::/8"]"#).unwrap_err();
        assert!(e.msg.contains("nftables-specific options [\"conditionsV6\"]"), "{}", e.msg);
        // Any iptables match: with the iptables backend passed through, with nftables refused.
        let c = load(r#","backend":"iptables","conditionsV4":["-m","conntrack","--ctstate","NEW"]"#).unwrap();
        assert!(c.conditions_v4.has_passthrough());
        let e = load(r#","backend":"nftables","conditionsV4":["-m","conntrack","--ctstate","NEW"]"#).unwrap_err();
        assert!(e.msg.contains("iptables-specific options"), "{}", e.msg);
        // Translated ones still work with nftables.
        assert_eq!(
            load(r#","backend":"nftables","conditionsV4":["!","-d","192.0.2.0/24"]"#).unwrap().backend,
            Backend::Nftables
        );
        // Hostile ones stay errors, in both forms.
        assert!(load(r#","conditionsV4":["ip","saddr","1.2.3.4","accept"]"#).is_err());
        assert!(load(r#","backend":"iptables","conditionsV4":["-j","ACCEPT"]"#).is_err());
    }

    #[test]
    fn del_ignores_malformed_mappings() {
        let conf = r#"{"cniVersion":"1.0.0","name":"n","type":"portmap","backend":"iptables",
            "runtimeConfig":{"portMappings":[{"containerPort":80}]}}"#;
        let add = Context::for_test(cnicore::spec::Command::Add, conf, "");
        assert!(Config::load(&add).unwrap_err().msg.contains("without host port"));
        let del = Context::for_test(cnicore::spec::Command::Del, conf, "");
        assert!(del.load_for_teardown(Config::load).unwrap().mappings.is_empty());
    }
}
