//! IP addresses of links.

use std::io;
use std::net::{IpAddr, Ipv4Addr};

use ipnet::IpNet;
use netlink_packet_core::{NLM_F_CREATE, NLM_F_EXCL};

use super::wire::{self, attributes, Request};
use super::{Netlink, Scope};

const IFA_F_NODAD: u32 = libc::IFA_F_NODAD;
const IFA_F_TENTATIVE: u32 = libc::IFA_F_TENTATIVE;
const IFA_F_DADFAILED: u32 = libc::IFA_F_DADFAILED;
/// `IFA_F_NOPREFIXROUTE` (linux/if_addr.h).
const IFA_F_NOPREFIXROUTE: u32 = 0x200;
/// `IFA_FLAGS` (linux/if_addr.h): all flags, the header only has room for the low 8 bits.
const IFA_FLAGS: u16 = 8;

/// Size of `struct ifaddrmsg`.
const IFADDRMSG_LEN: usize = 8;

/// An address assigned to a link, with its prefix length (`10.1.2.3/24`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Address {
    pub index: u32,
    pub addr: IpNet,
    pub scope: Scope,
    /// `IFA_F_*` flags (e.g. `libc::IFA_F_TENTATIVE` while IPv6 duplicate address detection runs).
    pub flags: u32,
}

impl Address {
    /// IPv6 duplicate address detection has not finished yet.
    pub fn is_tentative(&self) -> bool {
        self.flags & IFA_F_TENTATIVE != 0
    }

    /// IPv6 duplicate address detection found the address in use.
    pub fn is_dad_failed(&self) -> bool {
        self.flags & IFA_F_DADFAILED != 0
    }
}

/// Options for [`Netlink::add_address_with`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AddressOptions {
    /// Skip IPv6 duplicate address detection (`IFA_F_NODAD`): the address is usable at once.
    pub nodad: bool,
    /// Do not add the prefix route of the address (`IFA_F_NOPREFIXROUTE`).
    pub noprefixroute: bool,
    /// Scope of the address; `None` is universe (global).
    pub scope: Option<Scope>,
}

/// `struct ifaddrmsg` {family, prefixlen, flags, scope, index}.
fn ifaddrmsg(addr: &IpNet, flags: u8, scope: u8, index: u32) -> [u8; IFADDRMSG_LEN] {
    let family = match addr {
        IpNet::V4(_) => libc::AF_INET,
        IpNet::V6(_) => libc::AF_INET6,
    };
    let mut header = [0; IFADDRMSG_LEN];
    header[0] = family as u8;
    header[1] = addr.prefix_len();
    header[2] = flags;
    header[3] = scope;
    header[4..8].copy_from_slice(&index.to_ne_bytes());
    header
}

/// The request naming `addr` on link `index` (as `ip addr add/del` build it).
fn address_request(message_type: u16, addr: &IpNet, flags: u8, scope: u8, index: u32) -> Request {
    let mut request = Request::new(message_type, &ifaddrmsg(addr, flags, scope, index));
    request.attr_ip(libc::IFA_LOCAL, addr.addr());
    request.attr_ip(libc::IFA_ADDRESS, addr.addr());
    request
}

impl Address {
    /// The address in an `RTM_NEWADDR` payload.
    fn parse(data: &[u8]) -> Option<Address> {
        let header = data.get(..IFADDRMSG_LEN)?;
        let v6 = match i32::from(header[0]) {
            libc::AF_INET => false,
            libc::AF_INET6 => true,
            _ => return None,
        };
        let mut local = None;
        let mut address = None;
        let mut flags = u32::from(header[2]);
        for (kind, value) in attributes(&data[IFADDRMSG_LEN..]) {
            match kind {
                libc::IFA_LOCAL => local = wire::as_ip(value, v6),
                libc::IFA_ADDRESS => address = wire::as_ip(value, v6),
                IFA_FLAGS => flags = wire::as_u32(value).unwrap_or(flags),
                _ => {}
            }
        }
        // IFA_LOCAL is the interface's own address (IFA_ADDRESS is the peer on point-to-point links).
        let ip: IpAddr = local.or(address)?;
        let addr = IpNet::new(ip, header[1]).ok()?;
        Some(Address { index: wire::u32_at(header, 4)?, addr, scope: header[3].into(), flags })
    }
}

impl Netlink {
    /// Addresses of link `index`, or of all links.
    pub fn addresses(&mut self, index: Option<u32>) -> io::Result<Vec<Address>> {
        let mut request = Request::new(libc::RTM_GETADDR, &[0; IFADDRMSG_LEN]);
        let addresses = self.dump(&mut request, libc::RTM_NEWADDR, Address::parse)?;
        Ok(addresses.into_iter().filter(|address| index.is_none_or(|index| address.index == index)).collect())
    }

    /// Adds `addr` (address and prefix length) to link `index`; EEXIST if it is already there.
    pub fn add_address(&mut self, index: u32, addr: IpNet) -> io::Result<()> {
        self.add_address_with(index, addr, AddressOptions::default())
    }

    pub fn add_address_with(&mut self, index: u32, addr: IpNet, options: AddressOptions) -> io::Result<()> {
        let scope = options.scope.map_or(0, u8::from);
        let mut flags = 0;
        if options.nodad {
            flags |= IFA_F_NODAD;
        }
        if options.noprefixroute {
            flags |= IFA_F_NOPREFIXROUTE;
        }
        // The header keeps the low 8 bits of the flags (NODAD fits, NOPREFIXROUTE does not).
        let mut request = address_request(libc::RTM_NEWADDR, &addr, (flags & IFA_F_NODAD) as u8, scope, index);
        if flags != 0 {
            request.attr_u32(IFA_FLAGS, flags);
        }
        // Like `ip addr add ... brd +` and the Go netlink library: IPv4 subnets get their broadcast address.
        if let IpNet::V4(net) = addr {
            if net.prefix_len() < 31 {
                let broadcast: Ipv4Addr = net.broadcast();
                request.attr(libc::IFA_BROADCAST, &broadcast.octets());
            }
        }
        self.request_raw(&mut request, NLM_F_CREATE | NLM_F_EXCL)?;
        Ok(())
    }

    /// Removes `addr` from link `index` (EADDRNOTAVAIL if it is not there, see [`super::is_not_found`]).
    pub fn del_address(&mut self, index: u32, addr: IpNet) -> io::Result<()> {
        self.request_raw(&mut address_request(libc::RTM_DELADDR, &addr, 0, 0, index), 0)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    //! Requests compared byte for byte with netlink-packet-route's, and the parser fed its messages.
    use netlink_packet_route::address::{AddressAttribute, AddressFlags, AddressHeaderFlags, AddressMessage};
    use netlink_packet_route::AddressFamily;

    use super::*;
    use crate::netlink::wire::emitted;

    /// The message the earlier netlink-packet-route code built for `ip addr add`.
    fn reference(index: u32, addr: IpNet) -> AddressMessage {
        let mut message = AddressMessage::default();
        message.header.family = match addr {
            IpNet::V4(_) => AddressFamily::Inet,
            IpNet::V6(_) => AddressFamily::Inet6,
        };
        message.header.prefix_len = addr.prefix_len();
        message.header.index = index;
        message.attributes.push(AddressAttribute::Local(addr.addr()));
        message.attributes.push(AddressAttribute::Address(addr.addr()));
        message
    }

    #[test]
    fn requests() {
        let v4: IpNet = "10.1.2.3/24".parse().unwrap();
        let request = address_request(libc::RTM_DELADDR, &v4, 0, 0, 4);
        assert_eq!(request.payload(), emitted(&reference(4, v4)));

        let v6: IpNet = "fd00::5/64".parse().unwrap();
        let mut request = address_request(libc::RTM_NEWADDR, &v6, IFA_F_NODAD as u8, 253, 4);
        request.attr_u32(IFA_FLAGS, IFA_F_NODAD | IFA_F_NOPREFIXROUTE);
        let mut expected = reference(4, v6);
        expected.header.scope = 253u8.into();
        expected.header.flags |= AddressHeaderFlags::Nodad;
        expected.attributes.push(AddressAttribute::Flags(AddressFlags::Nodad | AddressFlags::Noprefixroute));
        assert_eq!(request.payload(), emitted(&expected));

        let mut request = address_request(libc::RTM_NEWADDR, &v4, 0, 0, 4);
        request.attr(libc::IFA_BROADCAST, &[10, 1, 2, 255]);
        let mut expected = reference(4, v4);
        expected.attributes.push(AddressAttribute::Broadcast("10.1.2.255".parse().unwrap()));
        assert_eq!(request.payload(), emitted(&expected));
    }

    #[test]
    fn parses_addresses() {
        let v6: IpNet = "fd00::5/64".parse().unwrap();
        let mut reported = reference(7, v6);
        reported.header.scope = 0u8.into();
        reported.attributes.remove(0); // IPv6 addresses come with IFA_ADDRESS only
        reported.attributes.push(AddressAttribute::Flags(AddressFlags::Tentative | AddressFlags::Noprefixroute));
        let address = Address::parse(&emitted(&reported)).unwrap();
        assert_eq!(address.addr, v6);
        assert_eq!((address.index, address.scope), (7, Scope::Universe));
        assert!(address.is_tentative() && !address.is_dad_failed());

        // IFA_LOCAL wins over the peer address of a point-to-point link.
        let mut ptp = reference(3, "10.0.0.1/32".parse().unwrap());
        ptp.attributes[1] = AddressAttribute::Address("10.0.0.2".parse().unwrap());
        ptp.header.scope = 253u8.into();
        let address = Address::parse(&emitted(&ptp)).unwrap();
        assert_eq!(address.addr, "10.0.0.1/32".parse::<IpNet>().unwrap());
        assert_eq!((address.scope, address.flags), (Scope::Link, 0));
    }
}
