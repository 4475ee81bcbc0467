//! ADD: validate against the node and the pod, then apply step by step; every step that changes something
//! registers its undo, and a failure rolls back everything done so far (veth, spoof check, IPAM lease,
//! masquerade) before the error is returned.

use std::net::IpAddr;
use std::time::Duration;

use cnicore::netlink::{Link, Netlink};
use cnicore::netns::NetNs;
use cnicore::spec::{ipam, CniResult, Command, Context, Error, ErrorContext, Interface, Result, Route};
use cnicore::sysctl;
use cnicore::{failpoint, podlink};
use ipnet::IpNet;

use crate::config::{format_mac, Config};
use crate::mtu;
use crate::node;
use crate::spoofchk::SpoofCheck;
use cnicore::firewall::masq::{self, Attachment as Masq};
use cnicore::firewall::Backend;
use cnicore::undo::Undo;

/// Bound on the host veth becoming operationally up (the reference polls for up to 2.55 s).
const PORT_UP_TIMEOUT: Duration = Duration::from_secs(5);
/// Position of the pod interface in the result's `interfaces`.
const POD_INTERFACE: usize = 2;

/// What the checks before any change found out, and the sockets the steps use.
struct Preflight<'a> {
    conf: Config,
    pod_ns: NetNs,
    node: Netlink,
    pod: Netlink,
    existing_bridge: Option<Link>,
    mtu: u32,
    ctx: &'a Context,
    /// The masquerade's firewall processes, started at the beginning of the changes ([`apply`]).
    masq_ahead: masq::Ahead,
}

pub fn add(ctx: &Context) -> Result<CniResult> {
    let mut preflight = preflight(ctx)?;
    let mut undo = Undo::default();
    let outcome = apply(&mut preflight, &mut undo);
    if outcome.is_err() {
        undo.rollback();
    }
    outcome
}

/// Everything that can be known to fail before touching the node: the config, the netns, a non-bridge
/// under the bridge's name, an interface already named `CNI_IFNAME` in the pod; and the MTU.
fn preflight(ctx: &Context) -> Result<Preflight<'_>> {
    let conf = Config::load(ctx)?;
    let pod_ns = ctx.open_netns()?;
    if conf.layer3 {
        // A missing IPAM plugin is known before anything is touched.
        ipam::find_plugin(ctx.conf.ipam_type()?, &ctx.env.path)?;
    }
    let mut node_nl = Netlink::new().context("failed to open netlink in the node namespace")?;
    let mut pod_nl = Netlink::in_netns(&pod_ns).context("failed to open netlink in the pod namespace")?;
    // MTU inference needs every link of the node; otherwise the bridge is all there is to look at.
    let (existing_bridge, inferred_mtu) = match conf.mtu {
        Some(_) => (node_nl.link_by_name(&conf.bridge).context("failed to look up the bridge")?, None),
        None => {
            let links = node_nl.links().context("failed to list the node's links")?;
            (links.iter().find(|l| l.name == conf.bridge).cloned(), Some(mtu::infer(&links)))
        }
    };
    node::check_bridge_name(existing_bridge.as_ref(), &conf.bridge)?;
    if let Some(bridge) = existing_bridge.as_ref().filter(|_| conf.uses_vlans()) {
        node::require_vlan_filtering(&mut node_nl, bridge)?;
    }
    podlink::require_free_name(&mut pod_nl, ctx)?;
    let mtu = conf.mtu.or(inferred_mtu).unwrap_or(mtu::DEFAULT_MTU);
    Ok(Preflight {
        conf,
        pod_ns,
        node: node_nl,
        pod: pod_nl,
        existing_bridge,
        mtu,
        ctx,
        masq_ahead: Default::default(),
    })
}

/// The links of an attachment.
struct Links {
    bridge: Link,
    host: Link,
    pod: Link,
}

fn apply<'a>(p: &mut Preflight<'a>, undo: &mut Undo<'a>) -> Result<CniResult> {
    let ctx = p.ctx;
    // The masquerade's restore processes start first: their start-up then overlaps the links and IPAM,
    // instead of following IPAM on the critical path.
    if p.conf.ip_masq {
        if let Ok(backend) = Backend::or_detect(p.conf.masq_backend) {
            p.masq_ahead = masq::start_ahead(backend, &masq::expected_families(ctx.conf.ipam.as_ref()));
        }
    }
    let (links, lease) = links_and_lease(p, undo)?;
    if let Some(Ok(_)) = &lease {
        undo.push("release the IPAM lease", move || ipam::exec(ctx, Command::Del));
    }
    let links = links?;
    let lease = lease.transpose()?;

    let ifname = ctx.env.ifname.as_str();
    let pod_mac = links.pod.mac.map(|m| format_mac(&m)).unwrap_or_default();
    let netns_path = ctx.netns()?.display().to_string();
    let mut result = CniResult {
        interfaces: vec![
            Interface { name: links.bridge.name.clone(), ..Default::default() },
            Interface { name: links.host.name.clone(), ..Default::default() },
            Interface { name: ifname.to_string(), mac: pod_mac, sandbox: netns_path, ..Default::default() },
        ],
        ..Default::default()
    };
    match lease {
        Some(lease) => configure_layer3(p, undo, &links, &mut result, lease)?,
        None => {
            if !p.conf.disable_container_interface {
                p.pod.set_up(links.pod.index).with_context(|| format!("failed to set {ifname:?} up"))?;
            }
            sysctl::enable_bridge_netfilter(true, false);
        }
    }

    // The bridge's MAC may have changed with its first port or its address, the host veth's with its master.
    finish_interfaces(&mut p.node, &mut result, &links.bridge, &links.host)?;
    if let Some(dns) = &p.conf.dns {
        result.dns = dns.clone();
    }
    Ok(result)
}

/// The links (see [`setup_links`]) and, with IPAM, the lease.
fn links_and_lease<'a>(
    p: &mut Preflight<'a>,
    undo: &mut Undo<'a>,
) -> Result<(Result<Links>, Option<Result<CniResult>>)> {
    let ctx = p.ctx;
    let layer3 = p.conf.layer3;
    let ipam_add = move || ipam::add(ctx).inspect(|_| failpoint::hit("bridge/after-ipam"));
    if layer3 && p.existing_bridge.is_none() {
        // This ADD would create the bridge: IPAM first, so that an IPAM refusal leaves the node as it was
        // (rolling back a new bridge could pull it from under a concurrent ADD that just found it).
        let lease = ipam_add()?;
        return Ok((setup_links(p, undo), Some(Ok(lease))));
    }
    // IPAM (another process) runs while the links are made: neither needs the other.
    Ok(std::thread::scope(|s| {
        let ipam = layer3.then(|| s.spawn(ipam_add));
        let links = setup_links(p, undo);
        (links, ipam.map(join))
    }))
}

fn join<T>(handle: std::thread::ScopedJoinHandle<'_, Result<T>>) -> Result<T> {
    handle.join().unwrap_or_else(|_| Err(Error::internal("a worker thread panicked")))
}

/// The bridge, the veth pair with its host end as a bridge port, and the MAC spoof check.
fn setup_links<'a>(p: &mut Preflight<'a>, undo: &mut Undo<'a>) -> Result<Links> {
    let Preflight { conf, pod_ns, node, pod, existing_bridge, mtu, ctx, .. } = p;
    let ifname = ctx.env.ifname.as_str();
    let bridge = node::ensure_bridge(node, conf, existing_bridge.take(), *mtu)?;
    failpoint::hit("bridge/after-bridge");

    let host = podlink::create_veth(node, pod, pod_ns, ctx, Some(*mtu), conf.mac)?;
    failpoint::hit("bridge/after-veth");
    let host_name = host.name.clone();
    undo.push(format!("delete veth {host_name}"), move || {
        let mut nl = Netlink::new().context("netlink")?;
        nl.delete_link_by_name(&host_name).map(|_| ()).with_context(|| format!("failed to delete {host_name:?}"))
    });
    let pod_link = pod.require_link(ifname).with_context(|| format!("failed to find {ifname:?} in the pod"))?;
    node::attach_port(node, &host, &bridge, conf, conf.vlan, &conf.trunk)?;
    failpoint::hit("bridge/after-port");

    if conf.mac_spoof_check {
        let check = SpoofCheck::new(&ctx.env.container_id, ifname);
        let mac = pod_link.mac.map(|m| format_mac(&m)).unwrap_or_default();
        let outcome = check.setup(&host.name, &mac);
        failpoint::hit("bridge/after-spoofchk");
        // A failed transaction changed nothing, but a teardown is harmless either way.
        undo.push("remove the MAC spoof check", move || check.teardown());
        outcome?;
    }
    Ok(Links { bridge, host, pod: pod_link })
}

/// Addresses and routes in the pod, the gateway on the bridge, forwarding, and masquerading (whose
/// firewall processes run while the node side is finished).
fn configure_layer3<'a>(
    p: &mut Preflight<'a>,
    undo: &mut Undo<'a>,
    links: &Links,
    result: &mut CniResult,
    lease: CniResult,
) -> Result<()> {
    let Preflight { conf, pod_ns, node, pod, mtu, ctx, masq_ahead, .. } = p;
    let masq_ahead = std::mem::take(masq_ahead);
    let conf: &Config = conf;
    let ctx: &'a Context = ctx;
    if lease.ips.is_empty() {
        return Err(Error::internal("IPAM plugin returned missing IP config"));
    }
    let gateways = plan_addresses(result, lease, conf);
    cnicore::iface::configure(pod_ns, pod, &ctx.env.ifname, links.pod.index, result, conf.enable_dad)?;
    failpoint::hit("bridge/after-pod-addresses");

    let ips: Vec<IpNet> = result.ips.iter().map(|ip| ip.address).collect();
    let container_id = ctx.env.container_id.as_str();
    let (node_side, masq_outcome) =
        node_side_and_masquerade(node, pod, conf, links, result, &gateways, *mtu, container_id, &ips, masq_ahead);
    if conf.ip_masq {
        let (network, non_masquerade) = (conf.network.clone(), conf.non_masquerade.clone());
        undo.push("remove the masquerade rules", move || {
            masq::teardown(&Masq { network: &network, container_id, ips: &ips, non_masquerade: &non_masquerade })
        });
    }
    node_side?;
    masq_outcome.transpose()?;
    Ok(())
}

/// The node side ([`finish_node_side`], once both veth ends are up) while the masquerade rules, whose
/// firewall processes take longest, are applied on another thread.
#[allow(clippy::too_many_arguments)]
fn node_side_and_masquerade(
    node: &mut Netlink,
    pod: &mut Netlink,
    conf: &Config,
    links: &Links,
    result: &mut CniResult,
    gateways: &[IpNet],
    mtu: u32,
    container_id: &str,
    ips: &[IpNet],
    masq_ahead: masq::Ahead,
) -> (Result<()>, Option<Result<()>>) {
    std::thread::scope(|s| {
        let masq = conf.ip_masq.then(|| {
            s.spawn(move || {
                let outcome = Backend::or_detect(conf.masq_backend)
                    .and_then(|b| masq::setup_ahead(b, &conf.masq(container_id, ips), masq_ahead));
                failpoint::hit("bridge/after-masq");
                outcome
            })
        });
        // Both ends up: the pod's own link-up processing (which flushes its neighbour entries and readies
        // IPv6) is over before the pod sends its first packet.
        let node_side = pod
            .wait_oper_up(links.pod.index, PORT_UP_TIMEOUT)
            .map_err(|e| Error::internal(format!("{:?} in the pod did not come up: {e}", links.pod.name)))
            .and_then(|()| finish_node_side(node, conf, links, result, gateways, mtu));
        (node_side, masq.map(join))
    })
}

/// The node's part once the pod is configured: the port up, the gateway address(es), forwarding, and
/// bridge-nf-call-iptables.
fn finish_node_side(
    nl: &mut Netlink,
    conf: &Config,
    links: &Links,
    result: &mut CniResult,
    gateways: &[IpNet],
    mtu: u32,
) -> Result<()> {
    nl.wait_oper_up(links.host.index, PORT_UP_TIMEOUT)
        .map_err(|e| Error::internal(format!("bridge port {:?} did not come up: {e}", links.host.name)))?;
    let has = |v4: bool| result.ips.iter().any(|ip| ip.address.addr().is_ipv4() == v4);
    let (v4, v6) = (has(true), has(false));
    if conf.is_gateway {
        let gateway_link = match conf.vlan {
            Some(vid) => {
                let link = node::ensure_vlan_interface(nl, &links.bridge, conf, vid, mtu)?;
                let mac = link.mac.map(|m| format_mac(&m)).unwrap_or_default();
                result.interfaces.push(Interface { name: link.name.clone(), mac, ..Default::default() });
                link
            }
            None => links.bridge.clone(),
        };
        for gw in gateways {
            node::ensure_gateway_address(nl, &gateway_link, *gw, conf.force_address)?;
        }
        failpoint::hit("bridge/after-gateway");
    }
    if conf.is_gateway || conf.ip_masq {
        node::enable_forwarding(v4, v6)?;
    }
    sysctl::enable_bridge_netfilter(v4, v6);
    failpoint::hit("bridge/after-sysctls");
    Ok(())
}

/// Fills the result's IPs, routes and DNS from the IPAM result, as the reference's calcGateways does: every
/// IP belongs to the pod interface; with isGateway a missing gateway is the subnet's first address; with
/// isDefaultGateway each family gets a default route via its gateway unless IPAM gave one. Returns the
/// gateway addresses (with the pod subnet's prefix) for the bridge.
fn plan_addresses(result: &mut CniResult, lease: CniResult, conf: &Config) -> Vec<IpNet> {
    result.routes = lease.routes;
    result.dns = lease.dns;
    let mut gateways = Vec::new();
    let mut default_done = [false, false];
    for mut ip in lease.ips {
        ip.interface = Some(POD_INTERFACE);
        if ip.gateway.is_none() && conf.is_gateway {
            ip.gateway = first_address(&ip.address);
        }
        let v4 = ip.address.addr().is_ipv4();
        let family = usize::from(!v4);
        if conf.is_default_gateway && !default_done[family] {
            let default: IpNet = if v4 { "0.0.0.0/0".parse() } else { "::/0".parse() }.unwrap_or(ip.address);
            let present = result.routes.iter().any(|r| r.gw.is_some() && r.dst == default);
            if !present {
                result.routes.push(Route::new(default, ip.gateway));
            }
            default_done[family] = true;
        }
        if conf.is_gateway {
            if let Some(gw) = ip.gateway.and_then(|gw| IpNet::new(gw, ip.address.prefix_len()).ok()) {
                if !gateways.contains(&gw) {
                    gateways.push(gw);
                }
            }
        }
        result.ips.push(ip);
    }
    gateways
}

/// The first address of `net`'s subnet (network address + 1).
fn first_address(net: &IpNet) -> Option<IpAddr> {
    match net.network() {
        IpAddr::V4(a) => u32::from(a).checked_add(1).map(|n| IpAddr::V4(n.into())),
        IpAddr::V6(a) => u128::from(a).checked_add(1).map(|n| IpAddr::V6(n.into())),
    }
}

/// Re-reads the bridge and host veth for their final MACs and MTUs.
fn finish_interfaces(nl: &mut Netlink, result: &mut CniResult, bridge: &Link, host: &Link) -> Result<()> {
    let bridge =
        nl.link_by_index(bridge.index).context("failed to look up the bridge")?.unwrap_or_else(|| bridge.clone());
    let host = nl.link_by_index(host.index).context("failed to look up the host veth")?.unwrap_or_else(|| host.clone());
    for (i, link) in [(0, &bridge), (1, &host)] {
        result.interfaces[i].mac = link.mac.map(|m| format_mac(&m)).unwrap_or_default();
        result.interfaces[i].mtu = Some(link.mtu);
    }
    result.interfaces[POD_INTERFACE].mtu = Some(host.mtu);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use cnicore::spec::IpConfig;

    fn conf(gw: bool, default_gw: bool) -> Config {
        let ctx_conf = serde_json::json!({"cniVersion":"1.1.0","name":"n","type":"bridge","ipam":{"type":"host-local"},
            "isGateway": gw, "isDefaultGateway": default_gw});
        let stdin = serde_json::to_vec(&ctx_conf).unwrap();
        let ctx = Context::for_test(Command::Add, stdin, "");
        Config::load(&ctx).unwrap()
    }

    fn lease() -> CniResult {
        CniResult {
            ips: vec![
                IpConfig { address: "10.1.0.5/24".parse().unwrap(), gateway: None, interface: None },
                IpConfig {
                    address: "fd00::5/64".parse().unwrap(),
                    gateway: Some("fd00::fe".parse().unwrap()),
                    interface: None,
                },
            ],
            routes: vec![Route::new("::/0".parse().unwrap(), Some("fd00::fe".parse().unwrap()))],
            ..Default::default()
        }
    }

    #[test]
    fn gateways_and_default_routes() {
        let mut r = CniResult::default();
        let gws = plan_addresses(&mut r, lease(), &conf(true, true));
        assert_eq!(gws, vec!["10.1.0.1/24".parse::<IpNet>().unwrap(), "fd00::fe/64".parse().unwrap()]);
        assert_eq!(r.ips[0].gateway, Some("10.1.0.1".parse().unwrap()));
        assert!(r.ips.iter().all(|ip| ip.interface == Some(POD_INTERFACE)));
        // IPAM's v6 default route is kept, a v4 one is added.
        assert_eq!(r.routes.len(), 2);
        assert_eq!(r.routes[1], Route::new("0.0.0.0/0".parse().unwrap(), Some("10.1.0.1".parse().unwrap())));
    }

    #[test]
    fn no_gateway_without_is_gateway() {
        let mut r = CniResult::default();
        let gws = plan_addresses(&mut r, lease(), &conf(false, false));
        assert!(gws.is_empty());
        assert_eq!(r.ips[0].gateway, None);
        assert_eq!(r.routes.len(), 1);
    }
}
