//! flannel's formats, so that a cluster that ran flanneld keeps its config and every node its subnet: the
//! network config (etcd's `<prefix>/config`, or `net-conf.json` in Kubernetes mode), and a lease's key and value
//! as flanneld writes them at `<prefix>/subnets/10.244.3.0-24`. JSON keys match case-insensitively, as Go's
//! encoding/json does. (`subnet.env` is `node.rs`'s, through cnicore; the Node annotations are
//! `source::kube::annotations`'.)

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::backend::{BackendConfig, LeaseData, OptionsError};
use crate::family::{number, Family};

/// The default flanneld `--etcd-prefix`.
pub const DEFAULT_PREFIX: &str = "/coreos.com/network";
/// Why a network config or a lease in flannel's format cannot be used.
#[derive(Debug)]
pub enum FormatError {
    /// Not JSON of the expected shape (`what`: "network config", "lease").
    Json { what: &'static str, source: serde_json::Error },
    /// A key the config needs is missing.
    Missing(&'static str),
    /// Neither `EnableIPv4` nor `EnableIPv6`.
    NoFamily,
    /// The subnet length (`key`) does not fit in the network.
    SubnetLen { key: &'static str, length: u8, network: IpNet },
    /// The leasable range (`keys`) is not inside the network.
    SubnetRange { keys: &'static str, min: IpAddr, max: IpAddr, network: IpNet },
    /// The `Backend` object.
    Backend(OptionsError),
}

impl std::fmt::Display for FormatError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FormatError::Json { what, source } => write!(f, "bad {what}: {source}"),
            FormatError::Missing(key) => write!(f, "bad network config: {key:?} is missing"),
            FormatError::NoFamily => f.write_str("bad network config: neither EnableIPv4 nor EnableIPv6"),
            FormatError::SubnetLen { key, length, network } => {
                write!(f, "bad network config: {key} {length} does not fit in {network}")
            }
            FormatError::SubnetRange { keys, min, max, network } => {
                write!(f, "bad network config: {keys} {min}..{max} not in {network}")
            }
            FormatError::Backend(e) => write!(f, "bad network config: {e}"),
        }
    }
}

impl std::error::Error for FormatError {}

/// The keys that name one family's subnet length and range in the config.
struct FamilyKeys {
    length: &'static str,
    range: &'static str,
}

/// One family's address plan: its Network, the length of a node's subnet, and the leasable range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FamilyNetwork {
    pub network: IpNet,
    pub subnet_len: u8,
    /// First and last subnet that may be leased (flannel's `SubnetMin`/`SubnetMax`, `IPv6SubnetMin`/`Max`).
    pub subnet_min: IpAddr,
    pub subnet_max: IpAddr,
}

impl FamilyNetwork {
    /// The plan for `network` with flannel's defaults for what is not given. `default_len`: the subnet length
    /// when none is given.
    fn new(
        network: IpNet,
        subnet_len: Option<u8>,
        min: Option<IpAddr>,
        max: Option<IpAddr>,
        default_len: u8,
        keys: FamilyKeys,
    ) -> Result<FamilyNetwork, FormatError> {
        let network = network.trunc();
        let family = Family::of(network.addr());
        let subnet_len = subnet_len.unwrap_or(default_len);
        let limit = family.bits() - 2;
        if subnet_len <= network.prefix_len() || subnet_len > limit {
            return Err(FormatError::SubnetLen { key: keys.length, length: subnet_len, network });
        }
        let size = 1u128 << (family.bits() - subnet_len);
        let first = family.address(number(network.network()) + size);
        let last = family.address(number(network.broadcast()) - size + 1);
        let subnet_min = min.unwrap_or(first);
        let subnet_max = max.unwrap_or(last);
        if !network.contains(&subnet_min) || !network.contains(&subnet_max) || subnet_min > subnet_max {
            return Err(FormatError::SubnetRange { keys: keys.range, min: subnet_min, max: subnet_max, network });
        }
        Ok(FamilyNetwork { network, subnet_len, subnet_min, subnet_max })
    }

    pub fn family(&self) -> Family {
        Family::of(self.network.addr())
    }

    /// True when `subnet` may be leased (right length, within the leasable range).
    pub fn allows(&self, subnet: &IpNet) -> bool {
        subnet.prefix_len() == self.subnet_len
            && Family::of(subnet.addr()) == self.family()
            && subnet.network() >= self.subnet_min
            && subnet.network() <= self.subnet_max
    }

    /// Up to `limit` leasable subnets not in `taken`, in address order (flannel picks one of the first 100 at
    /// random, which spreads nodes that start together).
    pub fn free_subnets(&self, taken: &[IpNet], limit: usize) -> Vec<IpNet> {
        let family = self.family();
        let step = 1u128 << (family.bits() - self.subnet_len);
        // The taken blocks as address ranges sorted by start, walked once beside the candidates: a cluster
        // leases from the bottom, so checking each candidate against every lease was quadratic (5,000 leases:
        // 25 million checks, most of a dual-stack cold start's CPU).
        let mut ranges: Vec<(u128, u128)> = taken
            .iter()
            .filter(|t| Family::of(t.addr()) == family)
            .map(|t| (number(t.network()), number(t.broadcast())))
            .collect();
        ranges.sort_unstable();
        let mut ranges = ranges.into_iter().peekable();
        let mut free = Vec::new();
        let mut address = number(self.subnet_min);
        let last = number(self.subnet_max);
        while address <= last && free.len() < limit {
            let end = address.saturating_add(step - 1);
            // Blocks ending before this candidate cannot overlap it or any later one.
            while ranges.next_if(|&(_, taken_end)| taken_end < address).is_some() {}
            // The first block left ends at or after `address`; every later one starts at or after it.
            let next = match ranges.peek() {
                Some(&(start, taken_end)) if start <= end => {
                    // Leased: on to the first candidate past that block.
                    address.checked_add(((taken_end - address) / step + 1).saturating_mul(step))
                }
                _ => {
                    free.push(IpNet::new(family.address(address), self.subnet_len).expect("valid length"));
                    address.checked_add(step)
                }
            };
            match next {
                Some(next) => address = next,
                None => break,
            }
        }
        free
    }
}

/// The cluster's network config (`<prefix>/config`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetworkConfig {
    /// `EnableIPv4` (default true): `Network`, `SubnetLen`, `SubnetMin`, `SubnetMax`.
    pub v4: Option<FamilyNetwork>,
    /// `EnableIPv6`: `IPv6Network`, `IPv6SubnetLen`, `IPv6SubnetMin`, `IPv6SubnetMax`.
    pub v6: Option<FamilyNetwork>,
    /// The `Backend` object and the backend it configures.
    pub backend: BackendConfig,
    /// flannel's `EnableNFTables`: the masquerade in nftables (flanneld's tables `ip flannel-ipv4` and
    /// `ip6 flannel-ipv6`, chain `postrtg`) unless --firewall-backend says otherwise.
    pub enable_nftables: bool,
}

#[derive(Deserialize)]
#[serde(rename_all = "lowercase")]
struct RawConfig {
    enableipv4: Option<bool>,
    enableipv6: Option<bool>,
    network: Option<Ipv4Net>,
    subnetlen: Option<u8>,
    subnetmin: Option<Ipv4Addr>,
    subnetmax: Option<Ipv4Addr>,
    ipv6network: Option<Ipv6Net>,
    ipv6subnetlen: Option<u8>,
    ipv6subnetmin: Option<Ipv6Addr>,
    ipv6subnetmax: Option<Ipv6Addr>,
    enablenftables: Option<bool>,
    backend: Option<Value>,
}

/// IPv6's minimum link MTU (RFC 8200): below it the kernel turns IPv6 off on the device.
const IPV6_MIN_MTU: u32 = 1280;

/// With IPv6 enabled, a backend `MTU` option must leave pods at least IPv6's minimum MTU.
fn check_ipv6_mtu(backend: &BackendConfig, v4: bool, v6: bool) -> Result<(), FormatError> {
    let Some(mtu) = backend.configured_mtu().filter(|_| v6) else { return Ok(()) };
    let families = [(v4, Family::V4), (v6, Family::V6)];
    let overhead = families.iter().filter(|(on, _)| *on).map(|(_, f)| backend.overhead(*f)).max().unwrap_or(0);
    if mtu.saturating_sub(overhead) >= IPV6_MIN_MTU {
        return Ok(());
    }
    Err(FormatError::Backend(OptionsError::BadOption {
        backend: backend.type_name(),
        key: "MTU",
        why: format!(
            "{mtu} leaves pods {} bytes after the tunnel's {overhead}; IPv6 (EnableIPv6) needs at least {IPV6_MIN_MTU}",
            mtu.saturating_sub(overhead)
        ),
    }))
}

/// flannel writes and reads these with Go's encoding/json: keys match case-insensitively and null is absent,
/// as `cnicore::spec::gojson` decodes them.
fn parse_go<T: serde::de::DeserializeOwned>(what: &'static str, text: &[u8]) -> Result<T, FormatError> {
    cnicore::spec::gojson::from_slice(text).map_err(|source| FormatError::Json { what, source })
}

impl NetworkConfig {
    /// The config with the backend's defaults (tests; the agent builds backends with its context).
    #[cfg(test)]
    pub fn parse(text: &[u8]) -> Result<NetworkConfig, FormatError> {
        NetworkConfig::parse_with(text, &crate::backend::BackendContext::default())
    }

    /// The config, its backend built with `context`.
    pub fn parse_with(text: &[u8], context: &crate::backend::BackendContext) -> Result<NetworkConfig, FormatError> {
        let raw: RawConfig = parse_go("network config", text)?;
        let options = raw.backend.unwrap_or_else(|| serde_json::json!({}));
        let backend = BackendConfig::parse(options, context).map_err(FormatError::Backend)?;
        let v4 = match raw.enableipv4.unwrap_or(true) {
            false => None,
            true => {
                let network = raw.network.ok_or(FormatError::Missing("Network"))?.trunc();
                // /24 subnets in a network of /22 or larger, else 4 bits more than the network.
                let default_len = if network.prefix_len() < 24 { 24 } else { network.prefix_len() + 4 };
                let length = raw.subnetlen.filter(|l| *l > 0);
                let network = FamilyNetwork::new(
                    IpNet::V4(network),
                    length,
                    raw.subnetmin.map(IpAddr::V4),
                    raw.subnetmax.map(IpAddr::V4),
                    default_len,
                    FamilyKeys { length: "SubnetLen", range: "SubnetMin/SubnetMax" },
                )?;
                Some(network)
            }
        };
        let v6 = match raw.enableipv6.unwrap_or(false) {
            false => None,
            true => {
                let network = raw.ipv6network.ok_or(FormatError::Missing("IPv6Network"))?.trunc();
                // flannel: /64 subnets in a network of /62 or larger, else 2 bits more than the network.
                let default_len = if network.prefix_len() <= 62 { 64 } else { network.prefix_len() + 2 };
                let length = raw.ipv6subnetlen.filter(|l| *l > 0);
                let network = FamilyNetwork::new(
                    IpNet::V6(network),
                    length,
                    raw.ipv6subnetmin.map(IpAddr::V6),
                    raw.ipv6subnetmax.map(IpAddr::V6),
                    default_len,
                    FamilyKeys { length: "IPv6SubnetLen", range: "IPv6SubnetMin/IPv6SubnetMax" },
                )?;
                Some(network)
            }
        };
        if v4.is_none() && v6.is_none() {
            return Err(FormatError::NoFamily);
        }
        check_ipv6_mtu(&backend, v4.is_some(), v6.is_some())?;
        Ok(NetworkConfig { v4, v6, backend, enable_nftables: raw.enablenftables.unwrap_or(false) })
    }

    /// The plan of `family`, when it is enabled.
    pub fn family(&self, family: Family) -> Option<&FamilyNetwork> {
        match family {
            Family::V4 => self.v4.as_ref(),
            Family::V6 => self.v6.as_ref(),
        }
    }

    /// The enabled families' plans.
    pub fn families(&self) -> impl Iterator<Item = &FamilyNetwork> {
        self.v4.iter().chain(self.v6.iter())
    }

    /// The cluster's networks, one per enabled family.
    pub fn networks(&self) -> Vec<IpNet> {
        self.families().map(|f| f.network).collect()
    }

    /// True when `key` has a subnet for exactly the enabled families, each leasable.
    pub fn allows(&self, key: &SubnetKey) -> bool {
        Family::ALL.into_iter().all(|family| match (self.family(family), key.get(family)) {
            (Some(plan), Some(subnet)) => plan.allows(&subnet),
            (None, None) => true,
            _ => false,
        })
    }
}

/// A lease's subnets: its key in the store (`10.244.3.0-24`, `10.244.3.0-24&fd00:10:244:3::-64`, and for an
/// IPv6-only lease `0.0.0.0-0&fd00:10:244:3::-64`, as flannel writes them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct SubnetKey {
    pub v4: Option<Ipv4Net>,
    pub v6: Option<Ipv6Net>,
}

impl SubnetKey {
    #[cfg(test)]
    pub fn v4(subnet: Ipv4Net) -> SubnetKey {
        SubnetKey { v4: Some(subnet), v6: None }
    }

    pub fn get(&self, family: Family) -> Option<IpNet> {
        match family {
            Family::V4 => self.v4.map(IpNet::V4),
            Family::V6 => self.v6.map(IpNet::V6),
        }
    }

    /// Its subnets, IPv4 first.
    pub fn subnets(&self) -> Vec<IpNet> {
        Family::ALL.into_iter().filter_map(|f| self.get(f)).collect()
    }
}

impl std::fmt::Display for SubnetKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let subnets: Vec<String> = self.subnets().iter().map(|s| s.to_string()).collect();
        f.write_str(&subnets.join(" + "))
    }
}

/// A lease's value: the node's public addresses and how to reach its pods.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseAttrs {
    /// `PublicIP` (flannel writes 0.0.0.0 in an IPv6-only lease: None here).
    pub public_ip: Option<Ipv4Addr>,
    pub public_ipv6: Option<Ipv6Addr>,
    pub backend_type: String,
    /// `BackendData`, `BackendV6Data`: each family's data of the backend, as written (the backend reads it).
    pub backend_data: Option<LeaseData>,
    pub backend_v6_data: Option<LeaseData>,
}

impl LeaseAttrs {
    /// The address that identifies the node: its public IPv4 address, else (IPv6-only) its public IPv6 one.
    pub fn node_address(&self) -> Option<IpAddr> {
        self.public(Family::V4).or(self.public(Family::V6))
    }

    /// The node's public address of `family`.
    pub fn public(&self, family: Family) -> Option<IpAddr> {
        match family {
            Family::V4 => self.public_ip.map(IpAddr::V4),
            Family::V6 => self.public_ipv6.map(IpAddr::V6),
        }
    }

    /// The backend data of `family`.
    pub fn data(&self, family: Family) -> Option<&Value> {
        match family {
            Family::V4 => self.backend_data.as_ref().map(LeaseData::value),
            Family::V6 => self.backend_v6_data.as_ref().map(LeaseData::value),
        }
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "lowercase")]
struct RawLease {
    publicip: Option<Ipv4Addr>,
    publicipv6: Option<Ipv6Addr>,
    backendtype: Option<String>,
    backenddata: Option<Value>,
    backendv6data: Option<Value>,
}

impl LeaseAttrs {
    /// The value as flanneld writes it (an IPv4 lease is byte for byte flanneld's; `BackendV6Data` only when
    /// there is IPv6 backend data).
    pub fn to_json(&self) -> String {
        fn json(value: &impl Serialize) -> String {
            serde_json::to_string(value).expect("serialisable")
        }
        let public_ip = self.public_ip.unwrap_or(Ipv4Addr::UNSPECIFIED).to_string();
        let data = |data: &Option<LeaseData>| data.as_ref().map_or("null", LeaseData::text).to_string();
        let mut text = format!(
            r#"{{"PublicIP":{},"PublicIPv6":{},"BackendType":{},"BackendData":{}"#,
            json(&public_ip),
            json(&self.public_ipv6.map(|ip| ip.to_string())),
            json(&self.backend_type),
            data(&self.backend_data)
        );
        if self.backend_v6_data.is_some() {
            text.push_str(&format!(r#","BackendV6Data":{}"#, data(&self.backend_v6_data)));
        }
        text.push('}');
        text
    }

    pub fn parse(text: &[u8]) -> Result<LeaseAttrs, FormatError> {
        let raw: RawLease = parse_go("lease", text)?;
        Ok(LeaseAttrs {
            public_ip: raw.publicip.filter(|ip| !ip.is_unspecified()),
            public_ipv6: raw.publicipv6,
            backend_type: raw.backendtype.unwrap_or_default(),
            backend_data: raw.backenddata.map(LeaseData::from),
            backend_v6_data: raw.backendv6data.map(LeaseData::from),
        })
    }
}

/// `10.244.3.0-24`, `10.244.3.0-24&fd00:10:244:3::-64`, `0.0.0.0-0&fd00:10:244:3::-64`: the last element of a
/// lease's key.
pub fn subnet_key(key: &SubnetKey) -> String {
    let v4 = key.v4.map(|s| format!("{}-{}", s.network(), s.prefix_len())).unwrap_or_else(|| "0.0.0.0-0".into());
    match key.v6 {
        Some(v6) => format!("{v4}&{}-{}", v6.network(), v6.prefix_len()),
        None => v4,
    }
}

pub fn parse_subnet_key(key: &str) -> Option<SubnetKey> {
    let last = key.rsplit('/').next()?;
    let (v4_text, v6_text) = match last.split_once('&') {
        Some((v4, v6)) => (v4, Some(v6)),
        None => (last, None),
    };
    let (address, length) = v4_text.split_once('-')?;
    let v4 = Ipv4Net::new(address.parse().ok()?, length.parse().ok()?).ok()?;
    if v4.trunc() != v4 {
        return None;
    }
    let v6 = match v6_text {
        Some(text) => {
            let (address, length) = text.rsplit_once('-')?;
            let v6 = Ipv6Net::new(address.parse().ok()?, length.parse().ok()?).ok()?;
            if v6.trunc() != v6 {
                return None;
            }
            Some(v6)
        }
        None => None,
    };
    // flannel's IPv6-only lease has the empty IPv4 subnet.
    let v4 = (v4.prefix_len() > 0 || v6.is_none()).then_some(v4);
    Some(SubnetKey { v4, v6 })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(text: &str) -> IpNet {
        text.parse().unwrap()
    }

    #[test]
    fn flannel_config() {
        let config =
            NetworkConfig::parse(br#"{"Network":"10.244.0.0/16","SubnetLen":24,"Backend":{"Type":"vxlan"}}"#).unwrap();
        let v4 = config.v4.clone().unwrap();
        assert_eq!(v4.network, net("10.244.0.0/16"));
        assert_eq!((v4.subnet_min, v4.subnet_max), ("10.244.1.0".parse().unwrap(), "10.244.255.0".parse().unwrap()));
        assert_eq!(config.v6, None);
        assert_eq!(
            format!("{:?}", config.backend),
            "VxlanBackend { vni: 1, port: 8472, direct_routing: false, mtu: None, gbp: false, learning: false }"
        );
        assert_eq!(config.backend.device_name(Family::V4).unwrap(), "flannel.1");
        assert_eq!(config.backend.device_name(Family::V6).unwrap(), "flannel-v6.1");
        // Go's key matching, nulls as absent, the defaults.
        let config = NetworkConfig::parse(br#"{"network":"10.1.0.0/16","subnetmin":null,"backend":{"type":"vxlan","VNI":4,"Port":4789,"directRouting":true}}"#).unwrap();
        assert!(!config.enable_nftables, "flannel's default");
        let nft =
            NetworkConfig::parse(br#"{"Network":"10.1.0.0/16","EnableNFTables":true,"Backend":{"Type":"vxlan"}}"#);
        assert!(nft.unwrap().enable_nftables);
        assert_eq!(config.v4.unwrap().subnet_len, 24);
        assert_eq!(
            format!("{:?}", config.backend),
            "VxlanBackend { vni: 4, port: 4789, direct_routing: true, mtu: None, gbp: false, learning: false }"
        );
        assert!(NetworkConfig::parse(br#"{"Network":"10.1.0.0/16","Backend":{"Type":"udp"}}"#)
            .unwrap_err()
            .to_string()
            .contains("udp"));
        assert!(NetworkConfig::parse(br#"{"Network":"10.1.0.0/16","SubnetLen":8,"Backend":{"Type":"vxlan"}}"#)
            .unwrap_err()
            .to_string()
            .contains("SubnetLen 8"));
    }

    #[test]
    fn a_backend_mtu_leaves_ipv6_pods_their_minimum() {
        let config = |families: &str, mtu: u32| {
            let text = format!(
                r#"{{{families},"Network":"10.244.0.0/16","IPv6Network":"fd00::/56","Backend":{{"Type":"vxlan","MTU":{mtu}}}}}"#
            );
            NetworkConfig::parse(text.as_bytes())
        };
        assert!(config(r#""EnableIPv6":false"#, 1000).is_ok(), "IPv4 only: 68 is the floor");
        assert!(config(r#""EnableIPv6":true"#, 1350).is_ok(), "1280 left after 70");
        let error = config(r#""EnableIPv6":true"#, 1349).unwrap_err().to_string();
        assert!(error.contains("vxlan backend: MTU: 1349 leaves pods 1279 bytes") && error.contains("1280"), "{error}");
    }

    #[test]
    fn flannel_dual_stack_and_ipv6_only_configs() {
        // As flannel's docs write them.
        let config = NetworkConfig::parse(
            br#"{"EnableIPv4":true,"EnableIPv6":true,"Network":"10.244.0.0/16","IPv6Network":"fd00:10:244::/56","Backend":{"Type":"vxlan"}}"#,
        )
        .unwrap();
        let v6 = config.v6.clone().unwrap();
        assert_eq!((v6.network, v6.subnet_len), (net("fd00:10:244::/56"), 64));
        assert_eq!(
            (v6.subnet_min, v6.subnet_max),
            ("fd00:10:244:1::".parse().unwrap(), "fd00:10:244:ff::".parse().unwrap())
        );
        assert_eq!(config.networks(), vec![net("10.244.0.0/16"), net("fd00:10:244::/56")]);
        let only = NetworkConfig::parse(
            br#"{"EnableIPv4":false,"EnableIPv6":true,"IPv6Network":"fd00:10:244::/120","IPv6SubnetLen":124,"Backend":{"Type":"host-gw"}}"#,
        )
        .unwrap();
        assert_eq!(only.v4, None);
        assert_eq!(only.v6.clone().unwrap().subnet_len, 124);
        let free = only.v6.unwrap().free_subnets(&[net("fd00:10:244::10/124")], 2);
        assert_eq!(free, vec![net("fd00:10:244::20/124"), net("fd00:10:244::30/124")]);
        // The defaults for a small network: 2 bits more.
        let small = NetworkConfig::parse(
            br#"{"EnableIPv6":true,"EnableIPv4":false,"IPv6Network":"fd00::/100","Backend":{"Type":"vxlan"}}"#,
        )
        .unwrap();
        assert_eq!(small.v6.unwrap().subnet_len, 102);
        for bad in [
            &br#"{"EnableIPv6":true,"Network":"10.1.0.0/16","Backend":{"Type":"vxlan"}}"#[..],
            br#"{"EnableIPv4":false,"EnableIPv6":true,"IPv6Network":"fd00::/64","IPv6SubnetLen":128,"Backend":{"Type":"vxlan"}}"#,
            br#"{"EnableIPv4":false,"Backend":{"Type":"vxlan"}}"#,
            br#"{"EnableIPv4":false,"EnableIPv6":true,"IPv6Network":"fd00::/48","IPv6SubnetMin":"fd01::","Backend":{"Type":"vxlan"}}"#,
        ] {
            assert!(NetworkConfig::parse(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn free_subnets_skip_leased_ones() {
        let config =
            NetworkConfig::parse(br#"{"Network":"10.244.0.0/22","SubnetLen":24,"Backend":{"Type":"host-gw"}}"#)
                .unwrap();
        let v4 = config.v4.clone().unwrap();
        let free = v4.free_subnets(&[net("10.244.1.0/24")], 100);
        assert_eq!(free, vec![net("10.244.2.0/24"), net("10.244.3.0/24")]);
        assert!(v4.allows(&net("10.244.1.0/24")));
        assert!(!v4.allows(&net("10.244.0.0/24")));
        assert!(config.allows(&SubnetKey::v4("10.244.1.0/24".parse().unwrap())));
        let dual = SubnetKey { v4: Some("10.244.1.0/24".parse().unwrap()), v6: Some("fd00::/64".parse().unwrap()) };
        assert!(!config.allows(&dual), "a family the config does not enable");
    }

    /// The candidates in address order that overlap none of `taken` (the definition, one check per pair).
    fn free_by_definition(plan: &FamilyNetwork, taken: &[IpNet], limit: usize) -> Vec<IpNet> {
        let step = 1u128 << (plan.family().bits() - plan.subnet_len);
        (0..)
            .map(|k: u128| number(plan.subnet_min) + k * step)
            .take_while(|&a| a <= number(plan.subnet_max))
            .map(|a| IpNet::new(plan.family().address(a), plan.subnet_len).unwrap())
            .filter(|s| !taken.iter().any(|t| t.contains(&s.network()) || s.contains(&t.network())))
            .take(limit)
            .collect()
    }

    #[test]
    fn free_subnets_around_blocks_of_any_size() {
        let config = NetworkConfig::parse(
            br#"{"Network":"10.244.0.0/20","SubnetLen":24,"EnableIPv6":true,"IPv6Network":"fd00:10::/56","Backend":{"Type":"vxlan"}}"#,
        )
        .unwrap();
        let (v4, v6) = (config.v4.unwrap(), config.v6.unwrap());
        let cases: &[&[&str]] = &[
            &[],
            &["10.244.1.0/24", "10.244.2.0/24", "10.244.5.0/24"],
            // Nested, larger and smaller than a subnet, unsorted, duplicated, another family, outside.
            &["10.244.4.0/22", "10.244.6.0/24", "10.244.2.128/25", "10.244.1.0/24", "10.244.1.0/24"],
            &["fd00:10:0:1::/64", "10.244.9.0/24", "10.0.0.0/8"],
            &["10.244.0.0/16"],
            &["10.244.15.0/24", "10.244.14.7/32"],
        ];
        for taken in cases {
            let taken: Vec<IpNet> = taken.iter().map(|t| net(t)).collect();
            for limit in [1, 3, 100] {
                assert_eq!(v4.free_subnets(&taken, limit), free_by_definition(&v4, &taken, limit), "{taken:?}");
            }
        }
        let taken6 = [net("fd00:10:0:2::/63"), net("fd00:10:0:1::/64"), net("fd00:10:0:8::/61"), net("10.244.1.0/24")];
        assert_eq!(v6.free_subnets(&taken6, 100), free_by_definition(&v6, &taken6, 100));
    }

    #[test]
    fn free_subnets_after_5000_leases_from_the_bottom() {
        // As a cluster of 5,000 nodes leases them: the first 5,000 /64s, then the next free ones.
        let config = NetworkConfig::parse(
            br#"{"EnableIPv4":false,"EnableIPv6":true,"IPv6Network":"fd00:10::/48","Backend":{"Type":"vxlan"}}"#,
        )
        .unwrap();
        let v6 = config.v6.unwrap();
        let taken: Vec<IpNet> = (1..=5000u32).rev().map(|i| net(&format!("fd00:10:0:{i:x}::/64"))).collect();
        let free = v6.free_subnets(&taken, 100);
        assert_eq!(free.len(), 100);
        assert_eq!(free[0], net("fd00:10:0:1389::/64"));
        assert_eq!(free[99], net("fd00:10:0:13ec::/64"));
    }

    #[test]
    fn leases_in_flannels_format() {
        let attrs = LeaseAttrs {
            public_ip: Some("192.168.0.3".parse().unwrap()),
            public_ipv6: None,
            backend_type: "vxlan".into(),
            backend_data: Some(serde_json::json!({ "VNI": 1, "VtepMAC": "0e:fd:01:02:03:04" }).into()),
            backend_v6_data: None,
        };
        let json = attrs.to_json();
        assert_eq!(
            json,
            r#"{"PublicIP":"192.168.0.3","PublicIPv6":null,"BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"0e:fd:01:02:03:04"}}"#
        );
        assert_eq!(LeaseAttrs::parse(json.as_bytes()).unwrap(), attrs);
        let host_gw = LeaseAttrs::parse(br#"{"PublicIP":"192.168.0.4","BackendType":"host-gw"}"#).unwrap();
        assert_eq!((host_gw.data(Family::V4), host_gw.backend_type.as_str()), (None, "host-gw"));
        assert_eq!(
            parse_subnet_key("/coreos.com/network/subnets/10.244.3.0-24"),
            Some(SubnetKey::v4("10.244.3.0/24".parse().unwrap()))
        );
        assert_eq!(parse_subnet_key("/coreos.com/network/subnets/10.244.3.1-24"), None);
        assert_eq!(subnet_key(&SubnetKey::v4("10.244.3.0/24".parse().unwrap())), "10.244.3.0-24");
    }

    /// A dual-stack and an IPv6-only lease as flanneld (vxlan backend) writes them: key and value (Go's field
    /// order; flanneld omits an empty BackendData, fabricd writes it null as in its IPv4 host-gw leases).
    #[test]
    fn dual_stack_and_ipv6_only_leases_as_flanneld_writes_them() {
        let dual_key = "/coreos.com/network/subnets/10.244.3.0-24&fd00:10:244:3::-64";
        let dual_value = br#"{"PublicIP":"192.168.50.12","PublicIPv6":"fd00:192:168:50::12","BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"a6:2e:5a:91:0c:11"},"BackendV6Data":{"VNI":1,"VtepMAC":"8e:0b:2c:4d:7a:02"}}"#;
        let key = parse_subnet_key(dual_key).unwrap();
        assert_eq!(
            key,
            SubnetKey { v4: Some("10.244.3.0/24".parse().unwrap()), v6: Some("fd00:10:244:3::/64".parse().unwrap()) }
        );
        assert_eq!(subnet_key(&key), "10.244.3.0-24&fd00:10:244:3::-64");
        let attrs = LeaseAttrs::parse(dual_value).unwrap();
        assert_eq!(attrs.public(Family::V6), Some("fd00:192:168:50::12".parse().unwrap()));
        assert_eq!(attrs.data(Family::V4).unwrap()["VtepMAC"], "a6:2e:5a:91:0c:11");
        assert_eq!(attrs.data(Family::V6).unwrap()["VtepMAC"], "8e:0b:2c:4d:7a:02");
        assert_eq!(attrs.to_json().as_bytes(), dual_value, "written back byte for byte");

        let only_key = "/coreos.com/network/subnets/0.0.0.0-0&fd00:10:244:5::-64";
        let ours = br#"{"PublicIP":"0.0.0.0","PublicIPv6":"fd00:192:168:50::14","BackendType":"vxlan","BackendData":null,"BackendV6Data":{"VNI":1,"VtepMAC":"8e:0b:2c:4d:7a:04"}}"#;
        let key = parse_subnet_key(only_key).unwrap();
        assert_eq!(key, SubnetKey { v4: None, v6: Some("fd00:10:244:5::/64".parse().unwrap()) });
        assert_eq!(subnet_key(&key), "0.0.0.0-0&fd00:10:244:5::-64");
        let flanneld = br#"{"PublicIP":"0.0.0.0","PublicIPv6":"fd00:192:168:50::14","BackendType":"vxlan","BackendV6Data":{"VNI":1,"VtepMAC":"8e:0b:2c:4d:7a:04"}}"#;
        let attrs = LeaseAttrs::parse(flanneld).unwrap();
        assert_eq!((attrs.public_ip, attrs.public(Family::V4)), (None, None));
        assert_eq!(attrs.to_json().as_bytes(), ours);
        assert_eq!(LeaseAttrs::parse(ours).unwrap(), attrs);
        assert_eq!(
            parse_subnet_key("/x/subnets/10.244.3.0-24&fd00:10:244:3::1-64"),
            None,
            "not a subnet's first address"
        );
    }
}
