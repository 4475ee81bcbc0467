//! Neighbours (ARP/NDP entries, `ip neigh`) and bridge forwarding entries (`bridge fdb`), as a vxlan device
//! needs them when it does not learn: a permanent neighbour gives a remote tunnel endpoint's MAC, a permanent
//! FDB entry says which underlay address that MAC is behind.

use std::io;
use std::net::IpAddr;

use netlink_packet_core::{NLM_F_CREATE, NLM_F_REPLACE};

use super::link::AF_BRIDGE;
use super::wire::{self, attributes, Request};
use super::{IpFamily, Netlink};

/// Size of `struct ndmsg`.
const NDMSG_LEN: usize = 12;
const NDA_DST: u16 = 1;
const NDA_LLADDR: u16 = 2;

/// `NUD_PERMANENT`: an entry the kernel never ages out or probes.
pub const NUD_PERMANENT: u16 = 0x80;
/// `NTF_SELF`: an FDB entry of the device itself (the vxlan driver's table), not of a bridge master.
pub const NTF_SELF: u8 = 0x02;

/// An ARP (IPv4) or NDP (IPv6) entry on link `index`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Neighbour {
    pub index: u32,
    pub dst: IpAddr,
    pub mac: Option<[u8; 6]>,
    /// `NUD_*` state bits.
    pub state: u16,
}

/// A forwarding entry of link `index` (a bridge port, or a vxlan device with [`NTF_SELF`]): frames to `mac`
/// go to the remote tunnel endpoint `dst` (vxlan) or out of the port.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct FdbEntry {
    pub index: u32,
    pub mac: [u8; 6],
    pub dst: Option<IpAddr>,
    pub state: u16,
    /// `NTF_*` flags.
    pub flags: u8,
}

/// `struct ndmsg` {family, pad1, pad2, ifindex, state, flags, type}.
fn ndmsg(family: u8, index: u32, state: u16, flags: u8) -> [u8; NDMSG_LEN] {
    let mut header = [0; NDMSG_LEN];
    header[0] = family;
    header[4..8].copy_from_slice(&index.to_ne_bytes());
    header[8..10].copy_from_slice(&state.to_ne_bytes());
    header[10] = flags;
    header
}

fn family_of(ip: &IpAddr) -> u8 {
    match ip {
        IpAddr::V4(_) => libc::AF_INET as u8,
        IpAddr::V6(_) => libc::AF_INET6 as u8,
    }
}

/// The fields of a neighbour message: (family, index, state, flags, dst, lladdr).
type Parsed = (u8, u32, u16, u8, Option<IpAddr>, Option<[u8; 6]>);

fn parse(data: &[u8]) -> Option<Parsed> {
    let header = data.get(..NDMSG_LEN)?;
    let family = header[0];
    let index = wire::u32_at(header, 4)?;
    let state = u16::from_ne_bytes([header[8], header[9]]);
    let flags = header[10];
    let (mut dst, mut mac) = (None, None);
    for (kind, value) in attributes(&data[NDMSG_LEN..]) {
        match kind {
            NDA_DST => dst = wire::as_ip(value, value.len() == 16),
            NDA_LLADDR => mac = <[u8; 6]>::try_from(value).ok(),
            _ => {}
        }
    }
    Some((family, index, state, flags, dst, mac))
}

impl Neighbour {
    /// A permanent entry: `ip neigh replace <dst> lladdr <mac> dev <index> nud permanent`.
    pub fn permanent(index: u32, dst: IpAddr, mac: [u8; 6]) -> Neighbour {
        Neighbour { index, dst, mac: Some(mac), state: NUD_PERMANENT }
    }

    /// The request adding or replacing this entry (`RTM_NEWNEIGH`, to send with [`Neighbour::REPLACE`]).
    pub fn replace_request(&self) -> Request {
        let mut request = Request::new(libc::RTM_NEWNEIGH, &ndmsg(family_of(&self.dst), self.index, self.state, 0));
        request.attr_ip(NDA_DST, self.dst);
        if let Some(mac) = self.mac {
            request.attr(NDA_LLADDR, &mac);
        }
        request
    }

    /// The request deleting this entry.
    pub fn delete_request(&self) -> Request {
        let mut request = Request::new(libc::RTM_DELNEIGH, &ndmsg(family_of(&self.dst), self.index, 0, 0));
        request.attr_ip(NDA_DST, self.dst);
        request
    }

    /// Flags to send [`Neighbour::replace_request`] with.
    pub const REPLACE: u16 = NLM_F_CREATE | NLM_F_REPLACE;
}

impl FdbEntry {
    /// A permanent vxlan entry: `bridge fdb replace <mac> dev <index> dst <dst> self permanent`.
    pub fn vxlan(index: u32, mac: [u8; 6], dst: IpAddr) -> FdbEntry {
        FdbEntry { index, mac, dst: Some(dst), state: NUD_PERMANENT, flags: NTF_SELF }
    }

    /// The request adding or replacing this entry (send with [`FdbEntry::REPLACE`]).
    pub fn replace_request(&self) -> Request {
        let mut request = Request::new(libc::RTM_NEWNEIGH, &ndmsg(AF_BRIDGE, self.index, self.state, self.flags));
        request.attr(NDA_LLADDR, &self.mac);
        if let Some(dst) = self.dst {
            request.attr_ip(NDA_DST, dst);
        }
        request
    }

    /// The request deleting this entry (the MAC and, for vxlan, the remote select it).
    pub fn delete_request(&self) -> Request {
        let mut request = Request::new(libc::RTM_DELNEIGH, &ndmsg(AF_BRIDGE, self.index, 0, self.flags));
        request.attr(NDA_LLADDR, &self.mac);
        if let Some(dst) = self.dst {
            request.attr_ip(NDA_DST, dst);
        }
        request
    }

    pub const REPLACE: u16 = NLM_F_CREATE | NLM_F_REPLACE;
}

impl Netlink {
    /// The ARP (`V4`) or NDP (`V6`) entries, of link `index` only when given.
    pub fn neighbours(&mut self, family: IpFamily, index: Option<u32>) -> io::Result<Vec<Neighbour>> {
        let family = match family {
            IpFamily::V4 => libc::AF_INET as u8,
            IpFamily::V6 => libc::AF_INET6 as u8,
        };
        let mut request = Request::new(libc::RTM_GETNEIGH, &ndmsg(family, 0, 0, 0));
        Ok(self
            .dump(&mut request, libc::RTM_NEWNEIGH, parse)?
            .into_iter()
            .filter(|parsed| parsed.0 == family && index.is_none_or(|index| parsed.1 == index))
            .filter_map(|(_, index, state, _, dst, mac)| Some(Neighbour { index, dst: dst?, mac, state }))
            .collect())
    }

    /// The forwarding entries of link `index` (`bridge fdb show dev <index>`).
    pub fn fdb(&mut self, index: u32) -> io::Result<Vec<FdbEntry>> {
        let mut request = Request::new(libc::RTM_GETNEIGH, &ndmsg(AF_BRIDGE, 0, 0, 0));
        Ok(self
            .dump(&mut request, libc::RTM_NEWNEIGH, parse)?
            .into_iter()
            .filter(|parsed| parsed.0 == AF_BRIDGE && parsed.1 == index)
            .filter_map(|(_, index, state, flags, dst, mac)| Some(FdbEntry { index, mac: mac?, dst, state, flags }))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    //! Requests compared byte for byte with netlink-packet-route's, and the parser fed its messages.
    use netlink_packet_route::neighbour::{
        NeighbourAddress, NeighbourAttribute, NeighbourFlags, NeighbourMessage, NeighbourState,
    };
    use netlink_packet_route::AddressFamily;

    use super::*;
    use crate::netlink::wire::emitted;

    const MAC: [u8; 6] = [0x0e, 0xfa, 192, 168, 0, 3];

    fn reference(family: AddressFamily, index: u32, state: NeighbourState, flags: NeighbourFlags) -> NeighbourMessage {
        let mut message = NeighbourMessage::default();
        message.header.family = family;
        message.header.ifindex = index;
        message.header.state = state;
        message.header.flags = flags;
        message
    }

    #[test]
    fn neighbour_requests() {
        let neighbour = Neighbour::permanent(7, "10.244.3.0".parse().unwrap(), MAC);
        let mut expected = reference(AddressFamily::Inet, 7, NeighbourState::Permanent, NeighbourFlags::empty());
        expected.attributes = vec![
            NeighbourAttribute::Destination(NeighbourAddress::Inet("10.244.3.0".parse().unwrap())),
            NeighbourAttribute::LinkLayerAddress(MAC.to_vec()),
        ];
        assert_eq!(neighbour.replace_request().payload(), emitted(&expected));

        let mut expected = reference(AddressFamily::Inet, 7, NeighbourState::Other(0), NeighbourFlags::empty());
        expected.attributes =
            vec![NeighbourAttribute::Destination(NeighbourAddress::Inet("10.244.3.0".parse().unwrap()))];
        assert_eq!(neighbour.delete_request().payload(), emitted(&expected));
    }

    #[test]
    fn fdb_requests() {
        let entry = FdbEntry::vxlan(7, MAC, "192.168.0.3".parse().unwrap());
        let mut expected = reference(AddressFamily::Bridge, 7, NeighbourState::Permanent, NeighbourFlags::Own);
        expected.attributes = vec![
            NeighbourAttribute::LinkLayerAddress(MAC.to_vec()),
            NeighbourAttribute::Destination(NeighbourAddress::Inet("192.168.0.3".parse().unwrap())),
        ];
        assert_eq!(entry.replace_request().payload(), emitted(&expected));
        expected.header.state = NeighbourState::Other(0);
        assert_eq!(entry.delete_request().payload(), emitted(&expected));
    }

    #[test]
    fn parses_entries() {
        let mut reported = reference(AddressFamily::Bridge, 9, NeighbourState::Permanent, NeighbourFlags::Own);
        reported.attributes = vec![
            NeighbourAttribute::LinkLayerAddress(MAC.to_vec()),
            NeighbourAttribute::Destination(NeighbourAddress::Inet("192.168.0.3".parse().unwrap())),
            NeighbourAttribute::Vni(1),
        ];
        let parsed = parse(&emitted(&reported)).unwrap();
        assert_eq!(parsed, (AF_BRIDGE, 9, NUD_PERMANENT, NTF_SELF, Some("192.168.0.3".parse().unwrap()), Some(MAC)));

        let mut reported = reference(AddressFamily::Inet6, 2, NeighbourState::Reachable, NeighbourFlags::empty());
        reported.attributes =
            vec![NeighbourAttribute::Destination(NeighbourAddress::Inet6("fd00::1".parse().unwrap()))];
        let parsed = parse(&emitted(&reported)).unwrap();
        assert_eq!((parsed.4, parsed.5), (Some("fd00::1".parse().unwrap()), None));
        assert!(parse(&[0; 4]).is_none());
    }
}
