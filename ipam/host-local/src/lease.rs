//! What a lease file says: `<containerID>\r\n<ifname>` (or only `<containerID>`, as written by old reference
//! versions), compared after trimming whitespace exactly as the reference does.

use std::fmt;

/// The holder of a lease.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Owner {
    /// `<containerID>\r\n<ifname>`: what current versions (ours and the reference) write.
    Attachment { id: String, ifname: String },
    /// `<containerID>`: leases of reference versions before interface names were recorded.
    Legacy { id: String },
}

/// The content of a lease file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Content {
    Owner(Owner),
    /// Nothing in it: left by a crash between creating and writing the file. Garbage.
    Empty,
    /// Something no container ID / ifname pair can produce.
    Unreadable,
}

impl Owner {
    pub fn attachment(id: &str, ifname: &str) -> Owner {
        Owner::Attachment { id: id.trim().to_string(), ifname: ifname.to_string() }
    }

    pub fn id(&self) -> &str {
        match self {
            Owner::Attachment { id, .. } | Owner::Legacy { id } => id,
        }
    }

    /// The bytes written to the lease file (no trailing newline, as the reference).
    pub fn file_content(&self) -> String {
        self.to_string()
    }

    /// Parses a lease file's content as the reference compares it (`strings.TrimSpace`).
    pub fn parse(bytes: &[u8]) -> Content {
        let Ok(text) = std::str::from_utf8(bytes) else { return Content::Unreadable };
        let text = text.trim();
        if text.is_empty() {
            return Content::Empty;
        }
        let no_space = |s: &str| !s.is_empty() && !s.chars().any(char::is_whitespace);
        match text.split_once("\r\n") {
            Some((id, ifname)) if no_space(id) && no_space(ifname) => {
                Content::Owner(Owner::Attachment { id: id.to_string(), ifname: ifname.to_string() })
            }
            None if no_space(text) => Content::Owner(Owner::Legacy { id: text.to_string() }),
            _ => Content::Unreadable,
        }
    }
}

impl fmt::Display for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Owner::Attachment { id, ifname } => write!(f, "{id}\r\n{ifname}"),
            Owner::Legacy { id } => f.write_str(id),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_like_the_reference() {
        assert_eq!(Owner::parse(b"abc\r\neth0"), Content::Owner(Owner::attachment("abc", "eth0")));
        assert_eq!(Owner::parse(b"  abc\r\neth0\n"), Content::Owner(Owner::attachment("abc", "eth0")));
        assert_eq!(Owner::parse(b"abc"), Content::Owner(Owner::Legacy { id: "abc".into() }));
        assert_eq!(Owner::parse(b"abc\r\n"), Content::Owner(Owner::Legacy { id: "abc".into() }));
        assert_eq!(Owner::parse(b""), Content::Empty);
        assert_eq!(Owner::parse(b" \n"), Content::Empty);
        assert_eq!(Owner::parse(b"a b"), Content::Unreadable);
        assert_eq!(Owner::parse(b"\xff"), Content::Unreadable);
        assert_eq!(Owner::attachment("abc", "eth0").file_content(), "abc\r\neth0");
    }
}
