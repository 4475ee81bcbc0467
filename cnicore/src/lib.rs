//! Shared library of the CNI plugins.
//!
//! - [`spec`]: the CNI specification: versions, environment, configs, results of every version and their
//!   conversion, errors, the entry point every plugin's `main` calls, and IPAM delegation.
//! - [`netns`], [`netlink`], [`sysctl`]: network namespaces and a small synchronous netlink layer.
//! - [`iface`]: the pod interface configured from an IPAM result (addresses, routes, sysctls); [`check`]: and
//!   checked against it.
//! - [`state`]: atomic files, locks and validation of names that become paths.
//! - [`mac`]: Ethernet addresses as configs and results spell them.
//! - [`undo`]: the undo list of an ADD; [`tuntap`]: persistent tap devices.
//! - [`ip`]: address families, link-local and global unicast addresses.
//! - [`podlink`]: the shared path of the link plugins (macvlan, ipvlan, vlan, dummy) and the veth pair of
//!   bridge and ptp; [`ipvlan_port`]: the one mode of a master's ipvlan links, looked up before another is made.
//! - [`firewall`]: iptables and nftables rules (portmap's host ports, ipMasq, the firewall plugin's backends),
//!   nf_tables over netlink, conntrack.
//! - [`tc`]: traffic control over rtnetlink (bandwidth's qdiscs and filters).
//! - [`subnet_env`]: flannel's `subnet.env`, written by fabricd and read by the flannel plugin.
//! - [`failpoint`]: named fail points for the crash-consistency tests (feature `failpoints`).

pub mod check;
pub mod failpoint;
pub mod firewall;
pub mod iface;
pub mod ip;
pub mod ipvlan_port;
pub mod mac;
pub mod netlink;
pub mod netns;
pub mod podlink;
pub mod spec;
pub mod state;
pub mod subnet_env;
pub mod sysctl;
pub mod tc;
pub mod tuntap;
pub mod undo;

pub use spec::{Error, Result};
