//! The node outside the routing tables: forwarding sysctls, masquerade, the CNI conflist and `subnet.env`.

use std::path::{Path, PathBuf};

use cnicore::firewall::{node_masq, Backend};
use ipnet::IpNet;
use serde_json::json;

use cnicore::subnet_env::SubnetEnv;

use crate::error::{Error, Result};
use crate::family::Family;
use crate::flannel::{NetworkConfig, SubnetKey};

/// The conflist's file name in the CNI config dir (sorted first, so runtimes pick it).
pub const CONFLIST_NAME: &str = "10-fabric.conflist";
/// flannel's conflist: on a node that has it, fabricd writes its conflist by that name, so that the node keeps
/// one network (two conflists would hand out one range from two host-local dirs).
pub const FLANNEL_CONFLIST_NAME: &str = "10-flannel.conflist";
/// The bridge of the conflist: its address is the pods' gateway in the node's subnet.
pub const BRIDGE: &str = "cbr0";
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
    /// What fabricd changed on the node outside its own objects (sysctls, a nat table), for `cleanup`,
    /// beside subnet.env.
    pub fn node_record(&self) -> PathBuf {
        self.subnet_file.with_file_name("fabricd-changed.txt")
    }

    /// Where the conflist goes: by flannel's name when the node has that conflist, else fabricd's.
    pub fn conflist_path(&self) -> PathBuf {
        let flannel = self.cni_conf_dir.join(FLANNEL_CONFLIST_NAME);
        match flannel.exists() {
            true => flannel,
            false => self.cni_conf_dir.join(CONFLIST_NAME),
        }
    }

    /// fabricd's own conflist when the conflist goes by flannel's name (written by an earlier run): removed.
    pub fn stale_conflist(&self) -> Option<PathBuf> {
        let own = self.cni_conf_dir.join(CONFLIST_NAME);
        (self.conflist_path() != own && own.exists()).then_some(own)
    }
}

/// Forwarding on; bridged traffic through iptables where the br_netfilter module is loaded (kube-proxy's
/// rules must see pod-to-pod traffic on the bridge). What this changes is remembered in `record` for
/// `cleanup` to put back.
pub fn sysctls(record: &Path) -> std::io::Result<()> {
    set_remembered(record, "net/ipv4/ip_forward", "1")?;
    if Path::new("/proc/sys/net/bridge/bridge-nf-call-iptables").exists() {
        set_remembered(record, "net/bridge/bridge-nf-call-iptables", "1")?;
    }
    Ok(())
}

/// IPv6 forwarding, when the cluster has an IPv6 network (written only when it differs, remembered).
pub fn family_sysctls(record: &Path, config: &NetworkConfig) -> std::io::Result<()> {
    if config.v6.is_some() {
        set_remembered(record, "net/ipv6/conf/all/forwarding", "1")?;
    }
    Ok(())
}

/// One thing fabricd changed on the node, as remembered in its record (one line each), for `cleanup` to put
/// back: a sysctl and its value before (`sysctl net/ipv4/ip_forward=0`), or an nf_tables table that did not
/// exist before the masquerade (`table ip nat`: iptables-nft makes it for the masquerade chain, and leaves it
/// empty when the chain goes; `table ip filter` likewise for the forward accept rules).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Changed {
    Sysctl { name: String, before: String },
    Table { family: String, name: String },
}

impl Changed {
    fn parse(line: &str) -> Option<Changed> {
        match line.split_once(' ')? {
            ("sysctl", rest) => {
                let (name, before) = rest.split_once('=')?;
                Some(Changed::Sysctl { name: name.into(), before: before.into() })
            }
            ("table", rest) => {
                let (family, name) = rest.split_once(' ')?;
                Some(Changed::Table { family: family.into(), name: name.into() })
            }
            _ => None,
        }
    }

    fn line(&self) -> String {
        match self {
            Changed::Sysctl { name, before } => format!("sysctl {name}={before}\n"),
            Changed::Table { family, name } => format!("table {family} {name}\n"),
        }
    }
}

/// What `record` remembers.
fn remembered(record: &Path) -> Vec<Changed> {
    let text = std::fs::read_to_string(record).unwrap_or_default();
    text.lines().filter_map(Changed::parse).collect()
}

/// Adds `change` to `record` unless an entry for the same sysctl or table is there (the first is the node's
/// own state).
fn remember(record: &Path, change: Changed) -> std::io::Result<()> {
    let mut saved = remembered(record);
    let same = |c: &Changed| match (c, &change) {
        (Changed::Sysctl { name: a, .. }, Changed::Sysctl { name: b, .. }) => a == b,
        (a, b) => a == b,
    };
    if !saved.iter().any(same) {
        saved.push(change);
        write_if_changed(record, &saved.iter().map(Changed::line).collect::<String>())?;
    }
    Ok(())
}

/// Sets sysctl `name` to `value`; when that changes it, the value before is remembered in `record`.
fn set_remembered(record: &Path, name: &str, value: &str) -> std::io::Result<()> {
    let before = cnicore::sysctl::read(name)?;
    if before.trim() == value {
        return Ok(());
    }
    remember(record, Changed::Sysctl { name: name.into(), before: before.trim().into() })?;
    cnicore::sysctl::write(name, value)
}

/// The tables iptables-nft may make for the node's rules, remembered in `record` when they do not exist yet:
/// `nat` for the masquerade, and `filter` with `forward` (--iptables-forward-rules' FLANNEL-FWD).
pub fn remember_absent_tables(record: &Path, forward: bool) -> std::io::Result<()> {
    let tables = cnicore::firewall::nfnl::tables()?;
    let names: &[&str] = if forward { &["nat", "filter"] } else { &["nat"] };
    for family in ["ip", "ip6"] {
        for name in names {
            if !tables.iter().any(|(f, n)| f == family && n == name) {
                remember(record, Changed::Table { family: family.into(), name: name.to_string() })?;
            }
        }
    }
    Ok(())
}

/// Puts back what `record` remembers (the sysctls; the tables fabricd made, removed when nothing is left in
/// them) and removes it; what was put back.
pub fn restore(record: &Path) -> Result<Vec<Changed>> {
    let mut done = Vec::new();
    for change in remembered(record) {
        match &change {
            Changed::Sysctl { name, before } => {
                cnicore::sysctl::write_if_different(name, before).map_err(|e| Error::io(name.as_str(), e))?;
            }
            Changed::Table { family, name } => {
                use cnicore::firewall::nftables;
                let listing = nftables::list(&["table", family, name])
                    .map_err(|f| Error::cni(format!("listing table {family} {name}"), f.to_error("nft list")))?;
                let Some(listing) = listing else { continue };
                let rules =
                    listing["nftables"].as_array().map_or(0, |o| o.iter().filter(|o| o.get("rule").is_some()).count());
                if rules > 0 {
                    continue;
                }
                let mut script = nftables::Script::new();
                script.push(format!("delete table {family} {name}"));
                script
                    .apply()
                    .map_err(|f| Error::cni(format!("removing table {family} {name}"), f.to_error("nft delete")))?;
            }
        }
        done.push(change);
    }
    match std::fs::remove_file(record) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(Error::io(record.display().to_string(), e)),
        _ => {}
    }
    Ok(done)
}

/// The kubenet chain of `conf/10-kubenet.conflist` (`conf/20-kubenet-dualstack.conflist` for two families)
/// for this node: one host-local range per family of its subnets, a default route per family, the backend's
/// MTU, and no per-pod masquerade (the node masquerades what leaves the cluster CIDR, see [`masquerade`]).
pub fn conflist(subnet: SubnetKey, mtu: u32, ipam_data_dir: Option<&Path>) -> String {
    let ranges: Vec<_> = subnet.subnets().iter().map(|s| json!([{ "subnet": s.to_string() }])).collect();
    let routes: Vec<_> = subnet
        .subnets()
        .iter()
        .map(|s| json!({ "dst": if s.addr().is_ipv4() { "0.0.0.0/0" } else { "::/0" } }))
        .collect();
    let mut ipam = json!({ "type": "host-local", "ranges": ranges, "routes": routes });
    if let Some(dir) = ipam_data_dir {
        ipam["dataDir"] = json!(dir);
    }
    let conflist = json!({
        "cniVersion": "1.0.0",
        "name": NETWORK_NAME,
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
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

/// flannel's subnet.env: the lines of each enabled family (flanneld's), the MTU, the masquerade flag, and
/// fabricd's lease token.
pub fn subnet_env(config: &NetworkConfig, subnet: SubnetKey, mtu: u32, ip_masq: bool, lease: Option<i64>) -> String {
    let mut env = SubnetEnv::new(mtu, ip_masq, lease);
    if let (Some(IpNet::V4(network)), Some(subnet)) = (config.v4.as_ref().map(|f| f.network), subnet.v4) {
        env = env.with_v4(network, subnet);
    }
    if let (Some(IpNet::V6(network)), Some(subnet)) = (config.v6.as_ref().map(|f| f.network), subnet.v6) {
        env = env.with_v6(network, subnet);
    }
    env.render()
}

/// Node-level masquerade (with `masq`) and flanneld's forward accept rules (with `forward`) through the core
/// library's firewall layer, for each enabled family.
pub fn masquerade(
    backend: Backend,
    config: &NetworkConfig,
    subnet: SubnetKey,
    masq: bool,
    forward: bool,
) -> cnicore::spec::Result<()> {
    let pairs: Vec<(IpNet, IpNet)> = Family::ALL
        .into_iter()
        .filter(|_| masq)
        .filter_map(|f| Some((config.family(f)?.network, subnet.get(f)?)))
        .collect();
    let networks: Vec<IpNet> = config.families().filter(|_| forward).map(|f| f.network).collect();
    if node_masq::is_set_up(backend, &pairs, &networks)? {
        return Ok(());
    }
    node_masq::setup(backend, &pairs, &networks)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conflist_is_the_kubenet_chain_with_the_node_subnet() {
        let text = conflist(SubnetKey::v4("10.244.3.0/24".parse().unwrap()), 1450, Some(Path::new("/tmp/x")));
        let value: serde_json::Value = serde_json::from_str(&text).unwrap();
        let bridge = &value["plugins"][0];
        assert_eq!(bridge["mtu"], 1450);
        assert_eq!(bridge["ipam"]["ranges"][0][0]["subnet"], "10.244.3.0/24");
        assert_eq!(bridge["ipam"]["dataDir"], "/tmp/x");
        assert_eq!(value["plugins"][1]["type"], "portmap");
        assert_eq!(value["name"], "kubenet");
        assert_eq!(bridge["ipam"]["routes"], json!([{ "dst": "0.0.0.0/0" }]));
    }

    #[test]
    fn a_dual_stack_conflist_has_a_range_and_a_default_route_per_family() {
        let subnet =
            SubnetKey { v4: Some("10.244.3.0/24".parse().unwrap()), v6: Some("fd00:10:244:3::/64".parse().unwrap()) };
        let value: serde_json::Value = serde_json::from_str(&conflist(subnet, 1430, None)).unwrap();
        let ipam = &value["plugins"][0]["ipam"];
        assert_eq!(ipam["ranges"], json!([[{ "subnet": "10.244.3.0/24" }], [{ "subnet": "fd00:10:244:3::/64" }]]));
        assert_eq!(ipam["routes"], json!([{ "dst": "0.0.0.0/0" }, { "dst": "::/0" }]));
        let only = SubnetKey { v4: None, v6: subnet.v6 };
        let value: serde_json::Value = serde_json::from_str(&conflist(only, 1430, None)).unwrap();
        assert_eq!(value["plugins"][0]["ipam"]["ranges"], json!([[{ "subnet": "fd00:10:244:3::/64" }]]));
    }

    #[test]
    fn subnet_env_as_flanneld_writes_it_for_each_family() {
        let config = NetworkConfig::parse(
            br#"{"EnableIPv6":true,"Network":"10.244.0.0/16","IPv6Network":"fd00:10:244::/56","Backend":{"Type":"vxlan"}}"#,
        )
        .unwrap();
        let subnet =
            SubnetKey { v4: Some("10.244.3.0/24".parse().unwrap()), v6: Some("fd00:10:244:3::/64".parse().unwrap()) };
        assert_eq!(
            subnet_env(&config, subnet, 1430, true, None),
            "FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.244.3.1/24\nFLANNEL_IPV6_NETWORK=fd00:10:244::/56\nFLANNEL_IPV6_SUBNET=fd00:10:244:3::1/64\nFLANNEL_MTU=1430\nFLANNEL_IPMASQ=true\n"
        );
    }

    #[test]
    fn what_the_agent_changed_is_remembered_once_and_put_back() {
        let record = std::env::temp_dir().join(format!("fabricd-changed-{}.txt", std::process::id()));
        let _ = std::fs::remove_file(&record);
        remember(&record, Changed::Sysctl { name: "net/ipv4/ip_forward".into(), before: "0".into() }).unwrap();
        // A second change of the same sysctl keeps the first value: the node's own.
        remember(&record, Changed::Sysctl { name: "net/ipv4/ip_forward".into(), before: "1".into() }).unwrap();
        remember(&record, Changed::Table { family: "ip".into(), name: "nat".into() }).unwrap();
        remember(&record, Changed::Table { family: "ip".into(), name: "nat".into() }).unwrap();
        assert_eq!(std::fs::read_to_string(&record).unwrap(), "sysctl net/ipv4/ip_forward=0\ntable ip nat\n");
        assert_eq!(
            remembered(&record),
            vec![
                Changed::Sysctl { name: "net/ipv4/ip_forward".into(), before: "0".into() },
                Changed::Table { family: "ip".into(), name: "nat".into() }
            ]
        );
        std::fs::remove_file(&record).unwrap();
    }
}
