//! What a backend needs and gives (the [`Backend`] trait), and what the backends share: reading options, the
//! routes every tunnel makes, the wanted objects of a pass. Below the backends and the registry (mod.rs), which
//! both use it.

use std::any::Any;
use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::net::IpAddr;
use std::sync::Arc;

use cnicore::netlink::{FdbEntry, Neighbour, Route, RT_TABLE_MAIN};
use ipnet::IpNet;
use serde_json::Value;

use crate::dataplane::diff::{Change, DeviceChange};
use crate::family::Family;
use crate::path::{PeerPath, Refusal, TunnelId};
use crate::underlay::{Underlay, ROUTE_PROTOCOL};

use super::device::DeviceContext;

/// What a backend must say and do. Implementations are configured from the config's `Backend` object.
pub trait Backend: fmt::Debug + Send + Sync {
    /// flannel's `Backend.Type`, also the lease's `BackendType`.
    fn type_name(&self) -> &'static str;

    /// Bytes the tunnel takes from the underlay's MTU over an underlay of `family` (0: no tunnel).
    fn overhead(&self, family: Family) -> u32;

    /// flannel's `MTU` option: the size of the packets the tunnel sends on the underlay, when configured
    /// (None: the underlay's MTU). See [`packet_mtu`].
    fn configured_mtu(&self) -> Option<u32> {
        None
    }

    /// This node's lease data for `family` (flannel's `BackendData`, `BackendV6Data`) as flannel writes it,
    /// for a node at `local`; None when the backend has none. An error when the node's key cannot be read.
    fn lease_data(&self, family: Family, local: IpAddr) -> io::Result<Option<LeaseData>>;

    /// What identifies a peer's tunnel endpoint in its lease `data` of `family` (None: the backend has no
    /// such identity), or why the data cannot be used.
    fn tunnel_id(&self, family: Family, data: Option<&Value>) -> Result<Option<TunnelId>, Refusal> {
        let _ = (family, data);
        Ok(None)
    }

    /// The UDP port a peer's lease `data` of `family` announces, when the backend has one.
    fn peer_port(&self, family: Family, data: Option<&Value>) -> Option<u16> {
        let _ = (family, data);
        None
    }

    /// This node's own tunnel identity for `family` at `local`: no peer may claim it.
    fn own_tunnel_id(&self, family: Family, local: IpAddr) -> Option<TunnelId> {
        let _ = (family, local);
        None
    }

    /// How a valid peer is reached.
    fn path(&self, peer: &PeerEndpoint, underlay: &Underlay) -> PeerPath;

    /// The device name of `family`, when the backend has one.
    fn device_name(&self, family: Family) -> Option<String> {
        let _ = family;
        None
    }

    /// Makes the device of the context's family right; its index (in a dry run, None when it is missing).
    fn ensure_device(&self, context: DeviceContext) -> io::Result<Option<u32>> {
        let _ = context;
        Ok(None)
    }

    /// Adds what one overlay peer (subnet `subnet`, node at `endpoint`) needs on the device `index`.
    fn add_peer(&self, wanted: &mut Wanted, index: u32, subnet: IpNet, endpoint: &PeerPath) {
        let _ = (wanted, index, subnet, endpoint);
    }

    /// Makes the peers of the tunnel device `index` the `wanted` ones (a backend whose peers are not kernel
    /// routes, neighbours or FDB entries: wireguard); the changes made (in a dry run, that would be).
    fn sync_tunnel_peers(&self, index: u32, wanted: Vec<TunnelPeer>, dry_run: bool) -> io::Result<Vec<Change>> {
        let _ = (index, wanted, dry_run);
        Ok(Vec::new())
    }

    /// True when a link of this name and kind is one that this backend makes (under any options): `cleanup`
    /// removes it.
    fn owns_link(&self, name: &str, kind: Option<&str>) -> bool {
        let _ = (name, kind);
        false
    }
}

/// One family's backend data of a lease, as written: flannel keeps it as Go's json.RawMessage, so its text
/// (field order included) is written back as it was made; two are equal when their content is. Shared, not
/// copied: a lease's data lives in the listing, the cluster and each pass's copy of it, and at 5,000 leases three
/// copies of the parsed JSON tripled the agent's memory.
#[derive(Debug, Clone)]
pub struct LeaseData(Arc<WrittenData>);

#[derive(Debug)]
struct WrittenData {
    text: String,
    value: Value,
}

impl LeaseData {
    /// The data as `data` serialises (a struct: its fields in their order, as Go's encoding/json writes them).
    pub fn of(data: &impl serde::Serialize) -> LeaseData {
        let text = serde_json::to_string(data).expect("serialisable");
        let value = serde_json::from_str(&text).expect("just written");
        LeaseData(Arc::new(WrittenData { text, value }))
    }

    pub fn value(&self) -> &Value {
        &self.0.value
    }

    pub fn text(&self) -> &str {
        &self.0.text
    }
}

impl From<Value> for LeaseData {
    fn from(value: Value) -> LeaseData {
        LeaseData(Arc::new(WrittenData { text: value.to_string(), value }))
    }
}

impl PartialEq for LeaseData {
    fn eq(&self, other: &LeaseData) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || self.0.value == other.0.value
    }
}

impl Eq for LeaseData {}

/// A valid peer of one family, as the plan hands it to the backend.
#[derive(Debug, Clone, Copy)]
pub struct PeerEndpoint<'a> {
    pub public_ip: IpAddr,
    pub id: Option<TunnelId>,
    /// The peer's public addresses and announced ports of both families (IPv4, IPv6): a backend with one
    /// tunnel for both families picks the endpoint among them.
    pub addresses: [Option<IpAddr>; 2],
    pub ports: [Option<u16>; 2],
    /// The lease's `BackendType` (for the refusal of a lease without the identity this backend needs).
    pub backend_type: &'a str,
}

/// A backend's options could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OptionsError {
    /// No backend of this `Type` (`known`: the types there are).
    UnknownType { name: String, known: Vec<&'static str> },
    /// An option of the right name has a value the backend cannot use.
    BadOption { backend: &'static str, key: &'static str, why: String },
}

impl fmt::Display for OptionsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OptionsError::UnknownType { name, known } => {
                let known: Vec<String> = known.iter().map(|name| format!("{name:?}")).collect();
                write!(f, "backend type {name:?} is not supported: use {}", known.join(", "))
            }
            OptionsError::BadOption { backend, key, why } => write!(f, "{backend} backend: {key}: {why}"),
        }
    }
}

impl std::error::Error for OptionsError {}

/// Reads a backend option with Go's key matching (absent and null: None).
pub fn option<T: serde::de::DeserializeOwned>(
    options: &Value,
    backend: &'static str,
    key: &'static str,
) -> Result<Option<T>, OptionsError> {
    match cnicore::spec::gojson::field(options, key) {
        None | Some(Value::Null) => Ok(None),
        Some(value) => cnicore::spec::gojson::from_value(value).map(Some).map_err(|e| OptionsError::BadOption {
            backend,
            key,
            why: e.to_string(),
        }),
    }
}

/// What the node should hold for its peers.
#[derive(Debug, Default)]
pub struct Wanted {
    pub routes: Vec<Route>,
    pub neighbours: Vec<Neighbour>,
    pub fdb: Vec<FdbEntry>,
    /// Tunnel peers by device index, each opaque to all but the backend that made it (wireguard's); a peer
    /// of both families on one device is listed twice.
    pub tunnel_peers: Vec<(u32, TunnelPeer)>,
    /// What a dry run cannot build yet (the device is missing): reported as changes.
    pub pending: Vec<Change>,
}

/// The route to `subnet` via `gateway` out of the underlay interface (host-gw, and direct routing).
pub fn direct_route(subnet: IpNet, gateway: IpAddr, underlay: &Underlay) -> Route {
    Route {
        dst: subnet,
        gateway: Some(gateway),
        oif: Some(underlay.index),
        protocol: Some(ROUTE_PROTOCOL),
        table: Some(RT_TABLE_MAIN),
        ..Route::default()
    }
}

/// The route to `subnet` via `gateway` on the tunnel device `index`, onlink (the gateway is not on a subnet
/// of the device).
pub fn onlink_route(subnet: IpNet, gateway: IpAddr, index: u32) -> Route {
    Route {
        dst: subnet,
        gateway: Some(gateway),
        oif: Some(index),
        onlink: true,
        protocol: Some(ROUTE_PROTOCOL),
        table: Some(RT_TABLE_MAIN),
        ..Route::default()
    }
}

/// The path of a peer on the same L2 segment when the backend routes directly, else None: host-gw's rule,
/// and that of vxlan's and ipip's `DirectRouting`.
pub fn direct_if_same_l2(peer: &PeerEndpoint, underlay: &Underlay) -> Option<PeerPath> {
    underlay.same_l2(peer.public_ip).then_some(PeerPath::Direct { gateway: peer.public_ip })
}

/// The wanted objects for the paths of one family. `device`: the family's tunnel device's index, when the
/// backend has one.
pub fn wanted(
    backend: &dyn Backend,
    family: Family,
    paths: &BTreeMap<IpNet, PeerPath>,
    underlay: &Underlay,
    device: Option<u32>,
) -> Wanted {
    let mut wanted = Wanted::default();
    for (subnet, path) in paths {
        match path {
            PeerPath::Direct { gateway } => wanted.routes.push(direct_route(*subnet, *gateway, underlay)),
            PeerPath::Overlay { .. } => match device {
                Some(index) => backend.add_peer(&mut wanted, index, *subnet, path),
                None => wanted.pending.push(Change::Device(DeviceChange::PendingRoute {
                    dst: *subnet,
                    via: subnet.network(),
                    name: backend.device_name(family).unwrap_or_default(),
                })),
            },
            PeerPath::Refused(_) | PeerPath::Unrouted => {}
        }
    }
    wanted
}

/// The MTU of pods' interfaces over `underlay` for the enabled `families`: the backend's overhead taken off
/// [`packet_mtu`], the largest of the families' (one MTU for the pod's interface, whichever family a packet
/// is). This is subnet.env's `FLANNEL_MTU`, as flanneld's network `MTU()` is.
pub fn pod_mtu(backend: &dyn Backend, families: impl Iterator<Item = Family>, underlay: &Underlay) -> u32 {
    packet_mtu(backend, underlay) - families.map(|f| backend.overhead(f)).max().unwrap_or(0)
}

/// The size of the packets the tunnel sends: the backend's `MTU` option, else the underlay's MTU (flannel's
/// default). Never more than the underlay's MTU: the option is checked against it at start
/// ([`BackendContext::underlay_mtu`]), and an underlay whose MTU shrank later wins over the config.
pub fn packet_mtu(backend: &dyn Backend, underlay: &Underlay) -> u32 {
    backend.configured_mtu().map_or(underlay.mtu, |mtu| mtu.min(underlay.mtu))
}

/// IPv4's minimum MTU (RFC 791): a device below it carries no IPv4 at all.
pub const MIN_MTU: u32 = 68;

/// flannel's `MTU` option of `backend` (0 and absent: the underlay's), checked: the tunnel device's MTU (the
/// option less the largest `overhead`) must be at least [`MIN_MTU`], and the option no more than the
/// underlay's MTU when the context knows it (larger packets would be fragmented or dropped on the underlay).
pub fn mtu_option(
    options: &Value,
    backend: &'static str,
    overhead: u32,
    context: &BackendContext,
) -> Result<Option<u32>, OptionsError> {
    let Some(mtu) = option::<u32>(options, backend, "MTU")?.filter(|mtu| *mtu != 0) else { return Ok(None) };
    let bad = |why: String| OptionsError::BadOption { backend, key: "MTU", why };
    if mtu < MIN_MTU + overhead {
        return Err(bad(format!(
            "{mtu} leaves the tunnel device {} bytes after the {overhead} of the tunnel's headers; at least {} \
             is needed (IPv4's minimum MTU is {MIN_MTU})",
            mtu.saturating_sub(overhead),
            MIN_MTU + overhead
        )));
    }
    match context.underlay_mtu {
        Some(underlay) if mtu > underlay => Err(bad(format!(
            "{mtu} is more than the underlay interface's MTU {underlay}: the tunnel's packets would not fit on it"
        ))),
        _ => Ok(Some(mtu)),
    }
}

/// A peer on a tunnel device whose peers are not rtnetlink objects, opaque to the plan and the data plane:
/// only the backend that made it reads it back (wireguard: its `WgPeer`).
pub struct TunnelPeer(Box<dyn Any + Send>);

impl TunnelPeer {
    pub fn new(peer: impl Any + Send) -> TunnelPeer {
        TunnelPeer(Box::new(peer))
    }

    /// The backend's own peer back; None when another backend made it.
    pub fn into_inner<T: Any>(self) -> Option<T> {
        self.0.downcast().ok().map(|peer| *peer)
    }
}

impl fmt::Debug for TunnelPeer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TunnelPeer")
    }
}

/// The wanted tunnel peers of each of `devices` (none: every peer goes); a peer of a device not in `devices`
/// is dropped.
pub fn peers_by_device(devices: &[u32], peers: Vec<(u32, TunnelPeer)>) -> Vec<(u32, Vec<TunnelPeer>)> {
    let mut wanted: Vec<(u32, Vec<TunnelPeer>)> = Vec::new();
    for index in devices {
        if !wanted.iter().any(|(known, _)| known == index) {
            wanted.push((*index, Vec::new()));
        }
    }
    for (index, peer) in peers {
        if let Some(device) = wanted.iter_mut().find(|(known, _)| *known == index) {
            device.1.push(peer);
        }
    }
    wanted
}

/// flannel's wireguard key file, and the variable that moves it.
pub const DEFAULT_KEY_FILE: &str = "/run/flannel/wgkey";
pub const KEY_FILE_VARIABLE: &str = "WIREGUARD_KEY_FILE";

/// What every backend is built from besides its options: one value made from the command line at start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendContext {
    /// The wireguard backend's private key file (--wireguard-key-file).
    pub wireguard_key_file: std::path::PathBuf,
    /// The underlay interface's MTU, when the agent found it: a backend's `MTU` option may not exceed it.
    /// None (status, cleanup, tests): not checked.
    pub underlay_mtu: Option<u32>,
}

impl Default for BackendContext {
    /// `$WIREGUARD_KEY_FILE`, else flannel's `/run/flannel/wgkey`.
    fn default() -> BackendContext {
        let key_file = std::env::var_os(KEY_FILE_VARIABLE).map(std::path::PathBuf::from);
        BackendContext { wireguard_key_file: key_file.unwrap_or_else(|| DEFAULT_KEY_FILE.into()), underlay_mtu: None }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_device_gets_its_wanted_peers_even_none() {
        let wanted = peers_by_device(
            &[3, 7, 3],
            vec![(7, TunnelPeer::new(1u8)), (7, TunnelPeer::new(2u8)), (9, TunnelPeer::new(3u8))],
        );
        assert_eq!(wanted.len(), 2, "one entry per device; a peer of no device of this pass is dropped");
        assert_eq!(
            (wanted[0].0, wanted[0].1.len()),
            (3, 0),
            "a device whose peers all left: its peers are all removed"
        );
        let (index, peers) = wanted.into_iter().nth(1).unwrap();
        let peers: Vec<u8> = peers.into_iter().map(|p| p.into_inner::<u8>().unwrap()).collect();
        assert_eq!((index, peers), (7, vec![1, 2]));
        assert!(TunnelPeer::new(1u8).into_inner::<u16>().is_none(), "another backend's peer is not read as ours");
    }
}
