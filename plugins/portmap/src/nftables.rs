//! The nftables backend: one table of fixed chains and maps; a container is only map and set elements.
//!
//! ```text
//! table inet cni_portmap {
//!   map hostports4     { type inet_proto . inet_service : verdict }                        # tcp . 8080 : jump dnat4-any
//!   map hostip_ports4  { type ipv4_addr . inet_proto . inet_service : verdict }            # hostIP mappings
//!   map dnat4          { type inet_proto . inet_service : ipv4_addr . inet_service }       # tcp . 8080 : 10.22.0.5 . 80
//!   map hostip_dnat4   { type ipv4_addr . inet_proto . inet_service : ipv4_addr . inet_service }
//!   set masq_hairpin4_24 { type ipv4_addr . ipv4_addr . inet_proto . inet_service }        # one per client prefix:
//!                      #   <pod subnet address, 0.0.0.0 with masqAll (masq_hairpin4_0)> . <pod IP> . tcp . 80
//!   set masq_local4    { type ipv4_addr . inet_proto . inet_service }                      # <pod IP> . tcp . 80
//!   (the same for IPv6, without masq_local6: the reference maps no IPv6 localhost)
//!   chain hostports    { the four vmap lookups, hostIP maps first }
//!   chain prerouting   { type nat hook prerouting priority dstnat; fib daddr type local jump hostports }
//!   chain output       { type nat hook output priority -100;      fib daddr type local jump hostports }
//!   chain dnat4-<conditions hash, or "any">        { <conditionsV4> dnat ip to meta l4proto . th dport map @dnat4 }
//!   chain hostip-dnat4-<conditions hash, or "any"> { <conditionsV4> dnat ip to ip daddr . meta l4proto . th dport map @hostip_dnat4 }
//!   chain postrouting  { type nat hook postrouting priority srcnat;
//!                        ct status dnat ip saddr 127.0.0.1 ip daddr . meta l4proto . th dport @masq_local4 masquerade }
//!   chain masq-hairpin4-24 { type nat hook postrouting priority srcnat;
//!                        ct status dnat ip saddr & 255.255.255.0 . ip daddr . meta l4proto . th dport @masq_hairpin4_24 masquerade }
//! }
//! ```
//!
//! A packet costs two map lookups whatever the number of containers. ADD is one transaction adding elements
//! (a netlink batch, `nft -f -` when the table must be set up):
//! nothing is read and nothing deleted (deleting makes the kernel wait for an RCU grace period), and since no
//! chain is made per container, nft's own cache (it lists the table's chains and sets) does not grow with
//! the containers either. Each element carries the comment `pm-<net hash>-<attachment hash>`, by which DEL
//! without prevResult and GC find them. The masquerade decision is taken after DNAT (`ct status dnat`), from
//! the pod's address and port: the same traffic as the reference's mark rules (hairpin from the pod subnet,
//! or everything with masqAll; 127.0.0.1 with snat), so `markMasqBit` has no use here and no mark is set.
//! Conditions (`conditionsV4`/`V6`) select the DNAT chain, one per distinct set of conditions.
//!
//! A host port still mapped to another container (one whose DEL never came) is taken over by the newest
//! container; DEL removes only elements whose value is its own.

use std::collections::BTreeSet;

use cnicore::firewall::nftables::{self, Datum, Element, MapValue, Script};
use cnicore::firewall::{hex_sha512, nft_tag, Family};
use cnicore::spec::{Error, Result};
use ipnet::IpNet;

use crate::config::{Config, PortMapping};

pub const TABLE: &str = "cni_portmap";
/// Elements are tagged (commented) `pm-<net hash>-<attachment hash>`.
const TAG_KIND: &str = "pm";

fn tag(config: &Config) -> String {
    nft_tag(TAG_KIND, &config.network, &config.container_id)
}

/// The DNAT chains of the config's conditions for `family`: (wildcard chain, hostIP chain).
fn dnat_chains(config: &Config, family: Family) -> Result<(String, String)> {
    let conditions = config.conditions(family).nft()?;
    let profile = if conditions.is_empty() { "any".to_string() } else { hex_sha512(&conditions)[..12].to_string() };
    let v = family.digit();
    Ok((format!("dnat{v}-{profile}"), format!("hostip-dnat{v}-{profile}")))
}

/// The elements of the container: per address and mapping of its family, the lookup, the DNAT target and
/// (with snat) the masquerade entries.
fn elements(config: &Config, containers: &[IpNet]) -> Result<Vec<Element>> {
    let mut out = Vec::new();
    for container in containers {
        let family = Family::of_net(container);
        let v = family.digit();
        let (wildcard_chain, hostip_chain) = dnat_chains(config, family)?;
        for mapping in config.mappings.iter().filter(|m| m.applies_to(family)) {
            out.extend(mapping_elements(config, container, mapping, v, &wildcard_chain, &hostip_chain));
        }
    }
    Ok(out)
}

fn mapping_elements(
    config: &Config,
    container: &IpNet,
    m: &PortMapping,
    v: &str,
    wildcard_chain: &str,
    hostip_chain: &str,
) -> Vec<Element> {
    let family = Family::of_net(container);
    let proto = Datum::Proto { number: m.protocol.number(), name: m.protocol.as_str() };
    let pod = Datum::Addr(container.addr());
    let target = Some(MapValue::Data(vec![pod.clone(), Datum::Port(m.container_port)]));
    let tag = tag(config);
    let element = |set: String, key: Vec<Datum>, value: Option<MapValue>| Element::new(set, key, value).tagged(&tag);
    let mut out = match m.host_destination() {
        Some(host) => {
            let key = vec![Datum::Addr(host), proto.clone(), Datum::Port(m.host_port)];
            vec![
                element(format!("hostip_ports{v}"), key.clone(), Some(MapValue::Jump(hostip_chain.to_string()))),
                element(format!("hostip_dnat{v}"), key, target),
            ]
        }
        None => {
            let key = vec![proto.clone(), Datum::Port(m.host_port)];
            vec![
                element(format!("hostports{v}"), key.clone(), Some(MapValue::Jump(wildcard_chain.to_string()))),
                element(format!("dnat{v}"), key, target),
            ]
        }
    };
    if config.snat {
        let clients = hairpin_clients(config, container);
        let pod_port = vec![pod, proto, Datum::Port(m.container_port)];
        let mut hairpin = vec![Datum::Addr(clients.addr())];
        hairpin.extend(pod_port.iter().cloned());
        out.push(element(hairpin_set(&clients), hairpin, None));
        if family == Family::V4 && !config.masq_all {
            out.push(element("masq_local4".into(), pod_port, None));
        }
    }
    out
}

/// The clients whose connections to the container are masqueraded: its subnet (hairpin), or everyone with
/// masqAll.
fn hairpin_clients(config: &Config, container: &IpNet) -> IpNet {
    if config.masq_all {
        Family::of_net(container).any_net()
    } else {
        container.trunc()
    }
}

/// Hairpin entries are kept per family and client prefix length, in plain hash sets looked up with the
/// client address masked (`ip saddr & 255.255.255.0 . ip daddr . ...`): interval sets would also do, but
/// deleting from them costs time proportional to their size.
fn hairpin_set(clients: &IpNet) -> String {
    format!("masq_hairpin{}_{}", Family::of_net(clients).digit(), clients.prefix_len())
}

/// The set and the postrouting chain masquerading one client prefix length (created or refreshed).
fn hairpin_objects(script: &mut Script, clients: &IpNet) {
    let t = format!("inet {TABLE}");
    let family = Family::of_net(clients);
    let (addr, ip, proto) = (family.nft_addr_type(), family.nft_keyword(), family.nfproto());
    let set = hairpin_set(clients);
    let chain = set.replace('_', "-");
    script.push(format!("add set {t} {set} {{ type {addr} . {addr} . inet_proto . inet_service ; }}"));
    script.push(format!("add chain {t} {chain} {{ type nat hook postrouting priority srcnat ; }}"));
    script.push(format!("flush chain {t} {chain}"));
    script.push(format!(
        "add rule {t} {chain} ct status dnat meta nfproto {proto} {ip} saddr & {} . {ip} daddr . meta l4proto . th dport @{set} masquerade",
        clients.netmask()
    ));
}

/// Table, maps, sets and fixed chains, and the config's DNAT and hairpin chains: created or refreshed (the
/// chains are rewritten, so this deletes rules and is only used when the usual transaction failed).
fn base(script: &mut Script, config: &Config, containers: &[IpNet]) -> Result<()> {
    let t = format!("inet {TABLE}");
    script.push(format!("add table {t}"));
    for family in [Family::V4, Family::V6] {
        let (v, addr) = (family.digit(), family.nft_addr_type());
        script.push(format!("add map {t} hostports{v} {{ type inet_proto . inet_service : verdict ; }}"));
        script.push(format!("add map {t} hostip_ports{v} {{ type {addr} . inet_proto . inet_service : verdict ; }}"));
        script.push(format!("add map {t} dnat{v} {{ type inet_proto . inet_service : {addr} . inet_service ; }}"));
        script.push(format!(
            "add map {t} hostip_dnat{v} {{ type {addr} . inet_proto . inet_service : {addr} . inet_service ; }}"
        ));
    }
    script.push(format!("add set {t} masq_local4 {{ type ipv4_addr . inet_proto . inet_service ; }}"));

    script.push(format!("add chain {t} hostports"));
    script.push(format!("flush chain {t} hostports"));
    for family in [Family::V4, Family::V6] {
        let (v, ip, proto) = (family.digit(), family.nft_keyword(), family.nfproto());
        script.push(format!(
            "add rule {t} hostports meta nfproto {proto} {ip} daddr . meta l4proto . th dport vmap @hostip_ports{v}"
        ));
    }
    for family in [Family::V4, Family::V6] {
        let (v, proto) = (family.digit(), family.nfproto());
        script.push(format!("add rule {t} hostports meta nfproto {proto} meta l4proto . th dport vmap @hostports{v}"));
    }
    for hook in ["prerouting", "output"] {
        script.push(format!("add chain {t} {hook} {{ type nat hook {hook} priority -100 ; }}"));
        script.push(format!("flush chain {t} {hook}"));
        script.push(format!("add rule {t} {hook} fib daddr type local jump hostports"));
    }
    script.push(format!("add chain {t} postrouting {{ type nat hook postrouting priority srcnat ; }}"));
    script.push(format!("flush chain {t} postrouting"));
    script.push(format!(
        "add rule {t} postrouting ct status dnat meta nfproto ipv4 ip saddr 127.0.0.1 ip daddr . meta l4proto . th dport @masq_local4 masquerade"
    ));

    for family in [Family::V4, Family::V6] {
        let (v, ip, proto) = (family.digit(), family.nft_keyword(), family.nfproto());
        let conditions = config.conditions(family).nft()?;
        let (wildcard_chain, hostip_chain) = dnat_chains(config, family)?;
        for (chain, rule) in [
            (wildcard_chain, format!("dnat {ip} to meta l4proto . th dport map @dnat{v}")),
            (hostip_chain, format!("dnat {ip} to {ip} daddr . meta l4proto . th dport map @hostip_dnat{v}")),
        ] {
            script.push(format!("add chain {t} {chain}"));
            script.push(format!("flush chain {t} {chain}"));
            script.push(format!("add rule {t} {chain} meta nfproto {proto}{conditions} {rule}"));
        }
    }
    if config.snat {
        let mut done = Vec::new();
        for container in containers {
            let clients = hairpin_clients(config, container);
            if !done.contains(&hairpin_set(&clients)) {
                hairpin_objects(script, &clients);
                done.push(hairpin_set(&clients));
            }
        }
    }
    Ok(())
}

/// ADD for all the container's addresses, in one transaction.
///
/// The usual case is one transaction of `add element` commands; it fails when the table or the config's
/// DNAT chains are not set up, or when a host port belongs to another container. Then the table is
/// (re)built in the same transaction, and if a host port is still taken, its elements are taken over.
pub fn add(config: &Config, containers: &[IpNet]) -> Result<()> {
    let t = format!("inet {TABLE}");
    let tag = tag(config);
    let wanted = elements(config, containers)?;
    if nftables::add_elements(TABLE, &wanted) {
        return Ok(());
    }
    let adds = nftables::add_script(TABLE, &wanted);
    let mut script = Script::new();
    base(&mut script, config, containers)?;
    for line in adds.render().lines() {
        script.push(line);
    }
    if script.apply().is_ok() {
        return Ok(());
    }
    // A host port of another container (whose DEL never came): the newest container takes it over.
    let mut retry = Script::new();
    for present in nftables::table_elements(TABLE)?.unwrap_or_default() {
        let taken = wanted.iter().any(|w| w.value.is_some() && present.is_key_of(w));
        if taken && present.comment.as_deref() != Some(tag.as_str()) {
            retry.push(format!("delete element {t} {} {{ {} }}", present.set, present.key));
        }
    }
    for line in script.render().lines() {
        retry.push(line);
    }
    retry.apply().map_err(|f| f.to_error(&format!("setting up port mappings of {}", config.container_id)))
}

/// DEL. With the mappings and addresses known: one transaction (over netlink) deleting exactly the
/// container's elements — each is first added with the container's own value, which fails (and falls back)
/// when another container owns the key, and makes the delete succeed when the element is already gone.
/// Otherwise: the elements tagged for the container.
pub fn del(config: &Config, containers: Option<&[IpNet]>) -> Result<()> {
    if let Some(containers) = containers.filter(|c| !c.is_empty() && !config.mappings.is_empty()) {
        if nftables::remove_elements(TABLE, &elements(config, containers)?) {
            return Ok(());
        }
    }
    let tag = tag(config);
    nftables::delete_tagged(TABLE, |comment| comment == tag)
}

/// CHECK: every element of the container is present, with its value.
pub fn check(config: &Config, containers: &[IpNet]) -> Result<()> {
    let missing = |what: String| Error::internal(format!("port mappings of container {}: {what}", config.container_id));
    let present = nftables::table_elements(TABLE)?.ok_or_else(|| missing(format!("table inet {TABLE} not found")))?;
    for element in elements(config, containers)? {
        let found = present.iter().any(|p| p.is_key_of(&element) && p.value == element.value_text());
        if !found {
            return Err(missing(format!(
                "{} {} not found in {}",
                element.key_text(),
                element.value_text().unwrap_or_default(),
                element.set
            )));
        }
    }
    Ok(())
}

/// GC: the elements of containers of `network` that are not in `valid`.
pub fn gc(network: &str, valid: &BTreeSet<&str>) -> Result<()> {
    nftables::gc_tagged(TABLE, TAG_KIND, network, valid)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Protocol;
    use cnicore::firewall::conditions::Conditions;
    use cnicore::firewall::Backend;

    fn config() -> Config {
        let tokens = vec!["!".to_string(), "-s".to_string(), "192.0.2.0/24".to_string()];
        Config {
            network: "kubenet".into(),
            container_id: "abc".into(),
            backend: Backend::Nftables,
            snat: true,
            masq_all: false,
            mark_bit: 13,
            external_set_mark_chain: None,
            conditions_v4: Conditions::parse("conditionsV4", Family::V4, &tokens).unwrap(),
            conditions_v6: Conditions::none(Family::V6),
            mappings: vec![
                PortMapping { host_port: 8080, container_port: 80, protocol: Protocol::Tcp, host_ip: None },
                PortMapping {
                    host_port: 53,
                    container_port: 5353,
                    protocol: Protocol::Udp,
                    host_ip: Some("10.1.0.1".parse().unwrap()),
                },
            ],
        }
    }

    #[test]
    fn elements_of_a_container() {
        let c = config();
        let (v4_chain, _) = dnat_chains(&c, Family::V4).unwrap();
        assert!(v4_chain.starts_with("dnat4-") && v4_chain != "dnat4-any");
        assert_eq!(dnat_chains(&c, Family::V6).unwrap().0, "dnat6-any");
        let t = tag(&c);
        let got: Vec<String> = elements(&c, &["10.22.0.5/24".parse().unwrap(), "fd22::5/64".parse().unwrap()])
            .unwrap()
            .iter()
            .map(|e| format!("{} {}", e.set, e.render(true)))
            .collect();
        let want = vec![
            format!("hostports4 tcp . 8080 comment \"{t}\" : jump {v4_chain}"),
            format!("dnat4 tcp . 8080 comment \"{t}\" : 10.22.0.5 . 80"),
            format!("masq_hairpin4_24 10.22.0.0 . 10.22.0.5 . tcp . 80 comment \"{t}\""),
            format!("masq_local4 10.22.0.5 . tcp . 80 comment \"{t}\""),
            format!("hostip_ports4 10.1.0.1 . udp . 53 comment \"{t}\" : jump hostip-{v4_chain}"),
            format!("hostip_dnat4 10.1.0.1 . udp . 53 comment \"{t}\" : 10.22.0.5 . 5353"),
            format!("masq_hairpin4_24 10.22.0.0 . 10.22.0.5 . udp . 5353 comment \"{t}\""),
            format!("masq_local4 10.22.0.5 . udp . 5353 comment \"{t}\""),
            format!("hostports6 tcp . 8080 comment \"{t}\" : jump dnat6-any"),
            format!("dnat6 tcp . 8080 comment \"{t}\" : fd22::5 . 80"),
            format!("masq_hairpin6_64 fd22:: . fd22::5 . tcp . 80 comment \"{t}\""),
        ];
        assert_eq!(got, want);
        assert!(tag(&c).starts_with("pm-"));
    }
}
