//! The firewall plugin's config: the reference's fields (`backend`, `iptablesAdminChainName`, `firewalldZone`,
//! `ingressPolicy`) plus `dataDir` (ours: where attachment records for GC are kept), validated before anything
//! touches the node.

use std::path::PathBuf;

use cnicore::firewall::{validate_chain_name, Backend as Kernel};
use cnicore::spec::{truncate_for_msg, validate_container_id, Context, Error, Result};
use ipnet::IpNet;
use serde::Deserialize;

/// The reference's admin chain, jumped first from `CNI-FORWARD`.
pub const DEFAULT_ADMIN_CHAIN: &str = "CNI-ADMIN";
/// The firewalld zone the reference puts container addresses in.
pub const DEFAULT_ZONE: &str = "trusted";
/// Where attachment records are kept unless `dataDir` says otherwise.
pub const DEFAULT_DATA_DIR: &str = "/var/lib/cni/firewall";

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawConf {
    #[serde(default)]
    backend: Option<String>,
    #[serde(default)]
    iptables_admin_chain_name: Option<String>,
    #[serde(default)]
    firewalld_zone: Option<String>,
    #[serde(default)]
    ingress_policy: Option<String>,
    #[serde(default)]
    data_dir: Option<PathBuf>,
}

/// `ingressPolicy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IngressPolicy {
    /// `""` or `"open"`: nothing beyond the accept rules.
    Open,
    /// `"same-bridge"`: traffic from another isolated bridge to this one is dropped (the reference's
    /// `CNI-ISOLATION-STAGE-1/2` chains).
    SameBridge,
    /// `"isolated"` (reference v1.7): as same-bridge, and containers on the bridge are also cut off from each
    /// other (Docker's `enable_icc=false`).
    Isolated,
}

impl IngressPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            IngressPolicy::Open => "open",
            IngressPolicy::SameBridge => "same-bridge",
            IngressPolicy::Isolated => "isolated",
        }
    }
}

/// The bridge isolation an attachment asks for: its bridge (prevResult's first interface, as in the
/// reference) and whether the bridge's own ports are cut off from each other too.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Isolation {
    pub bridge: String,
    pub within_bridge: bool,
}

#[derive(Debug, Clone)]
pub struct Config {
    pub network: String,
    pub container_id: String,
    pub ifname: String,
    /// The `backend` field; `None` (`""` or absent): firewalld when it runs on the system bus, else the
    /// machine's default (iptables when installed, else nftables).
    pub backend: Option<Backend>,
    pub admin_chain: String,
    pub zone: String,
    pub ingress_policy: IngressPolicy,
    pub data_dir: PathBuf,
}

impl Config {
    pub fn parse(ctx: &Context) -> Result<Config> {
        let raw: RawConf = ctx.parse_conf()?;
        // The network name is checked by the entry point; GC and STATUS have no container.
        if !ctx.env.container_id.is_empty() {
            validate_container_id(&ctx.env.container_id)?;
        }
        let backend = match raw.backend.as_deref().unwrap_or("") {
            "" => None,
            name => Some(Backend::parse(name).ok_or_else(|| {
                Error::config(format!(
                    "unknown firewall backend {:?}: must be \"iptables\", \"nftables\", \"firewalld\" or empty",
                    truncate_for_msg(name)
                ))
            })?),
        };
        let admin_chain = non_empty(raw.iptables_admin_chain_name).unwrap_or_else(|| DEFAULT_ADMIN_CHAIN.into());
        validate_chain_name("iptablesAdminChainName", &admin_chain)?;
        let zone = non_empty(raw.firewalld_zone).unwrap_or_else(|| DEFAULT_ZONE.into());
        validate_zone(&zone)?;
        let ingress_policy = match raw.ingress_policy.as_deref().unwrap_or("") {
            "" | "open" => IngressPolicy::Open,
            "same-bridge" => IngressPolicy::SameBridge,
            "isolated" => IngressPolicy::Isolated,
            other => return Err(Error::config(format!("unknown ingress policy: {:?}", truncate_for_msg(other)))),
        };
        let data_dir = raw.data_dir.filter(|d| !d.as_os_str().is_empty()).unwrap_or_else(|| DEFAULT_DATA_DIR.into());
        if !data_dir.is_absolute() {
            return Err(Error::config(format!(
                "dataDir {:?} must be an absolute path",
                data_dir.display().to_string()
            )));
        }
        Ok(Config {
            network: ctx.conf.name.clone(),
            container_id: ctx.env.container_id.clone(),
            ifname: ctx.env.ifname.clone(),
            backend,
            admin_chain,
            zone,
            ingress_policy,
            data_dir,
        })
    }
}

fn non_empty(value: Option<String>) -> Option<String> {
    value.filter(|v| !v.is_empty())
}

/// firewalld zone names are file names of its config (`<zone>.xml`): letters, digits, `_`, `-`, `/`... are its
/// own rule; here only what can travel safely: at most 64 characters, no control characters, no NUL.
fn validate_zone(zone: &str) -> Result<()> {
    if zone.len() > 64 || zone.chars().any(char::is_control) {
        return Err(Error::config(format!("invalid firewalldZone {:?}", truncate_for_msg(zone))));
    }
    Ok(())
}

/// A bridge name from prevResult, before it goes into a rule: the characters of the interface names the
/// bridge plugin and podman make (letters, digits, `_`, `.`, `-`), at most 15 bytes.
pub fn validate_bridge_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 15
        && !name.starts_with('-')
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
    if !ok {
        return Err(Error::config(format!(
            "bridge name {:?} from prevResult cannot be used in a firewall rule",
            truncate_for_msg(name)
        )));
    }
    Ok(())
}

/// The container addresses the rules are for: every address of prevResult, as a host prefix (`/32`, `/128`),
/// in order, each once (the reference's `ipString`).
pub fn host_addresses(ips: impl IntoIterator<Item = IpNet>) -> Vec<IpNet> {
    let mut out: Vec<IpNet> = Vec::new();
    for ip in ips {
        let host = IpNet::from(ip.addr());
        if !out.contains(&host) {
            out.push(host);
        }
    }
    out
}

/// A backend, as a config's `backend` and an attachment record name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Iptables,
    Nftables,
    Firewalld,
}

impl Backend {
    /// The one parse of a backend's name (a config's `backend`, a record's); `None` for any other text.
    pub fn parse(name: &str) -> Option<Backend> {
        match name {
            "iptables" => Some(Backend::Iptables),
            "nftables" => Some(Backend::Nftables),
            "firewalld" => Some(Backend::Firewalld),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Backend::Iptables => "iptables",
            Backend::Nftables => "nftables",
            Backend::Firewalld => "firewalld",
        }
    }

    /// The kernel backend that holds this backend's isolation rules: its own, for firewalld the machine's
    /// default (iptables as in the reference, nftables where iptables is not installed).
    pub fn isolation_kernel(self) -> Result<Kernel> {
        match self {
            Backend::Iptables => Ok(Kernel::Iptables),
            Backend::Nftables => Ok(Kernel::Nftables),
            Backend::Firewalld => Kernel::detect(),
        }
    }
}

impl From<Kernel> for Backend {
    fn from(kernel: Kernel) -> Backend {
        match kernel {
            Kernel::Iptables => Backend::Iptables,
            Kernel::Nftables => Backend::Nftables,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cnicore::spec::{codes, Command};

    fn parse(json: &str) -> Result<Config> {
        Config::parse(&Context::for_test(Command::Add, json, ""))
    }

    #[test]
    fn defaults_are_the_reference_ones() {
        let c = parse(r#"{"cniVersion":"0.4.0","name":"podman","type":"firewall","backend":""}"#).unwrap();
        assert_eq!(c.backend, None);
        assert_eq!(c.admin_chain, "CNI-ADMIN");
        assert_eq!(c.zone, "trusted");
        assert_eq!(c.ingress_policy, IngressPolicy::Open);
        assert_eq!(c.data_dir, PathBuf::from(DEFAULT_DATA_DIR));
        let c = parse(r#"{"name":"n","Backend":null,"IPTABLESADMINCHAINNAME":"MY-ADMIN","firewalldZone":"internal","ingressPolicy":"same-bridge"}"#).unwrap();
        assert_eq!((c.backend, c.admin_chain.as_str(), c.zone.as_str()), (None, "MY-ADMIN", "internal"));
        assert_eq!(c.ingress_policy, IngressPolicy::SameBridge);
        assert_eq!(
            parse(r#"{"name":"n","ingressPolicy":"isolated"}"#).unwrap().ingress_policy,
            IngressPolicy::Isolated
        );
        assert_eq!(parse(r#"{"name":"n","backend":"nftables"}"#).unwrap().backend, Some(Backend::Nftables));
        assert_eq!(parse(r#"{"name":"n","backend":"firewalld"}"#).unwrap().backend, Some(Backend::Firewalld));
    }

    #[test]
    fn bad_values_are_config_errors() {
        for bad in [
            r#"{"name":"n","backend":"ipfw"}"#,
            r#"{"name":"n","iptablesAdminChainName":"-j ACCEPT"}"#,
            r#"{"name":"n","iptablesAdminChainName":"A-CHAIN-NAME-LONGER-THAN-28-CHARS"}"#,
            r#"{"name":"n","ingressPolicy":"closed"}"#,
            r#"{"name":"n","firewalldZone":"a\u0000b"}"#,
            r#"{"name":"n","dataDir":"relative/dir"}"#,
            r#"{"name":"n","backend":7}"#,
        ] {
            assert_eq!(parse(bad).unwrap_err().code, codes::INVALID_CONFIG, "{bad}");
        }
    }

    #[test]
    fn bridge_names() {
        validate_bridge_name("cni-podman0").unwrap();
        for bad in ["", "-i", "a b", "a\"b", "sixteen-chars-xx", "a+"] {
            assert!(validate_bridge_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn host_addresses_are_deduplicated_host_prefixes() {
        let ips: Vec<IpNet> =
            ["10.88.0.2/16", "fd00::2/64", "10.88.0.2/24"].iter().map(|s| s.parse().unwrap()).collect();
        let hosts: Vec<String> = host_addresses(ips).iter().map(ToString::to_string).collect();
        assert_eq!(hosts, ["10.88.0.2/32", "fd00::2/128"]);
    }
}
