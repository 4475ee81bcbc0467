//! Spec versions and what each allows.

use super::error::{codes, Error, Result};

/// Every version this suite speaks, oldest first (reported by VERSION).
pub const SUPPORTED_VERSIONS: &[&str] = &["0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];

/// A parsed `major.minor.patch` spec version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version(pub u16, pub u16, pub u16);

impl Version {
    pub const V010: Version = Version(0, 1, 0);
    pub const V020: Version = Version(0, 2, 0);
    pub const V030: Version = Version(0, 3, 0);
    pub const V031: Version = Version(0, 3, 1);
    pub const V040: Version = Version(0, 4, 0);
    pub const V100: Version = Version(1, 0, 0);
    pub const V110: Version = Version(1, 1, 0);
    pub const LATEST: Version = Version::V110;

    /// Parses "X.Y.Z"; an empty string means 0.1.0, as libcni treats a config without `cniVersion`.
    pub fn parse(s: &str) -> Result<Version> {
        if s.is_empty() {
            return Ok(Version::V010);
        }
        // The version comes from the config: quoted shortened, so that a hostile one cannot flood the message.
        let bad = || {
            Error::new(
                codes::DECODE,
                format!("invalid version {:?}: expected major.minor.patch", super::env::truncate(s)),
            )
        };
        let mut parts = s.split('.');
        let mut next = || -> Result<u16> {
            let p = parts.next().ok_or_else(bad)?;
            if p.is_empty() || p.len() > 5 || !p.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad());
            }
            p.parse().map_err(|_| bad())
        };
        let v = Version(next()?, next()?, next()?);
        if parts.next().is_some() {
            return Err(bad());
        }
        Ok(v)
    }

    /// Parses a version and requires it to be one this suite speaks (error code 1 otherwise).
    pub fn parse_supported(s: &str) -> Result<Version> {
        let v = Version::parse(s)?;
        if !SUPPORTED_VERSIONS.contains(&v.to_string().as_str()) {
            return Err(Error::new(
                codes::INCOMPATIBLE_VERSION,
                format!("incompatible CNI versions; config is {s:?}, plugin supports {SUPPORTED_VERSIONS:?}"),
            ));
        }
        Ok(v)
    }

    /// Results of 0.1.0/0.2.0 have the legacy `ip4`/`ip6` shape.
    pub fn legacy_result(self) -> bool {
        self < Version::V030
    }
    pub fn allows_check(self) -> bool {
        self >= Version::V040
    }
    pub fn allows_gc_and_status(self) -> bool {
        self >= Version::V110
    }
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.0, self.1, self.2)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_orders() {
        assert_eq!(Version::parse("0.3.1").unwrap(), Version::V031);
        assert_eq!(Version::parse("").unwrap(), Version::V010);
        assert!(Version::V040 > Version::V031);
        assert!(Version::parse("1.0").is_err());
        assert!(Version::parse("1.0.0.0").is_err());
        assert!(Version::parse("a.b.c").is_err());
        assert!(Version::parse("-1.0.0").is_err());
    }

    #[test]
    fn long_versions_are_not_quoted_whole() {
        let e = Version::parse(&"1".repeat(100_000)).unwrap_err();
        assert!(e.msg.len() < 200, "{}", e.msg.len());
    }

    #[test]
    fn unsupported_is_code_1() {
        assert_eq!(Version::parse_supported("0.5.0").unwrap_err().code, codes::INCOMPATIBLE_VERSION);
        assert_eq!(Version::parse_supported("x").unwrap_err().code, codes::DECODE);
        for v in SUPPORTED_VERSIONS {
            assert_eq!(Version::parse_supported(v).unwrap().to_string(), *v);
        }
    }
}
