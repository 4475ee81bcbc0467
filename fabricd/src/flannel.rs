//! flannel's formats, so that a cluster that ran flanneld keeps its config and every node its subnet: the
//! network config at `<prefix>/config`, one lease per node at `<prefix>/subnets/10.244.3.0-24`, and
//! `subnet.env`. JSON keys match case-insensitively, as Go's encoding/json does.

use std::net::Ipv4Addr;

use ipnet::Ipv4Net;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The default flanneld `--etcd-prefix`.
pub const DEFAULT_PREFIX: &str = "/coreos.com/network";
/// The vxlan backend's defaults (flannel's `flannel.<VNI>` device, VNI 1, the kernel's port 8472).
pub const DEFAULT_VNI: u32 = 1;
pub const DEFAULT_VXLAN_PORT: u16 = 8472;
/// Bytes of a vxlan header over IPv4: outer IP 20 + UDP 8 + VXLAN 8 + inner Ethernet 14.
pub const VXLAN_OVERHEAD: u32 = 50;

/// How packets reach another node's pods.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    /// A route to each peer's subnet via its node address: peers must share the L2 segment.
    HostGw,
    /// An overlay; with `direct_routing`, peers on the same L2 segment get host-gw routes instead.
    Vxlan { direct_routing: bool },
}

impl BackendKind {
    /// The `BackendType` of a lease.
    pub fn type_name(self) -> &'static str {
        match self {
            BackendKind::HostGw => "host-gw",
            BackendKind::Vxlan { .. } => "vxlan",
        }
    }
}

/// The cluster's network config (`<prefix>/config`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetworkConfig {
    pub network: Ipv4Net,
    pub subnet_len: u8,
    /// First and last subnet that may be leased (flannel's `SubnetMin`/`SubnetMax`).
    pub subnet_min: Ipv4Addr,
    pub subnet_max: Ipv4Addr,
    pub backend: BackendKind,
    pub vni: u32,
    pub port: u16,
}

#[derive(Deserialize)]
#[serde(rename_all = "lowercase")]
struct RawConfig {
    network: Option<Ipv4Net>,
    subnetlen: Option<u8>,
    subnetmin: Option<Ipv4Addr>,
    subnetmax: Option<Ipv4Addr>,
    backend: Option<RawBackend>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "lowercase")]
struct RawBackend {
    r#type: Option<String>,
    vni: Option<u32>,
    port: Option<u16>,
    directrouting: Option<bool>,
}

/// flannel writes and reads these with Go's encoding/json: keys match case-insensitively and null is absent,
/// as `cnicore::spec::gojson` decodes them.
fn parse_go<T: serde::de::DeserializeOwned>(text: &[u8]) -> Result<T, String> {
    cnicore::spec::gojson::from_slice(text).map_err(|e| e.to_string())
}

impl NetworkConfig {
    pub fn parse(text: &[u8]) -> Result<NetworkConfig, String> {
        let raw: RawConfig = parse_go(text).map_err(|e| format!("bad network config: {e}"))?;
        let network = raw.network.ok_or("bad network config: \"Network\" is missing")?.trunc();
        let backend_raw = raw.backend.unwrap_or_default();
        let backend = match backend_raw.r#type.as_deref().unwrap_or("udp") {
            "host-gw" => BackendKind::HostGw,
            "vxlan" => BackendKind::Vxlan { direct_routing: backend_raw.directrouting.unwrap_or(false) },
            other => return Err(format!("backend type {other:?} is not supported: use \"vxlan\" or \"host-gw\"")),
        };
        // flannel's defaults: /24 subnets in a network of /22 or larger, else 4 bits more than the network.
        let subnet_len = raw.subnetlen.unwrap_or(if network.prefix_len() < 24 { 24 } else { network.prefix_len() + 4 });
        if subnet_len <= network.prefix_len() || subnet_len > 30 {
            return Err(format!("bad network config: SubnetLen {subnet_len} does not fit in {network}"));
        }
        let first = u32::from(network.network()) + (1 << (32 - subnet_len));
        let last = u32::from(network.broadcast()) - (1 << (32 - subnet_len)) + 1;
        let subnet_min = raw.subnetmin.unwrap_or(Ipv4Addr::from(first));
        let subnet_max = raw.subnetmax.unwrap_or(Ipv4Addr::from(last));
        if !network.contains(&subnet_min) || !network.contains(&subnet_max) || subnet_min > subnet_max {
            return Err(format!("bad network config: SubnetMin/SubnetMax {subnet_min}..{subnet_max} not in {network}"));
        }
        Ok(NetworkConfig {
            network,
            subnet_len,
            subnet_min,
            subnet_max,
            backend,
            vni: backend_raw.vni.unwrap_or(DEFAULT_VNI),
            port: match backend_raw.port {
                None | Some(0) => DEFAULT_VXLAN_PORT,
                Some(port) => port,
            },
        })
    }

    /// True when `subnet` may be leased under this config (right length, within SubnetMin..SubnetMax).
    pub fn allows(&self, subnet: &Ipv4Net) -> bool {
        subnet.prefix_len() == self.subnet_len
            && subnet.network() >= self.subnet_min
            && subnet.network() <= self.subnet_max
    }

    /// The vxlan device's name.
    pub fn vxlan_device(&self) -> String {
        format!("flannel.{}", self.vni)
    }

    /// Up to `limit` leasable subnets not in `taken`, in address order (flannel picks one of the first 100 at
    /// random, which spreads nodes that start together).
    pub fn free_subnets(&self, taken: &[Ipv4Net], limit: usize) -> Vec<Ipv4Net> {
        let step = 1u64 << (32 - self.subnet_len);
        let mut free = Vec::new();
        let mut address = u64::from(u32::from(self.subnet_min));
        while address <= u64::from(u32::from(self.subnet_max)) && free.len() < limit {
            let subnet = Ipv4Net::new(Ipv4Addr::from(address as u32), self.subnet_len).expect("valid length");
            if !taken.iter().any(|t| t.contains(&subnet.network()) || subnet.contains(&t.network())) {
                free.push(subnet);
            }
            address += step;
        }
        free
    }
}

/// A lease's value: the node's public address and how to reach its pods.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseAttrs {
    pub public_ip: Ipv4Addr,
    pub backend_type: String,
    /// vxlan: the node's VTEP MAC.
    pub vtep_mac: Option<[u8; 6]>,
    /// vxlan: the VNI the node uses.
    pub vni: Option<u32>,
}

#[derive(Serialize)]
struct LeaseJson<'a> {
    #[serde(rename = "PublicIP")]
    public_ip: String,
    #[serde(rename = "PublicIPv6")]
    public_ipv6: Option<String>,
    #[serde(rename = "BackendType")]
    backend_type: &'a str,
    #[serde(rename = "BackendData")]
    backend_data: Option<Value>,
}

#[derive(Deserialize)]
#[serde(rename_all = "lowercase")]
struct RawLease {
    publicip: Ipv4Addr,
    backendtype: Option<String>,
    backenddata: Option<RawBackendData>,
}

#[derive(Deserialize)]
#[serde(rename_all = "lowercase")]
struct RawBackendData {
    vni: Option<u32>,
    vtepmac: Option<String>,
}

pub fn parse_mac(text: &str) -> Option<[u8; 6]> {
    let bytes: Vec<u8> = text.split(':').map(|part| u8::from_str_radix(part, 16).ok()).collect::<Option<_>>()?;
    bytes.try_into().ok()
}

impl LeaseAttrs {
    pub fn to_json(&self) -> String {
        let backend_data = match (self.vni, self.vtep_mac) {
            (Some(vni), Some(mac)) => Some(serde_json::json!({ "VNI": vni, "VtepMAC": cnicore::mac::format(&mac) })),
            _ => None,
        };
        let json = LeaseJson {
            public_ip: self.public_ip.to_string(),
            public_ipv6: None,
            backend_type: &self.backend_type,
            backend_data,
        };
        serde_json::to_string(&json).expect("serialisable")
    }

    pub fn parse(text: &[u8]) -> Result<LeaseAttrs, String> {
        let raw: RawLease = parse_go(text).map_err(|e| format!("bad lease: {e}"))?;
        let (vni, vtep_mac) = match raw.backenddata {
            Some(data) => {
                let mac = match data.vtepmac {
                    Some(text) => Some(parse_mac(&text).ok_or_else(|| format!("bad lease: VtepMAC {text:?}"))?),
                    None => None,
                };
                (data.vni, mac)
            }
            None => (None, None),
        };
        Ok(LeaseAttrs { public_ip: raw.publicip, backend_type: raw.backendtype.unwrap_or_default(), vtep_mac, vni })
    }
}

/// `10.244.3.0-24`: the last element of a lease's key.
pub fn subnet_key(subnet: &Ipv4Net) -> String {
    format!("{}-{}", subnet.network(), subnet.prefix_len())
}

pub fn parse_subnet_key(key: &str) -> Option<Ipv4Net> {
    let last = key.rsplit('/').next()?;
    let (address, length) = last.split_once('-')?;
    let subnet = Ipv4Net::new(address.parse().ok()?, length.parse().ok()?).ok()?;
    (subnet.trunc() == subnet).then_some(subnet)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flannel_config() {
        let config =
            NetworkConfig::parse(br#"{"Network":"10.244.0.0/16","SubnetLen":24,"Backend":{"Type":"vxlan"}}"#).unwrap();
        assert_eq!(config.network, "10.244.0.0/16".parse().unwrap());
        assert_eq!(
            (config.subnet_min, config.subnet_max),
            ("10.244.1.0".parse().unwrap(), "10.244.255.0".parse().unwrap())
        );
        assert_eq!(config.backend, BackendKind::Vxlan { direct_routing: false });
        assert_eq!((config.vni, config.port, config.vxlan_device()), (1, 8472, "flannel.1".to_string()));
        // Go's key matching, nulls as absent, the defaults.
        let config = NetworkConfig::parse(br#"{"network":"10.1.0.0/16","subnetmin":null,"backend":{"type":"vxlan","VNI":4,"Port":4789,"directRouting":true}}"#).unwrap();
        assert_eq!((config.subnet_len, config.vni, config.port), (24, 4, 4789));
        assert_eq!(config.backend, BackendKind::Vxlan { direct_routing: true });
        assert!(NetworkConfig::parse(br#"{"Network":"10.1.0.0/16","Backend":{"Type":"udp"}}"#)
            .unwrap_err()
            .contains("udp"));
        assert!(NetworkConfig::parse(br#"{"Network":"10.1.0.0/16","SubnetLen":8}"#).is_err());
    }

    #[test]
    fn free_subnets_skip_leased_ones() {
        let config =
            NetworkConfig::parse(br#"{"Network":"10.244.0.0/22","SubnetLen":24,"Backend":{"Type":"host-gw"}}"#)
                .unwrap();
        let taken = ["10.244.1.0/24".parse().unwrap()];
        let free = config.free_subnets(&taken, 100);
        let expected: Vec<Ipv4Net> = ["10.244.2.0/24".parse().unwrap(), "10.244.3.0/24".parse().unwrap()].into();
        assert_eq!(free, expected);
        assert!(config.allows(&"10.244.1.0/24".parse().unwrap()));
        assert!(!config.allows(&"10.244.0.0/24".parse().unwrap()));
    }

    #[test]
    fn leases_in_flannels_format() {
        let attrs = LeaseAttrs {
            public_ip: "192.168.0.3".parse().unwrap(),
            backend_type: "vxlan".into(),
            vtep_mac: Some([0x0e, 0xfd, 1, 2, 3, 4]),
            vni: Some(1),
        };
        let json = attrs.to_json();
        assert_eq!(
            json,
            r#"{"PublicIP":"192.168.0.3","PublicIPv6":null,"BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"0e:fd:01:02:03:04"}}"#
        );
        assert_eq!(LeaseAttrs::parse(json.as_bytes()).unwrap(), attrs);
        let host_gw = LeaseAttrs::parse(br#"{"PublicIP":"192.168.0.4","BackendType":"host-gw"}"#).unwrap();
        assert_eq!((host_gw.vtep_mac, host_gw.backend_type.as_str()), (None, "host-gw"));
        assert_eq!(
            parse_subnet_key("/coreos.com/network/subnets/10.244.3.0-24"),
            Some("10.244.3.0/24".parse().unwrap())
        );
        assert_eq!(parse_subnet_key("/coreos.com/network/subnets/10.244.3.1-24"), None);
        assert_eq!(subnet_key(&"10.244.3.0/24".parse().unwrap()), "10.244.3.0-24");
    }
}
