//! The pod's ifb device: its name (the reference's, so either plugin finds the other's device), creation
//! with an owner tag for GC, and the listing GC needs.

use std::io;

use cnicore::netlink::{Link, Netlink};
use sha2::{Digest, Sha512};

/// Interface names are at most 15 bytes.
const MAX_NAME_LEN: usize = 15;
const PREFIX: &str = "bwp";
/// The kernel's `IFALIASZ` (256 including the NUL).
const MAX_ALIAS_LEN: usize = 255;
/// Start of the alias that tags an ifb made by this plugin with its network and container ID.
const ALIAS_TAG: &str = "cni-bandwidth";

/// `bwp` + the first 12 hex digits of SHA-512(network name + container ID), as the reference's
/// `utils.MustFormatHashWithPrefix(15, "bwp", name+containerID)`.
pub fn name(network: &str, container_id: &str) -> String {
    let digest = Sha512::digest(format!("{network}{container_id}").as_bytes());
    let mut name = String::from(PREFIX);
    for byte in digest.iter() {
        if name.len() >= MAX_NAME_LEN {
            break;
        }
        name.push_str(&format!("{byte:02x}"));
    }
    name.truncate(MAX_NAME_LEN);
    name
}

/// The alias that records which attachment an ifb belongs to (`cni-bandwidth <network> <container ID>`);
/// neither contains spaces (the spec's character sets). None if it would not fit.
pub fn alias(network: &str, container_id: &str) -> Option<String> {
    let alias = format!("{ALIAS_TAG} {network} {container_id}");
    (alias.len() <= MAX_ALIAS_LEN).then_some(alias)
}

/// Creates the ifb `name`, up, with `mtu` (the host veth's, as the reference) and the owner alias.
/// A leftover device of the same name (an earlier ADD of this pod that did not finish) is replaced.
pub fn create(nl: &mut Netlink, name: &str, mtu: u32, alias: Option<&str>) -> io::Result<Link> {
    let link = match nl.create_ifb_with(name, Some(mtu), true) {
        Err(e) if cnicore::netlink::is_exists(&e) => {
            nl.delete_link_by_name(name)?;
            nl.create_ifb_with(name, Some(mtu), true)?
        }
        other => other?,
    };
    if let Some(alias) = alias {
        // The kernel ignores IFLA_IFALIAS when creating a link: set it afterwards.
        nl.set_alias(link.index, alias)?;
    }
    Ok(link)
}

/// An ifb device and the attachment its alias names, if it carries our tag.
pub struct TaggedIfb {
    pub name: String,
    pub network: String,
    pub container_id: String,
}

/// Every ifb of the namespace that this plugin created (tagged by [`alias`]).
pub fn tagged(nl: &mut Netlink) -> io::Result<Vec<TaggedIfb>> {
    let mut found = Vec::new();
    for (link, alias) in nl.links_with_aliases()? {
        let (Some(alias), Some("ifb")) = (alias, link.kind.as_deref()) else { continue };
        let name = link.name;
        let mut fields = alias.split(' ');
        if let (Some(ALIAS_TAG), Some(network), Some(container_id), None) =
            (fields.next(), fields.next(), fields.next(), fields.next())
        {
            found.push(TaggedIfb { name, network: network.to_string(), container_id: container_id.to_string() });
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reference_names() {
        let n = name("mynet", "dummy");
        assert_eq!(n.len(), 15);
        assert!(n.starts_with("bwp"));
        let hex: String = Sha512::digest(b"mynetdummy").iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(&n[3..], &hex[..12]);
        assert_eq!(alias("net", "abc").as_deref(), Some("cni-bandwidth net abc"));
        assert_eq!(alias("net", &"x".repeat(300)), None);
    }
}
