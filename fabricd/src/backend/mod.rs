//! The backends: each builds, from the plan, the kernel objects its peers need (and the device it needs).
//! A new backend is a module here and a [`PeerPath`] it plans; the reconcile loop and the diff are shared.
//!
//! - [`host_gw`]: a route to each peer's subnet via its node address (also vxlan's DirectRouting peers);
//! - [`vxlan`]: the `flannel.<VNI>` device, and per peer an onlink route, a permanent neighbour and an FDB entry.

pub mod host_gw;
pub mod vxlan;

use std::collections::BTreeMap;

use cnicore::netlink::{FdbEntry, Neighbour, Route};
use ipnet::IpNet;

use crate::dataplane::diff::{Change, DeviceChange};
use crate::dataplane::Underlay;
use crate::flannel::{BackendKind, Family, NetworkConfig, VXLAN_OVERHEAD};
use crate::plan::PeerPath;

/// What the node should hold for its peers.
#[derive(Debug, Default)]
pub struct Wanted {
    pub routes: Vec<Route>,
    pub neighbours: Vec<Neighbour>,
    pub fdb: Vec<FdbEntry>,
    /// What a dry run cannot build yet (the device is missing): reported as changes.
    pub pending: Vec<Change>,
}

/// The wanted objects for the paths of one family. `device`: the family's vxlan device's index, when the
/// backend has one.
pub fn wanted(
    config: &NetworkConfig,
    family: Family,
    paths: &BTreeMap<IpNet, PeerPath>,
    underlay: &Underlay,
    device: Option<u32>,
) -> Wanted {
    let mut wanted = Wanted::default();
    for (subnet, path) in paths {
        match path {
            PeerPath::Direct { gateway } => wanted.routes.push(host_gw::route(*subnet, *gateway, underlay)),
            PeerPath::Overlay { vtep_mac, endpoint } => match device {
                Some(index) => vxlan::add_peer(&mut wanted, index, *subnet, *vtep_mac, *endpoint),
                None => wanted.pending.push(Change::Device(DeviceChange::PendingRoute {
                    dst: *subnet,
                    via: subnet.network(),
                    name: config.vxlan_device(family),
                })),
            },
            PeerPath::Refused(_) => {}
        }
    }
    wanted
}

/// The MTU of pods' interfaces for `config` over `underlay`: vxlan takes its header off, the larger IPv6 one
/// when a family tunnels over IPv6 (one MTU for the pod's interface, whichever family a packet is).
pub fn pod_mtu(config: &NetworkConfig, underlay: &Underlay) -> u32 {
    match config.backend {
        BackendKind::HostGw => underlay.mtu,
        BackendKind::Vxlan { .. } => {
            underlay.mtu - config.families().map(|f| f.family().vxlan_overhead()).max().unwrap_or(VXLAN_OVERHEAD)
        }
    }
}
