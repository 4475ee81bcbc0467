//! The ptp plugin: a veth pair per pod, routed rather than bridged. The pod's addresses come from IPAM; the
//! pod reaches its gateway through a /32 (/128) link route and its subnet through the gateway; the node
//! holds the gateway address (/32, /128) on the host veth and a /32 (/128) route to each pod address; ipMasq
//! masquerades the pod's traffic leaving its subnet (the reference's chains, iptables or nftables).
//!
//! ADD validates, then applies with an undo list; DEL removes what is still there and always succeeds.

use std::net::IpAddr;
use std::time::Duration;

use cnicore::failpoint;
use cnicore::firewall::masq::{self, Attachment as Masq};
use cnicore::firewall::{reference_nft, Backend};
use cnicore::netlink::{is_exists, is_not_found, AddressOptions, Link, Netlink, Route, Scope};
use cnicore::netns::NetNs;
use cnicore::podlink;
use cnicore::spec::{
    ipam, plugin_main, CniResult, Command, Context, Dns, Error, ErrorContext, Errors, Interface, Plugin, Result,
};
use cnicore::sysctl;
use cnicore::undo::Undo;
use ipnet::IpNet;
use serde::Deserialize;

/// Bound on the veth ends becoming operationally up.
const UP_TIMEOUT: Duration = Duration::from_secs(5);
/// Position of the pod interface in the result's `interfaces`.
const POD_INTERFACE: usize = 1;

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawConf {
    #[serde(default)]
    ip_masq: bool,
    #[serde(default)]
    ip_masq_backend: Option<String>,
    #[serde(default)]
    mtu: Option<i64>,
}

#[derive(Debug)]
struct Config {
    network: String,
    ip_masq: bool,
    masq_backend: Option<Backend>,
    mtu: Option<u32>,
    /// `dns` of the config when set: it replaces IPAM's.
    dns: Option<Dns>,
}

impl Config {
    fn load(ctx: &Context) -> Result<Config> {
        let raw: RawConf = ctx.parse_conf()?;
        if !podlink::ipam_configured(ctx)? {
            return Err(Error::config("ptp needs an ipam section with a type"));
        }
        let mtu = match raw.mtu {
            None | Some(0) => None,
            Some(m) if (68..=65535).contains(&m) => Some(m as u32),
            Some(m) => return Err(Error::config(format!("invalid MTU {m}: must be between 68 and 65535"))),
        };
        let masq_backend = raw
            .ip_masq_backend
            .as_deref()
            .map(|b| Backend::parse(b).map_err(|e| Error::config(format!("ipMasqBackend: {}", e.msg))))
            .transpose()?;
        Ok(Config {
            network: ctx.conf.name.clone(),
            ip_masq: raw.ip_masq,
            masq_backend,
            mtu,
            dns: ctx.conf.dns.clone().filter(|d| !d.is_empty()),
        })
    }

    fn masq<'a>(&'a self, container_id: &'a str, ips: &'a [IpNet]) -> Masq<'a> {
        Masq { network: &self.network, container_id, ips, non_masquerade: &[] }
    }
}

struct Ptp;

impl Plugin for Ptp {
    fn add(&self, ctx: &Context) -> Result<CniResult> {
        let conf = Config::load(ctx)?;
        let pod_ns = ctx.open_netns()?;
        let mut node = Netlink::new().context("failed to open netlink in the node namespace")?;
        let mut pod = Netlink::in_netns(&pod_ns).context("failed to open netlink in the pod namespace")?;
        podlink::require_free_name(&mut pod, ctx)?;
        ipam::find_plugin(ctx.conf.ipam_type()?, &ctx.env.path)?;
        let backend = if conf.ip_masq { Some(Backend::or_detect(conf.masq_backend)?) } else { None };
        let mut undo = Undo::default();
        let outcome = add(ctx, &conf, backend, &pod_ns, &mut node, &mut pod, &mut undo);
        if outcome.is_err() {
            undo.rollback();
        }
        outcome
    }

    fn del(&self, ctx: &Context) -> Result<()> {
        let conf = ctx.load_for_teardown(Config::load)?;
        let mut errors = Errors::new();
        let pod_veth = errors.record(podlink::find_pod_veth(ctx)).flatten();
        let ips = cnicore::check::teardown_pod_ips(ctx, pod_veth.as_ref().map_or(&[], |v| &v.addresses));
        // The steps mostly wait (the kernel tearing the veth down, firewall and IPAM processes): they run at the
        // same time, the veth's deletion after IPAM's DEL where the IPAM plugin needs it (`ipam::teardown`).
        let conf = &conf;
        let (network, ifname, container_id) = (&conf.network, &ctx.env.ifname, &ctx.env.container_id);
        let mut others: Vec<ipam::TeardownStep> = Vec::new();
        if conf.ip_masq {
            let ips = &ips;
            others.push(Box::new(move || masq::teardown(&conf.masq(container_id, ips))));
            // The rule the reference v1.6+ wrote with ipMasqBackend nftables (a node moved to ours).
            if Backend::Nftables.available() {
                others.push(Box::new(move || reference_nft::ipmasq_teardown(network, ifname, container_id)));
            }
        }
        let interface = pod_veth.map(|veth| -> ipam::TeardownStep { Box::new(move || veth.delete(ifname)) });
        let outcomes = ipam::teardown(ctx, true, interface, others);
        for outcome in outcomes {
            errors.record(outcome);
        }
        errors.into_result()
    }

    fn check(&self, ctx: &Context) -> Result<()> {
        let conf = Config::load(ctx)?;
        ctx.open_netns()?;
        ipam::exec(ctx, Command::Check)?;
        let prev = ctx.prev_result()?.ok_or_else(|| Error::config("ptp: Required prevResult missing"))?;
        cnicore::check::pod_link_of_kind(ctx, &prev, "veth", |_| Ok(()))?;
        if conf.ip_masq {
            let ips: Vec<IpNet> = cnicore::check::pod_ips(&prev, &ctx.env.ifname).collect();
            let backend = Backend::or_detect(conf.masq_backend)?;
            masq::check_with_reference(backend, &conf.masq(&ctx.env.container_id, &ips), &ctx.env.ifname)?;
        }
        Ok(())
    }

    /// The reference has no GC; ours frees IPAM's stale leases and the masquerade rules of vanished attachments.
    fn gc(&self, ctx: &Context) -> Result<()> {
        let conf = Config::load(ctx)?;
        let mut errors = Errors::new();
        errors.record(ipam::exec(ctx, Command::Gc));
        if conf.ip_masq {
            errors.record(masq::gc_with_reference(&conf.network, &ctx.valid_attachments()?));
        }
        errors.into_result()
    }

    fn status(&self, ctx: &Context) -> Result<()> {
        Config::load(ctx)?;
        ipam::exec(ctx, Command::Status)
    }
}

fn add<'a>(
    ctx: &'a Context,
    conf: &'a Config,
    backend: Option<Backend>,
    pod_ns: &NetNs,
    node: &mut Netlink,
    pod: &mut Netlink,
    undo: &mut Undo<'a>,
) -> Result<CniResult> {
    // The masquerade's restore processes start first, so that their start-up overlaps IPAM and the links.
    let masq_ahead = backend.map(|b| masq::start_ahead(b, &masq::expected_families(ctx.conf.ipam.as_ref())));
    let lease = ipam::add_undoable(ctx, undo)?;
    failpoint::hit("ptp/after-ipam");
    require_gateways(&lease)?;
    let v4 = lease.ips.iter().any(|ip| ip.address.addr().is_ipv4());
    let v6 = lease.ips.iter().any(|ip| ip.address.addr().is_ipv6());
    enable_forwarding(v4, v6)?;

    let ifname = ctx.env.ifname.as_str();
    let host = podlink::create_veth(node, pod, pod_ns, ctx, conf.mtu, None)?;
    let host_name = host.name.clone();
    undo.push(format!("delete veth {host_name}"), move || {
        let mut nl = Netlink::new().context("netlink")?;
        nl.delete_link_by_name(&host_name).map(|_| ()).with_context(|| format!("failed to delete {host_name:?}"))
    });
    failpoint::hit("ptp/after-veth");
    let pod_link = pod.require_link(ifname).with_context(|| format!("failed to find {ifname:?} in the pod"))?;

    let mut result = result_of(ctx, &host, &pod_link, lease)?;
    if result.ips.iter().any(|ip| ip.address.addr().is_ipv6()) {
        // The node sends neighbour solicitations only from a link-local address that passed DAD (a second or
        // two after link-up): without DAD on this point-to-point link the pod is reachable when ADD returns.
        let key = format!("net/ipv6/conf/{}/accept_dad", host.name);
        sysctl::write(&key, "0").with_context(|| format!("failed to set {key}=0"))?;
    }
    // The host end up first: the pod's routes through the gateway are only usable once it is.
    node.set_up(host.index).with_context(|| format!("failed to set {:?} up", host.name))?;
    cnicore::iface::configure(pod_ns, pod, ifname, pod_link.index, &result, false)?;
    pod_routes(pod, pod_link.index, &result)?;
    failpoint::hit("ptp/after-pod");
    host_side(node, &host, &result)?;
    failpoint::hit("ptp/after-host");

    if let Some(backend) = backend {
        let ips: Vec<IpNet> = result.ips.iter().map(|ip| ip.address).collect();
        let container_id = ctx.env.container_id.as_str();
        let outcome = masq::setup_ahead(backend, &conf.masq(container_id, &ips), masq_ahead.unwrap_or_default());
        undo.push("remove the masquerade rules", move || masq::teardown(&conf.masq(container_id, &ips)));
        outcome?;
        failpoint::hit("ptp/after-masq");
    }
    if let Some(dns) = &conf.dns {
        result.dns = dns.clone();
    }
    Ok(result)
}

/// Every address of the lease with a gateway of its family: ptp routes the pod through it.
fn require_gateways(lease: &CniResult) -> Result<()> {
    for ip in &lease.ips {
        let gw = ip.gateway.ok_or_else(|| {
            Error::internal(format!("IPAM gave {} no gateway: ptp routes the pod through one", ip.address))
        })?;
        if gw.is_ipv4() != ip.address.addr().is_ipv4() {
            return Err(Error::internal(format!("gateway {gw} is not of the family of {}", ip.address)));
        }
    }
    Ok(())
}

/// The result: the host veth and the pod's interface, the lease's addresses on the latter.
fn result_of(ctx: &Context, host: &Link, pod_link: &Link, lease: CniResult) -> Result<CniResult> {
    let mut result = CniResult {
        interfaces: vec![
            Interface { name: host.name.clone(), mac: mac_of(host), ..Default::default() },
            Interface {
                name: ctx.env.ifname.clone(),
                mac: mac_of(pod_link),
                sandbox: ctx.netns()?.display().to_string(),
                ..Default::default()
            },
        ],
        ips: lease.ips,
        routes: lease.routes,
        dns: lease.dns,
    };
    for ip in &mut result.ips {
        ip.interface = Some(POD_INTERFACE);
    }
    Ok(result)
}

fn mac_of(link: &Link) -> String {
    link.mac.map(|m| cnicore::mac::format(&m)).unwrap_or_default()
}

fn enable_forwarding(v4: bool, v6: bool) -> Result<()> {
    let keys = [(v4, "net/ipv4/ip_forward"), (v6, "net/ipv6/conf/all/forwarding")];
    for (_, key) in keys.iter().filter(|(wanted, _)| *wanted) {
        sysctl::write_if_different(key, "1").with_context(|| format!("Could not enable IP forwarding ({key})"))?;
    }
    Ok(())
}

/// In the pod, for each address: the gateway as a /32 (/128) link route, and the subnet through the gateway
/// instead of on the link (the subnet's other addresses are other pods, reached through the node).
fn pod_routes(pod: &mut Netlink, index: u32, result: &CniResult) -> Result<()> {
    for ip in &result.ips {
        let Some(gw) = ip.gateway else { continue };
        let subnet = ip.address.trunc();
        let prefix = Route { dst: subnet, oif: Some(index), scope: Scope::Nowhere, ..Default::default() };
        match pod.del_route(&prefix) {
            Ok(()) => {}
            Err(e) if is_not_found(&e) => {}
            Err(e) => return Err(Error::os(format!("failed to delete route {subnet}"), e)),
        }
        let gw_host = host_net(gw);
        let src = Some(ip.address.addr());
        let link_route = Route { dst: gw_host, oif: Some(index), scope: Scope::Link, src, ..Default::default() };
        let via_gateway = Route { dst: subnet, oif: Some(index), gateway: Some(gw), src, ..Default::default() };
        for route in [link_route, via_gateway] {
            match pod.add_route(&route) {
                Ok(()) => {}
                // The same gateway for two addresses of one family: its link route is there already.
                Err(e) if is_exists(&e) => {}
                Err(e) => return Err(Error::os(format!("failed to add route {}", route.dst), e)),
            }
        }
    }
    Ok(())
}

/// On the node: the gateway addresses on the host veth, and a host route to each pod address.
fn host_side(node: &mut Netlink, host: &Link, result: &CniResult) -> Result<()> {
    for ip in &result.ips {
        if let Some(gw) = ip.gateway {
            // No DAD: the address is the same on every host veth, and the pod needs its answers at once.
            let options = AddressOptions { nodad: true, ..Default::default() };
            match node.add_address_with(host.index, host_net(gw), options) {
                Ok(()) => {}
                Err(e) if is_exists(&e) => {}
                Err(e) => return Err(Error::os(format!("failed to add IP addr {gw} to {:?}", host.name), e)),
            }
        }
        let route = Route { dst: host_net(ip.address.addr()), oif: Some(host.index), ..Default::default() };
        match node.add_route(&route) {
            Ok(()) => {}
            Err(e) if is_exists(&e) => {}
            Err(e) => return Err(Error::os("failed to add route on host", e)),
        }
    }
    node.wait_oper_up(host.index, UP_TIMEOUT)
        .map_err(|e| Error::internal(format!("{:?} did not come up: {e}", host.name)))
}

fn host_net(ip: IpAddr) -> IpNet {
    IpNet::from(ip)
}

fn main() {
    plugin_main("CNI ptp plugin (cni-plugins-rs)", &Ptp)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cnicore::spec::codes;
    use serde_json::{json, Value};

    fn load(conf: Value) -> Result<Config> {
        Config::load(&Context::for_test(Command::Add, serde_json::to_vec(&conf).unwrap(), ""))
    }

    fn base() -> Value {
        json!({"cniVersion":"1.1.0","name":"n","type":"ptp","ipam":{"type":"host-local"}})
    }

    #[test]
    fn config() {
        let c = load(base()).unwrap();
        assert!(!c.ip_masq && c.mtu.is_none() && c.masq_backend.is_none() && c.dns.is_none());
        let mut full = base();
        full["ipMasq"] = true.into();
        full["ipMasqBackend"] = "nftables".into();
        full["mtu"] = 1400.into();
        full["dns"] = json!({"nameservers": ["10.0.0.10"]});
        let c = load(full).unwrap();
        assert_eq!((c.ip_masq, c.masq_backend, c.mtu), (true, Some(Backend::Nftables), Some(1400)));
        assert!(c.dns.is_some());
    }

    #[test]
    fn bad_inputs_are_config_errors() {
        let with = |key: &str, value: Value| {
            let mut c = base();
            c[key] = value;
            c
        };
        let mut no_ipam = base();
        no_ipam.as_object_mut().unwrap().remove("ipam");
        for conf in [
            no_ipam,
            with("ipam", json!({})),
            with("mtu", (-1).into()),
            with("mtu", 70000.into()),
            with("ipMasqBackend", "ebtables".into()),
            with("ipMasq", "yes".into()),
        ] {
            let e = load(conf.clone()).unwrap_err();
            assert!([codes::INVALID_CONFIG, codes::DECODE].contains(&e.code), "{conf}: {e:?}");
        }
    }
}
