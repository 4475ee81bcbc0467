//! The bridge plugin's `ipMasq`: masquerade pod traffic leaving the pod's subnet, except multicast.
//!
//! # API (for the bridge plugin)
//!
//! ```ignore
//! use cnicore::firewall::{masq, Backend};
//! // Config parsing: `ipMasqBackend` (None = iptables when the binary exists, else nftables).
//! let backend = Backend::resolve(conf.ip_masq_backend.as_deref())?;      // code 7 for an unknown name
//! // ADD, after IPAM: the pod's addresses WITH their prefix (result.ips[].address, e.g. 10.22.0.5/24).
//! masq::setup(backend, &conf.name, &ctx.env.container_id, &pod_ips)?;
//! // DEL (also without netns, from prevResult's IPs; an empty slice means "both families"):
//! masq::teardown(&conf.name, &ctx.env.container_id, &pod_ips)?;
//! // GC: everything of this network whose container is not in the valid list (ifname is ignored).
//! masq::gc(&conf.name, &ctx.valid_attachments()?)?;
//! ```
//!
//! - `setup` is idempotent (a repeated ADD leaves one copy of every rule). iptables: one `iptables-restore`
//!   per family for a new pod (`-N` of its chain fails when it exists, and then the nat table is read with one
//!   `iptables-save -t nat` and a complete transaction applied); nftables: one `nft -f -` for all families.
//!   Errors: code 50 when the backend's binaries are missing, 999 when the kernel refuses.
//! - `teardown` cleans BOTH backends (whichever binaries are installed), since the pod may have been set up by
//!   another plugin version or config, and succeeds when everything is already gone (no netns needed: it
//!   needs only the network name, the container ID and, optionally, the IPs). iptables: one save + at most one
//!   restore per family; nftables: one `nft -f -` when the IPs are given and present, else one listing + one
//!   transaction.
//! - `gc` removes the masquerade state of every attachment of `network` whose container ID is not listed.
//!
//! # Layout
//!
//! iptables (exactly the reference bridge v1.1.1, `pkg/ip/ipmasq_linux.go`, so either plugin cleans up after
//! the other): in table `nat`, a chain `CNI-<hash>` (`utils.FormatChainName(network, containerID)`) holding, for
//! each pod address, `-d <pod subnet> -j ACCEPT` and then one `! -d 224.0.0.0/4 -j MASQUERADE` (`ff00::/8` for
//! IPv6), all with the comment `name: "<network>" id: "<containerID>"`; `POSTROUTING` jumps to it with
//! `-s <pod IP>/32` (`/128`) and the same comment.
//!
//! nftables (ours): table `inet cni_ipmasq`; per family and pod prefix length (usually one), a postrouting
//! chain (nat hook, priority srcnat) of three fixed rules and two hash sets holding the pods, e.g. for /24:
//!
//! ```text
//! chain masq4-24 { meta nfproto ipv4 ip daddr 224.0.0.0/4 return                    # ff00::/8 for IPv6
//!                  meta nfproto ipv4 ip saddr . ip daddr & 255.255.255.0 @local4_24 return
//!                  meta nfproto ipv4 ip saddr @pods4_24 masquerade }
//! set pods4_24  { type ipv4_addr }               # <pod IP>
//! set local4_24 { type ipv4_addr . ipv4_addr }   # <pod IP> . <pod subnet address>
//! ```
//!
//! (Plain hash sets looked up with a masked address rather than interval sets: deleting from an interval set
//! costs time proportional to its size. One difference with the iptables layout: a pod with two addresses of
//! one family in different subnets is exempted, for each address, from its own subnet only.)
//!
//! Each element carries the comment `masq-<net hash>-<attachment hash>` (for teardown without IPs and GC).
//! Adding a pod adds elements in one `nft -f -` without reading anything: its cost does not depend on the
//! number of pods.

use std::collections::BTreeSet;

use ipnet::IpNet;

use super::iptables::{self, Rule, Script};
use super::nftables;
use super::{chain_name, families_of, nft_tag, owner_comment, parse_owner_comment};
use super::{validate_owner, Backend, Family};
use crate::spec::{Error, Result};

/// The nftables table of ipMasq.
pub const NFT_TABLE: &str = "cni_ipmasq";
/// Elements are tagged (commented) `masq-<net hash>-<attachment hash>`.
const NFT_TAG_KIND: &str = "masq";

fn multicast(family: Family) -> IpNet {
    match family {
        Family::V4 => "224.0.0.0/4".parse().expect("constant"),
        Family::V6 => "ff00::/8".parse().expect("constant"),
    }
}

/// Installs masquerading for the pod addresses `ips` (with their prefixes) of attachment (network, container).
pub fn setup(backend: Backend, network: &str, container_id: &str, ips: &[IpNet]) -> Result<()> {
    validate_owner(network, container_id)?;
    if ips.is_empty() {
        return Ok(());
    }
    match backend {
        Backend::Iptables => {
            for family in families_of(ips) {
                let family_ips: Vec<IpNet> = ips.iter().copied().filter(|ip| Family::of_net(ip) == family).collect();
                iptables_setup(family, network, container_id, &family_ips)?;
            }
            Ok(())
        }
        Backend::Nftables => nft_setup(network, container_id, ips),
    }
}

/// Removes the masquerading of attachment (network, container) from both backends. `ips` (from prevResult)
/// limit the iptables families looked at; when empty, both are.
pub fn teardown(network: &str, container_id: &str, ips: &[IpNet]) -> Result<()> {
    validate_owner(network, container_id)?;
    let families = if ips.is_empty() { vec![Family::V4, Family::V6] } else { families_of(ips) };
    let mut errors = Vec::new();
    for family in families {
        if iptables::available(family) {
            if let Err(e) = iptables_teardown(family, network, container_id) {
                errors.push(e.msg);
            }
        }
    }
    if Backend::Nftables.available() {
        if let Err(e) = nft_teardown(network, container_id, ips) {
            errors.push(e.msg);
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(Error::internal(format!("failed to remove ipMasq rules: {}", errors.join("; "))))
    }
}

/// Removes the masquerading of every attachment of `network` whose container ID is not in `valid`
/// (`(containerID, ifname)` pairs as `Context::valid_attachments` gives them; ifname is ignored), in both
/// backends.
pub fn gc(network: &str, valid: &[(String, String)]) -> Result<()> {
    crate::spec::validate_network_name(network)?;
    let valid: BTreeSet<&str> = valid.iter().map(|(id, _)| id.as_str()).collect();
    let mut errors = Vec::new();
    for family in [Family::V4, Family::V6] {
        if iptables::available(family) {
            if let Err(e) = iptables_gc(family, network, &valid) {
                errors.push(e.msg);
            }
        }
    }
    if Backend::Nftables.available() {
        if let Err(e) = nft_gc(network, &valid) {
            errors.push(e.msg);
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(Error::internal(format!("ipMasq garbage collection failed: {}", errors.join("; "))))
    }
}

// ---- iptables ----

/// The rules of the attachment chain, in order: ACCEPT for each pod subnet, then one MASQUERADE.
fn iptables_chain_rules(family: Family, comment: &str, ips: &[IpNet]) -> Result<Vec<Rule>> {
    let mut rules = Vec::new();
    for ip in ips {
        let accept = Rule::new().destination(ip.trunc(), false)?.comment(comment).jump("ACCEPT");
        if !rules.contains(&accept) {
            rules.push(accept);
        }
    }
    rules.push(Rule::new().destination(multicast(family), true)?.comment(comment).jump("MASQUERADE"));
    Ok(rules)
}

/// `POSTROUTING -s <pod IP>/32 -m comment --comment ... -j CNI-<hash>`.
fn iptables_jump(ip: &IpNet, comment: &str, chain: &str) -> Result<Rule> {
    let host = IpNet::new(ip.addr(), ip.max_prefix_len()).map_err(|e| Error::internal(e.to_string()))?;
    Ok(Rule::new().source(host, false)?.comment(comment).jump(chain))
}

fn iptables_setup(family: Family, network: &str, container_id: &str, ips: &[IpNet]) -> Result<()> {
    let chain = chain_name(network, container_id, "");
    let comment = super::trim_comment(&owner_comment(network, container_id));
    let rules = iptables_chain_rules(family, &comment, ips)?;
    let jumps = ips.iter().map(|ip| iptables_jump(ip, &comment, &chain)).collect::<Result<Vec<_>>>()?;
    // The usual case, a new pod, needs no reading: `-N` fails when the chain exists (a repeated ADD).
    let mut fast = Script::new("nat");
    fast.new_chain(&chain);
    for rule in &rules {
        fast.append(&chain, rule);
    }
    for jump in &jumps {
        fast.append("POSTROUTING", jump);
    }
    if fast.apply(family).is_ok() {
        return Ok(());
    }
    iptables::update(family, "nat", &format!("setting up ipMasq for {container_id}"), |snapshot, script| {
        if !snapshot.has_chain(&chain) {
            script.new_chain(&chain);
        }
        let current: Vec<&str> = snapshot.rules(&chain).collect();
        let wanted: Vec<String> = rules.iter().map(Rule::render).collect();
        if current != wanted.iter().map(String::as_str).collect::<Vec<_>>() {
            if !current.is_empty() {
                script.flush_chain(&chain);
            }
            for rule in &rules {
                script.append(&chain, rule);
            }
        }
        for jump in &jumps {
            if !snapshot.has_rule("POSTROUTING", jump) {
                script.append("POSTROUTING", jump);
            }
        }
    })
}

fn iptables_teardown(family: Family, network: &str, container_id: &str) -> Result<()> {
    let chain = chain_name(network, container_id, "");
    iptables::cleanup(family, "nat", &format!("removing ipMasq rules of {container_id}"), |snapshot, script| {
        iptables::remove_chain(script, snapshot, &chain)
    })
}

fn iptables_gc(family: Family, network: &str, valid: &BTreeSet<&str>) -> Result<()> {
    iptables::cleanup(family, "nat", "ipMasq garbage collection", |snapshot, script| {
        let mut stale = BTreeSet::new();
        for spec in snapshot.rules("POSTROUTING") {
            let Some(comment) = iptables::saved_comment(spec) else { continue };
            let Some((net, id)) = parse_owner_comment(&comment, "") else { continue };
            let chain = chain_name(net, id, "");
            if net == network && !valid.contains(id) && iptables::targets_chain(spec, &chain) {
                stale.insert(chain);
            }
        }
        for chain in stale {
            iptables::remove_chain(script, snapshot, &chain);
        }
    })
}

// ---- nftables ----

/// The sets and chain of pod addresses of one family and prefix length: (pods set, local set, chain).
fn nft_objects(ip: &IpNet) -> (String, String, String) {
    let (v, len) = (match Family::of_net(ip) {
        Family::V4 => "4",
        Family::V6 => "6",
    }, ip.prefix_len());
    (format!("pods{v}_{len}"), format!("local{v}_{len}"), format!("masq{v}-{len}"))
}

/// The table, and for each prefix length of `ips` its sets and postrouting chain (created or refreshed).
fn nft_base(script: &mut nftables::Script, ips: &[IpNet]) {
    let t = format!("inet {NFT_TABLE}");
    script.push(format!("add table {t}"));
    let mut done = Vec::new();
    for ip in ips {
        let (pods, local, chain) = nft_objects(ip);
        if done.contains(&chain) {
            continue;
        }
        let family = Family::of_net(ip);
        let addr = match family {
            Family::V4 => "ipv4_addr",
            Family::V6 => "ipv6_addr",
        };
        let (proto, kw, mask) = (family.nfproto(), family.nft_keyword(), ip.netmask());
        script.push(format!("add set {t} {pods} {{ type {addr} ; }}"));
        script.push(format!("add set {t} {local} {{ type {addr} . {addr} ; }}"));
        script.push(format!("add chain {t} {chain} {{ type nat hook postrouting priority srcnat ; }}"));
        script.push(format!("flush chain {t} {chain}"));
        script.push(format!("add rule {t} {chain} meta nfproto {proto} {kw} daddr {} return", multicast(family)));
        script.push(format!("add rule {t} {chain} meta nfproto {proto} {kw} saddr . {kw} daddr & {mask} @{local} return"));
        script.push(format!("add rule {t} {chain} meta nfproto {proto} {kw} saddr @{pods} masquerade"));
        done.push(chain);
    }
}

/// The elements of an attachment as (set, element): each pod address in the `pods` set of its prefix length,
/// and (pod address, its subnet's address) in the `local` set.
fn nft_elements(ips: &[IpNet]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for ip in ips {
        let (pods, local, _) = nft_objects(ip);
        out.push((pods, ip.addr().to_string()));
        out.push((local, format!("{} . {}", ip.addr(), ip.trunc().addr())));
    }
    out.sort();
    out.dedup();
    out
}

/// One transaction adding the attachment's elements, tagged; in the usual case (table set up) nothing is
/// read or deleted, so the cost does not depend on the number of pods.
fn nft_setup(network: &str, container_id: &str, ips: &[IpNet]) -> Result<()> {
    let t = format!("inet {NFT_TABLE}");
    let tag = nft_tag(NFT_TAG_KIND, network, container_id);
    let mut elements = nftables::Script::new();
    for (set, element) in nft_elements(ips) {
        elements.push(format!("add element {t} {set} {{ {element} comment \"{tag}\" }}"));
    }
    if elements.apply().is_ok() {
        return Ok(());
    }
    let mut script = nftables::Script::new();
    nft_base(&mut script, ips);
    for line in elements.render().lines() {
        script.push(line);
    }
    script.apply().map_err(|f| f.to_error(&format!("setting up ipMasq for {container_id}")))
}

/// With the IPs: one transaction deleting exactly the attachment's elements ("add" first makes it succeed
/// when they are gone). Otherwise, or when the table is missing: the elements tagged for the attachment.
fn nft_teardown(network: &str, container_id: &str, ips: &[IpNet]) -> Result<()> {
    let t = format!("inet {NFT_TABLE}");
    if !ips.is_empty() {
        let mut script = nftables::Script::new();
        for (set, element) in nft_elements(ips) {
            script.push(format!("add element {t} {set} {{ {element} }}"));
            script.push(format!("delete element {t} {set} {{ {element} }}"));
        }
        if script.apply().is_ok() {
            return Ok(());
        }
    }
    let tag = nft_tag(NFT_TAG_KIND, network, container_id);
    nftables::delete_tagged(NFT_TABLE, |comment| comment == tag)
}

fn nft_gc(network: &str, valid: &BTreeSet<&str>) -> Result<()> {
    nftables::gc_tagged(NFT_TABLE, NFT_TAG_KIND, network, valid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reference_rules() {
        let comment = owner_comment("kubenet", "abc");
        let ips: Vec<IpNet> = vec!["10.22.0.5/24".parse().unwrap()];
        let rules: Vec<String> = iptables_chain_rules(Family::V4, &comment, &ips).unwrap().iter().map(Rule::render).collect();
        assert_eq!(
            rules,
            vec![
                r#"-d 10.22.0.0/24 -m comment --comment "name: \"kubenet\" id: \"abc\"" -j ACCEPT"#,
                r#"! -d 224.0.0.0/4 -m comment --comment "name: \"kubenet\" id: \"abc\"" -j MASQUERADE"#,
            ]
        );
        let jump = iptables_jump(&ips[0], &comment, "CNI-x").unwrap().render();
        assert_eq!(jump, r#"-s 10.22.0.5/32 -m comment --comment "name: \"kubenet\" id: \"abc\"" -j CNI-x"#);
        let v6: IpNet = "fd00::5/64".parse().unwrap();
        assert!(iptables_jump(&v6, &comment, "CNI-x").unwrap().render().starts_with("-s fd00::5/128 "));
    }

    #[test]
    fn bad_names_are_refused() {
        let ips: Vec<IpNet> = vec!["10.22.0.5/24".parse().unwrap()];
        assert!(setup(Backend::Iptables, "bad\"net", "c", &ips).is_err());
        assert!(teardown("net", "c d", &ips).is_err());
        assert!(gc("net/../x", &[]).is_err());
    }
}
