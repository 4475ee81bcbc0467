//! Results of every spec version, held in one canonical (1.1.0) shape and converted as libcni does.
//!
//! - 0.1.0 / 0.2.0: `{ip4: {ip, gateway, routes}, ip6: {...}, dns}`; down-conversion keeps the first address of
//!   each family and fails when there is none.
//! - 0.3.0 / 0.3.1 / 0.4.0: `interfaces`, `ips` (with `version: "4" | "6"`), `routes`, `dns`.
//! - 1.0.0: as 0.4.0 without `version`.
//! - 1.1.0: adds interface `mtu`, `socketPath`, `pciID` and route `mtu`, `advmss`, `priority`, `table`, `scope`.
//!   Converted down as libcni 1.2/1.3 does: 1.0.0 keeps all of them (one Go type serves 1.0.0 and 1.1.0);
//!   0.x drops the interface fields and keeps the route fields (routes are one Go type in every version).

use super::error::{codes, Error, Result};
use super::version::Version;
use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::net::IpAddr;

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Interface {
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub mac: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub sandbox: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub socket_path: String,
    #[serde(default, rename = "pciID", skip_serializing_if = "String::is_empty")]
    pub pci_id: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IpConfig {
    /// Address with its prefix length (`10.1.2.3/24`).
    pub address: IpNet,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<IpAddr>,
    /// Index into `interfaces`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface: Option<usize>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Route {
    pub dst: IpNet,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gw: Option<IpAddr>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub advmss: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub table: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<u8>,
}

impl Route {
    pub fn new(dst: IpNet, gw: Option<IpAddr>) -> Route {
        Route { dst, gw, mtu: None, advmss: None, priority: None, table: None, scope: None }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dns {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nameservers: Vec<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub domain: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub search: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
}

impl Dns {
    pub fn is_empty(&self) -> bool {
        *self == Dns::default()
    }
}

/// A result in the canonical shape. `to_json` renders it in any version.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CniResult {
    pub interfaces: Vec<Interface>,
    pub ips: Vec<IpConfig>,
    pub routes: Vec<Route>,
    pub dns: Dns,
}

/// The 0.3.x/0.4.0 address shape, and the 1.x one when `version` is absent.
#[derive(Deserialize)]
struct IpConfigAnyVersion {
    address: IpNet,
    #[serde(default)]
    gateway: Option<IpAddr>,
    #[serde(default)]
    interface: Option<usize>,
}

#[derive(Deserialize)]
struct CurrentShape {
    #[serde(default)]
    interfaces: Vec<Interface>,
    #[serde(default)]
    ips: Vec<IpConfigAnyVersion>,
    #[serde(default)]
    routes: Vec<Route>,
    #[serde(default)]
    dns: Option<Dns>,
}

#[derive(Deserialize, Serialize)]
struct LegacyIp {
    ip: IpNet,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    gateway: Option<IpAddr>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    /// `types.Route`, shared by every version in libcni: a route keeps its 1.1.0 fields in any version.
    routes: Vec<Route>,
}

#[derive(Deserialize)]
struct LegacyShape {
    #[serde(default)]
    ip4: Option<LegacyIp>,
    #[serde(default)]
    ip6: Option<LegacyIp>,
    #[serde(default)]
    dns: Option<Dns>,
}

impl CniResult {
    /// Parses a result of any supported version (its own `cniVersion` says which).
    pub fn from_json(v: &Value) -> Result<CniResult> {
        let version = super::gojson::field(v, "cniVersion").and_then(Value::as_str).unwrap_or("");
        let version = Version::parse_supported(version)?;
        let bad = |e: serde_json::Error| {
            Error::new(
                codes::DECODE,
                format!("failed to parse {version} result: {}", super::gojson::shorten_json_error(&e)),
            )
        };
        if version.legacy_result() {
            let l: LegacyShape = super::gojson::from_value(v).map_err(bad)?;
            let mut r = CniResult { dns: l.dns.unwrap_or_default(), ..Default::default() };
            for ip in [l.ip4, l.ip6].into_iter().flatten() {
                r.ips.push(IpConfig { address: ip.ip, gateway: ip.gateway, interface: None });
                r.routes.extend(ip.routes);
            }
            return Ok(r);
        }
        let c: CurrentShape = super::gojson::from_value(v).map_err(bad)?;
        let r = CniResult {
            interfaces: c.interfaces,
            ips: c
                .ips
                .into_iter()
                .map(|i| IpConfig { address: i.address, gateway: i.gateway, interface: i.interface })
                .collect(),
            routes: c.routes,
            dns: c.dns.unwrap_or_default(),
        };
        if let Some(bad_ref) = r.ips.iter().find_map(|i| i.interface.filter(|&n| n >= r.interfaces.len())) {
            return Err(Error::new(
                codes::DECODE,
                format!("result ip refers to interface {bad_ref}, which does not exist"),
            ));
        }
        Ok(r)
    }

    /// Renders the result in `version`, converting as libcni does.
    pub fn to_json(&self, version: Version) -> Result<Value> {
        let cni_version = version.to_string();
        if version.legacy_result() {
            return self.to_legacy_json(&cni_version);
        }
        // As libcni 1.2/1.3: 1.0.0 and 1.1.0 share one result type (types/100), so a 1.1.0 result converted to
        // 1.0.0 keeps the interface's mtu, socketPath and pciID; 0.x interfaces (types/040) have no such fields.
        let v1 = version >= Version::V100;
        let interfaces: Vec<Interface> = self
            .interfaces
            .iter()
            .map(|i| {
                if v1 {
                    i.clone()
                } else {
                    Interface { mtu: None, socket_path: String::new(), pci_id: String::new(), ..i.clone() }
                }
            })
            .collect();
        let ips: Vec<Value> = self
            .ips
            .iter()
            .map(|ip| {
                let mut o = serde_json::to_value(ip).unwrap_or(Value::Null);
                if version < Version::V100 {
                    o["version"] = if ip.address.addr().is_ipv4() { "4" } else { "6" }.into();
                }
                o
            })
            .collect();
        // Routes are libcni's `types.Route` in every version: their mtu, advmss, priority, table and scope stay.
        let routes: Vec<Route> = self.routes.clone();
        let mut out = json!({ "cniVersion": cni_version });
        if !interfaces.is_empty() {
            out["interfaces"] = serde_json::to_value(interfaces).unwrap_or(Value::Null);
        }
        if !ips.is_empty() {
            out["ips"] = Value::Array(ips);
        }
        if !routes.is_empty() {
            out["routes"] = serde_json::to_value(routes).unwrap_or(Value::Null);
        }
        out["dns"] = serde_json::to_value(&self.dns).unwrap_or(Value::Null);
        Ok(out)
    }

    fn to_legacy_json(&self, cni_version: &str) -> Result<Value> {
        let first = |v4: bool| self.ips.iter().find(|i| i.address.addr().is_ipv4() == v4);
        let legacy = |ip: &IpConfig| LegacyIp {
            ip: ip.address,
            gateway: ip.gateway,
            routes: self
                .routes
                .iter()
                .filter(|r| r.dst.addr().is_ipv4() == ip.address.addr().is_ipv4())
                .cloned()
                .collect(),
        };
        let (ip4, ip6) = (first(true).map(legacy), first(false).map(legacy));
        if ip4.is_none() && ip6.is_none() {
            return Err(Error::new(
                codes::INCOMPATIBLE_VERSION,
                format!("cannot convert result to version {cni_version}: no valid IP addresses"),
            ));
        }
        let mut out = json!({ "cniVersion": cni_version });
        if let Some(ip4) = ip4 {
            out["ip4"] = serde_json::to_value(ip4).unwrap_or(Value::Null);
        }
        if let Some(ip6) = ip6 {
            out["ip6"] = serde_json::to_value(ip6).unwrap_or(Value::Null);
        }
        out["dns"] = serde_json::to_value(&self.dns).unwrap_or(Value::Null);
        Ok(out)
    }

    /// Converts a result JSON of any version to `to` (what libcni's `NewResultFromResult` + `GetAsVersion` do).
    pub fn convert(v: &Value, to: Version) -> Result<Value> {
        CniResult::from_json(v)?.to_json(to)
    }

    /// Index of the interface inside the given sandbox with the given name.
    pub fn sandbox_interface(&self, ifname: &str) -> Option<usize> {
        self.interfaces.iter().position(|i| i.name == ifname && !i.sandbox.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::SUPPORTED_VERSIONS;

    fn dual_stack() -> CniResult {
        CniResult {
            interfaces: vec![
                Interface { name: "cbr0".into(), mac: "aa:bb:cc:dd:ee:01".into(), ..Default::default() },
                Interface {
                    name: "eth0".into(),
                    mac: "aa:bb:cc:dd:ee:02".into(),
                    mtu: Some(1450),
                    sandbox: "/run/netns/p".into(),
                    ..Default::default()
                },
            ],
            ips: vec![
                IpConfig {
                    address: "10.1.0.5/24".parse().unwrap(),
                    gateway: Some("10.1.0.1".parse().unwrap()),
                    interface: Some(1),
                },
                IpConfig { address: "10.1.0.6/24".parse().unwrap(), gateway: None, interface: Some(1) },
                IpConfig {
                    address: "fd00::5/64".parse().unwrap(),
                    gateway: Some("fd00::1".parse().unwrap()),
                    interface: Some(1),
                },
            ],
            routes: vec![
                Route {
                    mtu: Some(1400),
                    ..Route::new("0.0.0.0/0".parse().unwrap(), Some("10.1.0.1".parse().unwrap()))
                },
                Route::new("::/0".parse().unwrap(), None),
            ],
            dns: Dns {
                nameservers: vec!["10.96.0.10".into()],
                search: vec!["svc.cluster.local".into()],
                ..Default::default()
            },
        }
    }

    /// Round trip through every pair of versions: what survives is what the lower of the two can carry.
    #[test]
    fn every_version_pair() {
        let full = dual_stack();
        for from in SUPPORTED_VERSIONS {
            let from_v = Version::parse(from).unwrap();
            let at_from = full.to_json(from_v).unwrap();
            assert_eq!(at_from["cniVersion"], *from);
            for to in SUPPORTED_VERSIONS {
                let to_v = Version::parse(to).unwrap();
                let converted = CniResult::convert(&at_from, to_v).unwrap();
                assert_eq!(converted["cniVersion"], *to, "{from} -> {to}");
                let back = CniResult::from_json(&converted).unwrap();
                let lowest = from_v.min(to_v);
                let expected = CniResult::from_json(&full.to_json(lowest).unwrap()).unwrap();
                assert_eq!(back, expected, "{from} -> {to}");
                if to_v.legacy_result() {
                    assert_eq!(converted["ip4"]["ip"], "10.1.0.5/24");
                    assert_eq!(converted["ip6"]["ip"], "fd00::5/64");
                    assert!(converted.get("ips").is_none());
                    assert_eq!(converted["dns"]["nameservers"][0], "10.96.0.10");
                } else if to_v < Version::V100 {
                    assert!(converted["ips"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .all(|i| i["version"] == "4" || i["version"] == "6"));
                } else {
                    assert!(converted["ips"][0].get("version").is_none());
                }
                // libcni keeps route fields in every version, and interface mtu from 1.0.0 on.
                let route = if to_v.legacy_result() { &converted["ip4"]["routes"][0] } else { &converted["routes"][0] };
                assert!(route.get("mtu").is_some(), "{from} -> {to}: {route}");
                let iface_mtu =
                    converted["interfaces"].as_array().into_iter().flatten().any(|i| i.get("mtu").is_some());
                assert_eq!(iface_mtu, from_v >= Version::V100 && to_v >= Version::V100, "{from} -> {to}");
            }
        }
    }

    #[test]
    fn legacy_keeps_first_of_each_family_and_its_routes() {
        let v = dual_stack().to_json(Version::V020).unwrap();
        assert_eq!(v["ip4"]["gateway"], "10.1.0.1");
        assert_eq!(v["ip4"]["routes"][0]["dst"], "0.0.0.0/0");
        assert_eq!(v["ip6"]["routes"][0]["dst"], "::/0");
        let up = CniResult::from_json(&v).unwrap();
        assert_eq!(up.ips.len(), 2);
        assert_eq!(up.ips[0].interface, None);
        assert_eq!(up.routes.len(), 2);
    }

    #[test]
    fn legacy_without_addresses_fails_clearly() {
        let r = CniResult { interfaces: dual_stack().interfaces, ..Default::default() };
        for v in [Version::V010, Version::V020] {
            let e = r.to_json(v).unwrap_err();
            assert!(e.msg.contains("no valid IP addresses"), "{}", e.msg);
        }
        assert!(r.to_json(Version::V031).is_ok());
    }

    #[test]
    fn parses_reference_outputs() {
        let v: Value = serde_json::from_str(
            r#"{"cniVersion":"0.3.1","interfaces":[{"name":"eth0","sandbox":"/x"}],
               "ips":[{"version":"4","address":"10.0.0.2/24","gateway":"10.0.0.1","interface":0}],"dns":{}}"#,
        )
        .unwrap();
        let r = CniResult::from_json(&v).unwrap();
        assert_eq!(r.ips[0].interface, Some(0));
        assert_eq!(r.sandbox_interface("eth0"), Some(0));
        let bad: Value =
            serde_json::from_str(r#"{"cniVersion":"1.0.0","ips":[{"address":"10.0.0.2/24","interface":3}]}"#).unwrap();
        assert_eq!(CniResult::from_json(&bad).unwrap_err().code, codes::DECODE);
        let unknown: Value = serde_json::from_str(r#"{"cniVersion":"9.9.9"}"#).unwrap();
        assert_eq!(CniResult::from_json(&unknown).unwrap_err().code, codes::INCOMPATIBLE_VERSION);
        let wrong: Value = serde_json::from_str(r#"{"cniVersion":"1.0.0","ips":[{"address":"nope"}]}"#).unwrap();
        assert_eq!(CniResult::from_json(&wrong).unwrap_err().code, codes::DECODE);
    }
}
