//! `route_localnet` on the host interface towards the container, so that connections from 127.0.0.1 to a host
//! port can be DNATed to the pod (127/8 may then cross a routing boundary), as the reference does when snat
//! is on.

use std::net::IpAddr;

use cnicore::netlink::Netlink;
use cnicore::spec::{ErrorContext, Result};

/// The interface the node routes `container` through (`ip route get`), if any.
fn routing_interface(netlink: &mut Netlink, container: IpAddr) -> Option<String> {
    let index = netlink.route_get_oif(container).ok().flatten()?;
    netlink.link_by_index(index).ok().flatten().map(|link| link.name)
}

/// Sets `net.ipv4.conf.<if>.route_localnet=1` on the interface routing to `container`. Like the reference, a
/// container address without a route is skipped.
pub fn enable(container: IpAddr) -> Result<()> {
    let mut netlink = Netlink::new().context("opening a netlink socket")?;
    let Some(interface) = routing_interface(&mut netlink, container) else {
        return Ok(());
    };
    cnicore::sysctl::write_if_different(&format!("net/ipv4/conf/{interface}/route_localnet"), "1")
        .map(|_| ())
        .with_context(|| format!("unable to enable route_localnet on {interface}"))
}
