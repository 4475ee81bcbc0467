//! The iptables backend, in the reference portmap's layout (plugins v1.1.1), so that either plugin removes
//! the other's rules (all in table `nat`):
//!
//! ```text
//! PREROUTING, OUTPUT:   -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT
//! CNI-HOSTPORT-DNAT:    -p tcp -m comment --comment "dnat name: \"net\" id: \"cid\"" -m multiport --dports 8080,8081
//!                       <conditions> -j CNI-DN-<hash>          (per protocol, at most 15 ports per rule)
//! CNI-DN-<hash>:        -s <pod subnet> [-d hostIP] -p tcp -m tcp --dport 8080 -j CNI-HOSTPORT-SETMARK  (hairpin)
//!                       -s 127.0.0.1/32 [-d hostIP] -p tcp -m tcp --dport 8080 -j CNI-HOSTPORT-SETMARK (localhost, v4)
//!                       [-d hostIP] -p tcp -m tcp --dport 8080 -j DNAT --to-destination <pod IP>:80
//! CNI-HOSTPORT-SETMARK: -m comment --comment "CNI portfwd masquerade mark" -j MARK --set-xmark 0x2000/0x2000
//! POSTROUTING (first):  -m comment --comment "CNI portfwd requiring masquerade" -j CNI-HOSTPORT-MASQ
//! CNI-HOSTPORT-MASQ:    -m mark --mark 0x2000/0x2000 -j MASQUERADE
//! ```
//!
//! Each call is one `iptables-restore` per family. ADD first tries a transaction that needs no reading: it
//! checks (`-C`) that the shared chains and rules exist and creates the container's chain with `-N`, which
//! fails when the chain exists. When that fails (first pod, a repeated ADD, a change made meanwhile), the
//! nat table is read once and a complete transaction is computed from it. DEL does the same: it deletes exactly
//! the rules it would have made, else reads the table and deletes whatever jumps to the container's chain.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use cnicore::firewall::iptables::{self, AddrType, Rule, Script, Snapshot};
use cnicore::firewall::{chain_name, owner_comment, trim_comment, Family};
use cnicore::spec::{Error, Result};
use ipnet::IpNet;

use crate::config::{Config, PortMapping, Protocol};

pub const DNAT_CHAIN: &str = "CNI-HOSTPORT-DNAT";
pub const SETMARK_CHAIN: &str = "CNI-HOSTPORT-SETMARK";
pub const MASQ_CHAIN: &str = "CNI-HOSTPORT-MASQ";
const TABLE: &str = "nat";
/// multiport accepts at most 15 ports per rule.
const MULTIPORT_MAX: usize = 15;

/// The container's chain (`utils.MustFormatChainNameWithPrefix(name, id, "DN-")`).
pub fn dnat_chain(network: &str, container_id: &str) -> String {
    chain_name(network, container_id, "DN-")
}

/// The per-container SNAT chain of plugin versions before 0.7; still removed on DEL, as the reference does.
fn old_snat_chain(network: &str, container_id: &str) -> String {
    chain_name(network, container_id, "SN-")
}

fn toplevel_jump() -> Rule {
    Rule::new().dst_type(AddrType::Local).jump(DNAT_CHAIN)
}

fn setmark_rule(mark: u32) -> Rule {
    Rule::new().comment("CNI portfwd masquerade mark").set_xmark(mark, mark)
}

fn masq_rule(mark: u32) -> Rule {
    Rule::new().mark(mark, mark).jump("MASQUERADE")
}

fn masq_jump() -> Rule {
    Rule::new().comment("CNI portfwd requiring masquerade").jump(MASQ_CHAIN)
}

/// Everything one container needs in one family.
struct Plan {
    chain: String,
    /// Rules of the container chain, in order.
    rules: Vec<Rule>,
    /// Rules in CNI-HOSTPORT-DNAT jumping to the container chain.
    entries: Vec<Rule>,
    /// The shared SETMARK / MASQ rules, unless snat is off or an external mark chain is used.
    own_masq: bool,
}

impl Plan {
    fn new(config: &Config, container: &IpNet) -> Result<Plan> {
        let family = Family::of_net(container);
        let chain = dnat_chain(&config.network, &config.container_id);
        Ok(Plan {
            entries: entry_rules(config, family, &chain)?,
            rules: chain_rules(config, container)?,
            chain,
            own_masq: config.snat && config.external_set_mark_chain.is_none(),
        })
    }
}

/// The CNI-HOSTPORT-DNAT rules of the container: per protocol (sorted), the host ports of every mapping in
/// groups of 15, with the config's conditions of this family.
fn entry_rules(config: &Config, family: Family, chain: &str) -> Result<Vec<Rule>> {
    let comment = trim_comment(&format!("dnat {}", owner_comment(&config.network, &config.container_id)));
    let mut by_protocol: BTreeMap<Protocol, Vec<u16>> = BTreeMap::new();
    for mapping in &config.mappings {
        by_protocol.entry(mapping.protocol).or_default().push(mapping.host_port);
    }
    let mut rules = Vec::new();
    for (protocol, ports) in by_protocol {
        for group in ports.chunks(MULTIPORT_MAX) {
            let rule = Rule::new().protocol(protocol.as_str()).comment(&comment).dports(group);
            rules.push(config.conditions(family).apply_iptables(rule)?.jump(chain));
        }
    }
    Ok(rules)
}

/// The container chain's rules: for each mapping of this family, hairpin and localhost marks (with snat),
/// then the DNAT.
fn chain_rules(config: &Config, container: &IpNet) -> Result<Vec<Rule>> {
    let family = Family::of_net(container);
    let setmark = config.external_set_mark_chain.as_deref().unwrap_or(SETMARK_CHAIN);
    let mut rules = Vec::new();
    for mapping in config.mappings.iter().filter(|m| m.applies_to(family)) {
        let base = base_rule(mapping)?;
        if config.snat {
            let source = if config.masq_all { family.any_net() } else { *container };
            rules.push(base.clone().source(source, false)?.jump(setmark));
            if family == Family::V4 && !config.masq_all {
                let localhost: IpNet = "127.0.0.1/32".parse().expect("constant");
                rules.push(base.clone().source(localhost, false)?.jump(setmark));
            }
        }
        rules.push(base.dnat(SocketAddr::new(container.addr(), mapping.container_port)));
    }
    Ok(rules)
}

fn base_rule(mapping: &PortMapping) -> Result<Rule> {
    let mut rule = Rule::new();
    if let Some(ip) = mapping.host_destination() {
        rule = rule.destination(IpNet::from(ip), false)?;
    }
    Ok(rule.dport(mapping.protocol.as_str(), mapping.host_port))
}

/// ADD for one container address.
pub fn add(config: &Config, container: &IpNet) -> Result<()> {
    let family = Family::of_net(container);
    let plan = Plan::new(config, container)?;
    if fast_add_script(config, &plan).apply(family).is_ok() {
        return Ok(());
    }
    let what = format!("setting up port mappings for {}", container.addr());
    iptables::update(family, TABLE, &what, |snapshot, script| full_add_script(script, config, &plan, snapshot))
}

/// Checks the shared rules and creates the container chain without reading anything; fails when the state
/// is not the usual one.
fn fast_add_script(config: &Config, plan: &Plan) -> Script {
    let mut script = Script::new(TABLE);
    check_shared_rules(&mut script, config, plan);
    script.new_chain(&plan.chain);
    append_container_rules(&mut script, plan);
    script
}

/// Creates whatever is missing according to `snapshot` and replaces the container's chain and entries.
fn full_add_script(script: &mut Script, config: &Config, plan: &Plan, snapshot: &Snapshot) {
    if plan.own_masq {
        ensure_chain_with(script, snapshot, SETMARK_CHAIN, &setmark_rule(config.mark()));
        ensure_chain_with(script, snapshot, MASQ_CHAIN, &masq_rule(config.mark()));
        if !snapshot.has_rule("POSTROUTING", &masq_jump()) {
            // First in POSTROUTING, else the bridge's and ptp's masquerade rules would take the packets.
            script.insert("POSTROUTING", 1, &masq_jump());
        }
    }
    if !snapshot.has_chain(DNAT_CHAIN) {
        script.new_chain(DNAT_CHAIN);
    }
    for entry in ["PREROUTING", "OUTPUT"] {
        if !snapshot.has_rule(entry, &toplevel_jump()) {
            script.append(entry, &toplevel_jump());
        }
    }
    for (from, spec) in snapshot.jumps_to(&plan.chain) {
        script.delete_saved(from, spec);
    }
    if snapshot.has_chain(&plan.chain) {
        script.flush_chain(&plan.chain);
    } else {
        script.new_chain(&plan.chain);
    }
    append_container_rules(script, plan);
}

/// Checks (`-C`) the rules every container shares: the jumps into `CNI-HOSTPORT-DNAT` and, when this
/// plugin does the masquerading, the mark and masquerade chains.
fn check_shared_rules(script: &mut Script, config: &Config, plan: &Plan) {
    script.check("PREROUTING", &toplevel_jump()).check("OUTPUT", &toplevel_jump());
    if plan.own_masq {
        script
            .check(SETMARK_CHAIN, &setmark_rule(config.mark()))
            .check(MASQ_CHAIN, &masq_rule(config.mark()))
            .check("POSTROUTING", &masq_jump());
    }
}

/// The container's own rules: its chain's rules, and its entries in `CNI-HOSTPORT-DNAT`.
fn append_container_rules(script: &mut Script, plan: &Plan) {
    for rule in &plan.rules {
        script.append(&plan.chain, rule);
    }
    for rule in &plan.entries {
        script.append(DNAT_CHAIN, rule);
    }
}

fn ensure_chain_with(script: &mut Script, snapshot: &Snapshot, chain: &str, rule: &Rule) {
    if !snapshot.has_chain(chain) {
        script.new_chain(chain);
    }
    if !snapshot.has_rule(chain, rule) {
        script.append(chain, rule);
    }
}

/// CHECK for one container address: every rule the container needs exists (compared by iptables itself).
pub fn check(config: &Config, container: &IpNet) -> Result<()> {
    let family = Family::of_net(container);
    let plan = Plan::new(config, container)?;
    let mut script = Script::new(TABLE);
    check_shared_rules(&mut script, config, &plan);
    for rule in &plan.rules {
        script.check(&plan.chain, rule);
    }
    for rule in &plan.entries {
        script.check(DNAT_CHAIN, rule);
    }
    script.apply(family).map_err(|failure| {
        Error::internal(format!(
            "port mapping rules of container {} for {} are missing or differ: {}",
            config.container_id,
            container.addr(),
            failure.describe()
        ))
    })
}

/// DEL in one family. `container` (from prevResult) lets the exact rules be deleted without reading.
pub fn del(config: &Config, family: Family, container: Option<&IpNet>) -> Result<()> {
    if !iptables::available(family) {
        return Ok(());
    }
    if let Some(container) = container.filter(|_| !config.mappings.is_empty()) {
        let plan = Plan::new(config, container)?;
        let mut script = Script::new(TABLE);
        for rule in &plan.entries {
            script.delete(DNAT_CHAIN, rule);
        }
        script.flush_chain(&plan.chain).delete_chain(&plan.chain);
        if script.apply(family).is_ok() {
            return Ok(());
        }
    }
    let chains =
        [dnat_chain(&config.network, &config.container_id), old_snat_chain(&config.network, &config.container_id)];
    iptables::cleanup(
        family,
        TABLE,
        &format!("removing port mappings of {}", config.container_id),
        |snapshot, script| {
            for chain in &chains {
                iptables::remove_chain(script, snapshot, chain);
            }
        },
    )
}

/// GC in one family: the chains of containers of this network that are not in `valid`.
pub fn gc(network: &str, valid: &std::collections::BTreeSet<&str>, family: Family) -> Result<()> {
    if !iptables::available(family) {
        return Ok(());
    }
    let owned =
        iptables::OwnedChains { table: TABLE, jumps_from: DNAT_CHAIN, comment_prefix: "dnat ", chain_of: dnat_chain };
    iptables::remove_stale_owners(family, &owned, network, valid, "port mapping garbage collection")
}

#[cfg(test)]
mod tests {
    use super::*;
    use cnicore::firewall::conditions::Conditions;
    use cnicore::firewall::Backend;

    pub(crate) fn config(mappings: Vec<PortMapping>) -> Config {
        Config {
            network: "kubenet".into(),
            container_id: "abc123".into(),
            backend: Backend::Iptables,
            snat: true,
            masq_all: false,
            mark_bit: 13,
            external_set_mark_chain: None,
            conditions_v4: Conditions::none(Family::V4),
            conditions_v6: Conditions::none(Family::V6),
            mappings,
        }
    }

    fn mapping(host: u16, container: u16, protocol: Protocol, host_ip: Option<&str>) -> PortMapping {
        PortMapping {
            host_port: host,
            container_port: container,
            protocol,
            host_ip: host_ip.map(|h| h.parse().unwrap()),
        }
    }

    /// The exact lines /usr/lib/cni/portmap v1.1.1 made for this config (iptables-save output).
    #[test]
    fn same_rules_as_the_reference() {
        let config = config(vec![
            mapping(8080, 80, Protocol::Tcp, None),
            mapping(8081, 81, Protocol::Udp, Some("10.1.0.1")),
            mapping(9090, 90, Protocol::Tcp, Some("fd00::1")),
        ]);
        let v4 = Plan::new(&config, &"10.22.0.5/24".parse().unwrap()).unwrap();
        assert_eq!(v4.chain, "CNI-DN-1e9a72e06b657088b0269");
        let rendered: Vec<String> = v4.rules.iter().map(Rule::render).collect();
        assert_eq!(
            rendered,
            vec![
                "-s 10.22.0.0/24 -p tcp -m tcp --dport 8080 -j CNI-HOSTPORT-SETMARK",
                "-s 127.0.0.1/32 -p tcp -m tcp --dport 8080 -j CNI-HOSTPORT-SETMARK",
                "-p tcp -m tcp --dport 8080 -j DNAT --to-destination 10.22.0.5:80",
                "-s 10.22.0.0/24 -d 10.1.0.1/32 -p udp -m udp --dport 8081 -j CNI-HOSTPORT-SETMARK",
                "-s 127.0.0.1/32 -d 10.1.0.1/32 -p udp -m udp --dport 8081 -j CNI-HOSTPORT-SETMARK",
                "-d 10.1.0.1/32 -p udp -m udp --dport 8081 -j DNAT --to-destination 10.22.0.5:81",
            ]
        );
        let entries: Vec<String> = v4.entries.iter().map(Rule::render).collect();
        assert_eq!(
            entries,
            vec![
                r#"-p tcp -m comment --comment "dnat name: \"kubenet\" id: \"abc123\"" -m multiport --dports 8080,9090 -j CNI-DN-1e9a72e06b657088b0269"#,
                r#"-p udp -m comment --comment "dnat name: \"kubenet\" id: \"abc123\"" -m multiport --dports 8081 -j CNI-DN-1e9a72e06b657088b0269"#,
            ]
        );
        let v6 = Plan::new(&config, &"fd22::5/64".parse().unwrap()).unwrap();
        let rendered: Vec<String> = v6.rules.iter().map(Rule::render).collect();
        assert_eq!(
            rendered,
            vec![
                "-s fd22::/64 -p tcp -m tcp --dport 8080 -j CNI-HOSTPORT-SETMARK",
                "-p tcp -m tcp --dport 8080 -j DNAT --to-destination [fd22::5]:80",
                "-s fd22::/64 -d fd00::1/128 -p tcp -m tcp --dport 9090 -j CNI-HOSTPORT-SETMARK",
                "-d fd00::1/128 -p tcp -m tcp --dport 9090 -j DNAT --to-destination [fd22::5]:90",
            ]
        );
        assert_eq!(
            setmark_rule(0x2000).render(),
            r#"-m comment --comment "CNI portfwd masquerade mark" -j MARK --set-xmark 0x2000/0x2000"#
        );
        assert_eq!(masq_rule(0x2000).render(), "-m mark --mark 0x2000/0x2000 -j MASQUERADE");
        assert_eq!(
            masq_jump().render(),
            r#"-m comment --comment "CNI portfwd requiring masquerade" -j CNI-HOSTPORT-MASQ"#
        );
        assert_eq!(toplevel_jump().render(), "-m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT");
    }

    #[test]
    fn many_ports_are_split_by_fifteen() {
        let mappings = (1..=20).map(|p| mapping(1000 + p, 80, Protocol::Tcp, None)).collect();
        let plan = Plan::new(&config(mappings), &"10.22.0.5/24".parse().unwrap()).unwrap();
        assert_eq!(plan.entries.len(), 2);
        assert_eq!(plan.rules.len(), 60);
    }

    #[test]
    fn masq_all_and_external_chain() {
        let mut c = config(vec![mapping(8080, 80, Protocol::Tcp, None)]);
        c.masq_all = true;
        c.external_set_mark_chain = Some("KUBE-MARK-MASQ".into());
        let plan = Plan::new(&c, &"10.22.0.5/24".parse().unwrap()).unwrap();
        let rendered: Vec<String> = plan.rules.iter().map(Rule::render).collect();
        assert_eq!(rendered[0], "-p tcp -m tcp --dport 8080 -j KUBE-MARK-MASQ");
        assert_eq!(rendered.len(), 2);
        assert!(!plan.own_masq);
    }
}
