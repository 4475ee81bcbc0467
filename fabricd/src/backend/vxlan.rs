//! vxlan: one device per family, flannel's `flannel.<VNI>` and `flannel-v6.<VNI>` (local = the node's public
//! address of that family, bound to the underlay, the subnet's network address /32 or /128 on it), and per
//! peer an onlink route via the peer subnet's network address, a permanent neighbour resolving that address
//! to the peer's VTEP MAC, and an FDB entry sending that MAC to the peer's node.
//!
//! Options, as flannel v0.28 reads them: `VNI` (1), `Port` (8472), `DirectRouting`, `MTU` (the size of the
//! packets sent on the underlay, default the underlay's MTU: the device's MTU is it less 50 over IPv4, less 70
//! over IPv6; flanneld takes 50 for both), `GBP` (the device's Group Based Policy flag) and `Learning` (the
//! device learns remote MACs from received packets; as flanneld, the neighbour and FDB entries of every peer
//! are still programmed, so learning only adds entries for MACs no lease names).
use std::io;
use std::net::IpAddr;
use std::sync::Arc;

use cnicore::netlink::{FdbEntry, Link, Neighbour, Vxlan as VxlanSettings};
use ipnet::IpNet;
use serde_json::Value;

use super::contract::{
    direct_if_same_l2, mtu_option, onlink_route, option, packet_mtu, Backend, BackendContext, LeaseData, OptionsError,
    PeerEndpoint, Wanted,
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
    /// `MTU`: the packets' size on the underlay (None: the underlay's MTU).
    pub mtu: Option<u32>,
    /// `GBP`: the device's Group Based Policy extension.
    pub gbp: bool,
    /// `Learning`: the device learns MACs from received packets.
    pub learning: bool,
}

pub fn parse(options: &Value, context: &BackendContext) -> Result<Arc<dyn Backend>, OptionsError> {
    Ok(Arc::new(VxlanBackend {
        vni: option(options, "vxlan", "VNI")?.unwrap_or(DEFAULT_VNI),
        port: option(options, "vxlan", "Port")?.filter(|p| *p != 0).unwrap_or(DEFAULT_PORT),
        direct_routing: option(options, "vxlan", "DirectRouting")?.unwrap_or(false),
        mtu: mtu_option(options, "vxlan", OVERHEAD_V6, context)?,
        gbp: option(options, "vxlan", "GBP")?.unwrap_or(false),
        learning: option(options, "vxlan", "Learning")?.unwrap_or(false),
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
            learning: self.learning,
            gbp: self.gbp,
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
                settings: format!(
                    "VNI {}, port {}{}{}",
                    self.vni,
                    self.port,
                    if self.gbp { ", gbp" } else { "" },
                    if self.learning { ", learning" } else { "" }
                ),
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

    fn configured_mtu(&self) -> Option<u32> {
        self.mtu
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
        let mtu = packet_mtu(self, context.underlay) - self.overhead(Family::of(context.local));
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::pod_mtu;

    fn parsed(options: Value, underlay_mtu: Option<u32>) -> Result<Arc<dyn Backend>, OptionsError> {
        parse(&options, &BackendContext { underlay_mtu, ..BackendContext::default() })
    }

    #[test]
    fn flannels_mtu_gbp_and_learning() {
        let all =
            parsed(serde_json::json!({ "Type": "vxlan", "mtu": 1400, "gbp": true, "Learning": true }), Some(1500))
                .unwrap();
        assert_eq!(
            format!("{all:?}"),
            "VxlanBackend { vni: 1, port: 8472, direct_routing: false, mtu: Some(1400), gbp: true, learning: true }"
        );
        let underlay = Underlay::example();
        // flanneld's FLANNEL_MTU: the option less the tunnel's headers (over IPv6: 70 here, 50 in flanneld).
        assert_eq!(pod_mtu(&*all, [Family::V4].into_iter(), &underlay), 1350);
        assert_eq!(pod_mtu(&*all, Family::ALL.into_iter(), &underlay), 1330);
        // 0 and null: the underlay's (flannel's default), as the other numeric options.
        for options in [serde_json::json!({ "MTU": 0 }), serde_json::json!({ "MTU": null }), serde_json::json!({})] {
            let backend = parsed(options, Some(1500)).unwrap();
            assert_eq!(backend.configured_mtu(), None);
            assert_eq!(pod_mtu(&*backend, [Family::V4].into_iter(), &underlay), underlay.mtu - OVERHEAD);
        }
        // The largest the underlay takes; unchecked without an underlay (status, cleanup).
        assert!(parsed(serde_json::json!({ "MTU": 1500 }), Some(1500)).is_ok());
        assert!(parsed(serde_json::json!({ "MTU": 9000 }), None).is_ok());
    }

    #[test]
    fn bad_values_name_the_key() {
        for (options, key, says) in [
            (serde_json::json!({ "MTU": 1501 }), "MTU", "more than the underlay interface's MTU 1500"),
            (serde_json::json!({ "MTU": 137 }), "MTU", "at least 138"),
            (serde_json::json!({ "MTU": -1 }), "MTU", "invalid value"),
            (serde_json::json!({ "MTU": "1400" }), "MTU", "invalid type"),
            (serde_json::json!({ "GBP": "yes" }), "GBP", "invalid type"),
            (serde_json::json!({ "Learning": 1 }), "Learning", "invalid type"),
        ] {
            let error = parsed(options.clone(), Some(1500)).unwrap_err();
            assert!(matches!(&error, OptionsError::BadOption { key: k, .. } if *k == key), "{options}: {error}");
            let text = error.to_string();
            assert!(text.starts_with(&format!("vxlan backend: {key}: ")) && text.contains(says), "{options}: {text}");
        }
        assert!(parsed(serde_json::json!({ "MTU": 138 }), Some(1500)).is_ok(), "68 bytes left over IPv6");
    }
}
