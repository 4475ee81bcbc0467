//! cni-netpol: Kubernetes NetworkPolicy enforced on every node natively in nftables.
//!
//! - [`model`]: what the agent reads of the cluster (Namespaces, Pods, NetworkPolicies), as the API's JSON.
//! - [`compile`]: the pure policy compiler, cluster view in, [`plan::Plan`] out (no kernel).
//! - [`plan`]: the table as data (sets, chains, rules) and an evaluator of it for one packet.
//! - [`ranges`]: CIDRs minus exceptions as address ranges (interval sets).
//! - [`nft`]: the plan as nf_tables netlink messages, sent as one transaction.
//! - [`apply`]: the table replaced whole at start, then changed by set-element differences.
//! - [`agent`]: the loop: a source of cluster views, compiled and applied; [`error`]: its errors.
//! - [`watch`]: the Kubernetes source (Pods, Namespaces, NetworkPolicies watched into reflector stores).
//! - [`metrics`]: what the agent did and holds, in the Prometheus text format, with `/healthz` and `/readyz`
//!   (`--metrics-addr`).
//! - [`verdicts`]: what an operator reads: the drop log ([`nflog`] read into [`drops`]) and [`explain`].

/// Logs a line on stderr, prefixed with the agent's name: every line the agent writes goes through it.
#[macro_export]
macro_rules! log {
    ($($arg:tt)*) => { eprintln!("cni-netpol: {}", format!($($arg)*)) };
}

pub mod agent;
pub mod apply;
pub mod compile;
pub mod drops;
pub mod error;
pub mod explain;
pub mod metrics;
pub mod model;
pub mod nflog;
pub mod nft;
pub mod plan;
pub mod ranges;
pub mod verdicts;
pub mod watch;
