//! vxlan: flannel's `flannel.<VNI>` device (no learning, local = the public address, bound to the underlay,
//! the subnet's network address /32 on it), and per peer an onlink route via the peer subnet's network
//! address, a permanent neighbour resolving that address to the peer's VTEP MAC, and an FDB entry sending
//! that MAC to the peer's node.

use std::io;
use std::net::{IpAddr, Ipv4Addr};

use cnicore::netlink::{FdbEntry, Neighbour, Netlink, Route, Vxlan, RT_TABLE_MAIN};
use ipnet::{IpNet, Ipv4Net};

use super::Wanted;
use crate::dataplane::diff::{Change, DeviceChange};
use crate::dataplane::{Underlay, ROUTE_PROTOCOL};
use crate::flannel::{NetworkConfig, VXLAN_OVERHEAD};

/// Adds what one overlay peer needs on the device `index`.
pub fn add_peer(wanted: &mut Wanted, index: u32, subnet: Ipv4Net, vtep_mac: [u8; 6], endpoint: Ipv4Addr) {
    let tunnel = IpAddr::V4(subnet.network());
    wanted.routes.push(Route {
        dst: IpNet::V4(subnet),
        gateway: Some(tunnel),
        oif: Some(index),
        onlink: true,
        protocol: Some(ROUTE_PROTOCOL),
        table: Some(RT_TABLE_MAIN),
        ..Route::default()
    });
    wanted.neighbours.push(Neighbour::permanent(index, tunnel, vtep_mac));
    wanted.fdb.push(FdbEntry::vxlan(index, vtep_mac, IpAddr::V4(endpoint)));
}

/// Makes the device right (settings, MTU, MAC, up, the subnet's /32 address); its index. In a dry run, only
/// says what differs, and None when the device is missing.
pub fn ensure_device(
    nl: &mut Netlink,
    config: &NetworkConfig,
    subnet: Ipv4Net,
    underlay: &Underlay,
    vtep_mac: [u8; 6],
    dry_run: bool,
    changes: &mut Vec<Change>,
) -> io::Result<Option<u32>> {
    let name = config.vxlan_device();
    let settings = Vxlan {
        vni: config.vni,
        local: Some(underlay.public_ip),
        link: Some(underlay.index),
        port: config.port,
        learning: false,
    };
    let mtu = underlay.mtu - VXLAN_OVERHEAD;
    let mut change = |change: DeviceChange| changes.push(Change::Device(change));
    let link = match nl.vxlan_by_name(&name)? {
        Some((link, Some(current))) if current == settings => link,
        other => {
            change(match &other {
                None => DeviceChange::Create { name: name.clone(), vni: config.vni, port: config.port, mtu },
                Some(_) => DeviceChange::Recreate { name: name.clone() },
            });
            if dry_run {
                return Ok(None);
            }
            if let Some((link, _)) = other {
                nl.delete_link(link.index)?;
            }
            let link = nl.create_vxlan(&name, Some(mtu), &settings)?;
            nl.set_mac(link.index, vtep_mac)?;
            link
        }
    };
    if link.mtu != mtu {
        change(DeviceChange::Mtu { name: name.clone(), from: link.mtu, to: mtu });
        if !dry_run {
            nl.set_mtu(link.index, mtu)?;
        }
    }
    if link.mac != Some(vtep_mac) {
        change(DeviceChange::Mac { name: name.clone(), mac: vtep_mac });
        if !dry_run {
            nl.set_mac(link.index, vtep_mac)?;
        }
    }
    let address = IpNet::V4(Ipv4Net::new(subnet.network(), 32).expect("valid"));
    let addresses = nl.addresses(Some(link.index))?;
    for other in addresses.iter().filter(|a| a.addr.addr().is_ipv4() && a.addr != address) {
        change(DeviceChange::RemoveAddress { name: name.clone(), address: other.addr });
        if !dry_run {
            nl.del_address(link.index, other.addr)?;
        }
    }
    if !addresses.iter().any(|a| a.addr == address) {
        change(DeviceChange::Address { name: name.clone(), address });
        if !dry_run {
            nl.add_address(link.index, address)?;
        }
    }
    if !link.up {
        change(DeviceChange::Up { name: name.clone() });
        if !dry_run {
            nl.set_up(link.index)?;
        }
    }
    Ok(Some(link.index))
}
