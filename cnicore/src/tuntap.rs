//! Persistent tun/tap devices made with the `/dev/net/tun` ioctls (what `ip tuntap add` does), in the network
//! namespace of the calling thread: the device belongs to the namespace `/dev/net/tun` was opened in, so run
//! [`create_tap`] inside the pod's namespace ([`crate::netns::NetNs::run`]).

use std::fs::OpenOptions;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;

const TUN_DEVICE: &str = "/dev/net/tun";

/// The `IFF_*` flags of a tap (`tun_flags` in sysfs).
pub const IFF_TAP: u16 = libc::IFF_TAP as u16;
pub const IFF_NO_PI: u16 = libc::IFF_NO_PI as u16;
pub const IFF_VNET_HDR: u16 = libc::IFF_VNET_HDR as u16;
pub const IFF_MULTI_QUEUE: u16 = libc::IFF_MULTI_QUEUE as u16;
/// Fail with EBUSY when a device of that name exists, instead of attaching to it.
const IFF_TUN_EXCL: u16 = libc::IFF_TUN_EXCL as u16;

/// What the tap is made with.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TapOptions {
    /// `IFF_*` flags besides `IFF_TAP` (`IFF_NO_PI`, `IFF_VNET_HDR`, `IFF_MULTI_QUEUE`).
    pub flags: u16,
    /// The user allowed to attach to the tap (`TUNSETOWNER`); anyone with `CAP_NET_ADMIN` when unset.
    pub owner: Option<u32>,
    /// The group allowed to attach to the tap (`TUNSETGROUP`).
    pub group: Option<u32>,
}

/// `struct ifreq` as TUNSETIFF reads it: the name, then the flags in the union.
#[repr(C)]
struct IfReq {
    name: [u8; libc::IFNAMSIZ],
    flags: u16,
    _pad: [u8; 22],
}

/// The request TUNSETIFF gets for `name` (an error when the name does not fit).
fn ifreq(name: &str, flags: u16) -> io::Result<IfReq> {
    let bytes = name.as_bytes();
    if bytes.is_empty() || bytes.len() >= libc::IFNAMSIZ || bytes.contains(&0) {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("invalid interface name {name:?}")));
    }
    let mut req = IfReq { name: [0; libc::IFNAMSIZ], flags: flags | IFF_TAP | IFF_TUN_EXCL, _pad: [0; 22] };
    req.name[..bytes.len()].copy_from_slice(bytes);
    Ok(req)
}

fn ioctl(fd: i32, request: libc::Ioctl, arg: libc::c_ulong, what: &str) -> io::Result<()> {
    // SAFETY: the tun ioctls used here take an integer argument, passed by value.
    if unsafe { libc::ioctl(fd, request, arg) } < 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(e.kind(), format!("{what}: {e}")));
    }
    Ok(())
}

/// Creates the persistent tap `name` in the calling thread's network namespace, owned as `options` say. It
/// outlives this process (`TUNSETPERSIST`) and is removed by deleting the link. A device already called `name`
/// is an error (EBUSY), never attached to.
pub fn create_tap(name: &str, options: TapOptions) -> io::Result<()> {
    let mut req = ifreq(name, options.flags)?;
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(TUN_DEVICE)
        .map_err(|e| io::Error::new(e.kind(), format!("{TUN_DEVICE}: {e} (is the tun module loaded?)")))?;
    let fd = file.as_raw_fd();
    // SAFETY: TUNSETIFF reads and writes a `struct ifreq`, which `req` is laid out as (40 bytes).
    if unsafe { libc::ioctl(fd, libc::TUNSETIFF, &mut req as *mut IfReq) } < 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(e.kind(), format!("TUNSETIFF {name:?}: {e}")));
    }
    // From here the device exists, and vanishes with the file unless made persistent: set the owner first, so
    // that a failure leaves nothing behind.
    if let Some(uid) = options.owner {
        ioctl(fd, libc::TUNSETOWNER, uid.into(), "TUNSETOWNER")?;
    }
    if let Some(gid) = options.group {
        ioctl(fd, libc::TUNSETGROUP, gid.into(), "TUNSETGROUP")?;
    }
    ioctl(fd, libc::TUNSETPERSIST, 1, "TUNSETPERSIST")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ifreq_layout() {
        assert_eq!(std::mem::size_of::<IfReq>(), 40);
        let req = ifreq("tap0", IFF_NO_PI | IFF_MULTI_QUEUE).unwrap();
        assert_eq!(&req.name[..5], b"tap0\0");
        assert_eq!(req.flags, 0x0002 | 0x1000 | 0x0100 | 0x8000);
        assert!(ifreq("", 0).is_err());
        assert!(ifreq("a-name-too-long!", 0).is_err());
        assert!(ifreq("a\0b", 0).is_err());
    }
}
