//! Shared library of the CNI plugins.
//!
//! - [`spec`]: the CNI specification: versions, environment, configs, results of every version and their
//!   conversion, errors, the entry point every plugin's `main` calls, and IPAM delegation.
//! - [`netns`], [`netlink`], [`sysctl`]: network namespaces and a small synchronous netlink layer.
//! - [`iface`]: the pod interface configured from an IPAM result (addresses, routes, sysctls).
//! - [`state`]: atomic files, locks and validation of names that become paths.
//! - [`mac`]: Ethernet addresses as configs and results spell them.

pub mod failpoint;
pub mod firewall;
pub mod iface;
pub mod mac;
pub mod netlink;
pub mod netns;
pub mod podlink;
pub mod spec;
pub mod state;
pub mod subnet_env;
pub mod sysctl;
pub mod tc;

pub use spec::{Error, Result};
