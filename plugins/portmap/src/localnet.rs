//! `route_localnet` on the host interface towards the container, so that connections from 127.0.0.1 to a host
//! port can be DNATed to the pod (127/8 may then cross a routing boundary), as the reference does when snat
//! is on.

use std::net::IpAddr;

use cnicore::netlink::{Netlink, RouteNetlinkMessage};
use cnicore::spec::{Error, Result};
use netlink_packet_route::route::{RouteAddress, RouteAttribute, RouteMessage};
use netlink_packet_route::AddressFamily;

/// The interface the node routes `container` through (`ip route get`), if any.
fn routing_interface(netlink: &mut Netlink, container: IpAddr) -> Option<String> {
    let mut message = RouteMessage::default();
    match container {
        IpAddr::V4(ip) => {
            message.header.address_family = AddressFamily::Inet;
            message.header.destination_prefix_length = 32;
            message.attributes.push(RouteAttribute::Destination(RouteAddress::Inet(ip)));
        }
        IpAddr::V6(ip) => {
            message.header.address_family = AddressFamily::Inet6;
            message.header.destination_prefix_length = 128;
            message.attributes.push(RouteAttribute::Destination(RouteAddress::Inet6(ip)));
        }
    }
    let replies = netlink.request(RouteNetlinkMessage::GetRoute(message), 0).ok()?;
    let index = replies.iter().find_map(|reply| match reply {
        RouteNetlinkMessage::NewRoute(route) => route.attributes.iter().find_map(|a| match a {
            RouteAttribute::Oif(index) => Some(*index),
            _ => None,
        }),
        _ => None,
    })?;
    netlink.link_by_index(index).ok().flatten().map(|link| link.name)
}

/// Sets `net.ipv4.conf.<if>.route_localnet=1` on the interface routing to `container`. Like the reference, a
/// container address without a route is skipped.
pub fn enable(container: IpAddr) -> Result<()> {
    let mut netlink = Netlink::new().map_err(|e| Error::os("opening a netlink socket", e))?;
    let Some(interface) = routing_interface(&mut netlink, container) else {
        return Ok(());
    };
    cnicore::sysctl::write_if_different(&format!("net/ipv4/conf/{interface}/route_localnet"), "1")
        .map(|_| ())
        .map_err(|e| Error::os(format!("unable to enable route_localnet on {interface}"), e))
}
