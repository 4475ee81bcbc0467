//! The agent's metrics (prometheus-client), served in the Prometheus text format with `/healthz` and `/readyz`
//! (`agent-http`, on hyper).

use std::net::TcpListener;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use agent_http::Answer;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family as Labelled;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::path::PeerPath;

/// A pass's backend and address family, and how a route reaches its peer.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabels {
    pub backend: &'static str,
    pub family: &'static str,
    /// `direct` (a route via the peer's node address) or `overlay` (through the backend's device).
    pub path: &'static str,
}

/// A pass's backend and address family.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BackendLabels {
    pub backend: &'static str,
    pub family: &'static str,
}

macro_rules! metrics {
    ($($field:ident: $kind:ty = $name:literal, $help:literal;)*) => {
        /// Every metric of the agent (a counter's exposed name ends in `_total`, as its field's does).
        pub struct Metrics {
            registry: Registry,
            $(pub $field: $kind,)*
            /// Time of a reconciliation pass (netlink dumps, diff and changes), in seconds.
            pub reconcile_duration_seconds: Histogram,
        }

        impl Default for Metrics {
            fn default() -> Metrics {
                let mut registry = Registry::with_prefix("fabricd");
                $(
                    let $field = <$kind>::default();
                    registry.register($name, $help, $field.clone());
                )*
                // 1 ms to 16 s: a pass at 5,000 peers takes about 0.3 s cold, milliseconds warm.
                let reconcile_duration_seconds = Histogram::new(exponential_buckets(0.001, 2.0, 15));
                registry.register(
                    "reconcile_duration_seconds",
                    "Time of a reconciliation pass (netlink dumps, diff and changes)",
                    reconcile_duration_seconds.clone(),
                );
                Metrics { registry, $($field,)* reconcile_duration_seconds }
            }
        }
    };
}

metrics! {
    reconciles_total: Counter = "reconciles", "Reconciliations of the data plane with the wanted state";
    reconcile_errors_total: Counter = "reconcile_errors", "Reconciliations that failed (retried with backoff)";
    changes_total: Counter = "changes", "Routes, neighbours, FDB entries and devices added, replaced or removed";
    drift_repairs_total: Counter = "drift_repairs", "Changes made to repair objects changed by someone else (netlink events)";
    refused_peers: Gauge = "refused_peers", "Peers not used: an invalid lease, a route it would replace or shadow, or beyond host-gw's L2";
    refused_leases_total: Counter = "refused_leases", "Invalid leases refused (each counted once, when first refused or when the reason changes)";
    peers: Gauge = "peers", "Other nodes known";
    backend_peers: Labelled<BackendLabels, Gauge> = "backend_peers", "Peers' subnets in use after the last good pass, by backend and family";
    routes: Labelled<RouteLabels, Gauge> = "routes", "Routes to peers' subnets after the last good pass, by backend, family and path";
    etcd_requests_total: Counter = "etcd_requests", "Unary requests sent to etcd (the watch stream counts once per start)";
    etcd_errors_total: Counter = "etcd_errors", "Failed etcd requests and lost connections";
    kube_errors_total: Counter = "kube_errors", "Failed Kubernetes API requests and lost watches of Nodes (Kubernetes mode)";
    watch_restarts_total: Counter = "watch_restarts", "Times the watch of leases was started again (relist after compaction or a lost stream)";
    lease_acquisitions_total: Counter = "lease_acquisitions", "Times this node's subnet lease was acquired or taken back";
    lease_renewals_total: Counter = "lease_renewals", "Renewals of this node's subnet lease (etcd keep-alives)";
    store_connected: Gauge = "store_connected", "1 while the store is reachable";
    ready: Gauge = "ready", "1 while the data plane matches the store (the last pass applied every change); /healthz answers 200 then";
    ignored_store_keys: Gauge = "ignored_store_keys", "Entries under the leases' prefix that are not leases (an alias of a lease's key, a value larger than a lease)";
    own_lease_rewrites_total: Counter = "own_lease_rewrites", "Times this node wrote its lease back after another writer changed it";
    started: Gauge = "started", "1 once the data plane, the masquerade and subnet.env were first in place (/readyz answers 200 from then on)";
    last_convergence_seconds: Gauge<f64, AtomicU64> = "last_convergence_seconds", "Time from a change seen in the store to the data plane matching it, last time";
}

impl Metrics {
    pub fn inc(counter: &Counter) {
        counter.inc();
    }

    pub fn add(counter: &Counter, n: u64) {
        counter.inc_by(n);
    }

    pub fn set(gauge: &Gauge, value: u64) {
        gauge.set(i64::try_from(value).unwrap_or(i64::MAX));
    }

    /// Peers and routes by backend and family, from a good pass's paths (`Direct` and `Overlay` are routes;
    /// `Unrouted` peers are in use, routed by someone else).
    pub fn paths<'a>(&self, backend: &'static str, paths: impl Iterator<Item = (&'a ipnet::IpNet, &'a PeerPath)>) {
        self.backend_peers.clear();
        self.routes.clear();
        for (subnet, path) in paths {
            let family = match subnet {
                ipnet::IpNet::V4(_) => "ipv4",
                ipnet::IpNet::V6(_) => "ipv6",
            };
            let path = match path {
                PeerPath::Direct { .. } => "direct",
                PeerPath::Overlay { .. } => "overlay",
                PeerPath::Unrouted => "",
                PeerPath::Refused(_) => continue,
            };
            self.backend_peers.get_or_create(&BackendLabels { backend, family }).inc();
            if !path.is_empty() {
                self.routes.get_or_create(&RouteLabels { backend, family, path }).inc();
            }
        }
    }
}

/// Which server answers: the metrics one (`--metrics-addr`) or flanneld's health one (`--healthz-port`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoints {
    Metrics,
    /// flanneld's: `/healthz` 200 while the process runs (a liveness probe), `/readyz` 200 once the node's
    /// data plane, masquerade and subnet.env were first in place.
    Health,
}

/// One server's answers.
struct Served {
    metrics: Arc<Metrics>,
    endpoints: Endpoints,
}

impl agent_http::Endpoints for Served {
    /// `/metrics` in Prometheus' text format, `/healthz` 200 while the data plane matches the store (503 before
    /// the first good pass or after a failed one), `/readyz` 200 once the node was first ready, else 404.
    fn answer(&self, path: &str) -> Answer {
        let started = self.metrics.started.get() == 1;
        match (self.endpoints, path) {
            (Endpoints::Health, "/healthz") => Answer::text(200, "flanneld is running"),
            (_, "/readyz") if started => Answer::text(200, "flanneld is ready"),
            (_, "/readyz") => Answer::text(503, "flanneld is not ready yet"),
            (Endpoints::Health, _) => Answer::not_found(&["/healthz", "/readyz"]),
            (Endpoints::Metrics, "/metrics") => Answer::metrics(&self.metrics.registry),
            (Endpoints::Metrics, "/healthz") if self.metrics.ready.get() == 1 => Answer::text(200, "ok\n"),
            (Endpoints::Metrics, "/healthz") => Answer::text(503, "the data plane does not match the store yet\n"),
            (Endpoints::Metrics, _) => Answer::not_found(&["/metrics", "/healthz", "/readyz"]),
        }
    }
}

/// Serves `endpoints` on `listener` (bound at start: [`agent_http::bind`]) until the process ends.
pub async fn serve(listener: TcpListener, metrics: Arc<Metrics>, endpoints: Endpoints) {
    agent_http::serve(listener, Arc::new(Served { metrics, endpoints })).await
}

#[cfg(test)]
mod tests {
    use agent_http::Endpoints as _;

    use super::*;

    #[test]
    fn metrics_healthz_readyz_and_nothing_else() {
        let served = Served { metrics: Arc::new(Metrics::default()), endpoints: Endpoints::Metrics };
        let status = |path: &str| served.answer(path).status;
        assert_eq!(status("/metrics"), 200);
        assert_eq!(status("/healthz"), 503);
        assert_eq!(status("/readyz"), 503);
        Metrics::set(&served.metrics.ready, 1);
        Metrics::set(&served.metrics.started, 1);
        assert_eq!(served.answer("/healthz"), Answer::text(200, "ok\n"));
        assert_eq!(served.answer("/readyz"), Answer::text(200, "flanneld is ready"));
        for other in ["/", "/metricsx", ""] {
            assert_eq!(status(other), 404, "{other:?}");
        }
        let health = Served { metrics: served.metrics.clone(), endpoints: Endpoints::Health };
        assert_eq!(health.answer("/healthz"), Answer::text(200, "flanneld is running"));
        assert_eq!(health.answer("/metrics").status, 404);
    }

    #[test]
    fn every_name_kept_and_the_new_ones() {
        let metrics = Metrics::default();
        Metrics::inc(&metrics.reconciles_total);
        Metrics::set(&metrics.peers, 2);
        Metrics::set(&metrics.ready, 1);
        metrics.last_convergence_seconds.set(0.25);
        metrics.reconcile_duration_seconds.observe(0.003);
        let direct = PeerPath::Direct { gateway: "172.31.0.2".parse().unwrap() };
        let overlay = PeerPath::Overlay { endpoint: "172.31.0.3".parse().unwrap(), port: None, id: None };
        let subnets: Vec<ipnet::IpNet> =
            ["10.244.1.0/24", "10.244.2.0/24", "fd00:10:244:1::/64"].iter().map(|s| s.parse().unwrap()).collect();
        let paths = [(&subnets[0], &direct), (&subnets[1], &overlay), (&subnets[2], &overlay)];
        metrics.paths("vxlan", paths.into_iter());
        let text = Answer::metrics(&metrics.registry).body;
        for line in [
            "fabricd_reconciles_total 1\n",
            "fabricd_peers 2\n",
            "fabricd_ready 1\n",
            "fabricd_last_convergence_seconds 0.25\n",
            "fabricd_reconcile_duration_seconds_count 1\n",
            "fabricd_reconcile_duration_seconds_bucket{le=\"0.004\"} 1\n",
            "fabricd_backend_peers{backend=\"vxlan\",family=\"ipv4\"} 2\n",
            "fabricd_routes{backend=\"vxlan\",family=\"ipv4\",path=\"direct\"} 1\n",
            "fabricd_routes{backend=\"vxlan\",family=\"ipv6\",path=\"overlay\"} 1\n",
        ] {
            assert!(text.contains(line), "{line:?} in\n{text}");
        }
        for name in [
            "reconcile_errors_total",
            "changes_total",
            "drift_repairs_total",
            "refused_peers",
            "refused_leases_total",
            "etcd_requests_total",
            "etcd_errors_total",
            "kube_errors_total",
            "watch_restarts_total",
            "lease_acquisitions_total",
            "lease_renewals_total",
            "store_connected",
            "ignored_store_keys",
            "own_lease_rewrites_total",
            "started",
        ] {
            assert!(text.contains(&format!("\nfabricd_{name} 0\n")), "{name} in\n{text}");
        }
    }
}
