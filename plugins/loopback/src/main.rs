//! `loopback`: brings the loopback interface up in the pod's network namespace (Kubernetes requires it).

use cnicore::netlink::Netlink;
use cnicore::spec::{plugin_main, CniResult, Context, Error, ErrorContext, Interface, IpConfig, Plugin, Result};

struct Loopback;

/// The interface this plugin manages. `CNI_IFNAME` is ignored, as the reference plugin does: runtimes pass `lo`,
/// but cnitool passes its default `eth0`, and only `lo` is ever meant.
const LOOPBACK: &str = "lo";

/// The pod's `lo`, checked to be a loopback device.
fn loopback_link(nl: &mut Netlink) -> Result<cnicore::netlink::Link> {
    let link = nl.link_by_name(LOOPBACK).context("looking up the loopback link")?;
    let link = link.ok_or_else(|| Error::internal(format!("no interface {LOOPBACK:?} in the pod netns")))?;
    if !link.loopback {
        return Err(Error::internal(format!("interface {LOOPBACK:?} is not a loopback device")));
    }
    Ok(link)
}

impl Plugin for Loopback {
    fn add(&self, ctx: &Context) -> Result<CniResult> {
        // Parsed first, so that a bad prevResult changes nothing.
        let prev = ctx.prev_result()?;
        let netns = ctx.open_netns()?;
        let mut nl = Netlink::in_netns(&netns).context("opening netlink in the pod netns")?;
        let link = loopback_link(&mut nl)?;
        // Every address on `lo` must be a loopback one (127.0.0.0/8, ::1), as the reference checks since v1.1.
        // Checked before the link is set up, so that a refused ADD changes nothing.
        let addrs = nl.addresses(Some(link.index)).context("listing loopback addresses")?;
        if let Some(bad) = addrs.iter().find(|a| !a.addr.addr().is_loopback()) {
            return Err(Error::internal(format!(
                "loopback interface found with non-loopback address {:?}",
                bad.addr.addr().to_string()
            )));
        }
        nl.set_up(link.index).context("setting the loopback link up")?;
        // A previous plugin's result is passed through unchanged, as the reference does.
        if let Some(prev) = prev {
            return Ok(prev);
        }
        // The first address of each family: 127.0.0.1/8, and ::1/128 where IPv6 is enabled (the kernel adds ::1
        // when `lo` comes up, so the addresses are listed again).
        let addrs = nl.addresses(Some(link.index)).context("listing loopback addresses")?;
        let first = |v4: bool| addrs.iter().find(|a| a.addr.addr().is_ipv4() == v4);
        let ips = [first(true), first(false)]
            .into_iter()
            .flatten()
            .map(|a| IpConfig { address: a.addr, gateway: None, interface: Some(0) })
            .collect();
        Ok(CniResult {
            interfaces: vec![Interface {
                name: LOOPBACK.into(),
                mac: "00:00:00:00:00:00".into(),
                sandbox: netns.path().display().to_string(),
                ..Default::default()
            }],
            ips,
            ..Default::default()
        })
    }

    fn del(&self, ctx: &Context) -> Result<()> {
        // The pod may be gone already: nothing to undo then.
        let Some(netns) = ctx.open_netns_if_exists()? else { return Ok(()) };
        let mut nl = Netlink::in_netns(&netns).context("opening netlink in the pod netns")?;
        match nl.link_by_name(LOOPBACK).context("looking up the loopback link")? {
            Some(link) if link.loopback => nl.set_down(link.index).context("setting the loopback link down"),
            _ => Ok(()),
        }
    }

    fn check(&self, ctx: &Context) -> Result<()> {
        let netns = ctx.open_netns()?;
        let mut nl = Netlink::in_netns(&netns).context("opening netlink in the pod netns")?;
        let link = loopback_link(&mut nl)?;
        if !link.up {
            return Err(Error::internal("loopback interface is down"));
        }
        Ok(())
    }
}

fn main() {
    plugin_main(concat!("CNI loopback plugin (cnicore) v", env!("CARGO_PKG_VERSION")), &Loopback)
}
