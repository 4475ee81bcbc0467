//! The host-local configuration: parsed from the network config, validated, defaults filled in as the
//! reference does (gateway = first address, allocation from the first usable to the last usable address).

use crate::range::{from_u128, to_u128, Range, RangeSet};
use cnicore::spec::{codes, Context, ConventionArgs, Error, IpsArg, Result, Route, Version};
use ipnet::IpNet;
use serde::Deserialize;
use std::net::IpAddr;
use std::path::PathBuf;

pub const DEFAULT_DATA_DIR: &str = "/var/lib/cni/networks";

/// What one invocation works with.
#[derive(Debug)]
pub struct Config {
    /// The network name: the lease directory's name under `data_dir`.
    pub name: String,
    pub data_dir: PathBuf,
    pub range_sets: Vec<RangeSet>,
    pub routes: Vec<Route>,
    pub resolv_conf: Option<PathBuf>,
    /// Addresses asked for by the runtime (at most one per range set).
    pub requested: Vec<IpAddr>,
}

impl Config {
    /// The directory holding this network's leases.
    pub fn network_dir(&self) -> PathBuf {
        self.data_dir.join(&self.name)
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct NetConfIn {
    #[serde(default)]
    ipam: Option<IpamIn>,
    #[serde(default)]
    runtime_config: Option<RuntimeIn>,
    #[serde(default)]
    args: Option<ConventionArgs<IpsArg>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct IpamIn {
    #[serde(default)]
    ranges: Option<Vec<Vec<RangeIn>>>,
    #[serde(default)]
    routes: Option<Vec<RouteIn>>,
    #[serde(default)]
    data_dir: Option<String>,
    #[serde(default)]
    resolv_conf: Option<String>,
}

/// The legacy single range at the top level of the ipam section (the reference embeds a Range there), read
/// as a second view of the same bytes: `#[serde(flatten)]` would decode it without its field list, so Go's
/// key matching could not apply to it.
#[derive(Deserialize)]
struct LegacyRangeIn {
    #[serde(default)]
    ipam: Option<RangeIn>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct RangeIn {
    #[serde(default)]
    subnet: Option<String>,
    #[serde(default)]
    range_start: Option<String>,
    #[serde(default)]
    range_end: Option<String>,
    #[serde(default)]
    gateway: Option<String>,
}

#[derive(Deserialize)]
struct RouteIn {
    dst: String,
    #[serde(default)]
    gw: Option<String>,
    #[serde(default)]
    mtu: Option<u32>,
    #[serde(default)]
    advmss: Option<u32>,
    #[serde(default)]
    priority: Option<u32>,
    #[serde(default)]
    table: Option<u32>,
    #[serde(default)]
    scope: Option<u8>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RuntimeIn {
    #[serde(default)]
    ips: Option<Vec<String>>,
    #[serde(default)]
    ip_ranges: Option<Vec<Vec<RangeIn>>>,
}

/// Parses and validates the whole configuration of this invocation (nothing is touched on disk).
pub fn load(ctx: &Context) -> Result<Config> {
    let conf: NetConfIn = ctx.parse_conf()?;
    let mut ipam = conf.ipam.ok_or_else(|| Error::config("IPAM config missing 'ipam' key"))?;
    cnicore::state::validate_path_component("network name", &ctx.conf.name)?;

    let data_dir = match ipam.data_dir.as_deref() {
        None | Some("") => PathBuf::from(DEFAULT_DATA_DIR),
        Some(d) if d.starts_with('/') && !d.contains('\0') => PathBuf::from(d),
        Some(d) => return Err(Error::config(format!("dataDir must be an absolute path, got {:?}", truncate(d)))),
    };

    let runtime = conf.runtime_config.unwrap_or(RuntimeIn { ips: None, ip_ranges: None });
    // As the reference (v0.8 to v1.9, `LoadIPAMConfig`): runtimeConfig.ipRanges (capability "ipRanges") first,
    // then the legacy single range (top-level subnet), then ipam.ranges. Overlaps between them are an error.
    let mut raw_sets: Vec<Vec<RangeIn>> = runtime.ip_ranges.unwrap_or_default();
    let legacy: LegacyRangeIn = ctx.parse_conf()?;
    if let Some(range) = legacy.ipam.filter(|r| r.subnet.is_some()) {
        raw_sets.push(vec![range]);
    }
    raw_sets.extend(ipam.ranges.take().unwrap_or_default());
    if raw_sets.is_empty() {
        return Err(Error::config("no IP ranges specified: set ipam.ranges (or the legacy ipam.subnet)"));
    }
    let range_sets = raw_sets.iter().enumerate().map(|(i, set)| parse_range_set(i, set)).collect::<Result<Vec<_>>>()?;
    for (i, a) in range_sets.iter().enumerate() {
        if let Some(j) = range_sets[i + 1..].iter().position(|b| a.overlaps(b)) {
            return Err(Error::config(format!("range set {i} overlaps with range set {}", i + 1 + j)));
        }
    }
    // Results of 0.1.0/0.2.0 carry one address per family.
    let v4_sets = range_sets.iter().filter(|s| s.is_ipv4()).count();
    if (v4_sets > 1 || range_sets.len() - v4_sets > 1) && ctx.version < Version::V030 {
        return Err(Error::new(
            codes::INCOMPATIBLE_VERSION,
            format!("CNI version {} does not support more than 1 address per family", ctx.version),
        ));
    }

    let routes = ipam
        .routes
        .unwrap_or_default()
        .iter()
        .enumerate()
        .map(|(i, r)| parse_route(i, r))
        .collect::<Result<Vec<_>>>()?;
    let resolv_conf = ipam.resolv_conf.filter(|p| !p.is_empty()).map(PathBuf::from);
    let requested = requested_ips(ctx, runtime.ips, ConventionArgs::cni(conf.args).and_then(|c| c.ips))?;

    Ok(Config { name: ctx.conf.name.clone(), data_dir, range_sets, routes, resolv_conf, requested })
}

fn truncate(s: &str) -> String {
    cnicore::spec::truncate_for_msg(s)
}

fn parse_ip(what: &str, s: &str) -> Result<IpAddr> {
    s.trim().parse().map_err(|_| Error::config(format!("{what} {:?} is not an IP address", truncate(s))))
}

fn parse_range_set(idx: usize, set: &[RangeIn]) -> Result<RangeSet> {
    let bad = |msg: String| Error::config(format!("invalid range set {idx}: {msg}"));
    if set.is_empty() {
        return Err(bad("empty range set".into()));
    }
    let ranges = set
        .iter()
        .enumerate()
        .map(|(j, r)| {
            parse_range(r).map_err(|e| bad(if set.len() > 1 { format!("range {j}: {}", e.msg) } else { e.msg }))
        })
        .collect::<Result<Vec<_>>>()?;
    if ranges.iter().any(|r| r.is_ipv4() != ranges[0].is_ipv4()) {
        return Err(bad("mixed address families (IPv4 and IPv6 go into separate range sets)".into()));
    }
    let set = RangeSet(ranges);
    if let Some((a, b)) = set.inner_overlap() {
        return Err(bad(format!("subnets {a} and {b} overlap")));
    }
    Ok(set)
}

/// One range with the reference's defaults: gateway = network + 1, start = network + 1,
/// end = the last address (IPv6) or the one before the broadcast (IPv4).
fn parse_range(r: &RangeIn) -> Result<Range> {
    let subnet_text = r.subnet.as_deref().filter(|s| !s.is_empty()).ok_or_else(|| Error::config("missing subnet"))?;
    let subnet: IpNet = subnet_text
        .trim()
        .parse()
        .map_err(|_| Error::config(format!("subnet {:?} is not a CIDR (e.g. 10.1.0.0/16)", truncate(subnet_text))))?;
    if let IpNet::V6(n) = subnet {
        if n.addr().to_ipv4_mapped().is_some() {
            return Err(Error::config(format!(
                "subnet {subnet}: IPv4-mapped IPv6 subnets are not supported, use the IPv4 form"
            )));
        }
    }
    if subnet.prefix_len() > subnet.max_prefix_len() - 2 {
        let smallest = if subnet.addr().is_ipv4() { "/30" } else { "/126" };
        return Err(Error::config(format!("network {subnet} too small to allocate from (the smallest is {smallest})")));
    }
    if subnet.addr() != subnet.network() {
        return Err(Error::config(format!(
            "network {subnet} has host bits set: for a prefix length of {} the network address is {}",
            subnet.prefix_len(),
            subnet.network()
        )));
    }
    let net = to_u128(subnet.network());
    let first = from_u128(net + 1, subnet.addr());
    let last = if subnet.addr().is_ipv4() {
        from_u128(to_u128(subnet.broadcast()) - 1, subnet.addr())
    } else {
        subnet.broadcast()
    };
    let inside = |what: &str, text: &Option<String>, default: IpAddr| -> Result<IpAddr> {
        let Some(text) = text.as_deref().filter(|t| !t.is_empty()) else { return Ok(default) };
        let ip = parse_ip(what, text)?;
        if !subnet.contains(&ip) || ip.is_ipv4() != subnet.addr().is_ipv4() {
            return Err(Error::config(format!("{what} {ip} is not in subnet {subnet}")));
        }
        Ok(ip)
    };
    let gateway = inside("gateway", &r.gateway, first)?;
    let start = inside("rangeStart", &r.range_start, first)?;
    let end = inside("rangeEnd", &r.range_end, last)?;
    if to_u128(start) > to_u128(end) {
        return Err(Error::config(format!("rangeStart {start} is after rangeEnd {end}")));
    }
    Ok(Range { subnet, start, end, gateway })
}

fn parse_route(idx: usize, r: &RouteIn) -> Result<Route> {
    let dst: IpNet = r
        .dst
        .trim()
        .parse()
        .map_err(|_| Error::config(format!("route {idx}: dst {:?} is not a CIDR", truncate(&r.dst))))?;
    let gw = match r.gw.as_deref().filter(|g| !g.is_empty()) {
        None => None,
        Some(g) => {
            let gw = parse_ip(&format!("route {idx}: gw"), g)?;
            if gw.is_ipv4() != dst.addr().is_ipv4() {
                return Err(Error::config(format!("route {idx}: gw {gw} is not of the family of dst {dst}")));
            }
            Some(gw)
        }
    };
    Ok(Route { dst, gw, mtu: r.mtu, advmss: r.advmss, priority: r.priority, table: r.table, scope: r.scope })
}

/// Requested addresses from every source, combined as the reference combines them (`LoadIPAMConfig`):
/// `CNI_ARGS` `IP=`, then `args.cni.ips`, then `runtimeConfig.ips` (capability "ips"); each address once.
/// Two differences, both accepting more than the reference: `IP=` may list several addresses separated by
/// commas (the reference's `net.IP` takes one), and `a.b.c.d/len` is accepted in every source (the reference
/// takes it in `runtimeConfig.ips` only).
fn requested_ips(ctx: &Context, runtime: Option<Vec<String>>, args: Option<Vec<String>>) -> Result<Vec<IpAddr>> {
    ctx.env.args.check_known(&["IP"])?;
    let parse = |s: &str| -> Option<IpAddr> {
        let s = s.trim();
        s.parse::<IpAddr>().ok().or_else(|| s.parse::<IpNet>().ok().map(|n| n.addr()))
    };
    let mut ips: Vec<IpAddr> = Vec::new();
    if let Some(raw) = ctx.env.args.get("IP").filter(|v| !v.is_empty()) {
        for s in raw.split(',').filter(|s| !s.trim().is_empty()) {
            ips.push(
                parse(s).ok_or_else(|| Error::env(format!("CNI_ARGS IP: {:?} is not an IP address", truncate(s))))?,
            );
        }
    }
    for s in &args.unwrap_or_default() {
        ips.push(
            parse(s).ok_or_else(|| Error::config(format!("args.cni.ips: {:?} is not an IP address", truncate(s))))?,
        );
    }
    for s in &runtime.unwrap_or_default() {
        ips.push(
            parse(s)
                .ok_or_else(|| Error::config(format!("runtimeConfig.ips: {:?} is not an IP address", truncate(s))))?,
        );
    }
    let mut unique = Vec::with_capacity(ips.len());
    for ip in ips {
        if !unique.contains(&ip) {
            unique.push(ip);
        }
    }
    Ok(unique)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cnicore::spec::Command;
    use serde_json::json;

    fn ctx(conf: serde_json::Value, cni_args: &str) -> Context {
        Context::for_test(Command::Add, conf.to_string(), cni_args)
    }

    fn load_ipam(ipam: serde_json::Value) -> Result<Config> {
        load(&ctx(json!({"cniVersion": "1.0.0", "name": "n", "ipam": ipam}), ""))
    }

    #[test]
    fn defaults_as_the_reference() {
        let c = load_ipam(json!({"subnet": "10.1.0.0/16"})).unwrap();
        assert_eq!(c.data_dir, PathBuf::from(DEFAULT_DATA_DIR));
        let r = &c.range_sets[0].0[0];
        assert_eq!(
            (r.start.to_string(), r.end.to_string(), r.gateway.to_string()),
            ("10.1.0.1".into(), "10.1.255.254".into(), "10.1.0.1".into())
        );
        let c = load_ipam(json!({"ranges": [[{"subnet": "fd00::/64"}]]})).unwrap();
        let r = &c.range_sets[0].0[0];
        assert_eq!((r.start.to_string(), r.end.to_string()), ("fd00::1".into(), "fd00::ffff:ffff:ffff:ffff".into()));
    }

    #[test]
    fn legacy_subnet_comes_first_and_runtime_ranges_are_prepended() {
        let c = load_ipam(json!({"subnet": "10.1.0.0/16", "ranges": [[{"subnet": "fd00::/64"}]]})).unwrap();
        assert!(c.range_sets[0].is_ipv4() && !c.range_sets[1].is_ipv4());
        let c = load(&ctx(
            json!({"cniVersion": "1.0.0", "name": "n", "ipam": {"subnet": "10.1.0.0/16"},
                   "runtimeConfig": {"ipRanges": [[{"subnet": "10.2.0.0/16"}]]}}),
            "",
        ))
        .unwrap();
        // The reference prepends runtime ranges to the configured ones; it does not replace them.
        let subnets: Vec<String> = c.range_sets.iter().map(|s| s.0[0].subnet.to_string()).collect();
        assert_eq!(subnets, ["10.2.0.0/16", "10.1.0.0/16"]);
        let overlapping = load(&ctx(
            json!({"cniVersion": "1.0.0", "name": "n", "ipam": {"subnet": "10.1.0.0/16"},
                   "runtimeConfig": {"ipRanges": [[{"subnet": "10.1.2.0/24"}]]}}),
            "",
        ));
        assert!(overlapping.unwrap_err().msg.contains("range set 0 overlaps with range set 1"));
    }

    #[test]
    fn requested_ips_from_every_source_are_combined() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let base = json!({"cniVersion": "1.0.0", "name": "n", "ipam": {"ranges": [[{"subnet": "10.1.0.0/16"}], [{"subnet": "fd01::/64"}]]}});
        let c = load(&ctx(base.clone(), "IP=10.1.0.5, 10.1.0.6")).unwrap();
        assert_eq!(c.requested, [ip("10.1.0.5"), ip("10.1.0.6")]);
        let mut all = base.clone();
        all["args"] = json!({"cni": {"ips": ["fd01::7"]}});
        all["runtimeConfig"] = json!({"ips": ["10.1.0.5/16", "fd01::8"]});
        // CNI_ARGS first, then args.cni.ips, then runtimeConfig.ips, each address once (upstream LoadIPAMConfig).
        assert_eq!(load(&ctx(all, "IP=10.1.0.5")).unwrap().requested, [ip("10.1.0.5"), ip("fd01::7"), ip("fd01::8")]);
    }

    #[test]
    fn go_spellings_of_the_config_and_capabilities() {
        // encoding/json matches keys case-insensitively: the reference reads these, and so must we.
        let c = load(&ctx(
            json!({"cniVersion": "1.0.0", "name": "n", "IPAM": {"Subnet": "10.1.0.0/16", "RangeStart": "10.1.0.10",
                   "Routes": [{"Dst": "0.0.0.0/0", "GW": "10.1.0.1"}], "DataDir": "/tmp/x"},
                   "RuntimeConfig": {"IPs": ["10.1.0.20"]}}),
            "",
        ))
        .unwrap();
        assert_eq!(c.range_sets[0].0[0].subnet.to_string(), "10.1.0.0/16");
        assert_eq!(c.data_dir, PathBuf::from("/tmp/x"));
        assert_eq!(c.routes.len(), 1);
        assert_eq!(c.requested, ["10.1.0.20".parse::<IpAddr>().unwrap()]);
        let c = load(&ctx(
            json!({"cniVersion": "1.0.0", "name": "n", "ipam": {"ranges": [[{"subnet": "10.1.0.0/16"}]]},
                   "runtimeConfig": {"IPRanges": [[{"Subnet": "10.9.0.0/16", "Gateway": "10.9.0.254"}]]},
                   "Args": {"CNI": {"IPs": ["10.9.0.7"]}}}),
            "",
        ))
        .unwrap();
        assert_eq!(c.range_sets[0].0[0].subnet.to_string(), "10.9.0.0/16");
        assert_eq!(c.range_sets[1].0[0].subnet.to_string(), "10.1.0.0/16");
        assert_eq!(c.requested, ["10.9.0.7".parse::<IpAddr>().unwrap()]);
    }

    #[test]
    fn del_ignores_runtime_inputs_it_does_not_need() {
        let conf = json!({"cniVersion": "1.0.0", "name": "n", "ipam": {"subnet": "10.1.0.0/16"},
                          "runtimeConfig": {"ips": "not a list", "ipRanges": 7}});
        assert!(load(&ctx(conf.clone(), "")).is_err());
        let del = Context::for_test(Command::Del, conf.to_string(), "IP=nonsense");
        assert_eq!(del.load_for_teardown(load).unwrap().range_sets[0].0[0].subnet.to_string(), "10.1.0.0/16");
        let bad = json!({"cniVersion": "1.0.0", "name": "n", "ipam": {"subnet": 5}});
        let del = Context::for_test(Command::Del, bad.to_string(), "");
        assert!(del.load_for_teardown(load).is_err(), "a bad config stays an error");
    }
}
