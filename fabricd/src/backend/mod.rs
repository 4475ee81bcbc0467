//! The backends, behind one trait ([`contract::Backend`]: what a backend needs and gives), chosen by flannel's
//! `Backend.Type` from [`REGISTRY`]. Adding a backend is its module and one line in [`REGISTRY`]; the plan, the
//! reconcile loop and the diff are shared.
//!
//! - [`host_gw`]: a route to each peer's subnet via its node address (also the DirectRouting peers of vxlan
//!   and ipip);
//! - [`vxlan`]: the `flannel.<VNI>` device, and per peer an onlink route, a permanent neighbour and an FDB entry;
//! - [`ipip`]: the `flannel.ipip` device (IPv4), and per peer an onlink route via its public address;
//! - [`wireguard`]: `flannel-wg` (and `flannel-wg-v6`), configured over generic netlink, and per peer a
//!   wireguard peer (key, endpoint, its subnets as allowed IPs) and a route on the device;
//! - [`alloc`]: the lease (or podCIDR) and the node's files only; nothing routed to peers.

pub mod alloc;
mod contract;
mod device;
pub mod host_gw;
pub mod ipip;
pub mod vxlan;
pub mod wireguard;
mod wireguard_key;

use std::fmt;
use std::sync::Arc;

use serde_json::Value;

pub use contract::{
    peers_by_device, pod_mtu, wanted, Backend, BackendContext, LeaseData, OptionsError, PeerEndpoint, TunnelPeer,
    Wanted,
};
pub use device::DeviceContext;

type Parse = fn(&Value, &BackendContext) -> Result<Arc<dyn Backend>, OptionsError>;

/// The backends by flannel's `Backend.Type`.
const REGISTRY: &[(&str, Parse)] = &[
    ("vxlan", vxlan::parse),
    ("host-gw", host_gw::parse),
    ("ipip", ipip::parse),
    ("wireguard", wireguard::parse),
    ("alloc", alloc::parse),
];

/// The config's `Backend` object and the backend it configures. Two are equal when their options are.
#[derive(Clone)]
pub struct BackendConfig {
    options: Value,
    backend: Arc<dyn Backend>,
}

impl BackendConfig {
    /// The backend named by `options`' `Type` (flannel's default: udp, which fabricd does not have).
    pub fn parse(options: Value, context: &BackendContext) -> Result<BackendConfig, OptionsError> {
        let name = match cnicore::spec::gojson::field(&options, "Type") {
            Some(Value::String(name)) => name.clone(),
            _ => "udp".into(),
        };
        let (_, parse) = REGISTRY.iter().find(|(known, _)| *known == name).ok_or_else(|| {
            OptionsError::UnknownType { name: name.clone(), known: REGISTRY.iter().map(|(known, _)| *known).collect() }
        })?;
        Ok(BackendConfig { backend: parse(&options, context)?, options })
    }
}

impl std::ops::Deref for BackendConfig {
    type Target = dyn Backend;
    fn deref(&self) -> &(dyn Backend + 'static) {
        &*self.backend
    }
}

impl PartialEq for BackendConfig {
    fn eq(&self, other: &BackendConfig) -> bool {
        self.options == other.options
    }
}

impl Eq for BackendConfig {}

impl fmt::Debug for BackendConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.backend)
    }
}

/// True when some backend makes links of this name and kind: `cleanup` removes them whatever the config.
pub fn any_owns_link(name: &str, kind: Option<&str>) -> bool {
    REGISTRY
        .iter()
        .filter_map(|(type_name, parse)| {
            parse(&serde_json::json!({ "Type": type_name }), &BackendContext::default()).ok()
        })
        .any(|backend| backend.owns_link(name, kind))
}
