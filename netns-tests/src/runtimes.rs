//! What the runtime tests (`containerd.rs`, `podman.rs`) share: the plugins under test, a node with an
//! uplink to a "wan" netns, and small helpers.

use std::path::PathBuf;

use crate::recorder::Call;
use crate::upstream::REFERENCE_DIR;
use crate::{bin_dir, veth_between, Node, TestNetns};
// Their home before the rig's root had them; runtime tests written against it keep working.
pub use crate::{eventually, net};

/// The plugins under test: each runtime test runs once with each, so a failure of ours alone is ours to fix.
#[derive(Clone, Copy, Debug)]
pub enum Plugins {
    Ours,
    /// Debian's reference plugins in /usr/lib/cni.
    Reference,
}

impl Plugins {
    /// Ours: `$CNI_PLUGIN_DIR` if set (an installed tree, e.g. the Debian package's `/usr/lib/cni` in a scratch
    /// root: see `tests/package.rs`), else the workspace's built binaries.
    pub fn dir(self) -> PathBuf {
        match self {
            Plugins::Ours => std::env::var_os("CNI_PLUGIN_DIR").map(PathBuf::from).unwrap_or_else(bin_dir),
            Plugins::Reference => PathBuf::from(REFERENCE_DIR),
        }
    }
}

/// The node's address on its uplink, where wan reaches hostPorts.
pub const NODE_IP: &str = "192.0.2.1";
pub const WAN_IP: &str = "192.0.2.2";

/// A node netns with an uplink `eth0` to a wan netns, and a default route through it.
pub fn node_with_wan() -> (Node, TestNetns) {
    let node = Node::new();
    let wan = TestNetns::new("wan");
    veth_between(&node, &wan, "eth0", "eth0", &[net(&format!("{NODE_IP}/24"))], &[net(&format!("{WAN_IP}/24"))]);
    node.ip(&["route", "add", "default", "via", WAN_IP]);
    (node, wan)
}

/// The links of the node that belong to a pod: host veths and the bandwidth ifbs.
pub fn pod_links(node: &Node) -> Vec<String> {
    node.links().into_iter().filter(|l| l.starts_with("veth") || l.starts_with("bwp")).collect()
}

/// The calls of `command` by `plugin`.
pub fn calls_of<'a>(calls: &'a [Call], command: &str, plugin: &str) -> Vec<&'a Call> {
    calls.iter().filter(|c| c.command() == command && c.plugin == plugin).collect()
}

/// The calls, one a line, for messages.
pub fn summaries(calls: &[Call]) -> String {
    calls.iter().map(Call::summary).collect::<Vec<_>>().join("\n  ")
}
