//! Waiting for IPv6 duplicate address detection to finish on a link, woken by address events.

use std::io;
use std::net::IpAddr;
use std::time::Duration;

use super::Netlink;

impl Netlink {
    /// Waits until no IPv6 address of link `index` is tentative any more. Fails with
    /// `ErrorKind::AddrInUse` when DAD found an address in use, and `ErrorKind::TimedOut` after `timeout`.
    ///
    /// An address stays tentative until the kernel's DAD work has run for it, which is also when the link
    /// joins the address's solicited-node multicast group: before that, neighbour solicitations for the address
    /// are dropped. With `accept_dad` 0 this takes microseconds, with DAD about a second.
    pub fn wait_dad_settled(&mut self, index: u32, timeout: Duration) -> io::Result<()> {
        self.wait_settled(index, None, timeout)
    }

    /// Like [`Netlink::wait_dad_settled`] for one address of the link (which must be there).
    pub fn wait_address_settled(&mut self, index: u32, addr: IpAddr, timeout: Duration) -> io::Result<()> {
        self.wait_settled(index, Some(addr), timeout)
    }

    fn wait_settled(&mut self, index: u32, only: Option<IpAddr>, timeout: Duration) -> io::Result<()> {
        let what = || format!("IPv6 addresses of link {index} still tentative");
        self.wait_until(&[libc::RTNLGRP_IPV6_IFADDR], timeout, what, |nl| {
            let addresses = nl.addresses(Some(index))?;
            let watched: Vec<_> = addresses
                .iter()
                .filter(|a| a.addr.addr().is_ipv6() && only.is_none_or(|ip| a.addr.addr() == ip))
                .collect();
            if let Some(failed) = watched.iter().find(|a| a.is_dad_failed()) {
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!("duplicate address detection failed for {}: the address is in use", failed.addr),
                ));
            }
            if let Some(ip) = only.filter(|_| watched.is_empty()) {
                return Err(io::Error::new(io::ErrorKind::NotFound, format!("address {ip} is not on link {index}")));
            }
            Ok((!watched.iter().any(|a| a.is_tentative())).then_some(()))
        })
    }
}
