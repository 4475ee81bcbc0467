//! fabricd's errors: what failed, classified by kind (the agent and the store decide by kind, never by the
//! text), printed whole (the cause's own message, a cnicore error with its details).

use std::fmt;
use std::io;

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
    /// The cluster's config, a flag or a file is not usable.
    Config(String),
    /// The network config in the store is not usable.
    Format(crate::flannel::FormatError),
    /// The store holds something fabricd cannot use (no config, no free subnet, no lease of this node).
    Store(String),
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
            Error::Config(text) | Error::Store(text) => f.write_str(text),
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
