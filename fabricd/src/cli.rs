//! The command line: flanneld's flags with their meaning, and fabricd's own.

use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgAction, Parser, Subcommand};

use crate::dataplane::Dataplane;
use crate::error::{Error, Result};
use crate::flannel::{self, SubnetKey};
use crate::node;
use crate::source::etcd::EtcdOptions;
use crate::source::{LeaseToken, NodeIdentity, Previous, SourceConfig};

/// Flags named as flanneld names them mean what they mean there, so a flannel unit changes only its binary.
/// Every flag is global: `fabricd status --etcd-endpoints=...` as well as `fabricd --etcd-endpoints=... status`.
#[derive(Parser, Debug)]
#[command(name = "fabricd", about = "Node agent: one flat pod network across nodes, on etcd (flannel's layout)")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    /// etcd endpoints, comma-separated.
    #[arg(long, global = true, default_value = "http://127.0.0.1:4001,http://127.0.0.1:2379", value_delimiter = ',')]
    pub etcd_endpoints: Vec<String>,
    /// etcd prefix of the network config and the leases.
    #[arg(long, global = true, default_value = flannel::DEFAULT_PREFIX)]
    pub etcd_prefix: String,
    /// CA certificate file to verify etcd's certificate with.
    #[arg(long, global = true)]
    pub etcd_cafile: Option<PathBuf>,
    /// Client certificate file (PEM) for etcd.
    #[arg(long, global = true)]
    pub etcd_certfile: Option<PathBuf>,
    /// Client key file (PEM) for etcd.
    #[arg(long, global = true)]
    pub etcd_keyfile: Option<PathBuf>,
    /// Interface (name or address) for traffic between nodes; repeatable, the first found wins. Default: the
    /// interface of the default route.
    #[arg(long, global = true)]
    pub iface: Vec<String>,
    /// The address other nodes reach this one at (default: the interface's first IPv4 address).
    #[arg(long, global = true)]
    pub public_ip: Option<Ipv4Addr>,
    /// The IPv6 address other nodes reach this one at (default: the interface's first global IPv6 address).
    #[arg(long, global = true)]
    pub public_ipv6: Option<Ipv6Addr>,
    /// flannel's subnet.env.
    #[arg(long, global = true, default_value = "/run/flannel/subnet.env")]
    pub subnet_file: PathBuf,
    /// Masquerade pod traffic leaving the cluster network.
    #[arg(long, global = true, action = ArgAction::Set, require_equals = true, default_value = "false")]
    pub ip_masq: bool,
    /// Renew the subnet lease this many minutes before it expires.
    #[arg(long, global = true, default_value_t = 60)]
    pub subnet_lease_renew_margin: u64,
    /// Where the node's CNI conflist is written.
    #[arg(long, global = true, default_value = "/etc/cni/net.d")]
    pub cni_conf_dir: PathBuf,
    /// Static mode: the subnet and the peers from this file; no etcd.
    #[arg(long, global = true)]
    pub static_config: Option<PathBuf>,
    /// TTL of the subnet lease, in seconds (flannel: 24 hours).
    #[arg(long, global = true, default_value_t = 86400)]
    pub subnet_lease_ttl: u64,
    /// host-local's dataDir in the conflist (default: host-local's own).
    #[arg(long, global = true)]
    pub cni_ipam_data_dir: Option<PathBuf>,
    /// Firewall backend for the masquerade: iptables or nftables (default: iptables when installed).
    #[arg(long, global = true)]
    pub firewall_backend: Option<String>,
    /// The wireguard backend's private key, created (0600) when missing (default: $WIREGUARD_KEY_FILE, else
    /// `wgkey` beside --subnet-file: flannel's /run/flannel/wgkey).
    #[arg(long)]
    pub wireguard_key_file: Option<PathBuf>,
    /// Serve Prometheus metrics here ("" to disable).
    #[arg(long, global = true, default_value = "127.0.0.1:9799")]
    pub metrics_addr: String,
    /// Remove everything fabricd made on this node (routes, vxlan device, rules, files, its lease) and exit.
    #[arg(long, global = true)]
    pub cleanup: bool,
}

#[derive(Subcommand, Debug, Clone)]
pub enum Command {
    /// Own lease, peers, and what differs between the node and the wanted state.
    Status,
    /// Same as --cleanup.
    Cleanup,
    /// Acquire (or find) this node's lease for --public-ip, print the subnet and exit; touches nothing on the
    /// node (a client for tests of concurrent allocation and of TLS).
    #[command(hide = true)]
    Acquire,
}

/// Go's flag package takes `-flag` as well as `--flag`, and a boolean flag alone means true (`--ip-masq`) while
/// its value must be joined (`--ip-masq=false`): accept the same.
pub fn go_style_args() -> Vec<String> {
    std::env::args()
        .enumerate()
        .map(|(i, arg)| {
            let bytes = arg.as_bytes();
            if arg == "--ip-masq" || arg == "-ip-masq" {
                "--ip-masq=true".to_string()
            } else if i > 0
                && bytes.len() > 2
                && bytes[0] == b'-'
                && bytes[1].is_ascii_alphabetic()
                && arg.contains(['-', '='])
                && bytes[1] != b'h'
            {
                format!("-{arg}")
            } else {
                arg
            }
        })
        .collect()
}

impl Cli {
    /// The node's data plane handle and its identity (its public addresses, from the flags or the underlay).
    pub fn open_dataplane(&self) -> Result<(Dataplane, NodeIdentity)> {
        let mut dataplane = Dataplane::new(self.iface.clone(), self.public_ip, self.public_ipv6)
            .map_err(|e| Error::netlink("opening netlink", e))?;
        let underlay = dataplane.underlay().map_err(|e| Error::netlink("finding the underlay", e))?;
        let identity = NodeIdentity { public_ip: underlay.public_ip, public_ipv6: underlay.public_ipv6 };
        Ok((dataplane, identity))
    }

    /// Where the cluster comes from: the static file, else etcd.
    pub fn source(&self) -> SourceConfig {
        match &self.static_config {
            Some(path) => SourceConfig::Static(path.clone()),
            None => SourceConfig::Etcd(self.etcd_options()),
        }
    }

    fn etcd_options(&self) -> EtcdOptions {
        EtcdOptions {
            endpoints: self.etcd_endpoints.clone(),
            prefix: self.etcd_prefix.clone(),
            cafile: self.etcd_cafile.clone(),
            certfile: self.etcd_certfile.clone(),
            keyfile: self.etcd_keyfile.clone(),
            lease_ttl: Duration::from_secs(self.subnet_lease_ttl),
            renew_margin: Duration::from_secs(self.subnet_lease_renew_margin * 60)
                .min(Duration::from_secs(self.subnet_lease_ttl / 2)),
        }
    }

    pub fn files(&self) -> node::Files {
        node::Files {
            cni_conf_dir: self.cni_conf_dir.clone(),
            subnet_file: self.subnet_file.clone(),
            ipam_data_dir: self.cni_ipam_data_dir.clone(),
        }
    }

    /// Where the wireguard key is kept (see --wireguard-key-file).
    pub fn wireguard_key_file(&self) -> PathBuf {
        let beside_subnet_file = || self.subnet_file.with_file_name("wgkey");
        self.wireguard_key_file.clone().unwrap_or_else(|| {
            std::env::var_os(crate::backend::wireguard::KEY_FILE_VARIABLE)
                .map(PathBuf::from)
                .unwrap_or_else(beside_subnet_file)
        })
    }

    /// The subnet and lease remembered in subnet.env.
    pub fn previous(&self) -> Previous {
        let text = std::fs::read_to_string(&self.subnet_file).unwrap_or_default();
        let env = cnicore::subnet_env::SubnetEnv::parse(&text).unwrap_or_default();
        let subnet = SubnetKey { v4: env.subnet.map(|s| s.trunc()), v6: env.ipv6_subnet.map(|s| s.trunc()) };
        let subnet = (subnet != SubnetKey::default()).then_some(subnet);
        Previous { subnet, lease: env.lease.map(LeaseToken) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_go_before_or_after_the_subcommand() {
        for args in [
            &["fabricd", "status", "--etcd-endpoints=http://10.0.0.1:2379", "--subnet-file=/x/subnet.env"][..],
            &["fabricd", "--etcd-endpoints=http://10.0.0.1:2379", "status", "--subnet-file=/x/subnet.env"],
        ] {
            let cli = Cli::parse_from(args);
            assert!(matches!(cli.command, Some(Command::Status)), "{args:?}");
            assert_eq!(cli.etcd_endpoints, vec!["http://10.0.0.1:2379".to_string()]);
            assert_eq!(cli.subnet_file, PathBuf::from("/x/subnet.env"));
        }
        let cli = Cli::parse_from(["fabricd", "cleanup", "--cni-conf-dir", "/y"]);
        assert!(matches!(cli.command, Some(Command::Cleanup)));
        assert_eq!(cli.cni_conf_dir, PathBuf::from("/y"));
    }
}
