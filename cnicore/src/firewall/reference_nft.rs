//! The nftables state of the reference plugins v1.6 to v1.9 (bridge `ipMasqBackend: nftables`, portmap
//! `backend: nftables`), so that a node moved from their binaries to ours with pods running keeps working:
//! our DEL and GC remove their rules, and our portmap CHECK accepts a pod whose rules are theirs. Our ADD
//! never writes into their tables (ours are `inet cni_ipmasq` and `inet cni_portmap`, see [`super::masq`] and
//! the portmap plugin), so their pods keep every rule until their DEL comes.
//!
//! Their layout, as `pkg/ip/ipmasq_nftables_linux.go` and `plugins/meta/portmap/portmap_nftables.go` write it
//! through knftables (a rule per attachment, owners in rule comments):
//!
//! ```text
//! table inet cni_plugins_masquerade {
//!   chain masq_checks { ip saddr == <pod IP> ip daddr != <pod subnet> masquerade
//!                         comment "<hash16(net)>-<hash16(ifname:id)>, net: <net>, if: <ifname>, id: <id>" }
//!   chain postrouting { type nat hook postrouting priority srcnat;
//!                       ip daddr 224.0.0.0/4 return; ip6 daddr ff00::/8 return; goto masq_checks } }
//! table ip cni_hostport {          (and table ip6 cni_hostport)
//!   chain hostports        { ip protocol tcp th dport 8080 dnat ip addr . port to <pod IP> . 80 comment "<id>" }
//!   chain hostip_hostports { ip daddr <hostIP> ip protocol tcp th dport 8080 dnat ... comment "<id>" }
//!   chain prerouting  { type nat hook prerouting priority dstnat; <conditions> jump hostip_hostports; <conditions> jump hostports }
//!   chain output      { type nat hook output priority -100; ... fib daddr type local jump hostports }
//!   chain masquerading { type nat hook postrouting priority srcnat;
//!                        ip saddr <pod IP> ip daddr <pod IP> masquerade comment "<id>"       (hairpin)
//!                        ip saddr 127.0.0.1 ip daddr <pod IP> masquerade comment "<id>" }    (IPv4 only) }
//! ```
//!
//! Their portmap comments carry the container ID only, not the network: a portmap GC of one network removes
//! their rules of every container ID not in its valid list (their own code has no portmap GC at all).
//!
//! Cost: one netlink dump of the tables per DEL or GC when `nft` is installed (`nft -j list tables` when the
//! dump fails); their tables are read, and their stale rules deleted in one transaction, only when they exist.

use std::collections::BTreeSet;

use serde_json::Value;

use super::nftables::{self, Script};
use super::{hex_sha512, Family};
use crate::spec::Result;

/// Their ipMasq table (family `inet`) and the chain holding a rule per attachment.
pub const IPMASQ_TABLE: &str = "cni_plugins_masquerade";
pub const IPMASQ_CHAIN: &str = "masq_checks";
/// Their portmap table, in families `ip` and `ip6`.
pub const PORTMAP_TABLE: &str = "cni_hostport";
/// Their portmap chains holding a rule per mapping (wildcard, hostIP) and per masquerade case.
pub const PORTMAP_CHAINS: [&str; 3] = ["hostports", "hostip_hostports", "masquerading"];
/// knftables' comment limit (`knftables.CommentLengthMax`).
const COMMENT_MAX: usize = 128;

/// `utils.MustFormatHashWithPrefix(16, "", text)`.
fn hash16(text: &str) -> String {
    hex_sha512(text)[..16].to_string()
}

/// The start of the comments of an attachment's ipMasq rule (`hashForInstance`).
pub fn ipmasq_instance(network: &str, ifname: &str, container_id: &str) -> String {
    format!("{}-{}", hash16(network), hash16(&format!("{ifname}:{container_id}")))
}

/// The whole comment of an attachment's ipMasq rule (`commentForInstance`), cut to 128 bytes.
pub fn ipmasq_comment(network: &str, ifname: &str, container_id: &str) -> String {
    let strip = |s: &str| s.replace('"', "");
    let mut comment = format!(
        "{}, net: {}, if: {}, id: {}",
        ipmasq_instance(network, ifname, container_id),
        strip(network),
        strip(ifname),
        strip(container_id)
    );
    comment.truncate(COMMENT_MAX);
    comment
}

/// One of their rules, as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TheirRule {
    pub family: String,
    pub table: String,
    pub chain: String,
    pub handle: u64,
    pub comment: Option<String>,
}

/// Which of (family, table) exist: asked over netlink (no process), else from one `nft -j list tables`.
fn present_tables(wanted: &[(&str, &str)]) -> Result<Vec<(String, String)>> {
    if let Ok(tables) = super::nfnl::tables() {
        return Ok(tables.into_iter().filter(|(f, t)| wanted.iter().any(|(wf, wt)| wf == f && wt == t)).collect());
    }
    let listing =
        nftables::list(&["tables"]).map_err(|f| f.to_error("listing nftables tables"))?.unwrap_or(Value::Null);
    let mut out = Vec::new();
    for item in listing.get("nftables").and_then(Value::as_array).into_iter().flatten() {
        let Some(table) = item.get("table") else { continue };
        let family = table.get("family").and_then(Value::as_str).unwrap_or_default();
        let name = table.get("name").and_then(Value::as_str).unwrap_or_default();
        if wanted.iter().any(|(f, t)| *f == family && *t == name) {
            out.push((family.to_string(), name.to_string()));
        }
    }
    Ok(out)
}

/// The rules of `family table` in `chains`; empty when the table is gone.
fn table_rules(family: &str, table: &str, chains: &[&str]) -> Result<Vec<TheirRule>> {
    let what = format!("listing table {family} {table}");
    let Some(listing) = nftables::list(&["table", family, table]).map_err(|f| f.to_error(&what))? else {
        return Ok(Vec::new());
    };
    Ok(nftables::objects(&listing, "rule", family, table)
        .filter_map(|rule| {
            let chain = rule.get("chain").and_then(Value::as_str).filter(|c| chains.contains(c))?;
            Some(TheirRule {
                family: family.to_string(),
                table: table.to_string(),
                chain: chain.to_string(),
                handle: rule.get("handle").and_then(Value::as_u64)?,
                comment: rule.get("comment").and_then(Value::as_str).map(str::to_string),
            })
        })
        .collect())
}

/// The rules in `chains` of those `tables` that exist.
fn rules_of(tables: &[(&str, &str)], chains: &[&str]) -> Result<Vec<TheirRule>> {
    let mut out = Vec::new();
    for (family, table) in present_tables(tables)? {
        out.extend(table_rules(&family, &table, chains)?);
    }
    Ok(out)
}

/// Deletes, in one transaction, the rules of `tables`/`chains` that `stale` selects; rules already gone are
/// fine. Nothing runs but one listing when their tables do not exist.
fn delete_rules(tables: &[(&str, &str)], chains: &[&str], stale: impl Fn(&TheirRule) -> bool) -> Result<()> {
    let mut last = None;
    for _ in 0..super::ATTEMPTS {
        let mut script = Script::new();
        for rule in rules_of(tables, chains)?.iter().filter(|r| stale(r)) {
            script.push(format!("delete rule {} {} {} handle {}", rule.family, rule.table, rule.chain, rule.handle));
        }
        match script.apply() {
            Ok(()) => return Ok(()),
            Err(failure) => last = Some(failure),
        }
    }
    let failure = last.expect("at least one attempt");
    Err(failure.to_error("removing rules of the reference plugins' nftables tables"))
}

const IPMASQ: [(&str, &str); 1] = [("inet", IPMASQ_TABLE)];
const PORTMAP: [(&str, &str); 2] = [("ip", PORTMAP_TABLE), ("ip6", PORTMAP_TABLE)];

/// DEL of bridge ipMasq: their rule of the attachment (network, ifname, container).
pub fn ipmasq_teardown(network: &str, ifname: &str, container_id: &str) -> Result<()> {
    let instance = ipmasq_instance(network, ifname, container_id);
    delete_rules(&IPMASQ, &[IPMASQ_CHAIN], |r| r.comment.as_deref().is_some_and(|c| c.starts_with(&instance)))
}

/// GC of bridge ipMasq: their rules of `network` whose attachment is not in `valid` (containerID, ifname).
pub fn ipmasq_gc(network: &str, valid: &[(String, String)]) -> Result<()> {
    let prefix = format!("{}-", hash16(network));
    let keep: BTreeSet<String> = valid.iter().map(|(id, ifname)| ipmasq_instance(network, ifname, id)).collect();
    delete_rules(&IPMASQ, &[IPMASQ_CHAIN], |r| {
        r.comment.as_deref().is_some_and(|c| c.starts_with(&prefix) && !keep.iter().any(|k| c.starts_with(k.as_str())))
    })
}

/// CHECK of bridge ipMasq: their rule of the attachment is there.
pub fn ipmasq_has_rule(network: &str, ifname: &str, container_id: &str) -> Result<bool> {
    let instance = ipmasq_instance(network, ifname, container_id);
    let rules = table_rules("inet", IPMASQ_TABLE, &[IPMASQ_CHAIN])?;
    Ok(rules.iter().any(|r| r.comment.as_deref().is_some_and(|c| c.starts_with(&instance))))
}

/// DEL of portmap: their rules of the container, in both families (as their `unforwardPorts`).
pub fn portmap_teardown(container_id: &str) -> Result<()> {
    delete_rules(&PORTMAP, &PORTMAP_CHAINS, |r| r.comment.as_deref() == Some(container_id))
}

/// GC of portmap: their rules of every container not in `valid`.
pub fn portmap_gc(valid: &BTreeSet<&str>) -> Result<()> {
    delete_rules(&PORTMAP, &PORTMAP_CHAINS, |r| r.comment.as_deref().is_some_and(|c| !valid.contains(c)))
}

/// CHECK of portmap for one container address family, as their `checkPorts`: at least `wanted[i]` rules of
/// the container in `PORTMAP_CHAINS[i]`. `Ok(false)` when their table does not exist or rules are missing.
pub fn portmap_has_rules(family: Family, container_id: &str, wanted: [usize; 3]) -> Result<bool> {
    let family = match family {
        Family::V4 => "ip",
        Family::V6 => "ip6",
    };
    let rules = table_rules(family, PORTMAP_TABLE, &PORTMAP_CHAINS)?;
    Ok(PORTMAP_CHAINS.iter().zip(wanted).all(|(chain, count)| {
        rules.iter().filter(|r| r.chain == *chain && r.comment.as_deref() == Some(container_id)).count() >= count
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipmasq_comments_as_the_reference_writes_them() {
        let comment = ipmasq_comment("kubenet", "eth0", "abc123");
        let instance = ipmasq_instance("kubenet", "eth0", "abc123");
        assert_eq!(instance.len(), 33);
        assert_eq!(&instance[..16], &hex_sha512("kubenet")[..16]);
        assert_eq!(&instance[17..], &hex_sha512("eth0:abc123")[..16]);
        assert_eq!(comment, format!("{instance}, net: kubenet, if: eth0, id: abc123"));
        let long = ipmasq_comment("kubenet", "eth0", &"f".repeat(200));
        assert_eq!(long.len(), 128);
    }
}
