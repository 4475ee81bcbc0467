//! `tuning`: sets sysctls of the pod's network namespace and settings of its interface (MAC, MTU, promiscuous
//! and all-multicast mode, transmit queue length), chained after the plugin that made the interface.
//!
//! ADD records what it is about to change in the reference's file (see [`saved`]), then changes it; when a
//! step fails, what was already changed is put back and the file removed. DEL puts back what the file says and
//! removes it, whichever plugin (ours or the reference) wrote it. CHECK compares each configured value with
//! what the namespace has.
//!
//! Modules: [`config`] (the settings from the config, `CNI_ARGS`, `runtimeConfig` and `args.cni`) and
//! [`saved`].

mod config;
mod saved;

use std::collections::BTreeMap;

use cnicore::failpoint;
use cnicore::netlink::{Link, Netlink};
use cnicore::netns::NetNs;
use cnicore::spec::{plugin_main, report_rollback, CniResult, Context, Error, ErrorContext, Errors, Plugin, Result};
use cnicore::sysctl;

use config::Tuning;
use saved::Saved;

struct TuningPlugin;

fn netlink_in(pod: &NetNs) -> Result<Netlink> {
    Netlink::in_netns(pod).context("opening netlink in the pod's network namespace")
}

/// Runs `f` inside the pod's namespace (where /proc/sys/net is the pod's).
fn in_pod<T>(pod: &NetNs, f: impl FnOnce() -> Result<T>) -> Result<T> {
    pod.run(f).context("entering the pod's network namespace")?
}

/// The current value of each configured sysctl; a sysctl that does not exist fails here, before any change.
fn read_sysctls(pod: &NetNs, tuning: &Tuning) -> Result<BTreeMap<String, String>> {
    in_pod(pod, || {
        tuning
            .sysctls
            .iter()
            .map(|s| Ok((s.name.clone(), sysctl::read(&s.name).with_context(|| format!("reading sysctl {}", s.key))?)))
            .collect()
    })
}

/// Changes what `tuning` asks for, in the reference's order: sysctls, MAC, promiscuous mode, MTU,
/// all-multicast mode, transmit queue length.
fn apply(tuning: &Tuning, pod: &NetNs, nl: &mut Netlink, link: Option<&Link>) -> Result<()> {
    in_pod(pod, || {
        for s in &tuning.sysctls {
            sysctl::write(&s.name, &s.value).with_context(|| format!("setting sysctl {} to {:?}", s.key, s.value))?;
        }
        Ok(())
    })?;
    failpoint::hit("tuning/after-sysctls");
    let Some(link) = link else { return Ok(()) };
    let name = &link.name;
    if let Some(mac) = tuning.mac {
        nl.set_mac(link.index, mac).with_context(|| format!("setting the MAC address of {name}"))?;
    }
    if tuning.promisc {
        nl.set_promisc(link.index, true).with_context(|| format!("setting {name} promiscuous"))?;
    }
    if let Some(mtu) = tuning.mtu {
        nl.set_mtu(link.index, mtu).with_context(|| format!("setting the MTU of {name} to {mtu}"))?;
    }
    if let Some(on) = tuning.allmulti {
        nl.set_allmulti(link.index, on).with_context(|| format!("setting all-multicast mode of {name}"))?;
    }
    if let Some(txqlen) = tuning.txqlen {
        nl.set_txqlen(link.index, txqlen).with_context(|| format!("setting the transmit queue length of {name}"))?;
    }
    failpoint::hit("tuning/after-link");
    Ok(())
}

/// Puts back what `saved` recorded, in the reference's order (MTU, MAC, promiscuous, all-multicast, queue
/// length), then the sysctls. Every step is tried; the errors are collected. A sysctl is put back only while it
/// still has the value this plugin wrote (another attachment may have set it since), and one that is gone
/// (its interface was deleted) needs nothing.
fn restore(saved: &Saved, pod: &NetNs, nl: &mut Netlink, link: Option<&Link>) -> Result<()> {
    let mut errors = Errors::new();
    if let Some(link) = link {
        let index = link.index;
        if saved.mtu != 0 {
            errors.record(nl.set_mtu(index, saved.mtu).context("failed to restore MTU"));
        }
        if !saved.mac.is_empty() {
            let mac = cnicore::mac::parse(&saved.mac);
            errors.record(mac.and_then(|mac| nl.set_mac(index, mac).context("failed to restore MAC address")));
        }
        if let Some(on) = saved.promisc {
            errors.record(nl.set_promisc(index, on).context("failed to restore promiscuous mode"));
        }
        if let Some(on) = saved.allmulti {
            errors.record(nl.set_allmulti(index, on).context("failed to restore all-multicast mode"));
        }
        if let Some(txqlen) = saved.txqlen {
            errors.record(nl.set_txqlen(index, txqlen).context("failed to restore transmit queue length"));
        }
    }
    if !saved.sysctl.is_empty() {
        let outcome = in_pod(pod, || {
            for (name, value) in &saved.sysctl {
                match sysctl::read(name) {
                    Ok(now) if same_value(&now, &value.set) => {
                        errors.record(
                            sysctl::write(name, &value.was).with_context(|| format!("failed to restore sysctl {name}")),
                        );
                    }
                    Ok(_) => cnicore::warn!("sysctl {name} changed since ADD set it; left as it is"),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => errors.push(Error::os(format!("reading sysctl {name}"), e)),
                }
            }
            Ok(())
        });
        errors.record(outcome);
    }
    errors.into_result()
}

/// Sysctl values compared as the kernel prints them: fields separated by tabs where the config has spaces.
fn same_value(a: &str, b: &str) -> bool {
    a.split_whitespace().eq(b.split_whitespace())
}

impl Plugin for TuningPlugin {
    fn add(&self, ctx: &Context) -> Result<CniResult> {
        let tuning = Tuning::load(ctx)?;
        let mut result = ctx.require_prev_result()?;
        if tuning.is_empty() {
            return Ok(result);
        }
        let ifname = &ctx.env.ifname;
        let pod = ctx.open_netns()?;
        let mut nl = netlink_in(&pod)?;
        let link = match tuning.touches_link() {
            false => None,
            true => {
                Some(nl.link_by_name(ifname).with_context(|| format!("looking up {ifname}"))?.ok_or_else(|| {
                    Error::internal(format!("failed to get {ifname:?}: no such interface in the pod"))
                })?)
            }
        };
        let originals = read_sysctls(&pod, &tuning)?;
        let before = Saved::before(&tuning, link.as_ref(), &originals);
        let path = saved::path(&tuning.data_dir, &ctx.env.container_id, ifname);
        let earlier = Saved::load(&path).unwrap_or_else(|e| {
            cnicore::warn!("replacing unreadable saved settings: {e}");
            None
        });
        let merged = earlier.clone().map_or_else(|| before.clone(), |e| e.merged_with(&before));
        merged.store(&path)?;
        failpoint::hit("tuning/after-save");

        if let Err(e) = apply(&tuning, &pod, &mut nl, link.as_ref()) {
            report_rollback("restoring what ADD changed", restore(&before, &pod, &mut nl, link.as_ref()));
            let file = match &earlier {
                Some(earlier) => earlier.store(&path),
                None => saved::remove(&path),
            };
            report_rollback("putting back the saved settings", file);
            return Err(e);
        }
        if let Some(mac) = tuning.mac {
            for interface in result.interfaces.iter_mut().filter(|i| &i.name == ifname) {
                interface.mac = cnicore::mac::format(&mac);
            }
        }
        Ok(result)
    }

    /// Puts back what ADD saved. Succeeds whatever is gone (netns, interface, file), and needs nothing from the
    /// config but `dataDir`. When the settings cannot be put back (the interface is gone, or the netns), the
    /// file is removed all the same: nothing could use it any more.
    fn del(&self, ctx: &Context) -> Result<()> {
        let data_dir = ctx.load_for_teardown(config::data_dir)?;
        let path = saved::path(&data_dir, &ctx.env.container_id, &ctx.env.ifname);
        let saved = match Saved::load(&path) {
            Ok(None) => return Ok(()),
            Ok(Some(saved)) => saved,
            Err(e) => {
                cnicore::warn!("discarding unreadable saved settings: {e}");
                return saved::remove(&path);
            }
        };
        if let Some(pod) = ctx.open_netns_if_exists()? {
            let mut nl = netlink_in(&pod)?;
            let link = nl.link_by_name(&ctx.env.ifname).with_context(|| format!("looking up {}", ctx.env.ifname))?;
            if let Err(e) = restore(&saved, &pod, &mut nl, link.as_ref()) {
                // As the reference: a DEL that fails here would only keep the runtime from removing the pod.
                cnicore::warn!("{} not fully restored: {e}", ctx.env.ifname);
            }
        }
        saved::remove(&path)
    }

    fn check(&self, ctx: &Context) -> Result<()> {
        let tuning = Tuning::load(ctx)?;
        ctx.require_prev_result()?;
        let ifname = &ctx.env.ifname;
        let pod = ctx.open_netns()?;
        let now = read_sysctls(&pod, &tuning)?;
        for s in &tuning.sysctls {
            let current = &now[&s.name];
            if !same_value(current, &s.value) {
                return Err(Error::internal(format!(
                    "Error: Tuning configured value of {} is {}, current value is {current}",
                    s.key, s.value
                )));
            }
        }
        let mut nl = netlink_in(&pod)?;
        let link = nl
            .link_by_name(ifname)
            .with_context(|| format!("looking up {ifname}"))?
            .ok_or_else(|| Error::internal(format!("Cannot find container link {ifname}")))?;
        let drift = |what: &str, configured: String, current: String| {
            Err(Error::internal(format!(
                "Error: Tuning configured {what} of {ifname} is {configured}, current value is {current}"
            )))
        };
        let mac_of = |mac: Option<[u8; 6]>| mac.map(|m| cnicore::mac::format(&m)).unwrap_or_default();
        if tuning.mac.is_some() && tuning.mac != link.mac {
            return drift("Ethernet", mac_of(tuning.mac), mac_of(link.mac));
        }
        // Only `promisc: true` is checked: a config without it sets nothing, so it cannot expect "off".
        if tuning.promisc && !link.promisc {
            return drift("promisc", "true".into(), "false".into());
        }
        if let Some(mtu) = tuning.mtu.filter(|&m| m != link.mtu) {
            return drift("MTU", mtu.to_string(), link.mtu.to_string());
        }
        if let Some(on) = tuning.allmulti.filter(|&on| on != link.allmulti) {
            return drift("all-multicast mode", on.to_string(), link.allmulti.to_string());
        }
        if let Some(txqlen) = tuning.txqlen.filter(|&q| q != link.txqlen) {
            return drift("Transmit Queue Length", txqlen.to_string(), link.txqlen.to_string());
        }
        Ok(())
    }
}

fn main() {
    plugin_main("CNI tuning plugin (sysctls and interface settings of a pod)", &TuningPlugin)
}
