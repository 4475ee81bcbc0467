//! vxlan: one device per family, flannel's `flannel.<VNI>` and `flannel-v6.<VNI>` (no learning, local = the
//! node's public address of that family, bound to the underlay, the subnet's network address /32 or /128 on
//! it, MTU = underlay - 50 over IPv4, - 70 over IPv6), and per peer an onlink route via the peer subnet's
//! network address, a permanent neighbour resolving that address to the peer's VTEP MAC, and an FDB entry
//! sending that MAC to the peer's node.

use std::io;
use std::net::IpAddr;

use cnicore::netlink::{FdbEntry, Neighbour, Netlink, Route, Vxlan, RT_TABLE_MAIN};
use ipnet::IpNet;

use super::Wanted;
use crate::dataplane::diff::{Change, DeviceChange};
use crate::dataplane::{Underlay, ROUTE_PROTOCOL};
use crate::flannel::{Family, NetworkConfig};
use crate::source::derived_vtep_mac;

/// Adds what one overlay peer needs on the device `index`.
pub fn add_peer(wanted: &mut Wanted, index: u32, subnet: IpNet, vtep_mac: [u8; 6], endpoint: IpAddr) {
    let tunnel = subnet.network();
    wanted.routes.push(Route {
        dst: subnet,
        gateway: Some(tunnel),
        oif: Some(index),
        onlink: true,
        protocol: Some(ROUTE_PROTOCOL),
        table: Some(RT_TABLE_MAIN),
        ..Route::default()
    });
    wanted.neighbours.push(Neighbour::permanent(index, tunnel, vtep_mac));
    wanted.fdb.push(FdbEntry::vxlan(index, vtep_mac, endpoint));
}

/// Makes `family`'s device right (settings, MTU, MAC, up, the subnet's network address as a host address) for
/// tunnels from `local`; its index. In a dry run, only says what differs, and None when the device is missing.
#[allow(clippy::too_many_arguments)]
pub fn ensure_device(
    nl: &mut Netlink,
    config: &NetworkConfig,
    family: Family,
    subnet: IpNet,
    underlay: &Underlay,
    local: IpAddr,
    dry_run: bool,
    changes: &mut Vec<Change>,
) -> io::Result<Option<u32>> {
    let name = config.vxlan_device(family);
    let vtep_mac = derived_vtep_mac(local);
    let settings =
        Vxlan { vni: config.vni, local: Some(local), link: Some(underlay.index), port: config.port, learning: false };
    let mtu = underlay.mtu - Family::of(&local).vxlan_overhead();
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
    let address = IpNet::new(subnet.network(), family.bits()).expect("valid");
    let addresses = nl.addresses(Some(link.index))?;
    // The kernel gives an IPv6 device its own link-local address: not ours to remove.
    let ours = |a: &IpNet| Family::of(&a.addr()) == family && !crate::dataplane::is_link_local(a);
    for other in addresses.iter().filter(|a| ours(&a.addr) && a.addr != address) {
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
