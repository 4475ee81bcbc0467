//! host-gw: a peer's subnet is routed via its node address on the underlay (the peer shares its L2 segment).

use std::net::IpAddr;

use cnicore::netlink::{Route, RT_TABLE_MAIN};
use ipnet::IpNet;

use crate::dataplane::{Underlay, ROUTE_PROTOCOL};

/// The route to `subnet` via `gateway` out of the underlay interface.
pub fn route(subnet: IpNet, gateway: IpAddr, underlay: &Underlay) -> Route {
    Route {
        dst: subnet,
        gateway: Some(gateway),
        oif: Some(underlay.index),
        protocol: Some(ROUTE_PROTOCOL),
        table: Some(RT_TABLE_MAIN),
        ..Route::default()
    }
}
