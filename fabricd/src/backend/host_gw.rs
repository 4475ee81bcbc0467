//! host-gw: a peer's subnet is routed via its node address on the underlay (the peer shares its L2 segment).

use std::net::Ipv4Addr;

use cnicore::netlink::{Route, RT_TABLE_MAIN};
use ipnet::{IpNet, Ipv4Net};

use crate::dataplane::{Underlay, ROUTE_PROTOCOL};

/// The route to `subnet` via `gateway` out of the underlay interface.
pub fn route(subnet: Ipv4Net, gateway: Ipv4Addr, underlay: &Underlay) -> Route {
    Route {
        dst: IpNet::V4(subnet),
        gateway: Some(gateway.into()),
        oif: Some(underlay.index),
        protocol: Some(ROUTE_PROTOCOL),
        table: Some(RT_TABLE_MAIN),
        ..Route::default()
    }
}
