//! The etcd v3 store, in flannel's layout: `<prefix>/config`, and `<prefix>/subnets/<a.b.c.d>-<len>` holding
//! each node's lease on an etcd lease with a TTL.
//!
//! - Acquiring: the policy of [`super::acquire`], on transactions conditioned on the key (created only when
//!   absent, replaced only at the revision read), so no two nodes ever get one subnet; a lost race retries.
//! - Renewing: a keep-alive of the etcd lease when its remaining time is under the renew margin; an expired or
//!   revoked lease, or our key deleted or taken, makes the node acquire again (not exit).
//! - Peers: one range read (pages of 10,000 keys at one revision, halved while a page is past the 64 MiB read
//!   limit), then a watch from the next revision. A compacted revision relists at once; a
//!   lost stream or connection reconnects with backoff (100 ms doubling to 5 s, plus up to half again at
//!   random), and relists.
//!
//! Unlike flanneld, leases are read without a `TimeToLive` request per key (a cold start costs one range
//! request, not one per node).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{
    Certificate, Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, GetResponse, Identity, PutOptions,
    TlsOptions, Txn, TxnOp, WatchOptions, WatchResponse, WatchStream,
};

use tokio::sync::watch;
use tokio::time::Instant;

use super::lease::{
    acquire, lease_entry, publish, Backoff, Cluster, IgnoredKeys, LeaseStore, LeaseToken, Listing, NodeIdentity,
    NotALease, Peer, Previous, StoredLease,
};
use crate::backend::BackendContext;
use crate::error::{ConfigError, Error, EtcdErrorKind, Result, StoreError};
use crate::flannel::{subnet_key, LeaseAttrs, NetworkConfig, SubnetKey};
use crate::log::log;
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
    /// What the config's backend is built with.
    pub backend: BackendContext,
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
            _ => return Err(ConfigError::EtcdCertWithoutKey.into()),
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
    /// Entries under the leases' prefix that are not leases, logged once (kept across reconnections).
    ignored: Arc<Mutex<IgnoredKeys>>,
    backend: BackendContext,
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
            ignored: Arc::default(),
            backend: options.backend.clone(),
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

    /// Watches the network config and the leases from `revision` on.
    async fn watch_leases(&mut self, revision: i64) -> Result<WatchStream> {
        Metrics::inc(&self.metrics.watch_restarts_total);
        Metrics::inc(&self.metrics.etcd_requests_total);
        let options = WatchOptions::new().with_prefix().with_start_revision(revision);
        let mut watcher = self.client.watch_client().max_decoding_message_size(MAX_RESPONSE);
        watcher
            .watch(format!("{}/", self.prefix), Some(options))
            .await
            .map_err(|e| Error::etcd("watching the leases", e))
    }

    /// Reads one page of the leases: up to `limit` keys from `from` at `revision` (0: the current one). A page
    /// larger than the client takes is read again with half the keys (and `limit` stays there for the next
    /// pages); a single value larger than that is skipped (its key read alone: then true).
    async fn lease_page(&mut self, from: Vec<u8>, revision: i64, limit: &mut i64) -> Result<(GetResponse, bool)> {
        let end = prefix_end(self.subnets_prefix().as_bytes());
        loop {
            let mut options = GetOptions::new().with_range(end.clone()).with_limit(*limit);
            if revision > 0 {
                options = options.with_revision(revision);
            }
            let mut kv = self.client.kv_client().max_decoding_message_size(MAX_RESPONSE);
            match kv.get(from.clone(), Some(options)).await {
                Err(etcd_client::Error::GRpcStatus(status)) if too_large(&status) && *limit > 1 => {
                    Metrics::inc(&self.metrics.etcd_requests_total);
                    *limit /= 2;
                }
                Err(etcd_client::Error::GRpcStatus(status)) if too_large(&status) => {
                    Metrics::inc(&self.metrics.etcd_requests_total);
                    let keys = GetOptions::new().with_range(end.clone()).with_limit(1).with_keys_only();
                    let keys = kv.get(from.clone(), Some(keys.with_revision(revision))).await;
                    let keys = self.counted("reading the leases", keys)?;
                    if let Some(key) = keys.kvs().first() {
                        let name = String::from_utf8_lossy(key.key()).into_owned();
                        self.ignore(&name, &NotALease::Unreadable { limit: MAX_RESPONSE });
                    }
                    return Ok((keys, true));
                }
                response => return Ok((self.counted("reading the leases", response)?, false)),
            }
        }
    }

    fn ignore(&self, key: &str, why: &NotALease) {
        let mut ignored = self.ignored.lock().expect("not poisoned");
        ignored.ignore(key, why);
        Metrics::set(&self.metrics.ignored_store_keys, ignored.len() as u64);
    }

    fn forget(&self, key: &str) {
        let mut ignored = self.ignored.lock().expect("not poisoned");
        ignored.forget(key);
        Metrics::set(&self.metrics.ignored_store_keys, ignored.len() as u64);
    }
}

impl LeaseStore for EtcdStore {
    async fn config(&mut self) -> Result<NetworkConfig> {
        match self.config_text().await? {
            Some(text) => NetworkConfig::parse_with(&text, &self.backend).map_err(Error::Format),
            None => Err(StoreError::NoConfig { prefix: self.prefix.clone() }.into()),
        }
    }

    /// Every lease, read in pages at one revision (a cluster's leases can outgrow one response, and values
    /// written by hand can be of any size).
    async fn leases(&mut self) -> Result<Listing> {
        let prefix = self.subnets_prefix();
        let mut listing = Listing::default();
        let mut from = prefix.clone().into_bytes();
        let mut limit = PAGE;
        loop {
            let (response, skipped) = self.lease_page(from, listing.revision, &mut limit).await?;
            if listing.revision == 0 {
                listing.revision = response.header().map(|h| h.revision()).unwrap_or(0);
            }
            for kv in response.kvs().iter().filter(|_| !skipped) {
                let key = String::from_utf8_lossy(kv.key());
                match lease_entry(&prefix, &key, kv.value()) {
                    Ok((subnet, attrs)) => {
                        self.forget(&key);
                        let lease = StoredLease {
                            attrs,
                            token: LeaseToken(kv.lease()),
                            revision: kv.mod_revision(),
                            created: kv.create_revision(),
                        };
                        listing.leases.insert(subnet, lease);
                    }
                    Err(why) => self.ignore(&key, &why),
                }
            }
            let Some(last) = response.kvs().last().filter(|_| response.more()) else { break };
            from = last.key().to_vec();
            from.push(0);
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

/// The largest response read (a page of leases, a watch response): leases are small, but values written by
/// hand need not be, and a response past the client's default 4 MiB would fail the whole listing.
const MAX_RESPONSE: usize = 64 << 20;
/// Keys per page of the lease listing: a cluster of 5,000 nodes (Kubernetes' limit) is one page of about 1.3 MB;
/// a page past the response limit (values written by hand) is read again in halves.
const PAGE: i64 = 10_000;

/// The end of the range of keys starting with `prefix`.
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// A response larger than the client takes (tonic's decoder says so with OutOfRange, which etcd also uses for
/// a compacted or future revision: told apart by the message).
fn too_large(status: &tonic::Status) -> bool {
    match status.code() {
        tonic::Code::ResourceExhausted => true,
        tonic::Code::OutOfRange => status.message().contains("message length too large"),
        _ => false,
    }
}

/// What one run of the source remembers across connections.
#[derive(Default)]
struct SourceState {
    previous: Previous,
    /// What the config's backend is built with.
    backend: BackendContext,
    /// Since when etcd has been unreachable (logged when it is reachable again).
    outage: Option<Instant>,
    /// The last config change reported, so that each is logged once.
    reported_config: Option<Vec<u8>>,
    /// The last overwrite of the node's own lease reported.
    reported_overwrite: Option<String>,
    ignored: Arc<Mutex<IgnoredKeys>>,
}

/// Runs the source: connects, acquires, publishes, watches, reconnects, for as long as the agent runs. Returns
/// only when the node must not start: its subnet does not fit the network config (its pods would lose their
/// addresses).
pub async fn run(
    options: EtcdOptions,
    node: NodeIdentity,
    previous: Previous,
    tx: watch::Sender<Option<Cluster>>,
    metrics: Arc<Metrics>,
) -> Error {
    let mut backoff = Backoff::new(Duration::from_millis(100));
    let mut state = SourceState { previous, backend: options.backend.clone(), ..SourceState::default() };
    loop {
        let started = Instant::now();
        let Err(e) = session(&options, &node, &mut state, &tx, &metrics).await;
        if matches!(e, Error::SubnetOutsideConfig { .. }) && tx.borrow().is_none() {
            return e;
        }
        Metrics::set(&metrics.store_connected, 0);
        Metrics::inc(&metrics.etcd_errors_total);
        state.outage.get_or_insert_with(Instant::now);
        log!(error, "{e}; the data plane is kept as it is, retrying in {:?}", backoff.next());
        if started.elapsed() > Duration::from_secs(30) {
            backoff.reset();
        }
        backoff.wait().await;
    }
}

/// flannel's etcd layout as a [`Source`].
impl super::Source for EtcdOptions {
    fn spawn(&self, context: super::SourceContext) -> Result<tokio::task::JoinHandle<Error>> {
        let super::SourceContext { node, previous, tx, metrics, .. } = context;
        Ok(tokio::spawn(run(self.clone(), node, previous, tx, metrics)))
    }

    fn current<'a>(&'a self, node: &'a NodeIdentity, previous: Previous) -> super::SourceFuture<'a, Cluster> {
        Box::pin(async move {
            let mut store = EtcdStore::connect(self, Arc::new(Metrics::default())).await?;
            super::snapshot(&mut store, node, previous).await
        })
    }

    fn release<'a>(&'a self, cluster: &'a Cluster) -> super::SourceFuture<'a, bool> {
        Box::pin(async move {
            let mut store = EtcdStore::connect(self, Arc::new(Metrics::default())).await?;
            store.release(cluster.subnet, cluster.lease).await?;
            Ok(true)
        })
    }

    fn acquire<'a>(
        &'a self,
        node: &'a NodeIdentity,
        previous: Previous,
    ) -> super::SourceFuture<'a, (SubnetKey, super::LeaseToken)> {
        Box::pin(async move {
            let mut store = EtcdStore::connect(self, Arc::new(Metrics::default())).await?;
            let config = store.config().await?;
            acquire(&mut store, &config, &node.attrs(&config)?, previous).await
        })
    }
}

enum Never {}

/// Why watching the leases stopped without an error.
enum WatchEnd {
    /// Our lease expired, was revoked or deleted: acquire again.
    OwnLost,
    /// The watch fell behind a compaction: list again.
    Relist,
    /// The network config changed and still holds this node's subnet: apply it.
    ConfigChanged,
}

/// One connection: acquire the node's lease, then list and watch until something fails.
async fn session(
    options: &EtcdOptions,
    node: &NodeIdentity,
    state: &mut SourceState,
    tx: &watch::Sender<Option<Cluster>>,
    metrics: &Arc<Metrics>,
) -> Result<Never> {
    let mut store = EtcdStore::connect(options, metrics.clone()).await?;
    store.ignored = state.ignored.clone();
    Metrics::set(&metrics.store_connected, 1);
    if let Some(since) = state.outage.take() {
        log!(info, "etcd {} is reachable again (after {:.1?})", options.endpoints.join(","), since.elapsed());
    }
    loop {
        let config = running_config(&mut store, state, tx).await?;
        let attrs = node.attrs(&config)?;
        let (subnet, token) = acquire(&mut store, &config, &attrs, state.previous).await?;
        Metrics::inc(&metrics.lease_acquisitions_total);
        if state.previous.subnet != Some(subnet) {
            log!(info, "acquired subnet {subnet} (etcd lease {token})");
        }
        state.previous = Previous { subnet: Some(subnet), lease: Some(token) };
        // The first keep-alive tells how long the lease (maybe an older one, kept) has left.
        let mut renew_at = Instant::now();
        let mut cluster = Cluster { config: config.clone(), subnet, lease: Some(token), peers: BTreeMap::new() };
        loop {
            let listing = store.leases().await?;
            cluster.peers = listing.peers_of(subnet);
            publish(tx, metrics, &cluster);
            let watch = Watch { store: &mut store, options, attrs: &attrs, state: &mut *state, tx, metrics };
            match watch.run(&mut cluster, listing.revision + 1, &mut renew_at).await? {
                WatchEnd::Relist => continue,
                WatchEnd::OwnLost | WatchEnd::ConfigChanged => break,
            }
        }
    }
}

/// The network config to run with: the store's, unless the node is running and the store's no longer holds
/// its subnet (then the running one is kept, and the change reported once). At start, a config that does not
/// hold the node's subnet is an error ([`super::acquire`] tells).
async fn running_config(
    store: &mut EtcdStore,
    state: &mut SourceState,
    tx: &watch::Sender<Option<Cluster>>,
) -> Result<NetworkConfig> {
    let text = store.config_text().await?;
    let running = tx.borrow().clone();
    let Some(running) = running else { return store.config().await };
    let new = text.as_deref().map(|t| NetworkConfig::parse_with(t, &store.backend));
    match new {
        Some(Ok(new)) if super::lease::subnet_outside(&new, &running.subnet).is_none() => {
            // Changed (seen by the watch, or while etcd was out of reach).
            if new != running.config {
                let changes = super::lease::describe_config_change(&running.config, &new);
                log!(info, "the network config changed: {changes}; applying it");
            }
            Ok(new)
        }
        _ => {
            report_config(state, text.as_deref(), &running);
            Ok(running.config)
        }
    }
}

/// Logs once that the config in the store changed to `text` and is not applied: not valid, or not holding
/// the node's subnet.
fn report_config(state: &mut SourceState, text: Option<&[u8]>, running: &Cluster) {
    let key = text.map(<[u8]>::to_vec).unwrap_or_default();
    if state.reported_config.as_ref() == Some(&key) {
        return;
    }
    state.reported_config = Some(key);
    let why = match text.map(|t| NetworkConfig::parse_with(t, &state.backend)) {
        None => "it was deleted".to_string(),
        Some(Err(e)) => format!("it is not valid ({e})"),
        Some(Ok(new)) => {
            let changes = super::lease::describe_config_change(&running.config, &new);
            let misfit = super::lease::subnet_outside(&new, &running.subnet).map(|e| e.to_string()).unwrap_or_default();
            format!("{changes}, and {misfit}")
        }
    };
    log!(
        error,
        "the network config changed: {why}; this node keeps running with the config it started with (subnet {}, \
         network {}); a restart refuses to start until the config holds its subnet again or the node is cleaned up",
        running.subnet,
        running.config.networks().iter().map(|n| n.to_string()).collect::<Vec<_>>().join(" ")
    );
}

/// Following the store while the node holds its lease.
struct Watch<'a> {
    store: &'a mut EtcdStore,
    options: &'a EtcdOptions,
    /// The node's lease value, written back when someone else overwrites it.
    attrs: &'a LeaseAttrs,
    state: &'a mut SourceState,
    tx: &'a watch::Sender<Option<Cluster>>,
    metrics: &'a Arc<Metrics>,
}

/// What happened to the node's own key in a watch response.
enum OwnKey {
    Kept,
    Deleted,
    /// Written by someone else: its value (as read) and its etcd lease, at `revision`.
    Overwritten {
        value: String,
        lease: i64,
        revision: i64,
    },
}

impl Watch<'_> {
    /// Follows the store from `revision`, publishing each change, renews the node's lease when due, and
    /// writes its value back when another writer changed it.
    async fn run(mut self, cluster: &mut Cluster, revision: i64, renew_at: &mut Instant) -> Result<WatchEnd> {
        let own_key = self.store.lease_key(&cluster.subnet);
        let config_key = format!("{}/config", self.store.prefix);
        let mut stream = self.store.watch_leases(revision).await?;
        loop {
            let token = cluster.lease.expect("acquired");
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
                    if self.config_changed(&response, &config_key, cluster) {
                        return Ok(WatchEnd::ConfigChanged);
                    }
                    match self.apply_events(&response, &own_key, cluster) {
                        OwnKey::Kept => {}
                        OwnKey::Deleted => {
                            log!(warn, "the lease of {} was deleted (expired, revoked or removed; maybe created afresh by someone else): acquiring it again", cluster.subnet);
                            return Ok(WatchEnd::OwnLost);
                        }
                        OwnKey::Overwritten { value, lease, revision } => self.write_back(cluster, value, lease, revision).await?,
                    }
                    publish(self.tx, self.metrics, cluster);
                }
                _ = tokio::time::sleep_until(*renew_at) => {
                    let Some(remaining) = self.store.renew(token).await? else {
                        log!(warn, "etcd lease {token} of {} is gone: acquiring again", cluster.subnet);
                        return Ok(WatchEnd::OwnLost);
                    };
                    Metrics::inc(&self.metrics.lease_renewals_total);
                    *renew_at = Instant::now() + remaining.saturating_sub(self.options.renew_margin).max(Duration::from_secs(1));
                }
            }
        }
    }

    /// The node's key was written by someone else: the node keeps its subnet (its pods have their addresses
    /// from it) and writes its value back at once, on a new etcd lease; who wrote it is logged once.
    async fn write_back(&mut self, cluster: &mut Cluster, value: String, lease: i64, revision: i64) -> Result<()> {
        let who = format!("value {value}, etcd lease {lease:x}");
        if self.state.reported_overwrite.as_ref() != Some(&who) {
            log!(
                error,
                "the lease of this node's subnet {} was overwritten by another writer ({who}): writing it back",
                cluster.subnet
            );
            self.state.reported_overwrite = Some(who);
        }
        Metrics::inc(&self.metrics.own_lease_rewrites_total);
        let old = cluster.lease.expect("acquired");
        // Written only over the value just seen: a newer write is seen by the watch, and answered in turn.
        if let Some(token) = self.store.replace(cluster.subnet, self.attrs, revision).await? {
            if old.0 != lease {
                self.store.revoke(old).await;
            }
            cluster.lease = Some(token);
            self.state.previous.lease = Some(token);
        }
        Ok(())
    }

    /// True when the network config changed into one to apply now; a change that is not applied is logged.
    fn config_changed(&mut self, response: &WatchResponse, config_key: &str, cluster: &Cluster) -> bool {
        let Some(event) =
            response.events().iter().rev().find(|e| e.kv().is_some_and(|kv| kv.key() == config_key.as_bytes()))
        else {
            return false;
        };
        let text = match event.event_type() {
            EventType::Put => event.kv().map(|kv| kv.value().to_vec()),
            EventType::Delete => None,
        };
        match text.as_deref().map(|t| NetworkConfig::parse_with(t, &self.state.backend)) {
            Some(Ok(new)) if new == cluster.config => false,
            // Applied (and logged) by the session, which reads the config again.
            Some(Ok(new)) if super::lease::subnet_outside(&new, &cluster.subnet).is_none() => {
                self.state.reported_config = None;
                true
            }
            _ => {
                report_config(self.state, text.as_deref(), cluster);
                false
            }
        }
    }

    /// Applies a watch response's lease events to the peers; what became of the node's own key.
    fn apply_events(&mut self, response: &WatchResponse, own_key: &str, cluster: &mut Cluster) -> OwnKey {
        let prefix = self.store.subnets_prefix();
        let token = cluster.lease.expect("acquired");
        let mut own = OwnKey::Kept;
        for event in response.events() {
            let Some(kv) = event.kv() else { continue };
            let key = String::from_utf8_lossy(kv.key());
            if !key.starts_with(&prefix) {
                continue;
            }
            if key == own_key {
                own = match event.event_type() {
                    EventType::Delete => OwnKey::Deleted,
                    // Ours: on our etcd lease with our value.
                    EventType::Put
                        if kv.lease() == token.0 && LeaseAttrs::parse(kv.value()).ok().as_ref() == Some(self.attrs) =>
                    {
                        OwnKey::Kept
                    }
                    // Deleted and created afresh (by a node that found the subnet free, maybe): not ours to write
                    // back; acquiring again decides, as at a start.
                    EventType::Put if matches!(own, OwnKey::Deleted) || kv.create_revision() == kv.mod_revision() => {
                        OwnKey::Deleted
                    }
                    EventType::Put => {
                        let shown = &kv.value()[..kv.value().len().min(200)];
                        OwnKey::Overwritten {
                            value: String::from_utf8_lossy(shown).into_owned(),
                            lease: kv.lease(),
                            revision: kv.mod_revision(),
                        }
                    }
                };
                continue;
            }
            if event.event_type() == EventType::Delete {
                self.store.forget(&key);
                if let Ok((subnet, _)) = lease_entry(&prefix, &key, b"{}") {
                    cluster.peers.remove(&subnet);
                }
                continue;
            }
            match lease_entry(&prefix, &key, kv.value()) {
                Ok((subnet, attrs)) => {
                    self.store.forget(&key);
                    cluster.peers.insert(subnet, Peer { attrs, created: kv.create_revision() });
                }
                Err(why) => {
                    self.store.ignore(&key, &why);
                    // A lease's key whose value is no longer a lease: that subnet has no peer any more.
                    if let Ok((subnet, _)) = lease_entry(&prefix, &key, b"{}") {
                        cluster.peers.remove(&subnet);
                    }
                }
            }
        }
        own
    }
}
