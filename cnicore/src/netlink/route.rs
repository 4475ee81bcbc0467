//! Unicast routes.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;
use netlink_packet_core::{NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL, NLM_F_REPLACE};
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteHeader, RouteMessage, RouteMetric, RouteProtocol,
    RouteScope, RouteType,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};

use super::{IpFamily, Netlink, Scope};

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
}

fn address_family(family: IpFamily) -> AddressFamily {
    match family {
        IpFamily::V4 => AddressFamily::Inet,
        IpFamily::V6 => AddressFamily::Inet6,
    }
}

fn ip_of(address: &RouteAddress) -> Option<IpAddr> {
    match address {
        RouteAddress::Inet(ip) => Some(IpAddr::V4(*ip)),
        RouteAddress::Inet6(ip) => Some(IpAddr::V6(*ip)),
        _ => None,
    }
}

impl Route {
    /// The route in `message` if it is a unicast route.
    fn from_message(message: &RouteMessage) -> Option<Route> {
        let header = &message.header;
        if header.kind != RouteType::Unicast {
            return None;
        }
        let mut dst_ip = match header.address_family {
            AddressFamily::Inet => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            AddressFamily::Inet6 => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
            _ => return None,
        };
        let mut route = Route {
            scope: u8::from(header.scope).into(),
            table: Some(u32::from(header.table)),
            ..Route::default()
        };
        for attribute in &message.attributes {
            match attribute {
                RouteAttribute::Destination(address) => dst_ip = ip_of(address)?,
                RouteAttribute::Gateway(address) => route.gateway = ip_of(address),
                RouteAttribute::PrefSource(address) => route.src = ip_of(address),
                RouteAttribute::Oif(index) => route.oif = Some(*index),
                RouteAttribute::Priority(priority) => route.priority = Some(*priority),
                // RTA_TABLE carries table ids above 255 that do not fit in the header.
                RouteAttribute::Table(table) => route.table = Some(*table),
                RouteAttribute::Metrics(metrics) => {
                    for metric in metrics {
                        match metric {
                            RouteMetric::Mtu(mtu) => route.mtu = Some(*mtu),
                            RouteMetric::Advmss(advmss) => route.advmss = Some(*advmss),
                            _ => {}
                        }
                    }
                }
                _ => {}
            }
        }
        route.dst = IpNet::new(dst_ip, header.destination_prefix_length).ok()?;
        Some(route)
    }

    /// The message for adding (`for_delete == false`) or deleting this route, as `ip route` builds it.
    fn to_message(&self, for_delete: bool) -> RouteMessage {
        let mut message = RouteMessage::default();
        let header = &mut message.header;
        header.address_family = match self.dst {
            IpNet::V4(_) => AddressFamily::Inet,
            IpNet::V6(_) => AddressFamily::Inet6,
        };
        header.destination_prefix_length = self.dst.prefix_len();
        let table = self.table.unwrap_or(RT_TABLE_MAIN);
        header.table = u8::try_from(table).unwrap_or(RouteHeader::RT_TABLE_UNSPEC);
        if for_delete {
            // Nowhere matches routes of any scope.
            header.scope = RouteScope::NoWhere;
        } else {
            header.protocol = RouteProtocol::Boot;
            header.scope = u8::from(self.scope).into();
            header.kind = RouteType::Unicast;
        }
        let attributes = &mut message.attributes;
        attributes.push(RouteAttribute::Table(table));
        if self.dst.prefix_len() > 0 {
            attributes.push(RouteAttribute::Destination(self.dst.addr().into()));
        }
        if let Some(gateway) = self.gateway {
            attributes.push(RouteAttribute::Gateway(gateway.into()));
        }
        if let Some(oif) = self.oif {
            attributes.push(RouteAttribute::Oif(oif));
        }
        if let Some(priority) = self.priority {
            attributes.push(RouteAttribute::Priority(priority));
        }
        if let Some(src) = self.src {
            attributes.push(RouteAttribute::PrefSource(src.into()));
        }
        let mut metrics = Vec::new();
        if let Some(mtu) = self.mtu {
            metrics.push(RouteMetric::Mtu(mtu));
        }
        if let Some(advmss) = self.advmss {
            metrics.push(RouteMetric::Advmss(advmss));
        }
        if !metrics.is_empty() && !for_delete {
            attributes.push(RouteAttribute::Metrics(metrics));
        }
        message
    }
}

impl Netlink {
    /// The unicast routes of `family` in routing table `table` (e.g. [`RT_TABLE_MAIN`]).
    pub fn routes(&mut self, family: IpFamily, table: u32) -> io::Result<Vec<Route>> {
        let mut message = RouteMessage::default();
        message.header.address_family = address_family(family);
        let replies = self.request(RouteNetlinkMessage::GetRoute(message), NLM_F_DUMP)?;
        Ok(replies
            .iter()
            .filter_map(|reply| match reply {
                RouteNetlinkMessage::NewRoute(message) => Route::from_message(message),
                _ => None,
            })
            .filter(|route| route.table == Some(table))
            .collect())
    }

    /// Adds a route; EEXIST if the same route is already there.
    pub fn add_route(&mut self, route: &Route) -> io::Result<()> {
        self.request(
            RouteNetlinkMessage::NewRoute(route.to_message(false)),
            NLM_F_CREATE | NLM_F_EXCL,
        )?;
        Ok(())
    }

    /// Adds a route or replaces the one with the same destination, table and metric.
    pub fn replace_route(&mut self, route: &Route) -> io::Result<()> {
        self.request(
            RouteNetlinkMessage::NewRoute(route.to_message(false)),
            NLM_F_CREATE | NLM_F_REPLACE,
        )?;
        Ok(())
    }

    /// Deletes a route (ESRCH if there is none matching, see [`super::is_not_found`]).
    pub fn del_route(&mut self, route: &Route) -> io::Result<()> {
        self.request(RouteNetlinkMessage::DelRoute(route.to_message(true)), 0)?;
        Ok(())
    }
}
