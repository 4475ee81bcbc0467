//! VLANs of bridge ports (`bridge vlan add/del/show`). They need a bridge with VLAN filtering; a kernel
//! without CONFIG_BRIDGE_VLAN_FILTERING answers EOPNOTSUPP.

use std::io;

use netlink_packet_core::NLM_F_DUMP;
use netlink_packet_route::link::{
    AfSpecBridge, BridgeVlanInfo, BridgeVlanInfoFlags, LinkAttribute, LinkExtentMask, LinkMessage,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};

use super::Netlink;

/// One VLAN of a bridge port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortVlan {
    pub vid: u16,
    /// Untagged packets entering the port belong to this VLAN.
    pub pvid: bool,
    /// Packets of this VLAN leave the port untagged.
    pub untagged: bool,
}

fn vlan_message(index: u32, vlan: PortVlan) -> LinkMessage {
    let mut flags = BridgeVlanInfoFlags::empty();
    if vlan.pvid {
        flags |= BridgeVlanInfoFlags::Pvid;
    }
    if vlan.untagged {
        flags |= BridgeVlanInfoFlags::Untagged;
    }
    let mut message = LinkMessage::default();
    message.header.interface_family = AddressFamily::Bridge;
    message.header.index = index;
    let info = AfSpecBridge::VlanInfo(BridgeVlanInfo { flags, vid: vlan.vid });
    message.attributes.push(LinkAttribute::AfSpecBridge(vec![info]));
    message
}

impl Netlink {
    /// Adds a VLAN to bridge port `index`.
    pub fn bridge_vlan_add(&mut self, index: u32, vlan: PortVlan) -> io::Result<()> {
        self.request(RouteNetlinkMessage::SetLink(vlan_message(index, vlan)), 0)?;
        Ok(())
    }

    /// Removes VLAN `vid` from bridge port `index`.
    pub fn bridge_vlan_del(&mut self, index: u32, vid: u16) -> io::Result<()> {
        let vlan = PortVlan { vid, pvid: false, untagged: false };
        self.request(RouteNetlinkMessage::DelLink(vlan_message(index, vlan)), 0)?;
        Ok(())
    }

    /// The VLANs of bridge port `index` (empty when the bridge does not filter VLANs).
    pub fn bridge_vlans(&mut self, index: u32) -> io::Result<Vec<PortVlan>> {
        let mut message = LinkMessage::default();
        message.header.interface_family = AddressFamily::Bridge;
        message.attributes.push(LinkAttribute::ExtMask(vec![LinkExtentMask::Brvlan]));
        let replies = self.request(RouteNetlinkMessage::GetLink(message), NLM_F_DUMP)?;
        let mut vlans = Vec::new();
        for reply in replies {
            let RouteNetlinkMessage::NewLink(link) = reply else { continue };
            if link.header.index != index {
                continue;
            }
            for attribute in &link.attributes {
                let LinkAttribute::AfSpecBridge(specs) = attribute else { continue };
                for spec in specs {
                    if let AfSpecBridge::VlanInfo(info) = spec {
                        vlans.push(PortVlan {
                            vid: info.vid,
                            pvid: info.flags.contains(BridgeVlanInfoFlags::Pvid),
                            untagged: info.flags.contains(BridgeVlanInfoFlags::Untagged),
                        });
                    }
                }
            }
        }
        Ok(vlans)
    }
}
