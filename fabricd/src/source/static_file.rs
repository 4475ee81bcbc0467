//! Static mode: the node's subnets and its peers from a file, no store. The file is flannel's network config
//! with two more keys, read with Go's key matching, and read again when it changes (checked every second):
//!
//! ```json
//! { "Network": "10.244.0.0/16", "SubnetLen": 24, "Backend": { "Type": "host-gw" },
//!   "Subnet": "10.244.1.0/24",
//!   "Peers": [ { "Subnet": "10.244.2.0/24", "PublicIP": "192.168.50.2" },
//!              { "Subnet": "10.244.3.0/24", "PublicIP": "192.168.60.3", "VtepMAC": "0e:fa:c0:a8:3c:03" } ] }
//! ```
//!
//! With `EnableIPv6`, the node and each peer also have an `IPv6Subnet`, and a peer a `PublicIPv6` (and
//! optionally `VtepMACv6`). A peer's VTEP MACs default to the ones fabricd derives from its public addresses.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use ipnet::{Ipv4Net, Ipv6Net};
use serde::Deserialize;
use serde_json::Value;
use tokio::sync::watch;

use super::lease::{publish, Cluster, Peer};
use crate::backend::LeaseData;
use crate::error::{ConfigError, Error, Result, StaticFileProblem};
use crate::family::Family;
use crate::flannel::{LeaseAttrs, NetworkConfig, SubnetKey};
use crate::log::log;
use crate::metrics::Metrics;

#[derive(Deserialize)]
#[serde(rename_all = "lowercase")]
struct File {
    subnet: Option<Ipv4Net>,
    ipv6subnet: Option<Ipv6Net>,
    #[serde(default)]
    peers: Vec<PeerEntry>,
}

#[derive(Deserialize)]
#[serde(rename_all = "lowercase")]
struct PeerEntry {
    subnet: Option<Ipv4Net>,
    ipv6subnet: Option<Ipv6Net>,
    publicip: Option<Ipv4Addr>,
    publicipv6: Option<Ipv6Addr>,
    vtepmac: Option<String>,
    vtepmacv6: Option<String>,
}

/// Reads and checks the file.
pub fn load(path: &std::path::Path, context: &crate::backend::BackendContext) -> Result<Cluster> {
    let fail = |problem| Error::from(ConfigError::StaticFile { path: path.to_path_buf(), problem });
    let text = std::fs::read(path).map_err(|e| Error::io(format!("static config {}", path.display()), e))?;
    let config = NetworkConfig::parse_with(&text, context).map_err(Error::Format)?;
    let file: File = cnicore::spec::gojson::from_slice(&text).map_err(|e| fail(StaticFileProblem::Parse(e)))?;
    // Each subnet must be one of its family's network, for exactly the families the config enables.
    let check = |what: &'static str, key: SubnetKey| -> Result<SubnetKey> {
        for family in Family::ALL {
            match (config.family(family), key.get(family)) {
                (Some(plan), Some(subnet)) if subnet.trunc() == subnet && plan.network.contains(&subnet) => {}
                (Some(plan), Some(subnet)) => {
                    return Err(fail(StaticFileProblem::OutsideNetwork { what, subnet, network: plan.network }))
                }
                (Some(plan), None) => {
                    return Err(fail(StaticFileProblem::MissingFamily { what, family, network: plan.network }))
                }
                (None, Some(subnet)) => return Err(fail(StaticFileProblem::FamilyNotEnabled { what, family, subnet })),
                (None, None) => {}
            }
        }
        Ok(key)
    };
    let own = check("Subnet", SubnetKey { v4: file.subnet, v6: file.ipv6subnet })?;
    // The data the backend would announce for a node at that address, with the VtepMAC the file gives.
    let data = |family: Family, public: Option<IpAddr>, mac: Option<String>| -> Result<Option<LeaseData>> {
        let data = public.map(|public| config.backend.lease_data(family, public)).transpose();
        let data = data.map_err(|e| Error::io("the backend's lease data", e))?.flatten();
        let Some(data) = data else { return Ok(None) };
        let mut data = data.value().clone();
        if let (Some(text), Some(fields)) = (mac, data.as_object_mut()) {
            crate::backend::vxlan::parse_mac(&text).ok_or_else(|| fail(StaticFileProblem::BadVtepMac(text.clone())))?;
            fields.insert("VtepMAC".into(), Value::String(text));
        }
        Ok(Some(LeaseData::from(data)))
    };
    let mut peers = BTreeMap::new();
    for (position, peer) in file.peers.into_iter().enumerate() {
        let key = check("Peers", SubnetKey { v4: peer.subnet, v6: peer.ipv6subnet })?;
        if key == own {
            continue;
        }
        let attrs = LeaseAttrs {
            public_ip: peer.publicip,
            public_ipv6: peer.publicipv6,
            backend_type: config.backend.type_name().into(),
            backend_data: data(Family::V4, peer.publicip.map(IpAddr::V4), peer.vtepmac)?,
            backend_v6_data: data(Family::V6, peer.publicipv6.map(IpAddr::V6), peer.vtepmacv6)?,
        };
        peers.insert(key, Peer { attrs, created: position as i64 });
    }
    Ok(Cluster { config, subnet: own, lease: None, peers })
}

/// Publishes the file's content, and again whenever it changes; never returns.
pub async fn run(
    path: PathBuf,
    context: crate::backend::BackendContext,
    tx: watch::Sender<Option<Cluster>>,
    metrics: Arc<Metrics>,
) -> Error {
    let mut seen: Option<SystemTime> = None;
    loop {
        let modified = std::fs::metadata(&path).and_then(|m| m.modified()).ok();
        if modified != seen {
            seen = modified;
            match load(&path, &context) {
                Ok(cluster) => publish(&tx, &metrics, &cluster),
                // A broken edit keeps the last good state.
                Err(e) => log!(error, "{e}"),
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load_text(text: &str) -> Result<Cluster> {
        let path = std::env::temp_dir().join(format!("fabricd-static-{}-{}.json", std::process::id(), text.len()));
        std::fs::write(&path, text).unwrap();
        let loaded = load(&path, &crate::backend::BackendContext::default());
        let _ = std::fs::remove_file(&path);
        loaded
    }

    #[test]
    fn an_ipv4_file_as_before() {
        let cluster = load_text(
            r#"{"Network":"10.244.0.0/16","Backend":{"Type":"vxlan"},"Subnet":"10.244.1.0/24",
                "Peers":[{"Subnet":"10.244.2.0/24","PublicIP":"192.168.50.2"},{"subnet":"10.244.1.0/24","publicIP":"192.168.50.1"}]}"#,
        )
        .unwrap();
        assert_eq!(cluster.subnet, SubnetKey::v4("10.244.1.0/24".parse().unwrap()));
        assert_eq!(cluster.peers.len(), 1, "its own entry skipped");
        let peer = &cluster.peers[&SubnetKey::v4("10.244.2.0/24".parse().unwrap())];
        assert_eq!(peer.attrs.data(Family::V4).unwrap()["VtepMAC"], "0e:fa:c0:a8:32:02");
    }

    #[test]
    fn a_dual_stack_file() {
        let cluster = load_text(
            r#"{"EnableIPv6":true,"Network":"10.244.0.0/16","IPv6Network":"fd00:10:244::/56","Backend":{"Type":"vxlan"},
                "Subnet":"10.244.1.0/24","IPv6Subnet":"fd00:10:244:1::/64",
                "Peers":[{"Subnet":"10.244.2.0/24","IPv6Subnet":"fd00:10:244:2::/64","PublicIP":"192.168.50.2","PublicIPv6":"fd00:50::2"}]}"#,
        )
        .unwrap();
        let peer = cluster.peers.values().next().unwrap();
        let derived = crate::backend::vxlan::derived_vtep_mac("fd00:50::2".parse().unwrap());
        assert_eq!(peer.attrs.data(Family::V6).unwrap()["VtepMAC"], cnicore::mac::format(&derived));
        let missing = load_text(
            r#"{"EnableIPv6":true,"Network":"10.244.0.0/16","IPv6Network":"fd00:10:244::/56","Subnet":"10.244.1.0/24","Backend":{"Type":"vxlan"}}"#,
        );
        assert!(missing.unwrap_err().to_string().contains("no IPv6 subnet"));
    }
}
