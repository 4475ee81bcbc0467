//! fabricd's errors: what failed, classified by kind (the agent and the store decide by kind, never by the
//! text), printed whole (the cause's own message, a cnicore error with its details).

use std::fmt;
use std::io;
use std::net::IpAddr;
use std::path::PathBuf;

use ipnet::IpNet;

use crate::family::Family;

/// How an etcd request failed, read from the error's type and its causes (io error kinds, gRPC codes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EtcdErrorKind {
    /// No connection: refused, timed out, no route to the endpoint.
    Unreachable,
    /// A connection was made and then closed or reset by etcd (with a client certificate, most often etcd
    /// refusing it after the TLS handshake).
    Closed,
    /// TLS: etcd's certificate was not accepted, or the TLS material is unusable.
    Tls,
    /// etcd answered with an error status (a bad request, no permission, a lease that does not exist).
    Refused,
    /// The watch stream ended or was canceled.
    Watch,
    /// Local: a bad endpoint URI or argument.
    Local,
}

impl EtcdErrorKind {
    /// Reads the kind of `error` from its variant and its chain of causes.
    pub fn of(error: &etcd_client::Error) -> EtcdErrorKind {
        use etcd_client::Error as E;
        let io_cause = match error {
            E::IoError(io) => io_kind(io),
            _ => io_kind(error),
        };
        if let Some(kind) = io_cause {
            return kind;
        }
        match error {
            E::TransportError(_) | E::IoError(_) => EtcdErrorKind::Unreachable,
            E::GRpcStatus(status) => match status.code() {
                tonic::Code::Unavailable | tonic::Code::Cancelled | tonic::Code::Unknown => EtcdErrorKind::Closed,
                tonic::Code::DeadlineExceeded => EtcdErrorKind::Unreachable,
                _ => EtcdErrorKind::Refused,
            },
            E::WatchError(_) | E::LeaseKeepAliveError(_) => EtcdErrorKind::Watch,
            _ => EtcdErrorKind::Local,
        }
    }
}

/// The kind told by the first io error among the causes that tells one, if any.
fn io_kind(error: &(dyn std::error::Error + 'static)) -> Option<EtcdErrorKind> {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(current) = cause {
        if let Some(io) = current.downcast_ref::<io::Error>() {
            use io::ErrorKind as K;
            let kind = match io.kind() {
                K::ConnectionRefused
                | K::TimedOut
                | K::HostUnreachable
                | K::NetworkUnreachable
                | K::AddrNotAvailable => Some(EtcdErrorKind::Unreachable),
                K::ConnectionReset | K::ConnectionAborted | K::BrokenPipe | K::UnexpectedEof => {
                    Some(EtcdErrorKind::Closed)
                }
                // rustls reports a certificate it does not accept as invalid data.
                K::InvalidData => Some(EtcdErrorKind::Tls),
                _ => None,
            };
            if let Some(kind) = kind.or_else(|| io.get_ref().and_then(|inner| io_kind(inner))) {
                return Some(kind);
            }
        }
        cause = current.source();
    }
    None
}

/// An error of fabricd.
#[derive(Debug)]
pub enum Error {
    /// An etcd request failed: what was being done, the kind, and the client's message with its causes.
    Etcd { what: String, kind: EtcdErrorKind, message: String },
    /// A request to the Kubernetes API failed: what was being done, and the client's message (the API
    /// server's status, or why there was no answer).
    Kube { what: String, message: String },
    /// A netlink request or dump failed.
    Netlink { what: String, source: io::Error },
    /// A file or other OS call failed.
    Io { what: String, source: io::Error },
    /// An error of the core library (sysctls, firewall), with its details.
    Cni { what: String, source: cnicore::spec::Error },
    /// A flag, a variable or a file of this node's settings is not usable.
    Config(ConfigError),
    /// The network config in the store is not usable.
    Format(crate::flannel::FormatError),
    /// The store holds something fabricd cannot use (no config, no free subnet, no lease of this node).
    Store(StoreError),
    /// The network config does not hold the node's subnet (its lease, or the one in subnet.env): the node
    /// does not start, its pods would lose their addresses.
    SubnetOutsideConfig { subnet: ipnet::IpNet, network: ipnet::IpNet, subnet_len: u8 },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn etcd(what: impl Into<String>, error: etcd_client::Error) -> Error {
        Error::Etcd { what: what.into(), kind: EtcdErrorKind::of(&error), message: describe(&error) }
    }

    pub fn kube(what: impl Into<String>, error: kube::Error) -> Error {
        let message = match &error {
            kube::Error::Api(status) => format!("{} ({} {})", status.message, status.code, status.reason),
            other => describe_chain(other),
        };
        Error::Kube { what: what.into(), message }
    }

    pub fn netlink(what: impl Into<String>, source: io::Error) -> Error {
        Error::Netlink { what: what.into(), source }
    }

    pub fn io(what: impl Into<String>, source: io::Error) -> Error {
        Error::Io { what: what.into(), source }
    }

    pub fn cni(what: impl Into<String>, source: cnicore::spec::Error) -> Error {
        Error::Cni { what: what.into(), source }
    }

    /// The kind of an etcd failure (None for other errors).
    pub fn etcd_kind(&self) -> Option<EtcdErrorKind> {
        match self {
            Error::Etcd { kind, .. } => Some(*kind),
            _ => None,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Etcd { what, message, .. } => write!(f, "{what}: {message}"),
            Error::Kube { what, message } => write!(f, "{what}: {message}"),
            Error::Netlink { what, source } => write!(f, "{what}: {source}"),
            Error::Io { what, source } => write!(f, "{what}: {source}"),
            // cnicore's Display is the message and its details: the whole error.
            Error::Cni { what, source } => write!(f, "{what}: {source}"),
            Error::Config(error) => write!(f, "{error}"),
            Error::Store(error) => write!(f, "{error}"),
            Error::SubnetOutsideConfig { subnet, network, subnet_len } => write!(
                f,
                "this node's subnet {subnet} is not a /{subnet_len} of the Network {network} in the network config \
                 (changed since the node got it): its pods would lose their addresses. Put the config back, or \
                 drain the node and run `fabricd cleanup` to move it to the new Network"
            ),
            Error::Format(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for Error {}

impl From<ConfigError> for Error {
    fn from(error: ConfigError) -> Error {
        Error::Config(error)
    }
}

impl From<StoreError> for Error {
    fn from(error: StoreError) -> Error {
        Error::Store(error)
    }
}

/// What of this node's settings (flags, environment, files, its own Node) is not usable.
#[derive(Debug)]
pub enum ConfigError {
    /// A flag that takes an address was given something else.
    NotAnAddress { flag: &'static str, text: String },
    /// A flag set to what fabricd cannot do, and why.
    Unsupported { flag: &'static str, why: &'static str },
    /// An `--iface-regex` that is not a regular expression.
    IfaceRegex { text: String, error: regex_lite::Error },
    /// `fabricd acquire` without the node's address.
    AcquireWithoutPublicIp,
    /// `fabricd acquire` with a source that leases nothing.
    AcquireWithoutEtcd,
    /// One of `--etcd-certfile` and `--etcd-keyfile` without the other.
    EtcdCertWithoutKey,
    /// The cluster enables a family this node has no public address of.
    NoPublicAddressOf { family: Family, network: IpNet },
    /// The node has no public address at all.
    NoPublicAddress,
    /// The node has no public address of the cluster's family.
    NoPublicAddressOfCluster,
    /// The static cluster file is not usable.
    StaticFile { path: PathBuf, problem: StaticFileProblem },
    /// A variable of flanneld's environment that does not parse.
    Variable { name: &'static str, value: String, error: std::num::ParseIntError },
    /// Neither `NODE_NAME` nor `POD_NAME` and `POD_NAMESPACE`: this node's name cannot be found.
    NoNodeName,
    /// The Kubernetes API client could not be configured from `what` (a kubeconfig, a URL, in-cluster).
    KubeClient { what: String, error: Box<dyn std::error::Error + Send + Sync> },
    /// `--kube-annotation-prefix` with more than one slash.
    AnnotationPrefixSlashes,
    /// `--kube-annotation-prefix` not of the form `fqdn/[0-9a-z-_]*` (the prefix as completed).
    AnnotationPrefixFormat { prefix: String },
    /// An address annotation of this node that is not an address.
    AnnotationNotAnAddress { key: String, text: String },
    /// An address annotation of this node of the other family.
    AnnotationFamily { key: String, family: Family },
    /// This node's podCIDR is not inside its family's Network of net-conf.json.
    PodCidrOutsideNetwork { subnet: IpNet, network: IpNet },
    /// net-conf.json enables a family this node has no podCIDR of.
    NoPodCidrOf { family: Family, network: IpNet },
}

/// What makes the static cluster file unusable.
#[derive(Debug)]
pub enum StaticFileProblem {
    /// Not the JSON of a cluster.
    Parse(serde_json::Error),
    /// A subnet (of `what`: `Subnet` or `Peers`) that is not a subnet of its family's network.
    OutsideNetwork { what: &'static str, subnet: IpNet, network: IpNet },
    /// No subnet of a family the network enables.
    MissingFamily { what: &'static str, family: Family, network: IpNet },
    /// A subnet of a family the network does not enable.
    FamilyNotEnabled { what: &'static str, family: Family, subnet: IpNet },
    /// A VtepMAC that is not a MAC address.
    BadVtepMac(String),
}

/// What the store (etcd, the API server's Nodes) holds or lacks that fabricd cannot use.
#[derive(Debug)]
pub enum StoreError {
    /// No network config under the etcd prefix.
    NoConfig { prefix: String },
    /// Every subnet of the network is leased.
    OutOfSubnets { subnet_len: u8, network: IpNet },
    /// No lease of this node (at its address).
    NoOwnLease(IpAddr),
    /// No lease at the subnet (the in-memory store of the tests).
    #[cfg(test)]
    NoLeaseAt(crate::flannel::SubnetKey),
    /// No Node of this name in the API server.
    NoNode(String),
    /// This node's pod has no `spec.nodeName`.
    PodWithoutNode { namespace: String, pod: String },
    /// This node's own Node has podCIDRs fabricd cannot read.
    OwnPodCidrs { name: String, problem: PodCidrsProblem },
    /// The watch of Nodes ended (the runtime shutting down).
    WatchEnded,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use ConfigError as C;
        match self {
            C::NotAnAddress { flag, text } => write!(f, "{flag} {text:?} is not an address"),
            C::Unsupported { flag, why } => write!(f, "--{flag} is not supported: {why}"),
            C::IfaceRegex { text, error } => write!(f, "--iface-regex {text:?}: {error}"),
            C::AcquireWithoutPublicIp => f.write_str("acquire needs --public-ip"),
            C::AcquireWithoutEtcd => f.write_str("acquire needs etcd"),
            C::EtcdCertWithoutKey => f.write_str("--etcd-certfile and --etcd-keyfile go together"),
            C::NoPublicAddressOf { family, network } => {
                let v6 = if *family == Family::V6 { "v6" } else { "" };
                write!(
                    f,
                    "the cluster enables {family} ({network}) but this node has no public {family} address \
                     (--iface, --public-ip{v6})"
                )
            }
            C::NoPublicAddress => f.write_str("the node has no public address"),
            C::NoPublicAddressOfCluster => f.write_str("the node has no public address of the cluster's family"),
            C::StaticFile { path, problem } => write!(f, "static config {}: {problem}", path.display()),
            C::Variable { name, value, error } => write!(f, "env {name}={value} format error: {error} (an integer)"),
            C::NoNodeName => f.write_str("env variables POD_NAME and POD_NAMESPACE must be set (or NODE_NAME)"),
            C::KubeClient { what, error } => write!(f, "{what}: {error}"),
            C::AnnotationPrefixSlashes => f.write_str("--kube-annotation-prefix: at most one slash"),
            C::AnnotationPrefixFormat { prefix } => write!(
                f,
                "--kube-annotation-prefix {prefix:?}: must be in the format fqdn/[0-9a-z-_]* (flanneld's rule)"
            ),
            C::AnnotationNotAnAddress { key, text } => write!(f, "annotation {key}: {text:?} is not an address"),
            C::AnnotationFamily { key, family } => write!(f, "annotation {key}: not an {family} address"),
            C::PodCidrOutsideNetwork { subnet, network } => {
                write!(f, "the node's podCIDR {subnet} is not inside the Network {network} of net-conf.json")
            }
            C::NoPodCidrOf { family, network } => {
                write!(f, "net-conf.json enables {family} ({network}) but the node has no {family} podCIDR")
            }
        }
    }
}

impl fmt::Display for StaticFileProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use StaticFileProblem as P;
        match self {
            P::Parse(error) => write!(f, "{error}"),
            P::OutsideNetwork { what, subnet, network } => {
                write!(f, "{what}: subnet {subnet} is not a subnet of {network}")
            }
            P::MissingFamily { what, family, network } => {
                write!(f, "{what}: no {family} subnet (the network has {network})")
            }
            P::FamilyNotEnabled { what, family, subnet } => write!(f, "{what}: {subnet}, but {family} is not enabled"),
            P::BadVtepMac(text) => write!(f, "bad VtepMAC {text:?}"),
        }
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use StoreError as S;
        match self {
            S::NoConfig { prefix } => write!(
                f,
                "no network config at {prefix}/config (etcdctl put {prefix}/config \
                 '{{\"Network\":\"10.244.0.0/16\",\"Backend\":{{\"Type\":\"vxlan\"}}}}')"
            ),
            S::OutOfSubnets { subnet_len, network } => {
                write!(f, "out of subnets: every /{subnet_len} of {network} is leased")
            }
            S::NoOwnLease(address) => write!(f, "no lease in the store for this node ({address})"),
            #[cfg(test)]
            S::NoLeaseAt(subnet) => write!(f, "no lease at {subnet}"),
            S::NoNode(name) => write!(f, "no Node {name:?} in the API server"),
            S::PodWithoutNode { namespace, pod } => {
                write!(f, "node name not present in pod spec '{namespace}/{pod}'")
            }
            S::OwnPodCidrs { name, problem } => write!(f, "Node {name:?}: podCIDRs: {problem}"),
            S::WatchEnded => f.write_str("the watch of Nodes ended"),
        }
    }
}

/// The client's message and each cause's own, once (the transport error's causes carry the reason: connection
/// refused, a certificate refused, ...).
/// An error and its causes, each once: "a: b: c".
fn describe_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut cause = Some(error);
    while let Some(current) = cause {
        let text = current.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        cause = current.source();
    }
    parts.join(": ")
}

fn describe(error: &etcd_client::Error) -> String {
    let mut text = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(inner) = source {
        let inner_text = inner.to_string();
        if !text.contains(&inner_text) {
            text.push_str(": ");
            text.push_str(&inner_text);
        }
        source = inner.source();
    }
    text
}

/// What is wrong with a Node's podCIDRs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodCidrsProblem {
    /// More than two.
    TooMany(usize),
    /// One that does not parse.
    NotACidr(String),
}

impl fmt::Display for PodCidrsProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PodCidrsProblem::TooMany(count) => write!(f, "{count} podCIDRs (IPv4, IPv6 or one of each)"),
            PodCidrsProblem::NotACidr(text) => write!(f, "{text:?} is not a CIDR"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etcd_errors_are_classified_by_their_causes() {
        let refused = etcd_client::Error::IoError(io::Error::from(io::ErrorKind::ConnectionRefused));
        assert_eq!(EtcdErrorKind::of(&refused), EtcdErrorKind::Unreachable);
        let reset = etcd_client::Error::IoError(io::Error::from(io::ErrorKind::ConnectionReset));
        assert_eq!(EtcdErrorKind::of(&reset), EtcdErrorKind::Closed);
        let status = etcd_client::Error::GRpcStatus(tonic::Status::not_found("requested lease not found"));
        assert_eq!(EtcdErrorKind::of(&status), EtcdErrorKind::Refused);
        let unavailable = etcd_client::Error::GRpcStatus(tonic::Status::unavailable("gone"));
        assert_eq!(EtcdErrorKind::of(&unavailable), EtcdErrorKind::Closed);
        let watch = etcd_client::Error::WatchError("canceled".into());
        assert_eq!(EtcdErrorKind::of(&watch), EtcdErrorKind::Watch);
        let error = Error::etcd("reading the leases", refused);
        assert_eq!(error.etcd_kind(), Some(EtcdErrorKind::Unreachable));
        assert!(error.to_string().starts_with("reading the leases: "), "{error}");
    }

    #[test]
    fn cnicore_errors_are_printed_whole() {
        let mut source = cnicore::spec::Error::new(11, "iptables-restore failed");
        source.details = "line 3: bad rule".into();
        let error = Error::cni("masquerade", source);
        assert_eq!(error.to_string(), "masquerade: iptables-restore failed; line 3: bad rule");
    }
}
