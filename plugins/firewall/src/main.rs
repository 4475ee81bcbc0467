//! firewall: a chained plugin that lets forwarded traffic to and from the container's addresses (from
//! `prevResult`) through the node's firewall. With `ingressPolicy: "same-bridge"` it isolates bridges from
//! each other; with `"isolated"` also the containers of one bridge from each other (and turns on
//! br_netfilter's bridge-nf-call sysctls, without which that traffic never reaches the firewall). Backends:
//! iptables (the reference's `CNI-FORWARD` / `CNI-ADMIN` layout), nftables (ours, one table) and firewalld
//! (the container addresses as sources of a zone, over D-Bus). With `"backend": ""` the choice is the
//! reference's: firewalld when it runs on the system bus, else iptables (else nftables where iptables is not
//! installed).

mod config;
mod dbus;
mod firewalld;
mod iptables;
mod nftables;
mod record;

use std::collections::BTreeSet;

use cnicore::firewall::{families_of, Backend, Family};
use cnicore::spec::{codes, plugin_main, report_rollback, CniResult, Context, Error, Errors, Plugin, Result};
use cnicore::sysctl;
use ipnet::IpNet;

use config::{host_addresses, validate_bridge_name, Config, IngressPolicy, Isolation, Requested};
use firewalld::Firewalld;
use record::Record;

const ABOUT: &str = "CNI firewall plugin (Rust) v0.1.0";

/// The backend a call works with.
enum Active {
    Kernel(Backend),
    Firewalld(Firewalld),
}

impl Active {
    fn name(&self) -> &'static str {
        match self {
            Active::Kernel(backend) => backend.as_str(),
            Active::Firewalld(_) => "firewalld",
        }
    }
}

/// The backend of the config: an explicit one, else firewalld when it runs, else the machine's default.
fn resolve(config: &Config) -> Result<Active> {
    match config.requested {
        Requested::Kernel(backend) => Ok(Active::Kernel(backend)),
        Requested::Firewalld => Firewalld::require().map(Active::Firewalld),
        Requested::Auto => match Firewalld::if_running() {
            Some(firewalld) => Ok(Active::Firewalld(firewalld)),
            None => Backend::detect().map(Active::Kernel),
        },
    }
}

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

/// The kernel backend of the isolation rules when firewalld holds the addresses: iptables as in the
/// reference, nftables where iptables is not installed.
fn isolation_backend() -> Result<Backend> {
    Backend::detect()
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
        let mut active = resolve(&config)?;
        let isolated_bridge = isolation.as_ref().filter(|i| i.within_bridge).map(|i| i.bridge.clone());
        // Held until the record is written: a DEL of the bridge's last other isolated attachment waits.
        let _lock = isolated_bridge.as_ref().map(|_| record::isolation_lock(&config)).transpose()?;
        open(&config, &mut active, &ips, isolation.as_ref())?;
        if isolated_bridge.is_some() {
            // Traffic between two ports of one bridge reaches the firewall only through br_netfilter.
            let families = families_of(&ips);
            sysctl::enable_bridge_netfilter(families.contains(&Family::V4), families.contains(&Family::V6));
        }
        let record = Record {
            container_id: config.container_id.clone(),
            ifname: config.ifname.clone(),
            backend: active.name().into(),
            zone: if matches!(active, Active::Firewalld(_)) { config.zone.clone() } else { String::new() },
            ips: ips.clone(),
            isolated_bridge: isolated_bridge.clone().unwrap_or_default(),
        };
        if let Err(e) = record::save(&config, &record) {
            report_rollback("removing the firewall rules just added", close(&config, &mut active, &ips, &[], None));
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
            Ok(mut active) => {
                let here = drop_of.filter(|_| isolated.is_some_and(|r| r.backend == active.name()));
                errors.record(close(&config, &mut active, &ips, &[], here));
                done.push(active.name());
            }
            // firewalld gone: its runtime sources went with it. No firewall binary: nothing was set up.
            Err(e) if e.code == codes::NOT_AVAILABLE => {}
            Err(e) => errors.push(e),
        }
        if let Some(record) = record.as_ref().filter(|r| !done.contains(&r.backend.as_str())) {
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
        match resolve(&config)? {
            Active::Kernel(Backend::Iptables) => {
                for family in families_of(&ips) {
                    iptables::check(
                        &iptables::Plan::new(&config, family, &ips, isolation.as_ref())?,
                        &config.container_id,
                    )?;
                }
                Ok(())
            }
            Active::Kernel(Backend::Nftables) => nftables::check(&config.container_id, &ips, isolation.as_ref()),
            Active::Firewalld(mut firewalld) => {
                firewalld.check(&config.zone, &ips)?;
                check_isolation(&config, &ips, isolation.as_ref())
            }
        }
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
        if Backend::Nftables.available() {
            let valid: BTreeSet<&str> = valid.iter().map(|(id, _)| id.as_str()).collect();
            errors.record(nftables::gc(&config.network, &valid));
        }
        errors.into_result()
    }

    fn status(&self, ctx: &Context) -> Result<()> {
        let config = Config::parse(ctx)?;
        match resolve(&config)? {
            Active::Kernel(backend) if !backend.available() => {
                Err(Error::new(codes::NOT_AVAILABLE, format!("the {backend} backend is not installed")))
            }
            _ => Ok(()),
        }
    }
}

/// Opens the firewall for `ips`; on failure, what was done is undone.
fn open(config: &Config, active: &mut Active, ips: &[IpNet], isolation: Option<&Isolation>) -> Result<()> {
    match active {
        Active::Kernel(Backend::Iptables) => {
            let mut done: Vec<Family> = Vec::new();
            for family in families_of(ips) {
                let outcome = iptables::Plan::new(config, family, ips, isolation).and_then(|plan| iptables::add(&plan));
                if let Err(e) = outcome {
                    for family in done {
                        report_rollback("removing firewall rules", iptables::del(family, ips, None));
                    }
                    return Err(e);
                }
                done.push(family);
            }
            Ok(())
        }
        Active::Kernel(Backend::Nftables) => nftables::add(&config.network, &config.container_id, ips, isolation),
        Active::Firewalld(firewalld) => {
            firewalld.add(&config.zone, ips)?;
            if let Err(e) = isolate(ips, isolation, config) {
                report_rollback("removing the addresses from firewalld", firewalld.del(&config.zone, ips));
                return Err(e);
            }
            Ok(())
        }
    }
}

/// The isolation rules of the firewalld backend, which firewalld does not make (the reference runs iptables).
fn isolate(ips: &[IpNet], isolation: Option<&Isolation>, config: &Config) -> Result<()> {
    if isolation.is_none() {
        return Ok(());
    }
    match isolation_backend()? {
        Backend::Iptables => families_of(ips)
            .into_iter()
            .try_for_each(|family| iptables::add(&iptables::Plan::new(config, family, &[], isolation)?)),
        Backend::Nftables => nftables::add(&config.network, &config.container_id, &[], isolation),
    }
}

fn check_isolation(config: &Config, ips: &[IpNet], isolation: Option<&Isolation>) -> Result<()> {
    if isolation.is_none() {
        return Ok(());
    }
    match isolation_backend()? {
        Backend::Iptables => families_of(ips).into_iter().try_for_each(|family| {
            iptables::check(&iptables::Plan::new(config, family, &[], isolation)?, &config.container_id)
        }),
        Backend::Nftables => nftables::check(&config.container_id, &[], isolation),
    }
}

/// The kernel backend that holds an attachment's isolation rules: its own, or for firewalld the machine's.
fn isolation_backend_of(backend: &str) -> Option<Backend> {
    match backend {
        "iptables" => Some(Backend::Iptables),
        "nftables" => Some(Backend::Nftables),
        _ => isolation_backend().ok(),
    }
}

/// Whether a record other than this attachment's still asks for the `isolated` drop `record` asked for (the same
/// bridge, in the same kernel backend), in any network.
fn drop_wanted_elsewhere(config: &Config, record: &Record) -> bool {
    let kernel = isolation_backend_of(&record.backend);
    record::any_other(config, |other| {
        other.isolated_bridge == record.isolated_bridge && isolation_backend_of(&other.backend) == kernel
    })
}

/// Removes the `isolated` drop a record asked for unless another record still does (GC, and an ADD undone;
/// called with the isolation lock held, after the record is gone or was never written).
fn release_bridge(config: &Config, record: &Record) -> Result<()> {
    if drop_wanted_elsewhere(config, record) {
        return Ok(());
    }
    match isolation_backend_of(&record.backend) {
        Some(kernel) => remove_drop(kernel, &record.isolated_bridge, &record.ips),
        None => Ok(()),
    }
}

/// Removes a bridge's `isolated` drop from `kernel`, in the families of `ips` (those the ADD made it in).
fn remove_drop(kernel: Backend, bridge: &str, ips: &[IpNet]) -> Result<()> {
    match kernel {
        Backend::Iptables => {
            let mut errors = Errors::new();
            for family in families_of(ips) {
                errors.record(iptables::remove_within_bridge(family, bridge));
            }
            errors.into_result()
        }
        Backend::Nftables if Backend::Nftables.available() => nftables::remove_within_bridge(bridge),
        Backend::Nftables => Ok(()),
    }
}

/// Closes the firewall for `ips` except the addresses in `keep`, and with `drop_of` removes that bridge's
/// `isolated` drop in the same transaction. The other isolation rules stay: they are the bridge's, shared by its
/// containers (as in the reference).
fn close(config: &Config, active: &mut Active, ips: &[IpNet], keep: &[IpNet], drop_of: Option<&str>) -> Result<()> {
    let ips: Vec<IpNet> = ips.iter().filter(|ip| !keep.contains(ip)).copied().collect();
    match active {
        Active::Kernel(Backend::Iptables) => {
            let mut errors = Errors::new();
            for family in [Family::V4, Family::V6] {
                errors.record(iptables::del(family, &ips, drop_of));
            }
            errors.into_result()
        }
        Active::Kernel(Backend::Nftables) if !Backend::Nftables.available() => Ok(()),
        Active::Kernel(Backend::Nftables) if ips.is_empty() && !keep.is_empty() => Ok(()),
        Active::Kernel(Backend::Nftables) => nftables::del(&config.network, &config.container_id, &ips, drop_of),
        Active::Firewalld(firewalld) => {
            let mut errors = Errors::new();
            errors.record(firewalld.del(&config.zone, &ips));
            if let Some(bridge) = drop_of {
                // firewalld's isolation rules are the kernel's.
                errors.record(isolation_backend().and_then(|kernel| remove_drop(kernel, bridge, &ips)));
            }
            errors.into_result()
        }
    }
}

/// Closes what a record says an ADD opened, with the record's backend.
fn close_recorded(config: &Config, record: &Record, keep: &[IpNet], drop_of: Option<&str>) -> Result<()> {
    let config = Config {
        container_id: record.container_id.clone(),
        ifname: record.ifname.clone(),
        zone: if record.zone.is_empty() { config.zone.clone() } else { record.zone.clone() },
        ..config.clone()
    };
    let mut active = match record.backend.as_str() {
        "iptables" => Active::Kernel(Backend::Iptables),
        "nftables" => Active::Kernel(Backend::Nftables),
        // firewalld gone: its sources went with it, the kernel's drop did not.
        _ => match Firewalld::if_running() {
            Some(firewalld) => Active::Firewalld(firewalld),
            None => {
                let Some(bridge) = drop_of else { return Ok(()) };
                return isolation_backend().and_then(|kernel| remove_drop(kernel, bridge, &record.ips));
            }
        },
    };
    close(&config, &mut active, &record.ips, keep, drop_of)
}

fn main() {
    plugin_main(ABOUT, &Firewall)
}
