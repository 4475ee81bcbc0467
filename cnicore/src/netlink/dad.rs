//! Waiting for IPv6 duplicate address detection to finish on a link, woken by address events.

use std::io;
use std::net::IpAddr;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

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
        let deadline = Instant::now() + timeout;
        // Subscribe before looking, so that no change between the look and the wait is missed.
        let events = self.subscribe(&[libc::RTNLGRP_IPV6_IFADDR])?;
        loop {
            let addresses = self.addresses(Some(index))?;
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
            if !watched.iter().any(|a| a.is_tentative()) {
                return Ok(());
            }
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() || !poll_readable(events.as_raw_fd(), remaining)? {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("IPv6 addresses of link {index} still tentative after {timeout:?}"),
                ));
            }
            // The event only wakes us up; the addresses are looked at again above.
            match events.recv_from_full() {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {}
                Err(e) => return Err(e),
            }
        }
    }
}

/// Waits up to `timeout` for `fd` to become readable; false on timeout.
fn poll_readable(fd: i32, timeout: Duration) -> io::Result<bool> {
    let mut pollfd = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    let millis = timeout.as_millis().saturating_add(1).min(i32::MAX as u128) as i32;
    loop {
        // SAFETY: one valid pollfd for the duration of the call.
        let ready = unsafe { libc::poll(&mut pollfd, 1, millis) };
        if ready >= 0 {
            return Ok(ready > 0);
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}
