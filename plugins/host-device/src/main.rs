//! `host-device`: moves an existing device of the node into the pod, renamed to `CNI_IFNAME`, and back on DEL
//! under its original name. As the reference v1.9, the original name travels with the device as its alias
//! (`IFLA_IFALIAS`), so a device moved by either plugin is moved back by the other. Moving a device to another
//! namespace drops its addresses and the reference's DEL returns it down and bare; ours records them before the
//! move ([`saved`]) and gives them back with the up state.
//!
//! Modules: [`config`] (how the device is named) and [`saved`].

mod config;
mod saved;

use cnicore::failpoint;
use cnicore::netlink::{is_exists, Link, Netlink};
use cnicore::netns::NetNs;
use cnicore::spec::{ipam, plugin_main, CniResult, Command, Context, Error, ErrorContext, Errors, Interface, Verbs};
use cnicore::spec::{IpConfig, Result};
use cnicore::undo::Undo;
use config::Config;
use saved::Saved;

/// The alias of link `name`, if it has one.
fn alias_of(nl: &mut Netlink, name: &str) -> Result<Option<String>> {
    Ok(nl
        .links_with_aliases()
        .context("failed to list links")?
        .into_iter()
        .find(|(l, _)| l.name == name)
        .and_then(|(_, alias)| alias)
        .filter(|a| !a.is_empty()))
}

/// Moves link `name` of the namespace of `from` to `to`, renamed `new_name`. The kernel renames after the
/// move; when the rename fails there, the link is moved back under its name (and the error returned).
fn move_link(from: &mut Netlink, name: &str, to: &NetNs, new_name: &str) -> Result<()> {
    let link = from
        .link_by_name(name)
        .context("netlink")?
        .ok_or_else(|| Error::internal(format!("failed to find {name:?} to move it")))?;
    match from.move_to_netns(link.index, to, Some(new_name)) {
        Ok(()) => Ok(()),
        Err(e) => {
            if is_exists(&e) {
                // Moved, not renamed: bring it back.
                let mut there = Netlink::in_netns(to).context("netlink")?;
                if let Some(stray) = there.link_by_name(name).context("netlink")? {
                    let back = there.move_to_netns(stray.index, from.netns(), None);
                    cnicore::spec::report_rollback(format!("move {name:?} back"), back.context("netlink"));
                }
            }
            Err(Error::os(format!("failed to move {name:?} as {new_name:?}"), e))
        }
    }
}

/// The node side of an ADD that cannot be known to fail later: the device, the pod, the IPAM plugin.
struct Preflight {
    conf: Config,
    pod_ns: NetNs,
    node_ns: NetNs,
    node: Netlink,
    pod: Netlink,
    /// The device, its alias and its addresses in the node (put back if the ADD fails).
    device: Option<Device>,
}

struct Device {
    link: Link,
    alias: Option<String>,
    addresses: Vec<ipnet::IpNet>,
    /// Whether it had an IPv6 link-local address, which the kernel makes again (asynchronously) when it is up.
    had_link_local: bool,
}

/// An IPv6 link-local address, which the kernel makes again by itself when the device comes up.
fn is_link_local(addr: &ipnet::IpNet) -> bool {
    matches!(addr, ipnet::IpNet::V6(n) if n.addr().is_unicast_link_local())
}

/// Waits (briefly: a failed ADD only) until the device given back has its IPv6 link-local address again, out of
/// duplicate address detection (its local route comes with that), so that the node is as it was when ADD fails.
fn settle_link_local(nl: &mut Netlink, index: u32) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
    while std::time::Instant::now() < deadline {
        let settled = nl
            .addresses(Some(index))
            .is_ok_and(|addrs| addrs.iter().any(|a| is_link_local(&a.addr) && !a.is_tentative()));
        if settled {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

fn preflight(ctx: &Context) -> Result<Preflight> {
    let conf = Config::load(ctx, false)?;
    let pod_ns = ctx.open_netns()?;
    let node_ns = NetNs::current().context("failed to open the node's netns")?;
    let mut node = Netlink::new().context("failed to open netlink in the node's netns")?;
    let mut pod = Netlink::in_netns(&pod_ns).context("failed to open netlink in the pod's netns")?;
    if let Some(t) = &conf.ipam_type {
        ipam::find_plugin(t, &ctx.env.path)?;
    }
    let device = match conf.dpdk {
        true => None,
        false => {
            let link = config::find_link(&mut node, &conf.selector)
                .map_err(|e| Error::new(e.code, format!("failed to find host device: {}", e.msg)))?;
            if link.loopback {
                return Err(Error::config(format!(
                    "{:?} is a loopback device, which cannot leave its netns",
                    link.name
                )));
            }
            let ifname = &ctx.env.ifname;
            if pod.link_by_name(ifname).context("failed to look at the pod's links")?.is_some() {
                return Err(Error::internal(format!("an interface named {ifname:?} already exists in the pod")));
            }
            let alias = alias_of(&mut node, &link.name)?;
            let all = node.addresses(Some(link.index)).context("failed to list the device's addresses")?;
            let had_link_local = all.iter().any(|a| is_link_local(&a.addr));
            let addresses = all.iter().filter(|a| !is_link_local(&a.addr)).map(|a| a.addr).collect();
            Some(Device { link, alias, addresses, had_link_local })
        }
    };
    Ok(Preflight { conf, pod_ns, node_ns, node, pod, device })
}

fn add(ctx: &Context) -> Result<CniResult> {
    let mut p = preflight(ctx)?;
    let mut undo = Undo::default();
    let outcome = apply(ctx, &mut p, &mut undo);
    if outcome.is_err() {
        undo.rollback();
    }
    outcome
}

fn apply<'a>(ctx: &'a Context, p: &'a mut Preflight, undo: &mut Undo<'a>) -> Result<CniResult> {
    let ifname = ctx.env.ifname.as_str();
    let sandbox = ctx.netns()?.display().to_string();
    let mut result = CniResult {
        interfaces: vec![Interface { name: ifname.to_string(), sandbox, ..Default::default() }],
        ..Default::default()
    };
    // IPAM first, unlike the reference: a refusal then leaves the device where it was, with its addresses.
    if p.conf.ipam_type.is_some() {
        let lease = ipam::add_undoable(ctx, undo)?;
        failpoint::hit("host-device/after-ipam");
        result.ips = lease.ips.into_iter().map(|ip| IpConfig { interface: Some(0), ..ip }).collect();
        result.routes = lease.routes;
        // As the reference: with IPAM, the result's DNS is the config's, not the IPAM plugin's.
        result.dns = p.conf.dns.clone().unwrap_or_default();
    }
    let Some(device) = &p.device else { return Ok(result) };
    let (name, index) = (device.link.name.clone(), device.link.index);
    let saved = Saved {
        container_id: ctx.env.container_id.clone(),
        ifname: ifname.to_string(),
        device: name.clone(),
        up: device.link.up,
        addresses: device.addresses.clone(),
    };
    let record = saved::path(&p.conf.data_dir, ctx)?;
    saved::write(&record, &saved)?;
    undo.push(format!("remove {}", record.display()), move || saved::remove(&record));
    p.node.set_alias(index, &name).with_context(|| format!("failed to set alias to {name:?}"))?;
    let restore = device.alias.clone().unwrap_or_default();
    let (node_ns, pod_ns) = (&p.node_ns, &p.pod_ns);
    let device_name = name.clone();
    undo.push(format!("restore the alias of {name:?}"), move || {
        let mut nl = Netlink::in_netns(node_ns).context("netlink")?;
        let link = nl.require_link(&device_name).context("netlink")?;
        nl.set_alias(link.index, &restore).context("netlink")
    });
    failpoint::hit("host-device/after-alias");

    move_link(&mut p.node, &device.link.name, &p.pod_ns, ifname)?;
    let had_link_local = device.had_link_local;
    undo.push(format!("move {ifname:?} back to the node as {name:?}"), move || {
        let mut pod = Netlink::in_netns(pod_ns).context("netlink")?;
        move_link(&mut pod, ifname, node_ns, &saved.device)?;
        let mut node = Netlink::in_netns(node_ns).context("netlink")?;
        let link = node.require_link(&saved.device).context("netlink")?;
        saved::restore(&mut node, link.index, &saved)?;
        if saved.up && had_link_local {
            settle_link_local(&mut node, link.index);
        }
        Ok(())
    });
    failpoint::hit("host-device/after-move");

    let link = p.pod.require_link(ifname).with_context(|| format!("failed to find {ifname:?} in the pod"))?;
    result.interfaces[0].mac = link.mac.map(|m| cnicore::mac::format(&m)).unwrap_or_default();
    if result.ips.is_empty() {
        p.pod.set_up(link.index).with_context(|| format!("failed to set {ifname:?} up"))?;
        return Ok(result);
    }
    cnicore::iface::configure(&p.pod_ns, &mut p.pod, ifname, link.index, &result, false)?;
    failpoint::hit("host-device/after-addresses");
    Ok(result)
}

fn del(ctx: &Context) -> Result<()> {
    let conf = ctx.load_for_teardown(|ctx| Config::load(ctx, true))?;
    let mut errors = Errors::new();
    if !conf.dpdk {
        let record = saved::path(&conf.data_dir, ctx)?;
        // The record goes once the device is back (or was never moved); kept for a retry otherwise.
        if errors.record(move_out(ctx, &conf, &record)).is_some() {
            errors.record(saved::remove(&record));
        }
    }
    if conf.ipam_type.is_some() {
        errors.record(ipam::exec(ctx, Command::Del));
    }
    errors.into_result()
}

/// An ADD killed between setting the alias and the move leaves the device in the node with its own name as
/// alias: cleared (best effort) when the config names the device by name or MAC.
fn clear_stale_alias(conf: &Config) {
    if !matches!(conf.selector, config::Selector::Name(_) | config::Selector::Mac(_)) {
        return;
    }
    let Ok(mut node) = Netlink::new() else { return };
    let Ok(device) = config::find_link(&mut node, &conf.selector) else { return };
    if alias_of(&mut node, &device.name).ok().flatten().as_deref() == Some(device.name.as_str()) {
        if let Err(e) = node.set_alias(device.index, "") {
            cnicore::warn!("failed to clear the alias of {:?}: {e}", device.name);
        }
    }
}

/// Moves the pod's `CNI_IFNAME` back to the node under the name its alias holds. Nothing to do without the
/// netns or the link; a link without an alias was not moved in by host-device and stays.
fn move_out(ctx: &Context, conf: &Config, record: &std::path::Path) -> Result<()> {
    let Some(pod_ns) = ctx.open_netns_if_exists()? else { return Ok(()) };
    let ifname = ctx.env.ifname.as_str();
    let mut pod = Netlink::in_netns(&pod_ns).context("failed to open netlink in the pod's netns")?;
    // One dump: the link and its alias.
    let links = pod.links_with_aliases().context("failed to list links")?;
    let Some((link, alias)) = links.into_iter().find(|(l, _)| l.name == ifname) else {
        clear_stale_alias(conf);
        return Ok(());
    };
    let Some(name) = alias.filter(|a| !a.is_empty()) else {
        cnicore::warn!("{ifname:?} in the pod has no alias: not a device host-device moved there; left in place");
        return Ok(());
    };
    let node_ns = NetNs::current().context("failed to open the node's netns")?;
    let mut node = Netlink::new().context("failed to open netlink in the node's netns")?;
    if node.link_by_name(&name).context("netlink")?.is_some() {
        return Err(Error::internal(format!(
            "cannot move {ifname:?} back to the node as {name:?}: the node has a link of that name"
        )));
    }
    // Down first, as the reference does: the move of a device that is up closes it inside the move, which
    // measured 3-6 ms slower (its pod-side state torn down while the kernel holds the move).
    pod.set_down(link.index).with_context(|| format!("failed to set {ifname:?} down"))?;
    move_link(&mut pod, ifname, &node_ns, &name)?;
    failpoint::hit("host-device/del-after-move");
    let link = node.require_link(&name).with_context(|| format!("failed to find {name:?} back in the node"))?;
    node.set_alias(link.index, "").with_context(|| format!("failed to unset the alias of {name:?}"))?;
    // With the record of our ADD, as it was; without (the reference moved it in), down and bare as theirs leaves it.
    match saved::read(record) {
        Some(saved) if saved.device == name => saved::restore(&mut node, link.index, &saved),
        _ => Ok(()),
    }
}

fn check(ctx: &Context) -> Result<()> {
    let conf = Config::load(ctx, false)?;
    let pod_ns = ctx.open_netns()?;
    ipam::exec_if(conf.ipam_type.is_some(), ctx, Command::Check)?;
    let prev = ctx.prev_result()?.ok_or_else(|| Error::config("Required prevResult missing"))?;
    if conf.dpdk {
        return Ok(());
    }
    let mut pod = Netlink::in_netns(&pod_ns).context("failed to open netlink in the pod's netns")?;
    cnicore::check::pod_interface(ctx, &prev, &mut pod, None)
}

/// The records of attachments not in the valid list go; GC is passed on to IPAM, as the spec asks.
fn gc(ctx: &Context) -> Result<()> {
    let conf = Config::load(ctx, true)?;
    let mut errors = Errors::new();
    errors.record(saved::gc(&conf.data_dir, &ctx.valid_attachments()?));
    errors.record(ipam::exec_if(conf.ipam_type.is_some(), ctx, Command::Gc));
    errors.into_result()
}

fn status(ctx: &Context) -> Result<()> {
    ipam::exec_if(Config::load(ctx, true)?.ipam_type.is_some(), ctx, Command::Status)
}

fn main() {
    plugin_main(
        concat!("CNI host-device plugin (cnicore) v", env!("CARGO_PKG_VERSION")),
        &Verbs::new(add, del, check).gc(gc).status(status),
    )
}
