//! The node outside the routing tables: forwarding sysctls, masquerade, the CNI conflist and `subnet.env`.

use std::path::{Path, PathBuf};

use cnicore::firewall::{node_masq, Backend};
use ipnet::Ipv4Net;
use serde_json::json;

use cnicore::subnet_env::SubnetEnv;

use crate::flannel::NetworkConfig;

/// The conflist's file name in the CNI config dir (sorted first, so runtimes pick it).
pub const CONFLIST_NAME: &str = "10-fabric.conflist";
/// The network name: kubenet's, as in `conf/10-kubenet.conflist`, whose chain this is.
pub const NETWORK_NAME: &str = "kubenet";

/// Where the node's files go.
#[derive(Debug, Clone)]
pub struct Files {
    pub cni_conf_dir: PathBuf,
    pub subnet_file: PathBuf,
    /// host-local's `dataDir` in the conflist (None: host-local's default).
    pub ipam_data_dir: Option<PathBuf>,
}

impl Files {
    pub fn conflist_path(&self) -> PathBuf {
        self.cni_conf_dir.join(CONFLIST_NAME)
    }
}

/// Forwarding on; bridged traffic through iptables where the br_netfilter module is loaded (kube-proxy's
/// rules must see pod-to-pod traffic on the bridge).
pub fn sysctls() -> std::io::Result<()> {
    cnicore::sysctl::write_if_different("net/ipv4/ip_forward", "1")?;
    if Path::new("/proc/sys/net/bridge/bridge-nf-call-iptables").exists() {
        cnicore::sysctl::write_if_different("net/bridge/bridge-nf-call-iptables", "1")?;
    }
    Ok(())
}

/// The kubenet chain of `conf/10-kubenet.conflist` for this node: its subnet, the backend's MTU, and no
/// per-pod masquerade (the node masquerades what leaves the cluster CIDR, see [`masquerade`]).
pub fn conflist(subnet: Ipv4Net, mtu: u32, ipam_data_dir: Option<&Path>) -> String {
    let mut ipam = json!({
        "type": "host-local",
        "ranges": [[{ "subnet": subnet.to_string() }]],
        "routes": [{ "dst": "0.0.0.0/0" }]
    });
    if let Some(dir) = ipam_data_dir {
        ipam["dataDir"] = json!(dir);
    }
    let conflist = json!({
        "cniVersion": "1.0.0",
        "name": NETWORK_NAME,
        "plugins": [
            {
                "type": "bridge",
                "bridge": "cbr0",
                "mtu": mtu,
                "isGateway": true,
                "ipMasq": false,
                "hairpinMode": true,
                "ipam": ipam
            },
            { "type": "portmap", "capabilities": { "portMappings": true }, "snat": true },
            { "type": "bandwidth", "capabilities": { "bandwidth": true } }
        ]
    });
    let mut text = serde_json::to_string_pretty(&conflist).expect("serialisable");
    text.push('\n');
    text
}

/// Writes `content` to `path` atomically, only when it differs; true when written.
pub fn write_if_changed(path: &Path, content: &str) -> std::io::Result<bool> {
    if std::fs::read_to_string(path).is_ok_and(|current| current == content) {
        return Ok(false);
    }
    if let Some(dir) = path.parent() {
        cnicore::state::ensure_dir(dir, 0o755)?;
    }
    cnicore::state::write_atomic(path, content.as_bytes(), 0o644)?;
    Ok(true)
}

pub fn subnet_env(config: &NetworkConfig, subnet: Ipv4Net, mtu: u32, ip_masq: bool, lease: Option<i64>) -> String {
    SubnetEnv::v4(config.network, subnet, mtu, ip_masq, lease).render()
}

/// Node-level masquerade through the core library's firewall layer (one transaction).
pub fn masquerade(backend: Backend, config: &NetworkConfig, subnet: Ipv4Net) -> cnicore::spec::Result<()> {
    if node_masq::is_set_up(backend, config.network, subnet)? {
        return Ok(());
    }
    node_masq::setup(backend, config.network, subnet)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conflist_is_the_kubenet_chain_with_the_node_subnet() {
        let text = conflist("10.244.3.0/24".parse().unwrap(), 1450, Some(Path::new("/tmp/x")));
        let value: serde_json::Value = serde_json::from_str(&text).unwrap();
        let bridge = &value["plugins"][0];
        assert_eq!(bridge["mtu"], 1450);
        assert_eq!(bridge["ipam"]["ranges"][0][0]["subnet"], "10.244.3.0/24");
        assert_eq!(bridge["ipam"]["dataDir"], "/tmp/x");
        assert_eq!(value["plugins"][1]["type"], "portmap");
        assert_eq!(value["name"], "kubenet");
    }
}
