//! The etcd v3 store, in flannel's layout: `<prefix>/config`, and `<prefix>/subnets/<a.b.c.d>-<len>` holding
//! each node's lease on an etcd lease with a TTL.
//!
//! - Acquiring: the policy of [`super::acquire`], on transactions conditioned on the key (created only when
//!   absent, replaced only at the revision read), so no two nodes ever get one subnet; a lost race retries.
//! - Renewing: a keep-alive of the etcd lease when its remaining time is under the renew margin; an expired or
//!   revoked lease, or our key deleted or taken, makes the node acquire again (not exit).
//! - Peers: one range read, then a watch from the next revision. A compacted revision relists at once; a
//!   lost stream or connection reconnects with backoff (100 ms doubling to 5 s, plus up to half again at
//!   random), and relists.
//!
//! Unlike flanneld, leases are read without a `TimeToLive` request per key (a cold start costs one range
//! request, not one per node).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{
    Certificate, Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, Identity, PutOptions, TlsOptions,
    Txn, TxnOp, WatchOptions, WatchResponse, WatchStream,
};

use tokio::sync::watch;
use tokio::time::{sleep, Instant};

use super::{
    acquire, random_below, Cluster, LeaseStore, LeaseToken, Listing, NodeIdentity, Peer, Previous, StoredLease,
};
use crate::error::{Error, EtcdErrorKind, Result};
use crate::flannel::{parse_subnet_key, subnet_key, LeaseAttrs, NetworkConfig, SubnetKey};
use crate::log;
use crate::metrics::Metrics;

#[derive(Debug, Clone)]
pub struct EtcdOptions {
    pub endpoints: Vec<String>,
    pub prefix: String,
    pub cafile: Option<PathBuf>,
    pub certfile: Option<PathBuf>,
    pub keyfile: Option<PathBuf>,
    /// TTL of the etcd lease holding the subnet (flannel: 24 h).
    pub lease_ttl: Duration,
    /// Renew when less than this is left (flannel's `--subnet-lease-renew-margin`).
    pub renew_margin: Duration,
}

impl EtcdOptions {
    fn tls(&self) -> Result<Option<TlsOptions>> {
        if self.cafile.is_none() && self.certfile.is_none() {
            return Ok(None);
        }
        let read = |flag: &str, path: &PathBuf| {
            std::fs::read(path).map_err(|e| Error::io(format!("--etcd-{flag} {}", path.display()), e))
        };
        let mut tls = TlsOptions::new();
        if let Some(ca) = &self.cafile {
            tls = tls.ca_certificate(Certificate::from_pem(read("cafile", ca)?));
        }
        match (&self.certfile, &self.keyfile) {
            (Some(cert), Some(key)) => {
                tls = tls.identity(Identity::from_pem(read("certfile", cert)?, read("keyfile", key)?));
            }
            (None, None) => {}
            _ => return Err(Error::Config("--etcd-certfile and --etcd-keyfile go together".into())),
        }
        Ok(Some(tls))
    }
}

/// An etcd client with the agent's counters.
pub struct EtcdStore {
    client: Client,
    prefix: String,
    lease_ttl: Duration,
    metrics: Arc<Metrics>,
}

impl EtcdStore {
    pub async fn connect(options: &EtcdOptions, metrics: Arc<Metrics>) -> Result<EtcdStore> {
        let mut connect = ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(3))
            .with_timeout(Duration::from_secs(5))
            // etcd refuses HTTP/2 pings more often than every 5 s (--grpc-keepalive-min-time) with a GOAWAY.
            .with_keep_alive(Duration::from_secs(10), Duration::from_secs(5));
        if let Some(tls) = options.tls()? {
            connect = connect.with_tls(tls);
        }
        Metrics::inc(&metrics.etcd_requests_total);
        let endpoints = options.endpoints.join(",");
        let client = Client::connect(&options.endpoints, Some(connect))
            .await
            .map_err(|e| Error::etcd(format!("etcd {endpoints}"), e))?;
        let mut store = EtcdStore {
            client,
            prefix: options.prefix.trim_end_matches('/').to_string(),
            lease_ttl: options.lease_ttl,
            metrics,
        };
        // The connection is lazy: a first request tells whether the endpoints (and TLS) work. With TLS 1.3 a
        // refused client certificate shows only as a connection closed after the handshake: say so.
        match store.config_text().await {
            Ok(_) => Ok(store),
            Err(e) if options.certfile.is_some() && e.etcd_kind() == Some(EtcdErrorKind::Closed) => Err(Error::Etcd {
                what: format!("etcd {endpoints}"),
                kind: EtcdErrorKind::Tls,
                message: format!(
                    "etcd closed the connection right after the TLS handshake: it most likely refused the \
                         client certificate {} (not signed by a CA that etcd trusts with --trusted-ca-file?) ({e})",
                    options.certfile.as_ref().expect("checked").display()
                ),
            }),
            Err(e) => Err(e),
        }
    }

    /// Counts a request (and its failure), naming what it was for.
    fn counted<T>(&self, what: &str, result: std::result::Result<T, etcd_client::Error>) -> Result<T> {
        Metrics::inc(&self.metrics.etcd_requests_total);
        result.map_err(|e| {
            Metrics::inc(&self.metrics.etcd_errors_total);
            Error::etcd(what, e)
        })
    }

    fn subnets_prefix(&self) -> String {
        format!("{}/subnets/", self.prefix)
    }

    fn lease_key(&self, subnet: &SubnetKey) -> String {
        format!("{}/subnets/{}", self.prefix, subnet_key(subnet))
    }

    async fn config_text(&mut self) -> Result<Option<Vec<u8>>> {
        let key = format!("{}/config", self.prefix);
        let response = self.client.get(key, None).await;
        let response = self.counted("reading the network config", response)?;
        Ok(response.kvs().first().map(|kv| kv.value().to_vec()))
    }

    /// Writes `attrs` at `subnet`'s key on a new etcd lease if `compare` holds; the new lease, or None when
    /// the condition failed (someone else got there first).
    async fn put_if(&mut self, subnet: SubnetKey, attrs: &LeaseAttrs, compare: Compare) -> Result<Option<LeaseToken>> {
        let response = self.client.lease_grant(self.lease_ttl.as_secs().max(2) as i64, None).await;
        let token = LeaseToken(self.counted("granting a lease", response)?.id());
        let put = TxnOp::put(self.lease_key(&subnet), attrs.to_json(), Some(PutOptions::new().with_lease(token.0)));
        let response = self.client.txn(Txn::new().when([compare]).and_then([put])).await;
        match self.counted(&format!("writing the lease of {subnet}"), response) {
            Ok(response) if response.succeeded() => Ok(Some(token)),
            Ok(_) => {
                self.revoke(token).await;
                Ok(None)
            }
            Err(e) => {
                self.revoke(token).await;
                Err(e)
            }
        }
    }

    /// Watches the leases from `revision` on.
    async fn watch_leases(&mut self, revision: i64) -> Result<WatchStream> {
        Metrics::inc(&self.metrics.watch_restarts_total);
        Metrics::inc(&self.metrics.etcd_requests_total);
        let options = WatchOptions::new().with_prefix().with_start_revision(revision);
        self.client.watch(self.subnets_prefix(), Some(options)).await.map_err(|e| Error::etcd("watching the leases", e))
    }
}

impl LeaseStore for EtcdStore {
    async fn config(&mut self) -> Result<NetworkConfig> {
        match self.config_text().await? {
            Some(text) => NetworkConfig::parse(&text).map_err(Error::Format),
            None => Err(Error::Store(format!(
                "no network config at {}/config (etcdctl put {}/config '{{\"Network\":\"10.244.0.0/16\",\"Backend\":{{\"Type\":\"vxlan\"}}}}')",
                self.prefix, self.prefix
            ))),
        }
    }

    async fn leases(&mut self) -> Result<Listing> {
        let response = self.client.get(self.subnets_prefix(), Some(GetOptions::new().with_prefix())).await;
        let response = self.counted("reading the leases", response)?;
        let mut listing =
            Listing { revision: response.header().map(|h| h.revision()).unwrap_or(0), ..Listing::default() };
        for kv in response.kvs() {
            let Some(subnet) = parse_subnet_key(&String::from_utf8_lossy(kv.key())) else { continue };
            match LeaseAttrs::parse(kv.value()) {
                Ok(attrs) => {
                    let lease = StoredLease {
                        attrs,
                        token: LeaseToken(kv.lease()),
                        revision: kv.mod_revision(),
                        created: kv.create_revision(),
                    };
                    listing.leases.insert(subnet, lease);
                }
                Err(e) => log!(warn, "ignoring lease {subnet}: {e}"),
            }
        }
        Ok(listing)
    }

    async fn create(&mut self, subnet: SubnetKey, attrs: &LeaseAttrs) -> Result<Option<LeaseToken>> {
        let key = self.lease_key(&subnet);
        self.put_if(subnet, attrs, Compare::version(key, CompareOp::Equal, 0)).await
    }

    async fn replace(&mut self, subnet: SubnetKey, attrs: &LeaseAttrs, revision: i64) -> Result<Option<LeaseToken>> {
        let key = self.lease_key(&subnet);
        self.put_if(subnet, attrs, Compare::mod_revision(key, CompareOp::Equal, revision)).await
    }

    async fn alive(&mut self, token: LeaseToken) -> Result<bool> {
        let response = self.client.lease_time_to_live(token.0, None).await;
        Ok(self.counted("reading a lease's time to live", response)?.ttl() > 0)
    }

    async fn revoke(&mut self, token: LeaseToken) {
        let response = self.client.lease_revoke(token.0).await;
        let _ = self.counted("revoking a lease", response);
    }

    async fn renew(&mut self, token: LeaseToken) -> Result<Option<Duration>> {
        let keeper = self.client.lease_keep_alive(token.0).await;
        let (mut keeper, mut stream) = self.counted("renewing the lease", keeper)?;
        keeper.keep_alive().await.map_err(|e| Error::etcd("renewing the lease", e))?;
        let response = stream.message().await.map_err(|e| Error::etcd("renewing the lease", e))?;
        Ok(response.map(|r| r.ttl()).filter(|ttl| *ttl > 0).map(|ttl| Duration::from_secs(ttl as u64)))
    }

    async fn release(&mut self, subnet: SubnetKey, token: Option<LeaseToken>) -> Result<()> {
        let response = self.client.delete(self.lease_key(&subnet), None).await;
        self.counted(&format!("deleting the lease of {subnet}"), response)?;
        if let Some(token) = token {
            self.revoke(token).await;
        }
        Ok(())
    }
}

/// Runs the source forever: connects, acquires, publishes, watches, reconnects.
pub async fn run(
    options: EtcdOptions,
    node: NodeIdentity,
    mut previous: Previous,
    tx: watch::Sender<Option<Cluster>>,
    metrics: Arc<Metrics>,
) {
    let mut backoff = Duration::from_millis(100);
    loop {
        let started = Instant::now();
        let Err(e) = session(&options, &node, &mut previous, &tx, &metrics).await;
        Metrics::set(&metrics.store_connected, 0);
        Metrics::inc(&metrics.etcd_errors_total);
        log!(error, "{e}; the data plane is kept as it is, retrying in {backoff:?}");
        if started.elapsed() > Duration::from_secs(30) {
            backoff = Duration::from_millis(100);
        }
        // Jittered, so that thousands of agents cut off together do not come back together.
        sleep(backoff + Duration::from_millis(random_below(backoff.as_millis() as usize / 2 + 1) as u64)).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

enum Never {}

/// Why watching the leases stopped without an error.
enum WatchEnd {
    /// Our lease expired, was revoked, deleted or taken: acquire again.
    OwnLost,
    /// The watch fell behind a compaction: list again.
    Relist,
}

/// One connection: acquire the node's lease, then list and watch until something fails.
async fn session(
    options: &EtcdOptions,
    node: &NodeIdentity,
    previous: &mut Previous,
    tx: &watch::Sender<Option<Cluster>>,
    metrics: &Arc<Metrics>,
) -> Result<Never> {
    let mut store = EtcdStore::connect(options, metrics.clone()).await?;
    Metrics::set(&metrics.store_connected, 1);
    let config = store.config().await?;
    let attrs = node.attrs(&config)?;
    loop {
        let (subnet, token) = acquire(&mut store, &config, &attrs, *previous).await?;
        Metrics::inc(&metrics.lease_acquisitions_total);
        if previous.subnet != Some(subnet) {
            log!(info, "acquired subnet {subnet} (etcd lease {token})");
        }
        *previous = Previous { subnet: Some(subnet), lease: Some(token) };
        // The first keep-alive tells how long the lease (maybe an older one, kept) has left.
        let mut renew_at = Instant::now();
        loop {
            let listing = store.leases().await?;
            let mut cluster =
                Cluster { config: config.clone(), subnet, lease: Some(token), peers: listing.peers_of(subnet) };
            publish(tx, &cluster, metrics);
            match watch_peers(&mut store, options, &mut cluster, listing.revision + 1, &mut renew_at, tx, metrics)
                .await?
            {
                WatchEnd::Relist => continue,
                WatchEnd::OwnLost => break,
            }
        }
    }
}

/// Follows the leases from `revision`, publishing each change, and renews the node's lease when due.
async fn watch_peers(
    store: &mut EtcdStore,
    options: &EtcdOptions,
    cluster: &mut Cluster,
    revision: i64,
    renew_at: &mut Instant,
    tx: &watch::Sender<Option<Cluster>>,
    metrics: &Arc<Metrics>,
) -> Result<WatchEnd> {
    let token = cluster.lease.expect("acquired");
    let own_key = store.lease_key(&cluster.subnet);
    let mut stream = store.watch_leases(revision).await?;
    loop {
        tokio::select! {
            message = stream.message() => {
                let Some(response) = message.map_err(|e| Error::etcd("watching the leases", e))? else {
                    return Err(Error::Etcd { what: "watching the leases".into(), kind: EtcdErrorKind::Watch, message: "the stream ended".into() });
                };
                if response.compact_revision() > 0 {
                    log!(warn, "watch fell behind compaction (revision {}): relisting", response.compact_revision());
                    return Ok(WatchEnd::Relist);
                }
                if response.canceled() {
                    return Err(Error::Etcd { what: "watching the leases".into(), kind: EtcdErrorKind::Watch, message: format!("canceled: {}", response.cancel_reason()) });
                }
                if !apply_events(&response, &own_key, token, cluster) {
                    log!(warn, "lease of {} expired, was revoked or taken: acquiring again", cluster.subnet);
                    return Ok(WatchEnd::OwnLost);
                }
                publish(tx, cluster, metrics);
            }
            _ = tokio::time::sleep_until(*renew_at) => {
                let Some(remaining) = store.renew(token).await? else {
                    log!(warn, "etcd lease {token} of {} is gone: acquiring again", cluster.subnet);
                    return Ok(WatchEnd::OwnLost);
                };
                *renew_at = Instant::now() + remaining.saturating_sub(options.renew_margin).max(Duration::from_secs(1));
            }
        }
    }
}

/// Applies a watch response's events to the peers; false when the node's own key was deleted or written by
/// someone else.
fn apply_events(response: &WatchResponse, own_key: &str, token: LeaseToken, cluster: &mut Cluster) -> bool {
    let mut own_kept = true;
    for event in response.events() {
        let Some(kv) = event.kv() else { continue };
        let key = String::from_utf8_lossy(kv.key());
        let Some(subnet) = parse_subnet_key(&key) else { continue };
        if key == own_key {
            // Deleted (expired, revoked, removed by hand) or overwritten by someone else.
            own_kept &= event.event_type() == EventType::Put && kv.lease() == token.0;
            continue;
        }
        match event.event_type() {
            EventType::Put => match LeaseAttrs::parse(kv.value()) {
                Ok(attrs) => {
                    cluster.peers.insert(subnet, Peer { attrs, created: kv.create_revision() });
                }
                Err(e) => log!(warn, "ignoring lease {subnet}: {e}"),
            },
            EventType::Delete => {
                cluster.peers.remove(&subnet);
            }
        }
    }
    own_kept
}

fn publish(tx: &watch::Sender<Option<Cluster>>, cluster: &Cluster, metrics: &Metrics) {
    Metrics::set(&metrics.peers, cluster.peers.len() as u64);
    tx.send_if_modified(|current| {
        if current.as_ref() == Some(cluster) {
            false
        } else {
            *current = Some(cluster.clone());
            true
        }
    });
}
