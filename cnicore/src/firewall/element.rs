//! Set and map elements of nf_tables, typed: what the nftables backends add, delete and tag. One
//! description renders to `nft` syntax ([`Element::render`], for `nft -f` scripts in
//! [`super::nftables`]) and encodes to nf_tables data for netlink ([`super::nfnl`]); both use it, and it uses
//! neither.

use std::net::IpAddr;

use crate::spec::{Error, Result};

/// A double-quoted nft string. nft strings have no escapes, so quotes, backslashes and control characters
/// are refused rather than escaped.
pub fn string(text: &str) -> Result<String> {
    if text.chars().any(|c| c == '"' || c == '\\' || c.is_control()) {
        return Err(Error::config(format!(
            "{:?} cannot be used in an nftables rule (quote, backslash or control character)",
            crate::spec::truncate_for_msg(text)
        )));
    }
    Ok(format!("\"{text}\""))
}

/// One part of a set key or map value, typed: rendered as nft syntax for `nft -f` ([`Element::render`]) and
/// encoded as nf_tables data for netlink ([`super::nfnl`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Datum {
    /// `ipv4_addr` or `ipv6_addr`.
    Addr(IpAddr),
    /// `inet_proto`: the protocol number, and the name nft reads and lists (`tcp`).
    Proto { number: u8, name: &'static str },
    /// `inet_service`.
    Port(u16),
    /// `ifname`.
    Ifname(IfName),
}

/// An interface name that can be written as an nft string (made by [`Datum::ifname`] only).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IfName(String);

impl IfName {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Datum {
    /// An interface name as a key part; refused as [`string`] refuses it.
    pub fn ifname(name: &str) -> Result<Datum> {
        string(name)?;
        Ok(Datum::Ifname(IfName(name.to_string())))
    }

    fn render(&self) -> String {
        match self {
            Datum::Addr(ip) => ip.to_string(),
            Datum::Proto { name, .. } => name.to_string(),
            Datum::Port(port) => port.to_string(),
            Datum::Ifname(name) => format!("\"{}\"", name.as_str()),
        }
    }
}

/// A key or data value: one datum, or a concatenation (`tcp . 8080`).
fn render_data(parts: &[Datum]) -> String {
    parts.iter().map(Datum::render).collect::<Vec<_>>().join(" . ")
}

/// The value of a map element.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MapValue {
    /// `continue`.
    Continue,
    /// `jump <chain>` (a generated chain name).
    Jump(String),
    /// Data, e.g. `10.22.0.5 . 80`.
    Data(Vec<Datum>),
}

impl MapValue {
    pub fn render(&self) -> String {
        match self {
            MapValue::Continue => "continue".to_string(),
            MapValue::Jump(chain) => format!("jump {chain}"),
            MapValue::Data(parts) => render_data(parts),
        }
    }
}

/// One element a backend adds or deletes: its set or map, key, value (maps) and comment (the owner tag).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Element {
    pub set: String,
    pub key: Vec<Datum>,
    pub value: Option<MapValue>,
    pub comment: Option<String>,
}

impl Element {
    /// An element without a comment.
    pub fn new(set: impl Into<String>, key: Vec<Datum>, value: Option<MapValue>) -> Element {
        Element { set: set.into(), key, value, comment: None }
    }

    /// The element with `tag` as its comment.
    pub fn tagged(mut self, tag: &str) -> Element {
        self.comment = Some(tag.to_string());
        self
    }

    /// The key in nft syntax (`tcp . 8080`), as [`Listed::key`](super::nftables::Listed::key) has it (interface names aside: quoted here).
    pub fn key_text(&self) -> String {
        render_data(&self.key)
    }

    /// The value in nft syntax, as [`Listed::value`](super::nftables::Listed::value) has it.
    pub fn value_text(&self) -> Option<String> {
        self.value.as_ref().map(MapValue::render)
    }

    /// `<key> [comment "<tag>"] [: <value>]`, as inside `add element ... { }`; the comment when
    /// `with_comment`.
    pub fn render(&self, with_comment: bool) -> String {
        let comment = match &self.comment {
            Some(tag) if with_comment => format!(" comment \"{tag}\""),
            _ => String::new(),
        };
        let value = self.value_text().map(|v| format!(" : {v}")).unwrap_or_default();
        format!("{}{comment}{value}", self.key_text())
    }
}
