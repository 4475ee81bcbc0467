//! The node's data plane: what it should hold for a [`Cluster`] (the backend's plan per peer), what it holds
//! (read with netlink dumps), and the difference applied in batches through cnicore's netlink layer.
//!
//! Everything here is synchronous (cnicore's netlink is); the agent runs it on a blocking thread. Routes that
//! fabricd makes carry the protocol [`ROUTE_PROTOCOL`], so it only ever removes routes it made; neighbour and
//! FDB entries live on its own vxlan device, wireguard peers on its own wireguard device.

pub mod diff;

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::Arc;
use std::time::Duration;

use cnicore::netlink::{self, Event, IpFamily, Netlink, Route, RT_TABLE_MAIN};
use ipnet::IpNet;

use crate::backend::{self, DeviceContext};
use crate::family::Family;
use crate::log::log;
use crate::path::{PeerPath, Refusal};
use crate::plan;
use crate::source::Cluster;
use crate::underlay::{Underlay, ROUTE_PROTOCOL};
use diff::{Change, DeviceChange, Kept, Step};

/// The result of one reconciliation.
#[derive(Debug, Default)]
pub struct Report {
    /// What was changed (or, in a dry run, would be).
    pub changes: Vec<Change>,
    /// Requests the kernel refused.
    pub errors: Vec<String>,
    /// How each peer is reached, or why it is refused (the plan with the node's routes checked).
    pub paths: BTreeMap<IpNet, PeerPath>,
}

impl Report {
    /// The refused peers and why.
    pub fn refused(&self) -> impl Iterator<Item = (&IpNet, &Refusal)> {
        self.paths.iter().filter_map(|(subnet, path)| match path {
            PeerPath::Refused(refusal) => Some((subnet, refusal)),
            _ => None,
        })
    }
}

/// The tunnel devices of a pass and the peers wanted on them (wireguard).
#[derive(Default)]
struct Tunnel {
    devices: Vec<u32>,
    peers: Vec<(u32, backend::TunnelPeer)>,
}

/// Owns the netlink socket of the node's namespace.
pub struct Dataplane {
    nl: Netlink,
    iface: Vec<String>,
    public_ip: Option<Ipv4Addr>,
    public_ipv6: Option<Ipv6Addr>,
}

impl Dataplane {
    pub fn new(
        iface: Vec<String>,
        public_ip: Option<Ipv4Addr>,
        public_ipv6: Option<Ipv6Addr>,
    ) -> io::Result<Dataplane> {
        Ok(Dataplane { nl: Netlink::new()?, iface, public_ip, public_ipv6 })
    }

    pub fn netlink(&mut self) -> &mut Netlink {
        &mut self.nl
    }

    pub fn underlay(&mut self) -> io::Result<Underlay> {
        Underlay::find(&mut self.nl, &self.iface, self.public_ip, self.public_ipv6)
    }

    /// Makes the node match `cluster` (or, with `dry_run`, only says what differs): the plan, then per family
    /// the backend's device, the wanted objects and their difference with the node's, all applied in one
    /// batch. A family the cluster does not enable keeps no route of fabricd's.
    pub fn reconcile(&mut self, cluster: &Cluster, dry_run: bool) -> io::Result<Report> {
        let underlay = self.underlay()?;
        let mut report = Report { paths: plan::plan(cluster, &underlay), ..Report::default() };
        let mut steps = Vec::new();
        let mut tunnel = Tunnel::default();
        for family in Family::ALL {
            steps.extend(self.family_steps(cluster, family, &underlay, dry_run, &mut report, &mut tunnel)?);
        }
        let (changes, requests): (Vec<Change>, Vec<_>) = steps.into_iter().map(|s| (s.change, s.request)).unzip();
        if !dry_run && !requests.is_empty() {
            self.apply(&changes, requests, &mut report)?;
        }
        report.changes.extend(changes);
        // Peers that are not rtnetlink objects (wireguard's), per device, both families' at once.
        let backend = &*cluster.config.backend;
        for (index, peers) in backend::peers_by_device(&tunnel.devices, tunnel.peers) {
            report.changes.extend(backend.sync_tunnel_peers(index, peers, dry_run)?);
        }
        Ok(report)
    }

    /// One family: its device, its routes checked against the node's, the steps to the wanted objects.
    fn family_steps(
        &mut self,
        cluster: &Cluster,
        family: Family,
        underlay: &Underlay,
        dry_run: bool,
        report: &mut Report,
        tunnel: &mut Tunnel,
    ) -> io::Result<Vec<Step>> {
        let network = cluster.config.family(family);
        let own_subnet = cluster.subnet.get(family);
        let backend = &*cluster.config.backend;
        let device = match (network, own_subnet, underlay.public(family)) {
            (Some(_), Some(subnet), Some(local)) => backend.ensure_device(DeviceContext {
                nl: &mut self.nl,
                family,
                subnet,
                underlay,
                local,
                dry_run,
                changes: &mut report.changes,
            })?,
            _ => None,
        };
        let routes = self.nl.routes(family, RT_TABLE_MAIN)?;
        let mut paths: BTreeMap<IpNet, PeerPath> = BTreeMap::new();
        if let Some(network) = network {
            plan::refuse_route_conflicts(&mut report.paths, network.network, &routes, device);
            paths = report
                .paths
                .iter()
                .filter(|(s, _)| Family::of(s.addr()) == family)
                .map(|(s, p)| (*s, p.clone()))
                .collect();
        }
        let mut wanted = backend::wanted(backend, family, &paths, underlay, device);
        tunnel.devices.extend(device);
        tunnel.peers.append(&mut wanted.tunnel_peers);
        self.steps(family, wanted, routes, device, report)
    }

    /// The changes that make the node's objects the wanted ones: puts of FDB entries, neighbours, then routes;
    /// removals in the reverse order (a route goes before the neighbour it resolves through).
    fn steps(
        &mut self,
        family: Family,
        wanted: backend::Wanted,
        routes: Vec<Route>,
        device: Option<u32>,
        report: &mut Report,
    ) -> io::Result<Vec<Step>> {
        report.changes.extend(wanted.pending);
        let (mut fdb, mut neighbours) = ((Vec::new(), Vec::new()), (Vec::new(), Vec::new()));
        if let Some(index) = device {
            fdb = diff::diff(wanted.fdb, diff::observe_fdb(&mut self.nl, index)?);
            neighbours = diff::diff(wanted.neighbours, diff::observe_neighbours(&mut self.nl, family, index)?);
        }
        let ours = routes.into_iter().filter(|r| r.protocol == Some(ROUTE_PROTOCOL));
        let routes = diff::diff(wanted.routes, ours);
        let mut steps = Vec::new();
        steps.extend(fdb.0);
        steps.extend(neighbours.0);
        steps.extend(routes.0);
        steps.extend(routes.1);
        steps.extend(neighbours.1);
        steps.extend(fdb.1);
        Ok(steps)
    }

    /// Sends the steps in one batch; a removal of something already gone is no error.
    fn apply(
        &mut self,
        changes: &[Change],
        requests: Vec<(netlink::Request, u16)>,
        report: &mut Report,
    ) -> io::Result<()> {
        let outcomes = self.nl.batch(requests)?;
        for (change, outcome) in changes.iter().zip(outcomes) {
            match outcome {
                Ok(()) => {}
                Err(e) if matches!(change, Change::Remove(_)) && netlink::is_not_found(&e) => {}
                Err(e) => report.errors.push(format!("{change}: {e}")),
            }
        }
        Ok(())
    }

    /// Removes everything fabricd made in the data plane: its routes of both families and its tunnel devices
    /// (with their neighbour and FDB entries). `devices`: the device names to remove.
    pub fn cleanup(&mut self, devices: &[String]) -> io::Result<Vec<Change>> {
        let mut removed = Vec::new();
        let mut routes = self.nl.routes(IpFamily::V4, RT_TABLE_MAIN)?;
        routes.extend(self.nl.routes(IpFamily::V6, RT_TABLE_MAIN)?);
        for route in routes {
            if route.protocol == Some(ROUTE_PROTOCOL) {
                match self.nl.del_route(&route) {
                    Ok(()) => removed.push(Change::Remove(route.object())),
                    Err(e) if netlink::is_not_found(&e) => {}
                    Err(e) => return Err(e),
                }
            }
        }
        for name in devices {
            if self.nl.delete_link_by_name(name)? {
                removed.push(Change::Device(DeviceChange::Remove { name: name.clone() }));
            }
        }
        Ok(removed)
    }
}

/// Watches the kernel's notifications on a thread of its own and signals `tx` when something that fabricd
/// maintains may have been removed or changed (a route, neighbour or FDB entry deleted, a link changed or
/// deleted, an address removed, notifications lost), so that drift is repaired within milliseconds.
pub fn watch_events(
    tx: tokio::sync::mpsc::UnboundedSender<()>,
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> io::Result<()> {
    let nl = Netlink::new()?;
    let groups = [
        libc::RTNLGRP_LINK,
        libc::RTNLGRP_IPV4_ROUTE,
        libc::RTNLGRP_IPV6_ROUTE,
        libc::RTNLGRP_NEIGH,
        libc::RTNLGRP_IPV4_IFADDR,
        libc::RTNLGRP_IPV6_IFADDR,
    ];
    let events = nl.events(&groups)?;
    std::thread::Builder::new().name("netlink-events".into()).spawn(move || {
        let interesting: BTreeSet<u16> =
            [libc::RTM_DELROUTE, libc::RTM_DELNEIGH, libc::RTM_DELLINK, libc::RTM_NEWLINK, libc::RTM_DELADDR]
                .into_iter()
                .collect();
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            match events.recv_timeout(Duration::from_secs(1)) {
                Ok(batch) => {
                    let relevant = batch.iter().any(|event| match event {
                        Event::Lost => true,
                        Event::Message(message) => interesting.contains(&message.message_type),
                    });
                    if relevant && tx.send(()).is_err() {
                        return;
                    }
                }
                Err(e) => {
                    log!(error, "netlink events: {e}");
                    std::thread::sleep(Duration::from_secs(1));
                }
            }
        }
    })?;
    Ok(())
}
