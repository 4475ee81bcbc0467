//! CHECK: the attachment still looks as `prevResult` says: the bridge, the pod's veth and its host end on
//! the bridge, the pod's addresses and routes, and with ipMasq the masquerade rules (exceptions included).

use cnicore::netlink::{Link, Netlink};
use cnicore::spec::{ipam, Command, Context, Error, ErrorContext, Interface, Result};

use ipnet::IpNet;

use crate::config::{format_mac, Config};
use crate::node::is_bridge;
use cnicore::firewall::masq;
use cnicore::firewall::Backend;

pub fn check(ctx: &Context) -> Result<()> {
    let conf = Config::load(ctx)?;
    let netns_path = ctx.netns()?;
    let pod_ns = ctx.open_netns()?;
    if conf.layer3 {
        ipam::exec(ctx, Command::Check)?;
    }
    let prev = ctx.prev_result()?.ok_or_else(|| Error::config("Required prevResult missing"))?;
    let ifname = ctx.env.ifname.as_str();
    let sandbox = netns_path.display().to_string();

    let mut node_nl = Netlink::new().context("netlink")?;
    let mut pod_nl = Netlink::in_netns(&pod_ns).context("netlink in the pod")?;

    let bridge_entry = prev.interfaces.iter().find(|i| i.name == conf.bridge);
    let bridge = check_bridge(&mut node_nl, bridge_entry, &conf)?;

    let pod_entry = cnicore::check::pod_entry(&prev, ifname, &sandbox)?;
    let pod_link = pod_nl
        .link_by_name(ifname)
        .context("netlink")?
        .ok_or_else(|| Error::internal(format!("CNI created interface in container {ifname} not found")))?;
    if pod_link.kind.as_deref() != Some("veth") {
        return Err(Error::internal(format!("Error: Container interface {ifname} not of type veth")));
    }
    cnicore::check::mac(pod_entry, &pod_link)?;
    if let Some(mtu) = pod_entry.mtu.filter(|&m| m != pod_link.mtu) {
        return Err(Error::internal(format!(
            "Interface {ifname} MTU {} doesn't match prevResult's {mtu}",
            pod_link.mtu
        )));
    }

    // The host end: a veth in prevResult whose peer is the pod interface and whose master is the bridge.
    let mut found_host = false;
    for entry in prev.interfaces.iter().filter(|i| i.name != conf.bridge && i.name != ifname && i.sandbox.is_empty()) {
        let Some(link) = node_nl.link_by_name(&entry.name).context("netlink")? else {
            return Err(Error::internal(format!("Interface name {} not found", entry.name)));
        };
        let ours = link.kind.as_deref() == Some("veth")
            && Some(link.index) == pod_link.peer_index
            && link.peer_index == Some(pod_link.index)
            && link.master == Some(bridge.index);
        if ours {
            cnicore::check::mac(entry, &link)?;
            found_host = true;
            break;
        }
    }
    if !found_host {
        return Err(Error::internal(format!("CNI veth created for bridge {} was not found", conf.bridge)));
    }

    cnicore::check::addresses_and_routes(&mut pod_nl, &prev, pod_link.index, ifname)?;
    if conf.layer3 && conf.ip_masq {
        let ips: Vec<IpNet> = pod_ips(&prev, ifname).collect();
        let backend = Backend::or_detect(conf.masq_backend)?;
        masq::check_with_reference(backend, &conf.masq(&ctx.env.container_id, &ips), ifname)?;
    }
    Ok(())
}

pub(crate) use cnicore::check::pod_ips;

fn check_bridge(nl: &mut Netlink, entry: Option<&Interface>, conf: &Config) -> Result<Link> {
    let name = &conf.bridge;
    let entry =
        entry.ok_or_else(|| Error::internal(format!("CNI created bridge {name} in host namespace was not found")))?;
    if !entry.sandbox.is_empty() {
        return Err(Error::internal(format!("Interface {name} should not be in sandbox")));
    }
    let link = nl
        .link_by_name(name)
        .context("netlink")?
        .ok_or_else(|| Error::internal(format!("Interface name {name} not found")))?;
    if !is_bridge(&link) {
        return Err(Error::internal(format!("Interface {name} does not have link type of bridge")));
    }
    if !entry.mac.is_empty() && Some(entry.mac.to_lowercase()) != link.mac.map(|m| format_mac(&m)) {
        return Err(Error::internal(format!("Bridge interface {name} Mac doesn't match: {}", entry.mac)));
    }
    if link.promisc != conf.promisc {
        return Err(Error::internal(format!(
            "Bridge interface {name} configured Promisc Mode {} doesn't match current state: {}",
            conf.promisc, link.promisc
        )));
    }
    Ok(link)
}
