//! The iptables backend, in the reference firewall plugin's layout (plugins v1.1.1, unchanged up to v1.9), so
//! that either plugin removes the other's rules (all in table `filter`):
//!
//! ```text
//! FORWARD (first):       -m comment --comment "CNI firewall plugin rules" -j CNI-FORWARD
//! CNI-FORWARD (first):   -m comment --comment "CNI firewall plugin admin overrides" -j CNI-ADMIN
//! CNI-FORWARD:           -d <ip>/32 -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT      (per address)
//!                        -s <ip>/32 -j ACCEPT
//! ingressPolicy same-bridge, per bridge (comment "CNI firewall plugin rules (ingressPolicy: same-bridge)"):
//! FORWARD (first):       -m comment --comment ... -j CNI-ISOLATION-STAGE-1
//! CNI-ISOLATION-STAGE-1: -i <br> ! -o <br> -m comment --comment ... -j CNI-ISOLATION-STAGE-2   (before RETURN)
//!                        -m comment --comment ... -j RETURN                                    (last)
//! CNI-ISOLATION-STAGE-2: -o <br> -m comment --comment ... -j DROP                              (before RETURN)
//!                        -m comment --comment ... -j RETURN                                    (last)
//! ingressPolicy isolated (v1.7): the same, and first in CNI-ISOLATION-STAGE-1
//!                        -i <br> -o <br> -m comment --comment "CNI firewall plugin rules (ingressPolicy: isolated)" -j DROP
//! ```
//!
//! `CNI-ADMIN` (or `iptablesAdminChainName`) belongs to the administrator: created when missing, never changed.
//! The isolation rules are per bridge and shared by its containers, so DEL leaves them, as the reference does,
//! except the `isolated` drop, which goes with the last attachment whose record asks for it.
//! The `isolated` drop's comment is ours: the reference's text was not available to read (its tests match
//! the rule by `-i <br> -o <br>` and `-j DROP`), and no call of either plugin depends on it.
//!
//! Each call is one `iptables-save -t filter` and one `iptables-restore --noflush` per family. DEL with the
//! addresses first tries deleting exactly the container's rules without reading.

use cnicore::firewall::iptables::{self, CtState, Rule, Script, Snapshot};
use cnicore::firewall::{families_of, Backend as Kernel, Family};
use cnicore::spec::{report_rollback, Error, Errors, Result};
use ipnet::IpNet;

use crate::config::{Backend, Config, Isolation};
use crate::driver::{kernel_status, Driver, KernelDriver};

pub const FORWARD_CHAIN: &str = "CNI-FORWARD";
pub const STAGE1_CHAIN: &str = "CNI-ISOLATION-STAGE-1";
pub const STAGE2_CHAIN: &str = "CNI-ISOLATION-STAGE-2";
const TABLE: &str = "filter";
const ISOLATION_COMMENT: &str = "CNI firewall plugin rules (ingressPolicy: same-bridge)";
const WITHIN_BRIDGE_COMMENT: &str = "CNI firewall plugin rules (ingressPolicy: isolated)";

fn forward_jump() -> Rule {
    Rule::new().comment("CNI firewall plugin rules").jump(FORWARD_CHAIN)
}

fn admin_jump(admin_chain: &str) -> Rule {
    Rule::new().comment("CNI firewall plugin admin overrides").jump(admin_chain)
}

/// The two rules of one container address (a host prefix).
pub fn address_rules(ip: &IpNet) -> Result<[Rule; 2]> {
    Ok([
        Rule::new().destination(*ip, false)?.ctstate(&[CtState::Related, CtState::Established]).jump("ACCEPT"),
        Rule::new().source(*ip, false)?.jump("ACCEPT"),
    ])
}

/// The isolation rules of one bridge: (chain, rule, goes first), in the order they are inserted (a later
/// "first" rule ends up before an earlier one); the RETURNs go last.
fn isolation_rules(isolation: &Isolation) -> Result<Vec<(&'static str, Rule, bool)>> {
    let bridge = isolation.bridge.as_str();
    let stage1 = Rule::new().in_interface(bridge, false)?.out_interface(bridge, true)?;
    let stage2 = Rule::new().out_interface(bridge, false)?;
    let ret = || Rule::new().comment(ISOLATION_COMMENT).jump("RETURN");
    let mut rules = vec![
        ("FORWARD", Rule::new().comment(ISOLATION_COMMENT).jump(STAGE1_CHAIN), true),
        (STAGE1_CHAIN, stage1.comment(ISOLATION_COMMENT).jump(STAGE2_CHAIN), true),
        (STAGE1_CHAIN, ret(), false),
        (STAGE2_CHAIN, stage2.comment(ISOLATION_COMMENT).jump("DROP"), true),
        (STAGE2_CHAIN, ret(), false),
    ];
    if isolation.within_bridge {
        rules.push((STAGE1_CHAIN, within_bridge_rule(bridge)?, true));
    }
    Ok(rules)
}

/// ingressPolicy isolated: the drop of the bridge's traffic to itself.
fn within_bridge_rule(bridge: &str) -> Result<Rule> {
    let rule = Rule::new().in_interface(bridge, false)?.out_interface(bridge, false)?;
    Ok(rule.comment(WITHIN_BRIDGE_COMMENT).jump("DROP"))
}

/// Everything one container needs in one family.
pub struct Plan {
    family: Family,
    admin_chain: String,
    /// The rules of `CNI-FORWARD` for the container's addresses of this family.
    rules: Vec<Rule>,
    /// The isolation rules of the bridge (ingressPolicy same-bridge or isolated): (chain, rule, goes first).
    isolation: Vec<(&'static str, Rule, bool)>,
}

impl Plan {
    pub fn new(config: &Config, family: Family, ips: &[IpNet], isolation: Option<&Isolation>) -> Result<Plan> {
        let mut rules = Vec::new();
        for ip in ips.iter().filter(|ip| Family::of_net(ip) == family) {
            rules.extend(address_rules(ip)?);
        }
        let isolation = match isolation {
            Some(isolation) => isolation_rules(isolation)?,
            None => Vec::new(),
        };
        Ok(Plan { family, admin_chain: config.admin_chain.clone(), rules, isolation })
    }

    /// The transaction that makes `snapshot` hold everything of the plan, adding only what is missing, in the
    /// reference's places (first in FORWARD, admin jump first in CNI-FORWARD, addresses appended).
    pub fn add_script(&self, snapshot: &Snapshot, script: &mut Script) {
        if !self.rules.is_empty() {
            for chain in [FORWARD_CHAIN, self.admin_chain.as_str()] {
                if !snapshot.has_chain(chain) {
                    script.new_chain(chain);
                }
            }
            if !snapshot.has_rule("FORWARD", &forward_jump()) {
                script.insert("FORWARD", 1, &forward_jump());
            }
            if !snapshot.has_rule(FORWARD_CHAIN, &admin_jump(&self.admin_chain)) {
                script.insert(FORWARD_CHAIN, 1, &admin_jump(&self.admin_chain));
            }
            for rule in self.rules.iter().filter(|rule| !snapshot.has_rule(FORWARD_CHAIN, rule)) {
                script.append(FORWARD_CHAIN, rule);
            }
        }
        if !self.isolation.is_empty() {
            // After the CNI-FORWARD jump, so that the STAGE-1 jump ends up before it, as in the reference.
            for chain in [STAGE1_CHAIN, STAGE2_CHAIN] {
                if !snapshot.has_chain(chain) {
                    script.new_chain(chain);
                }
            }
        }
        for (chain, rule, first) in &self.isolation {
            match (snapshot.has_rule(chain, rule), first) {
                (true, _) => {}
                (false, true) => {
                    script.insert(chain, 1, rule);
                }
                (false, false) => {
                    script.append(chain, rule);
                }
            }
        }
    }

    pub fn is_empty(&self) -> bool {
        self.rules.is_empty() && self.isolation.is_empty()
    }

    /// A transaction that fails unless every rule of the plan exists (`-C`, compared by iptables itself).
    pub fn check_script(&self) -> Script {
        let mut script = Script::new(TABLE);
        if !self.rules.is_empty() {
            script.check("FORWARD", &forward_jump()).check(FORWARD_CHAIN, &admin_jump(&self.admin_chain));
        }
        for rule in &self.rules {
            script.check(FORWARD_CHAIN, rule);
        }
        for (chain, rule, _) in &self.isolation {
            script.check(chain, rule);
        }
        script
    }
}

/// ADD in one family: one read of the table, one transaction adding what is missing.
fn add(plan: &Plan) -> Result<()> {
    if plan.is_empty() {
        return Ok(());
    }
    iptables::update(plan.family, TABLE, "adding firewall rules", |snapshot, script| plan.add_script(snapshot, script))
}

/// CHECK in one family.
fn check(plan: &Plan, container_id: &str) -> Result<()> {
    if plan.is_empty() {
        return Ok(());
    }
    plan.check_script().apply(plan.family).map_err(|failure| {
        Error::internal(format!(
            "firewall rules of container {container_id} are missing or differ: {}",
            failure.describe()
        ))
    })
}

/// Removes the rules of `ips` (this family's) from `CNI-FORWARD`, and with `drop_of` that bridge's `isolated`
/// drop, in one transaction when they are all there. Rules already gone are fine.
fn del(family: Family, ips: &[IpNet], drop_of: Option<&str>) -> Result<()> {
    let ips: Vec<IpNet> = ips.iter().filter(|ip| Family::of_net(ip) == family).copied().collect();
    if ips.is_empty() || !iptables::available(family) {
        return Ok(());
    }
    let mut rules = Vec::new();
    for ip in &ips {
        rules.extend(address_rules(ip)?.map(|rule| (FORWARD_CHAIN, rule)));
    }
    if let Some(bridge) = drop_of {
        rules.push((STAGE1_CHAIN, within_bridge_rule(bridge)?));
    }
    let mut exact = Script::new(TABLE);
    for (chain, rule) in &rules {
        exact.delete(chain, rule);
    }
    if exact.apply(family).is_ok() {
        return Ok(());
    }
    iptables::cleanup(family, TABLE, "removing firewall rules", |snapshot, script| {
        for (chain, rule) in &rules {
            let text = rule.render();
            // Every copy: an older plugin or a race may have added one twice.
            for _ in snapshot.rules(chain).filter(|spec| *spec == text) {
                script.delete(chain, rule);
            }
        }
    })
}

/// Removes the bridge's `isolated` drop (every copy); the same-bridge rules stay.
fn remove_within_bridge(family: Family, bridge: &str) -> Result<()> {
    if !iptables::available(family) {
        return Ok(());
    }
    let rule = within_bridge_rule(bridge)?;
    let text = rule.render();
    iptables::cleanup(family, TABLE, "removing the isolated drop of the bridge", |snapshot, script| {
        for _ in snapshot.rules(STAGE1_CHAIN).filter(|spec| *spec == text) {
            script.delete(STAGE1_CHAIN, &rule);
        }
    })
}

/// The iptables backend's driver.
pub struct Iptables;

impl Driver for Iptables {
    fn backend(&self) -> Backend {
        Backend::Iptables
    }

    /// One family after the other; a failed family undoes the ones before it.
    fn open(&mut self, config: &Config, ips: &[IpNet], isolation: Option<&Isolation>) -> Result<()> {
        let mut done: Vec<Family> = Vec::new();
        for family in families_of(ips) {
            if let Err(e) = Plan::new(config, family, ips, isolation).and_then(|plan| add(&plan)) {
                for family in done {
                    report_rollback("removing firewall rules", del(family, ips, None));
                }
                return Err(e);
            }
            done.push(family);
        }
        Ok(())
    }

    fn close(&mut self, _config: &Config, ips: &[IpNet], drop_of: Option<&str>) -> Result<()> {
        let mut errors = Errors::new();
        for family in [Family::V4, Family::V6] {
            errors.record(del(family, ips, drop_of));
        }
        errors.into_result()
    }

    fn check(&mut self, config: &Config, ips: &[IpNet], isolation: Option<&Isolation>) -> Result<()> {
        families_of(ips)
            .into_iter()
            .try_for_each(|family| check(&Plan::new(config, family, ips, isolation)?, &config.container_id))
    }

    fn status(&self) -> Result<()> {
        kernel_status(Kernel::Iptables)
    }
}

impl KernelDriver for Iptables {
    fn isolate(&self, config: &Config, ips: &[IpNet], isolation: &Isolation) -> Result<()> {
        families_of(ips).into_iter().try_for_each(|family| add(&Plan::new(config, family, &[], Some(isolation))?))
    }

    fn check_isolation(&self, config: &Config, ips: &[IpNet], isolation: &Isolation) -> Result<()> {
        families_of(ips)
            .into_iter()
            .try_for_each(|family| check(&Plan::new(config, family, &[], Some(isolation))?, &config.container_id))
    }

    fn remove_drop(&self, bridge: &str, ips: &[IpNet]) -> Result<()> {
        let mut errors = Errors::new();
        for family in families_of(ips) {
            errors.record(remove_within_bridge(family, bridge));
        }
        errors.into_result()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Backend;

    fn config() -> Config {
        Config {
            network: "podman".into(),
            container_id: "c1".into(),
            ifname: "eth0".into(),
            backend: Some(Backend::Iptables),
            admin_chain: "CNI-ADMIN".into(),
            zone: "trusted".into(),
            ingress_policy: crate::config::IngressPolicy::SameBridge,
            data_dir: "/tmp".into(),
        }
    }

    fn bridge(name: &str, within_bridge: bool) -> Option<Isolation> {
        Some(Isolation { bridge: name.into(), within_bridge })
    }

    fn ips() -> Vec<IpNet> {
        vec!["10.88.0.2/32".parse().unwrap(), "fd00::2/128".parse().unwrap()]
    }

    fn render(script: &Script) -> Vec<String> {
        script.render().lines().map(str::to_string).collect()
    }

    /// What /usr/lib/cni/firewall v1.1.1 leaves in an empty filter table (iptables-save), in our transaction.
    #[test]
    fn first_add_makes_the_reference_layout() {
        let plan = Plan::new(&config(), Family::V4, &ips(), bridge("cni-podman0", false).as_ref()).unwrap();
        let mut script = Script::new(TABLE);
        plan.add_script(&Snapshot::parse("*filter\n:FORWARD ACCEPT [0:0]\nCOMMIT\n", TABLE), &mut script);
        let c = r#""CNI firewall plugin rules (ingressPolicy: same-bridge)""#;
        assert_eq!(
            render(&script),
            vec![
                "*filter".to_string(),
                "-N CNI-FORWARD".into(),
                "-N CNI-ADMIN".into(),
                r#"-I FORWARD 1 -m comment --comment "CNI firewall plugin rules" -j CNI-FORWARD"#.into(),
                r#"-I CNI-FORWARD 1 -m comment --comment "CNI firewall plugin admin overrides" -j CNI-ADMIN"#.into(),
                "-A CNI-FORWARD -d 10.88.0.2/32 -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT".into(),
                "-A CNI-FORWARD -s 10.88.0.2/32 -j ACCEPT".into(),
                "-N CNI-ISOLATION-STAGE-1".into(),
                "-N CNI-ISOLATION-STAGE-2".into(),
                format!("-I FORWARD 1 -m comment --comment {c} -j CNI-ISOLATION-STAGE-1"),
                format!("-I CNI-ISOLATION-STAGE-1 1 -i cni-podman0 ! -o cni-podman0 -m comment --comment {c} -j CNI-ISOLATION-STAGE-2"),
                format!("-A CNI-ISOLATION-STAGE-1 -m comment --comment {c} -j RETURN"),
                format!("-I CNI-ISOLATION-STAGE-2 1 -o cni-podman0 -m comment --comment {c} -j DROP"),
                format!("-A CNI-ISOLATION-STAGE-2 -m comment --comment {c} -j RETURN"),
                "COMMIT".into(),
            ]
        );
    }

    /// The reference's own iptables-save output after its ADD (captured from v1.1.1): a repeated ADD, ours or
    /// theirs, adds nothing.
    #[test]
    fn add_over_the_reference_adds_nothing() {
        let saved = r#"*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:CNI-ADMIN - [0:0]
:CNI-FORWARD - [0:0]
:CNI-ISOLATION-STAGE-1 - [0:0]
:CNI-ISOLATION-STAGE-2 - [0:0]
-A FORWARD -m comment --comment "CNI firewall plugin rules (ingressPolicy: same-bridge)" -j CNI-ISOLATION-STAGE-1
-A FORWARD -m comment --comment "CNI firewall plugin rules" -j CNI-FORWARD
-A CNI-FORWARD -m comment --comment "CNI firewall plugin admin overrides" -j CNI-ADMIN
-A CNI-FORWARD -d fd00::2/128 -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
-A CNI-FORWARD -s fd00::2/128 -j ACCEPT
-A CNI-ISOLATION-STAGE-1 -i cni-podman0 ! -o cni-podman0 -m comment --comment "CNI firewall plugin rules (ingressPolicy: same-bridge)" -j CNI-ISOLATION-STAGE-2
-A CNI-ISOLATION-STAGE-1 -m comment --comment "CNI firewall plugin rules (ingressPolicy: same-bridge)" -j RETURN
-A CNI-ISOLATION-STAGE-2 -o cni-podman0 -m comment --comment "CNI firewall plugin rules (ingressPolicy: same-bridge)" -j DROP
-A CNI-ISOLATION-STAGE-2 -m comment --comment "CNI firewall plugin rules (ingressPolicy: same-bridge)" -j RETURN
COMMIT
"#;
        let plan = Plan::new(&config(), Family::V6, &ips(), bridge("cni-podman0", false).as_ref()).unwrap();
        let mut script = Script::new(TABLE);
        plan.add_script(&Snapshot::parse(saved, TABLE), &mut script);
        assert!(script.is_empty(), "{}", script.render());
        // A second bridge gets its rules before the RETURNs, and no second STAGE-1 jump.
        let plan = Plan::new(&config(), Family::V6, &ips(), bridge("cni-podman1", false).as_ref()).unwrap();
        let mut script = Script::new(TABLE);
        plan.add_script(&Snapshot::parse(saved, TABLE), &mut script);
        assert_eq!(render(&script).len(), 4, "{}", script.render());
        assert!(script.render().contains("-I CNI-ISOLATION-STAGE-1 1 -i cni-podman1 ! -o cni-podman1"));
    }

    #[test]
    fn open_policy_and_no_addresses() {
        let plan = Plan::new(&config(), Family::V4, &ips(), None).unwrap();
        assert!(plan.isolation.is_empty());
        assert_eq!(plan.rules.len(), 2);
        let check = plan.check_script().render();
        assert!(check.contains("-C CNI-FORWARD -s 10.88.0.2/32 -j ACCEPT"), "{check}");
        let none = Plan::new(&config(), Family::V4, &ips()[1..], None).unwrap();
        assert!(none.rules.is_empty());
    }

    /// ingressPolicy isolated: the same-bridge rules, and first in STAGE-1 a drop of the bridge's traffic to
    /// itself, added once and checked; a later same-bridge container on the bridge adds nothing.
    #[test]
    fn isolated_drops_within_the_bridge_first() {
        let plan = Plan::new(&config(), Family::V4, &ips(), bridge("cni-podman0", true).as_ref()).unwrap();
        let mut script = Script::new(TABLE);
        plan.add_script(&Snapshot::parse("*filter\n:FORWARD ACCEPT [0:0]\nCOMMIT\n", TABLE), &mut script);
        let lines = render(&script);
        let within = r#"-I CNI-ISOLATION-STAGE-1 1 -i cni-podman0 -o cni-podman0 -m comment --comment "CNI firewall plugin rules (ingressPolicy: isolated)" -j DROP"#;
        let across = "-I CNI-ISOLATION-STAGE-1 1 -i cni-podman0 ! -o cni-podman0";
        let at = |needle: &str| {
            lines.iter().position(|l| l.starts_with(needle)).unwrap_or_else(|| panic!("{needle}: {lines:?}"))
        };
        // Inserted after the across-bridges rule, so it ends up before it.
        assert!(at(across) < at(within), "{lines:?}");
        assert!(plan
            .check_script()
            .render()
            .contains(&within.replace("-I CNI-ISOLATION-STAGE-1 1", "-C CNI-ISOLATION-STAGE-1")));

        let saved = "*filter\n:FORWARD ACCEPT [0:0]\n:CNI-ISOLATION-STAGE-1 - [0:0]\n:CNI-ISOLATION-STAGE-2 - [0:0]\n\
            -A CNI-ISOLATION-STAGE-1 -i cni-podman0 -o cni-podman0 -m comment --comment \"CNI firewall plugin rules (ingressPolicy: isolated)\" -j DROP\n\
            COMMIT\n";
        let mut script = Script::new(TABLE);
        plan.add_script(&Snapshot::parse(saved, TABLE), &mut script);
        assert!(!script
            .render()
            .contains("-o cni-podman0 -m comment --comment \"CNI firewall plugin rules (ingressPolicy: isolated)\""));
        let same_bridge = Plan::new(&config(), Family::V4, &[], bridge("cni-podman0", false).as_ref()).unwrap();
        assert!(same_bridge.isolation.iter().all(|(_, rule, _)| !rule.render().contains("(ingressPolicy: isolated)")));
    }
}
