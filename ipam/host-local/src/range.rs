//! Address ranges and range sets, and the round-robin order in which their addresses are handed out.
//!
//! Addresses are handled as `u128` numbers within one family, so that IPv4 and IPv6 share the arithmetic.

use ipnet::IpNet;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// An address as a number, for arithmetic and comparison within one family.
pub fn to_u128(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(a) => u32::from(a) as u128,
        IpAddr::V6(a) => u128::from(a),
    }
}

/// The address of number `n` in the family of `like`.
pub fn from_u128(n: u128, like: IpAddr) -> IpAddr {
    match like {
        IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::from(n as u32)),
        IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::from(n)),
    }
}

/// One validated range: `start..=end` inside `subnet`, with its gateway.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Range {
    pub subnet: IpNet,
    pub start: IpAddr,
    pub end: IpAddr,
    pub gateway: IpAddr,
}

impl Range {
    pub fn is_ipv4(&self) -> bool {
        self.subnet.addr().is_ipv4()
    }

    /// Whether `ip` is an address of this range (same family, inside the subnet, between start and end).
    pub fn contains(&self, ip: IpAddr) -> bool {
        ip.is_ipv4() == self.is_ipv4()
            && self.subnet.contains(&ip)
            && to_u128(self.start) <= to_u128(ip)
            && to_u128(ip) <= to_u128(self.end)
    }

    /// Addresses never handed out even when inside start..=end: the gateway, the network address, and
    /// the IPv4 broadcast address.
    pub fn is_reserved(&self, ip: IpAddr) -> bool {
        ip == self.gateway || ip == self.subnet.network() || (self.is_ipv4() && ip == self.subnet.broadcast())
    }

    fn overlaps(&self, other: &Range) -> bool {
        self.is_ipv4() == other.is_ipv4()
            && to_u128(self.start) <= to_u128(other.end)
            && to_u128(other.start) <= to_u128(self.end)
    }

    /// How many addresses `start..=end` spans (saturating; only used to bound iteration).
    fn len(&self) -> u128 {
        (to_u128(self.end) - to_u128(self.start)).saturating_add(1)
    }
}

impl fmt::Display for Range {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.start, self.end)
    }
}

/// The ranges one address is taken from (one address per range set and ADD). One family per set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RangeSet(pub Vec<Range>);

impl RangeSet {
    pub fn is_ipv4(&self) -> bool {
        self.0.first().is_some_and(Range::is_ipv4)
    }

    /// The range holding `ip`, if any.
    pub fn range_for(&self, ip: IpAddr) -> Option<&Range> {
        self.0.iter().find(|r| r.contains(ip))
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        self.range_for(ip).is_some()
    }

    /// Whether any range of `self` overlaps any range of `other`.
    pub fn overlaps(&self, other: &RangeSet) -> bool {
        self.0.iter().any(|a| other.0.iter().any(|b| a.overlaps(b)))
    }

    /// A pair of overlapping ranges inside this set, if any.
    pub fn inner_overlap(&self) -> Option<(&Range, &Range)> {
        self.0.iter().enumerate().find_map(|(i, a)| self.0[i + 1..].iter().find(|b| a.overlaps(b)).map(|b| (a, b)))
    }

    /// Every allocatable address once, in the reference's round-robin order: from the address after
    /// `last_reserved` (when it belongs to this set) around the ring of ranges, else from the first range's
    /// start. Reserved addresses (gateway, network, broadcast) are skipped. Lazy: callers stop at the first
    /// free address.
    pub fn candidates(&self, last_reserved: Option<IpAddr>) -> impl Iterator<Item = (&Range, IpAddr)> + '_ {
        let ranges = &self.0;
        let (mut idx, mut cur) = (0usize, ranges.first().map(|r| to_u128(r.start)).unwrap_or(0));
        if let Some(last) = last_reserved {
            if let Some(i) = ranges.iter().position(|r| r.contains(last)) {
                let n = to_u128(last);
                if n == to_u128(ranges[i].end) {
                    idx = (i + 1) % ranges.len();
                    cur = to_u128(ranges[idx].start);
                } else {
                    idx = i;
                    cur = n + 1;
                }
            }
        }
        let total = ranges.iter().fold(0u128, |acc, r| acc.saturating_add(r.len()));
        let mut remaining = total;
        std::iter::from_fn(move || {
            while remaining > 0 {
                remaining -= 1;
                let range = &ranges[idx];
                let ip = from_u128(cur, range.start);
                if cur >= to_u128(range.end) {
                    idx = (idx + 1) % ranges.len();
                    cur = to_u128(ranges[idx].start);
                } else {
                    cur += 1;
                }
                if !range.is_reserved(ip) {
                    return Some((range, ip));
                }
            }
            None
        })
    }
}

impl fmt::Display for RangeSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{r}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(subnet: &str, start: &str, end: &str, gw: &str) -> Range {
        Range {
            subnet: subnet.parse().unwrap(),
            start: start.parse().unwrap(),
            end: end.parse().unwrap(),
            gateway: gw.parse().unwrap(),
        }
    }

    fn ips(set: &RangeSet, last: Option<&str>) -> Vec<String> {
        set.candidates(last.map(|l| l.parse().unwrap())).map(|(_, ip)| ip.to_string()).collect()
    }

    #[test]
    fn round_robin_skips_gateway_and_wraps() {
        let set = RangeSet(vec![range("10.0.0.0/29", "10.0.0.1", "10.0.0.6", "10.0.0.1")]);
        assert_eq!(ips(&set, None), ["10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5", "10.0.0.6"]);
        assert_eq!(ips(&set, Some("10.0.0.4")), ["10.0.0.5", "10.0.0.6", "10.0.0.2", "10.0.0.3", "10.0.0.4"]);
        assert_eq!(ips(&set, Some("10.0.0.6")), ["10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5", "10.0.0.6"]);
        // Not in the set: start from the beginning.
        assert_eq!(ips(&set, Some("10.9.0.1")).len(), 5);
    }

    #[test]
    fn several_ranges_in_a_set() {
        let set = RangeSet(vec![
            range("10.0.0.0/24", "10.0.0.10", "10.0.0.11", "10.0.0.1"),
            range("10.0.1.0/24", "10.0.1.1", "10.0.1.2", "10.0.1.1"),
        ]);
        assert_eq!(ips(&set, None), ["10.0.0.10", "10.0.0.11", "10.0.1.2"]);
        assert_eq!(ips(&set, Some("10.0.0.11")), ["10.0.1.2", "10.0.0.10", "10.0.0.11"]);
        assert!(set.inner_overlap().is_none());
    }

    #[test]
    fn never_network_or_broadcast() {
        let set = RangeSet(vec![range("10.0.0.0/30", "10.0.0.0", "10.0.0.3", "10.0.0.1")]);
        assert_eq!(ips(&set, None), ["10.0.0.2"]);
        let v6 = RangeSet(vec![range("fd00::/126", "fd00::", "fd00::3", "fd00::1")]);
        assert_eq!(ips(&v6, None), ["fd00::2", "fd00::3"]);
    }

    #[test]
    fn overlap() {
        let a = RangeSet(vec![range("10.0.0.0/24", "10.0.0.1", "10.0.0.254", "10.0.0.1")]);
        let b = RangeSet(vec![range("10.0.0.0/25", "10.0.0.1", "10.0.0.126", "10.0.0.1")]);
        let c = RangeSet(vec![range("fd00::/64", "fd00::1", "fd00::ffff", "fd00::1")]);
        assert!(a.overlaps(&b));
        assert!(!a.overlaps(&c));
    }
}
