//! What the kernel said when it refused a request: its errno by name and, where it gave one, its own reason
//! (the extended ACK message, e.g. "VLAN device already exists"), so that a plugin's error names what was
//! refused rather than only "Invalid argument (os error 22)".
//!
//! The errno stays the `io::Error`'s raw OS error (callers test it, see [`super::is_exists`]); the reason is
//! kept per thread by the reply parser (`wire::split_datagram`) for the last refusal it saw, and read
//! with [`reason`] right after the failed call.

use std::cell::RefCell;
use std::io;

thread_local! {
    static REASON: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// The kernel's own reason for the last refusal this thread received, if it gave one.
pub fn reason() -> Option<String> {
    REASON.with(|r| r.borrow().clone())
}

/// Records the kernel's reason (the extended ACK's message, [`super::wire`] reads it) of a refusal.
pub(crate) fn record(reason: Option<String>) {
    REASON.with(|r| *r.borrow_mut() = reason);
}

/// The symbolic name of an errno the kernel answers link, address and route requests with.
pub fn errno_name(errno: i32) -> String {
    let name = match errno {
        libc::EPERM => "EPERM",
        libc::ENOENT => "ENOENT",
        libc::ENOMEM => "ENOMEM",
        libc::EBUSY => "EBUSY",
        libc::EEXIST => "EEXIST",
        libc::ENODEV => "ENODEV",
        libc::EINVAL => "EINVAL",
        libc::ENOSPC => "ENOSPC",
        libc::ERANGE => "ERANGE",
        libc::EMSGSIZE => "EMSGSIZE",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        libc::EADDRINUSE => "EADDRINUSE",
        libc::EADDRNOTAVAIL => "EADDRNOTAVAIL",
        libc::ENETUNREACH => "ENETUNREACH",
        libc::ENOBUFS => "ENOBUFS",
        other => return format!("errno {other}"),
    };
    name.to_string()
}

/// "EBUSY (Device or resource busy)", with ": <the kernel's reason>" when it gave one; the error as it is
/// when it carries no errno.
pub fn describe(e: &io::Error) -> String {
    let Some(errno) = e.raw_os_error() else { return e.to_string() };
    let text = io::Error::from_raw_os_error(errno).to_string();
    let text = text.split(" (os error").next().unwrap_or_default();
    match reason() {
        Some(reason) => format!("{} ({text}): {reason}", errno_name(errno)),
        None => format!("{} ({text})", errno_name(errno)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn describes_errno_and_reason() {
        record(None);
        assert_eq!(describe(&io::Error::from_raw_os_error(libc::EBUSY)), "EBUSY (Device or resource busy)");
        record(Some("VLAN device already exists".into()));
        assert_eq!(
            describe(&io::Error::from_raw_os_error(libc::EEXIST)),
            "EEXIST (File exists): VLAN device already exists"
        );
        assert_eq!(errno_name(4242), "errno 4242");
    }
}
