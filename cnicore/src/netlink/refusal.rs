//! What the kernel said when it refused a request: its errno by name and, where it gave one, its own reason
//! (the extended ACK message, e.g. "VLAN device already exists"), so that a plugin's error names what was
//! refused rather than only "Invalid argument (os error 22)".
//!
//! The errno stays the `io::Error`'s raw OS error (callers test it, see [`super::is_exists`]); the reason is
//! kept per thread by the reply parser ([`super::wire::split_datagram`]) for the last refusal it saw, and read
//! with [`reason`] right after the failed call.

use std::cell::RefCell;
use std::io;

/// `NLMSGERR_ATTR_MSG`: the extended ACK's message (a NUL-terminated string).
const NLMSGERR_ATTR_MSG: u16 = 1;
/// `NLM_F_CAPPED`: the error message echoes only the request's header.
const NLM_F_CAPPED: u16 = 0x100;
/// `NLM_F_ACK_TLVS`: extended ACK attributes follow the echoed request.
const NLM_F_ACK_TLVS: u16 = 0x200;

thread_local! {
    static REASON: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// The kernel's own reason for the last refusal this thread received, if it gave one.
pub fn reason() -> Option<String> {
    REASON.with(|r| r.borrow().clone())
}

/// Records the reason of an `NLMSG_ERROR` with a negative errno: `payload` is the error message's (errno,
/// echoed request, attributes), `flags` its header's.
pub(crate) fn record(flags: u16, payload: &[u8]) {
    REASON.with(|r| *r.borrow_mut() = extended_ack_message(flags, payload));
}

fn extended_ack_message(flags: u16, payload: &[u8]) -> Option<String> {
    if flags & NLM_F_ACK_TLVS == 0 {
        return None;
    }
    let echoed = payload.get(4..)?;
    let echoed_len = u32::from_ne_bytes(echoed.get(..4)?.try_into().ok()?) as usize;
    let skip = if flags & NLM_F_CAPPED != 0 { super::wire::NLMSG_HDRLEN } else { super::wire::align(echoed_len) };
    let mut attrs = echoed.get(skip..)?;
    while attrs.len() >= 4 {
        let len = u16::from_ne_bytes([attrs[0], attrs[1]]) as usize;
        let kind = u16::from_ne_bytes([attrs[2], attrs[3]]) & 0x3fff;
        let value = attrs.get(4..len.max(4))?;
        if kind == NLMSGERR_ATTR_MSG {
            let text = value.split(|&b| b == 0).next().unwrap_or_default();
            let text = String::from_utf8_lossy(text).trim().to_string();
            return (!text.is_empty()).then_some(text);
        }
        attrs = attrs.get(super::wire::align(len.max(4)).min(attrs.len())..)?;
    }
    None
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

    fn error_payload(flags_capped: bool, message: &str) -> Vec<u8> {
        let mut payload = (-libc::EEXIST).to_ne_bytes().to_vec();
        let echoed_len: u32 = if flags_capped { 16 } else { 24 };
        payload.extend_from_slice(&echoed_len.to_ne_bytes());
        payload.extend_from_slice(&[0; 12]);
        if !flags_capped {
            payload.extend_from_slice(&[7; 8]);
        }
        let text = [message.as_bytes(), &[0]].concat();
        payload.extend_from_slice(&((4 + text.len()) as u16).to_ne_bytes());
        payload.extend_from_slice(&NLMSGERR_ATTR_MSG.to_ne_bytes());
        payload.extend_from_slice(&text);
        payload.resize(super::super::wire::align(payload.len()), 0);
        payload
    }

    #[test]
    fn reads_the_extended_ack_message_capped_or_not() {
        let capped = error_payload(true, "VLAN device already exists");
        let message = extended_ack_message(NLM_F_ACK_TLVS | NLM_F_CAPPED, &capped);
        assert_eq!(message.as_deref(), Some("VLAN device already exists"));
        let full = error_payload(false, "Unknown device type");
        assert_eq!(extended_ack_message(NLM_F_ACK_TLVS, &full).as_deref(), Some("Unknown device type"));
        assert_eq!(extended_ack_message(0, &full), None);
        assert_eq!(extended_ack_message(NLM_F_ACK_TLVS, &full[..10]), None);
    }

    #[test]
    fn describes_errno_and_reason() {
        record(0, &[]);
        assert_eq!(describe(&io::Error::from_raw_os_error(libc::EBUSY)), "EBUSY (Device or resource busy)");
        record(NLM_F_ACK_TLVS | NLM_F_CAPPED, &error_payload(true, "VLAN device already exists"));
        assert_eq!(
            describe(&io::Error::from_raw_os_error(libc::EEXIST)),
            "EEXIST (File exists): VLAN device already exists"
        );
        assert_eq!(errno_name(4242), "errno 4242");
    }
}
