//! Kernel parameters under /proc/sys, e.g. "net/ipv4/ip_forward".
//!
//! Files are opened at each call, and /proc/sys/net resolves to the network namespace of the calling
//! thread, so inside [`crate::netns::NetNs::run`] the settings of that namespace are read and written.

use std::fs;
use std::io;
use std::path::{Component, Path, PathBuf};

const SYSCTL_ROOT: &str = "/proc/sys";

/// The file of sysctl `name` (slash form: "net/ipv4/ip_forward"), refusing names that could leave
/// /proc/sys (e.g. an interface name "..").
fn sysctl_path(name: &str) -> io::Result<PathBuf> {
    let relative = Path::new(name);
    let plain = !name.is_empty() && relative.components().all(|component| matches!(component, Component::Normal(_)));
    if !plain {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("invalid sysctl name {name:?}")));
    }
    Ok(Path::new(SYSCTL_ROOT).join(relative))
}

/// The slash form of a sysctl name written either way, as sysctl(8) and the reference plugins' `sysctl` package
/// read it: the first separator decides; in the dotted form dots and slashes swap, so that an interface name
/// with a dot is written with a slash (`net.ipv4.conf.eth0/100.rp_filter` is `net/ipv4/conf/eth0.100/rp_filter`).
pub fn slash_form(name: &str) -> String {
    match name.find(['.', '/']) {
        Some(at) if name.as_bytes()[at] == b'.' => name
            .chars()
            .map(|c| match c {
                '.' => '/',
                '/' => '.',
                c => c,
            })
            .collect(),
        _ => name.to_string(),
    }
}

/// The value of sysctl `name`, without the trailing newline.
pub fn read(name: &str) -> io::Result<String> {
    let path = sysctl_path(name)?;
    let value = fs::read_to_string(&path).map_err(|e| with_path(e, &path))?;
    Ok(value.trim_end_matches('\n').to_string())
}

/// Sets sysctl `name` to `value`.
pub fn write(name: &str, value: &str) -> io::Result<()> {
    let path = sysctl_path(name)?;
    fs::write(&path, value).map_err(|e| with_path(e, &path))
}

/// Sets sysctl `name` to `value` unless it already has that value; true if it was written.
pub fn write_if_different(name: &str, value: &str) -> io::Result<bool> {
    if read(name)?.trim() == value.trim() {
        return Ok(false);
    }
    write(name, value)?;
    Ok(true)
}

/// `net.bridge.bridge-nf-call-iptables=1` (and ip6tables), as kubenet and Docker set them, so that the
/// firewall sees bridged traffic between ports of one bridge. The files only exist with br_netfilter; without
/// it, or when the write fails, this is a warning: the plugin's own work is done either way.
pub fn enable_bridge_netfilter(v4: bool, v6: bool) {
    let names = [(v4, "net/bridge/bridge-nf-call-iptables"), (v6, "net/bridge/bridge-nf-call-ip6tables")];
    for (_, name) in names.iter().filter(|(wanted, _)| *wanted) {
        match write_if_different(name, "1") {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                crate::warn!("{name} does not exist (br_netfilter not loaded?); bridged traffic bypasses iptables");
            }
            Err(e) => crate::warn!("failed to set {name}=1: {e}"),
        }
    }
}

/// Names the file in the error while keeping its kind (NotFound for a missing interface directory).
fn with_path(err: io::Error, path: &Path) -> io::Error {
    io::Error::new(err.kind(), format!("{}: {err}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_leave_proc_sys_are_refused() {
        for name in ["", "/etc/passwd", "net/../../etc/passwd", "net/ipv4/conf/../x", "./net", "net//"] {
            let result = sysctl_path(name);
            if name == "net//" {
                // Repeated slashes collapse to plain components: harmless.
                assert!(result.is_ok());
                continue;
            }
            assert!(result.is_err(), "{name:?} accepted");
        }
        assert_eq!(sysctl_path("net/ipv4/ip_forward").ok(), Some(PathBuf::from("/proc/sys/net/ipv4/ip_forward")));
    }

    #[test]
    fn either_separator() {
        assert_eq!(slash_form("net.core.somaxconn"), "net/core/somaxconn");
        assert_eq!(slash_form("net.ipv4.conf.eth0/100.rp_filter"), "net/ipv4/conf/eth0.100/rp_filter");
        assert_eq!(slash_form("net/ipv4/conf/eth0.100/rp_filter"), "net/ipv4/conf/eth0.100/rp_filter");
        assert_eq!(slash_form("somaxconn"), "somaxconn");
    }

    #[test]
    fn reads_a_sysctl() {
        let value = read("net/core/somaxconn");
        assert!(value.is_ok_and(|v| v.parse::<u32>().is_ok()));
    }
}
