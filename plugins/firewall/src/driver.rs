//! The three backends behind one interface (as netavark's `FirewallDriver`): a [`Driver`] opens, closes and
//! checks an attachment; a [`KernelDriver`] (iptables, nftables) also holds a bridge's isolation rules on their
//! own, which is where the firewalld backend keeps them (firewalld makes none; the reference runs iptables).

use std::collections::BTreeSet;

use cnicore::firewall::Backend as Kernel;
use cnicore::spec::{codes, Error, Result};
use ipnet::IpNet;

use crate::config::{Config, Isolation};
use crate::firewalld::Firewalld;
use crate::iptables::Iptables;
use crate::nftables::Nftables;

/// A backend, as a config's `backend` and an attachment record name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Iptables,
    Nftables,
    Firewalld,
}

impl Backend {
    /// The one parse of a backend's name (a config's `backend`, a record's); `None` for any other text.
    pub fn parse(name: &str) -> Option<Backend> {
        match name {
            "iptables" => Some(Backend::Iptables),
            "nftables" => Some(Backend::Nftables),
            "firewalld" => Some(Backend::Firewalld),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Backend::Iptables => "iptables",
            Backend::Nftables => "nftables",
            Backend::Firewalld => "firewalld",
        }
    }

    /// The kernel backend that holds this backend's isolation rules: its own, for firewalld the machine's
    /// default (iptables as in the reference, nftables where iptables is not installed).
    pub fn isolation_kernel(self) -> Result<Kernel> {
        match self {
            Backend::Iptables => Ok(Kernel::Iptables),
            Backend::Nftables => Ok(Kernel::Nftables),
            Backend::Firewalld => Kernel::detect(),
        }
    }
}

impl From<Kernel> for Backend {
    fn from(kernel: Kernel) -> Backend {
        match kernel {
            Kernel::Iptables => Backend::Iptables,
            Kernel::Nftables => Backend::Nftables,
        }
    }
}

/// What every backend does for an attachment.
pub trait Driver {
    fn backend(&self) -> Backend;

    /// Opens the firewall for `ips`, with the bridge's isolation rules; on failure, what was done is undone.
    fn open(&mut self, config: &Config, ips: &[IpNet], isolation: Option<&Isolation>) -> Result<()>;

    /// Closes the firewall for `ips` (none: what the attachment's tags find, where the backend has them), and
    /// with `drop_of` removes that bridge's `isolated` drop in the same transaction. The other isolation rules
    /// stay: they are the bridge's, shared by its containers (as in the reference). Rules already gone are fine.
    fn close(&mut self, config: &Config, ips: &[IpNet], drop_of: Option<&str>) -> Result<()>;

    /// Fails unless everything [`Driver::open`] made for `ips` and the isolation is there.
    fn check(&mut self, config: &Config, ips: &[IpNet], isolation: Option<&Isolation>) -> Result<()>;

    /// STATUS: an error when the backend's programs are not installed.
    fn status(&self) -> Result<()> {
        Ok(())
    }
}

/// What a kernel backend does besides: a bridge's isolation rules without any address (the firewalld
/// backend's), and the state that only it keeps.
pub trait KernelDriver: Driver {
    /// Adds the bridge's isolation rules alone, in the families of `ips`.
    fn isolate(&self, config: &Config, ips: &[IpNet], isolation: &Isolation) -> Result<()>;

    /// Fails unless the bridge's isolation rules are there, in the families of `ips`.
    fn check_isolation(&self, config: &Config, ips: &[IpNet], isolation: &Isolation) -> Result<()>;

    /// Removes a bridge's `isolated` drop (every copy), in the families of `ips` (those the ADD made it in);
    /// the same-bridge rules stay.
    fn remove_drop(&self, bridge: &str, ips: &[IpNet]) -> Result<()>;

    /// GC of what the backend tags with its owner: the attachments of `network` whose container is not in
    /// `valid`.
    fn gc(&self, _network: &str, _valid: &BTreeSet<&str>) -> Result<()> {
        Ok(())
    }
}

/// STATUS of a kernel backend: its programs are installed.
pub fn kernel_status(kernel: Kernel) -> Result<()> {
    if kernel.available() {
        Ok(())
    } else {
        Err(Error::new(codes::NOT_AVAILABLE, format!("the {kernel} backend is not installed")))
    }
}

/// The driver of a kernel backend.
pub fn kernel(kernel: Kernel) -> Box<dyn KernelDriver> {
    match kernel {
        Kernel::Iptables => Box::new(Iptables),
        Kernel::Nftables => Box::new(Nftables),
    }
}

/// The driver of the config's backend: an explicit one (firewalld must be running), else firewalld when it
/// runs, else the machine's default kernel backend.
pub fn resolve(config: &Config) -> Result<Box<dyn Driver>> {
    match config.backend {
        Some(Backend::Firewalld) => Ok(Box::new(Firewalld::require()?)),
        Some(Backend::Iptables) => Ok(kernel(Kernel::Iptables)),
        Some(Backend::Nftables) => Ok(kernel(Kernel::Nftables)),
        None => match Firewalld::if_running() {
            Some(firewalld) => Ok(Box::new(firewalld)),
            None => Kernel::detect().map(|k| kernel(k) as Box<dyn Driver>),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_back() {
        for backend in [Backend::Iptables, Backend::Nftables, Backend::Firewalld] {
            assert_eq!(Backend::parse(backend.as_str()), Some(backend));
        }
        assert_eq!(Backend::parse(""), None);
        assert_eq!(Backend::parse("Iptables"), None);
        assert_eq!(Backend::from(Kernel::Nftables), Backend::Nftables);
    }
}
