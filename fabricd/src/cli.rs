//! The command line: flanneld's flags with their meaning, and fabricd's own.

use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgAction, Parser, Subcommand};

use crate::backend::BackendContext;
use crate::dataplane::Dataplane;
use crate::error::{ConfigError, Error, Result};
use crate::flannel::{self, SubnetKey};
use crate::node;
use crate::source::etcd::EtcdOptions;
use crate::source::kube::KubeOptions;
use crate::source::{LeaseToken, NodeIdentity, Previous, Source, StaticSource};

/// Flags named as flanneld names them mean what they mean there, so a flannel unit changes only its binary.
/// Every flag is global: `fabricd status --etcd-endpoints=...` as well as `fabricd --etcd-endpoints=... status`.
#[derive(Parser, Debug)]
#[command(name = "fabricd", about = "Node agent: one flat pod network across nodes, on etcd (flannel's layout)")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    /// The underlay interface's MTU once the agent found it (not a flag): backends' `MTU` options are checked
    /// against it.
    #[arg(skip)]
    pub underlay_mtu: Option<u32>,
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
    /// Serve Prometheus metrics, /healthz and /readyz here, e.g. 127.0.0.1:9799 (default: none; flanneld has
    /// no such server, and a port a node did not ask for is not opened).
    #[arg(long, global = true, default_value = "")]
    pub metrics_addr: String,
    /// Remove everything fabricd made on this node (routes, vxlan device, rules, files, its lease) and exit.
    #[arg(long, global = true, action = ArgAction::Set, require_equals = true, default_value = "false")]
    pub cleanup: bool,
    /// Leases from the Kubernetes Node objects (their podCIDRs) instead of etcd.
    #[arg(long, global = true, action = ArgAction::Set, require_equals = true, default_value = "false")]
    pub kube_subnet_mgr: bool,
    /// The Kubernetes API server's URL (default: in-cluster, or the kubeconfig's).
    #[arg(long, global = true)]
    pub kube_api_url: Option<String>,
    /// Prefix of flannel's Node annotations (at most one slash; none: one is appended).
    #[arg(long, global = true, default_value = crate::source::kube::annotations::DEFAULT_PREFIX)]
    pub kube_annotation_prefix: String,
    /// kubeconfig file (default: the pod's service account).
    #[arg(long, global = true)]
    pub kubeconfig_file: Option<PathBuf>,
    /// The network config in Kubernetes mode (the ConfigMap's net-conf.json).
    #[arg(long, global = true, default_value = "/etc/kube-flannel/net-conf.json")]
    pub net_config_path: PathBuf,
    /// Set the Node's NetworkUnavailable condition to False once the node is ready (Kubernetes mode).
    #[arg(long, global = true, action = ArgAction::Set, require_equals = true, default_value = "true")]
    pub set_node_network_unavailable: bool,
    /// Address of the /healthz and /readyz server.
    #[arg(long, global = true, default_value = "0.0.0.0")]
    pub healthz_ip: String,
    /// Port of the /healthz and /readyz server (0: none).
    #[arg(long, global = true, default_value_t = 0)]
    pub healthz_port: u16,
    /// Regular expression matching the underlay interface's name or one of its addresses; repeatable, tried
    /// after --iface.
    #[arg(long, global = true)]
    pub iface_regex: Vec<String>,
    /// The underlay is the interface of the route to this address (tried after --iface and --iface-regex).
    #[arg(long, global = true)]
    pub iface_can_reach: Option<std::net::IpAddr>,
    /// Print the version and exit.
    #[arg(long, global = true, action = ArgAction::Set, require_equals = true, default_value = "false")]
    pub version: bool,
    /// How often the masquerade rules are checked, in seconds (flanneld's default, 5).
    #[arg(long, global = true, default_value_t = 5)]
    pub iptables_resync: u64,
    /// flanneld's accept rules for traffic from and to the cluster's networks on the forward hook (iptables
    /// FLANNEL-FWD, or the forward chain of flanneld's nftables tables), in the masquerade's firewall backend.
    /// On by default, as flanneld's: on a node whose FORWARD policy drops (Docker sets it), pod traffic between
    /// nodes passes only through them.
    #[arg(long, global = true, action = ArgAction::Set, require_equals = true, default_value = "true")]
    pub iptables_forward_rules: bool,
    /// flanneld's flags that fabricd does not honour: refused when set to anything but their default.
    #[command(flatten)]
    pub refused: RefusedFlags,
}

/// flanneld flags fabricd does not honour. Each is accepted at its default value (so a unit or manifest that
/// spells the default out still runs) and refused otherwise, with why.
#[derive(clap::Args, Debug, Default)]
pub struct RefusedFlags {
    #[arg(long, global = true, action = ArgAction::Set, require_equals = true)]
    pub ip_masq_fully_random_disable: Option<bool>,
    #[arg(long, global = true, action = ArgAction::Set, require_equals = true)]
    pub ip_blackhole_route: Option<bool>,
    #[arg(long, global = true)]
    pub etcd_username: Option<String>,
    #[arg(long, global = true)]
    pub etcd_password: Option<String>,
}

impl RefusedFlags {
    /// The first flag set to what fabricd cannot do, with why.
    pub fn check(&self) -> Result<()> {
        let refuse = |flag: &'static str, why: &'static str| Err(ConfigError::Unsupported { flag, why }.into());
        if self.ip_masq_fully_random_disable == Some(true) {
            return refuse("ip-masq-fully-random-disable", "fabricd's masquerade rules are always fully random");
        }
        if self.ip_blackhole_route == Some(true) {
            return refuse("ip-blackhole-route", "fabricd adds no blackhole route for the node's subnet");
        }
        if self.etcd_username.is_some() || self.etcd_password.is_some() {
            return refuse("etcd-username/--etcd-password", "etcd password authentication is not implemented; use client certificates (--etcd-certfile, --etcd-keyfile)");
        }
        Ok(())
    }
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

/// flanneld's boolean flags: alone they mean true.
const BOOL_FLAGS: &[&str] = &[
    "ip-masq",
    "kube-subnet-mgr",
    "set-node-network-unavailable",
    "version",
    "cleanup",
    "ip-masq-fully-random-disable",
    "iptables-forward-rules",
    "ip-blackhole-route",
];

/// Every flag of flanneld v0.28, each settable as `FLANNELD_<FLAG>` (upper case, `-` as `_`) when not given on
/// the command line.
const FLANNELD_FLAGS: &[&str] = &[
    "etcd-endpoints",
    "etcd-prefix",
    "etcd-keyfile",
    "etcd-certfile",
    "etcd-cafile",
    "etcd-username",
    "etcd-password",
    "iface",
    "iface-regex",
    "iface-can-reach",
    "subnet-file",
    "public-ip",
    "public-ipv6",
    "subnet-lease-renew-margin",
    "ip-masq",
    "ip-masq-fully-random-disable",
    "kube-subnet-mgr",
    "kube-api-url",
    "kube-annotation-prefix",
    "kubeconfig-file",
    "version",
    "healthz-ip",
    "healthz-port",
    "iptables-resync",
    "iptables-forward-rules",
    "ip-blackhole-route",
    "net-config-path",
    "set-node-network-unavailable",
];

/// The command line, then `FLANNELD_<FLAG>` for each flanneld flag it does not give (flanneld's
/// `SetFlagsFromEnv`).
pub fn go_style_args() -> Vec<String> {
    with_flanneld_env(go_style(std::env::args()), |name| std::env::var(name).ok())
}

fn with_flanneld_env(mut args: Vec<String>, env: impl Fn(&str) -> Option<String>) -> Vec<String> {
    for flag in FLANNELD_FLAGS {
        let given = args.iter().skip(1).any(|a| a == &format!("--{flag}") || a.starts_with(&format!("--{flag}=")));
        let variable = format!("FLANNELD_{}", flag.to_uppercase().replace('-', "_"));
        if let Some(value) = env(&variable).filter(|v| !v.is_empty()).filter(|_| !given) {
            args.push(format!("--{flag}={value}"));
        }
    }
    args
}

/// Go's flag package takes `-flag` as well as `--flag`, and a boolean flag alone means true (`--ip-masq`) while
/// its value must be joined (`--ip-masq=false`): accept the same.
fn go_style(args: impl Iterator<Item = String>) -> Vec<String> {
    args.enumerate()
        .map(|(i, arg)| {
            let bytes = arg.as_bytes();
            let bare = arg.trim_start_matches('-');
            if i > 0 && arg.starts_with('-') && BOOL_FLAGS.contains(&bare) {
                format!("--{bare}=true")
            } else if i > 0
                && bytes.len() > 2
                && bytes[0] == b'-'
                && bytes[1].is_ascii_alphabetic()
                && arg.contains(['-', '='])
                && arg != "-h"
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
        let iface = self.chosen_iface()?;
        let mut dataplane = Dataplane::new(iface, self.public_ip, self.public_ipv6)
            .map_err(|e| Error::netlink("opening netlink", e))?;
        let underlay = dataplane.underlay().map_err(|e| Error::netlink("finding the underlay", e))?;
        let identity = NodeIdentity { public_ip: underlay.public_ip, public_ipv6: underlay.public_ipv6 };
        Ok((dataplane, identity))
    }

    /// --iface, else the first interface --iface-regex matches, else the one --iface-can-reach's route leaves
    /// by (flanneld's order); nothing given: the default route's.
    fn chosen_iface(&self) -> Result<Vec<String>> {
        if self.iface_regex.is_empty() && self.iface_can_reach.is_none() {
            return Ok(self.iface.clone());
        }
        let mut regexes = Vec::new();
        for text in &self.iface_regex {
            let regex =
                regex_lite::Regex::new(text).map_err(|error| ConfigError::IfaceRegex { text: text.clone(), error })?;
            regexes.push(regex);
        }
        let mut nl = cnicore::netlink::Netlink::new().map_err(|e| Error::netlink("opening netlink", e))?;
        crate::underlay::choose(&mut nl, &self.iface, &regexes, self.iface_can_reach)
            .map_err(|e| Error::netlink("choosing the interface (--iface, --iface-regex, --iface-can-reach)", e))
    }

    /// Where the cluster comes from: the static file, the Kubernetes Nodes, else etcd.
    pub fn source(&self) -> Box<dyn Source> {
        match &self.static_config {
            Some(path) => Box::new(StaticSource(path.clone(), self.backend_context())),
            None if self.kube_subnet_mgr => Box::new(KubeOptions {
                api_url: self.kube_api_url.clone().filter(|u| !u.is_empty()),
                kubeconfig: self.kubeconfig_file.clone().filter(|p| !p.as_os_str().is_empty()),
                annotation_prefix: self.kube_annotation_prefix.clone(),
                net_config_path: self.net_config_path.clone(),
                set_node_network_unavailable: self.set_node_network_unavailable,
                backend: self.backend_context(),
            }),
            None => Box::new(self.etcd_options()),
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
            backend: self.backend_context(),
        }
    }

    pub fn files(&self) -> node::Files {
        node::Files {
            cni_conf_dir: self.cni_conf_dir.clone(),
            subnet_file: self.subnet_file.clone(),
            ipam_data_dir: self.cni_ipam_data_dir.clone(),
        }
    }

    /// What every backend is built with: one value from the command line.
    pub fn backend_context(&self) -> BackendContext {
        BackendContext { wireguard_key_file: self.wireguard_key_file(), underlay_mtu: self.underlay_mtu }
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

    fn args(list: &[&str]) -> Vec<String> {
        go_style(list.iter().map(|a| a.to_string()))
    }

    #[test]
    fn flannel_s_manifest_command_line_is_accepted() {
        let cli = Cli::parse_from(args(&["flanneld", "--ip-masq", "--kube-subnet-mgr", "--healthz-port=8081"]));
        assert!(cli.ip_masq && cli.kube_subnet_mgr && cli.set_node_network_unavailable);
        assert_eq!(cli.healthz_port, 8081);
        assert_eq!(cli.healthz_ip, "0.0.0.0");
        assert_eq!(cli.net_config_path, PathBuf::from("/etc/kube-flannel/net-conf.json"));
        assert_eq!(cli.kube_annotation_prefix, "flannel.alpha.coreos.com");
        assert!(cli.refused.check().is_ok());
        let cli = Cli::parse_from(args(&["flanneld", "-kube-subnet-mgr", "-set-node-network-unavailable=false"]));
        assert!(cli.kube_subnet_mgr && !cli.set_node_network_unavailable);
        assert!(Cli::parse_from(args(&["flanneld", "--version"])).version);
    }

    #[test]
    fn flags_fabricd_cannot_honour_are_refused_by_name() {
        for (flag, name) in [
            ("--ip-blackhole-route", "--ip-blackhole-route"),
            ("--ip-masq-fully-random-disable", "--ip-masq-fully-random-disable"),
            ("--etcd-password=x", "--etcd-username/--etcd-password"),
        ] {
            let cli = Cli::parse_from(args(&["flanneld", flag]));
            let error = cli.refused.check().unwrap_err().to_string();
            assert!(error.starts_with(&format!("{name} is not supported: ")), "{error}");
        }
        let cli = Cli::parse_from(args(&["flanneld", "--ip-blackhole-route=false"]));
        assert!(cli.refused.check().is_ok(), "defaults spelled out are fine");
        let forward = Cli::parse_from(args(&["flanneld", "--iptables-forward-rules"]));
        assert!(forward.iptables_forward_rules && forward.refused.check().is_ok(), "honoured, as flanneld's");
        assert!(Cli::parse_from(args(&["flanneld"])).iptables_forward_rules, "on by default, as flanneld's");
        let off = Cli::parse_from(args(&["flanneld", "--iptables-forward-rules=false"]));
        assert!(!off.iptables_forward_rules, "off when asked");
    }

    #[test]
    fn flanneld_variables_set_what_the_command_line_does_not() {
        let env = |name: &str| match name {
            "FLANNELD_IFACE" => Some("eth1".to_string()),
            "FLANNELD_KUBE_SUBNET_MGR" => Some("true".to_string()),
            "FLANNELD_PUBLIC_IP" => Some("10.0.0.9".to_string()),
            "FLANNELD_HEALTHZ_PORT" => Some("".to_string()),
            _ => None,
        };
        let list = with_flanneld_env(args(&["flanneld", "--public-ip=10.0.0.1"]), env);
        let cli = Cli::parse_from(list);
        assert_eq!(cli.iface, vec!["eth1".to_string()]);
        assert!(cli.kube_subnet_mgr);
        assert_eq!(cli.public_ip, Some(Ipv4Addr::new(10, 0, 0, 1)), "the command line wins");
        assert_eq!(cli.healthz_port, 0, "an empty variable sets nothing");
    }
}
