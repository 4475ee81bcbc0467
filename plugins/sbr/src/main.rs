//! `sbr` (source-based routing), a chained plugin, as the reference v1.9: for each address of the pod
//! interface in `prevResult`, a rule "from <address> lookup <table>", the table holding a default route through
//! the address's gateway and a copy of the interface's routes, which then leave the main table. Tables are
//! numbered from 100, each the first one no rule uses. With `table` in the
//! config, only the rules are added, all to that table, and the routes stay. DEL removes the rules whose source
//! is an address of the interface; the routes it copied stay in their tables and go with the link. Both hold a
//! lock on the netns file, as the reference does.

use std::fs::File;

use cnicore::failpoint;
use cnicore::netlink::{IpFamily, Netlink, Route, Rule, RT_TABLE_MAIN};
use cnicore::netns::NetNs;
use cnicore::spec::{plugin_main, CniResult, Context, Error, ErrorContext, Errors, IpConfig, Result, Verbs};
use cnicore::undo::Undo;
use ipnet::IpNet;
use serde::Deserialize;

/// The reference's first table number.
const FIRST_TABLE: u32 = 100;

#[derive(Deserialize)]
struct ConfIn {
    #[serde(default)]
    table: Option<i64>,
}

fn load_table(ctx: &Context) -> Result<Option<u32>> {
    let conf: ConfIn = ctx.parse_conf()?;
    match conf.table {
        None => Ok(None),
        Some(t) if (1..=i64::from(u32::MAX)).contains(&t) => Ok(Some(t as u32)),
        Some(t) => Err(Error::config(format!("invalid table {t}: a routing table is 1 to 4294967295"))),
    }
}

/// The lock the reference takes on the netns file (flock), held until dropped.
fn lock_netns(ctx: &Context) -> Result<File> {
    let path = ctx.netns()?;
    let file = File::open(path).map_err(|e| Error::os(format!("failed to open {} to lock it", path.display()), e))?;
    file.lock().map_err(|e| Error::os(format!("failed to lock {}", path.display()), e))?;
    Ok(file)
}

/// The addresses of `prev` on `ifname` (or on no interface in particular).
fn ip_configs<'a>(prev: &'a CniResult, ifname: &str) -> Result<Vec<&'a IpConfig>> {
    if prev.ips.is_empty() {
        return Err(Error::config(format!("No IP addresses supplied on interface: {ifname}")));
    }
    Ok(prev
        .ips
        .iter()
        .filter(|ip| ip.interface.and_then(|i| prev.interfaces.get(i)).is_none_or(|i| i.name == ifname))
        .collect())
}

/// The host prefix of an address (`/32`, `/128`).
fn host(ip: &IpConfig) -> IpNet {
    IpNet::from(ip.address.addr())
}

fn all_rules(nl: &mut Netlink) -> Result<Vec<Rule>> {
    let mut rules = nl.rules(IpFamily::V4).context("Failed to list all rules")?;
    rules.extend(nl.rules(IpFamily::V6).context("Failed to list all rules")?);
    Ok(rules)
}

/// The routing tables in use as the reference counts them: those of the rules, and main (its route listing
/// sees the main table only). A table that holds routes but has no rule is reused, as theirs does: that is what
/// lets an ADD after a DEL on the same interface find its table (and the routes DEL left there) again.
fn tables_in_use(rules: &[Rule]) -> Vec<u32> {
    rules.iter().map(|r| r.table).chain([RT_TABLE_MAIN]).collect()
}

/// The first table from `candidate` on that is not in use.
fn next_table(in_use: &[u32], mut candidate: u32) -> u32 {
    while in_use.contains(&candidate) {
        candidate += 1;
    }
    candidate
}

/// What ADD does, worked out before anything changes: the rules and the routes for each table, and the main
/// table's routes of the interface that go.
#[derive(Debug, Default, PartialEq)]
struct Plan {
    rules: Vec<Rule>,
    routes: Vec<Route>,
    removed: Vec<Route>,
}

/// The reference's `doRoutes`: one table per address; its rule, its default route via the gateway, and the
/// interface's routes whose source or gateway is in the address's subnet (or that have neither).
fn plan(ips: &[&IpConfig], link_index: u32, link_routes: &[Route], in_use: &[u32]) -> Plan {
    let mut plan = Plan { removed: link_routes.to_vec(), ..Plan::default() };
    let mut table = next_table(in_use, FIRST_TABLE);
    for ip in ips {
        plan.rules.push(Rule::from_source(host(ip), table, None));
        if let Some(gateway) = ip.gateway {
            let any = if ip.address.addr().is_ipv4() { "0.0.0.0/0" } else { "::/0" };
            plan.routes.push(Route {
                dst: any.parse().expect("default prefix"),
                gateway: Some(gateway),
                oif: Some(link_index),
                table: Some(table),
                ..Route::default()
            });
        }
        let subnet = ip.address.trunc();
        for route in link_routes {
            let related = route.src.is_some_and(|s| subnet.contains(&s))
                || route.gateway.is_some_and(|g| subnet.contains(&g))
                || (route.src.is_none() && route.gateway.is_none());
            if related {
                // As the reference: copied with its flags cleared.
                plan.routes.push(Route { table: Some(table), onlink: false, ..route.clone() });
            }
        }
        table = next_table(in_use, table + 1);
    }
    plan
}

fn add(ctx: &Context) -> Result<CniResult> {
    let table = load_table(ctx)?;
    let prev = ctx.prev_result()?.ok_or_else(|| Error::config("This plugin must be called as chained plugin"))?;
    let ifname = ctx.env.ifname.as_str();
    let ips = ip_configs(&prev, ifname)?;
    let pod_ns = ctx.open_netns()?;
    let _lock = lock_netns(ctx)?;
    let mut nl = Netlink::in_netns(&pod_ns).context("failed to open netlink in the pod's netns")?;
    let plan = match table {
        Some(table) => {
            Plan { rules: ips.iter().map(|ip| Rule::from_source(host(ip), table, None)).collect(), ..Plan::default() }
        }
        None => {
            let rules = all_rules(&mut nl)?;
            let in_use = tables_in_use(&rules);
            let link = nl
                .link_by_name(ifname)
                .context("netlink")?
                .ok_or_else(|| Error::internal(format!("Cannot find network interface {ifname}")))?;
            let mut link_routes = Vec::new();
            for family in IpFamily::ALL {
                let routes = nl.routes(family, RT_TABLE_MAIN).context("Unable to list routes")?;
                link_routes.extend(routes.into_iter().filter(|r| r.oif == Some(link.index)));
            }
            plan(&ips, link.index, &link_routes, &in_use)
        }
    };
    let mut undo = Undo::default();
    let outcome = apply(&pod_ns, &mut nl, &plan, &mut undo);
    if outcome.is_err() {
        undo.rollback();
    }
    outcome.map(|()| prev)
}

fn apply<'a>(pod_ns: &'a NetNs, nl: &mut Netlink, plan: &'a Plan, undo: &mut Undo<'a>) -> Result<()> {
    for rule in &plan.rules {
        let from = rule.src.map(|s| s.to_string()).unwrap_or_default();
        nl.add_rule(rule).with_context(|| format!("Failed to add rule from {from} lookup {}", rule.table))?;
        undo.push(format!("delete the rule from {from} lookup {}", rule.table), move || {
            Netlink::in_netns(pod_ns).and_then(|mut nl| nl.del_rule(rule)).context("netlink")
        });
        failpoint::hit("sbr/after-rule");
    }
    for route in &plan.routes {
        let table = route.table.unwrap_or(RT_TABLE_MAIN);
        nl.replace_route(route).with_context(|| format!("Failed to add route {} to table {table}", route.dst))?;
        undo.push(format!("delete route {} of table {table}", route.dst), move || {
            Netlink::in_netns(pod_ns).and_then(|mut nl| nl.del_route(route)).context("netlink")
        });
    }
    failpoint::hit("sbr/after-routes");
    for route in &plan.removed {
        match nl.del_route(route) {
            Err(e) if !cnicore::netlink::is_not_found(&e) => {
                return Err(Error::os(format!("Failed to delete route {}", route.dst), e))
            }
            _ => {}
        }
        undo.push(format!("put route {} back in the main table", route.dst), move || {
            Netlink::in_netns(pod_ns).and_then(|mut nl| nl.replace_route(route)).context("netlink")
        });
    }
    Ok(())
}

fn del(ctx: &Context) -> Result<()> {
    let table = ctx.load_for_teardown(load_table)?;
    let Some(pod_ns) = ctx.open_netns_if_exists()? else { return Ok(()) };
    let _lock = lock_netns(ctx)?;
    let ifname = ctx.env.ifname.as_str();
    let mut nl = Netlink::in_netns(&pod_ns).context("failed to open netlink in the pod's netns")?;
    let Some(link) = nl.link_by_name(ifname).context("netlink")? else { return Ok(()) };
    let addresses = nl.addresses(Some(link.index)).context("Failed to list all addrs")?;
    let mut errors = Errors::new();
    for rule in all_rules(&mut nl)? {
        let ours = table.is_none_or(|t| t == rule.table)
            && rule.src.is_some_and(|src| addresses.iter().any(|a| a.addr.addr() == src.addr()));
        if ours {
            match nl.del_rule(&rule) {
                Err(e) if !cnicore::netlink::is_not_found(&e) => {
                    let from = rule.src.map(|s| s.to_string()).unwrap_or_default();
                    errors.push(Error::os(format!("Failed to delete rule from {from} lookup {}", rule.table), e))
                }
                _ => {}
            }
        }
    }
    errors.into_result()
}

/// The reference's CHECK does nothing; ours checks that each address of the interface has its rule.
fn check(ctx: &Context) -> Result<()> {
    let table = load_table(ctx)?;
    let Some(prev) = ctx.prev_result()? else { return Ok(()) };
    let pod_ns = ctx.open_netns()?;
    let mut nl = Netlink::in_netns(&pod_ns).context("failed to open netlink in the pod's netns")?;
    let rules = all_rules(&mut nl)?;
    for ip in ip_configs(&prev, &ctx.env.ifname)? {
        let found = rules.iter().any(|r| r.src == Some(host(ip)) && table.is_none_or(|t| t == r.table));
        if !found {
            return Err(Error::internal(format!("no rule from {} in the pod", ip.address.addr())));
        }
    }
    Ok(())
}

fn main() {
    plugin_main(concat!("CNI sbr plugin (cnicore) v", env!("CARGO_PKG_VERSION")), &Verbs::new(add, del, check))
}

#[cfg(test)]
mod tests {
    use super::*;
    use cnicore::netlink::Scope;

    fn ipc(address: &str, gateway: Option<&str>) -> IpConfig {
        IpConfig { address: address.parse().unwrap(), gateway: gateway.map(|g| g.parse().unwrap()), interface: None }
    }

    fn route(dst: &str, gateway: Option<&str>, src: Option<&str>) -> Route {
        Route {
            dst: dst.parse().unwrap(),
            gateway: gateway.map(|g| g.parse().unwrap()),
            src: src.map(|s| s.parse().unwrap()),
            oif: Some(3),
            table: Some(RT_TABLE_MAIN),
            scope: Scope::Link,
            ..Route::default()
        }
    }

    #[test]
    fn tables_from_100_skipping_those_in_use() {
        assert_eq!(next_table(&[], FIRST_TABLE), 100);
        assert_eq!(next_table(&[100, 101, 103, 254, 255], FIRST_TABLE), 102);
        let (a, b) = (ipc("10.1.0.5/24", Some("10.1.0.1")), ipc("10.2.0.5/24", None));
        let routes = [
            route("10.1.0.0/24", None, Some("10.1.0.5")),
            route("10.2.0.0/24", None, Some("10.2.0.5")),
            route("192.168.0.0/16", Some("10.2.0.1"), None),
            route("fe80::/64", None, None),
        ];
        let plan = plan(&[&a, &b], 3, &routes, &[100, 101, 102, 254]);
        let rules: Vec<(String, u32)> = plan.rules.iter().map(|r| (r.src.unwrap().to_string(), r.table)).collect();
        assert_eq!(rules, [("10.1.0.5/32".to_string(), 103), ("10.2.0.5/32".to_string(), 104)]);
        let routes: Vec<(String, Option<u32>)> = plan.routes.iter().map(|r| (r.dst.to_string(), r.table)).collect();
        assert_eq!(
            routes,
            [
                ("0.0.0.0/0".to_string(), Some(103)),
                ("10.1.0.0/24".to_string(), Some(103)),
                ("fe80::/64".to_string(), Some(103)),
                ("10.2.0.0/24".to_string(), Some(104)),
                ("192.168.0.0/16".to_string(), Some(104)),
                ("fe80::/64".to_string(), Some(104)),
            ]
        );
        assert_eq!(plan.routes[0].gateway, Some("10.1.0.1".parse().unwrap()));
        assert_eq!(plan.removed.len(), 4);
    }

    #[test]
    fn table_config() {
        use cnicore::spec::{codes, Command};
        let load = |t: &str| load_table(&Context::for_test(Command::Add, format!(r#"{{"name":"n","table":{t}}}"#), ""));
        assert_eq!(load("500").unwrap(), Some(500));
        for bad in ["0", "-1", "4294967296"] {
            assert_eq!(load(bad).unwrap_err().code, codes::INVALID_CONFIG, "{bad}");
        }
    }
}
