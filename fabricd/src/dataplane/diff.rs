//! One generic difference between what the node should hold and what it holds, for every kind of kernel
//! object fabricd keeps (routes, neighbours, FDB entries), and the typed changes it reports.

use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::net::{IpAddr, SocketAddr};

use cnicore::mac::format as format_mac;
use cnicore::netlink::{self, FdbEntry, IpFamily, Neighbour, Netlink, Request, Route};
use ipnet::IpNet;

use crate::path::key_text;

/// A kernel object as the changes name it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Object {
    Route {
        dst: IpNet,
        via: Option<IpAddr>,
    },
    Neighbour {
        dst: IpAddr,
        mac: Option<[u8; 6]>,
    },
    Fdb {
        mac: [u8; 6],
        dst: Option<IpAddr>,
    },
    /// A wireguard peer (its public key) and where it is reached.
    TunnelPeer {
        key: [u8; 32],
        endpoint: Option<SocketAddr>,
    },
}

/// A change of a backend's tunnel device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceChange {
    Create {
        name: String,
        /// The link kind (vxlan, ipip, wireguard) and its settings as the log shows them.
        kind: &'static str,
        settings: String,
        mtu: u32,
    },
    /// Its settings differ: deleted and created again.
    Recreate {
        name: String,
    },
    Mtu {
        name: String,
        from: u32,
        to: u32,
    },
    Mac {
        name: String,
        mac: [u8; 6],
    },
    Address {
        name: String,
        address: IpNet,
    },
    RemoveAddress {
        name: String,
        address: IpNet,
    },
    Up {
        name: String,
    },
    /// Settings that are not link attributes (wireguard's private key and port: `what` names them, never
    /// their value).
    Configure {
        name: String,
        what: &'static str,
    },
    Remove {
        name: String,
    },
    /// A dry run without the device: the route that would go on it once made.
    PendingRoute {
        dst: IpNet,
        via: IpAddr,
        name: String,
    },
}

/// One change made (or, in a dry run, that would be).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// Added, or replaced because it differed.
    Put(Object),
    Remove(Object),
    Device(DeviceChange),
}

impl fmt::Display for Object {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Object::Route { dst, via: Some(via) } => write!(f, "route {dst} via {via}"),
            Object::Route { dst, via: None } => write!(f, "route {dst}"),
            Object::Neighbour { dst, mac: Some(mac) } => write!(f, "neighbour {dst} lladdr {}", format_mac(mac)),
            Object::Neighbour { dst, mac: None } => write!(f, "neighbour {dst}"),
            Object::Fdb { mac, dst: Some(dst) } => write!(f, "fdb {} dst {dst}", format_mac(mac)),
            Object::Fdb { mac, dst: None } => write!(f, "fdb {}", format_mac(mac)),
            Object::TunnelPeer { key, endpoint: Some(endpoint) } => {
                write!(f, "wireguard peer {} endpoint {endpoint}", key_text(key))
            }
            Object::TunnelPeer { key, endpoint: None } => write!(f, "wireguard peer {}", key_text(key)),
        }
    }
}

impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Change::Put(object) => write!(f, "{object}"),
            Change::Remove(object) => write!(f, "remove {object}"),
            Change::Device(change) => match change {
                DeviceChange::Create { name, kind, settings, mtu } if settings.is_empty() => {
                    write!(f, "create {kind} device {name} (MTU {mtu})")
                }
                DeviceChange::Create { name, kind, settings, mtu } => {
                    write!(f, "create {kind} device {name} ({settings}, MTU {mtu})")
                }
                DeviceChange::Recreate { name } => write!(f, "recreate {name}: its settings differ"),
                DeviceChange::Mtu { name, from, to } => write!(f, "{name} MTU {from} -> {to}"),
                DeviceChange::Mac { name, mac } => write!(f, "{name} MAC -> {}", format_mac(mac)),
                DeviceChange::Address { name, address } => write!(f, "address {address} on {name}"),
                DeviceChange::RemoveAddress { name, address } => write!(f, "remove address {address} from {name}"),
                DeviceChange::Up { name } => write!(f, "set {name} up"),
                DeviceChange::Configure { name, what } => write!(f, "set the {what} of {name}"),
                DeviceChange::Remove { name } => write!(f, "remove device {name}"),
                DeviceChange::PendingRoute { dst, via, name } => {
                    write!(f, "route {dst} via {via} dev {name} onlink (with its device)")
                }
            },
        }
    }
}

/// A kind of kernel object fabricd keeps in sync.
pub trait Kept: Sized {
    type Key: Ord + Clone;
    fn key(&self) -> Self::Key;
    /// True when `observed` is this object as the kernel holds it (no change needed).
    fn is_same(&self, observed: &Self) -> bool;
    fn replace(&self) -> (Request, u16);
    fn delete(&self) -> (Request, u16);
    fn object(&self) -> Object;
}

impl Kept for Route {
    type Key = IpNet;
    fn key(&self) -> IpNet {
        self.dst
    }
    fn is_same(&self, observed: &Route) -> bool {
        (self.gateway, self.oif, self.onlink) == (observed.gateway, observed.oif, observed.onlink)
    }
    fn replace(&self) -> (Request, u16) {
        (self.replace_request(), Route::REPLACE)
    }
    fn delete(&self) -> (Request, u16) {
        (self.delete_request(), 0)
    }
    fn object(&self) -> Object {
        Object::Route { dst: self.dst, via: self.gateway }
    }
}

impl Kept for Neighbour {
    type Key = IpAddr;
    fn key(&self) -> IpAddr {
        self.dst
    }
    fn is_same(&self, observed: &Neighbour) -> bool {
        self.mac == observed.mac
    }
    fn replace(&self) -> (Request, u16) {
        (self.replace_request(), Neighbour::REPLACE)
    }
    fn delete(&self) -> (Request, u16) {
        (self.delete_request(), 0)
    }
    fn object(&self) -> Object {
        Object::Neighbour { dst: self.dst, mac: self.mac }
    }
}

impl Kept for FdbEntry {
    type Key = [u8; 6];
    fn key(&self) -> [u8; 6] {
        self.mac
    }
    fn is_same(&self, observed: &FdbEntry) -> bool {
        self.dst == observed.dst
    }
    fn replace(&self) -> (Request, u16) {
        (self.replace_request(), FdbEntry::REPLACE)
    }
    fn delete(&self) -> (Request, u16) {
        (self.delete_request(), 0)
    }
    fn object(&self) -> Object {
        Object::Fdb { mac: self.mac, dst: self.dst }
    }
}

/// The permanent neighbours of `device`, the ones fabricd makes.
pub fn observe_neighbours(nl: &mut Netlink, family: IpFamily, device: u32) -> io::Result<Vec<Neighbour>> {
    Ok(nl
        .neighbours(family, Some(device))?
        .into_iter()
        .filter(|n| n.state & netlink::neigh::NUD_PERMANENT != 0)
        .collect())
}

/// The FDB entries of `device` that name a remote endpoint (not the device's own address).
pub fn observe_fdb(nl: &mut Netlink, device: u32) -> io::Result<Vec<FdbEntry>> {
    Ok(nl.fdb(device)?.into_iter().filter(|e| e.dst.is_some()).collect())
}

/// A change and the request that makes it.
pub struct Step {
    pub change: Change,
    pub request: (Request, u16),
}

/// What to put (absent or different) and what to remove (observed, not wanted) so that `observed` becomes
/// `wanted`.
pub fn diff<T: Kept>(
    wanted: impl IntoIterator<Item = T>,
    observed: impl IntoIterator<Item = T>,
) -> (Vec<Step>, Vec<Step>) {
    let wanted: BTreeMap<T::Key, T> = wanted.into_iter().map(|o| (o.key(), o)).collect();
    let observed: BTreeMap<T::Key, T> = observed.into_iter().map(|o| (o.key(), o)).collect();
    let puts = wanted
        .iter()
        .filter(|(key, object)| !observed.get(key).is_some_and(|seen| object.is_same(seen)))
        .map(|(_, object)| Step { change: Change::Put(object.object()), request: object.replace() })
        .collect();
    let removes = observed
        .iter()
        .filter(|(key, _)| !wanted.contains_key(key))
        .map(|(_, object)| Step { change: Change::Remove(object.object()), request: object.delete() })
        .collect();
    (puts, removes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(dst: &str, gateway: &str) -> Route {
        Route { dst: dst.parse().unwrap(), gateway: Some(gateway.parse().unwrap()), oif: Some(2), ..Route::default() }
    }

    #[test]
    fn the_diff_puts_what_is_missing_or_different_and_removes_what_is_not_wanted() {
        let wanted = vec![route("10.244.2.0/24", "192.168.50.11"), route("10.244.3.0/24", "192.168.50.12")];
        let observed = vec![route("10.244.3.0/24", "192.168.50.99"), route("10.244.4.0/24", "192.168.50.13")];
        let (puts, removes) = diff(wanted.clone(), observed);
        let text = |steps: &[Step]| steps.iter().map(|s| s.change.to_string()).collect::<Vec<_>>();
        assert_eq!(text(&puts), ["route 10.244.2.0/24 via 192.168.50.11", "route 10.244.3.0/24 via 192.168.50.12"]);
        assert_eq!(text(&removes), ["remove route 10.244.4.0/24 via 192.168.50.13"]);
        let (puts, removes) = diff(wanted.clone(), wanted);
        assert!(puts.is_empty() && removes.is_empty(), "in sync: nothing to do");
        let mac = [0x0e, 0xfa, 192, 168, 50, 11];
        let (puts, _) = diff(vec![FdbEntry::vxlan(5, mac, "192.168.50.11".parse().unwrap())], vec![]);
        assert_eq!(puts[0].change, Change::Put(Object::Fdb { mac, dst: Some("192.168.50.11".parse().unwrap()) }));
        assert_eq!(puts[0].change.to_string(), "fdb 0e:fa:c0:a8:32:0b dst 192.168.50.11");
    }
}
