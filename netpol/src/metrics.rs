//! The agent's metrics (prometheus-client) and its HTTP endpoints (`--metrics-addr`, off by default):
//! `/metrics` in the Prometheus text format, `/healthz` and `/readyz` as fabricd has them, on a thread of
//! their own (agent-http, on hyper), so that they answer while a transaction is being built.
//!
//! - What is in force: rules, sets and set elements of the table; the time of the last successful apply.
//! - Transactions by what they changed (the table replaced, elements, rules) or refused, and their duration;
//!   the policies the kernel refuses, in force allowing nothing.
//! - Time from an API event reaching the agent to the kernel holding its view (the watch only): the
//!   earliest event not yet in force to the commit of the transaction that put it in force. A view the kernel
//!   refused keeps its event's time for the next apply.
//! - Watch restarts and 410 Gone relists, by resource.
//! - Drops and accepts by policy: [`VerdictCounters`], read at each scrape from whoever counts them.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use agent_http::{Answer, BindError};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family as Labelled;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::apply::Applied;
use crate::plan::Plan;

/// Transaction durations: a few hundred microseconds for a pod's elements, up to a second for a whole table.
const TRANSACTION_BUCKETS: [f64; 12] = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5];
/// Event to kernel: the agent's 50 ms batching window and more; 0.25 s is the goal at p99.
const EVENT_BUCKETS: [f64; 16] =
    [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0];

/// What a transaction did: `replaced` (the whole table), `elements`, `rules`, or `refused` by the kernel.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

/// A watched resource: `pods`, `namespaces`, `networkpolicies`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResourceLabels {
    resource: String,
}

/// A rule's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Accept,
    Drop,
}

/// A policy's packets and bytes of one verdict, as the kernel counted them since the table was made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerdictCount {
    pub namespace: String,
    pub policy: String,
    pub verdict: Verdict,
    pub packets: u64,
    pub bytes: u64,
}

/// Where drops and accepts by policy come from (the table's rule counters): read at each scrape, on the
/// HTTP thread. Set with [`Metrics::count_verdicts`]; without one the two series are absent.
pub trait VerdictCounters: Send + Sync + 'static {
    fn read(&self) -> Vec<VerdictCount>;
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VerdictLabels {
    namespace: String,
    policy: String,
    verdict: &'static str,
}

/// A series of the verdict counts: its name, its help and its value of a count.
type Series = (&'static str, &'static str, fn(&VerdictCount) -> u64);

/// The collector of [`VerdictCounters`]: `cni_netpol_policy_packets_total` and `_bytes_total`.
#[derive(Default, Clone)]
struct Verdicts(Arc<Mutex<Option<Box<dyn VerdictCounters>>>>);

impl fmt::Debug for Verdicts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Verdicts")
    }
}

impl Collector for Verdicts {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), fmt::Error> {
        let counts = match self.0.lock().ok().and_then(|source| source.as_ref().map(|s| s.read())) {
            Some(counts) => counts,
            None => return Ok(()),
        };
        let series: [Series; 2] = [
            ("policy_packets", "Packets accepted or dropped by a policy's rules", |c| c.packets),
            ("policy_bytes", "Bytes accepted or dropped by a policy's rules", |c| c.bytes),
        ];
        for (name, help, value) in series {
            let mut family = encoder.encode_descriptor(name, help, None, ConstCounter::new(0u64).metric_type())?;
            for count in &counts {
                let verdict = if count.verdict == Verdict::Accept { "accept" } else { "drop" };
                let labels =
                    VerdictLabels { namespace: count.namespace.clone(), policy: count.policy.clone(), verdict };
                ConstCounter::new(value(count)).encode(family.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}

/// Every metric of the agent, and the state `/healthz` and `/readyz` answer from.
pub struct Metrics {
    registry: Registry,
    rules: Gauge,
    sets: Gauge,
    elements: Gauge,
    transactions: Labelled<ResultLabels, Counter>,
    transaction_seconds: Histogram,
    event_to_kernel_seconds: Histogram,
    watch_restarts: Labelled<ResourceLabels, Counter>,
    relists: Labelled<ResourceLabels, Counter>,
    last_apply: Gauge<f64, AtomicU64>,
    refused_policies: Gauge,
    verdicts: Verdicts,
    /// The kernel holds the latest view (the last apply succeeded).
    healthy: AtomicBool,
    /// A view was in force once.
    started: AtomicBool,
    /// The earliest API event whose view is not in force yet.
    unapplied_since: Mutex<Option<Instant>>,
}

impl Default for Metrics {
    fn default() -> Metrics {
        let mut registry = Registry::with_prefix("cni_netpol");
        let metrics = Metrics {
            rules: Gauge::default(),
            sets: Gauge::default(),
            elements: Gauge::default(),
            transactions: Labelled::default(),
            transaction_seconds: Histogram::new(TRANSACTION_BUCKETS),
            event_to_kernel_seconds: Histogram::new(EVENT_BUCKETS),
            watch_restarts: Labelled::default(),
            relists: Labelled::default(),
            last_apply: Gauge::default(),
            refused_policies: Gauge::default(),
            verdicts: Verdicts::default(),
            healthy: AtomicBool::new(false),
            started: AtomicBool::new(false),
            unapplied_since: Mutex::new(None),
            registry: Registry::default(),
        };
        registry.register("rules", "Rules of the table in force", metrics.rules.clone());
        registry.register("sets", "Sets of the table in force", metrics.sets.clone());
        registry.register("set_elements", "Set elements of the table in force", metrics.elements.clone());
        registry.register(
            "transactions",
            "nf_tables transactions by what they changed (replaced: the whole table), or refused",
            metrics.transactions.clone(),
        );
        registry.register(
            "transaction_duration_seconds",
            "Time to send a transaction and have the kernel's answer",
            metrics.transaction_seconds.clone(),
        );
        registry.register(
            "event_to_kernel_seconds",
            "Time from an API event reaching the agent to the kernel holding its view (batching, compile, transaction)",
            metrics.event_to_kernel_seconds.clone(),
        );
        let restarts = "Watches that failed and were started again (410 Gone included), by resource";
        registry.register("watch_restarts", restarts, metrics.watch_restarts.clone());
        registry.register("relists", "410 Gone: the resource listed again, by resource", metrics.relists.clone());
        let last = "Unix time of the last successful apply (the kernel holding the latest view)";
        registry.register("last_apply_timestamp_seconds", last, metrics.last_apply.clone());
        let refused = "Policies whose rules the kernel refuses, in force allowing nothing until they change";
        registry.register("refused_policies", refused, metrics.refused_policies.clone());
        registry.register_collector(Box::new(metrics.verdicts.clone()));
        Metrics { registry, ..metrics }
    }
}

impl Metrics {
    /// An apply's transaction: what it did (`None`: the kernel refused it) and how long it took. A view
    /// unchanged made no transaction.
    pub fn transaction(&self, applied: Option<Applied>, took: Duration) {
        let result = match applied {
            Some(Applied::Unchanged) => return,
            Some(Applied::Replaced(_)) => "replaced",
            Some(Applied::Elements(_)) => "elements",
            Some(Applied::Rules(_)) => "rules",
            None => "refused",
        };
        self.transactions.get_or_create(&ResultLabels { result }).inc();
        self.transaction_seconds.observe(took.as_secs_f64());
        if applied.is_none() {
            self.healthy.store(false, Ordering::Relaxed);
        }
    }

    /// `plan` is in force: the kernel holds the latest view.
    pub fn in_force(&self, plan: &Plan) {
        let (rules, elements) = plan.size();
        self.rules.set(rules as i64);
        self.sets.set(plan.sets.len() as i64);
        self.elements.set(elements as i64);
        let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
        self.last_apply.set(now.as_secs_f64());
        self.healthy.store(true, Ordering::Relaxed);
        self.started.store(true, Ordering::Relaxed);
    }

    /// How many policies the kernel refuses (in force allowing nothing).
    pub fn set_refused_policies(&self, count: usize) {
        self.refused_policies.set(count as i64);
    }

    /// An API event reached the agent.
    pub fn event(&self) {
        if let Ok(mut since) = self.unapplied_since.lock() {
            since.get_or_insert_with(Instant::now);
        }
    }

    /// The time of the earliest event not in force yet, taken before a view is made of the stores.
    pub fn take_event(&self) -> Option<Instant> {
        self.unapplied_since.lock().ok().and_then(|mut since| since.take())
    }

    /// The view made after `since` was applied (`applied`) or refused (`None`: its event's time is kept).
    pub fn event_applied(&self, since: Option<Instant>, applied: Option<Applied>) {
        let Some(since) = since else { return };
        match applied {
            Some(Applied::Unchanged) => {}
            Some(_) => self.event_to_kernel_seconds.observe(since.elapsed().as_secs_f64()),
            None => {
                if let Ok(mut kept) = self.unapplied_since.lock() {
                    *kept = Some(kept.map_or(since, |later| later.min(since)));
                }
            }
        }
    }

    /// A watch of `resource` failed and is started again; `gone`: with 410 Gone, so it lists again.
    pub fn watch_restart(&self, resource: &str, gone: bool) {
        let labels = ResourceLabels { resource: resource.to_string() };
        self.watch_restarts.get_or_create(&labels).inc();
        if gone {
            self.relists.get_or_create(&labels).inc();
        }
    }

    /// Drops and accepts by policy from `counters`, from the next scrape on.
    pub fn count_verdicts(&self, counters: Box<dyn VerdictCounters>) {
        if let Ok(mut source) = self.verdicts.0.lock() {
            *source = Some(counters);
        }
    }

    /// The answer to a path: `/metrics`; `/healthz` 200 while the kernel holds the latest view (503 before
    /// the first apply, or after the kernel refused one); `/readyz` 200 once a view was first in force.
    fn answer(&self, path: &str) -> Answer {
        match path {
            "/metrics" => Answer::metrics(&self.registry),
            "/healthz" if self.healthy.load(Ordering::Relaxed) => Answer::text(200, "ok\n"),
            "/healthz" => Answer::text(503, "the rules in force are not the latest view's\n"),
            "/readyz" if self.started.load(Ordering::Relaxed) => Answer::text(200, "cni-netpol is ready"),
            "/readyz" => Answer::text(503, "cni-netpol is not ready yet"),
            _ => Answer::not_found(&["/metrics", "/healthz", "/readyz"]),
        }
    }
}

struct Served(Arc<Metrics>);

impl agent_http::Endpoints for Served {
    fn answer(&self, path: &str) -> Answer {
        self.0.answer(path)
    }
}

/// Binds `address` (an address in use is an error here, at start) and serves the endpoints on a thread.
pub fn serve(address: &str, metrics: Arc<Metrics>) -> Result<(), BindError> {
    let listener = agent_http::bind(address)?;
    agent_http::serve_in_thread(listener, Arc::new(Served(metrics)))
        .map_err(|error| BindError { address: address.to_string(), error })
}

#[cfg(test)]
#[path = "metrics_tests.rs"]
mod tests;
