//! IP addresses of links.

use std::io;
use std::net::{IpAddr, Ipv4Addr};

use ipnet::IpNet;
use netlink_packet_core::{NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL};
use netlink_packet_route::address::{
    AddressAttribute, AddressFlags, AddressHeaderFlags, AddressMessage,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};

use super::{Netlink, Scope};

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
        self.flags & AddressFlags::Tentative.bits() != 0
    }

    /// IPv6 duplicate address detection found the address in use.
    pub fn is_dad_failed(&self) -> bool {
        self.flags & AddressFlags::Dadfailed.bits() != 0
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

fn family_of(addr: &IpNet) -> AddressFamily {
    match addr {
        IpNet::V4(_) => AddressFamily::Inet,
        IpNet::V6(_) => AddressFamily::Inet6,
    }
}

/// The message naming `addr` on link `index` (as `ip addr add/del` build it).
fn address_message(index: u32, addr: &IpNet) -> AddressMessage {
    let mut message = AddressMessage::default();
    message.header.family = family_of(addr);
    message.header.prefix_len = addr.prefix_len();
    message.header.index = index;
    message
        .attributes
        .push(AddressAttribute::Local(addr.addr()));
    message
        .attributes
        .push(AddressAttribute::Address(addr.addr()));
    message
}

impl Address {
    fn from_message(message: &AddressMessage) -> Option<Address> {
        let mut local = None;
        let mut address = None;
        let mut flags = u32::from(message.header.flags.bits());
        for attribute in &message.attributes {
            match attribute {
                AddressAttribute::Local(ip) => local = Some(*ip),
                AddressAttribute::Address(ip) => address = Some(*ip),
                // IFA_FLAGS holds all flags; the header only has room for the low 8 bits.
                AddressAttribute::Flags(all) => flags = all.bits(),
                _ => {}
            }
        }
        // IFA_LOCAL is the interface's own address (IFA_ADDRESS is the peer on point-to-point links).
        let ip: IpAddr = local.or(address)?;
        let addr = IpNet::new(ip, message.header.prefix_len).ok()?;
        Some(Address {
            index: message.header.index,
            addr,
            scope: u8::from(message.header.scope).into(),
            flags,
        })
    }
}

impl Netlink {
    /// Addresses of link `index`, or of all links.
    pub fn addresses(&mut self, index: Option<u32>) -> io::Result<Vec<Address>> {
        let replies = self.request(
            RouteNetlinkMessage::GetAddress(AddressMessage::default()),
            NLM_F_DUMP,
        )?;
        Ok(replies
            .iter()
            .filter_map(|reply| match reply {
                RouteNetlinkMessage::NewAddress(message) => Address::from_message(message),
                _ => None,
            })
            .filter(|address| index.is_none_or(|index| address.index == index))
            .collect())
    }

    /// Adds `addr` (address and prefix length) to link `index`; EEXIST if it is already there.
    pub fn add_address(&mut self, index: u32, addr: IpNet) -> io::Result<()> {
        self.add_address_with(index, addr, AddressOptions::default())
    }

    pub fn add_address_with(
        &mut self,
        index: u32,
        addr: IpNet,
        options: AddressOptions,
    ) -> io::Result<()> {
        let mut message = address_message(index, &addr);
        if let Some(scope) = options.scope {
            message.header.scope = u8::from(scope).into();
        }
        let mut flags = AddressFlags::empty();
        if options.nodad {
            flags |= AddressFlags::Nodad;
            message.header.flags |= AddressHeaderFlags::Nodad;
        }
        if options.noprefixroute {
            flags |= AddressFlags::Noprefixroute;
        }
        if !flags.is_empty() {
            message.attributes.push(AddressAttribute::Flags(flags));
        }
        // Like `ip addr add ... brd +` and the Go netlink library: IPv4 subnets get their broadcast address.
        if let IpNet::V4(net) = addr {
            if net.prefix_len() < 31 {
                let broadcast: Ipv4Addr = net.broadcast();
                message
                    .attributes
                    .push(AddressAttribute::Broadcast(broadcast));
            }
        }
        self.request(
            RouteNetlinkMessage::NewAddress(message),
            NLM_F_CREATE | NLM_F_EXCL,
        )?;
        Ok(())
    }

    /// Removes `addr` from link `index` (EADDRNOTAVAIL if it is not there, see [`super::is_not_found`]).
    pub fn del_address(&mut self, index: u32, addr: IpNet) -> io::Result<()> {
        self.request(
            RouteNetlinkMessage::DelAddress(address_message(index, &addr)),
            0,
        )?;
        Ok(())
    }
}
