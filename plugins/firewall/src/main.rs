//! firewall: a chained plugin that lets forwarded traffic to and from the container's addresses (from
//! `prevResult`) through the node's firewall. With `ingressPolicy: "same-bridge"` it isolates bridges from
//! each other; with `"isolated"` also the containers of one bridge from each other (and turns on
//! br_netfilter's bridge-nf-call sysctls, without which that traffic never reaches the firewall). Backends:
//! iptables (the reference's `CNI-FORWARD` / `CNI-ADMIN` layout), nftables (ours, one table) and firewalld
//! (the container addresses as sources of a zone, over D-Bus). With `"backend": ""` the choice is the
//! reference's: firewalld when it runs on the system bus, else iptables (else nftables where iptables is not
//! installed).
//!
//! Modules: [`config`]; [`driver`] (the backends behind one interface) and [`kernel`] (the kernel backends by
//! name); the backends [`iptables`], [`nftables`] and [`firewalld`] (over [`dbus`]); [`record`] (what an ADD
//! opened, for GC and DEL without prevResult).

mod config;
mod dbus;
mod driver;
mod firewalld;
mod iptables;
mod kernel;
mod nftables;
mod record;

use std::collections::BTreeSet;

use cnicore::firewall::{families_of, Backend as Kernel, Family};
use cnicore::spec::{codes, plugin_main, report_rollback, CniResult, Context, Error, Errors, Plugin, Result};
use cnicore::sysctl;
use ipnet::IpNet;

use config::{host_addresses, validate_bridge_name, Backend, Config, IngressPolicy, Isolation};
use driver::Driver;
use firewalld::Firewalld;
use record::Record;

const ABOUT: &str = "CNI firewall plugin (Rust) v0.1.0";

/// The isolation of `ingressPolicy` "same-bridge" or "isolated": the bridge is the first interface of
/// prevResult, as in the reference.
fn isolation(config: &Config, prev: &CniResult) -> Result<Option<Isolation>> {
    let within_bridge = match config.ingress_policy {
        IngressPolicy::Open => return Ok(None),
        IngressPolicy::SameBridge => false,
        IngressPolicy::Isolated => true,
    };
    let name = prev.interfaces.first().map(|i| i.name.as_str()).unwrap_or("");
    if name.is_empty() {
        return Err(Error::config(format!(
            "interface needs to be set for ingress policy {:?}, make sure to chain \"firewall\" plugin with \"bridge\"",
            config.ingress_policy.as_str()
        )));
    }
    validate_bridge_name(name)?;
    Ok(Some(Isolation { bridge: name.to_string(), within_bridge }))
}

struct Firewall;

impl Plugin for Firewall {
    fn add(&self, ctx: &Context) -> Result<CniResult> {
        let config = Config::parse(ctx)?;
        let prev = ctx.prev_result()?.ok_or_else(|| Error::config("missing prevResult from earlier plugin"))?;
        let isolation = isolation(&config, &prev)?;
        let ips = host_addresses(prev.ips.iter().map(|ip| ip.address));
        if ips.is_empty() {
            return Ok(prev);
        }
        let mut driver = resolve(&config)?;
        let isolated_bridge = isolation.as_ref().filter(|i| i.within_bridge).map(|i| i.bridge.clone());
        // Held until the record is written: a DEL of the bridge's last other isolated attachment waits.
        let _lock = isolated_bridge.as_ref().map(|_| record::isolation_lock(&config)).transpose()?;
        driver.open(&config, &ips, isolation.as_ref())?;
        if isolated_bridge.is_some() {
            // Traffic between two ports of one bridge reaches the firewall only through br_netfilter.
            let families = families_of(&ips);
            sysctl::enable_bridge_netfilter(families.contains(&Family::V4), families.contains(&Family::V6));
        }
        let record = Record {
            container_id: config.container_id.clone(),
            ifname: config.ifname.clone(),
            backend: driver.backend(),
            zone: if driver.backend() == Backend::Firewalld { config.zone.clone() } else { String::new() },
            ips: ips.clone(),
            isolated_bridge: isolated_bridge.clone().unwrap_or_default(),
        };
        if let Err(e) = record::save(&config, &record) {
            report_rollback("removing the firewall rules just added", close(&config, driver.as_mut(), &ips, &[], None));
            if isolated_bridge.is_some() {
                report_rollback("removing the isolated drop just added", release_bridge(&config, &record));
            }
            return Err(e);
        }
        Ok(prev)
    }

    fn del(&self, ctx: &Context) -> Result<()> {
        let config = ctx.load_for_teardown(Config::parse)?;
        let prev = ctx.prev_result().unwrap_or_else(|e| {
            cnicore::warn!("ignoring prevResult on DEL: {}", e.msg);
            None
        });
        let record = record::load(&config);
        // The bridge whose isolated drop this attachment may have been the last to want. Only a record of ours
        // says so: an attachment without one was made by the reference (or the record was lost), and the
        // drop may serve other such attachments, which nothing counts; it stays, as the reference leaves it.
        let isolated = record.as_ref().filter(|r| !r.isolated_bridge.is_empty());
        let _lock = isolated.and_then(|_| {
            record::isolation_lock(&config)
                .inspect_err(|e| cnicore::warn!("removing the attachment without the isolation lock: {}", e.msg))
                .ok()
        });
        let mut ips = prev.map(|p| host_addresses(p.ips.iter().map(|ip| ip.address))).unwrap_or_default();
        if ips.is_empty() {
            ips = record.as_ref().map(|r| r.ips.clone()).unwrap_or_default();
        }
        // The drop goes with this attachment, in the same transaction, unless another record still asks for it.
        let drop_of = isolated.filter(|r| !drop_wanted_elsewhere(&config, r)).map(|r| r.isolated_bridge.as_str());
        let mut errors = Errors::new();
        // The backend of this config, and the one of the ADD when it was another (a config changed meanwhile).
        let mut done = Vec::new();
        match resolve(&config) {
            Ok(mut driver) => {
                let here = drop_of.filter(|_| isolated.is_some_and(|r| r.backend == driver.backend()));
                errors.record(close(&config, driver.as_mut(), &ips, &[], here));
                done.push(driver.backend());
            }
            // firewalld gone: its runtime sources went with it. No firewall binary: nothing was set up.
            Err(e) if e.code == codes::NOT_AVAILABLE => {}
            Err(e) => errors.push(e),
        }
        if let Some(record) = record.as_ref().filter(|r| !done.contains(&r.backend)) {
            errors.record(close_recorded(&config, record, &[], drop_of));
        }
        if errors.is_empty() {
            errors.record(record::remove(&config));
        }
        errors.into_result()
    }

    fn check(&self, ctx: &Context) -> Result<()> {
        let config = Config::parse(ctx)?;
        let prev = ctx.prev_result()?.ok_or_else(|| Error::config("missing prevResult from earlier plugin"))?;
        let isolation = isolation(&config, &prev)?;
        let ips = host_addresses(prev.ips.iter().map(|ip| ip.address));
        if ips.is_empty() {
            return Ok(());
        }
        resolve(&config)?.check(&config, &ips, isolation.as_ref())
    }

    fn gc(&self, ctx: &Context) -> Result<()> {
        let config = Config::parse(ctx)?;
        let valid = ctx.valid_attachments()?;
        let records = record::list(&config);
        let (stale, kept): (Vec<_>, Vec<_>) = records
            .into_iter()
            .partition(|(_, r)| !valid.iter().any(|(id, ifname)| *id == r.container_id && *ifname == r.ifname));
        // An address a valid attachment holds now keeps its rules (the reference's rules name no owner).
        let in_use: Vec<IpNet> = kept.iter().flat_map(|(_, r)| r.ips.iter().copied()).collect();
        let mut errors = Errors::new();
        let has_isolated = stale.iter().any(|(_, r)| !r.isolated_bridge.is_empty());
        let _lock = has_isolated.then(|| record::isolation_lock(&config)).transpose()?;
        let mut released = Vec::new();
        for (path, record) in stale {
            if errors.record(close_recorded(&config, &record, &in_use, None)).is_some()
                && errors.record(record::remove_listed(path)).is_some()
                && !record.isolated_bridge.is_empty()
            {
                released.push(record);
            }
        }
        // After every stale record is gone, so that they do not keep each other's bridge isolated.
        for record in released {
            errors.record(release_bridge(&config, &record));
        }
        // The nftables backend tags its elements with their owner: those of containers no longer valid go, with or
        // without a record.
        let valid: BTreeSet<&str> = valid.iter().map(|(id, _)| id.as_str()).collect();
        errors.record(kernel::driver(Kernel::Nftables).gc(&config.network, &valid));
        errors.into_result()
    }

    fn status(&self, ctx: &Context) -> Result<()> {
        let config = Config::parse(ctx)?;
        resolve(&config)?.status()
    }
}

/// Whether a record other than this attachment's still asks for the `isolated` drop `record` asked for (the same
/// bridge, in the same kernel backend), in any network.
fn drop_wanted_elsewhere(config: &Config, record: &Record) -> bool {
    let kernel = record.backend.isolation_kernel().ok();
    record::any_other(config, |other| {
        other.isolated_bridge == record.isolated_bridge && other.backend.isolation_kernel().ok() == kernel
    })
}

/// Removes the `isolated` drop a record asked for unless another record still does (GC, and an ADD undone;
/// called with the isolation lock held, after the record is gone or was never written).
fn release_bridge(config: &Config, record: &Record) -> Result<()> {
    if drop_wanted_elsewhere(config, record) {
        return Ok(());
    }
    match record.backend.isolation_kernel() {
        Ok(kernel) => kernel::driver(kernel).remove_drop(&record.isolated_bridge, &record.ips),
        Err(_) => Ok(()),
    }
}

/// Closes the firewall for `ips` except the addresses in `keep` (see [`Driver::close`]).
fn close(config: &Config, driver: &mut dyn Driver, ips: &[IpNet], keep: &[IpNet], drop_of: Option<&str>) -> Result<()> {
    let ips: Vec<IpNet> = ips.iter().filter(|ip| !keep.contains(ip)).copied().collect();
    // Every address kept: nothing to close (no address at all would make a driver look for the attachment's).
    if ips.is_empty() && !keep.is_empty() {
        return Ok(());
    }
    driver.close(config, &ips, drop_of)
}

/// Closes what a record says an ADD opened, with the record's backend.
fn close_recorded(config: &Config, record: &Record, keep: &[IpNet], drop_of: Option<&str>) -> Result<()> {
    let config = Config {
        container_id: record.container_id.clone(),
        ifname: record.ifname.clone(),
        zone: if record.zone.is_empty() { config.zone.clone() } else { record.zone.clone() },
        ..config.clone()
    };
    let mut driver: Box<dyn Driver> = match record.backend {
        Backend::Iptables => kernel::driver(Kernel::Iptables),
        Backend::Nftables => kernel::driver(Kernel::Nftables),
        Backend::Firewalld => match Firewalld::if_running() {
            Some(firewalld) => Box::new(firewalld),
            None => return drop_of.map_or(Ok(()), |bridge| firewalld::remove_drop(bridge, &record.ips)),
        },
    };
    close(&config, driver.as_mut(), &record.ips, keep, drop_of)
}

/// The driver of the config's backend: an explicit one (firewalld must be running), else firewalld when it
/// runs, else the machine's default kernel backend.
fn resolve(config: &Config) -> Result<Box<dyn Driver>> {
    match config.backend {
        Some(Backend::Firewalld) => Ok(Box::new(Firewalld::require()?)),
        Some(Backend::Iptables) => Ok(kernel::driver(Kernel::Iptables)),
        Some(Backend::Nftables) => Ok(kernel::driver(Kernel::Nftables)),
        None => match Firewalld::if_running() {
            Some(firewalld) => Ok(Box::new(firewalld)),
            None => Kernel::detect().map(|k| kernel::driver(k) as Box<dyn Driver>),
        },
    }
}

fn main() {
    plugin_main(ABOUT, &Firewall)
}
