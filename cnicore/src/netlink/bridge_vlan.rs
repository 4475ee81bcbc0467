//! VLANs of bridge ports (`bridge vlan add/del/show`). They need a bridge with VLAN filtering; a kernel
//! without CONFIG_BRIDGE_VLAN_FILTERING answers EOPNOTSUPP.

use std::io;

use super::link::{link_request, split_link_message, AF_BRIDGE};
use super::wire::{self, attributes, Request};
use super::Netlink;

/// `IFLA_BRIDGE_VLAN_INFO` inside `IFLA_AF_SPEC`: `struct bridge_vlan_info` {flags: u16, vid: u16}.
const IFLA_BRIDGE_VLAN_INFO: u16 = 2;
const BRIDGE_VLAN_INFO_PVID: u16 = 1 << 1;
const BRIDGE_VLAN_INFO_UNTAGGED: u16 = 1 << 2;
/// `IFLA_BR_VLAN_FILTERING` in a bridge's `IFLA_INFO_DATA`.
const IFLA_BR_VLAN_FILTERING: u16 = 7;

/// One VLAN of a bridge port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortVlan {
    pub vid: u16,
    /// Untagged packets entering the port belong to this VLAN.
    pub pvid: bool,
    /// Packets of this VLAN leave the port untagged.
    pub untagged: bool,
}

fn vlan_request(message_type: u16, index: u32, vlan: PortVlan) -> Request {
    let mut flags = 0;
    if vlan.pvid {
        flags |= BRIDGE_VLAN_INFO_PVID;
    }
    if vlan.untagged {
        flags |= BRIDGE_VLAN_INFO_UNTAGGED;
    }
    let mut request = link_request(message_type, AF_BRIDGE, index);
    let spec = request.begin_nested(libc::IFLA_AF_SPEC);
    let mut info = [0; 4];
    info[..2].copy_from_slice(&flags.to_ne_bytes());
    info[2..].copy_from_slice(&vlan.vid.to_ne_bytes());
    request.attr(IFLA_BRIDGE_VLAN_INFO, &info);
    request.end_nested(spec);
    request
}

impl Netlink {
    /// Adds a VLAN to bridge port `index`.
    pub fn bridge_vlan_add(&mut self, index: u32, vlan: PortVlan) -> io::Result<()> {
        self.request_raw(&mut vlan_request(libc::RTM_SETLINK, index, vlan), 0)?;
        Ok(())
    }

    /// Removes VLAN `vid` from bridge port `index`.
    pub fn bridge_vlan_del(&mut self, index: u32, vid: u16) -> io::Result<()> {
        let vlan = PortVlan { vid, pvid: false, untagged: false };
        self.request_raw(&mut vlan_request(libc::RTM_DELLINK, index, vlan), 0)?;
        Ok(())
    }

    /// The VLANs of bridge port `index` (empty when the bridge does not filter VLANs).
    pub fn bridge_vlans(&mut self, index: u32) -> io::Result<Vec<PortVlan>> {
        let mut request = link_request(libc::RTM_GETLINK, AF_BRIDGE, 0);
        request.attr_u32(libc::IFLA_EXT_MASK, libc::RTEXT_FILTER_BRVLAN as u32);
        let ports = self.dump(&mut request, libc::RTM_NEWLINK, |data| {
            let (link_index, _, attrs) = split_link_message(data)?;
            (link_index == index).then(|| port_vlans(attrs))
        })?;
        Ok(ports.into_iter().flatten().collect())
    }

    /// Whether the bridge `name` filters VLANs; None when the kernel does not say (it has no VLAN filtering) or
    /// there is no such link.
    pub fn bridge_vlan_filtering(&mut self, name: &str) -> io::Result<Option<bool>> {
        Ok(self.link_message_by_name(name, |data| Some(vlan_filtering_of(data)))?.flatten())
    }
}

/// Whether the bridge of an `RTM_NEWLINK` payload filters VLANs (`IFLA_BR_VLAN_FILTERING` in its
/// `IFLA_INFO_DATA`); None when the kernel does not say (built without CONFIG_BRIDGE_VLAN_FILTERING, or not a
/// bridge).
fn vlan_filtering_of(data: &[u8]) -> Option<bool> {
    let (_, _, attrs) = split_link_message(data)?;
    let (_, info) = attributes(attrs).find(|(kind, _)| *kind == libc::IFLA_LINKINFO)?;
    let (_, bridge) = attributes(info).find(|(kind, _)| *kind == libc::IFLA_INFO_DATA)?;
    let (_, value) = attributes(bridge).find(|(kind, _)| *kind == IFLA_BR_VLAN_FILTERING)?;
    Some(wire::as_u8(value)? != 0)
}

/// The VLANs in the `IFLA_AF_SPEC` attributes of a bridge port's link message.
fn port_vlans(attrs: &[u8]) -> Vec<PortVlan> {
    let mut vlans = Vec::new();
    for (_, specs) in attributes(attrs).filter(|(kind, _)| *kind == libc::IFLA_AF_SPEC) {
        for (_, info) in attributes(specs).filter(|(kind, _)| *kind == IFLA_BRIDGE_VLAN_INFO) {
            let (Some(flags), Some(vid)) = (info.get(..2), info.get(2..4)) else { continue };
            let (flags, vid) = (wire::as_u16(flags).unwrap_or(0), wire::as_u16(vid).unwrap_or(0));
            vlans.push(PortVlan {
                vid,
                pvid: flags & BRIDGE_VLAN_INFO_PVID != 0,
                untagged: flags & BRIDGE_VLAN_INFO_UNTAGGED != 0,
            });
        }
    }
    vlans
}

#[cfg(test)]
mod tests {
    use netlink_packet_route::link::{
        AfSpecBridge, BridgeVlanInfo, BridgeVlanInfoFlags, InfoBridge, InfoData, InfoKind, LinkAttribute,
        LinkExtentMask, LinkInfo, LinkMessage,
    };
    use netlink_packet_route::AddressFamily;

    use super::*;
    use crate::netlink::wire::emitted;

    #[test]
    fn requests_like_netlink_packet_route() {
        let request = vlan_request(libc::RTM_SETLINK, 6, PortVlan { vid: 100, pvid: true, untagged: true });
        let mut expected = LinkMessage::default();
        expected.header.interface_family = AddressFamily::Bridge;
        expected.header.index = 6;
        let flags = BridgeVlanInfoFlags::Pvid | BridgeVlanInfoFlags::Untagged;
        let info = AfSpecBridge::VlanInfo(BridgeVlanInfo { flags, vid: 100 });
        expected.attributes.push(LinkAttribute::AfSpecBridge(vec![info]));
        assert_eq!(request.payload(), emitted(&expected));

        let mut request = link_request(libc::RTM_GETLINK, AF_BRIDGE, 0);
        request.attr_u32(libc::IFLA_EXT_MASK, libc::RTEXT_FILTER_BRVLAN as u32);
        let mut expected = LinkMessage::default();
        expected.header.interface_family = AddressFamily::Bridge;
        expected.attributes.push(LinkAttribute::ExtMask(vec![LinkExtentMask::Brvlan]));
        assert_eq!(request.payload(), emitted(&expected));
    }

    #[test]
    fn vlan_filtering_is_read_from_the_bridge_data() {
        let bridge = |data: Vec<InfoBridge>| {
            let mut message = LinkMessage::default();
            let info = vec![LinkInfo::Kind(InfoKind::Bridge), LinkInfo::Data(InfoData::Bridge(data))];
            message.attributes.push(LinkAttribute::LinkInfo(info));
            emitted(&message)
        };
        assert_eq!(vlan_filtering_of(&bridge(vec![InfoBridge::VlanFiltering(true)])), Some(true));
        let off = vec![InfoBridge::HelloTime(200), InfoBridge::VlanFiltering(false), InfoBridge::Priority(5)];
        assert_eq!(vlan_filtering_of(&bridge(off)), Some(false));
        assert_eq!(vlan_filtering_of(&bridge(vec![InfoBridge::HelloTime(200)])), None, "a kernel without it");
        assert_eq!(vlan_filtering_of(&emitted(&LinkMessage::default())), None);
    }
}
