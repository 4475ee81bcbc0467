//! What the device had in the node before ADD (its addresses and whether it was up), so that DEL gives it back
//! as it was: moving a device to another namespace drops its addresses, and the reference's DEL returns it down
//! and bare. One file per attachment, `<dataDir>/<containerID>-<ifname>.json`, written before the move (so a
//! killed ADD leaves the record for DEL) and removed by DEL. A device moved in by the reference has no record:
//! it comes back as the reference would bring it back.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use cnicore::netlink::{AddressOptions, Netlink};
use cnicore::spec::{Context, Error, ErrorContext, Result};
use ipnet::IpNet;
use serde::{Deserialize, Serialize};

/// Where the records go unless `dataDir` says otherwise.
pub const DEFAULT_DATA_DIR: &str = "/var/lib/cni/host-device";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Saved {
    /// The attachment (GC keeps the records of the valid ones).
    #[serde(rename = "containerID")]
    pub container_id: String,
    pub ifname: String,
    /// The device's name in the node.
    pub device: String,
    pub up: bool,
    pub addresses: Vec<IpNet>,
}

/// The record's path for this attachment (container ID and ifname are validated by the entry point).
pub fn path(data_dir: &Path, ctx: &Context) -> Result<PathBuf> {
    let name = format!("{}-{}.json", ctx.env.container_id, ctx.env.ifname);
    cnicore::state::validate_path_component("record name", &name)?;
    Ok(data_dir.join(name))
}

pub fn write(path: &Path, saved: &Saved) -> Result<()> {
    let dir = path.parent().unwrap_or(Path::new("/"));
    cnicore::state::ensure_dir(dir, 0o755).with_context(|| format!("failed to create {}", dir.display()))?;
    let data = serde_json::to_vec(saved).map_err(|e| Error::internal(format!("encoding the record: {e}")))?;
    cnicore::state::write_atomic(path, &data, 0o600).with_context(|| format!("failed to write {}", path.display()))
}

/// The record, if there is one; an unreadable one is reported and ignored (DEL must go on).
pub fn read(path: &Path) -> Option<Saved> {
    let bytes = match fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return None,
        Err(e) => {
            cnicore::warn!("ignoring {}: {e}", path.display());
            return None;
        }
    };
    match serde_json::from_slice(&bytes) {
        Ok(saved) => Some(saved),
        Err(e) => {
            cnicore::warn!("ignoring {}: {e}", path.display());
            None
        }
    }
}

pub fn remove(path: &Path) -> Result<()> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => {
            Err(Error::os(format!("failed to remove {}", path.display()), e))
        }
        _ => Ok(()),
    }
}

/// GC: removes the records of attachments not in `valid` (a pod that went without a DEL, a node rebooted).
pub fn gc(data_dir: &Path, valid: &[(String, String)]) -> Result<()> {
    let entries = match fs::read_dir(data_dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(Error::os(format!("failed to read {}", data_dir.display()), e)),
    };
    let mut errors = cnicore::spec::Errors::new();
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().is_none_or(|x| x != "json") {
            continue;
        }
        let Some(saved) = read(&path) else { continue };
        if !valid.iter().any(|(id, ifname)| *id == saved.container_id && *ifname == saved.ifname) {
            errors.record(remove(&path));
        }
    }
    errors.into_result()
}

/// Puts the saved addresses and up state back on link `index` of the node (addresses it has already are kept).
pub fn restore(node: &mut Netlink, index: u32, saved: &Saved) -> Result<()> {
    let present: Vec<IpNet> = node.addresses(Some(index)).context("netlink")?.iter().map(|a| a.addr).collect();
    for addr in saved.addresses.iter().filter(|a| !present.contains(a)) {
        // Without DAD: the address was the device's a moment ago, and is usable at once as it was.
        let options = AddressOptions { nodad: true, ..AddressOptions::default() };
        node.add_address_with(index, *addr, options)
            .with_context(|| format!("failed to put {addr} back on {:?}", saved.device))?;
    }
    if saved.up {
        node.set_up(index).with_context(|| format!("failed to set {:?} up", saved.device))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_missing() {
        let dir = std::env::temp_dir().join(format!("hd-saved-{}", std::process::id()));
        let path = dir.join("c-net1.json");
        let saved = Saved {
            container_id: "c".into(),
            ifname: "net1".into(),
            device: "eth1".into(),
            up: true,
            addresses: vec!["10.0.0.2/24".parse().unwrap()],
        };
        write(&path, &saved).unwrap();
        assert_eq!(read(&path), Some(saved.clone()));
        gc(&dir, &[("c".into(), "net1".into())]).unwrap();
        assert!(path.exists(), "a valid attachment's record is kept");
        gc(&dir, &[("d".into(), "net1".into())]).unwrap();
        assert!(!path.exists(), "a stale record is removed");
        write(&path, &saved).unwrap();
        remove(&path).unwrap();
        remove(&path).unwrap();
        assert_eq!(read(&path), None);
        fs::write(&path, b"{").unwrap();
        assert_eq!(read(&path), None);
        fs::remove_dir_all(&dir).unwrap();
    }
}
