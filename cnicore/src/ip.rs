//! IP addresses as the plugins sort them: the address family (of netlink requests, of firewall rule sets),
//! link-local addresses (the kernel's own, never a pod's), and the global unicast addresses a DEL reads back
//! from a pod's interface.

use std::net::IpAddr;

use ipnet::IpNet;

/// IP version of addresses, routes and rule sets. The firewall's methods (nftables keywords, iptables vs
/// ip6tables) are in [`crate::firewall`], which calls it `Family`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum IpFamily {
    V4,
    V6,
}

impl IpFamily {
    /// Both, IPv4 first.
    pub const ALL: [IpFamily; 2] = [IpFamily::V4, IpFamily::V6];

    pub fn of(ip: IpAddr) -> IpFamily {
        match ip {
            IpAddr::V4(_) => IpFamily::V4,
            IpAddr::V6(_) => IpFamily::V6,
        }
    }

    pub fn of_net(net: &IpNet) -> IpFamily {
        IpFamily::of(net.addr())
    }

    /// The length of its addresses, in bits.
    pub fn bits(self) -> u8 {
        match self {
            IpFamily::V4 => 32,
            IpFamily::V6 => 128,
        }
    }

    /// The address of the family whose number is `value` (IPv4: its low 32 bits).
    pub fn address(self, value: u128) -> IpAddr {
        match self {
            IpFamily::V4 => IpAddr::V4(std::net::Ipv4Addr::from(value as u32)),
            IpFamily::V6 => IpAddr::V6(std::net::Ipv6Addr::from(value)),
        }
    }
}

impl std::fmt::Display for IpFamily {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            IpFamily::V4 => "IPv4",
            IpFamily::V6 => "IPv6",
        })
    }
}

/// 169.254.0.0/16 or fe80::/10.
pub fn is_link_local(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(a) => a.is_link_local(),
        IpAddr::V6(a) => a.is_unicast_link_local(),
    }
}

/// Neither loopback, link-local, multicast, broadcast nor unspecified: an address IPAM may have given.
pub fn is_global_unicast(ip: IpAddr) -> bool {
    let special = match ip {
        IpAddr::V4(a) => a.is_loopback() || a.is_multicast() || a.is_broadcast() || a.is_unspecified(),
        IpAddr::V6(a) => a.is_loopback() || a.is_multicast() || a.is_unspecified(),
    };
    !special && !is_link_local(ip)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sorts_addresses() {
        for ip in ["169.254.3.4", "fe80::1", "febf::1"] {
            assert!(is_link_local(ip.parse().unwrap()), "{ip}");
        }
        for ip in ["10.0.0.1", "fec0::1", "fd00::1", "2001:db8::1"] {
            assert!(!is_link_local(ip.parse().unwrap()), "{ip}");
            assert!(is_global_unicast(ip.parse().unwrap()), "{ip}");
        }
        for ip in
            ["127.0.0.1", "169.254.1.1", "224.0.0.1", "255.255.255.255", "0.0.0.0", "::1", "ff02::1", "::", "fe80::2"]
        {
            assert!(!is_global_unicast(ip.parse().unwrap()), "{ip}");
        }
        assert_eq!(IpFamily::of_net(&"fd00::/64".parse().unwrap()), IpFamily::V6);
        assert_eq!(IpFamily::V4.address(0x0a00_0001).to_string(), "10.0.0.1");
        assert_eq!((IpFamily::V6.bits(), IpFamily::V6.to_string()), (128, "IPv6".to_string()));
    }
}
