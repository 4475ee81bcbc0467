//! A wireguard device's key, port and peers over generic netlink (the `wireguard` family, as `wg` speaks it):
//! the device read with `WG_CMD_GET_DEVICE`, changed with `WG_CMD_SET_DEVICE`. No `wg` process.
//!
//! Keys are 32 bytes; a private key is sent, never read back into anything that is printed.

use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};

use ipnet::IpNet;

use super::genl::{genl_request, Genl};
use super::wire::{self, attributes, Request, NLA_F_NESTED};

const WG_GENL_NAME: &str = "wireguard";
const WG_GENL_VERSION: u8 = 1;
const WG_CMD_GET_DEVICE: u8 = 0;
const WG_CMD_SET_DEVICE: u8 = 1;

const WGDEVICE_A_IFINDEX: u16 = 1;
const WGDEVICE_A_PRIVATE_KEY: u16 = 3;
const WGDEVICE_A_PUBLIC_KEY: u16 = 4;
const WGDEVICE_A_LISTEN_PORT: u16 = 6;
const WGDEVICE_A_PEERS: u16 = 8;

const WGPEER_A_PUBLIC_KEY: u16 = 1;
const WGPEER_A_PRESHARED_KEY: u16 = 2;
const WGPEER_A_FLAGS: u16 = 3;
const WGPEER_A_ENDPOINT: u16 = 4;
const WGPEER_A_PERSISTENT_KEEPALIVE_INTERVAL: u16 = 5;
const WGPEER_A_ALLOWEDIPS: u16 = 9;
const WGPEER_F_REMOVE_ME: u32 = 1;
const WGPEER_F_REPLACE_ALLOWEDIPS: u32 = 2;

const WGALLOWEDIP_A_FAMILY: u16 = 1;
const WGALLOWEDIP_A_IPADDR: u16 = 2;
const WGALLOWEDIP_A_CIDR_MASK: u16 = 3;

/// At most this many peers go in one `WG_CMD_SET_DEVICE` (a message stays well under a page per peer).
const PEERS_PER_MESSAGE: usize = 32;

/// A peer as the device holds it (or should).
#[derive(Clone, PartialEq, Eq)]
pub struct WgPeer {
    pub public_key: [u8; 32],
    pub preshared_key: Option<[u8; 32]>,
    pub endpoint: Option<SocketAddr>,
    /// Seconds; 0 is off.
    pub keepalive: u16,
    pub allowed_ips: Vec<IpNet>,
}

impl std::fmt::Debug for WgPeer {
    /// Without the preshared key.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WgPeer")
            .field("public_key", &self.public_key)
            .field("preshared_key", &self.preshared_key.map(|_| "(set)"))
            .field("endpoint", &self.endpoint)
            .field("keepalive", &self.keepalive)
            .field("allowed_ips", &self.allowed_ips)
            .finish()
    }
}

/// What a device says about itself (its private key is not kept: only whether it has the wanted one).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WgDevice {
    pub public_key: Option<[u8; 32]>,
    pub listen_port: u16,
    pub peers: Vec<WgPeer>,
}

/// One change of a device's peers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeerChange {
    /// Added, or set to exactly this (its allowed IPs replaced).
    Put(WgPeer),
    Remove([u8; 32]),
}

fn sockaddr(endpoint: SocketAddr) -> Vec<u8> {
    // struct sockaddr_in / sockaddr_in6: the family in host order, the port in network order.
    let mut bytes = Vec::with_capacity(28);
    match endpoint {
        SocketAddr::V4(v4) => {
            bytes.extend_from_slice(&(libc::AF_INET as u16).to_ne_bytes());
            bytes.extend_from_slice(&v4.port().to_be_bytes());
            bytes.extend_from_slice(&v4.ip().octets());
            bytes.extend_from_slice(&[0; 8]);
        }
        SocketAddr::V6(v6) => {
            bytes.extend_from_slice(&(libc::AF_INET6 as u16).to_ne_bytes());
            bytes.extend_from_slice(&v6.port().to_be_bytes());
            bytes.extend_from_slice(&v6.flowinfo().to_be_bytes());
            bytes.extend_from_slice(&v6.ip().octets());
            bytes.extend_from_slice(&v6.scope_id().to_ne_bytes());
        }
    }
    bytes
}

fn parse_sockaddr(value: &[u8]) -> Option<SocketAddr> {
    let family = u16::from_ne_bytes(value.get(0..2)?.try_into().ok()?);
    let port = u16::from_be_bytes(value.get(2..4)?.try_into().ok()?);
    match i32::from(family) {
        libc::AF_INET => {
            Some(SocketAddr::new(Ipv4Addr::from(<[u8; 4]>::try_from(value.get(4..8)?).ok()?).into(), port))
        }
        libc::AF_INET6 => {
            Some(SocketAddr::new(Ipv6Addr::from(<[u8; 16]>::try_from(value.get(8..24)?).ok()?).into(), port))
        }
        _ => None,
    }
}

fn add_peer(request: &mut Request, change: &PeerChange) {
    let peer = request.begin_nested(NLA_F_NESTED);
    match change {
        PeerChange::Remove(key) => {
            request.attr(WGPEER_A_PUBLIC_KEY, key);
            request.attr_u32(WGPEER_A_FLAGS, WGPEER_F_REMOVE_ME);
        }
        PeerChange::Put(wanted) => {
            request.attr(WGPEER_A_PUBLIC_KEY, &wanted.public_key);
            request.attr_u32(WGPEER_A_FLAGS, WGPEER_F_REPLACE_ALLOWEDIPS);
            // All zeros removes a preshared key.
            request.attr(WGPEER_A_PRESHARED_KEY, &wanted.preshared_key.unwrap_or([0; 32]));
            if let Some(endpoint) = wanted.endpoint {
                request.attr(WGPEER_A_ENDPOINT, &sockaddr(endpoint));
            }
            request.attr(WGPEER_A_PERSISTENT_KEEPALIVE_INTERVAL, &wanted.keepalive.to_ne_bytes());
            let ips = request.begin_nested(WGPEER_A_ALLOWEDIPS | NLA_F_NESTED);
            for ip in &wanted.allowed_ips {
                let entry = request.begin_nested(NLA_F_NESTED);
                let family = if ip.addr().is_ipv4() { libc::AF_INET } else { libc::AF_INET6 };
                request.attr(WGALLOWEDIP_A_FAMILY, &(family as u16).to_ne_bytes());
                request.attr_ip(WGALLOWEDIP_A_IPADDR, ip.network());
                request.attr_u8(WGALLOWEDIP_A_CIDR_MASK, ip.prefix_len());
                request.end_nested(entry);
            }
            request.end_nested(ips);
        }
    }
    request.end_nested(peer);
}

/// `WG_CMD_SET_DEVICE` for the device `index`: its private key and port when given, and `peers`' changes.
fn set_device_request(
    family: u16,
    index: u32,
    private_key: Option<&[u8; 32]>,
    listen_port: Option<u16>,
    peers: &[PeerChange],
) -> Request {
    let mut request = genl_request(family, WG_CMD_SET_DEVICE, WG_GENL_VERSION);
    request.attr_u32(WGDEVICE_A_IFINDEX, index);
    if let Some(key) = private_key {
        request.attr(WGDEVICE_A_PRIVATE_KEY, key);
    }
    if let Some(port) = listen_port {
        request.attr(WGDEVICE_A_LISTEN_PORT, &port.to_ne_bytes());
    }
    if !peers.is_empty() {
        let nest = request.begin_nested(WGDEVICE_A_PEERS | NLA_F_NESTED);
        for change in peers {
            add_peer(&mut request, change);
        }
        request.end_nested(nest);
    }
    request
}

fn get_device_request(family: u16, index: u32) -> Request {
    let mut request = genl_request(family, WG_CMD_GET_DEVICE, WG_GENL_VERSION);
    request.attr_u32(WGDEVICE_A_IFINDEX, index);
    request
}

fn parse_allowed_ip(data: &[u8]) -> Option<IpNet> {
    let (mut address, mut mask) = (None, None);
    for (kind, value) in attributes(data) {
        match kind {
            WGALLOWEDIP_A_IPADDR => address = wire::as_ip(value, value.len() == 16),
            WGALLOWEDIP_A_CIDR_MASK => mask = wire::as_u8(value),
            _ => {}
        }
    }
    IpNet::new(address?, mask?).ok()
}

fn parse_peer(data: &[u8]) -> Option<WgPeer> {
    let key = |value: &[u8]| <[u8; 32]>::try_from(value).ok();
    let mut peer =
        WgPeer { public_key: [0; 32], preshared_key: None, endpoint: None, keepalive: 0, allowed_ips: Vec::new() };
    let mut has_key = false;
    for (kind, value) in attributes(data) {
        match kind {
            WGPEER_A_PUBLIC_KEY => {
                peer.public_key = key(value)?;
                has_key = true;
            }
            WGPEER_A_PRESHARED_KEY => peer.preshared_key = key(value).filter(|k| *k != [0; 32]),
            WGPEER_A_ENDPOINT => peer.endpoint = parse_sockaddr(value),
            WGPEER_A_PERSISTENT_KEEPALIVE_INTERVAL => peer.keepalive = wire::as_u16(value).unwrap_or(0),
            WGPEER_A_ALLOWEDIPS => {
                peer.allowed_ips.extend(attributes(value).filter_map(|(_, entry)| parse_allowed_ip(entry)))
            }
            _ => {}
        }
    }
    has_key.then_some(peer)
}

/// Adds one message of a `WG_CMD_GET_DEVICE` dump to `device`. A peer with many allowed IPs continues in the
/// next message under the same key: its IPs are joined.
fn parse_device_message(data: &[u8], device: &mut WgDevice) {
    let Some(attrs) = data.get(4..) else { return };
    for (kind, value) in attributes(attrs) {
        match kind {
            WGDEVICE_A_PUBLIC_KEY => device.public_key = <[u8; 32]>::try_from(value).ok(),
            WGDEVICE_A_LISTEN_PORT => device.listen_port = wire::as_u16(value).unwrap_or(0),
            WGDEVICE_A_PEERS => {
                for peer in attributes(value).filter_map(|(_, peer)| parse_peer(peer)) {
                    match device.peers.last_mut() {
                        Some(last) if last.public_key == peer.public_key => last.allowed_ips.extend(peer.allowed_ips),
                        _ => device.peers.push(peer),
                    }
                }
            }
            _ => {}
        }
    }
}

/// The wireguard devices of one namespace, through its generic netlink socket.
pub struct Wireguard {
    genl: Genl,
    family: u16,
}

impl Wireguard {
    /// A socket in the calling thread's namespace and the family's id: ENOENT when the kernel has no
    /// wireguard.
    pub fn new() -> io::Result<Wireguard> {
        let mut genl = Genl::new()?;
        let family = genl.family_id(WG_GENL_NAME)?;
        Ok(Wireguard { genl, family })
    }

    /// The device `index`: its public key, port and peers.
    pub fn device(&mut self, index: u32) -> io::Result<WgDevice> {
        let replies =
            self.genl.request(&mut get_device_request(self.family, index), netlink_packet_core::NLM_F_DUMP)?;
        let mut device = WgDevice::default();
        for reply in replies.iter().filter(|reply| reply.message_type == self.family) {
            parse_device_message(&reply.data, &mut device);
        }
        Ok(device)
    }

    /// Sets the device's private key and listen port.
    pub fn configure(&mut self, index: u32, private_key: &[u8; 32], listen_port: u16) -> io::Result<()> {
        self.genl.request(&mut set_device_request(self.family, index, Some(private_key), Some(listen_port), &[]), 0)?;
        Ok(())
    }

    /// Applies `changes` to the device's peers, a bounded number per message.
    pub fn change_peers(&mut self, index: u32, changes: &[PeerChange]) -> io::Result<()> {
        for chunk in changes.chunks(PEERS_PER_MESSAGE) {
            self.genl.request(&mut set_device_request(self.family, index, None, None, chunk), 0)?;
        }
        Ok(())
    }
}

/// The changes that make `observed` peers the `wanted` ones: puts of the missing or different, removals of
/// the others.
pub fn peer_changes(wanted: &[WgPeer], observed: &[WgPeer]) -> Vec<PeerChange> {
    let same = |a: &WgPeer, b: &WgPeer| {
        let sorted = |p: &WgPeer| {
            let mut ips: Vec<IpNet> = p.allowed_ips.iter().map(|ip| ip.trunc()).collect();
            ips.sort();
            ips
        };
        (a.preshared_key, a.endpoint, a.keepalive) == (b.preshared_key, b.endpoint, b.keepalive)
            && sorted(a) == sorted(b)
    };
    let mut changes: Vec<PeerChange> = wanted
        .iter()
        .filter(|w| !observed.iter().any(|o| o.public_key == w.public_key && same(w, o)))
        .map(|w| PeerChange::Put(w.clone()))
        .collect();
    changes.extend(
        observed
            .iter()
            .filter(|o| !wanted.iter().any(|w| w.public_key == o.public_key))
            .map(|o| PeerChange::Remove(o.public_key)),
    );
    changes
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use super::*;

    fn peer() -> WgPeer {
        WgPeer {
            public_key: [7; 32],
            preshared_key: None,
            endpoint: Some("192.168.50.11:51820".parse().unwrap()),
            keepalive: 25,
            allowed_ips: vec!["10.244.2.0/24".parse().unwrap()],
        }
    }

    /// An attribute as the kernel's UAPI lays it out: length, type, payload, padding.
    fn nla(kind: u16, payload: &[u8]) -> Vec<u8> {
        let mut bytes = ((4 + payload.len()) as u16).to_le_bytes().to_vec();
        bytes.extend_from_slice(&kind.to_le_bytes());
        bytes.extend_from_slice(payload);
        bytes.resize((bytes.len() + 3) & !3, 0);
        bytes
    }

    #[test]
    fn set_device_with_key_and_port() {
        let request = set_device_request(0x1c, 5, Some(&[1; 32]), Some(51820), &[]);
        let mut expected = vec![WG_CMD_SET_DEVICE, 1, 0, 0];
        expected.extend(nla(1, &5u32.to_le_bytes()));
        expected.extend(nla(3, &[1; 32]));
        expected.extend(nla(6, &51820u16.to_le_bytes()));
        assert_eq!(request.payload(), &expected[..]);
        assert_eq!(request.payload().len(), 4 + 8 + 36 + 8);
    }

    #[test]
    fn set_peers_put_and_remove() {
        let request = set_device_request(0x1c, 5, None, None, &[PeerChange::Put(peer()), PeerChange::Remove([9; 32])]);
        let mut sockaddr_in = vec![2, 0, 0xca, 0x6c, 192, 168, 50, 11];
        sockaddr_in.extend_from_slice(&[0; 8]);
        let mut allowed = nla(1, &2u16.to_le_bytes());
        allowed.extend(nla(2, &[10, 244, 2, 0]));
        allowed.extend(nla(3, &[24]));
        let mut put = nla(1, &[7; 32]);
        put.extend(nla(3, &2u32.to_le_bytes()));
        put.extend(nla(2, &[0; 32]));
        put.extend(nla(4, &sockaddr_in));
        put.extend(nla(5, &25u16.to_le_bytes()));
        put.extend(nla(9 | 0x8000, &nla(0x8000, &allowed)));
        let mut remove = nla(1, &[9; 32]);
        remove.extend(nla(3, &1u32.to_le_bytes()));
        let mut peers = nla(0x8000, &put);
        peers.extend(nla(0x8000, &remove));
        let mut expected = vec![WG_CMD_SET_DEVICE, 1, 0, 0];
        expected.extend(nla(1, &5u32.to_le_bytes()));
        expected.extend(nla(8 | 0x8000, &peers));
        assert_eq!(request.payload(), &expected[..]);
    }

    #[test]
    fn get_device_and_its_answer() {
        assert_eq!(get_device_request(0x1c, 5).payload(), &[0, 1, 0, 0, 8, 0, 1, 0, 5, 0, 0, 0]);
        // An IPv6 peer, its allowed IPs split over two messages, as a dump of a large device gives them.
        let mut sockaddr_in6 = vec![10, 0, 0xca, 0x6d, 0, 0, 0, 0];
        sockaddr_in6.extend_from_slice(&"fd00:50::11".parse::<Ipv6Addr>().unwrap().octets());
        sockaddr_in6.extend_from_slice(&[0; 4]);
        let allowed = |net: &str| {
            let net: IpNet = net.parse().unwrap();
            let mut entry = nla(1, &10u16.to_le_bytes());
            let IpAddr::V6(address) = net.addr() else { unreachable!() };
            entry.extend(nla(2, &address.octets()));
            entry.extend(nla(3, &[net.prefix_len()]));
            nla(0x8000, &entry)
        };
        let message = |ips: &str| {
            let mut peer = nla(1, &[3; 32]);
            peer.extend(nla(2, &[0; 32]));
            peer.extend(nla(4, &sockaddr_in6));
            peer.extend(nla(5, &0u16.to_le_bytes()));
            peer.extend(nla(9 | 0x8000, &allowed(ips)));
            let mut data = vec![WG_CMD_GET_DEVICE, 1, 0, 0];
            data.extend(nla(4, &[8; 32]));
            data.extend(nla(6, &51821u16.to_le_bytes()));
            data.extend(nla(8 | 0x8000, &nla(0x8000, &peer)));
            data
        };
        let mut device = WgDevice::default();
        parse_device_message(&message("fd00:10:244:2::/64"), &mut device);
        parse_device_message(&message("fd00:10:244:9::/64"), &mut device);
        assert_eq!(device.public_key, Some([8; 32]));
        assert_eq!(device.listen_port, 51821);
        assert_eq!(device.peers.len(), 1);
        let peer = &device.peers[0];
        assert_eq!(peer.endpoint, Some("[fd00:50::11]:51821".parse().unwrap()));
        assert_eq!(peer.preshared_key, None, "all zeros: none");
        let ips: Vec<String> = peer.allowed_ips.iter().map(|n| n.to_string()).collect();
        assert_eq!(ips, ["fd00:10:244:2::/64", "fd00:10:244:9::/64"]);
        assert_eq!(parse_sockaddr(&sockaddr("[fd00:50::11]:51821".parse().unwrap())), peer.endpoint);
    }

    #[test]
    fn peer_changes_put_what_differs_and_remove_the_rest() {
        let wanted = vec![peer(), WgPeer { public_key: [8; 32], ..peer() }];
        let mut moved = peer();
        moved.endpoint = Some("192.168.50.99:51820".parse().unwrap());
        let observed = vec![moved, WgPeer { public_key: [9; 32], ..peer() }];
        let changes = peer_changes(&wanted, &observed);
        assert_eq!(
            changes,
            [
                PeerChange::Put(peer()),
                PeerChange::Put(WgPeer { public_key: [8; 32], ..peer() }),
                PeerChange::Remove([9; 32])
            ]
        );
        assert!(peer_changes(&wanted, &wanted).is_empty(), "in sync");
        let psk = WgPeer { preshared_key: Some([5; 32]), ..peer() };
        assert!(!format!("{psk:?}").contains("5, 5"), "a preshared key is never printed");
    }
}
