//! The plugin's config: what ADD, DEL and GC read ([`Conf`]) and where its files are, checked.

use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use cnicore::spec::{truncate_for_msg, Error, Result};
use serde::Deserialize;
use serde_json::{Map, Value};

const DEFAULT_SUBNET_FILE: &str = "/run/flannel/subnet.env";
const DEFAULT_DATA_DIR: &str = "/var/lib/cni/flannel";

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Conf {
    #[serde(default)]
    pub(crate) name: String,
    #[serde(default)]
    pub(crate) cni_version: String,
    pub(crate) ipam: Option<Map<String, Value>>,
    pub(crate) subnet_file: Option<PathBuf>,
    pub(crate) data_dir: Option<PathBuf>,
    pub(crate) delegate: Option<Map<String, Value>>,
    pub(crate) runtime_config: Option<Map<String, Value>>,
}

impl Conf {
    pub(crate) fn data_dir(&self) -> Result<&Path> {
        configured_path("dataDir", self.data_dir.as_deref(), DEFAULT_DATA_DIR)
    }

    pub(crate) fn subnet_file(&self) -> Result<&Path> {
        configured_path("subnetFile", self.subnet_file.as_deref(), DEFAULT_SUBNET_FILE)
    }
}

/// `dataDir` or `subnetFile` (the default when absent or empty): an absolute path without `..`, so that what
/// is written and read does not depend on the runtime's working directory or climb out of the named place.
fn configured_path<'a>(what: &str, path: Option<&'a Path>, default: &'static str) -> Result<&'a Path> {
    let Some(path) = path.filter(|p| !p.as_os_str().is_empty()) else { return Ok(Path::new(default)) };
    let hostile = !path.is_absolute()
        || path.components().any(|c| c == Component::ParentDir)
        || path.as_os_str().as_bytes().contains(&0);
    if hostile {
        let shown = truncate_for_msg(&path.to_string_lossy());
        return Err(Error::config(format!("{what} must be an absolute path without '..' or NUL, got {shown:?}")));
    }
    Ok(path)
}
