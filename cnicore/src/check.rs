//! CHECK of a pod interface against `prevResult` (the reference's `ip.ValidateExpectedInterfaceIPs` and
//! `ip.ValidateExpectedRoute`): the one CHECK of every plugin that makes a pod interface (host-device and tap,
//! the link plugins, bridge's pod side), each adding its own settings to compare.

use crate::netlink::{IpFamily, KindData, Link, Netlink, RT_TABLE_MAIN};
use crate::spec::{CniResult, Context, Error, ErrorContext, Interface, Result};
use ipnet::IpNet;

/// The entry of `prev` for pod interface `ifname` in netns `sandbox`.
pub fn pod_entry<'a>(prev: &'a CniResult, ifname: &str, sandbox: &str) -> Result<&'a Interface> {
    prev.interfaces.iter().find(|i| i.name == ifname && i.sandbox == sandbox).ok_or_else(|| {
        Error::internal(format!("Sandbox in prevResult doesn't match configured netns {sandbox:?} for {ifname:?}"))
    })
}

/// The MAC of `link` is the one `entry` names, when it names one.
pub fn mac(entry: &Interface, link: &Link) -> Result<()> {
    let actual = link.mac.map(|m| crate::mac::format(&m)).unwrap_or_default();
    if !entry.mac.is_empty() && entry.mac.to_lowercase() != actual {
        return Err(Error::internal(format!("Interface {} Mac {} doesn't match: {actual}", entry.name, entry.mac)));
    }
    Ok(())
}

/// The addresses of `prev` on the pod interface (or on no interface in particular).
pub fn pod_ips<'a>(prev: &'a CniResult, ifname: &'a str) -> impl Iterator<Item = IpNet> + 'a {
    prev.ips
        .iter()
        .filter(move |ip| ip.interface.and_then(|i| prev.interfaces.get(i)).is_none_or(|i| i.name == ifname))
        .map(|ip| ip.address)
}

/// For DEL: the pod's addresses, each once: those of the pod interface in the `prevResult` of `ctx` (one that
/// cannot be read is ignored with a warning: DEL must succeed) and those `found` on the interface itself.
pub fn teardown_pod_ips(ctx: &Context, found: &[IpNet]) -> Vec<IpNet> {
    let mut ips: Vec<IpNet> = match ctx.prev_result() {
        Ok(Some(prev)) => pod_ips(&prev, &ctx.env.ifname).collect(),
        Ok(None) => Vec::new(),
        Err(e) => {
            crate::warn!("ignoring prevResult on DEL: {}", e.msg);
            Vec::new()
        }
    };
    ips.extend(found);
    ips.sort();
    ips.dedup();
    ips
}

/// Every address of the pod interface in `prev` is on link `index`, and every route of the main table is in
/// the pod's.
pub fn addresses_and_routes(nl: &mut Netlink, prev: &CniResult, index: u32, ifname: &str) -> Result<()> {
    let addresses = nl.addresses(Some(index)).context("netlink")?;
    for ip in pod_ips(prev, ifname) {
        if !addresses.iter().any(|a| a.addr == ip) {
            return Err(Error::internal(format!("Failed to match addr {ip} on interface {ifname}")));
        }
    }
    let mut routes = Vec::new();
    for family in IpFamily::ALL {
        if prev.routes.iter().any(|r| r.dst.addr().is_ipv4() == (family == IpFamily::V4)) {
            routes.extend(nl.routes(family, RT_TABLE_MAIN).context("netlink")?);
        }
    }
    for expected in prev.routes.iter().filter(|r| r.table.is_none_or(|t| t == RT_TABLE_MAIN)) {
        let present =
            routes.iter().any(|r| r.dst == expected.dst && expected.gw.is_none_or(|gw| r.gateway == Some(gw)));
        if !present {
            let via = expected.gw.map(|g| format!(" via {g}")).unwrap_or_default();
            return Err(Error::internal(format!("Failed to match route {}{via} in the container", expected.dst)));
        }
    }
    Ok(())
}

/// The whole CHECK of a plugin whose pod interface is all it made: `CNI_IFNAME` in `prev` for this netns, the
/// link there (of link kind `kind` when given), its MAC, addresses and routes.
pub fn pod_interface(ctx: &Context, prev: &CniResult, pod: &mut Netlink, kind: Option<&str>) -> Result<()> {
    let ifname = ctx.env.ifname.as_str();
    let entry = pod_entry(prev, ifname, &ctx.netns()?.display().to_string())?;
    let link = pod
        .link_by_name(ifname)
        .context("netlink")?
        .filter(|l| kind.is_none_or(|k| l.kind.as_deref() == Some(k)))
        .ok_or_else(|| Error::internal(format!("Container Interface name in prevResult: {ifname} not found")))?;
    mac(entry, &link)?;
    addresses_and_routes(pod, prev, link.index, ifname)
}

/// CHECK of a link plugin's pod interface (macvlan, ipvlan, vlan, dummy, ptp): the interface `prevResult` names
/// for `CNI_IFNAME` and this netns exists, is of the plugin's kind with the `expected` settings (compared by the
/// caller) and MAC, and carries `prevResult`'s addresses and routes, as in [`pod_interface`]. Returns the link
/// for the caller's own comparisons.
pub fn pod_link_of_kind(
    ctx: &Context,
    prev: &CniResult,
    kind: &str,
    expected: impl FnOnce(&KindData) -> Result<()>,
) -> Result<Link> {
    let ifname = ctx.env.ifname.as_str();
    let entry = pod_entry(prev, ifname, &ctx.netns()?.display().to_string())?;
    let pod_ns = ctx.open_netns()?;
    let mut pod = Netlink::in_netns(&pod_ns).context("failed to open netlink in the pod namespace")?;
    let (link, data) = pod
        .link_with_kind_data(ifname)
        .context("netlink")?
        .ok_or_else(|| Error::internal(format!("container Interface name in prevResult: {ifname} not found")))?;
    if link.kind.as_deref() != Some(kind) {
        return Err(not_of_kind(ifname, kind));
    }
    expected(&data)?;
    mac(entry, &link)?;
    addresses_and_routes(&mut pod, prev, link.index, ifname)?;
    Ok(link)
}

/// CHECK's error for a pod interface that is not a link of the plugin's kind.
pub fn not_of_kind(ifname: &str, kind: &str) -> Error {
    Error::internal(format!("Error: Container interface {ifname} not of type {kind}"))
}

/// CHECK's error for a pod link of the plugin's kind in another mode than the config's.
pub fn mode_mismatch(kind: &str, actual: &str, expected: &str) -> Error {
    Error::internal(format!("container {kind} mode {actual} does not match expected value: {expected}"))
}
