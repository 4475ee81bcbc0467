//! Unicast routes.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;
use netlink_packet_core::{NLM_F_CREATE, NLM_F_EXCL, NLM_F_REPLACE};

use super::wire::{self, attributes, Request};
use super::{IpFamily, Netlink, Scope};

/// Size of `struct rtmsg`.
const RTMSG_LEN: usize = 12;
/// `RTAX_MTU` and `RTAX_ADVMSS`: metrics inside `RTA_METRICS`.
const RTAX_MTU: u16 = 2;
const RTAX_ADVMSS: u16 = 8;
/// `RT_TABLE_UNSPEC`: the header's table field when the table id does not fit in a byte.
const RT_TABLE_UNSPEC: u8 = 0;

/// The main routing table (`RT_TABLE_MAIN`), where routes go unless told otherwise.
pub const RT_TABLE_MAIN: u32 = 254;

/// A unicast route. `Route { dst, oif: Some(index), ..Default::default() }` is a direct route.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Route {
    pub dst: IpNet,
    pub gateway: Option<IpAddr>,
    /// Output link index.
    pub oif: Option<u32>,
    pub scope: Scope,
    /// Routing table; `None` is the main table when adding (routes read back always say which).
    pub table: Option<u32>,
    /// Metric (`RTA_PRIORITY`).
    pub priority: Option<u32>,
    pub mtu: Option<u32>,
    pub advmss: Option<u32>,
    /// Preferred source address (`RTA_PREFSRC`, `ip route ... src`).
    pub src: Option<IpAddr>,
    /// `onlink`: the gateway is on the link even though no address of the link covers it (vxlan overlays).
    pub onlink: bool,
    /// Who made the route (`RTPROT_*`, `ip route ... proto`); `None` is `boot`, the default of `ip route add`.
    pub protocol: Option<u8>,
}

/// `RTNH_F_ONLINK` in `rtm_flags`.
const RTNH_F_ONLINK: u32 = 4;

/// `struct rtmsg` {family, dst_len, src_len, tos, table, protocol, scope, type, flags}.
fn rtmsg(family: i32, dst_len: u8, table: u8, protocol: u8, scope: u8, kind: u8) -> [u8; RTMSG_LEN] {
    [family as u8, dst_len, 0, 0, table, protocol, scope, kind, 0, 0, 0, 0]
}

fn family_of(ip: &IpAddr) -> i32 {
    match ip {
        IpAddr::V4(_) => libc::AF_INET,
        IpAddr::V6(_) => libc::AF_INET6,
    }
}

impl Route {
    /// The route in an `RTM_NEWROUTE` payload if it is a unicast route.
    fn parse(data: &[u8]) -> Option<Route> {
        let header = data.get(..RTMSG_LEN)?;
        if header[7] != libc::RTN_UNICAST {
            return None;
        }
        let (mut dst_ip, v6) = match i32::from(header[0]) {
            libc::AF_INET => (IpAddr::V4(Ipv4Addr::UNSPECIFIED), false),
            libc::AF_INET6 => (IpAddr::V6(Ipv6Addr::UNSPECIFIED), true),
            _ => return None,
        };
        let flags = wire::u32_at(header, 8)?;
        let mut route = Route {
            scope: header[6].into(),
            table: Some(u32::from(header[4])),
            onlink: flags & RTNH_F_ONLINK != 0,
            protocol: (header[5] != libc::RTPROT_BOOT).then_some(header[5]),
            ..Route::default()
        };
        for (kind, value) in attributes(&data[RTMSG_LEN..]) {
            match kind {
                libc::RTA_DST => dst_ip = wire::as_ip(value, v6)?,
                libc::RTA_GATEWAY => route.gateway = wire::as_ip(value, v6),
                libc::RTA_PREFSRC => route.src = wire::as_ip(value, v6),
                libc::RTA_OIF => route.oif = wire::as_u32(value),
                libc::RTA_PRIORITY => route.priority = wire::as_u32(value),
                // RTA_TABLE carries table ids above 255 that do not fit in the header.
                libc::RTA_TABLE => route.table = wire::as_u32(value).or(route.table),
                libc::RTA_METRICS => {
                    for (metric, value) in attributes(value) {
                        match metric {
                            RTAX_MTU => route.mtu = wire::as_u32(value),
                            RTAX_ADVMSS => route.advmss = wire::as_u32(value),
                            _ => {}
                        }
                    }
                }
                _ => {}
            }
        }
        route.dst = IpNet::new(dst_ip, header[1]).ok()?;
        Some(route)
    }

    /// The request adding (`for_delete == false`) or deleting this route, as `ip route` builds it.
    fn to_request(&self, message_type: u16, for_delete: bool) -> Request {
        let dst = self.dst.addr();
        let table = self.table.unwrap_or(RT_TABLE_MAIN);
        let header_table = u8::try_from(table).unwrap_or(RT_TABLE_UNSPEC);
        let header = if for_delete {
            // Scope "nowhere" matches routes of any scope.
            rtmsg(family_of(&dst), self.dst.prefix_len(), header_table, 0, libc::RT_SCOPE_NOWHERE, 0)
        } else {
            let scope = u8::from(self.scope);
            let (protocol, kind) = (self.protocol.unwrap_or(libc::RTPROT_BOOT), libc::RTN_UNICAST);
            let mut header = rtmsg(family_of(&dst), self.dst.prefix_len(), header_table, protocol, scope, kind);
            if self.onlink {
                header[8..12].copy_from_slice(&RTNH_F_ONLINK.to_ne_bytes());
            }
            header
        };
        let mut request = Request::new(message_type, &header);
        request.attr_u32(libc::RTA_TABLE, table);
        if self.dst.prefix_len() > 0 {
            request.attr_ip(libc::RTA_DST, dst);
        }
        if let Some(gateway) = self.gateway {
            request.attr_ip(libc::RTA_GATEWAY, gateway);
        }
        if let Some(oif) = self.oif {
            request.attr_u32(libc::RTA_OIF, oif);
        }
        if let Some(priority) = self.priority {
            request.attr_u32(libc::RTA_PRIORITY, priority);
        }
        if let Some(src) = self.src {
            request.attr_ip(libc::RTA_PREFSRC, src);
        }
        if (self.mtu.is_some() || self.advmss.is_some()) && !for_delete {
            let metrics = request.begin_nested(libc::RTA_METRICS);
            if let Some(mtu) = self.mtu {
                request.attr_u32(RTAX_MTU, mtu);
            }
            if let Some(advmss) = self.advmss {
                request.attr_u32(RTAX_ADVMSS, advmss);
            }
            request.end_nested(metrics);
        }
        request
    }
}

/// `ip route get <dst>`: a host-length destination.
fn route_get_request(dst: IpAddr) -> Request {
    let prefix_len = if dst.is_ipv4() { 32 } else { 128 };
    let mut request = Request::new(libc::RTM_GETROUTE, &rtmsg(family_of(&dst), prefix_len, 0, 0, 0, 0));
    request.attr_ip(libc::RTA_DST, dst);
    request
}

impl Netlink {
    /// The unicast routes of `family` in routing table `table` (e.g. [`RT_TABLE_MAIN`]).
    pub fn routes(&mut self, family: IpFamily, table: u32) -> io::Result<Vec<Route>> {
        let family = match family {
            IpFamily::V4 => libc::AF_INET,
            IpFamily::V6 => libc::AF_INET6,
        };
        let mut request = Request::new(libc::RTM_GETROUTE, &rtmsg(family, 0, 0, 0, 0, 0));
        self.dump(&mut request, libc::RTM_NEWROUTE, |data| Route::parse(data).filter(|r| r.table == Some(table)))
    }

    /// The interface the namespace routes packets to `dst` through (`ip route get <dst>`), if it has a route.
    pub fn route_get_oif(&mut self, dst: IpAddr) -> io::Result<Option<u32>> {
        let mut request = route_get_request(dst);
        let replies = self.request_raw(&mut request, 0)?;
        Ok(replies.iter().filter(|reply| reply.message_type == libc::RTM_NEWROUTE).find_map(|reply| {
            let attrs = reply.data.get(RTMSG_LEN..)?;
            attributes(attrs).find_map(|(kind, value)| (kind == libc::RTA_OIF).then(|| wire::as_u32(value)).flatten())
        }))
    }

    /// The route the namespace would take to `dst` (`ip route get <dst>`): its gateway says whether `dst` is
    /// on a directly connected network. None when `dst` is local or unreachable.
    pub fn route_get(&mut self, dst: IpAddr) -> io::Result<Option<Route>> {
        let mut request = route_get_request(dst);
        let replies = self.request_raw(&mut request, 0)?;
        Ok(replies
            .iter()
            .filter(|reply| reply.message_type == libc::RTM_NEWROUTE)
            .find_map(|reply| Route::parse(&reply.data)))
    }
}

impl Route {
    /// The request adding or replacing this route (send with [`Route::REPLACE`]), e.g. for [`Netlink::batch`].
    pub fn replace_request(&self) -> Request {
        self.to_request(libc::RTM_NEWROUTE, false)
    }

    /// The request deleting this route.
    pub fn delete_request(&self) -> Request {
        self.to_request(libc::RTM_DELROUTE, true)
    }

    pub const REPLACE: u16 = NLM_F_CREATE | NLM_F_REPLACE;
}

impl Netlink {
    /// Adds a route; EEXIST if the same route is already there.
    pub fn add_route(&mut self, route: &Route) -> io::Result<()> {
        let mut request = route.to_request(libc::RTM_NEWROUTE, false);
        self.request_raw(&mut request, NLM_F_CREATE | NLM_F_EXCL)?;
        Ok(())
    }

    /// Adds a route or replaces the one with the same destination, table and metric.
    pub fn replace_route(&mut self, route: &Route) -> io::Result<()> {
        let mut request = route.to_request(libc::RTM_NEWROUTE, false);
        self.request_raw(&mut request, NLM_F_CREATE | NLM_F_REPLACE)?;
        Ok(())
    }

    /// Deletes a route (ESRCH if there is none matching, see [`super::is_not_found`]).
    pub fn del_route(&mut self, route: &Route) -> io::Result<()> {
        let mut request = route.to_request(libc::RTM_DELROUTE, true);
        self.request_raw(&mut request, 0)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    //! Requests compared byte for byte with netlink-packet-route's, and the parser fed its messages.
    use netlink_packet_route::route::{
        RouteAttribute, RouteFlags, RouteHeader, RouteMessage, RouteMetric, RouteProtocol, RouteScope, RouteType,
    };
    use netlink_packet_route::AddressFamily;

    use super::*;
    use crate::netlink::wire::emitted;

    /// The message the earlier netlink-packet-route code built.
    fn reference(route: &Route, for_delete: bool) -> RouteMessage {
        let mut message = RouteMessage::default();
        let header = &mut message.header;
        header.address_family = match route.dst {
            IpNet::V4(_) => AddressFamily::Inet,
            IpNet::V6(_) => AddressFamily::Inet6,
        };
        header.destination_prefix_length = route.dst.prefix_len();
        let table = route.table.unwrap_or(RT_TABLE_MAIN);
        header.table = u8::try_from(table).unwrap_or(RouteHeader::RT_TABLE_UNSPEC);
        if for_delete {
            header.scope = RouteScope::NoWhere;
        } else {
            header.protocol = route.protocol.map(RouteProtocol::from).unwrap_or(RouteProtocol::Boot);
            header.scope = u8::from(route.scope).into();
            header.kind = RouteType::Unicast;
            if route.onlink {
                header.flags = RouteFlags::Onlink;
            }
        }
        let attributes = &mut message.attributes;
        attributes.push(RouteAttribute::Table(table));
        if route.dst.prefix_len() > 0 {
            attributes.push(RouteAttribute::Destination(route.dst.addr().into()));
        }
        if let Some(gateway) = route.gateway {
            attributes.push(RouteAttribute::Gateway(gateway.into()));
        }
        if let Some(oif) = route.oif {
            attributes.push(RouteAttribute::Oif(oif));
        }
        if let Some(priority) = route.priority {
            attributes.push(RouteAttribute::Priority(priority));
        }
        if let Some(src) = route.src {
            attributes.push(RouteAttribute::PrefSource(src.into()));
        }
        let mut metrics = Vec::new();
        if let Some(mtu) = route.mtu {
            metrics.push(RouteMetric::Mtu(mtu));
        }
        if let Some(advmss) = route.advmss {
            metrics.push(RouteMetric::Advmss(advmss));
        }
        if !metrics.is_empty() && !for_delete {
            attributes.push(RouteAttribute::Metrics(metrics));
        }
        message
    }

    fn examples() -> Vec<Route> {
        vec![
            Route { dst: "0.0.0.0/0".parse().unwrap(), gateway: Some("10.1.0.1".parse().unwrap()), ..Route::default() },
            Route {
                dst: "10.2.0.0/16".parse().unwrap(),
                oif: Some(3),
                scope: Scope::Link,
                table: Some(1000),
                priority: Some(50),
                mtu: Some(1400),
                advmss: Some(1360),
                src: Some("10.1.0.5".parse().unwrap()),
                ..Route::default()
            },
            Route {
                dst: "fd00:1::/64".parse().unwrap(),
                gateway: Some("fe80::1".parse().unwrap()),
                oif: Some(2),
                mtu: Some(1280),
                table: Some(100),
                ..Route::default()
            },
            // A vxlan overlay route as fabricd makes it: via the peer's tunnel address, onlink, its own protocol.
            Route {
                dst: "10.244.5.0/24".parse().unwrap(),
                gateway: Some("10.244.5.0".parse().unwrap()),
                oif: Some(4),
                onlink: true,
                protocol: Some(77),
                ..Route::default()
            },
        ]
    }

    #[test]
    fn requests() {
        for route in examples() {
            for for_delete in [false, true] {
                let request = route.to_request(libc::RTM_NEWROUTE, for_delete);
                assert_eq!(request.payload(), emitted(&reference(&route, for_delete)), "{route:?} {for_delete}");
            }
        }
    }

    #[test]
    fn route_get() {
        for dst in ["10.1.2.3", "fd00::3"] {
            let dst: IpAddr = dst.parse().unwrap();
            let mut expected = RouteMessage::default();
            expected.header.address_family = if dst.is_ipv4() { AddressFamily::Inet } else { AddressFamily::Inet6 };
            expected.header.destination_prefix_length = if dst.is_ipv4() { 32 } else { 128 };
            expected.attributes.push(RouteAttribute::Destination(dst.into()));
            assert_eq!(route_get_request(dst).payload(), emitted(&expected));
        }
    }

    #[test]
    fn parses_routes() {
        for route in examples() {
            let mut reported = reference(&route, false);
            // Dumps say the table; routes without a gateway have none, and so on.
            let parsed = Route::parse(&emitted(&reported)).unwrap();
            assert_eq!(parsed, Route { table: Some(route.table.unwrap_or(RT_TABLE_MAIN)), ..route.clone() });
            reported.header.kind = RouteType::Local;
            assert_eq!(Route::parse(&emitted(&reported)), None);
        }
    }
}
