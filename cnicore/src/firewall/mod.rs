//! Firewall backends shared by portmap (host ports), bridge (`ipMasq`), the firewall plugin, fabricd (a node's
//! masquerade) and cni-netpol (its nf_tables transactions).
//!
//! Two backends, chosen per config ([`Backend::resolve`]): explicit `iptables` / `nftables`, else iptables when
//! the `iptables` binary exists, else nftables (as the reference plugins do).
//!
//! - [`iptables`]: rules are rendered as `iptables-save` text and applied with ONE
//!   `iptables-restore --noflush --wait` per address family per call (`ip6tables-restore` for IPv6); state is
//!   read with one `iptables-save -t <table>` when needed. Which kernel backend (legacy or nf_tables) is used is
//!   left to the `iptables-restore` found on `PATH`, exactly as running `iptables` would.
//! - [`nftables`]: one `nft -f -` transaction per call; state is read with `nft -j list ...` when needed. The
//!   usual ADD and DEL (elements only) and the deletion by owner tag go over netlink instead ([`nfnl`]: one
//!   nf_tables batch, no `nft` process).
//! - [`element`]: the typed set and map elements both of those speak (rendered as `nft` text by the one,
//!   encoded as netlink data by the other).
//! - [`masq`]: the bridge plugin's ipMasq (setup / teardown / gc), see its docs for the API.
//! - [`node_masq`]: a node agent's masquerade of a whole pod network (fabricd's `--ip-masq`), in flannel's
//!   iptables or nftables layout (the nftables one written by the private `flannel_nft` as one netlink batch).
//! - [`find_binary`]: the iptables binaries, found by path; the private `exec` runs them with explicit
//!   arguments and the script on stdin, never through a shell.
//! - [`conditions`]: user-supplied match conditions (portmap's `conditionsV4`/`conditionsV6`), parsed into a
//!   small typed language and rendered for either backend; never pasted as text.
//! - [`reference_nft`]: the nftables rules of the reference plugins v1.6+ (their tables), found and removed
//!   by our DEL and GC, so that a node moved from their binaries to ours keeps working.
//! - [`conntrack`]: deleting conntrack entries over netlink (NETLINK_NETFILTER), e.g. stale UDP flows.
//!
//! Every name that reaches a rule (network name, container ID, chain names, comments) is validated here
//! ([`validate_owner`], [`validate_chain_name`]) or generated from a hash, so no rule text can be injected.

pub mod conditions;
pub mod conntrack;
pub mod element;
mod exec;
mod flannel_nft;
pub mod iptables;
pub mod masq;
pub mod nfnl;
pub mod nftables;
pub mod node_masq;
pub mod reference_nft;

use std::fmt;

use ipnet::IpNet;
use sha2::{Digest, Sha512};

use crate::spec::{validate_container_id, validate_network_name, Error, Result};

pub use exec::find_binary;

/// How often a firewall transaction computed from a read (of a table, a chain, a set) is tried: a concurrent
/// change between the read and the write (another ADD creating the same shared chain, another DEL deleting
/// the same elements) makes it fail, and it is then computed again from a new read.
const ATTEMPTS: usize = 3;

/// Which firewall implementation programs the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Backend {
    Iptables,
    Nftables,
}

impl Backend {
    /// The backend named in a config (`"iptables"` or `"nftables"`); anything else is an invalid config.
    pub fn parse(name: &str) -> Result<Backend> {
        match name {
            "iptables" => Ok(Backend::Iptables),
            "nftables" => Ok(Backend::Nftables),
            other => Err(Error::config(format!(
                "unknown firewall backend {:?}: must be \"iptables\" or \"nftables\"",
                crate::spec::truncate_for_msg(other)
            ))),
        }
    }

    /// The configured backend, or the default when none is configured: iptables when the `iptables` binary
    /// exists, else nftables when `nft` exists (as the reference plugins choose).
    pub fn resolve(configured: Option<&str>) -> Result<Backend> {
        match configured {
            Some(name) => Backend::parse(name),
            None => Backend::detect(),
        }
    }

    /// The configured backend, else this machine's default ([`Backend::detect`]).
    pub fn or_detect(configured: Option<Backend>) -> Result<Backend> {
        configured.map_or_else(Backend::detect, Ok)
    }

    /// The default backend of this machine.
    pub fn detect() -> Result<Backend> {
        if find_binary("iptables").is_some() {
            Ok(Backend::Iptables)
        } else if find_binary("nft").is_some() {
            Ok(Backend::Nftables)
        } else {
            Err(Error::new(
                crate::spec::codes::NOT_AVAILABLE,
                "neither iptables nor nft found on PATH: install iptables or nftables",
            ))
        }
    }

    /// True when the binaries of this backend are installed.
    pub fn available(self) -> bool {
        match self {
            Backend::Iptables => find_binary("iptables-restore").is_some(),
            Backend::Nftables => find_binary("nft").is_some(),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Backend::Iptables => "iptables",
            Backend::Nftables => "nftables",
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// IP version of a rule set (iptables vs ip6tables; `ip` vs `ip6` in nftables): [`crate::ip::IpFamily`], with
/// the firewall's names for it below.
pub use crate::ip::IpFamily as Family;

impl Family {
    /// `"ip"` or `"ip6"`: the nftables payload keyword of this family.
    pub fn nft_keyword(self) -> &'static str {
        match self {
            Family::V4 => "ip",
            Family::V6 => "ip6",
        }
    }

    /// `"ipv4"` or `"ipv6"`: the `meta nfproto` value of this family.
    pub fn nfproto(self) -> &'static str {
        match self {
            Family::V4 => "ipv4",
            Family::V6 => "ipv6",
        }
    }

    /// `"4"` or `"6"`: the suffix of per-family names (`pods4_24`, `nomasq6`).
    pub fn digit(self) -> &'static str {
        match self {
            Family::V4 => "4",
            Family::V6 => "6",
        }
    }

    /// `"ipv4_addr"` or `"ipv6_addr"`: the nftables type of an address of this family.
    pub fn nft_addr_type(self) -> &'static str {
        match self {
            Family::V4 => "ipv4_addr",
            Family::V6 => "ipv6_addr",
        }
    }

    /// `"IPv4"` or `"IPv6"`, for messages.
    pub fn name(self) -> &'static str {
        match self {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        }
    }

    /// The whole address space of the family (`0.0.0.0/0`, `::/0`).
    pub fn any_net(self) -> IpNet {
        match self {
            Family::V4 => "0.0.0.0/0".parse().expect("constant"),
            Family::V6 => "::/0".parse().expect("constant"),
        }
    }
}

/// The families of a list of addresses, each once, IPv4 first.
pub fn families_of(ips: &[IpNet]) -> Vec<Family> {
    let mut families: Vec<Family> = ips.iter().map(Family::of_net).collect();
    families.sort();
    families.dedup();
    families
}

/// Length of the chain names the reference plugins generate (`utils.FormatChainName`).
const CHAIN_NAME_LEN: usize = 28;

/// The reference plugins' per-container chain name (`utils.MustFormatChainNameWithPrefix`):
/// `"CNI-" + prefix + hex(sha512(network + container_id))`, cut to 28 characters. With an empty prefix this is
/// `utils.FormatChainName` (bridge's ipMasq chain); portmap uses `"DN-"`.
pub fn chain_name(network: &str, container_id: &str, prefix: &str) -> String {
    let hash = hex_sha512(&format!("{network}{container_id}"));
    let mut name = format!("CNI-{prefix}{hash}");
    name.truncate(CHAIN_NAME_LEN);
    name
}

/// The owner tag of nftables elements (their comment): `<kind>-<8 hex of sha512(network)>-<16 hex of
/// sha512(network + container_id)>`. The network part lets GC find the elements of one network; the attachment
/// part is the reference's chain hash, shortened. Fixed length, well under nft's 128-byte comment limit.
pub fn nft_tag(kind: &str, network: &str, container_id: &str) -> String {
    let attachment = hex_sha512(&format!("{network}{container_id}"));
    format!("{}{}", nft_tag_prefix(kind, network), &attachment[..16])
}

/// The common start of the tags [`nft_tag`] gives the attachments of `network`.
pub fn nft_tag_prefix(kind: &str, network: &str) -> String {
    format!("{kind}-{}-", &hex_sha512(network)[..8])
}

/// Lower-case hex of the SHA-512 of `text`.
pub fn hex_sha512(text: &str) -> String {
    let digest = Sha512::digest(text.as_bytes());
    let mut out = String::with_capacity(digest.len() * 2);
    for byte in digest {
        out.push_str(&format!("{byte:02x}"));
    }
    out
}

/// The reference plugins' rule comment naming an attachment (`utils.FormatComment`): `name: "<net>" id: "<cid>"`.
/// Go's `%q` equals plain quoting for the names [`validate_owner`] accepts.
pub fn owner_comment(network: &str, container_id: &str) -> String {
    format!("name: \"{network}\" id: \"{container_id}\"")
}

/// Parses a comment made by [`owner_comment`] (after an optional prefix such as `"dnat "`), giving
/// (network, container ID). Comments of any other shape give `None`.
pub fn parse_owner_comment<'a>(comment: &'a str, prefix: &str) -> Option<(&'a str, &'a str)> {
    let rest = comment.strip_prefix(prefix)?.strip_prefix("name: \"")?;
    let (network, rest) = rest.split_once('"')?;
    let container_id = rest.strip_prefix(" id: \"")?.strip_suffix('"')?;
    if container_id.contains('"') {
        return None;
    }
    Some((network, container_id))
}

/// Checks the network name and container ID that go into chain names and comments, with the spec's rules
/// (letters, digits, `_`, `.`, `-`), so that no quote, space or newline can reach a rule.
pub fn validate_owner(network: &str, container_id: &str) -> Result<()> {
    validate_network_name(network)?;
    validate_container_id(container_id)
}

/// A chain name given in a config (e.g. portmap's `externalSetMarkChain`): letters, digits, `_`, `.`, `-`,
/// not starting with `-`, at most 28 characters (the iptables limit).
pub fn validate_chain_name(what: &str, name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= CHAIN_NAME_LEN
        && !name.starts_with('-')
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
    if !ok {
        return Err(Error::config(format!(
            "invalid {what} {:?}: a chain name has at most 28 letters, digits, '_', '.' or '-' and does not start with '-'",
            crate::spec::truncate_for_msg(name)
        )));
    }
    Ok(())
}

/// Cuts a comment to the iptables limit of 255 bytes, ending it with "..." as the reference portmap does
/// (`trimComment`, which keeps one byte too many for iptables to accept).
pub fn trim_comment(comment: &str) -> String {
    if comment.len() <= 255 {
        return comment.to_string();
    }
    // Comments are ASCII (validated names), so byte offsets are character boundaries.
    format!("{}...", &comment[..252])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chain_names_match_the_reference() {
        // Observed from /usr/lib/cni/portmap v1.1.1: network "kubenet", container "abc123".
        assert_eq!(chain_name("kubenet", "abc123", "DN-"), "CNI-DN-1e9a72e06b657088b0269");
        assert_eq!(chain_name("kubenet", "abc123", "").len(), 28);
        assert!(chain_name("kubenet", "abc123", "").starts_with("CNI-"));
    }

    #[test]
    fn owner_comments_round_trip() {
        let c = owner_comment("kubenet", "abc-1.2_3");
        assert_eq!(c, r#"name: "kubenet" id: "abc-1.2_3""#);
        assert_eq!(parse_owner_comment(&c, ""), Some(("kubenet", "abc-1.2_3")));
        assert_eq!(parse_owner_comment(&format!("dnat {c}"), "dnat "), Some(("kubenet", "abc-1.2_3")));
        assert_eq!(parse_owner_comment("CNI portfwd masquerade mark", ""), None);
        assert_eq!(parse_owner_comment(r#"name: "a" id: "b"c""#, ""), None);
    }

    #[test]
    fn validation() {
        validate_owner("kubenet", "0123abc").unwrap();
        assert!(validate_owner("bad name", "c").is_err());
        assert!(validate_owner("n", "c\"; drop").is_err());
        validate_chain_name("chain", "KUBE-MARK-MASQ").unwrap();
        for bad in ["", "-j", "a b", "x\ny", &"A".repeat(29), "a\"b"] {
            assert!(validate_chain_name("chain", bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn backend_names() {
        assert_eq!(Backend::parse("iptables").unwrap(), Backend::Iptables);
        assert_eq!(Backend::parse("nftables").unwrap(), Backend::Nftables);
        assert_eq!(Backend::parse("ipfw").unwrap_err().code, crate::spec::codes::INVALID_CONFIG);
    }

    #[test]
    fn trims_long_comments() {
        assert_eq!(trim_comment("short"), "short");
        let long = "x".repeat(300);
        assert_eq!(trim_comment(&long).len(), 255);
    }
}
