//! The static IPAM configuration, with the reference's sources and precedence (`LoadIPAMConfig`, v1.9):
//!
//! 1. `ipam.addresses` of the config;
//! 2. plus `CNI_ARGS` `IP=` (comma-separated CIDRs), then `GATEWAY=` (comma-separated addresses; each becomes
//!    the gateway of every address so far whose subnet holds it);
//! 3. `args.cni.ips`, when present and not empty, replaces all of them (gateways included);
//! 4. `runtimeConfig.ips` (capability `ips`), when present and not empty, replaces all of them.
//!
//! Results of 0.1.0/0.2.0 hold one address per family, so more is refused for those versions.

use cnicore::spec::{
    codes, truncate_for_msg as truncate, Context, ConventionArgs, Dns, Error, IpsArg, Result, Route, Version,
};
use ipnet::IpNet;
use serde::Deserialize;
use std::net::IpAddr;

/// One address of the result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Address {
    /// The address with its prefix length, host bits kept (`10.1.2.3/24`).
    pub address: IpNet,
    pub gateway: Option<IpAddr>,
}

#[derive(Debug)]
pub struct Config {
    pub addresses: Vec<Address>,
    pub routes: Vec<Route>,
    pub dns: Dns,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct NetConfIn {
    #[serde(default)]
    ipam: Option<IpamIn>,
    #[serde(default)]
    runtime_config: Option<IpsArg>,
    #[serde(default)]
    args: Option<ConventionArgs<IpsArg>>,
}

#[derive(Deserialize)]
struct IpamIn {
    #[serde(default)]
    routes: Option<Vec<Route>>,
    #[serde(default)]
    addresses: Option<Vec<AddressIn>>,
    #[serde(default)]
    dns: Option<Dns>,
}

#[derive(Deserialize)]
struct AddressIn {
    #[serde(default)]
    address: String,
    #[serde(default)]
    gateway: Option<String>,
}

/// Go's `net.ParseCIDR`: an address with its prefix length; the host bits are the address.
fn parse_cidr(text: &str) -> Option<IpNet> {
    let net: IpNet = text.parse().ok()?;
    // Go reads `::ffff:a.b.c.d` as the IPv4 address (and its prefix as a v6 one, which then fits no v4 mask).
    match net {
        IpNet::V6(n) if n.addr().to_ipv4_mapped().is_some() => None,
        _ => Some(net),
    }
}

pub fn load(ctx: &Context) -> Result<Config> {
    let conf: NetConfIn = ctx.parse_conf()?;
    let ipam = conf.ipam.ok_or_else(|| Error::config("IPAM config missing 'ipam' key"))?;

    let mut addresses = configured(ipam.addresses.unwrap_or_default())?;
    add_cni_args(ctx, &mut addresses)?;
    let from_list = |what: &str, list: &[String]| -> Result<Vec<Address>> {
        list.iter()
            .map(|s| {
                let address = parse_cidr(s).ok_or_else(|| {
                    Error::config(format!(
                        "{what}: an entry in the 'ips' field is NOT in CIDR notation, got: '{}'",
                        truncate(s)
                    ))
                })?;
                Ok(Address { address, gateway: None })
            })
            .collect()
    };
    if let Some(ips) = ConventionArgs::cni(conf.args).and_then(|c| c.ips).filter(|l| !l.is_empty()) {
        addresses = from_list("args.cni.ips", &ips)?;
    }
    if let Some(ips) = conf.runtime_config.and_then(|r| r.ips).filter(|l| !l.is_empty()) {
        addresses = from_list("runtimeConfig.ips", &ips)?;
    }
    check(ctx, &addresses)?;
    Ok(Config { addresses, routes: ipam.routes.unwrap_or_default(), dns: ipam.dns.unwrap_or_default() })
}

/// `ipam.addresses`, each with its gateway.
fn configured(list: Vec<AddressIn>) -> Result<Vec<Address>> {
    let mut addresses = Vec::new();
    for (i, a) in list.iter().enumerate() {
        let address = parse_cidr(&a.address).ok_or_else(|| {
            Error::config(format!(
                "the 'address' field is expected to be in CIDR notation, got: '{}'",
                truncate(&a.address)
            ))
        })?;
        let gateway = match a.gateway.as_deref() {
            None | Some("") => None,
            Some(g) => Some(
                g.parse::<IpAddr>()
                    .map_err(|_| Error::config(format!("address {i}: invalid gateway address: '{}'", truncate(g))))?,
            ),
        };
        addresses.push(Address { address, gateway });
    }
    Ok(addresses)
}

/// `CNI_ARGS`: `IP=` adds addresses, then `GATEWAY=` gives each address that contains it its gateway.
fn add_cni_args(ctx: &Context, addresses: &mut Vec<Address>) -> Result<()> {
    ctx.env.args.check_known(&["IP", "GATEWAY"])?;
    if let Some(ips) = ctx.env.args.get("IP").filter(|v| !v.is_empty()) {
        for item in ips.split(',').map(str::trim) {
            let address = parse_cidr(item).ok_or_else(|| {
                Error::env(format!("the 'ip' field is expected to be in CIDR notation, got: '{}'", truncate(item)))
            })?;
            addresses.push(Address { address, gateway: None });
        }
    }
    if let Some(gateways) = ctx.env.args.get("GATEWAY").filter(|v| !v.is_empty()) {
        for item in gateways.split(',') {
            let gw: IpAddr =
                item.trim().parse().map_err(|_| Error::env(format!("invalid gateway address: {}", truncate(item))))?;
            for a in addresses.iter_mut().filter(|a| a.address.contains(&gw)) {
                a.gateway = Some(gw);
            }
        }
    }
    Ok(())
}

/// What the addresses must be once all sources are read.
fn check(ctx: &Context, addresses: &[Address]) -> Result<()> {
    // The reference does not check a configured gateway's family; one of the other family makes every
    // interface plugin fail later, so it is refused here.
    if let Some(a) = addresses.iter().find(|a| a.gateway.is_some_and(|g| g.is_ipv4() != a.address.addr().is_ipv4())) {
        return Err(Error::config(format!(
            "gateway {} is not of the family of address {}",
            a.gateway.unwrap_or(a.address.addr()),
            a.address
        )));
    }
    let v4 = addresses.iter().filter(|a| a.address.addr().is_ipv4()).count();
    if (v4 > 1 || addresses.len() - v4 > 1) && ctx.version < Version::V030 {
        return Err(Error::new(
            codes::INCOMPATIBLE_VERSION,
            format!("CNI version {} does not support more than 1 address per family", ctx.version),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use cnicore::spec::Command;
    use serde_json::{json, Value};

    fn load_with(conf: Value, cni_args: &str) -> Result<Config> {
        load(&Context::for_test(Command::Add, conf.to_string(), cni_args))
    }

    fn addrs(c: &Config) -> Vec<(String, Option<String>)> {
        c.addresses.iter().map(|a| (a.address.to_string(), a.gateway.map(|g| g.to_string()))).collect()
    }

    fn a(addr: &str, gw: Option<&str>) -> (String, Option<String>) {
        (addr.to_string(), gw.map(str::to_string))
    }

    fn base() -> Value {
        json!({"cniVersion": "1.0.0", "name": "n", "type": "bridge", "ipam": {
            "type": "static",
            "addresses": [
                {"address": "10.10.0.1/24", "gateway": "10.10.0.254"},
                {"address": "3ffe:ffff:0:01ff::1/64", "gateway": "3ffe:ffff:0::1"}
            ],
            "routes": [{"dst": "0.0.0.0/0"}, {"dst": "192.168.0.0/16", "gw": "10.10.5.1"}],
            "dns": {"nameservers": ["8.8.8.8"], "domain": "example.com", "search": ["example.com"]}
        }})
    }

    #[test]
    fn config_addresses_routes_dns() {
        let c = load_with(base(), "").unwrap();
        assert_eq!(
            addrs(&c),
            vec![a("10.10.0.1/24", Some("10.10.0.254")), a("3ffe:ffff:0:1ff::1/64", Some("3ffe:ffff::1"))]
        );
        assert_eq!(c.routes.len(), 2);
        assert_eq!(c.routes[1].gw, Some("10.10.5.1".parse().unwrap()));
        assert_eq!(c.dns.nameservers, vec!["8.8.8.8"]);
        assert_eq!(c.dns.domain, "example.com");
    }

    #[test]
    fn cni_args_add_addresses_and_gateways() {
        let c = load_with(base(), "IP=10.10.1.2/24, 10.10.2.2/24;GATEWAY=10.10.1.1,10.10.0.1").unwrap();
        assert_eq!(
            addrs(&c),
            vec![
                a("10.10.0.1/24", Some("10.10.0.1")),
                a("3ffe:ffff:0:1ff::1/64", Some("3ffe:ffff::1")),
                a("10.10.1.2/24", Some("10.10.1.1")),
                a("10.10.2.2/24", None),
            ]
        );
        let e = load_with(base(), "IP=10.10.1.2").unwrap_err();
        assert!(e.msg.contains("CIDR notation, got: '10.10.1.2'"), "{}", e.msg);
        assert!(load_with(base(), "GATEWAY=nope").unwrap_err().msg.contains("invalid gateway address"));
        assert!(load_with(base(), "FOO=1").unwrap_err().msg.contains("unknown args"));
        assert!(load_with(base(), "FOO=1;IgnoreUnknown=1").is_ok());
    }

    #[test]
    fn args_then_runtime_config_replace_everything() {
        let mut conf = base();
        conf["args"] = json!({"cni": {"ips": ["10.20.0.2/16"]}});
        let c = load_with(conf.clone(), "IP=10.10.1.2/24").unwrap();
        assert_eq!(addrs(&c), vec![a("10.20.0.2/16", None)]);
        conf["runtimeConfig"] = json!({"ips": ["10.30.0.3/8", "fd00::3/64"]});
        let c = load_with(conf.clone(), "").unwrap();
        assert_eq!(addrs(&c), vec![a("10.30.0.3/8", None), a("fd00::3/64", None)]);
        // Empty lists replace nothing.
        conf["runtimeConfig"] = json!({"ips": []});
        conf["args"] = json!({"cni": {"ips": []}});
        assert_eq!(load_with(conf.clone(), "").unwrap().addresses.len(), 2);
        conf["runtimeConfig"] = json!({"ips": ["10.1.1.1"]});
        assert!(load_with(conf, "").unwrap_err().msg.contains("NOT in CIDR notation"));
    }

    #[test]
    fn invalid_configs() {
        let bad = |ipam: Value| load_with(json!({"cniVersion": "1.0.0", "name": "n", "ipam": ipam}), "").unwrap_err();
        assert_eq!(load_with(json!({"cniVersion": "1.0.0", "name": "n"}), "").unwrap_err().code, codes::INVALID_CONFIG);
        assert!(bad(json!({"addresses": [{"address": "10.0.0.1"}]})).msg.contains("CIDR notation"));
        assert!(bad(json!({"addresses": [{}]})).msg.contains("got: ''"));
        assert!(bad(json!({"addresses": [{"address": "10.0.0.1/24", "gateway": "x"}]})).msg.contains("gateway"));
        assert!(bad(json!({"addresses": [{"address": "10.0.0.1/24", "gateway": "fd00::1"}]})).msg.contains("family"));
        assert!(bad(json!({"addresses": [{"address": "10.0.0.1/33"}]})).msg.contains("CIDR"));
        assert_eq!(bad(json!({"routes": [{"dst": "10.0.0.1"}]})).code, codes::INVALID_CONFIG);
        assert_eq!(bad(json!({"addresses": "10.0.0.1/24"})).code, codes::INVALID_CONFIG);
        // An empty gateway is no gateway (Go's net.IP).
        let c = load_with(
            json!({"cniVersion": "1.0.0", "name": "n", "ipam": {"addresses": [
            {"address": "10.0.0.1/24", "gateway": ""}]}}),
            "",
        )
        .unwrap();
        assert_eq!(addrs(&c), vec![a("10.0.0.1/24", None)]);
    }

    #[test]
    fn old_versions_take_one_address_per_family() {
        let mut conf = base();
        conf["cniVersion"] = json!("0.2.0");
        assert!(load_with(conf.clone(), "").is_ok());
        let e = load_with(conf, "IP=10.10.9.9/24").unwrap_err();
        assert_eq!(e.code, codes::INCOMPATIBLE_VERSION);
    }

    #[test]
    fn go_key_matching() {
        let c = load_with(
            json!({"cniVersion": "1.0.0", "name": "n", "IPAM": {"Addresses": [{"Address": "10.0.0.1/24",
                "GateWay": "10.0.0.2"}]}, "RuntimeConfig": {"IPs": []}}),
            "",
        )
        .unwrap();
        assert_eq!(addrs(&c), vec![a("10.0.0.1/24", Some("10.0.0.2"))]);
    }
}
