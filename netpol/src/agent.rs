//! The node agent's loop, fed by a source of cluster views: the table replaced at start, then each new view
//! compiled and applied as one transaction (element differences when only pods or labels changed).
//!
//! When the source fails (the API server lost, the file unreadable), the last rules stay in force: nothing
//! is applied until a new view arrives. Every tick the table's presence is checked, and a table deleted by
//! someone else is put back whole (drift repair). Stopping the agent (SIGTERM, a crash) leaves the table in
//! place, so a restart opens no window; only `cleanup` removes it.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::apply::{self, Applied};
use crate::compile::{compile, NodeOptions};
use crate::error::Error;
use crate::metrics::Metrics;
use crate::model::{Cluster, NetworkPolicy, PolicySpec};
use crate::plan::Plan;
use cnicore::firewall::nfnl::BatchError;

/// A JSON file holding a [`Cluster`], read again whenever its content changes (`--static`): the source of
/// [`Agent::run`]. The Kubernetes source ([`crate::watch::run`]) is event-driven and calls [`Agent::apply`] and
/// [`Agent::repair`] itself; the two share no trait, having no caller in common.
pub struct StaticFile {
    pub path: PathBuf,
    last: Option<Vec<u8>>,
}

impl StaticFile {
    pub fn new(path: PathBuf) -> StaticFile {
        StaticFile { path, last: None }
    }

    /// A new view when the file changed since the last call, `None` when it did not.
    pub fn poll(&mut self) -> Result<Option<Cluster>, Error> {
        let bytes = fs::read(&self.path).map_err(|error| Error::Read { path: self.path.clone(), error })?;
        if self.last.as_ref() == Some(&bytes) {
            return Ok(None);
        }
        let cluster =
            serde_json::from_slice(&bytes).map_err(|error| Error::Parse { path: self.path.clone(), error })?;
        self.last = Some(bytes);
        Ok(Some(cluster))
    }
}

/// The agent's state: what the kernel holds, and what was logged.
pub struct Agent {
    pub table: String,
    pub node: NodeOptions,
    applied: Option<Plan>,
    logged: BTreeSet<String>,
    source_failing: bool,
    /// A view whose transaction the kernel refused: tried again at each [`Agent::repair`].
    pending: Option<Cluster>,
    /// Policies whose rules the kernel refused, by id: the spec it refused and what is in force in its
    /// place, until the policy changes ([`Agent::apply`]).
    refused: BTreeMap<String, (PolicySpec, NetworkPolicy)>,
    /// What it did and holds (served on `--metrics-addr`).
    pub metrics: Arc<Metrics>,
    /// Told each view put in force (the drop log's directory, `explain`'s view: [`crate::verdicts`]).
    pub on_applied: Option<crate::verdicts::OnApplied>,
}

impl Agent {
    pub fn new(table: &str, node: NodeOptions) -> Agent {
        Agent {
            table: table.to_string(),
            node,
            applied: None,
            logged: BTreeSet::new(),
            source_failing: false,
            pending: None,
            refused: BTreeMap::new(),
            metrics: Arc::default(),
            on_applied: None,
        }
    }

    /// Compiles `cluster` and puts it in force: the whole table the first time, differences after. A policy
    /// whose rules the kernel refuses does not hold back the rest: it is put in force allowing nothing (its
    /// pods isolated by it, as kube-router fails a policy it cannot sync closed) until it changes, and the
    /// view applies without it. When the kernel refuses the view for another reason, nothing of it applies,
    /// the rules before it stay, and it is tried again at each [`Agent::repair`].
    pub fn apply(&mut self, cluster: &Cluster) -> Result<Applied, Error> {
        self.refused.retain(|id, (spec, _)| cluster.policies.iter().any(|p| p.id() == *id && p.spec == *spec));
        let view = self.in_place_of_refused(cluster);
        let mut applied = self.put_in_force(&view);
        if let Err(Error::Nftables { error: BatchError::Refused { .. }, .. }) = &applied {
            let found = self.refused_policies(&view);
            if !found.is_empty() {
                for (policy, error, in_place) in found {
                    let isolated = match in_place == policy.allowing_nothing() {
                        true => "the pods it selects are isolated by it and nothing is allowed by it",
                        false => "every pod of its namespace is isolated",
                    };
                    log!(
                        "policy {}: the kernel refuses its rules ({error}); until it changes, {isolated}",
                        policy.id()
                    );
                    self.refused.insert(policy.id(), (policy.spec, in_place));
                }
                applied = self.put_in_force(&self.in_place_of_refused(cluster));
            }
        }
        self.metrics.set_refused_policies(self.refused.len());
        self.pending = applied.is_err().then(|| cluster.clone());
        applied
    }

    /// `cluster` with each policy the kernel refused replaced by what is in force in its place.
    fn in_place_of_refused(&self, cluster: &Cluster) -> Cluster {
        let mut view = cluster.clone();
        for policy in &mut view.policies {
            if let Some((_, in_place)) = self.refused.get(&policy.id()) {
                *policy = in_place.clone();
            }
        }
        view
    }

    /// The policies of `view` the kernel refuses, each with its error and what can stand in its place: the
    /// policy allowing nothing, else (when that is refused too) its whole namespace isolated. Found with
    /// validated, never committed, transactions: the shortest refused prefix of the policies ends with a
    /// refused one (a binary search), which is replaced before the search goes on. Empty when the view is
    /// refused without any policy, or a policy's stand-ins are refused too: then no policy is to blame.
    fn refused_policies(&self, view: &Cluster) -> Vec<(NetworkPolicy, BatchError, NetworkPolicy)> {
        let mut trial = view.clone();
        let all = std::mem::take(&mut trial.policies);
        let mut validate = |policies: &[NetworkPolicy]| {
            trial.policies = policies.to_vec();
            apply::validate(&self.table, &compile(&trial, &self.node))
        };
        let mut policies = all.clone();
        let mut found = Vec::new();
        // A prefix of `policies` the kernel takes.
        let mut taken = 0;
        if validate(&[]).is_err() {
            return Vec::new();
        }
        while let Err(mut error) = validate(&policies) {
            // The shortest refused prefix lies in (taken, refused].
            let mut refused = policies.len();
            while refused - taken > 1 {
                let middle = (taken + refused) / 2;
                match validate(&policies[..middle]) {
                    Ok(()) => taken = middle,
                    Err(e) => (refused, error) = (middle, e),
                }
            }
            let policy = policies[refused - 1].clone();
            let stand_ins = [
                policy.allowing_nothing(),
                NetworkPolicy::unreadable(&policy.metadata.namespace, &policy.metadata.name),
            ];
            let Some(in_place) = stand_ins.into_iter().find(|stand_in| {
                policies[refused - 1] = stand_in.clone();
                validate(&policies[..refused]).is_ok()
            }) else {
                return Vec::new();
            };
            found.push((all[refused - 1].clone(), error, in_place));
            taken = refused;
        }
        found
    }

    /// Compiles `view` and applies it: the whole table the first time, differences after.
    fn put_in_force(&mut self, view: &Cluster) -> Result<Applied, Error> {
        let compiling = Instant::now();
        let plan = compile(view, &self.node);
        let compiled = compiling.elapsed();
        for warning in plan.warnings.difference(&self.logged) {
            log!("{warning}");
        }
        self.logged = plan.warnings.clone();
        let started = Instant::now();
        let applied = match &self.applied {
            None => apply::replace(&self.table, &plan),
            Some(old) => match apply::update(&self.table, old, &plan) {
                // Elements not as we left them (someone changed the table): the whole table again.
                Err(_) => apply::replace(&self.table, &plan),
                done => done,
            },
        };
        self.metrics.transaction(applied.as_ref().ok().copied(), started.elapsed());
        let applied = applied.map_err(|error| Error::Nftables { doing: "applying the plan", error })?;
        self.metrics.in_force(&plan);
        if applied != Applied::Unchanged {
            let (rules, elements) = plan.size();
            let took = started.elapsed();
            log!("{applied:?} in {took:?} (compiled in {compiled:?}): {rules} rules, {elements} set elements");
        }
        if let Some(on_applied) = self.on_applied.as_mut() {
            on_applied(view, &plan);
        }
        self.applied = Some(plan);
        Ok(applied)
    }

    /// One tick: a new view applied if there is one; the table put back if it disappeared.
    pub fn tick(&mut self, source: &mut StaticFile) -> Result<(), Error> {
        match source.poll() {
            Ok(Some(cluster)) => {
                self.source_failing = false;
                self.apply(&cluster)?;
            }
            Ok(None) => self.source_failing = false,
            Err(e) => {
                if !self.source_failing {
                    log!("{e}: keeping the rules in force");
                }
                self.source_failing = true;
            }
        }
        self.repair()
    }

    /// Tries again a view the kernel refused, and puts the table back whole when it has disappeared (someone
    /// ran `nft flush ruleset`, say).
    pub fn repair(&mut self) -> Result<(), Error> {
        if let Some(cluster) = self.pending.take() {
            self.apply(&cluster)?;
        }
        if let Some(plan) = &self.applied {
            if !apply::exists(&self.table).unwrap_or(true) {
                log!("table inet {} is gone: putting it back", self.table);
                let started = Instant::now();
                let replaced = apply::replace(&self.table, plan);
                self.metrics.transaction(replaced.as_ref().ok().copied(), started.elapsed());
                replaced.map_err(|error| Error::Nftables { doing: "repairing", error })?;
            }
        }
        Ok(())
    }

    /// Runs until killed.
    pub fn run(&mut self, source: &mut StaticFile, interval: Duration) -> Result<(), Error> {
        loop {
            if let Err(e) = self.tick(source) {
                log!("{e}");
            }
            std::thread::sleep(interval);
        }
    }
}

/// `net.bridge.bridge-nf-call-ip{,6}tables=1` in the agent's namespace, so that traffic between two pods of
/// one bridge (kubenet's cbr0, flannel's cni0) passes the inet forward hook. A node without br_netfilter
/// has no such files, and then no bridged traffic to miss.
pub fn ensure_bridge_netfilter() -> Result<(), Error> {
    for name in ["net/bridge/bridge-nf-call-iptables", "net/bridge/bridge-nf-call-ip6tables"] {
        match cnicore::sysctl::write_if_different(name, "1") {
            Ok(_) => {}
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            Err(error) => return Err(Error::BridgeNetfilter { name, error }),
        }
    }
    Ok(())
}
