//! The etcd v3 source, in flannel's layout: `<prefix>/config`, and `<prefix>/subnets/<a.b.c.d>-<len>` holding
//! each node's lease on an etcd lease with a TTL.
//!
//! - Acquiring (flannel's order): this node's lease found by its public IP is kept (no write when it is alive
//!   and unchanged); else the previous subnet (remembered in memory or in `subnet.env`) is taken when free, or
//!   when the etcd lease holding it is the one this node remembers (its address changed); else a random free
//!   subnet among the first 100. Every write is a transaction conditioned on the key (created only when
//!   absent, replaced only at the revision read), so no two nodes ever get one subnet; a lost race retries.
//! - Renewing: a keep-alive of the etcd lease when its remaining time is under the renew margin; an expired or
//!   revoked lease, or our key deleted or taken, makes the node acquire again (not exit).
//! - Peers: one range read, then a watch from the next revision. A compacted revision relists at once; a
//!   lost stream or connection reconnects with backoff (100 ms doubling to 5 s, plus up to half again at
//!   random), and relists.
//!
//! Unlike flanneld, leases are read without a `TimeToLive` request per key (a cold start costs one range
//! request, not one per node).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{
    Certificate, Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, Identity, PutOptions, TlsOptions,
    Txn, TxnOp, WatchOptions,
};
use ipnet::Ipv4Net;
use tokio::sync::watch;
use tokio::time::{sleep, Instant};

use super::{Cluster, NodeIdentity};
use crate::flannel::{parse_subnet_key, subnet_key, LeaseAttrs, NetworkConfig};
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

/// A subnet remembered from an earlier run or acquisition: taken again first.
#[derive(Debug, Clone, Copy, Default)]
pub struct Previous {
    pub subnet: Option<Ipv4Net>,
    pub lease_id: Option<i64>,
}

type Error = String;

fn describe(e: etcd_client::Error) -> String {
    // The transport error's sources carry the reason (connection refused, a certificate refused, ...).
    let mut text = e.to_string();
    let mut source = std::error::Error::source(&e);
    while let Some(inner) = source {
        let inner_text = inner.to_string();
        if !text.contains(&inner_text) {
            text.push_str(": ");
            text.push_str(&inner_text);
        }
        source = inner.source();
    }
    text
}

/// True for the ways a connection shows as closed by the server once TLS is set up (rather than not made).
fn closed_after_handshake(error: &str) -> bool {
    let not_connected = [
        "tcp connect",
        "Connection refused",
        "timed out",
        "No route to host",
        "certificate verify",
        "InvalidCertificate",
    ];
    let closed = ["connection closed", "canceled", "broken pipe", "Connection reset", "transport error"];
    closed.iter().any(|c| error.contains(c)) && !not_connected.iter().any(|c| error.contains(c))
}

/// An etcd client with the agent's counters.
pub struct Store {
    client: Client,
    prefix: String,
    metrics: Arc<Metrics>,
}

impl Store {
    pub async fn connect(options: &EtcdOptions, metrics: Arc<Metrics>) -> Result<Store, Error> {
        let mut connect = ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(3))
            .with_timeout(Duration::from_secs(5))
            // etcd refuses HTTP/2 pings more often than every 5 s (--grpc-keepalive-min-time) with a GOAWAY.
            .with_keep_alive(Duration::from_secs(10), Duration::from_secs(5));
        if options.cafile.is_some() || options.certfile.is_some() {
            let mut tls = TlsOptions::new();
            if let Some(ca) = &options.cafile {
                let pem = std::fs::read(ca).map_err(|e| format!("--etcd-cafile {}: {e}", ca.display()))?;
                tls = tls.ca_certificate(Certificate::from_pem(pem));
            }
            match (&options.certfile, &options.keyfile) {
                (Some(cert), Some(key)) => {
                    let cert_pem =
                        std::fs::read(cert).map_err(|e| format!("--etcd-certfile {}: {e}", cert.display()))?;
                    let key_pem = std::fs::read(key).map_err(|e| format!("--etcd-keyfile {}: {e}", key.display()))?;
                    tls = tls.identity(Identity::from_pem(cert_pem, key_pem));
                }
                (None, None) => {}
                _ => return Err("--etcd-certfile and --etcd-keyfile go together".into()),
            }
            connect = connect.with_tls(tls);
        }
        Metrics::inc(&metrics.etcd_requests_total);
        let client = Client::connect(&options.endpoints, Some(connect)).await.map_err(describe)?;
        let mut store = Store { client, prefix: options.prefix.trim_end_matches('/').to_string(), metrics };
        // The connection is lazy: a first request tells whether the endpoints (and TLS) work. With TLS 1.3 a
        // refused client certificate shows only as a connection closed after the handshake: say so.
        match store.config_text().await {
            Ok(_) => Ok(store),
            Err(e) if options.certfile.is_some() && closed_after_handshake(&e) => Err(format!(
                "etcd closed the connection right after the TLS handshake: it most likely refused the client \
                 certificate {} (not signed by a CA that etcd trusts with --trusted-ca-file?) ({e})",
                options.certfile.as_ref().expect("checked").display()
            )),
            Err(e) => Err(e),
        }
    }

    fn counted<T>(&self, result: Result<T, etcd_client::Error>) -> Result<T, Error> {
        Metrics::inc(&self.metrics.etcd_requests_total);
        result.map_err(|e| {
            Metrics::inc(&self.metrics.etcd_errors_total);
            describe(e)
        })
    }

    fn subnets_prefix(&self) -> String {
        format!("{}/subnets/", self.prefix)
    }

    fn lease_key(&self, subnet: &Ipv4Net) -> String {
        format!("{}/subnets/{}", self.prefix, subnet_key(subnet))
    }

    async fn config_text(&mut self) -> Result<Option<Vec<u8>>, Error> {
        let key = format!("{}/config", self.prefix);
        let response = self.client.get(key, None).await;
        let response = self.counted(response)?;
        Ok(response.kvs().first().map(|kv| kv.value().to_vec()))
    }

    pub async fn config(&mut self) -> Result<NetworkConfig, Error> {
        match self.config_text().await? {
            Some(text) => NetworkConfig::parse(&text),
            None => Err(format!(
                "no network config at {}/config (etcdctl put {}/config '{{\"Network\":\"10.244.0.0/16\",\"Backend\":{{\"Type\":\"vxlan\"}}}}')",
                self.prefix, self.prefix
            )),
        }
    }

    /// Every lease: subnet -> (attrs, etcd lease id, mod revision), and the revision of the read.
    pub async fn leases(&mut self) -> Result<(BTreeMap<Ipv4Net, (LeaseAttrs, i64, i64)>, i64), Error> {
        let response = self.client.get(self.subnets_prefix(), Some(GetOptions::new().with_prefix())).await;
        let response = self.counted(response)?;
        let revision = response.header().map(|h| h.revision()).unwrap_or(0);
        let mut leases = BTreeMap::new();
        for kv in response.kvs() {
            let Some(subnet) = parse_subnet_key(&String::from_utf8_lossy(kv.key())) else { continue };
            match LeaseAttrs::parse(kv.value()) {
                Ok(attrs) => {
                    leases.insert(subnet, (attrs, kv.lease(), kv.mod_revision()));
                }
                Err(e) => log!(warn, "ignoring lease {subnet}: {e}"),
            }
        }
        Ok((leases, revision))
    }

    async fn grant(&mut self, ttl: Duration) -> Result<i64, Error> {
        let response = self.client.lease_grant(ttl.as_secs().max(2) as i64, None).await;
        Ok(self.counted(response)?.id())
    }

    async fn revoke(&mut self, id: i64) {
        let response = self.client.lease_revoke(id).await;
        let _ = self.counted(response);
    }

    /// Remaining seconds of an etcd lease (0: expired or revoked).
    async fn remaining(&mut self, id: i64) -> Result<i64, Error> {
        let response = self.client.lease_time_to_live(id, None).await;
        Ok(self.counted(response)?.ttl().max(0))
    }

    /// Writes `attrs` at `subnet`'s key on a new etcd lease if `compare` holds; the new lease id, or None when
    /// the condition failed (someone else got there first).
    async fn put_if(
        &mut self,
        subnet: &Ipv4Net,
        attrs: &LeaseAttrs,
        compare: Compare,
        ttl: Duration,
    ) -> Result<Option<i64>, Error> {
        let id = self.grant(ttl).await?;
        let put = TxnOp::put(self.lease_key(subnet), attrs.to_json(), Some(PutOptions::new().with_lease(id)));
        let response = self.client.txn(Txn::new().when([compare]).and_then([put])).await;
        match self.counted(response) {
            Ok(response) if response.succeeded() => Ok(Some(id)),
            Ok(_) => {
                self.revoke(id).await;
                Ok(None)
            }
            Err(e) => {
                self.revoke(id).await;
                Err(e)
            }
        }
    }

    /// Acquires this node's subnet (see the module's docs): (subnet, etcd lease id).
    pub async fn acquire(
        &mut self,
        config: &NetworkConfig,
        attrs: &LeaseAttrs,
        previous: Previous,
        ttl: Duration,
    ) -> Result<(Ipv4Net, i64), Error> {
        for attempt in 0u32.. {
            let (leases, _) = self.leases().await?;
            // Ours by public IP: keep it (rewritten only when its value changed or its etcd lease is gone).
            let mine =
                leases.iter().find(|(subnet, (a, _, _))| a.public_ip == attrs.public_ip && config.allows(subnet));
            if let Some((subnet, (current, id, revision))) = mine {
                let key = self.lease_key(subnet);
                if current == attrs && self.remaining(*id).await? > 0 {
                    return Ok((*subnet, *id));
                }
                if let Some(id) =
                    self.put_if(subnet, attrs, Compare::mod_revision(key, CompareOp::Equal, *revision), ttl).await?
                {
                    return Ok((*subnet, id));
                }
                continue;
            }
            // The previous subnet: free, or held by the etcd lease this node remembers (its address changed).
            if let Some(subnet) = previous.subnet.filter(|s| config.allows(s)) {
                let key = self.lease_key(&subnet);
                let outcome = match leases.get(&subnet) {
                    None => self.put_if(&subnet, attrs, Compare::version(key, CompareOp::Equal, 0), ttl).await?,
                    Some((_, id, revision)) if Some(*id) == previous.lease_id => {
                        let taken = self
                            .put_if(&subnet, attrs, Compare::mod_revision(key, CompareOp::Equal, *revision), ttl)
                            .await?;
                        if taken.is_some() {
                            self.revoke(*id).await;
                        }
                        taken
                    }
                    Some(_) => None,
                };
                if let Some(id) = outcome {
                    return Ok((subnet, id));
                }
            }
            let taken: Vec<Ipv4Net> = leases.keys().copied().collect();
            let free = config.free_subnets(&taken, 100);
            if free.is_empty() {
                return Err(format!("out of subnets: every /{} of {} is leased", config.subnet_len, config.network));
            }
            let subnet = free[random_below(free.len())];
            let key = self.lease_key(&subnet);
            if let Some(id) = self.put_if(&subnet, attrs, Compare::version(key, CompareOp::Equal, 0), ttl).await? {
                return Ok((subnet, id));
            }
            // Lost a race for that subnet: read again, after a short random pause when it keeps happening.
            if attempt > 2 {
                sleep(Duration::from_millis(random_below(50) as u64)).await;
            }
        }
        unreachable!()
    }

    /// Keeps the etcd lease alive once; its remaining TTL (0: it is gone).
    pub async fn keep_alive(&mut self, id: i64) -> Result<i64, Error> {
        let keeper = self.client.lease_keep_alive(id).await;
        let (mut keeper, mut stream) = self.counted(keeper)?;
        keeper.keep_alive().await.map_err(describe)?;
        match stream.message().await.map_err(describe)? {
            Some(response) => Ok(response.ttl()),
            None => Ok(0),
        }
    }

    /// Deletes this node's lease (the node leaves: peers remove their routes to it).
    pub async fn release(&mut self, subnet: &Ipv4Net, lease_id: Option<i64>) -> Result<(), Error> {
        let response = self.client.delete(self.lease_key(subnet), None).await;
        self.counted(response)?;
        if let Some(id) = lease_id {
            self.revoke(id).await;
        }
        Ok(())
    }
}

/// A random index below `n` (std's randomly keyed hasher: enough to spread nodes over free subnets).
fn random_below(n: usize) -> usize {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0),
    );
    (hasher.finish() % n.max(1) as u64) as usize
}

/// Why a session of [`run`] ended.
enum Ended {
    /// Connection or request failure: reconnect after a backoff.
    Failed(Error),
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
        let Ended::Failed(e) = session(&options, &node, &mut previous, &tx, &metrics).await;
        Metrics::set(&metrics.store_connected, 0);
        Metrics::inc(&metrics.etcd_errors_total);
        log!(
            error,
            "etcd {}: {e}; the data plane is kept as it is, retrying in {backoff:?}",
            options.endpoints.join(",")
        );
        if started.elapsed() > Duration::from_secs(30) {
            backoff = Duration::from_millis(100);
        }
        // Jittered, so that thousands of agents cut off together do not come back together.
        sleep(backoff + Duration::from_millis(random_below(backoff.as_millis() as usize / 2 + 1) as u64)).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

async fn session(
    options: &EtcdOptions,
    node: &NodeIdentity,
    previous: &mut Previous,
    tx: &watch::Sender<Option<Cluster>>,
    metrics: &Arc<Metrics>,
) -> Ended {
    match session_inner(options, node, previous, tx, metrics).await {
        Ok(never) => match never {},
        Err(e) => Ended::Failed(e),
    }
}

enum Never {}

async fn session_inner(
    options: &EtcdOptions,
    node: &NodeIdentity,
    previous: &mut Previous,
    tx: &watch::Sender<Option<Cluster>>,
    metrics: &Arc<Metrics>,
) -> Result<Never, Error> {
    let mut store = Store::connect(options, metrics.clone()).await?;
    Metrics::set(&metrics.store_connected, 1);
    let config = store.config().await?;
    let attrs = node.attrs(&config);
    'acquire: loop {
        let (subnet, lease_id) = store.acquire(&config, &attrs, *previous, options.lease_ttl).await?;
        Metrics::inc(&metrics.lease_acquisitions_total);
        if previous.subnet != Some(subnet) {
            log!(info, "acquired subnet {subnet} (etcd lease {lease_id:x})");
        }
        *previous = Previous { subnet: Some(subnet), lease_id: Some(lease_id) };
        let own_key = store.lease_key(&subnet);
        // The first keep-alive tells how long the lease (maybe an older one, kept) has left.
        let mut renew_at = Instant::now();
        loop {
            // List, publish, then watch from the next revision.
            let (leases, revision) = store.leases().await?;
            let peers: BTreeMap<Ipv4Net, LeaseAttrs> =
                leases.into_iter().filter(|(s, _)| *s != subnet).map(|(s, (a, _, _))| (s, a)).collect();
            let mut cluster = Cluster { config: config.clone(), subnet, lease_id: Some(lease_id), peers };
            publish(tx, &cluster, metrics);
            Metrics::inc(&metrics.watch_restarts_total);
            Metrics::inc(&metrics.etcd_requests_total);
            let watch_options = WatchOptions::new().with_prefix().with_start_revision(revision + 1);
            let mut stream = store.client.watch(store.subnets_prefix(), Some(watch_options)).await.map_err(describe)?;
            loop {
                tokio::select! {
                    message = stream.message() => {
                        let Some(response) = message.map_err(describe)? else {
                            return Err("the watch of leases ended".into());
                        };
                        if response.compact_revision() > 0 {
                            log!(warn, "watch fell behind compaction (revision {}): relisting", response.compact_revision());
                            break;
                        }
                        if response.canceled() {
                            return Err(format!("watch canceled: {}", response.cancel_reason()));
                        }
                        let mut own_lost = false;
                        for event in response.events() {
                            let Some(kv) = event.kv() else { continue };
                            let key = String::from_utf8_lossy(kv.key());
                            let Some(peer) = parse_subnet_key(&key) else { continue };
                            if key == own_key {
                                // Deleted (expired, revoked, removed by hand) or overwritten by someone else.
                                let ours = event.event_type() == EventType::Put && kv.lease() == lease_id;
                                if !ours {
                                    own_lost = true;
                                }
                                continue;
                            }
                            match event.event_type() {
                                EventType::Put => match LeaseAttrs::parse(kv.value()) {
                                    Ok(attrs) => { cluster.peers.insert(peer, attrs); }
                                    Err(e) => log!(warn, "ignoring lease {peer}: {e}"),
                                },
                                EventType::Delete => { cluster.peers.remove(&peer); }
                            }
                        }
                        if own_lost {
                            log!(warn, "lease of {subnet} expired, was revoked or taken: acquiring again");
                            continue 'acquire;
                        }
                        publish(tx, &cluster, metrics);
                    }
                    _ = tokio::time::sleep_until(renew_at) => {
                        let remaining = store.keep_alive(lease_id).await?;
                        if remaining <= 0 {
                            log!(warn, "etcd lease {lease_id:x} of {subnet} is gone: acquiring again");
                            continue 'acquire;
                        }
                        let remaining = Duration::from_secs(remaining as u64);
                        renew_at = Instant::now() + remaining.saturating_sub(options.renew_margin).max(Duration::from_secs(1));
                    }
                }
            }
        }
    }
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
