//! One mode per master. The kernel keeps one ipvlan "port" on a master link, and the port's mode is the mode of
//! every ipvlan link of that master. Creating an ipvlan of another mode does not fail: it switches all the
//! others, in whichever pods they are (seen on 6.1 in the VM lane: an l2 link became l3 and stopped answering
//! ARP). The reference plugin lets that happen; an ADD here looks for the master's ipvlan links first and
//! refuses another mode.
//!
//! The master's links are looked for in the master's own namespace and, for a master on the node, in every
//! namespace file in /run/netns (containerd, CRI-O, podman and `ip netns` keep pods' namespaces there) and in the
//! directory of the pod's own `CNI_NETNS`. A namespace that is kept elsewhere is not seen.

use std::path::{Path, PathBuf};

use crate::netlink::{IpvlanLink, IpvlanMode, Link, Netlink};
use crate::netns::NetNs;
use crate::spec::{Error, Result};

/// Where runtimes keep the namespace files of pods.
const NETNS_DIRS: [&str; 2] = ["/run/netns", "/var/run/netns"];
/// Loaded when there can be ipvtap links (ipvlan's tap form, on the same port): only then are they looked for.
const IPVTAP_MODULE: &str = "/sys/module/ipvtap";

/// An ipvlan link of the master, and the namespace file it was found in (None: the master's own namespace).
#[derive(Debug)]
pub struct Sibling {
    pub link: IpvlanLink,
    pub netns: Option<PathBuf>,
}

/// Refuses an ipvlan of `mode` on `master` (a link of `master_side`'s namespace) when the master already has
/// ipvlan links of another mode. `others`: also look in the pods' namespaces (the master is on the node).
pub fn require_mode(
    mode: IpvlanMode,
    master: &Link,
    master_side: &mut Netlink,
    pod_netns: &Path,
    others: bool,
) -> Result<()> {
    let Some(sibling) = find_sibling(master, master_side, pod_netns, others) else { return Ok(()) };
    if sibling.link.mode == mode {
        return Ok(());
    }
    let place = match &sibling.netns {
        None => "in the master's namespace".to_string(),
        Some(path) => format!("in netns {}", path.display()),
    };
    Err(Error::internal(format!(
        "ipvlan mode {mode} refused on {:?}: its ipvlan links are in mode {} ({:?} {place}), and the kernel keeps \
         one mode for all ipvlan links of a master: a link in mode {mode} would switch them all to it",
        master.name, sibling.link.mode, sibling.link.name
    )))
}

/// An ipvlan link of `master`, if it has one: first in the master's namespace, then (`others`) in the pods'.
/// Namespaces that cannot be read (gone since they were listed, not a namespace) are passed over.
pub fn find_sibling(master: &Link, master_side: &mut Netlink, pod_netns: &Path, others: bool) -> Option<Sibling> {
    let kinds: &[&str] = if Path::new(IPVTAP_MODULE).exists() { &["ipvlan", "ipvtap"] } else { &["ipvlan"] };
    let links_of = |nl: &mut Netlink| -> Vec<IpvlanLink> {
        kinds.iter().flat_map(|kind| nl.ipvlan_links(kind).unwrap_or_default()).collect()
    };
    // In the master's namespace, a link of the master names it without a namespace id.
    let links = links_of(master_side);
    if let Some(link) = links.into_iter().find(|l| l.master == master.index && l.master_nsid.is_none()) {
        return Some(Sibling { link, netns: None });
    }
    if !others {
        return None;
    }
    for path in namespace_files(pod_netns) {
        let Ok(netns) = NetNs::open(&path) else { continue };
        if netns.is_same(master_side.netns()).unwrap_or(true) {
            continue;
        }
        let Ok(mut nl) = Netlink::in_netns(&netns) else { continue };
        let links = links_of(&mut nl);
        let mut candidates = links.into_iter().filter(|l| l.master == master.index && l.master_nsid.is_some());
        let Some(first) = candidates.next() else { continue };
        // The id this namespace gives the master's: given when the dump above reported such a link.
        let Ok(Some(id)) = nl.nsid_of(master_side.netns()) else { continue };
        if let Some(link) = std::iter::once(first).chain(candidates).find(|l| l.master_nsid == Some(id)) {
            return Some(Sibling { link, netns: Some(path) });
        }
    }
    None
}

/// The namespace files to look in: those of [`NETNS_DIRS`] and of the pod's namespace's directory, each
/// directory once (/var/run is usually a link to /run); none under /proc (a process's namespace is not a pod's
/// directory of namespaces).
fn namespace_files(pod_netns: &Path) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    let candidates = NETNS_DIRS.iter().map(PathBuf::from).chain(pod_netns.parent().map(Path::to_path_buf));
    for dir in candidates {
        let Ok(dir) = dir.canonicalize() else { continue };
        if !dir.starts_with("/proc") && !dirs.contains(&dir) {
            dirs.push(dir);
        }
    }
    let mut files = Vec::new();
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        let mut names: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
        names.sort();
        files.extend(names);
    }
    files
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_directory_is_read_once_and_proc_not_at_all() {
        let dir = std::env::temp_dir().join(format!("ipvlan-port-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("b"), "").unwrap();
        std::fs::write(dir.join("a"), "").unwrap();
        let files = namespace_files(&dir.join("a"));
        let ours: Vec<&PathBuf> = files.iter().filter(|f| f.starts_with(dir.canonicalize().unwrap())).collect();
        assert_eq!(ours.len(), 2, "{files:?}");
        assert!(ours[0] < ours[1], "sorted: {ours:?}");
        assert!(namespace_files(Path::new("/proc/self/ns/net")).iter().all(|f| !f.starts_with("/proc")));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
