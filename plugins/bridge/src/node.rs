//! The node side: the bridge, the pods' host veths as its ports, the gateway addresses, node sysctls.

use std::io;

use cnicore::netlink::{is_exists, is_not_found, InfoBridge, Link, Netlink, PortVlan};
use cnicore::spec::{Error, ErrorContext, Result};
use cnicore::sysctl;
use ipnet::IpNet;

use crate::config::Config;

/// Bound on a new IPv6 gateway address leaving the tentative state.
const GATEWAY_SETTLE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

pub fn is_bridge(link: &Link) -> bool {
    link.kind.as_deref() == Some("bridge")
}

fn not_a_bridge(name: &str) -> Error {
    Error::config(format!("{name:?} already exists but is not a bridge"))
}

fn vlan_unsupported(e: &io::Error) -> Error {
    Error::config(format!(
        "vlan and vlanTrunk need a bridge with VLAN filtering, which this kernel refused ({e}); \
         it may lack CONFIG_BRIDGE_VLAN_FILTERING"
    ))
}

/// Sets a sysctl when it differs, ignoring failures: used for settings the reference plugin also treats as
/// best effort (e.g. `accept_ra` of a link whose IPv6 is disabled has no file).
pub fn sysctl_best_effort(name: &str, value: &str) {
    if let Err(e) = sysctl::write_if_different(name, value) {
        if e.kind() != io::ErrorKind::NotFound {
            cnicore::warn!("sysctl {name}={value}: {e}");
        }
    }
}

/// Sets a sysctl that must be set.
pub fn sysctl_required(name: &str, value: &str) -> Result<()> {
    sysctl::write_if_different(name, value).map(|_| ()).with_context(|| format!("failed to set {name}={value}"))
}

/// Finds the bridge or creates it (with `mtu`), tolerating a concurrent ADD creating it at the same moment,
/// then makes sure it is a bridge, promiscuous if asked, and up.
pub fn ensure_bridge(nl: &mut Netlink, conf: &Config, existing: Option<Link>, mtu: u32) -> Result<Link> {
    let bridge = match existing {
        Some(link) => link,
        None => {
            let options = if conf.uses_vlans() { vec![InfoBridge::VlanFiltering(true)] } else { Vec::new() };
            match nl.create_bridge_with(&conf.bridge, Some(mtu), options) {
                Ok(link) => {
                    // We own the routes of this interface, not router advertisements.
                    sysctl_best_effort(&format!("net/ipv6/conf/{}/accept_ra", conf.bridge), "0");
                    link
                }
                Err(e) if is_exists(&e) => nl
                    .link_by_name(&conf.bridge)
                    .with_context(|| format!("could not look up {:?}", conf.bridge))?
                    .ok_or_else(|| {
                        Error::internal(format!("bridge {:?} vanished right after being created", conf.bridge))
                    })?,
                Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) && conf.uses_vlans() => {
                    return Err(vlan_unsupported(&e))
                }
                Err(e) => return Err(Error::os(format!("failed to create bridge {:?}", conf.bridge), e)),
            }
        }
    };
    if !is_bridge(&bridge) {
        return Err(not_a_bridge(&conf.bridge));
    }
    if conf.promisc && !bridge.promisc {
        nl.set_promisc(bridge.index, true)
            .with_context(|| format!("could not set promiscuous mode on {:?}", conf.bridge))?;
    }
    if !bridge.up {
        nl.set_up(bridge.index).with_context(|| format!("failed to set {:?} up", conf.bridge))?;
    }
    Ok(bridge)
}

/// vlan or vlanTrunk on a bridge that exists without VLAN filtering: refused before anything changes. The kernel
/// takes the ports' VLANs there but does not enforce them, so pods of different VLANs would reach each other (the
/// reference makes it so); turning filtering on would change the bridge under its other ports and its uplink.
/// A kernel that does not report filtering has none: the VLAN step says so.
pub fn require_vlan_filtering(nl: &mut Netlink, bridge: &Link) -> Result<()> {
    let filtering =
        nl.bridge_vlan_filtering(&bridge.name).with_context(|| format!("could not look up {:?}", bridge.name))?;
    if filtering == Some(false) {
        return Err(Error::config(format!(
            "vlan and vlanTrunk need a bridge that filters VLANs, and {:?} exists without VLAN filtering (its \
             pods of different VLANs would reach each other): turn it on (ip link set {} type bridge \
             vlan_filtering 1) or name another bridge",
            bridge.name, bridge.name
        )));
    }
    Ok(())
}

/// Checks, without changing anything, that `name` is free or a bridge.
pub fn check_bridge_name(existing: Option<&Link>, name: &str) -> Result<()> {
    match existing {
        Some(link) if !is_bridge(link) => Err(not_a_bridge(name)),
        _ => Ok(()),
    }
}

/// Makes `port` a port of `bridge` with the configured port options, and brings it up.
pub fn attach_port(
    nl: &mut Netlink,
    port: &Link,
    bridge: &Link,
    conf: &Config,
    vlan: Option<u16>,
    trunk: &[u16],
) -> Result<()> {
    let name = &port.name;
    nl.set_master(port.index, bridge.index)
        .with_context(|| format!("failed to connect {name:?} to bridge {:?}", bridge.name))?;
    if conf.hairpin {
        nl.set_hairpin(port.index, true).with_context(|| format!("failed to set hairpin mode on {name:?}"))?;
    }
    if conf.port_isolation {
        nl.set_port_isolated(port.index, true).with_context(|| format!("failed to set port isolation on {name:?}"))?;
    }
    if vlan.is_some() || !trunk.is_empty() {
        set_port_vlans(nl, port, vlan, trunk, conf.preserve_default_vlan)?;
    }
    sysctl_best_effort(&format!("net/ipv6/conf/{name}/accept_ra"), "0");
    nl.set_up(port.index).with_context(|| format!("failed to set {name:?} up"))
}

/// The VLANs of a pod's port, as reference v1.8+ sets them: `vlan` untagged and PVID (the access VLAN, or the
/// native VLAN of a trunk), then each `vlanTrunk` ID tagged. An ID in both stays the native one (adding it again
/// as tagged would clear its PVID and untagged flags).
pub fn port_vlans(vlan: Option<u16>, trunk: &[u16]) -> Vec<PortVlan> {
    let native = vlan.map(|vid| PortVlan { vid, pvid: true, untagged: true });
    let tagged =
        trunk.iter().filter(|&&vid| Some(vid) != vlan).map(|&vid| PortVlan { vid, pvid: false, untagged: false });
    native.into_iter().chain(tagged).collect()
}

/// Access port (`vlan`), trunk port (`trunk`), or a trunk with a native VLAN (both); see [`port_vlans`].
/// Unless `preserve_default` (reference v1.8+: false by default), the VLANs the kernel gave the new port (the
/// bridge's default PVID) are removed first.
fn set_port_vlans(
    nl: &mut Netlink,
    port: &Link,
    vlan: Option<u16>,
    trunk: &[u16],
    preserve_default: bool,
) -> Result<()> {
    let refused = |e: io::Error| {
        if e.raw_os_error() == Some(libc::EOPNOTSUPP) {
            vlan_unsupported(&e)
        } else {
            Error::os(format!("failed to set up VLANs on {:?}", port.name), e)
        }
    };
    if !preserve_default {
        for existing in nl.bridge_vlans(port.index).map_err(refused)? {
            nl.bridge_vlan_del(port.index, existing.vid).map_err(refused)?;
        }
    }
    for port_vlan in port_vlans(vlan, trunk) {
        nl.bridge_vlan_add(port.index, port_vlan).map_err(refused)?;
    }
    Ok(())
}

/// The interface that carries the gateway address of VLAN `vid`: a veth `<bridge>.<vid>` whose peer is an
/// access port of the bridge in that VLAN (as the reference plugin does). Created on first use.
pub fn ensure_vlan_interface(nl: &mut Netlink, bridge: &Link, conf: &Config, vid: u16, mtu: u32) -> Result<Link> {
    let name = format!("{}.{vid}", bridge.name);
    if let Some(link) = nl.link_by_name(&name).with_context(|| format!("failed to find {name:?}"))? {
        return Ok(link);
    }
    let node_ns = nl.netns().try_clone().context("failed to open the node namespace")?;
    let peer_name = cnicore::podlink::random_veth_name()?;
    let link = match nl.create_veth(&name, &peer_name, &node_ns, Some(mtu), None) {
        Ok(link) => link,
        Err(e) if is_exists(&e) => return nl.require_link(&name).with_context(|| format!("failed to find {name:?}")),
        Err(e) => return Err(Error::os(format!("failed to create VLAN gateway {name:?}"), e)),
    };
    let peer = nl.require_link(&peer_name).with_context(|| format!("failed to find {peer_name:?}"))?;
    let port_conf = Config { hairpin: false, port_isolation: false, ..conf.clone() };
    attach_port(nl, &peer, bridge, &port_conf, Some(vid), &[])?;
    nl.set_up(link.index).with_context(|| format!("failed to set {name:?} up"))?;
    Ok(link)
}

/// Puts gateway address `gw` on `link` (the bridge), as the reference's ensureAddr: an IPv4 address other
/// than `gw`, or an overlapping IPv6 one, is an error unless `force` (then it is replaced).
pub fn ensure_gateway_address(nl: &mut Netlink, link: &Link, gw: IpNet, force: bool) -> Result<()> {
    let addresses = nl
        .addresses(Some(link.index))
        .with_context(|| format!("could not get list of IP addresses of {:?}", link.name))?;
    let present = addresses.iter().any(|a| a.addr == gw);
    if !present {
        for existing in addresses.iter().filter(|a| a.addr.addr().is_ipv4() == gw.addr().is_ipv4()) {
            let conflicts =
                gw.addr().is_ipv4() || existing.addr.contains(&gw.addr()) || gw.contains(&existing.addr.addr());
            if !conflicts {
                continue;
            }
            if !force {
                return Err(Error::internal(format!("{:?} already has an IP address different from {gw}", link.name)));
            }
            match nl.del_address(link.index, existing.addr) {
                Ok(()) => {}
                Err(e) if is_not_found(&e) => {}
                Err(e) => return Err(Error::os(format!("could not remove IP address from {:?}", link.name), e)),
            }
        }
        if gw.addr().is_ipv6() {
            // The gateway is ours by definition: no duplicate address detection on the bridge.
            sysctl_best_effort(&format!("net/ipv6/conf/{}/accept_dad", link.name), "0");
        }
        // Pin the bridge's MAC: otherwise it follows the lowest MAC among its ports and changes as pods come
        // and go. Before the address, so that an ADD killed in between leaves it pinned. A bridge whose ports
        // all left before it was pinned (an ADD killed after attaching its port) has the all-zero MAC, which
        // cannot be set: it then pins the MAC it took from the new port.
        let mac = match link.mac.filter(usable_mac) {
            Some(mac) => Some(mac),
            None => nl
                .link_by_index(link.index)
                .with_context(|| format!("could not look up {:?}", link.name))?
                .and_then(|now| now.mac)
                .filter(usable_mac),
        };
        if let Some(mac) = mac {
            nl.set_mac(link.index, mac).with_context(|| format!("could not set {:?}'s MAC", link.name))?;
        }
        match nl.add_address(link.index, gw) {
            Ok(()) => {}
            Err(e) if is_exists(&e) => {}
            Err(e) => return Err(Error::os(format!("could not add IP address to {:?}", link.name), e)),
        }
    }
    if gw.addr().is_ipv6() {
        // Until the address has left the tentative state, the bridge drops neighbour solicitations for it.
        nl.wait_address_settled(link.index, gw.addr(), GATEWAY_SETTLE_TIMEOUT)
            .with_context(|| format!("gateway address {gw} on {:?}", link.name))?;
    }
    Ok(())
}

/// A MAC a bridge can be given: not all-zero, not multicast.
fn usable_mac(mac: &[u8; 6]) -> bool {
    *mac != [0; 6] && mac[0] & 1 == 0
}

/// IP forwarding for the families the node routes pod traffic for.
pub fn enable_forwarding(v4: bool, v6: bool) -> Result<()> {
    if v4 {
        sysctl_required("net/ipv4/ip_forward", "1")?;
    }
    if v6 {
        sysctl_required("net/ipv6/conf/all/forwarding", "1")?;
    }
    Ok(())
}

#[cfg(test)]
mod vlan_tests {
    use super::*;

    fn v(vid: u16, native: bool) -> PortVlan {
        PortVlan { vid, pvid: native, untagged: native }
    }

    #[test]
    fn port_vlans_as_reference_v1_8() {
        assert_eq!(port_vlans(Some(100), &[]), [v(100, true)]);
        assert_eq!(port_vlans(None, &[200, 300]), [v(200, false), v(300, false)]);
        // v1.8: vlan and vlanTrunk together make a trunk whose native VLAN is `vlan`.
        assert_eq!(port_vlans(Some(100), &[200, 300]), [v(100, true), v(200, false), v(300, false)]);
        assert_eq!(port_vlans(Some(200), &[200, 300]), [v(200, true), v(300, false)]);
        assert!(port_vlans(None, &[]).is_empty());
    }
}
