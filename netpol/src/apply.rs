//! The plan into the kernel, one nf_tables transaction per change.
//!
//! - [`replace`]: the whole table, atomically: `add table` (so that the delete cannot fail), `delete table`,
//!   then the new table with its chains, sets, elements and rules, in ONE batch. The kernel switches from
//!   the old generation to the new one at commit: there is no moment with no rules (open) or with the
//!   new table half-filled (deny-all for allowed flows). Used at start (the state of an earlier run, or
//!   none) and when the base chain `forward` or the node's `local4`/`local6` sets it reads change.
//! - [`update`]: when only set elements differ (a pod coming, going, changing its labels or addresses; a
//!   namespace's labels), the elements deleted and added, in one batch; the rules are not touched. When the
//!   policies changed (a policy added, changed or deleted), still one batch: the `ingress` and `egress`
//!   chains flushed and written again, the sets no rule needs any more deleted, new ones created, the others
//!   changed by their elements (an interval set whose ranges changed is made again whole; at 1,000 pods, the
//!   16,000 elements of the unchanged sets are not sent again, as a whole-table replacement would).
//! - [`validate`]: whether the kernel would take a plan as the whole table, nothing committed (`nft --check`):
//!   how the agent finds a policy the kernel refuses.
//! - [`remove`]: the table deleted (cleanup); nothing else of the node is touched. [`exists`]: whether the
//!   table is there (one table dump, no transaction).

use cnicore::firewall::nfnl::{self, BatchError};

use crate::nft::Transaction;
use crate::plan::{Chain, Plan, Rule, Set, SetKind, Verdict};

/// What a change did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// The table was replaced (this many messages).
    Replaced(usize),
    /// Set elements changed (this many messages).
    Elements(usize),
    /// The policy chains written again, with the sets they need (this many messages).
    Rules(usize),
    Unchanged,
}

/// Replaces the whole table with `plan` in one transaction.
pub fn replace(table: &str, plan: &Plan) -> Result<Applied, BatchError> {
    let tx = replacement(table, plan);
    let count = tx.len();
    tx.commit()?;
    Ok(Applied::Replaced(count))
}

/// Whether the kernel would take `plan` as the whole table: [`replace`]'s transaction checked and aborted,
/// the table untouched.
pub fn validate(table: &str, plan: &Plan) -> Result<(), BatchError> {
    replacement(table, plan).validate()
}

/// [`replace`]'s transaction.
fn replacement(table: &str, plan: &Plan) -> Transaction {
    let mut tx = Transaction::new(table);
    tx.add_table().delete_table().add_table();
    for chain in Chain::ALL {
        tx.add_chain(chain);
    }
    for (name, set) in &plan.sets {
        tx.add_set(name, set).add_elements(name, &set.elements);
    }
    // The regular chains first: the base chain jumps to them, and from its first rule on it is in force.
    for chain in [Chain::Ingress, Chain::Egress, Chain::Forward] {
        add_rules(&mut tx, plan, chain);
    }
    tx
}

/// The rules of `chain`. In a test build, `CNI_FAILPOINT=netpol/kernel-refuses:NAMESPACE/NAME` adds after each
/// rule written for that policy one the kernel refuses (a jump to the base chain: EOPNOTSUPP), so that a test
/// sees what a policy the kernel cannot take does to the agent.
fn add_rules(tx: &mut Transaction, plan: &Plan, chain: Chain) {
    let refused = cnicore::failpoint::argument("netpol/kernel-refuses:").map(|name| format!("policy {name} "));
    for (index, rule) in plan.rules(chain).iter().enumerate() {
        tx.add_rule(chain, rule);
        // Outside that test, no provenance is read here: this runs for every rule of every change.
        let Some(prefix) = &refused else { continue };
        if plan.provenance.of_rule(chain, index).iter().any(|origin| origin.starts_with(prefix.as_str())) {
            tx.add_rule(chain, &Rule { family: None, matches: Vec::new(), verdict: Verdict::Jump(Chain::Forward) });
        }
    }
}

/// Goes from `old` (what the kernel holds) to `new`: element differences when the rules are the same, else
/// [`replace`].
pub fn update(table: &str, old: &Plan, new: &Plan) -> Result<Applied, BatchError> {
    if old.same_shape(new) {
        let mut tx = Transaction::new(table);
        element_changes(&mut tx, old, new);
        if tx.is_empty() {
            return Ok(Applied::Unchanged);
        }
        let count = tx.len();
        tx.commit()?;
        return Ok(Applied::Elements(count));
    }
    // The base chain and the sets it reads never change with the policies; if they did, the whole table.
    let fixed = |plan: &Plan| {
        (plan.rules(Chain::Forward).to_vec(), plan.sets.get("local4").cloned(), plan.sets.get("local6").cloned())
    };
    if fixed(old) != fixed(new) {
        return replace(table, new);
    }
    let mut tx = Transaction::new(table);
    tx.flush_chain(Chain::Ingress).flush_chain(Chain::Egress);
    for (name, set) in &old.sets {
        if !new.sets.get(name).is_some_and(|n| keeps(set, n)) {
            tx.delete_set(name);
        }
    }
    for (name, set) in &new.sets {
        if !old.sets.get(name).is_some_and(|o| keeps(o, set)) {
            tx.add_set(name, set).add_elements(name, &set.elements);
        }
    }
    element_changes(&mut tx, old, new);
    for chain in [Chain::Ingress, Chain::Egress] {
        add_rules(&mut tx, new, chain);
    }
    let count = tx.len();
    tx.commit()?;
    Ok(Applied::Rules(count))
}

/// True when a set can stay as it is, changed by its elements only: same family and kind, and for interval
/// sets the same elements (their ranges are replaced with the set).
fn keeps(old: &Set, new: &Set) -> bool {
    old.family == new.family && old.kind == new.kind && (old.kind != SetKind::Ranges || old.elements == new.elements)
}

/// The element differences of the sets both plans keep ([`keeps`]).
fn element_changes(tx: &mut Transaction, old: &Plan, new: &Plan) {
    for (name, set) in &new.sets {
        let Some(before) = old.sets.get(name).filter(|o| keeps(o, set)) else { continue };
        let gone: Vec<_> = before.elements.difference(&set.elements).collect();
        let came: Vec<_> = set.elements.difference(&before.elements).collect();
        if !gone.is_empty() {
            tx.delete_elements(name, gone);
        }
        if !came.is_empty() {
            tx.add_elements(name, came);
        }
    }
}

/// Deletes the table (nothing when it is not there).
pub fn remove(table: &str) -> Result<(), BatchError> {
    let mut tx = Transaction::new(table);
    tx.add_table().delete_table();
    tx.commit()
}

/// True when the table exists in this namespace.
pub fn exists(table: &str) -> std::io::Result<bool> {
    nfnl::table_exists("inet", table)
}
