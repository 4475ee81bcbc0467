//! The underlay: the interface a node's traffic to other nodes leaves by, its addresses, and the marks that
//! tell fabricd's kernel objects from others'. Below the plan, the backends and the data plane, which all read it.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use cnicore::netlink::{IpFamily, Netlink, RT_TABLE_MAIN};
use ipnet::IpNet;

use crate::family::Family;

/// `proto 75` in `ip route`: the routes fabricd made (and will remove).
pub const ROUTE_PROTOCOL: u8 = 75;

/// The underlay interface the node's traffic to other nodes leaves by.
#[derive(Debug, Clone)]
pub struct Underlay {
    pub index: u32,
    pub name: String,
    pub mtu: u32,
    /// The addresses announced to peers, per family (`--public-ip`, `--public-ipv6`, or the interface's first).
    pub public_ip: Option<Ipv4Addr>,
    pub public_ipv6: Option<Ipv6Addr>,
    /// The prefixes on the interface (IPv6: global ones): a peer inside one is on the same L2 segment.
    pub prefixes: Vec<IpNet>,
}

/// fe80::/10: the addresses the kernel gives each IPv6 interface (IPv4's link-local ones are an operator's).
pub fn is_link_local(net: &IpNet) -> bool {
    matches!(net, IpNet::V6(_)) && cnicore::ip::is_link_local(net.addr())
}

impl Underlay {
    /// Finds the interface: `iface` (a name or one of its addresses), else the one of the default route
    /// (IPv4, else IPv6). `public_ip` and `public_ipv6` override the addresses announced to peers.
    pub fn find(
        nl: &mut Netlink,
        iface: &[String],
        public_ip: Option<Ipv4Addr>,
        public_ipv6: Option<Ipv6Addr>,
    ) -> io::Result<Underlay> {
        let links = nl.links()?;
        let addresses = nl.addresses(None)?;
        let mut chosen = None;
        // An --iface given as an address is also the public address of its family (as flanneld takes it).
        let mut iface_address = None;
        for wanted in iface {
            chosen = match wanted.parse::<IpAddr>() {
                Ok(ip) => {
                    iface_address = Some(ip);
                    addresses.iter().find(|a| a.addr.addr() == ip).map(|a| a.index)
                }
                Err(_) => links.iter().find(|l| &l.name == wanted).map(|l| l.index),
            };
            if chosen.is_some() {
                break;
            }
        }
        if !iface.is_empty() && chosen.is_none() {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("--iface {}: no such interface or address", iface.join(",")),
            ));
        }
        for family in [IpFamily::V4, IpFamily::V6] {
            if chosen.is_none() {
                let default = nl.routes(family, RT_TABLE_MAIN)?.into_iter().find(|r| r.dst.prefix_len() == 0);
                chosen = default.and_then(|r| r.oif);
            }
        }
        let index = chosen.ok_or_else(|| {
            io::Error::new(io::ErrorKind::NotFound, "no --iface given and no default route to choose the interface by")
        })?;
        let link = links.iter().find(|l| l.index == index).expect("listed");
        let prefixes: Vec<IpNet> =
            addresses.iter().filter(|a| a.index == index && !is_link_local(&a.addr)).map(|a| a.addr).collect();
        let first_v4 = prefixes.iter().find_map(|p| match p {
            IpNet::V4(net) => Some(net.addr()),
            _ => None,
        });
        let first_v6 = prefixes.iter().find_map(|p| match p {
            IpNet::V6(net) => Some(net.addr()),
            _ => None,
        });
        let (first_v4, first_v6) = match iface_address {
            Some(IpAddr::V4(ip)) => (Some(ip), first_v6),
            Some(IpAddr::V6(ip)) => (first_v4, Some(ip)),
            None => (first_v4, first_v6),
        };
        let underlay = Underlay {
            index,
            name: link.name.clone(),
            mtu: link.mtu,
            public_ip: public_ip.or(first_v4),
            public_ipv6: public_ipv6.or(first_v6),
            prefixes: prefixes.iter().map(|p| p.trunc()).collect(),
        };
        if underlay.public_ip.is_none() && underlay.public_ipv6.is_none() {
            return Err(io::Error::new(io::ErrorKind::NotFound, format!("{} has no address", link.name)));
        }
        Ok(underlay)
    }

    /// The address announced to peers for `family`.
    pub fn public(&self, family: Family) -> Option<IpAddr> {
        match family {
            Family::V4 => self.public_ip.map(IpAddr::V4),
            Family::V6 => self.public_ipv6.map(IpAddr::V6),
        }
    }

    pub fn same_l2(&self, ip: IpAddr) -> bool {
        self.prefixes.iter().any(|p| p.contains(&ip))
    }
}

/// The interface flanneld would choose: the first of `iface` (names or addresses) that exists, else the first
/// interface whose name or one of whose addresses a regex of `regexes` matches (each regex in turn), else the
/// interface of the route to `can_reach`. One name or address, or an error when none matches.
pub fn choose(
    nl: &mut Netlink,
    iface: &[String],
    regexes: &[regex_lite::Regex],
    can_reach: Option<IpAddr>,
) -> io::Result<Vec<String>> {
    let links = nl.links()?;
    let addresses = nl.addresses(None)?;
    let exists = |wanted: &String| match wanted.parse::<IpAddr>() {
        Ok(ip) => addresses.iter().any(|a| a.addr.addr() == ip),
        Err(_) => links.iter().any(|l| &l.name == wanted),
    };
    if let Some(found) = iface.iter().find(|w| exists(w)) {
        return Ok(vec![found.clone()]);
    }
    for regex in regexes {
        let by_name = links.iter().find(|l| regex.is_match(&l.name)).map(|l| l.name.clone());
        let by_address =
            || addresses.iter().find(|a| regex.is_match(&a.addr.addr().to_string())).map(|a| a.addr.addr().to_string());
        if let Some(found) = by_name.or_else(by_address) {
            return Ok(vec![found]);
        }
    }
    if let Some(target) = can_reach {
        let index = nl.route_get_oif(target)?;
        if let Some(link) = index.and_then(|i| links.iter().find(|l| l.index == i)) {
            return Ok(vec![link.name.clone()]);
        }
    }
    Err(io::Error::new(io::ErrorKind::NotFound, "no interface matches the interfaces and/or regexes provided"))
}

#[cfg(test)]
impl Underlay {
    /// A node at 192.168.50.10 and fd00:50::10 on eth0 (index 2, MTU 1500), for unit tests.
    pub fn example() -> Underlay {
        Underlay {
            index: 2,
            name: "eth0".into(),
            mtu: 1500,
            public_ip: Some(Ipv4Addr::new(192, 168, 50, 10)),
            public_ipv6: Some("fd00:50::10".parse().unwrap()),
            prefixes: vec!["192.168.50.0/24".parse().unwrap(), "fd00:50::/64".parse().unwrap()],
        }
    }
}
