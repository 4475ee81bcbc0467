//! `vrf`, a chained plugin, as the reference v1.9: puts the pod interface into VRF `vrfname` inside the pod,
//! creating the VRF on the routing table `table` (or the first table from 1 that no VRF of the pod uses),
//! keeping the interface's global IPv6 addresses (enslaving drops them) and moving its routes that carry a
//! source address into the VRF's table. DEL takes the interface out and deletes the VRF with its last
//! interface. Kernels without `CONFIG_NET_VRF` get a clear error and an unchanged pod.

use cnicore::failpoint;
use cnicore::netlink::{AddressOptions, IpFamily, Link, Netlink, Route, Scope, RT_TABLE_MAIN};
use cnicore::netns::NetNs;
use cnicore::spec::{plugin_main, CniResult, Context, Error, ErrorContext, Result, Verbs};
use cnicore::undo::Undo;
use ipnet::IpNet;
use serde::Deserialize;

#[derive(Deserialize)]
struct ConfIn {
    #[serde(default)]
    vrfname: String,
    #[serde(default)]
    table: u32,
}

#[derive(Debug)]
struct Config {
    name: String,
    /// 0: the first free table.
    table: u32,
}

fn load(ctx: &Context) -> Result<Config> {
    let conf: ConfIn = ctx.parse_conf()?;
    if conf.vrfname.is_empty() {
        return Err(Error::config("configuration is expected to have a valid vrf name"));
    }
    cnicore::spec::validate_ifname(&conf.vrfname).map_err(|e| Error::config(format!("vrfname: {}", e.msg)))?;
    Ok(Config { name: conf.vrfname, table: conf.table })
}

/// The VRF called `name` in the pod and its table; an error when a link of that name is not a VRF.
fn find_vrf(nl: &mut Netlink, name: &str) -> Result<Option<(Link, u32)>> {
    let Some(link) = nl.link_by_name(name).context("netlink")? else { return Ok(None) };
    let table = nl.vrfs().context("failed to list VRFs")?.into_iter().find(|(l, _)| l.index == link.index);
    match table {
        Some((_, table)) => Ok(Some((link, table))),
        None => Err(Error::internal(format!("Netlink {name} is not a VRF"))),
    }
}

/// The first table from 1 that no VRF uses (the reference's `findFreeRoutingTableID`).
fn free_table(used: &[u32]) -> u32 {
    (1..u32::MAX).find(|t| !used.contains(t)).unwrap_or(u32::MAX)
}

fn no_vrf_support(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::Unsupported
}

fn add(ctx: &Context) -> Result<CniResult> {
    let conf = load(ctx)?;
    let prev = ctx.prev_result()?.ok_or_else(|| Error::config("missing prevResult from earlier plugin"))?;
    let pod_ns = ctx.open_netns()?;
    let mut nl = Netlink::in_netns(&pod_ns).context("failed to open netlink in the pod's netns")?;
    let existing = find_vrf(&mut nl, &conf.name)?;
    if let Some((_, table)) = &existing {
        if conf.table != 0 && *table != conf.table {
            return Err(Error::config(format!("VRF {} already exist with different routing table {table}", conf.name)));
        }
    }
    let ifname = ctx.env.ifname.as_str();
    let link = nl
        .link_by_name(ifname)
        .context("netlink")?
        .ok_or_else(|| Error::internal(format!("could not get link by name {ifname}")))?;
    if let Some(master) = link.master {
        let name = nl.link_by_index(master).ok().flatten().map(|l| l.name).unwrap_or_else(|| master.to_string());
        return Err(Error::internal(format!("interface {ifname} has already a master set: {name}")));
    }
    // What enslaving loses: the global IPv6 addresses, and (in main) the routes with a source address.
    let v6_addresses: Vec<IpNet> = nl
        .addresses(Some(link.index))
        .context("failed to list addresses")?
        .into_iter()
        .filter(|a| a.addr.addr().is_ipv6() && a.scope == Scope::Universe)
        .map(|a| a.addr)
        .collect();
    let mut routes = Vec::new();
    for family in IpFamily::ALL {
        let main = nl.routes(family, RT_TABLE_MAIN).context("failed getting all routes")?;
        routes.extend(
            main.into_iter().filter(|r| r.oif == Some(link.index) && r.scope == Scope::Universe && r.src.is_some()),
        );
    }
    let mut undo = Undo::default();
    let outcome = apply(&conf, &pod_ns, &mut nl, existing, &link, &v6_addresses, &routes, &mut undo);
    if outcome.is_err() {
        undo.rollback();
    }
    outcome.map(|()| prev)
}

#[allow(clippy::too_many_arguments)]
fn apply<'a>(
    conf: &'a Config,
    pod_ns: &'a NetNs,
    nl: &mut Netlink,
    existing: Option<(Link, u32)>,
    link: &Link,
    v6_addresses: &[IpNet],
    routes: &[Route],
    undo: &mut Undo<'a>,
) -> Result<()> {
    let (vrf, table) = match existing {
        Some(found) => found,
        None => {
            let table = match conf.table {
                0 => free_table(&nl.vrfs().context("failed to list VRFs")?.iter().map(|(_, t)| *t).collect::<Vec<_>>()),
                t => t,
            };
            let vrf = nl.create_vrf(&conf.name, table).map_err(|e| {
                if no_vrf_support(&e) {
                    Error::internal(format!(
                        "could not add VRF {}: this kernel has no VRF support (CONFIG_NET_VRF): {e}",
                        conf.name
                    ))
                } else {
                    // E.g. EBUSY with net.vrf.strict_mode when another VRF holds the table.
                    let refused = cnicore::netlink::refusal::describe(&e);
                    Error::internal(format!(
                        "could not add VRF {} on table {table}: the kernel refused it with {refused}",
                        conf.name
                    ))
                }
            })?;
            let index = vrf.index;
            undo.push(format!("delete VRF {}", conf.name), move || {
                Netlink::in_netns(pod_ns).and_then(|mut nl| nl.delete_link(index)).context("netlink")
            });
            failpoint::hit("vrf/after-create");
            nl.set_up(vrf.index).with_context(|| format!("could not set link up for VRF {}", conf.name))?;
            (vrf, table)
        }
    };
    nl.set_master(link.index, vrf.index)
        .with_context(|| format!("could not set vrf {} as master of {}", conf.name, link.name))?;
    let index = link.index;
    undo.push(format!("take {} out of VRF {}", link.name, conf.name), move || {
        Netlink::in_netns(pod_ns).and_then(|mut nl| nl.set_master(index, 0)).context("netlink")
    });
    failpoint::hit("vrf/after-enslave");
    let now: Vec<IpNet> =
        nl.addresses(Some(link.index)).context("failed to list addresses")?.iter().map(|a| a.addr).collect();
    for addr in v6_addresses.iter().filter(|a| !now.contains(a)) {
        // Without DAD, unlike the reference, so that the address (and its local route in the VRF's table,
        // which the reference polls for) is there at once for the routes below.
        let options = AddressOptions { nodad: true, ..AddressOptions::default() };
        nl.add_address_with(link.index, *addr, options)
            .with_context(|| format!("could not restore address {addr} to {} @ {}", link.name, conf.name))?;
    }
    for route in routes {
        let moved = Route { table: Some(table), ..route.clone() };
        nl.replace_route(&moved).with_context(|| format!("could not add route '{}' to table {table}", route.dst))?;
    }
    Ok(())
}

fn del(ctx: &Context) -> Result<()> {
    let conf = ctx.load_for_teardown(load)?;
    let Some(pod_ns) = ctx.open_netns_if_exists()? else { return Ok(()) };
    let mut nl = Netlink::in_netns(&pod_ns).context("failed to open netlink in the pod's netns")?;
    let vrf = match find_vrf(&mut nl, &conf.name) {
        Ok(Some((vrf, _))) => vrf,
        Ok(None) => return Ok(()),
        Err(e) => {
            cnicore::warn!("{}; nothing to undo", e.msg);
            return Ok(());
        }
    };
    if let Some(link) = nl.link_by_name(&ctx.env.ifname).context("netlink")? {
        if link.master == Some(vrf.index) {
            nl.set_master(link.index, 0)
                .with_context(|| format!("resetMaster: could not reset master of {}", link.name))?;
        }
    }
    let links = nl.links().context("failed to list links")?;
    if !links.iter().any(|l| l.master == Some(vrf.index)) {
        match nl.delete_link(vrf.index) {
            Err(e) if !cnicore::netlink::is_not_found(&e) => {
                return Err(Error::os(format!("failed to delete VRF {}", conf.name), e))
            }
            _ => {}
        }
    }
    Ok(())
}

fn check(ctx: &Context) -> Result<()> {
    let conf = load(ctx)?;
    ctx.prev_result()?.ok_or_else(|| Error::config("missing prevResult from earlier plugin"))?;
    let pod_ns = ctx.open_netns()?;
    let mut nl = Netlink::in_netns(&pod_ns).context("failed to open netlink in the pod's netns")?;
    let (vrf, _) =
        find_vrf(&mut nl, &conf.name)?.ok_or_else(|| Error::internal(format!("VRF {} not found", conf.name)))?;
    let ifname = &ctx.env.ifname;
    match nl.link_by_name(ifname).context("netlink")? {
        Some(link) if link.master == Some(vrf.index) => Ok(()),
        _ => Err(Error::internal(format!("failed to find {ifname} associated to vrf {}", conf.name))),
    }
}

fn main() {
    plugin_main(concat!("CNI vrf plugin (cnicore) v", env!("CARGO_PKG_VERSION")), &Verbs::new(add, del, check))
}

#[cfg(test)]
mod tests {
    use super::*;
    use cnicore::spec::{codes, Command};

    #[test]
    fn first_free_table_from_one() {
        assert_eq!(free_table(&[]), 1);
        assert_eq!(free_table(&[1, 2, 4]), 3);
    }

    #[test]
    fn config() {
        let load = |s: &str| load(&Context::for_test(Command::Add, s, ""));
        let c = load(r#"{"name":"n","vrfname":"blue","table":7}"#).unwrap();
        assert_eq!((c.name.as_str(), c.table), ("blue", 7));
        assert!(load(r#"{"name":"n"}"#).unwrap_err().msg.contains("valid vrf name"));
        assert_eq!(load(r#"{"name":"n","vrfname":"a/b"}"#).unwrap_err().code, codes::INVALID_CONFIG);
        assert_eq!(load(r#"{"name":"n","vrfname":"b","table":-1}"#).unwrap_err().code, codes::INVALID_CONFIG);
    }
}
