//! Address arithmetic for interval sets: a CIDR minus its exceptions as disjoint, sorted ranges.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;

/// An address as a number of its family.
pub fn to_number(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(ip) => u128::from(u32::from(ip)),
        IpAddr::V6(ip) => u128::from(ip),
    }
}

/// The address of the family of `like` with this number.
pub fn from_number(like: IpAddr, n: u128) -> IpAddr {
    match like {
        IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::from(n as u32)),
        IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::from(n)),
    }
}

/// First and last address of a network, as numbers.
fn bounds(net: &IpNet) -> (u128, u128) {
    (to_number(net.network()), to_number(net.broadcast()))
}

/// `cidr` without the `except` networks (each inside `cidr`, of its family; others are ignored by the
/// caller's validation), as disjoint sorted inclusive ranges.
pub fn subtract(cidr: &IpNet, except: &[IpNet]) -> Vec<(IpAddr, IpAddr)> {
    let like = cidr.network();
    let mut holes: Vec<(u128, u128)> = except.iter().map(bounds).collect();
    holes.sort();
    let (mut next, last) = bounds(cidr);
    let mut out = Vec::new();
    let mut done = false;
    for (hole_first, hole_last) in holes {
        if done || hole_last < next {
            continue;
        }
        if hole_first > next {
            out.push((from_number(like, next), from_number(like, hole_first - 1)));
        }
        if hole_last >= last {
            done = true;
        } else {
            next = hole_last + 1;
        }
    }
    if !done {
        out.push((from_number(like, next), from_number(like, last)));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn subtracts() {
        let cidr: IpNet = "10.0.0.0/8".parse().unwrap();
        assert_eq!(subtract(&cidr, &[]), vec![(ip("10.0.0.0"), ip("10.255.255.255"))]);
        let holes = ["10.1.0.0/16".parse().unwrap(), "10.0.0.0/24".parse().unwrap(), "10.1.2.0/24".parse().unwrap()];
        assert_eq!(
            subtract(&cidr, &holes),
            vec![(ip("10.0.1.0"), ip("10.0.255.255")), (ip("10.2.0.0"), ip("10.255.255.255"))]
        );
        assert_eq!(subtract(&cidr, &[cidr]), vec![]);
        let all: IpNet = "0.0.0.0/0".parse().unwrap();
        assert_eq!(
            subtract(&all, &["255.255.255.255/32".parse().unwrap()]),
            vec![(ip("0.0.0.0"), ip("255.255.255.254"))]
        );
        let v6: IpNet = "fd00::/64".parse().unwrap();
        assert_eq!(
            subtract(&v6, &["fd00::/65".parse().unwrap()]),
            vec![(ip("fd00::8000:0:0:0"), ip("fd00::ffff:ffff:ffff:ffff"))]
        );
    }
}
