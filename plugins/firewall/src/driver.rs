//! The three backends behind one interface (as netavark's `FirewallDriver`): a [`Driver`] opens, closes and
//! checks an attachment; a [`KernelDriver`] (iptables, nftables) also holds a bridge's isolation rules on their
//! own, which is where the firewalld backend keeps them (firewalld makes none; the reference runs iptables).

use std::collections::BTreeSet;

use cnicore::firewall::Backend as Kernel;
use cnicore::spec::{codes, Error, Result};
use ipnet::IpNet;

use crate::config::{Backend, Config, Isolation};

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
