//! The CNI error object: `{cniVersion, code, msg, details}` on stdout, non-zero exit ([`Error`], with the
//! spec's codes as constructors), and what plugins report beside it: [`Errors`] (the failures of a DEL or GC
//! that goes on after one, reported together), [`warn`] and [`report_rollback`] (stderr, as the reference's
//! plugins log), [`io_error`] (a file's io error, code 5) and [`ErrorContext`] (an OS or netlink call's,
//! code 999), each with what was being done.

use serde::Serialize;
use std::fmt;

/// Error codes reserved by the specification (0–99).
pub mod codes {
    pub const INCOMPATIBLE_VERSION: u32 = 1;
    pub const UNSUPPORTED_FIELD: u32 = 2;
    pub const UNKNOWN_CONTAINER: u32 = 3;
    pub const INVALID_ENV: u32 = 4;
    pub const IO: u32 = 5;
    pub const DECODE: u32 = 6;
    pub const INVALID_CONFIG: u32 = 7;
    pub const TRY_AGAIN: u32 = 11;
    pub const NOT_AVAILABLE: u32 = 50;
    pub const LIMITED_CONNECTIVITY: u32 = 51;
    /// Plugin-specific failures (the reference plugins use 999 for "internal" errors).
    pub const INTERNAL: u32 = 999;
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Error {
    pub code: u32,
    pub msg: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub details: String,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn new(code: u32, msg: impl Into<String>) -> Self {
        Error { code, msg: msg.into(), details: String::new() }
    }
    pub fn with_details(mut self, details: impl Into<String>) -> Self {
        self.details = details.into();
        self
    }
    pub fn config(msg: impl Into<String>) -> Self {
        Error::new(codes::INVALID_CONFIG, msg)
    }
    pub fn env(msg: impl Into<String>) -> Self {
        Error::new(codes::INVALID_ENV, msg)
    }
    pub fn decode(msg: impl Into<String>) -> Self {
        Error::new(codes::DECODE, msg)
    }
    pub fn io(msg: impl Into<String>) -> Self {
        Error::new(codes::IO, msg)
    }
    pub fn internal(msg: impl Into<String>) -> Self {
        Error::new(codes::INTERNAL, msg)
    }
    /// The same error, its message prefixed with what was being done: `"<what>: <msg>"`.
    pub fn within(self, what: impl fmt::Display) -> Self {
        Error { msg: format!("{what}: {}", self.msg), ..self }
    }
    /// Wraps an OS error with what was being done: `"<what>: <error>"`.
    pub fn os(what: impl fmt::Display, err: impl fmt::Display) -> Self {
        Error::new(codes::INTERNAL, format!("{what}: {err}"))
    }

    /// The JSON object printed on stdout, in the given spec version.
    pub fn to_json(&self, cni_version: &str) -> serde_json::Value {
        let mut v = serde_json::json!({ "cniVersion": cni_version, "code": self.code, "msg": self.msg });
        if !self.details.is_empty() {
            v["details"] = self.details.clone().into();
        }
        v
    }

    /// Parses a plugin's error object (as a runner reads it from a delegated plugin's stdout).
    pub fn from_json(v: &serde_json::Value) -> Option<Self> {
        let code = v.get("code")?.as_u64()?;
        Some(Error {
            code: u32::try_from(code).unwrap_or(codes::INTERNAL),
            msg: v.get("msg").and_then(|m| m.as_str()).unwrap_or("").to_string(),
            details: v.get("details").and_then(|m| m.as_str()).unwrap_or("").to_string(),
        })
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.msg)?;
        if !self.details.is_empty() {
            write!(f, "; {}", self.details)?;
        }
        Ok(())
    }
}

impl std::error::Error for Error {}

/// A failed file or process I/O as an IO error (code 5, what the reference plugins return for a file they cannot
/// read or write), with what was being done: for `map_err`, e.g. `.map_err(io_error("reading the lease index"))`.
/// [`ErrorContext::context`] is for OS and netlink calls (code 999).
pub fn io_error(what: impl fmt::Display) -> impl FnOnce(std::io::Error) -> Error {
    move |e| Error::io(format!("{what}: {e}"))
}

/// Adds what was being done to a failed OS or netlink call, making it a CNI error (code 999, "internal", as
/// the reference plugins report such failures): `"<what>: <error>"`.
pub trait ErrorContext<T> {
    fn context(self, what: impl fmt::Display) -> Result<T>;
    /// [`ErrorContext::context`] with a message built only on failure.
    fn with_context<D: fmt::Display>(self, what: impl FnOnce() -> D) -> Result<T>;
}

impl<T> ErrorContext<T> for std::result::Result<T, std::io::Error> {
    fn context(self, what: impl fmt::Display) -> Result<T> {
        self.map_err(|e| Error::os(what, e))
    }
    fn with_context<D: fmt::Display>(self, what: impl FnOnce() -> D) -> Result<T> {
        self.map_err(|e| Error::os(what(), e))
    }
}

/// "Do every step, report every failure": for teardown paths (DEL, GC, rollback) where one failed step must
/// not stop the others. The result keeps the first error's code and message; the messages of the others
/// follow in `details`.
#[derive(Debug, Default)]
pub struct Errors(Vec<Error>);

impl Errors {
    pub fn new() -> Errors {
        Errors::default()
    }

    pub fn push(&mut self, error: Error) {
        self.0.push(error);
    }

    /// Keeps the error of a step, if any, and hands back its value.
    pub fn record<T>(&mut self, outcome: Result<T>) -> Option<T> {
        outcome.map_err(|e| self.push(e)).ok()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn into_result(self) -> Result<()> {
        let mut errors = self.0.into_iter();
        let Some(first) = errors.next() else { return Ok(()) };
        let details: Vec<String> = std::iter::once(first.details.clone())
            .filter(|d| !d.is_empty())
            .chain(errors.map(|e| e.to_string()))
            .collect();
        Err(Error { details: details.join("; "), ..first })
    }
}

impl Extend<Error> for Errors {
    fn extend<I: IntoIterator<Item = Error>>(&mut self, iter: I) {
        self.0.extend(iter);
    }
}

/// The name this process was run as (`bridge`, `portmap`, ...), for messages on stderr.
pub fn program_name() -> &'static str {
    static NAME: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    NAME.get_or_init(|| {
        std::env::args_os()
            .next()
            .and_then(|a| std::path::Path::new(&a).file_name().map(|n| n.to_string_lossy().into_owned()))
            .unwrap_or_else(|| "cni".to_string())
    })
}

/// Writes a warning to stderr, prefixed with the program's name; see [`crate::warn!`].
pub fn warn(args: fmt::Arguments) {
    eprintln!("{}: {args}", program_name());
}

/// A warning on stderr, prefixed with the plugin's name: what a plugin tolerated or could not undo. Runtimes
/// log a plugin's stderr; stdout is reserved for the result.
#[macro_export]
macro_rules! warn {
    ($($arg:tt)*) => {
        $crate::spec::warn(format_args!($($arg)*))
    };
}

/// Reports a rollback step that failed: the ADD's own error is what the caller returns, so this one is logged.
pub fn report_rollback(what: impl fmt::Display, outcome: Result<()>) {
    if let Err(e) = outcome {
        warn(format_args!("rollback: {what}: {e}"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn context_makes_internal_errors() {
        let failed: std::io::Result<()> = Err(std::io::Error::from_raw_os_error(libc::ENOENT));
        let e = failed.context("deleting eth0").unwrap_err();
        assert_eq!(e.code, codes::INTERNAL);
        assert!(e.msg.starts_with("deleting eth0: No such file"), "{}", e.msg);
        let ok: std::io::Result<u8> = Ok(1);
        assert_eq!(ok.with_context(|| -> String { unreachable!() }).unwrap(), 1);
    }

    #[test]
    fn errors_keep_the_first_code_and_every_message() {
        assert!(Errors::new().into_result().is_ok());
        let mut errors = Errors::new();
        assert_eq!(errors.record(Ok::<_, Error>(5)), Some(5));
        errors.push(Error::new(codes::IO, "first").with_details("why"));
        errors.record::<()>(Err(Error::internal("second")));
        let e = errors.into_result().unwrap_err();
        assert_eq!((e.code, e.msg.as_str(), e.details.as_str()), (codes::IO, "first", "why; second"));
    }
}
