//! Counters and gauges in the Prometheus text format, served on a local address (`GET /metrics`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::log::log;

macro_rules! metrics {
    ($($name:ident: $kind:literal, $help:literal;)*) => {
        /// Every metric of the agent.
        #[derive(Default)]
        pub struct Metrics {
            $(pub $name: AtomicU64,)*
        }

        impl Metrics {
            pub fn render(&self) -> String {
                let mut text = String::new();
                $(
                    let name = concat!("fabricd_", stringify!($name));
                    text.push_str(&format!("# HELP {name} {}\n# TYPE {name} {}\n", $help, $kind));
                    let value = self.$name.load(Ordering::Relaxed);
                    if stringify!($name).ends_with("_seconds") {
                        text.push_str(&format!("{name} {}\n", value as f64 / 1e6));
                    } else {
                        text.push_str(&format!("{name} {value}\n"));
                    }
                )*
                text
            }
        }
    };
}

metrics! {
    reconciles_total: "counter", "Reconciliations of the data plane with the wanted state.";
    reconcile_errors_total: "counter", "Reconciliations that failed (retried with backoff).";
    changes_total: "counter", "Routes, neighbours, FDB entries and devices added, replaced or removed.";
    drift_repairs_total: "counter", "Changes made to repair objects changed by someone else (netlink events).";
    refused_peers: "gauge", "Peers not used: an invalid lease, a route it would replace or shadow, or beyond host-gw's L2.";
    refused_leases_total: "counter", "Invalid leases refused (each counted once, when first refused or when the reason changes).";
    peers: "gauge", "Other nodes known.";
    etcd_requests_total: "counter", "Unary requests sent to etcd (the watch stream counts once per start).";
    etcd_errors_total: "counter", "Failed etcd requests and lost connections.";
    kube_errors_total: "counter", "Failed Kubernetes API requests and lost watches of Nodes (Kubernetes mode).";
    watch_restarts_total: "counter", "Times the watch of leases was started again (relist after compaction or a lost stream).";
    lease_acquisitions_total: "counter", "Times this node's subnet lease was acquired or taken back.";
    store_connected: "gauge", "1 while the store is reachable.";
    ready: "gauge", "1 while the data plane matches the store (the last pass applied every change); /healthz answers 200 then.";
    ignored_store_keys: "gauge", "Entries under the leases' prefix that are not leases (an alias of a lease's key, a value larger than a lease).";
    own_lease_rewrites_total: "counter", "Times this node wrote its lease back after another writer changed it.";
    started: "gauge", "1 once the data plane, the masquerade and subnet.env were first in place (/readyz answers 200 from then on).";
    last_convergence_seconds: "gauge", "Time from a change seen in the store to the data plane matching it, last time.";
}

impl Metrics {
    pub fn inc(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    pub fn set(gauge: &AtomicU64, value: u64) {
        gauge.store(value, Ordering::Relaxed);
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

/// The answer to a request head: `/metrics` in Prometheus' text format, `/healthz` 200 while the data plane
/// matches the store (503 before the first good pass or after a failed one), `/readyz` 200 once the node was
/// first ready, anything else 404.
fn answer(head: &[u8], metrics: &Metrics, endpoints: Endpoints) -> String {
    let line = String::from_utf8_lossy(head.split(|b| *b == b'\n').next().unwrap_or_default()).into_owned();
    let path = line.split_whitespace().nth(1).unwrap_or_default();
    let path = path.split('?').next().unwrap_or_default();
    let started = metrics.started.load(Ordering::Relaxed) == 1;
    let (status, kind, body) = match (endpoints, path) {
        (Endpoints::Health, "/healthz") => ("200 OK", "text/plain", "flanneld is running".to_string()),
        (_, "/readyz") if started => ("200 OK", "text/plain", "flanneld is ready".to_string()),
        (_, "/readyz") => ("503 Service Unavailable", "text/plain", "flanneld is not ready yet".to_string()),
        (Endpoints::Health, _) => ("404 Not Found", "text/plain", "not found: /healthz, /readyz\n".to_string()),
        (_, path) => answer_metrics(path, metrics),
    };
    format!(
        "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

fn answer_metrics(path: &str, metrics: &Metrics) -> (&'static str, &'static str, String) {
    match path {
        "/metrics" => ("200 OK", "text/plain; version=0.0.4", metrics.render()),
        "/healthz" if metrics.ready.load(Ordering::Relaxed) == 1 => ("200 OK", "text/plain", "ok\n".to_string()),
        "/healthz" => ("503 Service Unavailable", "text/plain", "the data plane does not match the store yet\n".into()),
        _ => ("404 Not Found", "text/plain", "not found: /metrics, /healthz, /readyz\n".to_string()),
    }
}

/// Serves `endpoints` on `address` until the process ends.
pub async fn serve(address: String, metrics: Arc<Metrics>, endpoints: Endpoints) {
    let listener = match TcpListener::bind(&address).await {
        Ok(listener) => listener,
        Err(e) => {
            log!(error, "metrics: cannot listen on {address}: {e}");
            return;
        }
    };
    loop {
        let Ok((mut stream, _)) = listener.accept().await else { continue };
        let metrics = metrics.clone();
        tokio::spawn(async move {
            // The whole request head is read before answering: closing a socket with unread bytes resets the
            // connection, and a client whose request came in several segments would lose the answer.
            let read_head = async {
                let (mut head, mut buf) = (Vec::new(), [0u8; 1024]);
                while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 16 * 1024 {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                head
            };
            let head = tokio::time::timeout(std::time::Duration::from_secs(5), read_head).await.unwrap_or_default();
            let response = answer(&head, &metrics, endpoints);
            let _ = stream.write_all(response.as_bytes()).await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_healthz_and_nothing_else() {
        let metrics = Metrics::default();
        let status = |head: &str| {
            answer(head.as_bytes(), &metrics, Endpoints::Metrics).lines().next().unwrap_or_default().to_string()
        };
        assert_eq!(status("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"), "HTTP/1.1 200 OK");
        assert_eq!(status("GET /healthz HTTP/1.1\r\n\r\n"), "HTTP/1.1 503 Service Unavailable");
        Metrics::set(&metrics.ready, 1);
        assert_eq!(status("GET /healthz?verbose HTTP/1.0\r\n\r\n"), "HTTP/1.1 200 OK");
        for other in ["GET / HTTP/1.1\r\n\r\n", "GET /metricsx HTTP/1.1\r\n\r\n", "", "garbage"] {
            assert_eq!(status(other), "HTTP/1.1 404 Not Found", "{other:?}");
        }
        assert!(answer(b"GET /metrics HTTP/1.1\r\n\r\n", &metrics, Endpoints::Metrics).contains("fabricd_ready 1"));
    }
}
