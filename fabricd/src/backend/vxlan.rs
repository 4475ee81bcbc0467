//! vxlan: one device per family, flannel's `flannel.<VNI>` and `flannel-v6.<VNI>` (no learning, local = the
//! node's public address of that family, bound to the underlay, the subnet's network address /32 or /128 on
//! it, MTU = underlay - 50 over IPv4, - 70 over IPv6), and per peer an onlink route via the peer subnet's
//! network address, a permanent neighbour resolving that address to the peer's VTEP MAC, and an FDB entry
//! sending that MAC to the peer's node. Options: `VNI` (1), `Port` (8472), `DirectRouting`.

use std::io;
use std::net::IpAddr;
use std::sync::Arc;

use cnicore::netlink::{FdbEntry, Link, Neighbour, Vxlan as VxlanSettings};
use ipnet::IpNet;
use serde_json::Value;

use super::contract::{
    direct_if_same_l2, onlink_route, option, Backend, LeaseData, OptionsError, PeerEndpoint, Wanted,
};
use super::device::DeviceContext;
use crate::dataplane::diff::DeviceChange;
use crate::family::Family;
use crate::path::{PeerPath, Refusal, TunnelId};
use crate::underlay::Underlay;

/// flannel's defaults: VNI 1, the kernel's port 8472.
pub const DEFAULT_VNI: u32 = 1;
pub const DEFAULT_PORT: u16 = 8472;
/// Bytes of a vxlan header over IPv4: outer IP 20 + UDP 8 + VXLAN 8 + inner Ethernet 14.
pub const OVERHEAD: u32 = 50;
/// Over IPv6 the outer IP header is 40 bytes: 70.
pub const OVERHEAD_V6: u32 = 70;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VxlanBackend {
    pub vni: u32,
    pub port: u16,
    /// Peers on the same L2 segment get host-gw routes instead.
    pub direct_routing: bool,
}

pub fn parse(options: &Value, _: &super::contract::BackendContext) -> Result<Arc<dyn Backend>, OptionsError> {
    Ok(Arc::new(VxlanBackend {
        vni: option(options, "vxlan", "VNI")?.unwrap_or(DEFAULT_VNI),
        port: option(options, "vxlan", "Port")?.filter(|p| *p != 0).unwrap_or(DEFAULT_PORT),
        direct_routing: option(options, "vxlan", "DirectRouting")?.unwrap_or(false),
    }))
}

/// flannel's lease data (Go's field order).
#[derive(serde::Serialize)]
struct LeaseFields {
    #[serde(rename = "VNI")]
    vni: u32,
    #[serde(rename = "VtepMAC")]
    vtep_mac: String,
}

/// The VTEP MAC a node uses: derived from its public address of the device's family (locally administered,
/// unicast; `0e:fa` and an IPv4 address, `0e:fb` and a 32-bit FNV-1a hash of an IPv6 address), so a device
/// recreated after being deleted keeps its MAC and peers need no update, and static files need not list MACs.
pub fn derived_vtep_mac(public: IpAddr) -> [u8; 6] {
    match public {
        IpAddr::V4(ip) => {
            let [a, b, c, d] = ip.octets();
            [0x0e, 0xfa, a, b, c, d]
        }
        IpAddr::V6(ip) => {
            // FNV-1a of the whole address: nodes of different prefixes often share their last bytes.
            let hash = ip.octets().iter().fold(0x811c_9dc5u32, |h, b| (h ^ u32::from(*b)).wrapping_mul(0x0100_0193));
            let [a, b, c, d] = hash.to_be_bytes();
            [0x0e, 0xfb, a, b, c, d]
        }
    }
}

/// A MAC as flannel writes it (`0e:fa:c0:a8:32:0b`), whatever kind of address it is.
pub fn parse_mac(text: &str) -> Option<[u8; 6]> {
    let bytes: Vec<u8> = text.split(':').map(|part| u8::from_str_radix(part, 16).ok()).collect::<Option<_>>()?;
    bytes.try_into().ok()
}

fn is_unicast_mac(mac: &[u8; 6]) -> bool {
    mac[0] & 1 == 0 && *mac != [0; 6]
}

impl VxlanBackend {
    /// The device as it should be for tunnels from `local`.
    fn settings(&self, local: IpAddr, underlay: &Underlay) -> VxlanSettings {
        VxlanSettings {
            vni: self.vni,
            local: Some(local),
            link: Some(underlay.index),
            port: self.port,
            learning: false,
        }
    }

    /// The device with the right settings: kept, or (re)created. None in a dry run that would create it.
    fn ensure_link(&self, context: &mut DeviceContext, name: &str, mtu: u32) -> io::Result<Option<Link>> {
        let settings = self.settings(context.local, context.underlay);
        let current = context.nl.vxlan_by_name(name)?;
        if let Some((link, Some(current))) = &current {
            if *current == settings {
                return Ok(Some(link.clone()));
            }
        }
        let change = match &current {
            None => DeviceChange::Create {
                name: name.into(),
                kind: "vxlan",
                settings: format!("VNI {}, port {}", self.vni, self.port),
                mtu,
            },
            Some(_) => DeviceChange::Recreate { name: name.into() },
        };
        if !context.change(change) {
            return Ok(None);
        }
        if let Some((link, _)) = current {
            context.nl.delete_link(link.index)?;
        }
        let link = context.nl.create_vxlan(name, Some(mtu), &settings)?;
        context.nl.set_mac(link.index, derived_vtep_mac(context.local))?;
        Ok(Some(link))
    }
}

impl Backend for VxlanBackend {
    fn type_name(&self) -> &'static str {
        "vxlan"
    }

    fn overhead(&self, family: Family) -> u32 {
        match family {
            Family::V4 => OVERHEAD,
            Family::V6 => OVERHEAD_V6,
        }
    }

    fn lease_data(&self, _family: Family, local: IpAddr) -> io::Result<Option<LeaseData>> {
        let mac = cnicore::mac::format(&derived_vtep_mac(local));
        Ok(Some(LeaseData::of(&LeaseFields { vni: self.vni, vtep_mac: mac })))
    }

    fn tunnel_id(&self, _family: Family, data: Option<&Value>) -> Result<Option<TunnelId>, Refusal> {
        let Some(text) = data.and_then(|d| cnicore::spec::gojson::field(d, "VtepMAC")) else { return Ok(None) };
        let mac = text
            .as_str()
            .and_then(parse_mac)
            .ok_or_else(|| Refusal::BadBackendData { why: format!("VtepMAC {text} is not a MAC address") })?;
        if !is_unicast_mac(&mac) {
            return Err(Refusal::BadTunnelId { id: TunnelId::VtepMac(mac), why: "not a unicast address" });
        }
        Ok(Some(TunnelId::VtepMac(mac)))
    }

    fn own_tunnel_id(&self, _family: Family, local: IpAddr) -> Option<TunnelId> {
        Some(TunnelId::VtepMac(derived_vtep_mac(local)))
    }

    fn path(&self, peer: &PeerEndpoint, underlay: &Underlay) -> PeerPath {
        if let Some(direct) = direct_if_same_l2(peer, underlay).filter(|_| self.direct_routing) {
            return direct;
        }
        match peer.id {
            Some(id) => PeerPath::Overlay { endpoint: peer.public_ip, port: None, id: Some(id) },
            None => PeerPath::Refused(Refusal::NoTunnelId {
                public_ip: peer.public_ip,
                backend_type: peer.backend_type.to_string(),
                what: "VtepMAC",
            }),
        }
    }

    fn device_name(&self, family: Family) -> Option<String> {
        Some(match family {
            Family::V4 => format!("flannel.{}", self.vni),
            Family::V6 => format!("flannel-v6.{}", self.vni),
        })
    }

    /// The device's settings, MTU, MAC, the subnet's network address as a host address, up.
    fn ensure_device(&self, mut context: DeviceContext) -> io::Result<Option<u32>> {
        let name = self.device_name(context.family).expect("vxlan has devices");
        let mtu = context.underlay.mtu - self.overhead(Family::of(&context.local));
        let Some(link) = self.ensure_link(&mut context, &name, mtu)? else { return Ok(None) };
        context.mtu(&link, mtu)?;
        context.mac(&link, derived_vtep_mac(context.local))?;
        context.subnet_address(&link)?;
        context.up(&link)?;
        Ok(Some(link.index))
    }

    fn add_peer(&self, wanted: &mut Wanted, index: u32, subnet: IpNet, path: &PeerPath) {
        let PeerPath::Overlay { endpoint, id: Some(TunnelId::VtepMac(vtep_mac)), .. } = *path else { return };
        let tunnel = subnet.network();
        wanted.routes.push(onlink_route(subnet, tunnel, index));
        wanted.neighbours.push(Neighbour::permanent(index, tunnel, vtep_mac));
        wanted.fdb.push(FdbEntry::vxlan(index, vtep_mac, endpoint));
    }

    fn owns_link(&self, name: &str, kind: Option<&str>) -> bool {
        (name.starts_with("flannel.") || name.starts_with("flannel-v6.")) && kind == Some("vxlan")
    }
}
