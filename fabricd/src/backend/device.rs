//! The steps every tunnel device shares: each says what differs and, unless in a dry run, fixes it (MTU, MAC,
//! the one address of the family, up).

use std::io;
use std::net::IpAddr;

use cnicore::netlink::{Link, Netlink};
use ipnet::IpNet;

use crate::dataplane::diff::{Change, DeviceChange};
use crate::family::Family;
use crate::underlay::{is_link_local, Underlay};

/// What a backend's `ensure_device` works with: one family's device for tunnels from `local`.
pub struct DeviceContext<'a> {
    pub nl: &'a mut Netlink,
    pub family: Family,
    /// This node's subnet of the family.
    pub subnet: IpNet,
    pub underlay: &'a Underlay,
    /// This node's public address of the family: the tunnels' local end.
    pub local: IpAddr,
    pub dry_run: bool,
    pub changes: &'a mut Vec<Change>,
}

impl DeviceContext<'_> {
    /// Records `change`; true when it is to be made (not a dry run).
    pub fn change(&mut self, change: DeviceChange) -> bool {
        self.changes.push(Change::Device(change));
        !self.dry_run
    }

    /// The MTU of `link` made `mtu`.
    pub fn mtu(&mut self, link: &Link, mtu: u32) -> io::Result<()> {
        if link.mtu != mtu && self.change(DeviceChange::Mtu { name: link.name.clone(), from: link.mtu, to: mtu }) {
            self.nl.set_mtu(link.index, mtu)?;
        }
        Ok(())
    }

    /// The MAC of `link` made `mac`.
    pub fn mac(&mut self, link: &Link, mac: [u8; 6]) -> io::Result<()> {
        if link.mac != Some(mac) && self.change(DeviceChange::Mac { name: link.name.clone(), mac }) {
            self.nl.set_mac(link.index, mac)?;
        }
        Ok(())
    }

    /// The subnet's network address (/32, /128) as the only address of the family on `link` (flannel's).
    pub fn subnet_address(&mut self, link: &Link) -> io::Result<()> {
        let family = self.family;
        let address = IpNet::new(self.subnet.network(), family.bits()).expect("valid");
        let addresses = self.nl.addresses(Some(link.index))?;
        // The kernel gives an IPv6 device its own link-local address: not ours to remove.
        let ours = |a: &IpNet| Family::of(a.addr()) == family && !is_link_local(a);
        for other in addresses.iter().filter(|a| ours(&a.addr) && a.addr != address) {
            if self.change(DeviceChange::RemoveAddress { name: link.name.clone(), address: other.addr }) {
                self.nl.del_address(link.index, other.addr)?;
            }
        }
        if !addresses.iter().any(|a| a.addr == address)
            && self.change(DeviceChange::Address { name: link.name.clone(), address })
        {
            self.nl.add_address(link.index, address)?;
        }
        Ok(())
    }

    /// `link` set up.
    pub fn up(&mut self, link: &Link) -> io::Result<()> {
        if !link.up && self.change(DeviceChange::Up { name: link.name.clone() }) {
            self.nl.set_up(link.index)?;
        }
        Ok(())
    }
}
