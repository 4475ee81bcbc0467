//! The node's data plane: what it should hold for a [`Cluster`] (the backend's plan per peer), what it holds
//! (read with netlink dumps), and the difference applied in batches through cnicore's netlink layer.
//!
//! Everything here is synchronous (cnicore's netlink is); the agent runs it on a blocking thread. Routes that
//! fabricd makes carry the protocol [`ROUTE_PROTOCOL`], so it only ever removes routes it made; neighbour and
//! FDB entries live on its own vxlan device.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Duration;

use cnicore::netlink::{self, Event, FdbEntry, IpFamily, Neighbour, Netlink, Route, Vxlan, RT_TABLE_MAIN};
use ipnet::{IpNet, Ipv4Net};

use crate::flannel::{BackendKind, NetworkConfig, VXLAN_OVERHEAD};
use crate::source::Cluster;
use cnicore::mac::format as format_mac;

/// `proto 75` in `ip route`: the routes fabricd made (and will remove).
pub const ROUTE_PROTOCOL: u8 = 75;

/// The underlay interface the node's traffic to other nodes leaves by.
#[derive(Debug, Clone)]
pub struct Underlay {
    pub index: u32,
    pub name: String,
    pub mtu: u32,
    pub public_ip: Ipv4Addr,
    /// The IPv4 prefixes on the interface: a peer inside one is on the same L2 segment.
    pub prefixes: Vec<Ipv4Net>,
}

impl Underlay {
    /// Finds the interface: `iface` (a name or one of its addresses), else the one of the default route.
    /// `public_ip` overrides the address announced to peers.
    pub fn find(nl: &mut Netlink, iface: &[String], public_ip: Option<Ipv4Addr>) -> io::Result<Underlay> {
        let links = nl.links()?;
        let addresses = nl.addresses(None)?;
        let v4_of = |index: u32| -> Vec<Ipv4Net> {
            addresses
                .iter()
                .filter(|a| a.index == index)
                .filter_map(|a| match a.addr {
                    IpNet::V4(net) => Some(net),
                    _ => None,
                })
                .collect()
        };
        let mut chosen = None;
        for wanted in iface {
            chosen = match wanted.parse::<IpAddr>() {
                Ok(ip) => addresses.iter().find(|a| a.addr.addr() == ip).map(|a| a.index),
                Err(_) => links.iter().find(|l| &l.name == wanted).map(|l| l.index),
            };
            if chosen.is_some() {
                break;
            }
        }
        if !iface.is_empty() && chosen.is_none() {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("--iface {}: no such interface or address", iface.join(",")),
            ));
        }
        if chosen.is_none() {
            let default = nl.routes(IpFamily::V4, RT_TABLE_MAIN)?.into_iter().find(|r| r.dst.prefix_len() == 0);
            chosen = default.and_then(|r| r.oif);
        }
        let index = chosen.ok_or_else(|| {
            io::Error::new(io::ErrorKind::NotFound, "no --iface given and no default route to choose the interface by")
        })?;
        let link = links.iter().find(|l| l.index == index).expect("listed");
        let prefixes = v4_of(index);
        let public_ip = match public_ip.or_else(|| prefixes.first().map(|p| p.addr())) {
            Some(ip) => ip,
            None => return Err(io::Error::new(io::ErrorKind::NotFound, format!("{} has no IPv4 address", link.name))),
        };
        Ok(Underlay {
            index,
            name: link.name.clone(),
            mtu: link.mtu,
            public_ip,
            prefixes: prefixes.iter().map(|p| p.trunc()).collect(),
        })
    }

    fn same_l2(&self, ip: Ipv4Addr) -> bool {
        self.prefixes.iter().any(|p| p.contains(&ip))
    }
}

/// The MTU of pods' interfaces for `config` over `underlay`.
pub fn pod_mtu(config: &NetworkConfig, underlay: &Underlay) -> u32 {
    match config.backend {
        BackendKind::HostGw => underlay.mtu,
        BackendKind::Vxlan { .. } => underlay.mtu - VXLAN_OVERHEAD,
    }
}

/// How one peer's pods are reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeerPath {
    /// A route via the peer's node address (host-gw, or direct routing).
    Direct { gateway: Ipv4Addr },
    /// Through the vxlan device: route, neighbour and FDB entry.
    Overlay { vtep_mac: [u8; 6], endpoint: Ipv4Addr },
    /// Cannot be reached with this backend.
    Refused(String),
}

/// The backend's decision for each peer.
pub fn plan(cluster: &Cluster, underlay: &Underlay) -> BTreeMap<Ipv4Net, PeerPath> {
    cluster
        .peers
        .iter()
        .map(|(subnet, attrs)| {
            let same_l2 = underlay.same_l2(attrs.public_ip);
            let path = match cluster.config.backend {
                BackendKind::HostGw if same_l2 => PeerPath::Direct { gateway: attrs.public_ip },
                BackendKind::HostGw => PeerPath::Refused(format!(
                    "host-gw cannot reach {subnet}: its node {} is not on this node's L2 segment ({} on {}); use the vxlan backend (with DirectRouting)",
                    attrs.public_ip,
                    underlay.prefixes.iter().map(|p| p.to_string()).collect::<Vec<_>>().join(", "),
                    underlay.name
                )),
                BackendKind::Vxlan { direct_routing: true } if same_l2 => PeerPath::Direct { gateway: attrs.public_ip },
                BackendKind::Vxlan { .. } => match attrs.vtep_mac {
                    Some(vtep_mac) => PeerPath::Overlay { vtep_mac, endpoint: attrs.public_ip },
                    None => PeerPath::Refused(format!(
                        "{subnet}: node {} announces backend {:?} without a VtepMAC",
                        attrs.public_ip, attrs.backend_type
                    )),
                },
            };
            (*subnet, path)
        })
        .collect()
}

/// The result of one reconciliation.
#[derive(Debug, Default)]
pub struct Report {
    /// What was changed (or, in a dry run, would be), one line each.
    pub changes: Vec<String>,
    /// Peers that cannot be reached, and requests the kernel refused.
    pub errors: Vec<String>,
    pub refused_peers: usize,
}

/// Owns the netlink socket of the node's namespace.
pub struct Dataplane {
    nl: Netlink,
    iface: Vec<String>,
    public_ip: Option<Ipv4Addr>,
    vtep_mac: [u8; 6],
}

fn route_key(route: &Route) -> (Option<IpAddr>, Option<u32>, bool) {
    (route.gateway, route.oif, route.onlink)
}

impl Dataplane {
    pub fn new(iface: Vec<String>, public_ip: Option<Ipv4Addr>, vtep_mac: [u8; 6]) -> io::Result<Dataplane> {
        Ok(Dataplane { nl: Netlink::new()?, iface, public_ip, vtep_mac })
    }

    pub fn netlink(&mut self) -> &mut Netlink {
        &mut self.nl
    }

    pub fn underlay(&mut self) -> io::Result<Underlay> {
        Underlay::find(&mut self.nl, &self.iface, self.public_ip)
    }

    /// Makes the node match `cluster` (or, with `dry_run`, only says what differs).
    pub fn reconcile(&mut self, cluster: &Cluster, dry_run: bool) -> io::Result<Report> {
        let underlay = self.underlay()?;
        let paths = plan(cluster, &underlay);
        let mut report = Report::default();
        for path in paths.values() {
            if let PeerPath::Refused(reason) = path {
                report.errors.push(reason.clone());
                report.refused_peers += 1;
            }
        }
        let uses_vxlan = matches!(cluster.config.backend, BackendKind::Vxlan { .. });
        let vxlan_index = if uses_vxlan {
            self.ensure_vxlan(&cluster.config, cluster.subnet, &underlay, dry_run, &mut report)?
        } else {
            None
        };

        let proto = Some(ROUTE_PROTOCOL);
        let mut routes: BTreeMap<IpNet, Route> = BTreeMap::new();
        let mut neighbours: BTreeMap<IpAddr, [u8; 6]> = BTreeMap::new();
        let mut fdb: BTreeMap<[u8; 6], IpAddr> = BTreeMap::new();
        for (subnet, path) in &paths {
            let dst = IpNet::V4(*subnet);
            match path {
                PeerPath::Direct { gateway } => {
                    let route = Route {
                        dst,
                        gateway: Some((*gateway).into()),
                        oif: Some(underlay.index),
                        protocol: proto,
                        table: Some(RT_TABLE_MAIN),
                        ..Route::default()
                    };
                    routes.insert(dst, route);
                }
                PeerPath::Overlay { vtep_mac, endpoint } => {
                    let tunnel = IpAddr::V4(subnet.network());
                    let Some(vxlan_index) = vxlan_index else {
                        report.changes.push(format!(
                            "route {subnet} via {tunnel} dev {} onlink (with its device)",
                            cluster.config.vxlan_device()
                        ));
                        continue;
                    };
                    let route = Route {
                        dst,
                        gateway: Some(tunnel),
                        oif: Some(vxlan_index),
                        onlink: true,
                        protocol: proto,
                        table: Some(RT_TABLE_MAIN),
                        ..Route::default()
                    };
                    routes.insert(dst, route);
                    neighbours.insert(tunnel, *vtep_mac);
                    fdb.insert(*vtep_mac, IpAddr::V4(*endpoint));
                }
                PeerPath::Refused(_) => {}
            }
        }

        let mut adds: Vec<(netlink::Request, u16)> = Vec::new();
        let mut removes: Vec<(netlink::Request, u16)> = Vec::new();
        let mut what_adds = Vec::new();
        let mut what_removes = Vec::new();
        if let Some(index) = vxlan_index {
            let observed: BTreeMap<[u8; 6], FdbEntry> =
                self.nl.fdb(index)?.into_iter().filter(|e| e.dst.is_some()).map(|e| (e.mac, e)).collect();
            for (mac, dst) in &fdb {
                if observed.get(mac).map(|e| e.dst) != Some(Some(*dst)) {
                    let entry = FdbEntry::vxlan(index, *mac, *dst);
                    adds.push((entry.replace_request(), FdbEntry::REPLACE));
                    what_adds.push(format!("fdb {} dst {dst}", format_mac(mac)));
                }
            }
            for (mac, entry) in &observed {
                if !fdb.contains_key(mac) {
                    removes.push((entry.delete_request(), 0));
                    what_removes.push(format!("remove fdb {}", format_mac(mac)));
                }
            }
            let observed: BTreeMap<IpAddr, Neighbour> = self
                .nl
                .neighbours(IpFamily::V4, Some(index))?
                .into_iter()
                .filter(|n| n.state & netlink::neigh::NUD_PERMANENT != 0)
                .map(|n| (n.dst, n))
                .collect();
            for (dst, mac) in &neighbours {
                if observed.get(dst).and_then(|n| n.mac) != Some(*mac) {
                    let neighbour = Neighbour::permanent(index, *dst, *mac);
                    adds.push((neighbour.replace_request(), Neighbour::REPLACE));
                    what_adds.push(format!("neighbour {dst} lladdr {}", format_mac(mac)));
                }
            }
            for (dst, neighbour) in &observed {
                if !neighbours.contains_key(dst) {
                    removes.push((neighbour.delete_request(), 0));
                    what_removes.push(format!("remove neighbour {dst}"));
                }
            }
        }
        let observed: BTreeMap<IpNet, Route> = self
            .nl
            .routes(IpFamily::V4, RT_TABLE_MAIN)?
            .into_iter()
            .filter(|r| r.protocol == proto)
            .map(|r| (r.dst, r))
            .collect();
        for (dst, route) in &routes {
            if observed.get(dst).map(route_key) != Some(route_key(route)) {
                adds.push((route.replace_request(), Route::REPLACE));
                what_adds.push(format!("route {dst} via {}", route.gateway.map(|g| g.to_string()).unwrap_or_default()));
            }
        }
        for (dst, route) in &observed {
            if !routes.contains_key(dst) {
                removes.push((route.delete_request(), 0));
                what_removes.push(format!("remove route {dst}"));
            }
        }
        // Removals of routes first, then neighbours and FDB entries (reverse of the adds).
        removes.reverse();
        what_removes.reverse();
        adds.extend(removes);
        what_adds.extend(what_removes);
        if !dry_run && !adds.is_empty() {
            let outcomes = self.nl.batch(adds)?;
            for (what, outcome) in what_adds.iter().zip(outcomes) {
                match outcome {
                    Ok(()) => {}
                    Err(e) if what.starts_with("remove") && netlink::is_not_found(&e) => {}
                    Err(e) => report.errors.push(format!("{what}: {e}")),
                }
            }
        }
        report.changes.extend(what_adds);
        Ok(report)
    }

    /// Makes the vxlan device right (settings, MTU, MAC, up, the subnet's /32 address); its index. In a dry
    /// run, None when it is missing.
    fn ensure_vxlan(
        &mut self,
        config: &NetworkConfig,
        subnet: Ipv4Net,
        underlay: &Underlay,
        dry_run: bool,
        report: &mut Report,
    ) -> io::Result<Option<u32>> {
        let name = config.vxlan_device();
        let settings = Vxlan {
            vni: config.vni,
            local: Some(underlay.public_ip),
            link: Some(underlay.index),
            port: config.port,
            learning: false,
        };
        let mtu = underlay.mtu - VXLAN_OVERHEAD;
        let existing = self.nl.vxlan_by_name(&name)?;
        let link = match existing {
            Some((link, Some(current))) if current == settings => link,
            other => {
                report.changes.push(match &other {
                    None => format!("create vxlan device {name} (VNI {}, port {}, MTU {mtu})", config.vni, config.port),
                    Some(_) => format!("recreate {name}: its settings differ"),
                });
                if dry_run {
                    return Ok(None);
                }
                if let Some((link, _)) = other {
                    self.nl.delete_link(link.index)?;
                }
                let link = self.nl.create_vxlan(&name, Some(mtu), &settings)?;
                self.nl.set_mac(link.index, self.vtep_mac)?;
                link
            }
        };
        if link.mtu != mtu {
            report.changes.push(format!("{name} MTU {} -> {mtu}", link.mtu));
            if !dry_run {
                self.nl.set_mtu(link.index, mtu)?;
            }
        }
        if link.mac != Some(self.vtep_mac) {
            report.changes.push(format!("{name} MAC -> {}", format_mac(&self.vtep_mac)));
            if !dry_run {
                self.nl.set_mac(link.index, self.vtep_mac)?;
            }
        }
        let address = IpNet::V4(Ipv4Net::new(subnet.network(), 32).expect("valid"));
        let addresses = self.nl.addresses(Some(link.index))?;
        for other in addresses.iter().filter(|a| a.addr.addr().is_ipv4() && a.addr != address) {
            report.changes.push(format!("remove address {} from {name}", other.addr));
            if !dry_run {
                self.nl.del_address(link.index, other.addr)?;
            }
        }
        if !addresses.iter().any(|a| a.addr == address) {
            report.changes.push(format!("address {address} on {name}"));
            if !dry_run {
                self.nl.add_address(link.index, address)?;
            }
        }
        if !link.up {
            report.changes.push(format!("set {name} up"));
            if !dry_run {
                self.nl.set_up(link.index)?;
            }
        }
        Ok(Some(link.index))
    }

    /// Removes everything fabricd made in the data plane: its routes and its vxlan device (with its
    /// neighbour and FDB entries). `devices`: the vxlan device names to remove.
    pub fn cleanup(&mut self, devices: &[String]) -> io::Result<Vec<String>> {
        let mut removed = Vec::new();
        for route in self.nl.routes(IpFamily::V4, RT_TABLE_MAIN)? {
            if route.protocol == Some(ROUTE_PROTOCOL) {
                match self.nl.del_route(&route) {
                    Ok(()) => removed.push(format!("route {}", route.dst)),
                    Err(e) if netlink::is_not_found(&e) => {}
                    Err(e) => return Err(e),
                }
            }
        }
        for name in devices {
            if self.nl.delete_link_by_name(name)? {
                removed.push(format!("device {name}"));
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
    let groups = [libc::RTNLGRP_LINK, libc::RTNLGRP_IPV4_ROUTE, libc::RTNLGRP_NEIGH, libc::RTNLGRP_IPV4_IFADDR];
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
                    crate::log!(error, "netlink events: {e}");
                    std::thread::sleep(Duration::from_secs(1));
                }
            }
        }
    })?;
    Ok(())
}
