//! The agent's errors: typed, each naming what it was doing.

use std::fmt;
use std::io;
use std::path::PathBuf;

use cnicore::firewall::nfnl::BatchError;

#[derive(Debug)]
pub enum Error {
    /// The cluster file could not be read.
    Read { path: PathBuf, error: io::Error },
    /// The cluster file is not the JSON of a cluster view.
    Parse { path: PathBuf, error: serde_json::Error },
    /// The kernel refused a transaction (nothing of it applied).
    Nftables { doing: &'static str, error: BatchError },
    /// Bridged traffic would bypass the forward hook (br_netfilter's switch off and not settable).
    BridgeNetfilter { name: &'static str, error: io::Error },
    /// The kubeconfig given could not be read or used.
    Kubeconfig(kube::config::KubeconfigError),
    /// No kubeconfig given, and none found (in-cluster, `KUBECONFIG`, `~/.kube/config`).
    InferConfig(kube::config::InferConfigError),
    /// A request to the API server failed.
    Kube(kube::Error),
    /// A watch ended before its first complete list (the runtime shutting down).
    WatchEnded,
    /// The Node's `spec.podCIDRs` holds something that is not a CIDR.
    NodePodCidr { node: String, cidr: String },
    /// The metrics address (`--metrics-addr`) cannot be listened on.
    Listen(agent_http::BindError),
    /// The run directory (drop log, view in force) could not be used.
    RunDir { path: PathBuf, error: io::Error },
    /// `explain` was given a flow it cannot judge.
    Explain(crate::explain::ExplainError),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Read { path, error } => write!(f, "reading {}: {error}", path.display()),
            Error::Parse { path, error } => write!(f, "parsing {}: {error}", path.display()),
            Error::Nftables { doing, error } => write!(f, "{doing}: {error}"),
            Error::BridgeNetfilter { name, error } => {
                write!(f, "{name} cannot be set to 1 ({error}): traffic between pods of one bridge would not be judged")
            }
            Error::Kubeconfig(error) => write!(f, "kubeconfig: {error}"),
            Error::InferConfig(error) => write!(f, "no kubeconfig: {error}"),
            Error::Kube(error) => write!(f, "Kubernetes API: {error}"),
            Error::WatchEnded => f.write_str("a watch ended before its first list"),
            Error::NodePodCidr { node, cidr } => write!(f, "Node {node}: podCIDR {cidr:?} is not a CIDR"),
            Error::Listen(error) => write!(f, "--metrics-addr: {error}"),
            Error::RunDir { path, error } => write!(f, "{}: {error}", path.display()),
            Error::Explain(error) => write!(f, "explain: {error}"),
        }
    }
}

impl std::error::Error for Error {}
