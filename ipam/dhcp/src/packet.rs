//! DHCPv4 messages (RFC 2131, options RFC 2132 and RFC 3442), built and parsed byte for byte.

use serde::{Deserialize, Serialize};
use std::net::Ipv4Addr;

pub const SERVER_PORT: u16 = 67;
pub const CLIENT_PORT: u16 = 68;
const MAGIC: [u8; 4] = [99, 130, 83, 99];
/// op, htype, ... file: the fixed part before the magic cookie.
const FIXED_LEN: usize = 236;
/// BOOTP's minimum message; some relays and servers drop shorter ones.
const MIN_LEN: usize = 300;
const BROADCAST_FLAG: u16 = 0x8000;

pub mod opt {
    pub const PAD: u8 = 0;
    pub const SUBNET_MASK: u8 = 1;
    pub const ROUTER: u8 = 3;
    pub const DNS: u8 = 6;
    pub const HOST_NAME: u8 = 12;
    pub const STATIC_ROUTES: u8 = 33;
    pub const REQUESTED_IP: u8 = 50;
    pub const LEASE_TIME: u8 = 51;
    pub const MESSAGE_TYPE: u8 = 53;
    pub const SERVER_ID: u8 = 54;
    pub const PARAMETER_LIST: u8 = 55;
    pub const MESSAGE: u8 = 56;
    pub const RENEWAL_TIME: u8 = 58;
    pub const REBINDING_TIME: u8 = 59;
    pub const CLASS_ID: u8 = 60;
    pub const CLIENT_ID: u8 = 61;
    pub const USER_CLASS: u8 = 77;
    pub const CLASSLESS_ROUTES: u8 = 121;
    pub const END: u8 = 255;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum MessageType {
    Discover = 1,
    Offer = 2,
    Request = 3,
    Decline = 4,
    Ack = 5,
    Nak = 6,
    Release = 7,
    Inform = 8,
}

impl MessageType {
    fn from_u8(v: u8) -> Option<MessageType> {
        use MessageType::*;
        Some(match v {
            1 => Discover,
            2 => Offer,
            3 => Request,
            4 => Decline,
            5 => Ack,
            6 => Nak,
            7 => Release,
            8 => Inform,
            _ => return None,
        })
    }
}

/// A message from the client: what differs between DISCOVER, the REQUESTs of each state and RELEASE.
#[derive(Debug, Clone)]
pub struct ClientMessage<'a> {
    pub kind: MessageType,
    pub xid: u32,
    pub mac: [u8; 6],
    pub broadcast: bool,
    /// The client's address: set when renewing, rebinding and releasing (RFC 2131 table 5).
    pub ciaddr: Ipv4Addr,
    /// Option 50: only in the REQUEST of the SELECTING state (and INIT-REBOOT).
    pub requested_ip: Option<Ipv4Addr>,
    /// Option 54: only in the REQUEST of the SELECTING state and in RELEASE.
    pub server_id: Option<Ipv4Addr>,
    /// Option 61, as the reference builds it: type 0 then the client ID's bytes.
    pub client_id: &'a [u8],
    /// Further options (parameter request list, provided options), in order, one code each.
    pub extra: &'a [(u8, Vec<u8>)],
}

impl ClientMessage<'_> {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(MIN_LEN + 64);
        b.extend_from_slice(&[1, 1, 6, 0]);
        b.extend_from_slice(&self.xid.to_be_bytes());
        b.extend_from_slice(&0u16.to_be_bytes()); // secs
        b.extend_from_slice(&(if self.broadcast { BROADCAST_FLAG } else { 0 }).to_be_bytes());
        b.extend_from_slice(&self.ciaddr.octets());
        b.extend_from_slice(&[0; 12]); // yiaddr, siaddr, giaddr
        b.extend_from_slice(&self.mac);
        b.resize(FIXED_LEN, 0); // rest of chaddr, sname, file
        b.extend_from_slice(&MAGIC);
        put_option(&mut b, opt::MESSAGE_TYPE, &[self.kind as u8]);
        if let Some(ip) = self.requested_ip {
            put_option(&mut b, opt::REQUESTED_IP, &ip.octets());
        }
        if let Some(ip) = self.server_id {
            put_option(&mut b, opt::SERVER_ID, &ip.octets());
        }
        let mut id = Vec::with_capacity(self.client_id.len() + 1);
        id.push(0);
        id.extend_from_slice(self.client_id);
        put_option(&mut b, opt::CLIENT_ID, &id);
        if self.kind != MessageType::Release {
            for (code, value) in self.extra {
                put_option(&mut b, *code, value);
            }
        }
        b.push(opt::END);
        if b.len() < MIN_LEN {
            b.resize(MIN_LEN, opt::PAD);
        }
        b
    }
}

/// Options longer than 255 bytes are split into several instances (RFC 3396).
fn put_option(b: &mut Vec<u8>, code: u8, value: &[u8]) {
    let mut chunks = value.chunks(255).peekable();
    if chunks.peek().is_none() {
        b.extend_from_slice(&[code, 0]);
    }
    for chunk in chunks {
        b.push(code);
        b.push(chunk.len() as u8);
        b.extend_from_slice(chunk);
    }
}

/// A route from option 121 (or 33): destination, prefix length, router (0.0.0.0 = on link).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StaticRoute {
    pub dst: Ipv4Addr,
    pub prefix: u8,
    pub router: Ipv4Addr,
}

/// A message from a server, with the options a client acts on decoded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerMessage {
    pub kind: MessageType,
    pub xid: u32,
    pub chaddr: [u8; 6],
    pub yiaddr: Ipv4Addr,
    pub server_id: Option<Ipv4Addr>,
    pub subnet_mask: Option<Ipv4Addr>,
    pub routers: Vec<Ipv4Addr>,
    pub dns: Vec<Ipv4Addr>,
    pub lease_time: Option<u32>,
    pub renewal_time: Option<u32>,
    pub rebinding_time: Option<u32>,
    pub classless_routes: Vec<StaticRoute>,
    pub static_routes: Vec<StaticRoute>,
    pub message: Option<String>,
}

impl ServerMessage {
    /// An ACK with nothing in it: what a lease holds before its first ACK, and a base for tests.
    pub fn empty_ack() -> ServerMessage {
        ServerMessage {
            kind: MessageType::Ack,
            xid: 0,
            chaddr: [0; 6],
            yiaddr: Ipv4Addr::UNSPECIFIED,
            server_id: None,
            subnet_mask: None,
            routers: vec![],
            dns: vec![],
            lease_time: None,
            renewal_time: None,
            rebinding_time: None,
            classless_routes: vec![],
            static_routes: vec![],
            message: None,
        }
    }

    /// Parses a BOOTREPLY; `None` for anything else (requests, truncated or foreign packets).
    pub fn decode(b: &[u8]) -> Option<ServerMessage> {
        if b.len() < FIXED_LEN + 4 || b[0] != 2 || b[1] != 1 || b[2] != 6 || b[FIXED_LEN..FIXED_LEN + 4] != MAGIC {
            return None;
        }
        let xid = u32::from_be_bytes(b[4..8].try_into().ok()?);
        let yiaddr = ipv4(&b[16..20])?;
        let chaddr: [u8; 6] = b[28..34].try_into().ok()?;
        // Options of one code are concatenated in order (RFC 3396).
        let mut options: Vec<(u8, Vec<u8>)> = Vec::new();
        let mut rest = &b[FIXED_LEN + 4..];
        while let Some((&code, tail)) = rest.split_first() {
            match code {
                opt::PAD => rest = tail,
                opt::END => break,
                _ => {
                    let (&len, tail) = tail.split_first()?;
                    let value = tail.get(..len as usize)?;
                    match options.iter_mut().find(|(c, _)| *c == code) {
                        Some((_, v)) => v.extend_from_slice(value),
                        None => options.push((code, value.to_vec())),
                    }
                    rest = &tail[len as usize..];
                }
            }
        }
        let get = |code: u8| options.iter().find(|(c, _)| *c == code).map(|(_, v)| v.as_slice());
        let kind = MessageType::from_u8(*get(opt::MESSAGE_TYPE)?.first()?)?;
        let addr = |code| get(code).and_then(ipv4);
        let addrs = |code| get(code).map(|v| v.chunks_exact(4).filter_map(ipv4).collect()).unwrap_or_default();
        let secs = |code| get(code).and_then(|v| Some(u32::from_be_bytes(v.try_into().ok()?)));
        Some(ServerMessage {
            kind,
            xid,
            chaddr,
            yiaddr,
            server_id: addr(opt::SERVER_ID),
            subnet_mask: addr(opt::SUBNET_MASK),
            routers: addrs(opt::ROUTER),
            dns: addrs(opt::DNS),
            lease_time: secs(opt::LEASE_TIME),
            renewal_time: secs(opt::RENEWAL_TIME),
            rebinding_time: secs(opt::REBINDING_TIME),
            classless_routes: get(opt::CLASSLESS_ROUTES).map(parse_classless_routes).unwrap_or_default(),
            static_routes: get(opt::STATIC_ROUTES).map(parse_static_routes).unwrap_or_default(),
            message: get(opt::MESSAGE).map(|v| String::from_utf8_lossy(v).into_owned()),
        })
    }
}

fn ipv4(b: &[u8]) -> Option<Ipv4Addr> {
    let o: [u8; 4] = b.try_into().ok()?;
    Some(Ipv4Addr::from(o))
}

/// Option 121: (prefix length, the significant octets of the destination, router) repeated. A malformed
/// option is ignored whole, as RFC 3442 asks.
fn parse_classless_routes(mut v: &[u8]) -> Vec<StaticRoute> {
    let mut routes = Vec::new();
    while let Some((&prefix, tail)) = v.split_first() {
        if prefix > 32 {
            return Vec::new();
        }
        let octets = prefix.div_ceil(8) as usize;
        let Some(dst_part) = tail.get(..octets) else { return Vec::new() };
        let Some(router) = tail.get(octets..octets + 4).and_then(ipv4) else { return Vec::new() };
        let mut dst = [0u8; 4];
        dst[..octets].copy_from_slice(dst_part);
        routes.push(StaticRoute { dst: Ipv4Addr::from(dst), prefix, router });
        v = &tail[octets + 4..];
    }
    routes
}

/// Option 33: (destination, router) pairs with classful destinations.
fn parse_static_routes(v: &[u8]) -> Vec<StaticRoute> {
    v.chunks_exact(8)
        .filter_map(|c| {
            let dst = ipv4(&c[..4])?;
            let prefix = match dst.octets()[0] {
                0..=127 => 8,
                128..=191 => 16,
                _ => 24,
            };
            Some(StaticRoute { dst, prefix, router: ipv4(&c[4..])? })
        })
        .collect()
}

/// An IPv4 + UDP datagram around a DHCP message, for the packet socket (no address on the interface yet).
/// The UDP checksum is left 0 (optional over IPv4).
pub fn ip_udp_wrap(src: Ipv4Addr, dst: Ipv4Addr, src_port: u16, dst_port: u16, payload: &[u8]) -> Vec<u8> {
    let total = 20 + 8 + payload.len();
    let mut p = Vec::with_capacity(total);
    p.extend_from_slice(&[0x45, 0x10]); // version 4, IHL 5; TOS low delay as dhclient
    p.extend_from_slice(&(total as u16).to_be_bytes());
    p.extend_from_slice(&[0, 0, 0, 0]); // id, flags, fragment offset
    p.extend_from_slice(&[64, 17, 0, 0]); // TTL, UDP, checksum (below)
    p.extend_from_slice(&src.octets());
    p.extend_from_slice(&dst.octets());
    let sum = ip_checksum(&p);
    p[10..12].copy_from_slice(&sum.to_be_bytes());
    p.extend_from_slice(&src_port.to_be_bytes());
    p.extend_from_slice(&dst_port.to_be_bytes());
    p.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
    p.extend_from_slice(&[0, 0]);
    p.extend_from_slice(payload);
    p
}

fn ip_checksum(header: &[u8]) -> u16 {
    let mut sum: u32 = header.chunks(2).map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]))).sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// The UDP payload of an IPv4 packet to `dst_port`, as a packet socket hands it over.
pub fn udp_payload(packet: &[u8], dst_port: u16) -> Option<&[u8]> {
    let (&vihl, _) = packet.split_first()?;
    if vihl >> 4 != 4 || *packet.get(9)? != 17 {
        return None;
    }
    let ihl = usize::from(vihl & 0x0f) * 4;
    let udp = packet.get(ihl..)?;
    if u16::from_be_bytes([*udp.get(2)?, *udp.get(3)?]) != dst_port {
        return None;
    }
    let len = usize::from(u16::from_be_bytes([*udp.get(4)?, *udp.get(5)?]));
    udp.get(8..len.max(8))
}

/// A small deterministic generator for the corruption tests.
#[cfg(test)]
pub(crate) fn xorshift(mut seed: u64) -> impl FnMut() -> u64 {
    move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAC: [u8; 6] = [0x02, 0x42, 0xac, 0x11, 0x00, 0x02];

    fn header(b: &[u8]) -> String {
        b[..34].iter().map(|x| format!("{x:02x}")).collect()
    }

    fn options(b: &[u8]) -> Vec<u8> {
        let mut o = b[FIXED_LEN + 4..].to_vec();
        while o.last() == Some(&opt::PAD) {
            o.pop();
        }
        o
    }

    fn msg<'a>(kind: MessageType, extra: &'a [(u8, Vec<u8>)]) -> ClientMessage<'a> {
        ClientMessage {
            kind,
            xid: 0x01020304,
            mac: MAC,
            broadcast: false,
            ciaddr: Ipv4Addr::UNSPECIFIED,
            requested_ip: None,
            server_id: None,
            client_id: b"c1/net/eth0",
            extra,
        }
    }

    const CLIENT_ID_OPT: [u8; 14] = [61, 12, 0, b'c', b'1', b'/', b'n', b'e', b't', b'/', b'e', b't', b'h', b'0'];

    #[test]
    fn discover() {
        let extra = vec![(opt::PARAMETER_LIST, vec![3, 1]), (opt::HOST_NAME, b"pod".to_vec())];
        let mut m = msg(MessageType::Discover, &extra);
        m.broadcast = true;
        let b = m.encode();
        assert_eq!(b.len(), MIN_LEN);
        // op, htype, hlen, hops, xid, secs, flags (broadcast), ciaddr, yiaddr, siaddr, giaddr, chaddr
        assert_eq!(header(&b), "010106000102030400008000000000000000000000000000000000000242ac110002");
        assert!(b[44..FIXED_LEN].iter().all(|&x| x == 0));
        assert_eq!(b[FIXED_LEN..FIXED_LEN + 4], MAGIC);
        let mut want = vec![53, 1, 1];
        want.extend_from_slice(&CLIENT_ID_OPT);
        want.extend_from_slice(&[55, 2, 3, 1, 12, 3, b'p', b'o', b'd', 255]);
        assert_eq!(options(&b), want);
    }

    #[test]
    fn request_selecting_carries_requested_ip_and_server_id() {
        let extra = vec![(opt::PARAMETER_LIST, vec![3, 1])];
        let mut m = msg(MessageType::Request, &extra);
        m.requested_ip = Some(Ipv4Addr::new(10, 0, 0, 20));
        m.server_id = Some(Ipv4Addr::new(10, 0, 0, 1));
        let b = m.encode();
        assert_eq!(header(&b), "010106000102030400000000000000000000000000000000000000000242ac110002");
        let mut want = vec![53, 1, 3, 50, 4, 10, 0, 0, 20, 54, 4, 10, 0, 0, 1];
        want.extend_from_slice(&CLIENT_ID_OPT);
        want.extend_from_slice(&[55, 2, 3, 1, 255]);
        assert_eq!(options(&b), want);
    }

    #[test]
    fn request_init_reboot_asks_for_the_address_without_ciaddr_or_server_id() {
        let extra = vec![(opt::PARAMETER_LIST, vec![3, 1])];
        let mut m = msg(MessageType::Request, &extra);
        m.requested_ip = Some(Ipv4Addr::new(10, 0, 0, 20));
        let b = m.encode();
        assert_eq!(header(&b), "010106000102030400000000000000000000000000000000000000000242ac110002");
        let mut want = vec![53, 1, 3, 50, 4, 10, 0, 0, 20];
        want.extend_from_slice(&CLIENT_ID_OPT);
        want.extend_from_slice(&[55, 2, 3, 1, 255]);
        assert_eq!(options(&b), want);
    }

    #[test]
    fn request_renewing_and_rebinding_have_ciaddr_and_no_50_or_54() {
        let extra = vec![(opt::PARAMETER_LIST, vec![3, 1])];
        for broadcast in [false, true] {
            let mut m = msg(MessageType::Request, &extra);
            m.ciaddr = Ipv4Addr::new(10, 0, 0, 20);
            m.broadcast = broadcast;
            let b = m.encode();
            let flags = if broadcast { "8000" } else { "0000" };
            assert_eq!(header(&b), format!("01010600010203040000{flags}0a0000140000000000000000000000000242ac110002"));
            let mut want = vec![53, 1, 3];
            want.extend_from_slice(&CLIENT_ID_OPT);
            want.extend_from_slice(&[55, 2, 3, 1, 255]);
            assert_eq!(options(&b), want);
        }
    }

    #[test]
    fn release_has_ciaddr_server_id_and_client_id_only() {
        let extra = vec![(opt::PARAMETER_LIST, vec![3, 1])];
        let mut m = msg(MessageType::Release, &extra);
        m.ciaddr = Ipv4Addr::new(10, 0, 0, 20);
        m.server_id = Some(Ipv4Addr::new(10, 0, 0, 1));
        let b = m.encode();
        assert_eq!(
            header(&b),
            concat!("010106000102030400000000", "0a000014", "000000000000000000000000", "0242ac110002")
        );
        let mut want = vec![53, 1, 7, 54, 4, 10, 0, 0, 1];
        want.extend_from_slice(&CLIENT_ID_OPT);
        want.push(255);
        assert_eq!(options(&b), want);
    }

    #[test]
    fn long_client_id_is_split() {
        let id = vec![b'x'; 300];
        let m = ClientMessage { client_id: &id, ..msg(MessageType::Discover, &[]) };
        let o = options(&m.encode());
        assert_eq!(&o[..3], &[53, 1, 1]);
        assert_eq!(&o[3..6], &[61, 255, 0]);
        assert_eq!(o[3 + 2 + 255], 61);
        assert_eq!(o[3 + 2 + 255 + 1], 46);
    }

    fn ack_bytes() -> Vec<u8> {
        let mut b = vec![0u8; FIXED_LEN];
        b[..4].copy_from_slice(&[2, 1, 6, 0]);
        b[4..8].copy_from_slice(&0x01020304u32.to_be_bytes());
        b[16..20].copy_from_slice(&[10, 0, 0, 20]);
        b[20..24].copy_from_slice(&[10, 0, 0, 1]);
        b[28..34].copy_from_slice(&MAC);
        b.extend_from_slice(&MAGIC);
        #[rustfmt::skip]
        b.extend_from_slice(&[
            53, 1, 5,
            54, 4, 10, 0, 0, 1,
            1, 4, 255, 255, 255, 0,
            3, 8, 10, 0, 0, 1, 10, 0, 0, 2,
            6, 4, 10, 0, 0, 53,
            51, 4, 0, 0, 0x0e, 0x10,
            58, 4, 0, 0, 0x07, 0x08,
            0, // a pad in the middle
            59, 4, 0, 0, 0x0c, 0x4e,
            // 121: 192.168.0.0/16 via 10.0.0.1, 0.0.0.0/0 via 10.0.0.1, 10.9.8.0/24 on link;
            // split in two instances (RFC 3396)
            121, 5, 16, 192, 168, 10, 0,
            121, 15, 0, 1, 0, 10, 0, 0, 1, 24, 10, 9, 8, 0, 0, 0, 0,
            255,
        ]);
        b
    }

    #[test]
    fn ack_with_options_1_3_6_51_58_59_121() {
        let m = ServerMessage::decode(&ack_bytes()).expect("an ACK");
        let ip = Ipv4Addr::new;
        assert_eq!(
            m,
            ServerMessage {
                kind: MessageType::Ack,
                xid: 0x01020304,
                chaddr: MAC,
                yiaddr: ip(10, 0, 0, 20),
                server_id: Some(ip(10, 0, 0, 1)),
                subnet_mask: Some(ip(255, 255, 255, 0)),
                routers: vec![ip(10, 0, 0, 1), ip(10, 0, 0, 2)],
                dns: vec![ip(10, 0, 0, 53)],
                lease_time: Some(3600),
                renewal_time: Some(1800),
                rebinding_time: Some(3150),
                classless_routes: vec![
                    StaticRoute { dst: ip(192, 168, 0, 0), prefix: 16, router: ip(10, 0, 0, 1) },
                    StaticRoute { dst: ip(0, 0, 0, 0), prefix: 0, router: ip(10, 0, 0, 1) },
                    StaticRoute { dst: ip(10, 9, 8, 0), prefix: 24, router: ip(0, 0, 0, 0) },
                ],
                static_routes: vec![],
                message: None,
            }
        );
    }

    #[test]
    fn malformed_replies_are_ignored() {
        let good = ack_bytes();
        assert!(ServerMessage::decode(&good[..100]).is_none());
        let mut request = good.clone();
        request[0] = 1;
        assert!(ServerMessage::decode(&request).is_none());
        // An option running past the end.
        let mut cut = good[..FIXED_LEN + 4].to_vec();
        cut.extend_from_slice(&[53, 1, 5, 3, 8, 10, 0]);
        assert!(ServerMessage::decode(&cut).is_none());
        // No message type.
        let mut no_type = good[..FIXED_LEN + 4].to_vec();
        no_type.push(255);
        assert!(ServerMessage::decode(&no_type).is_none());
        // A malformed option 121 is dropped whole.
        assert!(parse_classless_routes(&[33, 1, 2, 3, 4, 5, 6, 7, 8]).is_empty());
        assert!(parse_classless_routes(&[24, 10, 9]).is_empty());
    }

    /// Anyone on the link can answer: truncated and corrupted replies decode or are ignored, never panic.
    #[test]
    fn corrupt_replies_never_panic() {
        let good = ack_bytes();
        let mut rand = xorshift(0x2545_f491_4f6c_dd1d);
        for n in 0..good.len() {
            let _ = ServerMessage::decode(&good[..n]);
            let _ = udp_payload(&good[..n], 68);
        }
        for _ in 0..20_000 {
            let mut b = good.clone();
            // Corrupt the options mostly: that is where lengths are.
            for _ in 0..1 + rand() % 3 {
                let i = FIXED_LEN + 4 + (rand() as usize) % (b.len() - FIXED_LEN - 4);
                b[i] = rand() as u8;
            }
            if let Some(m) = ServerMessage::decode(&b) {
                let _ = crate::lease::result_of(&m, 0);
            }
            let _ = udp_payload(&b, 68);
        }
    }

    #[test]
    fn static_routes_are_classful() {
        let r = parse_static_routes(&[10, 1, 0, 0, 10, 0, 0, 1, 172, 16, 0, 0, 10, 0, 0, 1]);
        assert_eq!(r[0].prefix, 8);
        assert_eq!(r[1].prefix, 16);
    }

    #[test]
    fn ip_udp_round_trip() {
        let p = ip_udp_wrap(Ipv4Addr::UNSPECIFIED, Ipv4Addr::BROADCAST, 68, 67, b"hello");
        assert_eq!(p[..20], [0x45, 0x10, 0, 33, 0, 0, 0, 0, 64, 17, 0x7a, 0xbd, 0, 0, 0, 0, 255, 255, 255, 255]);
        assert_eq!(ip_checksum(&p[..20]), 0);
        assert_eq!(&p[20..28], &[0, 68, 0, 67, 0, 13, 0, 0]);
        assert_eq!(udp_payload(&p, 67), Some(&b"hello"[..]));
        assert_eq!(udp_payload(&p, 68), None);
    }
}
