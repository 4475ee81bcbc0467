//! portmap: Kubernetes hostPort support as a chained CNI plugin (`"capabilities": {"portMappings": true}`).
//!
//! Forwards host ports (`runtimeConfig.portMappings`) to the container addresses found in `prevResult`, with
//! the iptables backend (the reference plugin's chain layout, one `iptables-restore` per family per call) or
//! the nftables backend (one table, lookups keyed by protocol and port, one `nft` transaction per call).
//! See `iptables.rs` and `nftables.rs` for the layouts.
//!
//! Modules: [`config`] (validated as a whole), the backends [`iptables`] and [`nftables`], and [`localnet`]
//! (`route_localnet` for connections from 127.0.0.1).

mod config;
mod iptables;
mod localnet;
mod nftables;

use std::collections::BTreeSet;
use std::net::IpAddr;

use cnicore::failpoint;
use cnicore::firewall::conntrack::{self, PROTO_UDP};
use cnicore::firewall::{families_of, reference_nft, Backend, Family};
use cnicore::spec::{codes, plugin_main, report_rollback, CniResult, Context, Error, Plugin, Result};
use ipnet::IpNet;

use config::{container_ips, Config, Protocol};

const ABOUT: &str = "CNI portmap plugin (Rust) v0.1.0";

struct PortMap;

impl Plugin for PortMap {
    fn add(&self, ctx: &Context) -> Result<CniResult> {
        let config = Config::load(ctx)?;
        let prev = ctx.require_prev_result()?;
        if config.mappings.is_empty() {
            return Ok(prev);
        }
        let containers = container_ips(&prev, &ctx.env.ifname);
        if containers.is_empty() {
            return Ok(prev);
        }
        if config.snat {
            for container in containers.iter().filter(|c| c.addr().is_ipv4()) {
                localnet::enable(container.addr())?;
                failpoint::hit("portmap/after-localnet");
            }
        }
        if let Err(e) = forward(&config, &containers) {
            // Leave nothing half-applied (e.g. IPv4 rules when IPv6 failed).
            report_rollback("removing the port mappings", unforward(&config, Some(&containers)));
            return Err(e);
        }
        flush_udp_conntrack(&config, &containers);
        failpoint::hit("portmap/after-conntrack");
        Ok(prev)
    }

    fn del(&self, ctx: &Context) -> Result<()> {
        let config = match ctx.load_for_teardown(Config::load) {
            // No firewall binary at all: nothing can have been set up.
            Err(e) if e.code == codes::NOT_AVAILABLE => return Ok(()),
            other => other?,
        };
        if !config.backend.available() {
            return Ok(());
        }
        // Without a usable prevResult, the container's chains are found by name in both families.
        let prev = ctx.prev_result().unwrap_or_else(|e| {
            cnicore::warn!("ignoring prevResult on DEL: {}", e.msg);
            None
        });
        let containers = prev.map(|prev| container_ips(&prev, &ctx.env.ifname));
        let ours = unforward(&config, containers.as_deref().filter(|c| !c.is_empty()));
        // The rules the reference portmap v1.6+ wrote with backend nftables (a node moved to ours).
        let theirs = match config.backend {
            Backend::Nftables => reference_nft::portmap_teardown(&config.container_id),
            Backend::Iptables => Ok(()),
        };
        ours.and(theirs)
    }

    fn check(&self, ctx: &Context) -> Result<()> {
        let config = Config::load(ctx)?;
        let prev = ctx.prev_result()?.ok_or_else(|| Error::config("required prevResult missing"))?;
        if config.mappings.is_empty() {
            return Ok(());
        }
        let containers = container_ips(&prev, &ctx.env.ifname);
        match config.backend {
            Backend::Iptables => containers.iter().try_for_each(|c| iptables::check(&config, c)),
            Backend::Nftables if containers.is_empty() => Ok(()),
            Backend::Nftables => nftables::check(&config, &containers).or_else(|ours| {
                // A pod set up by the reference portmap v1.6+ before the node moved to ours.
                if reference_rules_present(&config, &containers)? {
                    Ok(())
                } else {
                    Err(ours)
                }
            }),
        }
    }

    fn gc(&self, ctx: &Context) -> Result<()> {
        let valid = ctx.valid_attachments()?;
        let valid: BTreeSet<&str> = valid.iter().map(|(id, _)| id.as_str()).collect();
        let network = &ctx.conf.name;
        if Backend::Iptables.available() {
            for family in [Family::V4, Family::V6] {
                iptables::gc(network, &valid, family)?;
            }
        }
        if Backend::Nftables.available() {
            nftables::gc(network, &valid)?;
            reference_nft::portmap_gc(&valid)?;
        }
        Ok(())
    }

    fn status(&self, ctx: &Context) -> Result<()> {
        let config = Config::load(ctx)?;
        if !config.backend.available() {
            return Err(Error::new(codes::NOT_AVAILABLE, format!("the {} backend is not installed", config.backend)));
        }
        Ok(())
    }
}

/// True when the reference portmap's nftables rules (v1.6+) of the container are all there: per address family,
/// a DNAT rule per mapping in `hostports` or `hostip_hostports`, and with snat the hairpin rule and (IPv4) the
/// localhost rule in `masquerading`, all commented with the container ID. (These are the rules their ADD
/// writes; their own CHECK expects other masquerade counts and fails on their IPv6 pods.)
fn reference_rules_present(config: &Config, containers: &[IpNet]) -> Result<bool> {
    for container in containers {
        let family = Family::of_net(container);
        let applicable = config.mappings.iter().filter(|m| m.applies_to(family));
        let (hostip, wildcard): (Vec<_>, Vec<_>) = applicable.partition(|m| m.host_destination().is_some());
        let masquerades = match (config.snat, family) {
            (false, _) => 0,
            (true, Family::V4) => 2,
            (true, Family::V6) => 1,
        };
        if !reference_nft::portmap_has_rules(family, &config.container_id, [wildcard.len(), hostip.len(), masquerades])?
        {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Installs the mappings for the container addresses.
fn forward(config: &Config, containers: &[IpNet]) -> Result<()> {
    match config.backend {
        Backend::Iptables => containers
            .iter()
            .try_for_each(|c| iptables::add(config, c).map(|()| failpoint::hit("portmap/after-iptables"))),
        Backend::Nftables => nftables::add(config, containers).map(|()| failpoint::hit("portmap/after-nftables")),
    }
}

/// Removes the container's mappings. `containers` (from prevResult) name the families to clean; without them
/// both are.
fn unforward(config: &Config, containers: Option<&[IpNet]>) -> Result<()> {
    match config.backend {
        Backend::Iptables => {
            let families = containers.map(families_of).unwrap_or_else(|| vec![Family::V4, Family::V6]);
            for family in families {
                let container = containers.and_then(|cs| cs.iter().find(|c| Family::of_net(c) == family));
                iptables::del(config, family, container)?;
            }
            Ok(())
        }
        Backend::Nftables => nftables::del(config, containers),
    }
}

/// Deletes conntrack entries of the mapped UDP host ports, so that flows tracked before the rules existed do
/// not keep bypassing them. Failures are only logged, as in the reference.
fn flush_udp_conntrack(config: &Config, containers: &[IpNet]) {
    for family in families_of(containers) {
        let ports: Vec<u16> = config
            .mappings
            .iter()
            .filter(|m| m.protocol == Protocol::Udp && m.applies_to(family))
            .map(|m| m.host_port)
            .collect();
        if let Err(e) = conntrack::delete_by_dst_port(family, PROTO_UDP, &ports) {
            let what = containers.iter().map(|c| c.addr()).find(|ip: &IpAddr| Family::of(*ip) == family);
            cnicore::warn!("failed to delete stale UDP conntrack entries for {what:?}: {e}");
        }
    }
}

fn main() {
    plugin_main(ABOUT, &PortMap)
}
