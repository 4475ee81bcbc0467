//! The CNI error object: `{cniVersion, code, msg, details}` on stdout, non-zero exit.

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
