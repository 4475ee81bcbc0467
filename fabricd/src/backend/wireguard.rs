//! wireguard, as flannel configures it (its Documentation/backends.md): pod traffic between nodes encrypted
//! by the kernel. `Mode` `separate` (the default) makes one device per family, `flannel-wg` listening on
//! `ListenPort` (51820) and `flannel-wg-v6` on `ListenPortV6` (51821); `auto`, `ipv4` and `ipv6` make one
//! device, `flannel-wg`, for both families, its peers reached over IPv4 (`ipv4`), IPv6 (`ipv6`) or IPv4 when
//! both ends have it (`auto`). `PSK` (a preshared key for every peer), `PersistentKeepaliveInterval`
//! (seconds, 0: off), `MTU` (the size of the packets sent on the underlay; default the underlay's MTU).
//!
//! The device's key and peers go over generic netlink (no `wg` process); its MTU is `MTU` minus the tunnel's
//! overhead for the underlay's family (IPv4 20 + UDP 8 + wireguard 32 = 60; IPv6: 80; flanneld takes 80 for
//! both). The node's
//! key (see [`super::wireguard_key`]) is created once, kept, never logged; its public half is the lease's
//! `{"PublicKey":…,"Port":…}`, as flannel writes it, so flanneld and fabricd nodes peer with each other. Per
//! peer: a wireguard peer (key, endpoint, its subnets as allowed IPs) and a route to its subnet on the device.
//! A peer's new key (a rotation) replaces its old one at the next pass.

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use cnicore::netlink::{Link, PeerChange, Route, WgPeer, Wireguard, RT_TABLE_MAIN};
use ipnet::IpNet;
use serde::Serialize;
use serde_json::Value;

#[cfg(test)]
use super::contract::peers_by_device;
use super::contract::{
    mtu_option, option, packet_mtu, Backend, LeaseData, OptionsError, PeerEndpoint, TunnelPeer, Wanted,
};
use super::device::DeviceContext;
use super::wireguard_key::{load_or_create, PrivateKey};
use crate::dataplane::diff::{Change, DeviceChange, Object};
use crate::family::Family;
use crate::path::{key_text, parse_key, PeerPath, Refusal, TunnelId};
use crate::underlay::{Underlay, ROUTE_PROTOCOL};

pub const DEVICE: &str = "flannel-wg";
pub const DEVICE_V6: &str = "flannel-wg-v6";
pub const DEFAULT_PORT: u16 = 51820;
pub const DEFAULT_PORT_V6: u16 = 51821;
/// Outer IPv4 20 + UDP 8 + wireguard's header and tag 32; over IPv6, 80.
pub const OVERHEAD: u32 = 60;
pub const OVERHEAD_V6: u32 = 80;
pub use super::contract::KEY_FILE_VARIABLE;

/// Tunnels per family, or one for both and the family its peers are reached over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Separate,
    Auto,
    Ipv4,
    Ipv6,
}

#[derive(Clone, PartialEq, Eq)]
pub struct WireguardBackend {
    pub mode: Mode,
    pub listen_port: u16,
    pub listen_port_v6: u16,
    pub keepalive: u16,
    /// `MTU`: the packets' size on the underlay (None: the underlay's MTU).
    pub mtu: Option<u32>,
    psk: Option<[u8; 32]>,
    /// This node's private key (--wireguard-key-file).
    key_file: PathBuf,
}

impl std::fmt::Debug for WireguardBackend {
    /// Without the preshared key.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WireguardBackend")
            .field("mode", &self.mode)
            .field("listen_port", &self.listen_port)
            .field("listen_port_v6", &self.listen_port_v6)
            .field("keepalive", &self.keepalive)
            .field("mtu", &self.mtu)
            .field("psk", &self.psk.map(|_| "(set)"))
            .finish()
    }
}

pub fn parse(options: &Value, context: &super::contract::BackendContext) -> Result<Arc<dyn Backend>, OptionsError> {
    let bad = |key: &'static str, why: &str| OptionsError::BadOption { backend: "wireguard", key, why: why.into() };
    let mode = match option::<String>(options, "wireguard", "Mode")?.as_deref() {
        None | Some("") | Some("separate") => Mode::Separate,
        Some("auto") => Mode::Auto,
        Some("ipv4") => Mode::Ipv4,
        Some("ipv6") => Mode::Ipv6,
        Some(_) => return Err(bad("Mode", "not one of separate, auto, ipv4, ipv6")),
    };
    // The key's text is not repeated in the error: it is a secret.
    let psk = match option::<String>(options, "wireguard", "PSK")?.filter(|text| !text.is_empty()) {
        None => None,
        Some(text) => Some(parse_key(&text).ok_or_else(|| bad("PSK", "not a base64 key of 32 bytes (wg genpsk)"))?),
    };
    Ok(Arc::new(WireguardBackend {
        mode,
        listen_port: option(options, "wireguard", "ListenPort")?.filter(|p| *p != 0).unwrap_or(DEFAULT_PORT),
        listen_port_v6: option(options, "wireguard", "ListenPortV6")?.filter(|p| *p != 0).unwrap_or(DEFAULT_PORT_V6),
        keepalive: option(options, "wireguard", "PersistentKeepaliveInterval")?.unwrap_or(0),
        mtu: mtu_option(options, "wireguard", OVERHEAD_V6, context)?,
        psk,
        key_file: context.wireguard_key_file.clone(),
    }))
}

/// The key once read, with its file and its public half.
static KEY: Mutex<Option<(PathBuf, PrivateKey, [u8; 32])>> = Mutex::new(None);

/// This node's key at `path` and its public key, read (or created) once per file.
fn node_key(path: &Path) -> io::Result<(PrivateKey, [u8; 32])> {
    let mut cached = KEY.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some((file, key, public)) = cached.as_ref() {
        if file == path {
            return Ok((key.clone(), *public));
        }
    }
    let key = load_or_create(path)?;
    let public = key.public_key();
    *cached = Some((path.to_path_buf(), key.clone(), public));
    Ok((key, public))
}

/// flannel's lease data (Go's field order).
#[derive(Serialize)]
struct LeaseFields {
    #[serde(rename = "PublicKey")]
    public_key: String,
    #[serde(rename = "Port")]
    port: u16,
}

impl WireguardBackend {
    /// The device of `family` and the port it listens on.
    fn device(&self, family: Family) -> (&'static str, u16) {
        match (self.mode, family) {
            (Mode::Separate, Family::V6) => (DEVICE_V6, self.listen_port_v6),
            _ => (DEVICE, self.listen_port),
        }
    }

    /// The family a peer is reached over, for its subnet of `family`.
    fn endpoint_family(&self, family: Family, peer: &PeerEndpoint, underlay: &Underlay) -> Family {
        match self.mode {
            Mode::Separate => family,
            Mode::Ipv4 => Family::V4,
            Mode::Ipv6 => Family::V6,
            Mode::Auto if peer.addresses[0].is_some() && underlay.public_ip.is_some() => Family::V4,
            Mode::Auto => Family::V6,
        }
    }

    /// The wireguard link of `name`: kept, or (re)created when missing or of another kind. None in a dry run
    /// that would create it.
    fn ensure_link(&self, context: &mut DeviceContext, name: &str, port: u16, mtu: u32) -> io::Result<Option<Link>> {
        let current = context.nl.link_by_name(name)?;
        if let Some(link) = current.as_ref().filter(|l| l.kind.as_deref() == Some("wireguard")) {
            return Ok(Some(link.clone()));
        }
        let change = match &current {
            None => {
                DeviceChange::Create { name: name.into(), kind: "wireguard", settings: format!("port {port}"), mtu }
            }
            Some(_) => DeviceChange::Recreate { name: name.into() },
        };
        if !context.change(change) {
            return Ok(None);
        }
        if let Some(link) = current {
            context.nl.delete_link(link.index)?;
        }
        Ok(Some(context.nl.create_wireguard(name, Some(mtu))?))
    }
}

impl Backend for WireguardBackend {
    fn type_name(&self) -> &'static str {
        "wireguard"
    }

    fn configured_mtu(&self) -> Option<u32> {
        self.mtu
    }

    fn overhead(&self, family: Family) -> u32 {
        let tunnel_family = match self.mode {
            Mode::Separate => family,
            Mode::Ipv4 => Family::V4,
            Mode::Ipv6 | Mode::Auto => Family::V6,
        };
        match tunnel_family {
            Family::V4 => OVERHEAD,
            Family::V6 => OVERHEAD_V6,
        }
    }

    fn lease_data(&self, family: Family, _local: IpAddr) -> io::Result<Option<LeaseData>> {
        let (_, public) = node_key(&self.key_file)?;
        // The port the family's device listens on (flannel writes ListenPortV6 in BackendV6Data even when one
        // device listens on ListenPort for both; peers reach that device on the IPv4 data's port).
        let fields = LeaseFields { public_key: key_text(&public), port: self.device(family).1 };
        Ok(Some(LeaseData::of(&fields)))
    }

    fn tunnel_id(&self, _family: Family, data: Option<&Value>) -> Result<Option<TunnelId>, Refusal> {
        let Some(text) = data.and_then(|d| cnicore::spec::gojson::field(d, "PublicKey")) else { return Ok(None) };
        let key = text.as_str().and_then(parse_key).ok_or_else(|| Refusal::BadBackendData {
            why: format!("PublicKey {text} is not a base64 key of 32 bytes"),
        })?;
        Ok(Some(TunnelId::PublicKey(key)))
    }

    fn peer_port(&self, _family: Family, data: Option<&Value>) -> Option<u16> {
        let port = data.and_then(|d| cnicore::spec::gojson::field(d, "Port"))?.as_u64()?;
        u16::try_from(port).ok().filter(|p| *p != 0)
    }

    fn own_tunnel_id(&self, _family: Family, _local: IpAddr) -> Option<TunnelId> {
        node_key(&self.key_file).ok().map(|(_, public)| TunnelId::PublicKey(public))
    }

    fn path(&self, peer: &PeerEndpoint, underlay: &Underlay) -> PeerPath {
        let family = Family::of(peer.public_ip);
        if peer.id.is_none() {
            let backend_type = peer.backend_type.to_string();
            return PeerPath::Refused(Refusal::NoTunnelId {
                public_ip: peer.public_ip,
                backend_type,
                what: "PublicKey",
            });
        }
        let over = self.endpoint_family(family, peer, underlay);
        let index = usize::from(over == Family::V6);
        let Some(endpoint) = peer.addresses[index] else {
            return PeerPath::Refused(Refusal::NoPublicIp { family: over });
        };
        // One device for both families listens on the port of the IPv4 data (flannel's ListenPort); a lease
        // without a port is reached on this node's own port (flannel's rule).
        let announced = match self.mode {
            Mode::Separate => peer.ports[index],
            _ => peer.ports[0].or(peer.ports[1]),
        };
        let port = announced.unwrap_or(self.device(over).1);
        PeerPath::Overlay { endpoint, port: Some(port), id: peer.id }
    }

    fn device_name(&self, family: Family) -> Option<String> {
        Some(self.device(family).0.to_string())
    }

    /// The link, its key and port, MTU, the subnet's network address as a host address, up.
    fn ensure_device(&self, mut context: DeviceContext) -> io::Result<Option<u32>> {
        let (name, port) = self.device(context.family);
        let mtu = packet_mtu(self, context.underlay) - self.overhead(context.family);
        let Some(link) = self.ensure_link(&mut context, name, port, mtu)? else { return Ok(None) };
        let (key, public) = node_key(&self.key_file)?;
        let mut wireguard = Wireguard::new()?;
        let device = wireguard.device(link.index)?;
        if (device.public_key != Some(public) || device.listen_port != port)
            && context.change(DeviceChange::Configure { name: name.into(), what: "private key and listen port" })
        {
            wireguard.configure(link.index, key.bytes(), port)?;
        }
        context.mtu(&link, mtu)?;
        context.subnet_address(&link)?;
        context.up(&link)?;
        Ok(Some(link.index))
    }

    fn add_peer(&self, wanted: &mut Wanted, index: u32, subnet: IpNet, path: &PeerPath) {
        let PeerPath::Overlay { endpoint, port, id: Some(TunnelId::PublicKey(key)) } = *path else { return };
        wanted.routes.push(Route {
            dst: subnet,
            oif: Some(index),
            protocol: Some(ROUTE_PROTOCOL),
            table: Some(RT_TABLE_MAIN),
            scope: cnicore::netlink::Scope::Link,
            ..Route::default()
        });
        let peer = WgPeer {
            public_key: key,
            preshared_key: self.psk,
            endpoint: port.map(|port| SocketAddr::new(endpoint, port)),
            keepalive: self.keepalive,
            allowed_ips: vec![subnet],
        };
        wanted.tunnel_peers.push((index, TunnelPeer::new(peer)));
    }

    fn sync_tunnel_peers(&self, index: u32, wanted: Vec<TunnelPeer>, dry_run: bool) -> io::Result<Vec<Change>> {
        let wanted = one_peer_per_key(wanted.into_iter().filter_map(TunnelPeer::into_inner::<WgPeer>));
        let mut wireguard = Wireguard::new()?;
        let observed = wireguard.device(index)?.peers;
        let changes = cnicore::netlink::wireguard::peer_changes(&wanted, &observed);
        if !dry_run && !changes.is_empty() {
            wireguard.change_peers(index, &changes)?;
        }
        Ok(changes
            .iter()
            .map(|change| match change {
                PeerChange::Put(peer) => {
                    Change::Put(Object::TunnelPeer { key: peer.public_key, endpoint: peer.endpoint })
                }
                PeerChange::Remove(key) => Change::Remove(Object::TunnelPeer { key: *key, endpoint: None }),
            })
            .collect())
    }

    fn owns_link(&self, name: &str, kind: Option<&str>) -> bool {
        (name == DEVICE || name == DEVICE_V6) && kind == Some("wireguard")
    }
}

/// A peer of both families on one device is one wireguard peer with both subnets as allowed IPs. A map of
/// where each key is: a scan of the peers per peer is quadratic in the cluster.
fn one_peer_per_key(peers: impl Iterator<Item = WgPeer>) -> Vec<WgPeer> {
    let mut merged: Vec<WgPeer> = Vec::new();
    let mut placed: HashMap<[u8; 32], usize> = HashMap::new();
    for peer in peers {
        match placed.entry(peer.public_key) {
            Entry::Occupied(at) => merged[*at.get()].allowed_ips.extend(peer.allowed_ips),
            Entry::Vacant(slot) => {
                slot.insert(merged.len());
                merged.push(peer);
            }
        }
    }
    merged
}

#[cfg(test)]
mod tests {
    use super::super::contract::pod_mtu;
    use super::*;

    fn backend(options: Value) -> Arc<dyn Backend> {
        parse(&options, &super::super::contract::BackendContext::default()).unwrap()
    }

    fn underlay() -> Underlay {
        Underlay::example()
    }

    fn peer<'a>(public_ip: &str, key: u8) -> PeerEndpoint<'a> {
        PeerEndpoint {
            public_ip: public_ip.parse().unwrap(),
            id: Some(TunnelId::PublicKey([key; 32])),
            backend_type: "wireguard",
            addresses: [Some("192.168.60.3".parse().unwrap()), Some("fd00:60::3".parse().unwrap())],
            ports: [Some(51820), Some(51821)],
        }
    }

    #[test]
    fn flannels_options_and_defaults() {
        let defaults = format!("{:?}", backend(serde_json::json!({ "Type": "wireguard" })));
        assert_eq!(
            defaults,
            "WireguardBackend { mode: Separate, listen_port: 51820, listen_port_v6: 51821, keepalive: 0, mtu: None, psk: None }"
        );
        let psk = "jD4iUbzdL8h9zD2sAoebvUWdqR7h7JqtzdLzX2LRPnI=";
        let all = backend(serde_json::json!({ "type": "wireguard", "psk": psk, "listenPort": 5000,
            "ListenPortV6": 5001, "PersistentKeepaliveInterval": 25, "Mode": "auto" }));
        let shown = format!("{all:?}");
        assert!(shown.contains("mode: Auto, listen_port: 5000, listen_port_v6: 5001, keepalive: 25"), "{shown}");
        let mtu = backend(serde_json::json!({ "Type": "wireguard", "MTU": 1400 }));
        assert_eq!(mtu.configured_mtu(), Some(1400));
        assert_eq!(pod_mtu(&*mtu, [Family::V4, Family::V6].into_iter(), &underlay()), 1400 - OVERHEAD_V6);
        assert!(shown.contains("psk: Some(\"(set)\")") && !shown.contains(psk), "a PSK is never printed: {shown}");
        for (bad, key) in [("{\"Mode\":\"both\"}", "Mode"), ("{\"PSK\":\"short\"}", "PSK")] {
            let error = parse(&serde_json::from_str(bad).unwrap(), &super::super::contract::BackendContext::default())
                .unwrap_err();
            assert!(matches!(error, OptionsError::BadOption { key: k, .. } if k == key), "{error}");
            assert!(!error.to_string().contains("short"));
        }
    }

    #[test]
    fn mtu_overhead_by_the_tunnels_family() {
        let separate = backend(serde_json::json!({ "Type": "wireguard" }));
        assert_eq!((separate.overhead(Family::V4), separate.overhead(Family::V6)), (60, 80));
        let ipv4 = backend(serde_json::json!({ "Type": "wireguard", "Mode": "ipv4" }));
        assert_eq!((ipv4.overhead(Family::V4), ipv4.overhead(Family::V6)), (60, 60));
        let auto = backend(serde_json::json!({ "Type": "wireguard", "Mode": "auto" }));
        assert_eq!(auto.overhead(Family::V4), 80, "auto may reach a peer over IPv6");
        assert_eq!(separate.device_name(Family::V6).unwrap(), "flannel-wg-v6");
        assert_eq!(auto.device_name(Family::V6).unwrap(), "flannel-wg");
    }

    #[test]
    fn lease_data_is_flannels_and_peers_keys_are_read_or_refused() {
        let key = [0x42; 32];
        let text = key_text(&key);
        let flannel = format!(r#"{{"PublicKey":"{text}","Port":51820}}"#);
        let data = LeaseFields { public_key: text.clone(), port: 51820 };
        assert_eq!(LeaseData::of(&data).text(), flannel, "Go's field order");
        let wg = backend(serde_json::json!({ "Type": "wireguard" }));
        let value: Value = serde_json::from_str(&flannel).unwrap();
        assert_eq!(wg.tunnel_id(Family::V4, Some(&value)), Ok(Some(TunnelId::PublicKey(key))));
        assert_eq!(wg.peer_port(Family::V4, Some(&value)), Some(51820));
        let bad: Value = serde_json::json!({ "PublicKey": "bm90IGEga2V5", "Port": 51820 });
        let Err(refusal) = wg.tunnel_id(Family::V4, Some(&bad)) else { panic!("a bad key accepted") };
        assert!(refusal.to_string().contains("is not a base64 key of 32 bytes") && refusal.is_invalid_lease());
        assert_eq!(wg.tunnel_id(Family::V4, None), Ok(None));
        let PeerPath::Refused(refusal) = wg.path(&PeerEndpoint { id: None, ..peer("192.168.60.3", 1) }, &underlay())
        else {
            panic!("a peer without a key used")
        };
        assert_eq!(refusal.to_string(), "node 192.168.60.3 announces backend \"wireguard\" without a PublicKey");
    }

    #[test]
    fn endpoints_by_mode() {
        let endpoint = |mode: &str, subnet_family: &str| {
            let wg = backend(serde_json::json!({ "Type": "wireguard", "Mode": mode }));
            let public = if subnet_family == "v4" { "192.168.60.3" } else { "fd00:60::3" };
            match wg.path(&peer(public, 1), &underlay()) {
                PeerPath::Overlay { endpoint, port, .. } => format!("{endpoint} {}", port.unwrap()),
                other => panic!("{other:?}"),
            }
        };
        assert_eq!(endpoint("separate", "v4"), "192.168.60.3 51820");
        assert_eq!(endpoint("separate", "v6"), "fd00:60::3 51821");
        assert_eq!(endpoint("ipv4", "v6"), "192.168.60.3 51820");
        assert_eq!(endpoint("ipv6", "v4"), "fd00:60::3 51820", "one device: the IPv4 data's port, its ListenPort");
        assert_eq!(endpoint("auto", "v6"), "192.168.60.3 51820", "IPv4 when both ends have it");
    }

    #[test]
    fn a_peer_gets_a_route_and_one_wireguard_peer_for_both_families() {
        let wg = backend(serde_json::json!({ "Type": "wireguard", "Mode": "ipv4", "PersistentKeepaliveInterval": 25 }));
        let mut wanted = Wanted::default();
        let path = wg.path(&peer("192.168.60.3", 1), &underlay());
        wg.add_peer(&mut wanted, 7, "10.244.3.0/24".parse().unwrap(), &path);
        wg.add_peer(&mut wanted, 7, "fd00:10:244:3::/64".parse().unwrap(), &path);
        let route = &wanted.routes[0];
        assert_eq!((route.gateway, route.oif, route.onlink), (None, Some(7), false));
        let devices = peers_by_device(&[7], wanted.tunnel_peers);
        assert_eq!(devices.len(), 1);
        let (index, peers) = devices.into_iter().next().unwrap();
        let peers = one_peer_per_key(peers.into_iter().filter_map(TunnelPeer::into_inner::<WgPeer>));
        assert_eq!((index, peers.len()), (7, 1), "both families on one peer");
        assert_eq!(peers[0].endpoint, Some("192.168.60.3:51820".parse().unwrap()));
        assert_eq!(peers[0].keepalive, 25);
        let ips: Vec<String> = peers[0].allowed_ips.iter().map(|n| n.to_string()).collect();
        assert_eq!(ips, ["10.244.3.0/24", "fd00:10:244:3::/64"]);
    }
}
