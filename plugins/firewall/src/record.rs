//! Attachment records (ours): what an ADD opened, kept in `<dataDir>/<network>/<containerID>:<ifname>`, so
//! that GC and a DEL without prevResult can find the addresses again, and so that the `isolated` drop of a
//! bridge goes with the last attachment that asked for it. The reference's rules carry no owner
//! (`-s <ip> -j ACCEPT`), and they must stay exactly the reference's for takeover either way, so the owner is
//! kept here instead. Written atomically, mode 0600; a record that cannot be read is ignored.

use std::fs;
use std::io::ErrorKind;
use std::path::PathBuf;

use cnicore::spec::{ErrorContext, Result};
use cnicore::state::{self, FileLock};
use ipnet::IpNet;
use serde::{de, Deserialize, Deserializer, Serialize, Serializer};

use crate::config::Backend;
use crate::config::Config;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Record {
    #[serde(rename = "containerID")]
    pub container_id: String,
    pub ifname: String,
    /// `iptables`, `nftables` or `firewalld` (a record naming another is unreadable, and ignored).
    pub backend: Backend,
    /// The firewalld zone, for the firewalld backend.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub zone: String,
    pub ips: Vec<IpNet>,
    /// With ingressPolicy isolated: the bridge whose ports this attachment cut off from each other. The drop
    /// goes when the last record naming the bridge does.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub isolated_bridge: String,
}

impl Serialize for Backend {
    fn serialize<S: Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Backend {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> std::result::Result<Backend, D::Error> {
        let name = String::deserialize(deserializer)?;
        Backend::parse(&name).ok_or_else(|| de::Error::custom(format!("unknown firewall backend {name:?}")))
    }
}

fn network_dir(config: &Config) -> PathBuf {
    config.data_dir.join(&config.network)
}

fn path(config: &Config) -> PathBuf {
    // Neither container IDs nor interface names can hold ':'.
    network_dir(config).join(format!("{}:{}", config.container_id, config.ifname))
}

pub fn save(config: &Config, record: &Record) -> Result<()> {
    let dir = network_dir(config);
    state::ensure_dir(&dir, 0o700).with_context(|| format!("creating {}", dir.display()))?;
    let data = serde_json::to_vec(record).expect("a record serializes");
    let path = path(config);
    state::write_atomic(&path, &data, 0o600).with_context(|| format!("writing {}", path.display()))
}

/// The record of this attachment, if there is a readable one.
pub fn load(config: &Config) -> Option<Record> {
    let data = fs::read(path(config)).ok()?;
    serde_json::from_slice(&data).ok()
}

pub fn remove(config: &Config) -> Result<()> {
    remove_path(path(config))
}

fn remove_path(path: PathBuf) -> Result<()> {
    match fs::remove_file(&path) {
        Err(e) if e.kind() != ErrorKind::NotFound => Err(e).with_context(|| format!("removing {}", path.display())),
        _ => Ok(()),
    }
}

/// Every readable record of the network, with its path.
pub fn list(config: &Config) -> Vec<(PathBuf, Record)> {
    let Ok(entries) = fs::read_dir(network_dir(config)) else { return Vec::new() };
    entries
        .flatten()
        .filter(|entry| !entry.file_name().to_string_lossy().starts_with('.'))
        .filter_map(|entry| {
            let data = fs::read(entry.path()).ok()?;
            Some((entry.path(), serde_json::from_slice(&data).ok()?))
        })
        .collect()
}

/// Serializes the calls that add or may remove a bridge's `isolated` drop (across networks: two networks can
/// share a bridge), so that a DEL never removes the drop between an ADD's rule and its record.
pub fn isolation_lock(config: &Config) -> Result<FileLock> {
    state::ensure_dir(&config.data_dir, 0o700).with_context(|| format!("creating {}", config.data_dir.display()))?;
    let path = config.data_dir.join(".isolation.lock");
    FileLock::exclusive(&path).with_context(|| format!("locking {}", path.display()))
}

/// Whether a record of any network, other than this attachment's own, matches `wanted` (whether a bridge's
/// `isolated` drop is still asked for).
pub fn any_other(config: &Config, wanted: impl Fn(&Record) -> bool) -> bool {
    let own = path(config);
    let Ok(networks) = fs::read_dir(&config.data_dir) else { return false };
    networks.flatten().filter(|network| network.path().is_dir()).any(|network| {
        let Ok(entries) = fs::read_dir(network.path()) else { return false };
        entries
            .flatten()
            .filter(|entry| !entry.file_name().to_string_lossy().starts_with('.') && entry.path() != own)
            .filter_map(|entry| serde_json::from_slice::<Record>(&fs::read(entry.path()).ok()?).ok())
            .any(|record| wanted(&record))
    })
}

/// Removes a record found by [`list`].
pub fn remove_listed(path: PathBuf) -> Result<()> {
    remove_path(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::IngressPolicy;

    fn config(data_dir: &std::path::Path, network: &str, container_id: &str) -> Config {
        Config {
            network: network.into(),
            container_id: container_id.into(),
            ifname: "eth0".into(),
            backend: None,
            admin_chain: "CNI-ADMIN".into(),
            zone: "trusted".into(),
            ingress_policy: IngressPolicy::Isolated,
            data_dir: data_dir.into(),
        }
    }

    fn record(container_id: &str, isolated_bridge: &str) -> Record {
        Record {
            container_id: container_id.into(),
            ifname: "eth0".into(),
            backend: Backend::Iptables,
            zone: String::new(),
            ips: vec!["10.88.0.2/32".parse().unwrap()],
            isolated_bridge: isolated_bridge.into(),
        }
    }

    /// Records of every network count but the attachment's own; a record without the field (written before it
    /// existed) names no bridge.
    #[test]
    fn a_bridge_is_isolated_while_any_record_names_it() {
        let dir = std::env::temp_dir().join(format!("firewall-records-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let a = config(&dir, "net-a", "c1");
        let b = config(&dir, "net-b", "c2");
        save(&a, &record("c1", "br0")).unwrap();
        save(&b, &record("c2", "")).unwrap();
        let _lock = isolation_lock(&a).unwrap();
        let names = |bridge: &'static str| move |r: &Record| r.isolated_bridge == bridge;
        assert!(any_other(&b, names("br0")) && !any_other(&a, names("br0")) && !any_other(&b, names("br1")));
        let text = fs::read_to_string(dir.join("net-b/c2:eth0")).unwrap();
        assert!(!text.contains("isolatedBridge"), "{text}");
        fs::write(dir.join("net-b/c3:eth0"), r#"{"containerID":"c3","ifname":"eth0","backend":"nftables","ips":[]}"#)
            .unwrap();
        assert_eq!(list(&b).len(), 2);
        // A backend of no driver: unreadable, like any other damaged record.
        fs::write(dir.join("net-b/c4:eth0"), r#"{"containerID":"c4","ifname":"eth0","backend":"ipfw","ips":[]}"#)
            .unwrap();
        assert_eq!(list(&b).len(), 2);
        remove(&a).unwrap();
        assert!(!any_other(&b, names("br0")));
        let _ = fs::remove_dir_all(&dir);
    }
}
