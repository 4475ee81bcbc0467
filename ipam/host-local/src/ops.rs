//! The verbs: ADD, DEL, CHECK, GC, STATUS.

use crate::config::{self, Config};
use crate::dns::parse_resolv_conf;
use crate::lease::{Content, Owner};
use crate::range::RangeSet;
use crate::store::{boot_time, is_garbage, Reserver, Store};
use cnicore::failpoint;
use cnicore::spec::{codes, report_rollback, CniResult, Context, Dns, Error, Errors, IpConfig, Result};
use ipnet::IpNet;
use std::collections::HashSet;
use std::net::IpAddr;

/// The requested address of each range set, checked before anything is written.
fn requested_per_set(cfg: &Config) -> Result<Vec<Option<IpAddr>>> {
    let mut wanted = vec![None; cfg.range_sets.len()];
    for &ip in &cfg.requested {
        let Some(idx) = cfg.range_sets.iter().position(|s| s.contains(ip)) else {
            let ranges: Vec<String> = cfg.range_sets.iter().map(|s| s.to_string()).collect();
            return Err(Error::config(format!(
                "requested IP {ip} is not in any range of network {} ({})",
                cfg.name,
                ranges.join("; ")
            )));
        };
        if let Some(other) = wanted[idx] {
            return Err(Error::config(format!(
                "requested IPs {other} and {ip} are both in range set {idx}: one address per range set"
            )));
        }
        if let Some(range) = cfg.range_sets[idx].range_for(ip).filter(|r| r.is_reserved(ip)) {
            let what = if ip == range.gateway { "the gateway" } else { "the network or broadcast address" };
            return Err(Error::config(format!("requested IP {ip} is {what} of subnet {}", range.subnet)));
        }
        wanted[idx] = Some(ip);
    }
    Ok(wanted)
}

fn lock_network(cfg: &Config, create: bool) -> Result<Option<Store>> {
    Store::open(&cfg.network_dir(), create)
}

pub fn add(ctx: &Context) -> Result<CniResult> {
    let cfg = config::load(ctx)?;
    let wanted = requested_per_set(&cfg)?;
    let dns = match &cfg.resolv_conf {
        Some(path) => parse_resolv_conf(path)?,
        None => Dns::default(),
    };
    let (id, ifname) = (ctx.env.container_id.as_str(), ctx.env.ifname.as_str());
    let mut store = lock_network(&cfg, true)?.ok_or_else(|| Error::internal("network directory vanished"))?;
    store.ensure_index()?;

    // One attachment, one address per range set: a second ADD is an error, as in the reference.
    let owner = Owner::attachment(id, ifname);
    let mut held = store.leases_of(&owner)?;
    held.extend(store.leases_of(&Owner::Legacy { id: id.to_string() })?);
    if let Some(ip) = held.iter().find(|ip| cfg.range_sets.iter().any(|s| s.contains(**ip))) {
        store.commit()?;
        return Err(Error::internal(format!(
            "{ip} has been allocated to {id} (interface {ifname}), duplicate allocation is not allowed"
        )));
    }

    let mut ips = Vec::new();
    let mut taken = Vec::new();
    let mut reserver = store.reserver(&owner)?;
    failpoint::hit("host-local/after-temp-lease");
    let mut allocate = || -> Result<()> {
        for (idx, set) in cfg.range_sets.iter().enumerate() {
            let ip = match wanted[idx] {
                Some(ip) => reserve_requested(&mut reserver, set, ip)?,
                None => reserve_next(&mut reserver, set, idx)?,
            };
            taken.push(ip);
            reserver.store().set_last_reserved(idx, ip)?;
            failpoint::hit("host-local/after-last-reserved");
            let range = set.range_for(ip).ok_or_else(|| Error::internal(format!("{ip} is outside range set {idx}")))?;
            let address = IpNet::new(ip, range.subnet.prefix_len()).map_err(|e| Error::internal(e.to_string()))?;
            ips.push(IpConfig { address, gateway: Some(range.gateway), interface: None });
        }
        Ok(())
    };
    let outcome = allocate();
    if outcome.is_err() {
        for ip in &taken {
            report_rollback(format_args!("giving back {ip}"), reserver.undo(*ip));
        }
    }
    drop(reserver);
    store.commit()?;
    failpoint::hit("host-local/after-index");
    outcome?;
    Ok(CniResult { interfaces: Vec::new(), ips, routes: cfg.routes, dns })
}

/// The address the runtime asked for (`ips` or the `IP` arg), when it is free.
fn reserve_requested(reserver: &mut Reserver, set: &RangeSet, ip: IpAddr) -> Result<IpAddr> {
    if reserver.try_reserve(ip)? {
        return Ok(ip);
    }
    let holder = match reserver.store().read_lease(ip)? {
        Some(Content::Owner(o)) => format!(": leased to container {}", o.id()),
        _ => String::new(),
    };
    Err(Error::internal(format!("requested IP address {ip} is not available in range set {set}{holder}")))
}

/// The next free address of range set `idx` after the last one reserved, as the reference walks it; when the
/// set is full, one freed from an earlier boot.
fn reserve_next(reserver: &mut Reserver, set: &RangeSet, idx: usize) -> Result<IpAddr> {
    let last = reserver.store().last_reserved(idx);
    for (_, ip) in set.candidates(last) {
        if reserver.try_reserve(ip)? {
            return Ok(ip);
        }
    }
    reclaim_earlier_boot(reserver, set, last)?.ok_or_else(|| {
        Error::internal(format!("failed to allocate for range {idx}: no IP addresses available in range set: {set}"))
    })
}

/// A full range set may still hold leases of pods that died with an earlier boot (upstream #252: containerd
/// sends no GC, and an unclean shutdown no DEL). Before failing, those are freed (all of them at once, so the
/// next ADDs need no scan) and the first is taken. A lease is of an earlier boot when its file was written
/// before this boot began; the reference's lease format stays as it is. If the clock was set far back at boot
/// and corrected later, leases written meanwhile look older than the boot: freeing them is only ever done when
/// the alternative is failing every new pod, and each is logged.
fn reclaim_earlier_boot(reserver: &mut Reserver, set: &RangeSet, last: Option<IpAddr>) -> Result<Option<IpAddr>> {
    let Some(boot) = boot_time() else { return Ok(None) };
    let freed = reserver.store().reclaim_written_before(set.candidates(last).map(|(_, ip)| ip), boot)?;
    if freed.is_empty() {
        return Ok(None);
    }
    let holders: Vec<String> = freed
        .iter()
        .take(8)
        .map(|(ip, held)| match held {
            Content::Owner(owner) => format!("{ip} ({})", owner.id()),
            _ => ip.to_string(),
        })
        .collect();
    let more =
        if freed.len() > holders.len() { format!(" and {} more", freed.len() - holders.len()) } else { String::new() };
    cnicore::warn!(
        "range set {set} is full: freed {} leases written before this boot: {}{more}",
        freed.len(),
        holders.join(", ")
    );
    for (ip, _) in freed {
        if reserver.try_reserve(ip)? {
            return Ok(Some(ip));
        }
    }
    Ok(None)
}

pub fn del(ctx: &Context) -> Result<()> {
    let cfg = ctx.load_for_teardown(config::load)?;
    let Some(mut store) = lock_network(&cfg, false)? else { return Ok(()) };
    store.ensure_index()?;
    let (owner, ips) = store.leases_for_release(&ctx.env.container_id, &ctx.env.ifname)?;
    // Release as much as possible; report every failure.
    let mut errors = Errors::new();
    errors.record(store.remove_temp_lease());
    for ip in ips {
        errors.record(store.release(ip, &owner));
    }
    store.commit()?;
    errors.into_result()
}

pub fn check(ctx: &Context) -> Result<()> {
    let cfg = config::load(ctx)?;
    let (id, ifname) = (ctx.env.container_id.as_str(), ctx.env.ifname.as_str());
    let not_found = || {
        Error::internal(format!(
            "host-local: failed to find an address leased to container {id} (interface {ifname}) in network {}",
            cfg.name
        ))
    };
    let Some(mut store) = lock_network(&cfg, false)? else { return Err(not_found()) };
    store.ensure_index()?;
    let (_, leased) = store.leases_for_release(id, ifname)?;
    store.commit()?;
    if leased.is_empty() {
        return Err(not_found());
    }
    // Addresses of the previous result that belong to this network must be leased to this container.
    if let Some(prev) = ctx.prev_result()? {
        for ip in prev.ips.iter().map(|i| i.address.addr()) {
            if cfg.range_sets.iter().any(|s| s.contains(ip)) && !leased.contains(&ip) {
                return Err(Error::internal(format!(
                    "host-local: address {ip} of container {id} (interface {ifname}) has no lease"
                )));
            }
        }
    }
    Ok(())
}

pub fn gc(ctx: &Context) -> Result<()> {
    let cfg = config::load(ctx)?;
    // Without the list (as opposed to an empty list) only garbage is removed, never a lease with an owner.
    let attachments = ctx.gc_attachments()?;
    let has_list = attachments.is_some();
    let valid: HashSet<(String, String)> = attachments.unwrap_or_default().into_iter().collect();
    let valid_ids: HashSet<&str> = valid.iter().map(|(id, _)| id.as_str()).collect();
    let is_valid = |o: &Owner| match o {
        Owner::Attachment { id, ifname } => valid.contains(&(id.clone(), ifname.clone())),
        Owner::Legacy { id } => valid_ids.contains(id.as_str()),
    };

    let Some(mut store) = lock_network(&cfg, false)? else { return Ok(()) };
    let mut kept = Vec::new();
    for entry in store.scan()? {
        let remove = match &entry.lease {
            _ if is_garbage(&entry) => true,
            Some((ip, Content::Owner(owner))) => {
                let keep = !has_list || is_valid(owner);
                if keep {
                    kept.push((*ip, owner.clone()));
                }
                !keep
            }
            Some((_, Content::Unreadable)) => has_list,
            _ => false,
        };
        if remove {
            store.remove_entry(&entry.name)?;
        }
    }
    store.index.rebuild(kept);
    store.touch();
    store.commit()
}

pub fn status(ctx: &Context) -> Result<()> {
    let cfg = config::load(ctx)?;
    let dir = cfg.network_dir();
    let unavailable = |why: String| {
        Error::new(
            codes::NOT_AVAILABLE,
            format!("host-local: data directory {} cannot be written: {why}", dir.display()),
        )
    };
    let mut store =
        lock_network(&cfg, true).map_err(|e| unavailable(e.msg))?.ok_or_else(|| unavailable("missing".into()))?;
    let was_current = store.index.is_current();
    probe_write(store.dir()).map_err(|e| unavailable(e.to_string()))?;
    if was_current {
        store.touch();
        store.commit().map_err(|e| unavailable(e.msg))?;
    }
    for (idx, set) in cfg.range_sets.iter().enumerate() {
        let last = store.last_reserved(idx);
        if !set.candidates(last).any(|(_, ip)| store.is_free(ip)) {
            return Err(Error::new(
                codes::NOT_AVAILABLE,
                format!(
                    "host-local: no free address in range set {idx} ({set}) of network {}: every address is leased",
                    cfg.name
                ),
            ));
        }
    }
    Ok(())
}

/// Creates and removes a file: the only reliable test of writability (root ignores permission bits, not a
/// read-only mount or a full disk).
fn probe_write(dir: &std::path::Path) -> std::io::Result<()> {
    use std::io::Write;
    let path = dir.join(format!("{}status-{}", crate::store::TMP_PREFIX, std::process::id()));
    let _ = std::fs::remove_file(&path);
    let result =
        std::fs::OpenOptions::new().write(true).create_new(true).open(&path).and_then(|mut f| f.write_all(b"probe"));
    let _ = std::fs::remove_file(&path);
    result
}
