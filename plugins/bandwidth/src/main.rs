//! `bandwidth`: shapes a pod's traffic with tbf qdiscs, chained after the plugin that made its veth.
//!
//! - Ingress (into the pod): a tbf at the root of the host veth.
//! - Egress (out of the pod): the host veth's incoming traffic is redirected (u32 match-all + mirred) to
//!   an ifb device named `bwp` + hash of network name and container ID, which has the tbf.
//!
//! Rates and bursts come from the config or `runtimeConfig.bandwidth`, in bits per second and bits; the
//! tbf values are computed exactly as the reference plugin (containernetworking/plugins v1.1.1) does, so
//! either plugin can delete and check what the other made. Everything goes over netlink.
//!
//! Modules: [`config`] (rates and bursts), [`host`] (the pod veth's host end), [`ifb`] (the egress device)
//! and [`shaping`] (the tc objects of one pod).

mod config;
mod host;
mod ifb;
mod shaping;

use std::collections::HashSet;

use cnicore::failpoint;
use cnicore::netlink::{is_not_found, Link, Netlink};
use cnicore::spec::{plugin_main, report_rollback, CniResult, Context, Error, ErrorContext, Interface, Plugin, Result};

use config::Limits;

struct Bandwidth;

fn host_netlink() -> Result<Netlink> {
    Netlink::new().context("opening netlink")
}

/// Installs the shaping of one pod on its host veth; returns the ifb when egress is shaped.
fn apply(nl: &mut Netlink, host: &Link, ctx: &Context, ifb_name: &str, limits: &Limits) -> Result<Option<Link>> {
    if let Some(tbf) = &limits.ingress {
        shaping::install_ingress(nl, host, tbf)?;
        failpoint::hit("bandwidth/after-ingress-tbf");
    }
    let Some(tbf) = &limits.egress else { return Ok(None) };
    let alias = ifb::alias(&ctx.conf.name, &ctx.env.container_id);
    let ifb = ifb::create(nl, ifb_name, host.mtu, alias.as_deref())
        .with_context(|| format!("creating ifb device {ifb_name}"))?;
    failpoint::hit("bandwidth/after-ifb");
    shaping::install_egress(nl, host, &ifb, tbf)?;
    failpoint::hit("bandwidth/after-filter");
    Ok(Some(ifb))
}

/// Removes everything of this pod: filters and qdiscs on the host veth(s), then the ifb.
fn remove(nl: &mut Netlink, hosts: &[Link], ifb_name: &str) -> Result<()> {
    let ifb = nl
        .link_by_name(ifb_name)
        .context("looking up the ifb device")?
        .filter(|link| link.kind.as_deref() == Some("ifb"));
    for host in hosts {
        shaping::remove_from_host(nl, host, ifb_name, ifb.as_ref().map(|l| l.index))
            .with_context(|| format!("removing the shaping of {}", host.name))?;
    }
    if let Some(ifb) = ifb {
        match nl.delete_link(ifb.index) {
            Err(e) if !is_not_found(&e) => return Err(Error::os(format!("deleting ifb device {ifb_name}"), e)),
            _ => {}
        }
    }
    Ok(())
}

impl Plugin for Bandwidth {
    fn add(&self, ctx: &Context) -> Result<CniResult> {
        let limits = config::limits(ctx)?;
        if limits.is_empty() {
            // Nothing to shape: the previous result passes through, as in the reference.
            return Ok(ctx.prev_result()?.unwrap_or_default());
        }
        let mut result = ctx.require_prev_result()?;
        let pod = ctx.open_netns()?;
        let mut nl = host_netlink()?;
        let host = host::find(&mut nl, &pod, &ctx.env.ifname, &result)?;
        let ifb_name = ifb::name(&ctx.conf.name, &ctx.env.container_id);
        match apply(&mut nl, &host, ctx, &ifb_name, &limits) {
            Ok(Some(ifb)) => result.interfaces.push(Interface {
                name: ifb.name,
                mac: ifb.mac.map(|m| cnicore::mac::format(&m)).unwrap_or_default(),
                ..Default::default()
            }),
            Ok(None) => {}
            Err(e) => {
                // Leave nothing half-made behind; the error that matters is the first one.
                report_rollback(
                    format_args!("removing the shaping of {}", host.name),
                    remove(&mut nl, std::slice::from_ref(&host), &ifb_name),
                );
                return Err(e);
            }
        }
        Ok(result)
    }

    fn del(&self, ctx: &Context) -> Result<()> {
        // DEL must succeed whatever is already gone (netns, veth, ifb) and needs no valid limits.
        let ifb_name = ifb::name(&ctx.conf.name, &ctx.env.container_id);
        let mut nl = host_netlink()?;
        let pod = ctx.open_netns_if_exists().ok().flatten();
        let prev = ctx.prev_result().ok().flatten();
        let hosts = host::candidates(&mut nl, pod.as_ref(), &ctx.env.ifname, prev.as_ref());
        remove(&mut nl, &hosts, &ifb_name)
    }

    fn check(&self, ctx: &Context) -> Result<()> {
        let limits = config::limits(ctx)?;
        let prev = ctx.require_prev_result()?;
        let pod = ctx.open_netns()?;
        let mut nl = host_netlink()?;
        let host = host::find(&mut nl, &pod, &ctx.env.ifname, &prev)?;
        if let Some(tbf) = &limits.ingress {
            shaping::check_ingress(&mut nl, &host, tbf)?;
        }
        if let Some(tbf) = &limits.egress {
            let ifb_name = ifb::name(&ctx.conf.name, &ctx.env.container_id);
            shaping::check_egress(&mut nl, &host, &ifb_name, tbf)?;
        }
        Ok(())
    }

    /// Deletes the ifb devices this plugin made for this network's attachments that are not valid any
    /// more (the pods' veths, and with them the qdiscs, went with their netns).
    fn gc(&self, ctx: &Context) -> Result<()> {
        let valid: HashSet<String> = ctx.valid_attachments()?.into_iter().map(|(id, _)| id).collect();
        let mut nl = host_netlink()?;
        let tagged = ifb::tagged(&mut nl).context("listing links")?;
        for device in tagged {
            let stale = device.network == ctx.conf.name && !valid.contains(&device.container_id);
            // Only names we derive ourselves: an alias is easy to set by hand.
            if stale && device.name == ifb::name(&device.network, &device.container_id) {
                nl.delete_link_by_name(&device.name).with_context(|| format!("deleting ifb device {}", device.name))?;
            }
        }
        Ok(())
    }
}

fn main() {
    plugin_main("CNI bandwidth plugin (tbf shaping of a pod's veth)", &Bandwidth)
}
