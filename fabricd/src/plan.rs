//! The plan: for each peer's lease, whether it may be used and how its pods are reached. Pure: it reads the
//! cluster, the underlay and the routes found on the node, and touches nothing.
//!
//! The store is not trusted: any node, or a typo, can write a lease, and one bad lease must not cut a node
//! off or take over another node's traffic. A lease is used only if its subnet lies inside the cluster's
//! Network with the configured length; its public address is unicast, not loopback, not this node's and not
//! another lease's; its tunnel identity (vxlan's VtepMAC, wireguard's PublicKey) valid and not this node's or
//! another lease's; and its route would neither replace nor shadow a route that fabricd did not make. Of two
//! leases claiming one address or identity, the older keeps it.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use cnicore::netlink::Route;
use ipnet::IpNet;

use crate::backend::PeerEndpoint;
use crate::family::{overlaps, Family};
use crate::flannel::{FamilyNetwork, SubnetKey};
pub use crate::path::{PeerPath, Refusal, TunnelId};
use crate::source::{Cluster, Peer};
use crate::underlay::{Underlay, ROUTE_PROTOCOL};

/// Why `ip` cannot be a peer's public address, if it cannot.
fn not_unicast(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(ip) if ip.is_unspecified() || ip.octets()[0] == 0 => Some("unspecified"),
        IpAddr::V4(ip) if ip.is_broadcast() || ip.octets()[0] >= 240 => Some("a broadcast or reserved address"),
        IpAddr::V6(ip) if ip.is_unspecified() => Some("unspecified"),
        ip @ IpAddr::V6(_) if cnicore::ip::is_link_local(ip) => Some("a link-local address"),
        ip if ip.is_loopback() => Some("a loopback address"),
        ip if ip.is_multicast() => Some("a multicast address"),
        _ => None,
    }
}

/// One family's share of a peer's lease.
struct FamilyLease<'a> {
    /// The lease's key (both families' subnets): its seniority's tie-break.
    key: SubnetKey,
    subnet: IpNet,
    public: Option<IpAddr>,
    /// The backend's reading of its data.
    id: Result<Option<TunnelId>, Refusal>,
    peer: &'a Peer,
}

/// The backend's decision for each peer subnet of each enabled family.
pub fn plan(cluster: &Cluster, underlay: &Underlay) -> BTreeMap<IpNet, PeerPath> {
    let mut paths = BTreeMap::new();
    for network in cluster.config.families() {
        plan_family(cluster, network, underlay, &mut paths);
    }
    paths
}

/// One family: each lease checked alone, then of the leases left the older keeps an address or a tunnel
/// identity (VTEP MAC, public key) claimed twice, then the backend's path.
fn plan_family(cluster: &Cluster, network: &FamilyNetwork, underlay: &Underlay, paths: &mut BTreeMap<IpNet, PeerPath>) {
    let family = network.family();
    let backend = &*cluster.config.backend;
    let own_public = underlay.public(family);
    let own_id = own_public.and_then(|ip| backend.own_tunnel_id(family, ip));
    let own =
        Own { public: own_public, id: own_id, subnet: cluster.subnet.get(family), networks: cluster.config.networks() };
    let leases: Vec<FamilyLease> = cluster
        .peers
        .iter()
        .filter_map(|(key, peer)| {
            let subnet = key.get(family)?;
            let id = backend.tunnel_id(family, peer.attrs.data(family));
            Some(FamilyLease { key: *key, subnet, public: peer.attrs.public(family), id, peer })
        })
        .collect();
    let mut valid = Vec::new();
    for lease in &leases {
        match refusal(lease, network, &own) {
            Some(refusal) => {
                paths.insert(lease.subnet, PeerPath::Refused(refusal));
            }
            None => valid.push(lease),
        }
    }
    valid.sort_by_key(|lease| lease.peer.seniority(lease.key));
    let mut ip_holders: BTreeMap<IpAddr, IpNet> = BTreeMap::new();
    let mut id_holders: BTreeMap<TunnelId, IpNet> = BTreeMap::new();
    let mut subnet_holders = SubnetHolders::default();
    for lease in valid {
        let public_ip = lease.public.expect("checked");
        let id = lease.id.clone().expect("checked");
        if let Some(holder) = subnet_holders.first_overlapping(&lease.subnet) {
            // Two keys for one subnet (`10.244.1.0-24` and `10.244.1.0-24&<v6>` in an IPv4 cluster): the
            // older speaks for it, the newer is refused, and keeps the older's entry in `paths`.
            if paths.get(&lease.subnet).is_none() || holder != lease.subnet {
                paths.insert(lease.subnet, PeerPath::Refused(Refusal::SubnetTaken { holder: Some(holder) }));
            }
            continue;
        }
        subnet_holders.insert(lease.subnet);
        if let Some(holder) = ip_holders.get(&public_ip) {
            paths.insert(lease.subnet, PeerPath::Refused(Refusal::PublicIpTaken { public_ip, holder: *holder }));
            continue;
        }
        if let Some(id) = id {
            if let Some(holder) = id_holders.get(&id) {
                let refusal = Refusal::TunnelIdTaken { id, holder: Some(*holder) };
                paths.insert(lease.subnet, PeerPath::Refused(refusal));
                continue;
            }
            id_holders.insert(id, lease.subnet);
        }
        ip_holders.insert(public_ip, lease.subnet);
        let attrs = &lease.peer.attrs;
        let peer = PeerEndpoint {
            public_ip,
            id,
            backend_type: &attrs.backend_type,
            addresses: Family::ALL.map(|f| attrs.public(f)),
            ports: Family::ALL.map(|f| backend.peer_port(f, attrs.data(f))),
        };
        paths.insert(lease.subnet, backend.path(&peer, underlay));
    }
}

/// What of this node a lease must not claim, in one family.
struct Own {
    public: Option<IpAddr>,
    id: Option<TunnelId>,
    subnet: Option<IpNet>,
    /// The cluster's Networks (of every family): a node address inside one is a pod's.
    networks: Vec<IpNet>,
}

/// The subnets one family's plan has given to leases so far (pairwise disjoint, and network prefixes: a key with
/// host bits is not a lease), and the order they were given in. Finding the first that overlaps a subnet takes a
/// lookup per prefix length held and a range, not a scan of every holder: at 5,000 leases the scan made each pass
/// quadratic (a cold start took 1.1 s instead of 0.3).
#[derive(Default)]
struct SubnetHolders {
    /// Each holder, with its rank.
    ranks: BTreeMap<IpNet, usize>,
    prefix_lens: BTreeSet<u8>,
}

impl SubnetHolders {
    fn insert(&mut self, subnet: IpNet) {
        let rank = self.ranks.len();
        self.ranks.insert(subnet, rank);
        self.prefix_lens.insert(subnet.prefix_len());
    }

    /// The earliest holder that overlaps `subnet`: the one holder containing it, or those inside it.
    fn first_overlapping(&self, subnet: &IpNet) -> Option<IpNet> {
        let containing = self
            .prefix_lens
            .range(..=subnet.prefix_len())
            .filter_map(|len| IpNet::new(subnet.network(), *len).ok())
            .filter_map(|net| self.ranks.get_key_value(&net.trunc()));
        let last = IpNet::new(subnet.broadcast(), subnet.max_prefix_len()).expect("a host prefix");
        let inside = self.ranks.range(subnet.trunc()..=last);
        containing.chain(inside).min_by_key(|(_, rank)| **rank).map(|(held, _)| *held)
    }
}

/// Peer keys naming a subnet that an older peer's key (`holder`) also names, as (key, holder): the plan
/// refuses them, and where the subnet is the same, `paths` keeps the holder's path and cannot show the refusal.
pub fn second_keys(cluster: &Cluster) -> Vec<(SubnetKey, SubnetKey)> {
    let mut peers: Vec<(&SubnetKey, &Peer)> = cluster.peers.iter().collect();
    peers.sort_by_key(|(key, peer)| peer.seniority(**key));
    // The first (oldest) key naming each subnet: a map, as a scan of the older keys is quadratic.
    let mut first_with: BTreeMap<IpNet, (usize, SubnetKey)> = BTreeMap::new();
    let mut seconds = Vec::new();
    for (rank, (key, _)) in peers.iter().enumerate() {
        let subnets = Family::ALL.into_iter().filter_map(|f| key.get(f));
        if let Some((_, holder)) = subnets.clone().filter_map(|s| first_with.get(&s)).min_by_key(|(r, _)| *r) {
            seconds.push((**key, *holder));
        }
        for subnet in subnets {
            first_with.entry(subnet).or_insert((rank, **key));
        }
    }
    seconds
}

/// Why one lease is not used on its own (before it is compared with the others), if it is not.
fn refusal(lease: &FamilyLease, network: &FamilyNetwork, own: &Own) -> Option<Refusal> {
    if !network.network.contains(&lease.subnet) {
        return Some(Refusal::OutsideNetwork { network: network.network });
    }
    if lease.subnet.prefix_len() != network.subnet_len {
        return Some(Refusal::WrongLength { wanted: network.subnet_len });
    }
    let Some(public_ip) = lease.public else { return Some(Refusal::NoPublicIp { family: network.family() }) };
    if let Some(why) = not_unicast(public_ip) {
        return Some(Refusal::BadPublicIp { public_ip, why });
    }
    if Some(public_ip) == own.public {
        return Some(Refusal::OwnPublicIp { public_ip });
    }
    if let Some(network) = own.networks.iter().find(|n| n.contains(&public_ip)) {
        return Some(Refusal::PublicIpInNetwork { public_ip, network: *network });
    }
    if own.subnet.is_some_and(|subnet| overlaps(&subnet, &lease.subnet)) {
        return Some(Refusal::SubnetTaken { holder: None });
    }
    match &lease.id {
        Err(refusal) => Some(refusal.clone()),
        Ok(Some(id)) if Some(*id) == own.id => Some(Refusal::TunnelIdTaken { id: *id, holder: None }),
        Ok(_) => None,
    }
}

/// Refuses each path of `network`'s family whose route would replace or shadow a route of `routes` that
/// fabricd did not make: one for the same destination (replace would overwrite it), or one it overlaps that
/// is not broader than the cluster's `network` (a default or supernet route is what peers' routes refine). A
/// route for the same destination that already goes where fabricd would send it (flanneld's, on a node moved
/// from it) is taken over instead. `device`: the family's tunnel device's index.
pub fn refuse_route_conflicts(
    paths: &mut BTreeMap<IpNet, PeerPath>,
    network: IpNet,
    routes: &[Route],
    device: Option<u32>,
) {
    let family = Family::of(network.addr());
    let foreign: Vec<&Route> =
        routes.iter().filter(|r| r.protocol != Some(ROUTE_PROTOCOL) && Family::of(r.dst.addr()) == family).collect();
    for (dst, path) in paths.iter_mut().filter(|(dst, _)| Family::of(dst.addr()) == family) {
        if matches!(path, PeerPath::Refused(_) | PeerPath::Unrouted) {
            continue;
        }
        let conflict = foreign.iter().find(|route| {
            let broader = route.dst.prefix_len() <= network.prefix_len() && route.dst.contains(&network.network());
            if !overlaps(&route.dst, dst) || broader {
                return false;
            }
            let equivalent = route.dst == *dst
                && match path {
                    PeerPath::Direct { gateway } => route.gateway == Some(*gateway),
                    PeerPath::Overlay { .. } => device.is_some() && route.oif == device,
                    PeerPath::Refused(_) | PeerPath::Unrouted => false,
                };
            !equivalent
        });
        if let Some(route) = conflict {
            let via = route.gateway.map(|g| format!(" via {g}")).unwrap_or_default();
            *path = PeerPath::Refused(Refusal::RouteConflict { route: format!("{}{via}", route.dst) });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::vxlan::derived_vtep_mac;
    use crate::flannel::{LeaseAttrs, NetworkConfig, SubnetKey};

    fn underlay() -> Underlay {
        Underlay::example()
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    /// A vxlan lease of a node at `public` (either family), its MAC derived from it.
    fn peer(public: &str, created: i64) -> Peer {
        let public = ip(public);
        let data = Some(vxlan_data(derived_vtep_mac(public)));
        let attrs = match public {
            IpAddr::V4(v4) => LeaseAttrs {
                public_ip: Some(v4),
                public_ipv6: None,
                backend_type: "vxlan".into(),
                backend_data: data,
                backend_v6_data: None,
            },
            IpAddr::V6(v6) => LeaseAttrs {
                public_ip: None,
                public_ipv6: Some(v6),
                backend_type: "vxlan".into(),
                backend_data: None,
                backend_v6_data: data,
            },
        };
        Peer { attrs, created }
    }

    fn vxlan_data(mac: [u8; 6]) -> crate::backend::LeaseData {
        serde_json::json!({ "VNI": 1, "VtepMAC": cnicore::mac::format(&mac) }).into()
    }

    fn key_of(subnet: &str) -> SubnetKey {
        match subnet.parse::<IpNet>().unwrap() {
            IpNet::V4(v4) => SubnetKey { v4: Some(v4), v6: None },
            IpNet::V6(v6) => SubnetKey { v4: None, v6: Some(v6) },
        }
    }

    fn cluster(backend: &str, peers: Vec<(&str, Peer)>) -> Cluster {
        let text = format!(
            r#"{{"EnableIPv6":true,"Network":"10.244.0.0/16","SubnetLen":24,"IPv6Network":"fd00:10:244::/56","Backend":{backend}}}"#
        );
        Cluster {
            config: NetworkConfig::parse(text.as_bytes()).unwrap(),
            subnet: SubnetKey {
                v4: Some("10.244.1.0/24".parse().unwrap()),
                v6: Some("fd00:10:244:1::/64".parse().unwrap()),
            },
            lease: None,
            peers: peers.into_iter().map(|(s, p)| (key_of(s), p)).collect(),
        }
    }

    fn path_of(paths: &BTreeMap<IpNet, PeerPath>, subnet: &str) -> PeerPath {
        paths[&subnet.parse::<IpNet>().unwrap()].clone()
    }

    #[test]
    fn the_first_overlapping_holder_is_found_without_a_scan() {
        let net = |text: &str| text.parse::<IpNet>().unwrap();
        let mut holders = SubnetHolders::default();
        for held in ["10.244.7.0/24", "10.244.3.0/24", "fd00:10:0:1::/64"] {
            holders.insert(net(held));
        }
        assert_eq!(holders.first_overlapping(&net("10.244.4.0/24")), None);
        assert_eq!(holders.first_overlapping(&net("10.244.3.0/24")), Some(net("10.244.3.0/24")));
        assert_eq!(holders.first_overlapping(&net("10.244.3.128/25")), Some(net("10.244.3.0/24")));
        // A wider subnet over several holders names the one given first, as a scan in that order would.
        assert_eq!(holders.first_overlapping(&net("10.244.0.0/16")), Some(net("10.244.7.0/24")));
        assert_eq!(holders.first_overlapping(&net("10.0.0.0/8")), Some(net("10.244.7.0/24")));
        assert_eq!(holders.first_overlapping(&net("fd00:10::/48")), Some(net("fd00:10:0:1::/64")));
        assert_eq!(holders.first_overlapping(&net("fd00:11::/48")), None);
    }

    #[test]
    fn backends_choose_direct_or_overlay_in_each_family() {
        let peers = || {
            vec![
                ("10.244.2.0/24", peer("192.168.50.11", 1)),
                ("10.244.3.0/24", peer("192.168.60.3", 2)),
                ("fd00:10:244:2::/64", peer("fd00:50::11", 1)),
                ("fd00:10:244:3::/64", peer("fd00:60::3", 2)),
            ]
        };
        let vxlan = plan(&cluster(r#"{"Type":"vxlan"}"#, peers()), &underlay());
        assert!(matches!(path_of(&vxlan, "10.244.2.0/24"), PeerPath::Overlay { .. }));
        assert_eq!(
            path_of(&vxlan, "fd00:10:244:3::/64"),
            PeerPath::Overlay {
                endpoint: ip("fd00:60::3"),
                port: None,
                id: Some(TunnelId::VtepMac(derived_vtep_mac(ip("fd00:60::3"))))
            }
        );
        let direct = plan(&cluster(r#"{"Type":"vxlan","DirectRouting":true}"#, peers()), &underlay());
        assert_eq!(path_of(&direct, "10.244.2.0/24"), PeerPath::Direct { gateway: ip("192.168.50.11") });
        assert_eq!(path_of(&direct, "fd00:10:244:2::/64"), PeerPath::Direct { gateway: ip("fd00:50::11") });
        assert!(matches!(path_of(&direct, "10.244.3.0/24"), PeerPath::Overlay { .. }));
        assert!(matches!(path_of(&direct, "fd00:10:244:3::/64"), PeerPath::Overlay { .. }));
        let host_gw = plan(&cluster(r#"{"Type":"host-gw"}"#, peers()), &underlay());
        assert!(matches!(path_of(&host_gw, "10.244.2.0/24"), PeerPath::Direct { .. }));
        assert!(matches!(path_of(&host_gw, "fd00:10:244:2::/64"), PeerPath::Direct { .. }));
        let PeerPath::Refused(far) = path_of(&host_gw, "10.244.3.0/24") else { panic!("routed beyond the L2") };
        assert!(far
            .to_string()
            .contains("its node 192.168.60.3 is not on this node's L2 segment (192.168.50.0/24 on eth0)"));
        assert!(!far.is_invalid_lease());
        let PeerPath::Refused(far) = path_of(&host_gw, "fd00:10:244:3::/64") else { panic!("routed beyond the L2") };
        assert!(far
            .to_string()
            .contains("its node fd00:60::3 is not on this node's L2 segment (fd00:50::/64 on eth0)"));
    }

    #[test]
    fn leases_that_are_not_valid_are_refused_and_the_others_used() {
        let with_mac = |mut peer: Peer, mac: [u8; 6]| {
            for data in [&mut peer.attrs.backend_data, &mut peer.attrs.backend_v6_data].into_iter().flatten() {
                *data = vxlan_data(mac);
            }
            peer
        };
        let own_mac = derived_vtep_mac(underlay().public(Family::V4).unwrap());
        let own_mac6 = derived_vtep_mac(underlay().public(Family::V6).unwrap());
        let peers = vec![
            ("10.244.2.0/24", peer("192.168.50.11", 1)),
            ("192.168.50.0/24", peer("192.168.50.12", 2)),
            ("10.244.4.0/25", peer("192.168.50.13", 3)),
            ("10.244.5.0/24", peer("127.0.0.1", 4)),
            ("10.244.6.0/24", peer("224.0.0.5", 5)),
            ("10.244.8.0/24", peer("192.168.50.10", 7)),
            ("10.244.9.0/24", peer("192.168.50.11", 8)),
            ("10.244.10.0/24", with_mac(peer("192.168.50.20", 9), [0x01, 0, 0x5e, 0, 0, 1])),
            ("10.244.11.0/24", with_mac(peer("192.168.50.21", 10), derived_vtep_mac(ip("192.168.50.11")))),
            ("10.244.12.0/24", with_mac(peer("192.168.50.22", 11), own_mac)),
            ("fd00:10:244:2::/64", peer("fd00:50::11", 1)),
            ("fd00:50::/64", peer("fd00:50::12", 2)),
            ("fd00:10:244:4::/80", peer("fd00:50::13", 3)),
            ("fd00:10:244:5::/64", peer("::1", 4)),
            ("fd00:10:244:6::/64", peer("ff02::1", 5)),
            ("fd00:10:244:7::/64", peer("fe80::7", 6)),
            ("fd00:10:244:8::/64", peer("fd00:50::10", 7)),
            ("fd00:10:244:9::/64", peer("fd00:50::11", 8)),
            ("fd00:10:244:10::/64", with_mac(peer("fd00:50::20", 9), [0x33, 0x33, 0, 0, 0, 1])),
            ("fd00:10:244:11::/64", with_mac(peer("fd00:50::21", 10), derived_vtep_mac(ip("fd00:50::11")))),
            ("fd00:10:244:12::/64", with_mac(peer("fd00:50::22", 11), own_mac6)),
        ];
        let paths = plan(&cluster(r#"{"Type":"vxlan"}"#, peers), &underlay());
        assert!(matches!(path_of(&paths, "10.244.2.0/24"), PeerPath::Overlay { .. }), "the good peer keeps working");
        assert!(matches!(path_of(&paths, "fd00:10:244:2::/64"), PeerPath::Overlay { .. }));
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
        assert_eq!(reason("fd00:50::/64"), "its subnet is not inside the Network fd00:10:244::/56");
        assert_eq!(reason("fd00:10:244:4::/80"), "its subnet is not a /64 (SubnetLen)");
        assert_eq!(reason("fd00:10:244:5::/64"), "its public address ::1 is a loopback address");
        assert_eq!(reason("fd00:10:244:6::/64"), "its public address ff02::1 is a multicast address");
        assert_eq!(reason("fd00:10:244:7::/64"), "its public address fe80::7 is a link-local address");
        assert_eq!(reason("fd00:10:244:8::/64"), "its public address fd00:50::10 is this node's");
        assert_eq!(
            reason("fd00:10:244:9::/64"),
            "its public address fd00:50::11 is already that of the lease of fd00:10:244:2::/64"
        );
        assert_eq!(reason("fd00:10:244:10::/64"), "its VtepMAC 33:33:00:00:00:01 is not a unicast address");
        let mac = |public: &str| cnicore::mac::format(&derived_vtep_mac(ip(public)));
        assert_eq!(
            reason("fd00:10:244:11::/64"),
            format!("its VtepMAC {} is already that of the lease of fd00:10:244:2::/64", mac("fd00:50::11"))
        );
        assert_eq!(reason("fd00:10:244:12::/64"), format!("its VtepMAC {} is this node's", mac("fd00:50::10")));
    }

    #[test]
    fn vtep_macs_of_ipv6_addresses_differ_when_their_last_bytes_agree() {
        let (a, b) = (derived_vtep_mac(ip("fd00:192:168:50::a")), derived_vtep_mac(ip("fd00:192:168:51::a")));
        assert_ne!(a, b);
        assert!(a[0] & 1 == 0 && a[0] & 2 == 2, "locally administered unicast");
    }

    #[test]
    fn a_dual_stack_lease_without_a_public_ipv6_address_is_used_for_ipv4_only() {
        let mut dual = peer("192.168.50.11", 1);
        dual.attrs.backend_v6_data = dual.attrs.backend_data.clone();
        let mut cluster = cluster(r#"{"Type":"vxlan"}"#, vec![]);
        let key =
            SubnetKey { v4: Some("10.244.2.0/24".parse().unwrap()), v6: Some("fd00:10:244:2::/64".parse().unwrap()) };
        cluster.peers.insert(key, dual);
        let paths = plan(&cluster, &underlay());
        assert!(matches!(path_of(&paths, "10.244.2.0/24"), PeerPath::Overlay { .. }));
        assert_eq!(
            path_of(&paths, "fd00:10:244:2::/64"),
            PeerPath::Refused(Refusal::NoPublicIp { family: Family::V6 })
        );
    }

    #[test]
    fn the_older_lease_keeps_an_address_claimed_twice() {
        // The newer lease sorts first by subnet; age decides, not the key.
        let peers = vec![("10.244.2.0/24", peer("192.168.50.11", 20)), ("10.244.3.0/24", peer("192.168.50.11", 5))];
        let paths = plan(&cluster(r#"{"Type":"host-gw"}"#, peers), &underlay());
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
            route("fd00:10:244:2::/64", Some("fd00:50::99"), 4, 2),
        ];
        let mut paths: BTreeMap<IpNet, PeerPath> = [
            ("10.244.2.0/24", PeerPath::Direct { gateway: ip("192.168.50.11") }),
            ("10.244.3.0/24", PeerPath::Direct { gateway: ip("192.168.50.12") }),
            (
                "10.244.4.0/24",
                PeerPath::Overlay {
                    endpoint: ip("192.168.60.3"),
                    port: None,
                    id: Some(TunnelId::VtepMac([2, 0, 0, 0, 0, 1])),
                },
            ),
            ("10.244.5.0/24", PeerPath::Direct { gateway: ip("192.168.50.13") }),
            ("fd00:10:244:2::/64", PeerPath::Direct { gateway: ip("fd00:50::11") }),
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
        assert!(matches!(path_of(&paths, "fd00:10:244:2::/64"), PeerPath::Direct { .. }), "another family's turn");
        refuse_route_conflicts(&mut paths, "fd00:10:244::/56".parse().unwrap(), &routes, None);
        assert_eq!(
            path_of(&paths, "fd00:10:244:2::/64"),
            PeerPath::Refused(Refusal::RouteConflict { route: "fd00:10:244:2::/64 via fd00:50::99".into() })
        );
    }

    #[test]
    fn wireguard_leases_with_a_bad_a_taken_or_this_nodes_key_are_refused_and_the_others_used() {
        let dir = std::env::temp_dir().join(format!("fabricd-plan-wg-{}", std::process::id()));
        let mut cluster = cluster(r#"{"Type":"wireguard"}"#, vec![]);
        let context = crate::backend::BackendContext { wireguard_key_file: dir.join("wgkey"), underlay_mtu: None };
        cluster.config = crate::flannel::NetworkConfig::parse_with(
            br#"{"Network":"10.244.0.0/16","Backend":{"Type":"wireguard"}}"#,
            &context,
        )
        .unwrap();
        let Some(TunnelId::PublicKey(own)) = cluster.config.backend.own_tunnel_id(Family::V4, ip("192.168.50.10"))
        else {
            panic!("no key of this node")
        };
        let lease = |public: &str, key: &str, created: i64| {
            let mut peer = peer(public, created);
            let data = Some(serde_json::json!({ "PublicKey": key, "Port": 51820 }).into());
            peer.attrs.backend_type = "wireguard".into();
            peer.attrs.backend_data = data;
            peer
        };
        let key = crate::path::key_text;
        let peers = vec![
            ("10.244.2.0/24", lease("192.168.50.11", &key(&[1; 32]), 1)),
            ("10.244.3.0/24", lease("192.168.50.12", &key(&[1; 32]), 2)),
            ("10.244.4.0/24", lease("192.168.50.13", "bm90IGEga2V5", 3)),
            ("10.244.5.0/24", lease("192.168.50.14", &key(&own), 4)),
            ("10.244.6.0/24", peer("192.168.50.15", 5)),
        ];
        cluster.peers = peers.into_iter().map(|(s, p)| (key_of(s), p)).collect();
        let paths = plan(&cluster, &underlay());
        assert_eq!(
            path_of(&paths, "10.244.2.0/24"),
            PeerPath::Overlay {
                endpoint: ip("192.168.50.11"),
                port: Some(51820),
                id: Some(TunnelId::PublicKey([1; 32]))
            }
        );
        let reason = |subnet: &str| match path_of(&paths, subnet) {
            PeerPath::Refused(refusal) => refusal.to_string(),
            other => panic!("{subnet} not refused: {other:?}"),
        };
        let first = key(&[1; 32]);
        assert_eq!(
            reason("10.244.3.0/24"),
            format!("its PublicKey {first} is already that of the lease of 10.244.2.0/24")
        );
        assert!(reason("10.244.4.0/24").contains("PublicKey \"bm90IGEga2V5\" is not a base64 key of 32 bytes"));
        assert_eq!(reason("10.244.5.0/24"), format!("its PublicKey {} is this node's", key(&own)));
        assert_eq!(reason("10.244.6.0/24"), "node 192.168.50.15 announces backend \"vxlan\" without a PublicKey");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A store it does not trust, round two: a node address inside the cluster Network (a pod's), a key for
    /// this node's own subnet, and a second key for a subnet another lease names: refused on both backends.
    #[test]
    fn pod_addresses_and_second_keys_for_a_subnet_are_refused() {
        for backend in [r#"{"Type":"vxlan"}"#, r#"{"Type":"host-gw"}"#] {
            let mut alias = peer("192.168.50.66", 5);
            alias.attrs.public_ipv6 = Some("fd00:50::66".parse().unwrap());
            let mut cluster = cluster(
                backend,
                vec![
                    ("10.244.2.0/24", peer("192.168.50.11", 1)),
                    ("10.244.4.0/24", peer("10.244.9.5", 3)),
                    ("10.244.1.0/24", peer("192.168.50.67", 4)),
                ],
            );
            // `10.244.2.0-24&fd00:10:244:7::-64`: a second key naming 10.244.2.0/24.
            let dual = SubnetKey {
                v4: Some("10.244.2.0/24".parse().unwrap()),
                v6: Some("fd00:10:244:7::/64".parse().unwrap()),
            };
            cluster.peers.insert(dual, alias);
            let paths = plan(&cluster, &underlay());
            let gateway = ip("192.168.50.11");
            assert!(
                matches!(path_of(&paths, "10.244.2.0/24"), PeerPath::Direct { gateway: g } | PeerPath::Overlay { endpoint: g, .. } if g == gateway),
                "{backend}: the older lease keeps its subnet: {paths:?}"
            );
            assert_eq!(
                path_of(&paths, "10.244.4.0/24"),
                PeerPath::Refused(Refusal::PublicIpInNetwork {
                    public_ip: ip("10.244.9.5"),
                    network: "10.244.0.0/16".parse().unwrap()
                })
            );
            assert_eq!(path_of(&paths, "10.244.1.0/24"), PeerPath::Refused(Refusal::SubnetTaken { holder: None }));
        }
    }
}
