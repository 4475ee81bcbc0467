//! How a peer's pods are reached, or why its lease is not used: what the plan decides and the backends and
//! the data plane carry out. Below all three: a backend's tunnel identity is data here ([`TunnelId`]: vxlan's
//! VTEP MAC, wireguard's public key and its base64 text), so the plan and the data plane import no backend.

use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;

use crate::family::Family;

/// What identifies a node's tunnel endpoint beyond its address, announced in its lease's backend data: no two
/// nodes may share one (the kernel would send one node's traffic to the other).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum TunnelId {
    /// vxlan: the MAC of the node's vxlan device.
    VtepMac([u8; 6]),
    /// wireguard: the node's public key.
    PublicKey([u8; 32]),
}

impl fmt::Display for TunnelId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TunnelId::VtepMac(mac) => write!(f, "VtepMAC {}", cnicore::mac::format(mac)),
            TunnelId::PublicKey(key) => write!(f, "PublicKey {}", key_text(key)),
        }
    }
}

/// How one peer's pods of one family are reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeerPath {
    /// A route via the peer's node address (host-gw, or direct routing).
    Direct { gateway: IpAddr },
    /// Through the family's tunnel device to the peer's node at `endpoint` (its UDP `port` and its `id`,
    /// when the backend has them).
    Overlay { endpoint: IpAddr, port: Option<u16>, id: Option<TunnelId> },
    /// Not used: the lease is not valid, or the backend cannot reach it.
    Refused(Refusal),
    /// Valid, and not routed by fabricd: the backend routes nothing (alloc: someone else does).
    Unrouted,
}

/// Why a lease (of one family) is not used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The subnet is not inside the cluster's Network of its family.
    OutsideNetwork { network: IpNet },
    /// The subnet's length is not the configured one.
    WrongLength { wanted: u8 },
    /// The lease has no public address of the subnet's family.
    NoPublicIp { family: Family },
    /// The public address is not a unicast address of another host.
    BadPublicIp { public_ip: IpAddr, why: &'static str },
    /// The public address is this node's.
    OwnPublicIp { public_ip: IpAddr },
    /// The public address is inside a cluster Network (a pod's address, not a node's).
    PublicIpInNetwork { public_ip: IpAddr, network: IpNet },
    /// Another key names the same subnet: this node's own, or an older lease's (`holder`).
    SubnetTaken { holder: Option<IpNet> },
    /// An older lease has this public address.
    PublicIpTaken { public_ip: IpAddr, holder: IpNet },
    /// The backend data cannot be read (a key that is not a key, a MAC that is not a MAC).
    BadBackendData { why: String },
    /// The tunnel identity cannot be a node's (a multicast or zero MAC).
    BadTunnelId { id: TunnelId, why: &'static str },
    /// The tunnel identity is this node's (holder None), or an older lease's.
    TunnelIdTaken { id: TunnelId, holder: Option<IpNet> },
    /// The lease has no tunnel identity (`what`: the key the backend reads) for a tunnel backend.
    NoTunnelId { public_ip: IpAddr, backend_type: String, what: &'static str },
    /// The backend carries no traffic of this family (ipip: IPv4 only).
    FamilyNotCarried { backend: &'static str, family: Family },
    /// host-gw: the peer's node is not on this node's L2 segment.
    BeyondL2 { public_ip: IpAddr, prefixes: String, underlay: String },
    /// Its route would replace or shadow a route fabricd did not make.
    RouteConflict { route: String },
}

impl Refusal {
    /// True for refusals of the lease itself (not of the backend's reach).
    pub fn is_invalid_lease(&self) -> bool {
        !matches!(self, Refusal::BeyondL2 { .. } | Refusal::FamilyNotCarried { .. })
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::OutsideNetwork { network } => write!(f, "its subnet is not inside the Network {network}"),
            Refusal::WrongLength { wanted } => write!(f, "its subnet is not a /{wanted} (SubnetLen)"),
            Refusal::NoPublicIp { family } => write!(f, "it has no public {family} address"),
            Refusal::BadPublicIp { public_ip, why } => write!(f, "its public address {public_ip} is {why}"),
            Refusal::OwnPublicIp { public_ip } => write!(f, "its public address {public_ip} is this node's"),
            Refusal::PublicIpInNetwork { public_ip, network } => {
                write!(f, "its public address {public_ip} is inside the cluster's Network {network} (a pod's address)")
            }
            Refusal::SubnetTaken { holder: None } => write!(f, "its subnet overlaps this node's own"),
            Refusal::SubnetTaken { holder: Some(holder) } => {
                write!(f, "its subnet overlaps that of the older lease of {holder} (another key names it)")
            }
            Refusal::PublicIpTaken { public_ip, holder } => {
                write!(f, "its public address {public_ip} is already that of the lease of {holder}")
            }
            Refusal::BadBackendData { why } => write!(f, "its backend data is not usable: {why}"),
            Refusal::BadTunnelId { id, why } => write!(f, "its {id} is {why}"),
            Refusal::TunnelIdTaken { id, holder: None } => write!(f, "its {id} is this node's"),
            Refusal::TunnelIdTaken { id, holder: Some(holder) } => {
                write!(f, "its {id} is already that of the lease of {holder}")
            }
            Refusal::NoTunnelId { public_ip, backend_type, what } => {
                write!(f, "node {public_ip} announces backend {backend_type:?} without a {what}")
            }
            Refusal::FamilyNotCarried { backend, family } => {
                write!(f, "the {backend} backend carries no {family} traffic")
            }
            Refusal::BeyondL2 { public_ip, prefixes, underlay } => write!(
                f,
                "host-gw cannot reach it: its node {public_ip} is not on this node's L2 segment ({prefixes} on \
                 {underlay}); use the vxlan backend (with DirectRouting)"
            ),
            Refusal::RouteConflict { route } => {
                write!(f, "its route would replace or shadow a route fabricd did not make ({route})")
            }
        }
    }
}

/// A key as flannel and `wg` write it: standard base64.
pub fn key_text(key: &[u8; 32]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(key)
}

/// A key from its base64 text; None when it is not 32 bytes of base64.
pub fn parse_key(text: &str) -> Option<[u8; 32]> {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.decode(text.trim()).ok()?.try_into().ok()
}
