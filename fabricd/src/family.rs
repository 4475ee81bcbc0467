//! The address families: the cluster's networks, leases, routes and devices exist once per family. The family
//! is cnicore's (netlink's and netpol's), named `Family` here as in netpol.

use std::net::IpAddr;

use ipnet::IpNet;

pub use cnicore::ip::IpFamily as Family;

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
