//! ipip, as flannel's: IPv4 only, one `flannel.ipip` device (local = the node's public address, bound to the
//! underlay, any remote end, MTU = underlay - 20, the subnet's network address /32 on it), and per peer an
//! onlink route via the peer's public address on it. With `DirectRouting`, a peer on the same L2 segment gets
//! a host-gw route instead. No lease data (flannel writes none).

use std::io;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use cnicore::netlink::{Ipip, Link};
use ipnet::IpNet;
use serde_json::Value;

use super::contract::{
    direct_if_same_l2, onlink_route, option, Backend, LeaseData, OptionsError, PeerEndpoint, Wanted,
};
use super::device::DeviceContext;
use crate::dataplane::diff::DeviceChange;
use crate::family::Family;
use crate::path::{PeerPath, Refusal};
use crate::underlay::Underlay;

/// flannel's device name.
pub const DEVICE: &str = "flannel.ipip";
/// The outer IPv4 header.
pub const OVERHEAD: u32 = 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpipBackend {
    pub direct_routing: bool,
}

pub fn parse(options: &Value, _: &super::contract::BackendContext) -> Result<Arc<dyn Backend>, OptionsError> {
    Ok(Arc::new(IpipBackend { direct_routing: option(options, "ipip", "DirectRouting")?.unwrap_or(false) }))
}

impl IpipBackend {
    /// The device with the right settings: kept, or (re)created. None in a dry run that would create it.
    fn ensure_link(&self, context: &mut DeviceContext, local: Ipv4Addr, mtu: u32) -> io::Result<Option<Link>> {
        let settings = Ipip { local: Some(local), remote: None, link: Some(context.underlay.index) };
        let current = context.nl.ipip_by_name(DEVICE)?;
        if let Some((link, Some(current))) = &current {
            if *current == settings {
                return Ok(Some(link.clone()));
            }
        }
        let change = match &current {
            None => DeviceChange::Create { name: DEVICE.into(), kind: "ipip", settings: format!("local {local}"), mtu },
            Some(_) => DeviceChange::Recreate { name: DEVICE.into() },
        };
        if !context.change(change) {
            return Ok(None);
        }
        if let Some((link, _)) = current {
            context.nl.delete_link(link.index)?;
        }
        Ok(Some(context.nl.create_ipip(DEVICE, Some(mtu), &settings)?))
    }
}

impl Backend for IpipBackend {
    fn type_name(&self) -> &'static str {
        "ipip"
    }

    fn overhead(&self, _family: Family) -> u32 {
        OVERHEAD
    }

    fn lease_data(&self, _family: Family, _local: IpAddr) -> io::Result<Option<LeaseData>> {
        Ok(None)
    }

    fn path(&self, peer: &PeerEndpoint, underlay: &Underlay) -> PeerPath {
        if Family::of(peer.public_ip) == Family::V6 {
            return PeerPath::Refused(Refusal::FamilyNotCarried { backend: "ipip", family: Family::V6 });
        }
        if let Some(direct) = direct_if_same_l2(peer, underlay).filter(|_| self.direct_routing) {
            return direct;
        }
        PeerPath::Overlay { endpoint: peer.public_ip, port: None, id: None }
    }

    fn device_name(&self, family: Family) -> Option<String> {
        (family == Family::V4).then(|| DEVICE.to_string())
    }

    /// The device's settings, MTU, the subnet's network address as a host address, up (IPv4 only).
    fn ensure_device(&self, mut context: DeviceContext) -> io::Result<Option<u32>> {
        let IpAddr::V4(local) = context.local else { return Ok(None) };
        let mtu = context.underlay.mtu - OVERHEAD;
        let Some(link) = self.ensure_link(&mut context, local, mtu)? else { return Ok(None) };
        context.mtu(&link, mtu)?;
        context.subnet_address(&link)?;
        context.up(&link)?;
        Ok(Some(link.index))
    }

    fn add_peer(&self, wanted: &mut Wanted, index: u32, subnet: IpNet, path: &PeerPath) {
        if let PeerPath::Overlay { endpoint, .. } = path {
            wanted.routes.push(onlink_route(subnet, *endpoint, index));
        }
    }

    fn owns_link(&self, name: &str, kind: Option<&str>) -> bool {
        name == DEVICE && kind == Some("ipip")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn underlay() -> Underlay {
        Underlay::example()
    }

    fn peer(ip: &str) -> PeerEndpoint<'static> {
        PeerEndpoint {
            public_ip: ip.parse().unwrap(),
            id: None,
            backend_type: "ipip",
            addresses: [None, None],
            ports: [None, None],
        }
    }

    #[test]
    fn peers_are_reached_through_the_tunnel_or_directly_on_the_same_segment() {
        let tunnel = IpipBackend { direct_routing: false };
        let near = tunnel.path(&peer("192.168.50.11"), &underlay());
        assert_eq!(near, PeerPath::Overlay { endpoint: "192.168.50.11".parse().unwrap(), port: None, id: None });
        let direct = IpipBackend { direct_routing: true };
        assert_eq!(
            direct.path(&peer("192.168.50.11"), &underlay()),
            PeerPath::Direct { gateway: "192.168.50.11".parse().unwrap() }
        );
        assert!(matches!(direct.path(&peer("192.168.60.3"), &underlay()), PeerPath::Overlay { .. }));
        let PeerPath::Refused(refusal) = direct.path(&peer("fd00:50::11"), &underlay()) else {
            panic!("IPv6 over ipip")
        };
        assert_eq!(refusal.to_string(), "the ipip backend carries no IPv6 traffic");
        assert!(!refusal.is_invalid_lease());
    }

    #[test]
    fn a_peer_gets_an_onlink_route_via_its_public_address() {
        let mut wanted = Wanted::default();
        let backend = IpipBackend { direct_routing: false };
        let path = PeerPath::Overlay { endpoint: "192.168.60.3".parse().unwrap(), port: None, id: None };
        backend.add_peer(&mut wanted, 9, "10.244.3.0/24".parse().unwrap(), &path);
        let route = &wanted.routes[0];
        assert_eq!((route.gateway, route.oif, route.onlink), (Some("192.168.60.3".parse().unwrap()), Some(9), true));
        assert!(wanted.neighbours.is_empty() && wanted.fdb.is_empty());
        assert_eq!(backend.lease_data(Family::V4, "192.168.50.10".parse().unwrap()).unwrap(), None, "none");
        assert_eq!(backend.overhead(Family::V4), 20);
        assert!(backend.owns_link("flannel.ipip", Some("ipip")) && !backend.owns_link("tunl0", Some("ipip")));
    }
}
