//! What ADD found before it changed anything, so that DEL can put it back: the reference's file
//! `<dataDir>/<containerID>_<ifname>.json`, in its format (`{"mac","promisc","mtu","allmulti","txQLen"}`, each
//! present only when ADD changed it, indented by one space), mode 0600. Either plugin restores what the other
//! saved. Ours also records the sysctls it changed (`"sysctl"`, which the reference ignores).

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

use cnicore::netlink::Link;
use cnicore::spec::{gojson, Error, ErrorContext, Result};
use serde::{Deserialize, Serialize};

use crate::config::Tuning;

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Saved {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub mac: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub promisc: Option<bool>,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub mtu: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allmulti: Option<bool>,
    #[serde(default, rename = "txQLen", skip_serializing_if = "Option::is_none")]
    pub txqlen: Option<u32>,
    /// Sysctl name (slash form) → the value before ADD and the value ADD wrote.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub sysctl: BTreeMap<String, SavedSysctl>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavedSysctl {
    pub was: String,
    pub set: String,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl Saved {
    /// What `tuning` will change, as it is now: the link's current settings and the sysctls' current values
    /// (`originals`, by name).
    pub fn before(tuning: &Tuning, link: Option<&Link>, originals: &BTreeMap<String, String>) -> Saved {
        let mut saved = Saved::default();
        if let Some(link) = link {
            if tuning.mac.is_some() {
                saved.mac = link.mac.map(|m| cnicore::mac::format(&m)).unwrap_or_default();
            }
            saved.promisc = tuning.promisc.then_some(link.promisc);
            saved.mtu = if tuning.mtu.is_some() { link.mtu } else { 0 };
            saved.allmulti = tuning.allmulti.map(|_| link.allmulti);
            saved.txqlen = tuning.txqlen.map(|_| link.txqlen);
        }
        for sysctl in &tuning.sysctls {
            if let Some(was) = originals.get(&sysctl.name) {
                saved.sysctl.insert(sysctl.name.clone(), SavedSysctl { was: was.clone(), set: sysctl.value.clone() });
            }
        }
        saved
    }

    /// `self` completed with what `later` recorded and `self` does not have: after a repeated ADD, the values
    /// from before the first one are what DEL must restore.
    pub fn merged_with(mut self, later: &Saved) -> Saved {
        if self.mac.is_empty() {
            self.mac = later.mac.clone();
        }
        self.promisc = self.promisc.or(later.promisc);
        if self.mtu == 0 {
            self.mtu = later.mtu;
        }
        self.allmulti = self.allmulti.or(later.allmulti);
        self.txqlen = self.txqlen.or(later.txqlen);
        for (name, value) in &later.sysctl {
            self.sysctl.entry(name.clone()).or_insert_with(|| value.clone());
        }
        self
    }

    /// The reference's rendering: Go's `json.MarshalIndent(v, "", " ")`, no trailing newline.
    pub fn render(&self) -> Vec<u8> {
        let mut out = Vec::new();
        let formatter = serde_json::ser::PrettyFormatter::with_indent(b" ");
        let mut serializer = serde_json::Serializer::with_formatter(&mut out, formatter);
        self.serialize(&mut serializer).expect("serializing plain data cannot fail");
        out
    }

    /// The saved settings at `path`; `None` when there are none.
    pub fn load(path: &Path) -> Result<Option<Saved>> {
        match std::fs::read(path) {
            Ok(bytes) => gojson::from_slice(&bytes)
                .map(Some)
                .map_err(|e| Error::decode(format!("{}: {}", path.display(), cnicore::spec::shorten_json_error(&e)))),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
        }
    }

    /// Writes the file atomically, creating the directory (0700) if needed.
    pub fn store(&self, path: &Path) -> Result<()> {
        if let Some(dir) = path.parent() {
            cnicore::state::ensure_dir(dir, 0o700).with_context(|| format!("creating {}", dir.display()))?;
        }
        cnicore::state::write_atomic(path, &self.render(), 0o600).with_context(|| format!("writing {}", path.display()))
    }
}

/// `<dataDir>/<containerID>_<ifname>.json`. Both names were validated by the entry point (no `/`, no `..`).
pub fn path(data_dir: &Path, container_id: &str, ifname: &str) -> PathBuf {
    data_dir.join(format!("{container_id}_{ifname}.json"))
}

/// Removes the file; one that is already gone is fine.
pub fn remove(path: &Path) -> Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e).with_context(|| format!("removing {}", path.display())),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_as_the_reference() {
        // Bytes the reference 1.1.1 wrote for mac, mtu, promisc and allmulti.
        let reference =
            "{\n \"mac\": \"3e:1d:4f:fc:21:b8\",\n \"promisc\": false,\n \"mtu\": 1500,\n \"allmulti\": false\n}";
        let saved = Saved {
            mac: "3e:1d:4f:fc:21:b8".into(),
            promisc: Some(false),
            mtu: 1500,
            allmulti: Some(false),
            ..Default::default()
        };
        assert_eq!(String::from_utf8(saved.render()).unwrap(), reference);
        assert_eq!(gojson::from_slice::<Saved>(reference.as_bytes()).unwrap(), saved);
        assert_eq!(Saved::default().render(), b"{}");
        let with_more = Saved { txqlen: Some(1000), ..saved.clone() };
        assert!(String::from_utf8(with_more.render()).unwrap().ends_with("\"allmulti\": false,\n \"txQLen\": 1000\n}"));
    }

    #[test]
    fn the_first_values_win_a_merge() {
        let first = Saved { mtu: 1500, ..Default::default() };
        let second = Saved { mtu: 1400, txqlen: Some(1000), ..Default::default() };
        let merged = first.merged_with(&second);
        assert_eq!((merged.mtu, merged.txqlen), (1500, Some(1000)));
    }
}
