//! The plan: for each peer's lease, whether it may be used and how its pods are reached. Pure: it reads the
//! cluster, the underlay and the routes found on the node, and touches nothing.
//!
//! The store is not trusted: any node, or a typo, can write a lease, and one bad lease must not cut a node
//! off or take over another node's traffic. A lease is used only if its subnet lies inside the cluster's
//! Network with the configured length; its public address is unicast, not loopback, not this node's and not
//! another lease's; its VtepMAC (vxlan) is unicast and not this node's or another lease's; and its route would
//! neither replace nor shadow a route that fabricd did not make. Of two leases claiming one address or MAC,
//! the older keeps it.

use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr};

use cnicore::netlink::Route;
use ipnet::{IpNet, Ipv4Net};

use crate::dataplane::{Underlay, ROUTE_PROTOCOL};
use crate::flannel::BackendKind;
use crate::source::{Cluster, Peer};

/// How one peer's pods are reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeerPath {
    /// A route via the peer's node address (host-gw, or direct routing).
    Direct { gateway: Ipv4Addr },
    /// Through the vxlan device: route, neighbour and FDB entry.
    Overlay { vtep_mac: [u8; 6], endpoint: Ipv4Addr },
    /// Not used: the lease is not valid, or the backend cannot reach it.
    Refused(Refusal),
}

/// Why a lease is not used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The subnet is not inside the cluster's Network.
    OutsideNetwork { network: Ipv4Net },
    /// The subnet's length is not the configured SubnetLen.
    WrongLength { wanted: u8 },
    /// The public address is not a unicast address of another host.
    BadPublicIp { public_ip: Ipv4Addr, why: &'static str },
    /// The public address is this node's.
    OwnPublicIp { public_ip: Ipv4Addr },
    /// An older lease has this public address.
    PublicIpTaken { public_ip: Ipv4Addr, holder: Ipv4Net },
    /// The VTEP MAC is multicast or zero.
    BadVtepMac { vtep_mac: [u8; 6] },
    /// The VTEP MAC is this node's, or an older lease's.
    VtepMacTaken { vtep_mac: [u8; 6], holder: Option<Ipv4Net> },
    /// vxlan: the lease has no VTEP MAC.
    NoVtepMac { public_ip: Ipv4Addr, backend_type: String },
    /// host-gw: the peer's node is not on this node's L2 segment.
    BeyondL2 { public_ip: Ipv4Addr, prefixes: String, underlay: String },
    /// Its route would replace or shadow a route fabricd did not make.
    RouteConflict { route: String },
}

impl Refusal {
    /// True for refusals of the lease itself (not of the backend's reach).
    pub fn is_invalid_lease(&self) -> bool {
        !matches!(self, Refusal::BeyondL2 { .. })
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mac = cnicore::mac::format;
        match self {
            Refusal::OutsideNetwork { network } => write!(f, "its subnet is not inside the Network {network}"),
            Refusal::WrongLength { wanted } => write!(f, "its subnet is not a /{wanted} (SubnetLen)"),
            Refusal::BadPublicIp { public_ip, why } => write!(f, "its public address {public_ip} is {why}"),
            Refusal::OwnPublicIp { public_ip } => write!(f, "its public address {public_ip} is this node's"),
            Refusal::PublicIpTaken { public_ip, holder } => {
                write!(f, "its public address {public_ip} is already that of the lease of {holder}")
            }
            Refusal::BadVtepMac { vtep_mac } => write!(f, "its VtepMAC {} is not a unicast address", mac(vtep_mac)),
            Refusal::VtepMacTaken { vtep_mac, holder: None } => {
                write!(f, "its VtepMAC {} is this node's", mac(vtep_mac))
            }
            Refusal::VtepMacTaken { vtep_mac, holder: Some(holder) } => {
                write!(f, "its VtepMAC {} is already that of the lease of {holder}", mac(vtep_mac))
            }
            Refusal::NoVtepMac { public_ip, backend_type } => {
                write!(f, "node {public_ip} announces backend {backend_type:?} without a VtepMAC")
            }
            Refusal::BeyondL2 { public_ip, prefixes, underlay } => write!(
                f,
                "host-gw cannot reach it: its node {public_ip} is not on this node's L2 segment ({prefixes} on \
                 {underlay}); use the vxlan backend (with DirectRouting)"
            ),
            Refusal::RouteConflict { route } => {
                write!(f, "its route would replace or shadow a route fabricd did not make ({route})")
            }
        }
    }
}

/// Why `ip` cannot be a peer's public address, if it cannot.
fn not_unicast(ip: Ipv4Addr) -> Option<&'static str> {
    if ip.is_unspecified() || ip.octets()[0] == 0 {
        Some("unspecified")
    } else if ip.is_loopback() {
        Some("a loopback address")
    } else if ip.is_multicast() {
        Some("a multicast address")
    } else if ip.is_broadcast() || ip.octets()[0] >= 240 {
        Some("a broadcast or reserved address")
    } else {
        None
    }
}

fn is_unicast_mac(mac: &[u8; 6]) -> bool {
    mac[0] & 1 == 0 && *mac != [0; 6]
}

/// The backend's decision for each peer. `own_vtep_mac`: this node's, which no peer may claim.
pub fn plan(cluster: &Cluster, underlay: &Underlay, own_vtep_mac: [u8; 6]) -> BTreeMap<Ipv4Net, PeerPath> {
    let config = &cluster.config;
    let vxlan = matches!(config.backend, BackendKind::Vxlan { .. });
    let mut paths: BTreeMap<Ipv4Net, PeerPath> = BTreeMap::new();
    // Checks of the lease alone.
    for (subnet, peer) in &cluster.peers {
        let public_ip = peer.attrs.public_ip;
        let refusal = if !config.network.contains(subnet) {
            Some(Refusal::OutsideNetwork { network: config.network })
        } else if subnet.prefix_len() != config.subnet_len {
            Some(Refusal::WrongLength { wanted: config.subnet_len })
        } else if let Some(why) = not_unicast(public_ip) {
            Some(Refusal::BadPublicIp { public_ip, why })
        } else if public_ip == underlay.public_ip {
            Some(Refusal::OwnPublicIp { public_ip })
        } else if vxlan && peer.attrs.vtep_mac.is_some_and(|m| !is_unicast_mac(&m)) {
            Some(Refusal::BadVtepMac { vtep_mac: peer.attrs.vtep_mac.expect("checked") })
        } else if vxlan && peer.attrs.vtep_mac == Some(own_vtep_mac) {
            Some(Refusal::VtepMacTaken { vtep_mac: own_vtep_mac, holder: None })
        } else {
            None
        };
        if let Some(refusal) = refusal {
            paths.insert(*subnet, PeerPath::Refused(refusal));
        }
    }
    // Of the leases left, the older keeps an address or a MAC claimed twice.
    let mut by_age: Vec<(&Ipv4Net, &Peer)> = cluster.peers.iter().filter(|(s, _)| !paths.contains_key(s)).collect();
    by_age.sort_by_key(|(subnet, peer)| (peer.created, **subnet));
    let mut ip_holders: BTreeMap<Ipv4Addr, Ipv4Net> = BTreeMap::new();
    let mut mac_holders: BTreeMap<[u8; 6], Ipv4Net> = BTreeMap::new();
    for (subnet, peer) in by_age {
        let public_ip = peer.attrs.public_ip;
        if let Some(holder) = ip_holders.get(&public_ip) {
            paths.insert(*subnet, PeerPath::Refused(Refusal::PublicIpTaken { public_ip, holder: *holder }));
            continue;
        }
        if let Some(vtep_mac) = peer.attrs.vtep_mac.filter(|_| vxlan) {
            if let Some(holder) = mac_holders.get(&vtep_mac) {
                paths.insert(*subnet, PeerPath::Refused(Refusal::VtepMacTaken { vtep_mac, holder: Some(*holder) }));
                continue;
            }
            mac_holders.insert(vtep_mac, *subnet);
        }
        ip_holders.insert(public_ip, *subnet);
        paths.insert(*subnet, path(config.backend, peer, underlay));
    }
    paths
}

/// How the backend reaches a valid peer.
fn path(backend: BackendKind, peer: &Peer, underlay: &Underlay) -> PeerPath {
    let public_ip = peer.attrs.public_ip;
    let same_l2 = underlay.same_l2(public_ip);
    match backend {
        BackendKind::HostGw if same_l2 => PeerPath::Direct { gateway: public_ip },
        BackendKind::HostGw => PeerPath::Refused(Refusal::BeyondL2 {
            public_ip,
            prefixes: underlay.prefixes.iter().map(|p| p.to_string()).collect::<Vec<_>>().join(", "),
            underlay: underlay.name.clone(),
        }),
        BackendKind::Vxlan { direct_routing: true } if same_l2 => PeerPath::Direct { gateway: public_ip },
        BackendKind::Vxlan { .. } => match peer.attrs.vtep_mac {
            Some(vtep_mac) => PeerPath::Overlay { vtep_mac, endpoint: public_ip },
            None => PeerPath::Refused(Refusal::NoVtepMac { public_ip, backend_type: peer.attrs.backend_type.clone() }),
        },
    }
}

/// Refuses each path whose route would replace or shadow a route of `routes` that fabricd did not make: one
/// for the same destination (replace would overwrite it), or one it overlaps that is not broader than the
/// cluster's `network` (a default or supernet route is what peers' routes refine). A route for the same
/// destination that already goes where fabricd would send it (flanneld's, on a node moved from it) is taken
/// over instead. `device`: the vxlan device's index.
pub fn refuse_route_conflicts(
    paths: &mut BTreeMap<Ipv4Net, PeerPath>,
    network: Ipv4Net,
    routes: &[Route],
    device: Option<u32>,
) {
    let foreign: Vec<&Route> = routes.iter().filter(|r| r.protocol != Some(ROUTE_PROTOCOL)).collect();
    for (subnet, path) in paths.iter_mut() {
        let dst = IpNet::V4(*subnet);
        let conflict = foreign.iter().find(|route| {
            let overlaps = route.dst.contains(&dst.network()) || dst.contains(&route.dst.network());
            let broader =
                route.dst.prefix_len() <= network.prefix_len() && route.dst.contains(&IpAddr::V4(network.network()));
            if !overlaps || broader {
                return false;
            }
            let equivalent = route.dst == dst
                && match path {
                    PeerPath::Direct { gateway } => route.gateway == Some(IpAddr::V4(*gateway)),
                    PeerPath::Overlay { .. } => device.is_some() && route.oif == device,
                    PeerPath::Refused(_) => false,
                };
            !equivalent
        });
        if let (Some(route), false) = (conflict, matches!(path, PeerPath::Refused(_))) {
            let via = route.gateway.map(|g| format!(" via {g}")).unwrap_or_default();
            *path = PeerPath::Refused(Refusal::RouteConflict { route: format!("{}{via}", route.dst) });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flannel::{LeaseAttrs, NetworkConfig};
    use crate::source::derived_vtep_mac;

    fn underlay() -> Underlay {
        Underlay {
            index: 2,
            name: "eth0".into(),
            mtu: 1500,
            public_ip: Ipv4Addr::new(192, 168, 50, 10),
            prefixes: vec!["192.168.50.0/24".parse().unwrap()],
        }
    }

    fn peer(ip: [u8; 4], created: i64) -> Peer {
        let ip = Ipv4Addr::from(ip);
        Peer {
            attrs: LeaseAttrs {
                public_ip: ip,
                backend_type: "vxlan".into(),
                vtep_mac: Some(derived_vtep_mac(ip)),
                vni: Some(1),
            },
            created,
        }
    }

    fn cluster(backend: &str, peers: Vec<(&str, Peer)>) -> Cluster {
        let text = format!(r#"{{"Network":"10.244.0.0/16","SubnetLen":24,"Backend":{backend}}}"#);
        Cluster {
            config: NetworkConfig::parse(text.as_bytes()).unwrap(),
            subnet: "10.244.1.0/24".parse().unwrap(),
            lease: None,
            peers: peers.into_iter().map(|(s, p)| (s.parse().unwrap(), p)).collect(),
        }
    }

    fn own_mac() -> [u8; 6] {
        derived_vtep_mac(underlay().public_ip)
    }

    fn path_of(paths: &BTreeMap<Ipv4Net, PeerPath>, subnet: &str) -> PeerPath {
        paths[&subnet.parse::<Ipv4Net>().unwrap()].clone()
    }

    #[test]
    fn backends_choose_direct_or_overlay() {
        let peers =
            || vec![("10.244.2.0/24", peer([192, 168, 50, 11], 1)), ("10.244.3.0/24", peer([192, 168, 60, 3], 2))];
        let vxlan = plan(&cluster(r#"{"Type":"vxlan"}"#, peers()), &underlay(), own_mac());
        assert!(matches!(path_of(&vxlan, "10.244.2.0/24"), PeerPath::Overlay { .. }));
        let direct = plan(&cluster(r#"{"Type":"vxlan","DirectRouting":true}"#, peers()), &underlay(), own_mac());
        assert_eq!(path_of(&direct, "10.244.2.0/24"), PeerPath::Direct { gateway: Ipv4Addr::new(192, 168, 50, 11) });
        assert_eq!(
            path_of(&direct, "10.244.3.0/24"),
            PeerPath::Overlay {
                vtep_mac: derived_vtep_mac(Ipv4Addr::new(192, 168, 60, 3)),
                endpoint: Ipv4Addr::new(192, 168, 60, 3)
            }
        );
        let host_gw = plan(&cluster(r#"{"Type":"host-gw"}"#, peers()), &underlay(), own_mac());
        assert!(matches!(path_of(&host_gw, "10.244.2.0/24"), PeerPath::Direct { .. }));
        let PeerPath::Refused(far) = path_of(&host_gw, "10.244.3.0/24") else { panic!("routed beyond the L2") };
        assert!(far
            .to_string()
            .contains("its node 192.168.60.3 is not on this node's L2 segment (192.168.50.0/24 on eth0)"));
        assert!(!far.is_invalid_lease());
    }

    #[test]
    fn leases_that_are_not_valid_are_refused_and_the_others_used() {
        let mut multicast_mac = peer([192, 168, 50, 20], 9);
        multicast_mac.attrs.vtep_mac = Some([0x01, 0, 0x5e, 0, 0, 1]);
        let mut stolen_mac = peer([192, 168, 50, 21], 10);
        stolen_mac.attrs.vtep_mac = peer([192, 168, 50, 11], 0).attrs.vtep_mac;
        let mut own_mac_peer = peer([192, 168, 50, 22], 11);
        own_mac_peer.attrs.vtep_mac = Some(own_mac());
        let peers = vec![
            ("10.244.2.0/24", peer([192, 168, 50, 11], 1)),
            ("192.168.50.0/24", peer([192, 168, 50, 12], 2)),
            ("10.244.4.0/25", peer([192, 168, 50, 13], 3)),
            ("10.244.5.0/24", peer([127, 0, 0, 1], 4)),
            ("10.244.6.0/24", peer([224, 0, 0, 5], 5)),
            ("10.244.7.0/24", peer([0, 0, 0, 0], 6)),
            ("10.244.8.0/24", peer([192, 168, 50, 10], 7)),
            ("10.244.9.0/24", peer([192, 168, 50, 11], 8)),
            ("10.244.10.0/24", multicast_mac),
            ("10.244.11.0/24", stolen_mac),
            ("10.244.12.0/24", own_mac_peer),
        ];
        let paths = plan(&cluster(r#"{"Type":"vxlan"}"#, peers), &underlay(), own_mac());
        assert!(matches!(path_of(&paths, "10.244.2.0/24"), PeerPath::Overlay { .. }), "the good peer keeps working");
        let reason = |subnet: &str| match path_of(&paths, subnet) {
            PeerPath::Refused(refusal) => {
                assert!(refusal.is_invalid_lease());
                refusal.to_string()
            }
            other => panic!("{subnet} not refused: {other:?}"),
        };
        assert_eq!(reason("192.168.50.0/24"), "its subnet is not inside the Network 10.244.0.0/16");
        assert_eq!(reason("10.244.4.0/25"), "its subnet is not a /24 (SubnetLen)");
        assert_eq!(reason("10.244.5.0/24"), "its public address 127.0.0.1 is a loopback address");
        assert_eq!(reason("10.244.6.0/24"), "its public address 224.0.0.5 is a multicast address");
        assert_eq!(reason("10.244.7.0/24"), "its public address 0.0.0.0 is unspecified");
        assert_eq!(reason("10.244.8.0/24"), "its public address 192.168.50.10 is this node's");
        assert_eq!(
            reason("10.244.9.0/24"),
            "its public address 192.168.50.11 is already that of the lease of 10.244.2.0/24"
        );
        assert_eq!(reason("10.244.10.0/24"), "its VtepMAC 01:00:5e:00:00:01 is not a unicast address");
        assert_eq!(
            reason("10.244.11.0/24"),
            "its VtepMAC 0e:fa:c0:a8:32:0b is already that of the lease of 10.244.2.0/24"
        );
        assert_eq!(reason("10.244.12.0/24"), "its VtepMAC 0e:fa:c0:a8:32:0a is this node's");
    }

    #[test]
    fn the_older_lease_keeps_an_address_claimed_twice() {
        // The newer lease sorts first by subnet; age decides, not the key.
        let peers =
            vec![("10.244.2.0/24", peer([192, 168, 50, 11], 20)), ("10.244.3.0/24", peer([192, 168, 50, 11], 5))];
        let paths = plan(&cluster(r#"{"Type":"host-gw"}"#, peers), &underlay(), own_mac());
        assert!(matches!(path_of(&paths, "10.244.3.0/24"), PeerPath::Direct { .. }));
        assert!(matches!(path_of(&paths, "10.244.2.0/24"), PeerPath::Refused(Refusal::PublicIpTaken { .. })));
    }

    #[test]
    fn routes_not_made_by_fabricd_are_neither_replaced_nor_shadowed() {
        let route = |dst: &str, gateway: Option<&str>, protocol: u8, oif: u32| Route {
            dst: dst.parse().unwrap(),
            gateway: gateway.map(|g| g.parse().unwrap()),
            oif: Some(oif),
            protocol: Some(protocol),
            ..Route::default()
        };
        let routes = vec![
            route("0.0.0.0/0", Some("192.168.50.1"), 3, 2),
            route("10.0.0.0/8", Some("192.168.50.1"), 4, 2),
            route("10.244.2.0/24", Some("192.168.50.99"), 4, 2),
            route("10.244.3.0/25", None, 2, 7),
            route("10.244.4.0/24", Some("10.244.4.0"), 3, 9),
            route("10.244.5.0/24", Some("192.168.50.11"), ROUTE_PROTOCOL, 2),
        ];
        let mut paths: BTreeMap<Ipv4Net, PeerPath> = [
            ("10.244.2.0/24", PeerPath::Direct { gateway: Ipv4Addr::new(192, 168, 50, 11) }),
            ("10.244.3.0/24", PeerPath::Direct { gateway: Ipv4Addr::new(192, 168, 50, 12) }),
            (
                "10.244.4.0/24",
                PeerPath::Overlay { vtep_mac: [2, 0, 0, 0, 0, 1], endpoint: Ipv4Addr::new(192, 168, 60, 3) },
            ),
            ("10.244.5.0/24", PeerPath::Direct { gateway: Ipv4Addr::new(192, 168, 50, 13) }),
        ]
        .into_iter()
        .map(|(s, p)| (s.parse().unwrap(), p))
        .collect();
        refuse_route_conflicts(&mut paths, "10.244.0.0/16".parse().unwrap(), &routes, Some(9));
        assert_eq!(
            path_of(&paths, "10.244.2.0/24"),
            PeerPath::Refused(Refusal::RouteConflict { route: "10.244.2.0/24 via 192.168.50.99".into() }),
            "same destination, elsewhere: not replaced"
        );
        assert_eq!(
            path_of(&paths, "10.244.3.0/24"),
            PeerPath::Refused(Refusal::RouteConflict { route: "10.244.3.0/25".into() }),
            "a more specific route (a connected subnet) is not shadowed"
        );
        // flanneld's route on the vxlan device is taken over; fabricd's own routes and broader ones are fine.
        assert!(matches!(path_of(&paths, "10.244.4.0/24"), PeerPath::Overlay { .. }));
        assert!(matches!(path_of(&paths, "10.244.5.0/24"), PeerPath::Direct { .. }));
    }
}
