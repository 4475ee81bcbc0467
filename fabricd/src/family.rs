//! The address families: the cluster's networks, leases, routes and devices exist once per family.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;

/// An address family: the cluster's networks, leases, routes and devices exist once per family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    pub const ALL: [Family; 2] = [Family::V4, Family::V6];

    pub fn of(ip: &IpAddr) -> Family {
        match ip {
            IpAddr::V4(_) => Family::V4,
            IpAddr::V6(_) => Family::V6,
        }
    }

    pub fn bits(self) -> u8 {
        match self {
            Family::V4 => 32,
            Family::V6 => 128,
        }
    }

    pub fn netlink(self) -> cnicore::netlink::IpFamily {
        match self {
            Family::V4 => cnicore::netlink::IpFamily::V4,
            Family::V6 => cnicore::netlink::IpFamily::V6,
        }
    }

    pub fn address(self, value: u128) -> IpAddr {
        match self {
            Family::V4 => IpAddr::V4(Ipv4Addr::from(value as u32)),
            Family::V6 => IpAddr::V6(Ipv6Addr::from(value)),
        }
    }
}

impl std::fmt::Display for Family {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        })
    }
}

pub fn number(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(ip) => u32::from(ip) as u128,
        IpAddr::V6(ip) => u128::from(ip),
    }
}

/// True when the subnets share an address (one holds the other: prefixes never overlap partly).
pub fn overlaps(a: &IpNet, b: &IpNet) -> bool {
    a.contains(&b.network()) || b.contains(&a.network())
}
