//! host-gw: a peer's subnet is routed via its node address on the underlay (the peer shares its L2 segment).
//! No device, no overhead, no lease data.

use std::net::IpAddr;
use std::sync::Arc;

use serde_json::Value;

use super::contract::{direct_if_same_l2, Backend, LeaseData, OptionsError, PeerEndpoint};
use crate::family::Family;
use crate::path::{PeerPath, Refusal};
use crate::underlay::Underlay;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostGw;

pub fn parse(_options: &Value, _: &super::contract::BackendContext) -> Result<Arc<dyn Backend>, OptionsError> {
    Ok(Arc::new(HostGw))
}

impl Backend for HostGw {
    fn type_name(&self) -> &'static str {
        "host-gw"
    }

    fn overhead(&self, _family: Family) -> u32 {
        0
    }

    fn lease_data(&self, _family: Family, _local: IpAddr) -> std::io::Result<Option<LeaseData>> {
        Ok(None)
    }

    fn path(&self, peer: &PeerEndpoint, underlay: &Underlay) -> PeerPath {
        direct_if_same_l2(peer, underlay).unwrap_or_else(|| {
            let family = Family::of(peer.public_ip);
            PeerPath::Refused(Refusal::BeyondL2 {
                public_ip: peer.public_ip,
                prefixes: underlay
                    .prefixes
                    .iter()
                    .filter(|p| Family::of(p.addr()) == family)
                    .map(|p| p.to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
                underlay: underlay.name.clone(),
            })
        })
    }
}
