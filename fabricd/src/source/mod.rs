//! Where the node's subnet and its peers come from: the seam between the store and the data plane.
//!
//! A source is a task that publishes the latest [`Cluster`] on a `tokio::sync::watch` channel; the reconcile
//! loop only ever reads the latest value. While a source cannot reach its store it publishes nothing, so the
//! data plane stays as it was (no route is removed because of a store outage). Sources: [`etcd`] (flannel's
//! layout, leases in a transaction) and [`static_file`] (one node and small labs); the Kubernetes Node's
//! `podCIDR` would be a third, publishing the same value from a watch of Node objects.

pub mod etcd;
pub mod static_file;

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use ipnet::Ipv4Net;

use crate::flannel::{LeaseAttrs, NetworkConfig};

/// What the node must look like, as far as the store says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cluster {
    pub config: NetworkConfig,
    /// This node's subnet.
    pub subnet: Ipv4Net,
    /// The etcd lease holding the subnet (None in static mode).
    pub lease_id: Option<i64>,
    /// Every other node: subnet -> its lease.
    pub peers: BTreeMap<Ipv4Net, LeaseAttrs>,
}

/// What the node tells the store about itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeIdentity {
    pub public_ip: Ipv4Addr,
    /// The MAC of this node's vxlan device.
    pub vtep_mac: [u8; 6],
}

impl NodeIdentity {
    /// The lease value for `config`'s backend.
    pub fn attrs(&self, config: &NetworkConfig) -> LeaseAttrs {
        let vxlan = matches!(config.backend, crate::flannel::BackendKind::Vxlan { .. });
        LeaseAttrs {
            public_ip: self.public_ip,
            backend_type: config.backend.type_name().to_string(),
            vtep_mac: vxlan.then_some(self.vtep_mac),
            vni: vxlan.then_some(config.vni),
        }
    }
}

/// The VTEP MAC a node uses unless its vxlan device already has one: derived from its public address
/// (locally administered, unicast), so a device recreated after being deleted keeps its MAC and peers need
/// no update, and static files need not list MACs.
pub fn derived_vtep_mac(public_ip: Ipv4Addr) -> [u8; 6] {
    let [a, b, c, d] = public_ip.octets();
    [0x0e, 0xfa, a, b, c, d]
}
