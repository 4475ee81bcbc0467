//! Static mode: the node's subnet and its peers from a file, no store. The file is flannel's network config
//! with two more keys, and is read again when it changes (checked every second):
//!
//! ```json
//! { "Network": "10.244.0.0/16", "SubnetLen": 24, "Backend": { "Type": "host-gw" },
//!   "Subnet": "10.244.1.0/24",
//!   "Peers": [ { "Subnet": "10.244.2.0/24", "PublicIP": "192.168.50.2" },
//!              { "Subnet": "10.244.3.0/24", "PublicIP": "192.168.60.3", "VtepMAC": "0e:fa:c0:a8:3c:03" } ] }
//! ```
//!
//! A peer's `VtepMAC` defaults to the one fabricd derives from its `PublicIP`.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use ipnet::{IpNet, Ipv4Net};
use serde::Deserialize;
use tokio::sync::watch;

use super::{derived_vtep_mac, Cluster, Peer};
use crate::flannel::{parse_mac, BackendKind, LeaseAttrs, NetworkConfig, SubnetKey, VxlanData};
use crate::log;

#[derive(Deserialize)]
struct File {
    #[serde(alias = "subnet")]
    #[serde(rename = "Subnet")]
    subnet: Ipv4Net,
    #[serde(alias = "peers", rename = "Peers", default)]
    peers: Vec<PeerEntry>,
}

#[derive(Deserialize)]
struct PeerEntry {
    #[serde(alias = "subnet", rename = "Subnet")]
    subnet: Ipv4Net,
    #[serde(alias = "publicIP", alias = "publicip", rename = "PublicIP")]
    public_ip: Ipv4Addr,
    #[serde(alias = "vtepMAC", alias = "vtepmac", rename = "VtepMAC", default)]
    vtep_mac: Option<String>,
}

/// Reads and checks the file.
pub fn load(path: &std::path::Path) -> Result<Cluster, String> {
    let text = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let config = NetworkConfig::parse(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    let file: File = serde_json::from_slice(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    let Some(network) = config.v4.as_ref().map(|v4| v4.network) else {
        return Err(format!("{}: static mode is IPv4 only (EnableIPv4)", path.display()));
    };
    let check = |subnet: &Ipv4Net| {
        if subnet.trunc() != *subnet || !network.contains(&IpNet::V4(*subnet)) {
            Err(format!("{}: subnet {subnet} is not a subnet of {network}", path.display()))
        } else {
            Ok(())
        }
    };
    check(&file.subnet)?;
    let vxlan = matches!(config.backend, BackendKind::Vxlan { .. });
    let mut peers = BTreeMap::new();
    for (position, peer) in file.peers.into_iter().enumerate() {
        check(&peer.subnet)?;
        if peer.subnet == file.subnet {
            continue;
        }
        let vtep_mac = match peer.vtep_mac {
            Some(text) => Some(parse_mac(&text).ok_or_else(|| format!("{}: bad VtepMAC {text:?}", path.display()))?),
            None => Some(derived_vtep_mac(peer.public_ip.into())),
        };
        let attrs = LeaseAttrs {
            public_ip: Some(peer.public_ip),
            public_ipv6: None,
            backend_type: config.backend.type_name().into(),
            backend_data: vxlan.then_some(VxlanData { vni: Some(config.vni), vtep_mac }),
            backend_v6_data: None,
        };
        peers.insert(SubnetKey::v4(peer.subnet), Peer { attrs, created: position as i64 });
    }
    Ok(Cluster { config, subnet: SubnetKey::v4(file.subnet), lease: None, peers })
}

/// Publishes the file's content, and again whenever it changes.
pub async fn run(path: PathBuf, tx: watch::Sender<Option<Cluster>>) {
    let mut seen: Option<SystemTime> = None;
    loop {
        let modified = std::fs::metadata(&path).and_then(|m| m.modified()).ok();
        if modified != seen {
            seen = modified;
            match load(&path) {
                Ok(cluster) => {
                    tx.send_if_modified(|current| {
                        let changed = current.as_ref() != Some(&cluster);
                        *current = Some(cluster);
                        changed
                    });
                }
                // A broken edit keeps the last good state.
                Err(e) => log!(error, "static config: {e}"),
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}
