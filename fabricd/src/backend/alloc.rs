//! alloc: flannel's experimental backend that only allocates (Documentation/backends.md: "subnet allocation
//! with no forwarding of data packets"). The node takes its lease (or its podCIDR) and writes subnet.env, the
//! conflist and, with --ip-masq, the masquerade; no device, no route to any peer: someone else routes the pod
//! network (a cloud's route tables, a cloud controller manager).

use std::net::IpAddr;
use std::sync::Arc;

use serde_json::Value;

use super::contract::{Backend, BackendContext, LeaseData, OptionsError, PeerEndpoint};
use crate::family::Family;
use crate::path::PeerPath;
use crate::underlay::Underlay;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Alloc;

pub fn parse(_options: &Value, _: &BackendContext) -> Result<Arc<dyn Backend>, OptionsError> {
    Ok(Arc::new(Alloc))
}

impl Backend for Alloc {
    fn type_name(&self) -> &'static str {
        "alloc"
    }

    /// No tunnel: pods get the underlay's MTU, as flanneld's alloc network (its MTU is the interface's).
    fn overhead(&self, _family: Family) -> u32 {
        0
    }

    fn lease_data(&self, _family: Family, _local: IpAddr) -> std::io::Result<Option<LeaseData>> {
        Ok(None)
    }

    fn path(&self, _peer: &PeerEndpoint, _underlay: &Underlay) -> PeerPath {
        PeerPath::Unrouted
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{pod_mtu, wanted, BackendConfig};

    #[test]
    fn allocates_and_routes_nothing() {
        let config = BackendConfig::parse(serde_json::json!({ "Type": "alloc" }), &BackendContext::default()).unwrap();
        let underlay = Underlay::example();
        let peer = PeerEndpoint {
            public_ip: "192.168.50.11".parse().unwrap(),
            id: None,
            addresses: [Some("192.168.50.11".parse().unwrap()), None],
            ports: [None, None],
            backend_type: "alloc",
        };
        let path = config.path(&peer, &underlay);
        assert_eq!(path, PeerPath::Unrouted);
        let paths = [("10.244.2.0/24".parse().unwrap(), path)].into_iter().collect();
        let wanted = wanted(&*config, Family::V4, &paths, &underlay, None);
        assert!(wanted.routes.is_empty() && wanted.pending.is_empty(), "no route, no device: {wanted:?}");
        assert_eq!(config.device_name(Family::V4), None);
        assert_eq!(pod_mtu(&*config, Family::ALL.into_iter(), &underlay), 1500);
        assert_eq!(config.lease_data(Family::V4, peer.public_ip).unwrap(), None);
    }
}
