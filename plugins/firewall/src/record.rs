//! Attachment records (ours): what an ADD opened, kept in `<dataDir>/<network>/<containerID>:<ifname>`, so
//! that GC and a DEL without prevResult can find the addresses again. The reference's rules carry no owner
//! (`-s <ip> -j ACCEPT`), and they must stay exactly the reference's for takeover either way, so the owner is
//! kept here instead. Written atomically, mode 0600; a record that cannot be read is ignored.

use std::fs;
use std::io::ErrorKind;
use std::path::PathBuf;

use cnicore::spec::{ErrorContext, Result};
use cnicore::state;
use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use crate::config::Config;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Record {
    #[serde(rename = "containerID")]
    pub container_id: String,
    pub ifname: String,
    /// `iptables`, `nftables` or `firewalld`.
    pub backend: String,
    /// The firewalld zone, for the firewalld backend.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub zone: String,
    pub ips: Vec<IpNet>,
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

/// Removes a record found by [`list`].
pub fn remove_listed(path: PathBuf) -> Result<()> {
    remove_path(path)
}
