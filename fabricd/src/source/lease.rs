//! The lease model and the allocation policy every store shares: a lease's key and value as read from the store
//! ([`lease_entry`]), the cluster a source publishes ([`Cluster`]), the conditional operations of a store
//! ([`LeaseStore`]) and the policy written once against them ([`acquire`], [`find_own`], [`snapshot`]); and
//! what every source does alike: [`publish`] a cluster read, wait with [`Backoff`] before trying its store again.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use ipnet::IpNet;
use tokio::sync::watch;

use crate::error::{ConfigError, Error, Result, StoreError};
use crate::family::overlaps;
use crate::family::Family;
use crate::flannel::{parse_subnet_key, subnet_key, LeaseAttrs, NetworkConfig, SubnetKey};
use crate::log::log;
use crate::metrics::Metrics;

/// The largest value read as a lease. A lease that fabricd or flanneld writes is under 400 bytes (a dual-stack
/// vxlan lease with both families' data); a larger value is not a lease, and is not kept in memory.
pub const MAX_LEASE_VALUE: usize = 4096;

/// Why an entry under the leases' prefix is not read as a lease.
#[derive(Debug)]
pub enum NotALease {
    /// The key is not exactly the key fabricd writes for a subnet; `canonical`: that key, when the key is an
    /// alias of one.
    Key { canonical: Option<String> },
    /// The value is larger than any lease.
    TooLarge { bytes: usize },
    /// The value is larger than a response fabricd reads.
    Unreadable { limit: usize },
    /// The value is not a lease.
    Value(crate::flannel::FormatError),
}

impl std::fmt::Display for NotALease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NotALease::Key { canonical: Some(canonical) } => {
                write!(f, "not a lease key (the key of that subnet is exactly .../subnets/{canonical})")
            }
            NotALease::Key { canonical: None } => write!(f, "not a lease key (.../subnets/<address>-<length>)"),
            NotALease::TooLarge { bytes } => {
                write!(f, "its value is {bytes} bytes, larger than any lease ({MAX_LEASE_VALUE})")
            }
            NotALease::Unreadable { limit } => write!(f, "its value is larger than {limit} bytes"),
            NotALease::Value(why) => write!(f, "{why}"),
        }
    }
}

/// A lease read from the store: its subnets, when `key` is exactly the key fabricd writes for them under
/// `subnets_prefix` and the value is no larger than a lease. Anything else names no subnet: an alias of a
/// subnet's key (`10.244.1.0-024`, `10.244.1.0-+24`, a trailing space, a nested `subnets/x/10.244.1.0-24`)
/// would otherwise let a second key speak for a node's subnet.
pub fn lease_entry(subnets_prefix: &str, key: &str, value: &[u8]) -> Result<(SubnetKey, LeaseAttrs), NotALease> {
    let last = key.strip_prefix(subnets_prefix).unwrap_or(key);
    let subnet = parse_subnet_key(last).filter(|subnet| !last.contains('/') && subnet_key(subnet) == last);
    let Some(subnet) = subnet else {
        let alias = last.rsplit('/').next().map(str::trim).and_then(|l| {
            let (address, length) = l.rsplit_once('-')?;
            let length: u8 = length.trim_start_matches('+').parse().ok()?;
            parse_subnet_key(&format!("{address}-{length}"))
        });
        return Err(NotALease::Key { canonical: alias.map(|s| subnet_key(&s)) });
    };
    if value.len() > MAX_LEASE_VALUE {
        return Err(NotALease::TooLarge { bytes: value.len() });
    }
    let attrs = LeaseAttrs::parse(value).map_err(NotALease::Value)?;
    Ok((subnet, attrs))
}

/// Entries under the leases' prefix that are not used, each logged once (again when the reason changes).
#[derive(Debug, Default)]
pub struct IgnoredKeys {
    logged: BTreeMap<String, String>,
}

impl IgnoredKeys {
    /// Logs `key` as ignored for `reason`, unless it already was for that reason.
    pub fn ignore(&mut self, key: &str, reason: &NotALease) {
        let reason = reason.to_string();
        if self.logged.get(key) != Some(&reason) {
            log!(error, "ignoring {key:?} under the leases: {reason}");
            self.logged.insert(key.to_string(), reason);
        }
    }

    /// `key` was deleted or is a lease again.
    pub fn forget(&mut self, key: &str) {
        self.logged.remove(key);
    }

    pub fn len(&self) -> usize {
        self.logged.len()
    }
}

/// The store's handle of a node's lease (etcd: the id of the etcd lease holding the key). Written to
/// `subnet.env` as `FABRIC_LEASE`, so that a node whose address changed recognises its own lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LeaseToken(pub i64);

impl std::fmt::Display for LeaseToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:x}", self.0)
    }
}

/// Another node, as its lease says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    pub attrs: LeaseAttrs,
    /// When the lease was created, in the store's order (etcd: its create revision; static: its position):
    /// of two leases claiming one address or VTEP MAC, the older is used.
    pub created: i64,
}

/// Of two leases claiming one subnet, address or tunnel identity, the one ordered first keeps it: the older
/// (`created`, the store's order), and of two made at once the lower key. Written once, for the plan, its
/// second keys and the dual-stack twin check of [`acquire`], so that every node judges alike.
pub fn seniority(created: i64, key: SubnetKey) -> (i64, SubnetKey) {
    (created, key)
}

impl Peer {
    /// See [`seniority`].
    pub fn seniority(&self, key: SubnetKey) -> (i64, SubnetKey) {
        seniority(self.created, key)
    }
}

/// What the node must look like, as far as the store says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cluster {
    pub config: NetworkConfig,
    /// This node's subnets.
    pub subnet: SubnetKey,
    /// The store's handle of this node's lease (None in static mode).
    pub lease: Option<LeaseToken>,
    /// Every other node: subnets -> its lease.
    pub peers: BTreeMap<SubnetKey, Peer>,
}

/// What the node tells the store about itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeIdentity {
    /// The node's public addresses (`--public-ip`, `--public-ipv6`, or the underlay interface's).
    pub public_ip: Option<Ipv4Addr>,
    pub public_ipv6: Option<Ipv6Addr>,
}

impl NodeIdentity {
    pub fn public(&self, family: Family) -> Option<IpAddr> {
        match family {
            Family::V4 => self.public_ip.map(IpAddr::V4),
            Family::V6 => self.public_ipv6.map(IpAddr::V6),
        }
    }

    /// The lease value for `config`'s families and backend; an error when the node has no public address of
    /// an enabled family.
    pub fn attrs(&self, config: &NetworkConfig) -> Result<LeaseAttrs> {
        let data = |family: Family| match self.public(family).filter(|_| config.family(family).is_some()) {
            Some(local) => config.backend.lease_data(family, local).map_err(|e| Error::io("the backend's key", e)),
            None => Ok(None),
        };
        for plan in config.families() {
            if self.public(plan.family()).is_none() {
                return Err(ConfigError::NoPublicAddressOf { family: plan.family(), network: plan.network }.into());
            }
        }
        Ok(LeaseAttrs {
            public_ip: self.public_ip.filter(|_| config.v4.is_some()),
            public_ipv6: self.public_ipv6.filter(|_| config.v6.is_some()),
            backend_type: config.backend.type_name().to_string(),
            backend_data: data(Family::V4)?,
            backend_v6_data: data(Family::V6)?,
        })
    }
}

/// A subnet remembered from an earlier run or acquisition: taken again first.
#[derive(Debug, Clone, Copy, Default)]
pub struct Previous {
    pub subnet: Option<SubnetKey>,
    pub lease: Option<LeaseToken>,
}

/// One lease as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredLease {
    pub attrs: LeaseAttrs,
    pub token: LeaseToken,
    /// The store's version of the value (etcd: mod revision): a replacement is conditioned on it.
    pub revision: i64,
    /// See [`Peer::created`].
    pub created: i64,
}

/// Every lease, and the store's revision of the read (a watch starts after it).
#[derive(Debug, Clone, Default)]
pub struct Listing {
    pub leases: BTreeMap<SubnetKey, StoredLease>,
    pub revision: i64,
}

impl Listing {
    /// Every lease but `own`'s, as peers.
    pub fn peers_of(&self, own: SubnetKey) -> BTreeMap<SubnetKey, Peer> {
        self.leases
            .iter()
            .filter(|(subnet, _)| **subnet != own)
            .map(|(subnet, lease)| (*subnet, Peer { attrs: lease.attrs.clone(), created: lease.created }))
            .collect()
    }
}

/// A store of leases: the operations the allocation policy needs, each one request. Writes are conditional,
/// so that no two nodes ever hold one subnet.
#[allow(async_fn_in_trait)]
pub trait LeaseStore {
    /// The cluster's network config.
    async fn config(&mut self) -> Result<NetworkConfig>;
    /// Every lease.
    async fn leases(&mut self) -> Result<Listing>;
    /// Writes `attrs` at `subnet` on a new lease if no lease is there; its token, or None when there is one.
    async fn create(&mut self, subnet: SubnetKey, attrs: &LeaseAttrs) -> Result<Option<LeaseToken>>;
    /// Writes `attrs` at `subnet` on a new lease if the value there is still at `revision`; its token, or
    /// None when it changed.
    async fn replace(&mut self, subnet: SubnetKey, attrs: &LeaseAttrs, revision: i64) -> Result<Option<LeaseToken>>;
    /// True while the lease has time left.
    async fn alive(&mut self, token: LeaseToken) -> Result<bool>;
    /// Ends a lease (its key goes with it); failures are counted, not reported.
    async fn revoke(&mut self, token: LeaseToken);
    /// Renews the lease once; its remaining time (None: it is gone).
    async fn renew(&mut self, token: LeaseToken) -> Result<Option<Duration>>;
    /// Deletes the lease at `subnet` (the node leaves: peers remove their routes to it), and ends `token`.
    async fn release(&mut self, subnet: SubnetKey, token: Option<LeaseToken>) -> Result<()>;
}

/// What one step of [`acquire`] came to.
enum Attempt {
    Acquired(SubnetKey, LeaseToken),
    /// The store changed under the step (a lost race, a lease given back): read the leases again.
    ReadAgain,
    /// Not this step's case: on to the next.
    NotHere,
}

/// Acquires this node's subnet, in flannel's order: the lease with this node's public IP is kept (no write
/// when it is alive and unchanged); else the previous subnet when free, or when the lease holding it is the
/// one this node remembers (its address changed); else a random free subnet among the first 100. A lost race
/// reads again.
pub async fn acquire<S: LeaseStore>(
    store: &mut S,
    config: &NetworkConfig,
    attrs: &LeaseAttrs,
    mut previous: Previous,
) -> Result<(SubnetKey, LeaseToken)> {
    let address = attrs.node_address().ok_or(ConfigError::NoPublicAddress)?;
    for attempt in 0u32.. {
        let listing = store.leases().await?;
        // A node keeps the subnet its pods have their addresses from, or does not start.
        let held = own_by_address(&listing, address, previous, |_| true).map(|(subnet, _)| *subnet);
        if let Some(error) = held.or(previous.subnet).and_then(|subnet| subnet_outside(config, &subnet)) {
            return Err(error);
        }
        // One step after the other, each only when the one before was not this node's case.
        let mut outcome = keep_own_lease(store, &listing, config, attrs, address, &mut previous).await?;
        if matches!(outcome, Attempt::NotHere) {
            outcome = take_previous_subnet(store, &listing, config, attrs, previous).await?;
        }
        match outcome {
            Attempt::Acquired(subnet, token) => return Ok((subnet, token)),
            Attempt::ReadAgain => continue,
            Attempt::NotHere => {}
        }
        let subnet = free_subnet(&listing, config, previous)?;
        if let Some(token) = store.create(subnet, attrs).await? {
            if gave_back_to_an_older_twin(store, subnet, token).await? {
                continue;
            }
            return Ok((subnet, token));
        }
        // Lost a race for that subnet: read again, after a short random pause when it keeps happening.
        if attempt > 2 {
            tokio::time::sleep(Duration::from_millis(random_below(50) as u64)).await;
        }
    }
    unreachable!()
}

/// The lease with this node's public address: kept (rewritten only when its value changed or its lease is
/// gone). One that no longer fits the config (a family enabled or disabled since) is deleted, as flanneld does,
/// and its subnets that still fit are taken again first (a cluster that turns on IPv6 keeps its IPv4 subnets).
async fn keep_own_lease<S: LeaseStore>(
    store: &mut S,
    listing: &Listing,
    config: &NetworkConfig,
    attrs: &LeaseAttrs,
    address: IpAddr,
    previous: &mut Previous,
) -> Result<Attempt> {
    if let Some((subnet, lease)) = own_by_address(listing, address, *previous, |subnet| config.allows(subnet)) {
        if lease.attrs == *attrs && store.alive(lease.token).await? {
            return Ok(Attempt::Acquired(*subnet, lease.token));
        }
        return Ok(match store.replace(*subnet, attrs, lease.revision).await? {
            Some(token) => Attempt::Acquired(*subnet, token),
            None => Attempt::ReadAgain,
        });
    }
    if let Some((stale, lease)) = own_by_address(listing, address, *previous, |_| true) {
        log!(info, "the lease of {stale} does not fit the network config (its families changed): replacing it");
        store.release(*stale, Some(lease.token)).await?;
        *previous = Previous { subnet: Some(*stale), lease: None };
        return Ok(Attempt::ReadAgain);
    }
    Ok(Attempt::NotHere)
}

/// The previous subnet: free, or held by the lease this node remembers (its address changed), or overwritten
/// by someone else: by a plain put (no etcd lease: no node writes its lease so), or written over (not deleted
/// and created afresh, as another node would) while the etcd lease this node remembers still lives.
async fn take_previous_subnet<S: LeaseStore>(
    store: &mut S,
    listing: &Listing,
    config: &NetworkConfig,
    attrs: &LeaseAttrs,
    previous: Previous,
) -> Result<Attempt> {
    let Some(subnet) = previous.subnet.filter(|s| config.allows(s)) else { return Ok(Attempt::NotHere) };
    let overwritten = match (listing.leases.get(&subnet), previous.lease) {
        (Some(lease), _) if lease.token.0 == 0 => true,
        (Some(lease), Some(remembered)) if lease.token != remembered && lease.revision > lease.created => {
            store.alive(remembered).await?
        }
        _ => false,
    };
    let outcome = match listing.leases.get(&subnet) {
        None => store.create(subnet, attrs).await?,
        Some(lease) if overwritten => {
            log!(
                error,
                "the lease of this node's subnet {subnet} was overwritten by another writer ({}, etcd lease {}): \
                 writing it back",
                lease.attrs.to_json(),
                lease.token
            );
            store.replace(subnet, attrs, lease.revision).await?
        }
        Some(lease) if Some(lease.token) == previous.lease => {
            let taken = store.replace(subnet, attrs, lease.revision).await?;
            if taken.is_some() {
                store.revoke(lease.token).await;
            }
            taken
        }
        Some(_) => None,
    };
    Ok(match outcome {
        Some(token) if gave_back_to_an_older_twin(store, subnet, token).await? => Attempt::ReadAgain,
        Some(token) => Attempt::Acquired(subnet, token),
        None => Attempt::NotHere,
    })
}

/// Per family: the previous subnet when it fits and is free, else a random free one among the first 100.
fn free_subnet(listing: &Listing, config: &NetworkConfig, previous: Previous) -> Result<SubnetKey> {
    let mut subnet = SubnetKey::default();
    for plan in config.families() {
        let family = plan.family();
        let taken: Vec<IpNet> = listing.leases.keys().filter_map(|key| key.get(family)).collect();
        let kept = previous
            .subnet
            .and_then(|p| p.get(family))
            .filter(|s| plan.allows(s) && !taken.iter().any(|t| overlaps(t, s)));
        let chosen = match kept {
            Some(kept) => kept,
            None => {
                let free = plan.free_subnets(&taken, 100);
                if free.is_empty() {
                    return Err(StoreError::OutOfSubnets { subnet_len: plan.subnet_len, network: plan.network }.into());
                }
                free[random_below(free.len())]
            }
        };
        match chosen {
            IpNet::V4(net) => subnet.v4 = Some(net),
            IpNet::V6(net) => subnet.v6 = Some(net),
        }
    }
    Ok(subnet)
}

/// In dual stack a lease's key names both its subnets, so the store's create-if-absent guards the pair, not each
/// subnet: two nodes that pick the same subnet of one family with different ones of the other both create their
/// keys (seen in CI: two nodes with one IPv6 subnet, each refusing the other's lease). Of two such twins the older
/// keeps the subnet, as peers judge them (plan.rs); so after writing its lease at `subnet`, the node reads the
/// leases again, and when an older one shares a subnet with its own it gives its own back (true) and picks again.
async fn gave_back_to_an_older_twin<S: LeaseStore>(
    store: &mut S,
    subnet: SubnetKey,
    token: LeaseToken,
) -> Result<bool> {
    if subnet.v4.is_none() || subnet.v6.is_none() {
        return Ok(false);
    }
    let listing = store.leases().await?;
    let Some(own) = listing.leases.get(&subnet) else { return Ok(false) };
    let shares = |other: &SubnetKey| {
        Family::ALL.iter().any(|family| match (other.get(*family), subnet.get(*family)) {
            (Some(a), Some(b)) => overlaps(&a, &b),
            _ => false,
        })
    };
    let ours = seniority(own.created, subnet);
    let older = listing
        .leases
        .iter()
        .find(|(key, lease)| **key != subnet && seniority(lease.created, **key) < ours && shares(key));
    let Some((twin, _)) = older else { return Ok(false) };
    log!(info, "the older lease of {twin} shares a subnet with {subnet}, made at the same time: giving {subnet} back");
    store.release(subnet, Some(token)).await?;
    Ok(true)
}

/// The error that keeps a node from starting when `config` does not hold `subnet` (a family both enable
/// whose subnet is not of the config's Network and SubnetLen); None when it does.
pub fn subnet_outside(config: &NetworkConfig, subnet: &SubnetKey) -> Option<Error> {
    config.families().find_map(|plan| {
        let subnet = subnet.get(plan.family())?;
        (!plan.allows(&subnet)).then_some(Error::SubnetOutsideConfig {
            subnet,
            network: plan.network,
            subnet_len: plan.subnet_len,
        })
    })
}

/// What differs between two network configs, for a log line.
pub fn describe_config_change(old: &NetworkConfig, new: &NetworkConfig) -> String {
    let mut changes = Vec::new();
    let networks = |c: &NetworkConfig| c.networks().iter().map(|n| n.to_string()).collect::<Vec<_>>().join(" ");
    if networks(old) != networks(new) {
        changes.push(format!("Network {} -> {}", networks(old), networks(new)));
    }
    let lengths = |c: &NetworkConfig| c.families().map(|f| f.subnet_len.to_string()).collect::<Vec<_>>().join(" ");
    if lengths(old) != lengths(new) {
        changes.push(format!("SubnetLen {} -> {}", lengths(old), lengths(new)));
    }
    if old.backend != new.backend {
        let (from, to) = (old.backend.type_name(), new.backend.type_name());
        changes.push(if from == to { format!("Backend {from}'s options") } else { format!("Backend {from} -> {to}") });
    }
    if changes.is_empty() {
        changes.push("SubnetMin/SubnetMax".to_string());
    }
    changes.join(", ")
}

/// The lease with this node's public address: the one at the previous subnet when there are several (another
/// may have been written by hand or by a node that had the address before), else the oldest.
fn own_by_address(
    listing: &Listing,
    address: IpAddr,
    previous: Previous,
    allowed: impl Fn(&SubnetKey) -> bool,
) -> Option<(&SubnetKey, &StoredLease)> {
    let mut candidates: Vec<(&SubnetKey, &StoredLease)> = listing
        .leases
        .iter()
        .filter(|(subnet, lease)| lease.attrs.node_address() == Some(address) && allowed(subnet))
        .collect();
    candidates.sort_by_key(|(subnet, lease)| (Some(**subnet) != previous.subnet, lease.created, **subnet));
    candidates.into_iter().next()
}

/// This node's lease in `listing`: the one with its public IP, else the previous subnet still held by the
/// remembered lease.
pub fn find_own(listing: &Listing, address: IpAddr, previous: Previous) -> Option<(SubnetKey, LeaseToken)> {
    own_by_address(listing, address, previous, |_| true)
        .or_else(|| {
            listing
                .leases
                .iter()
                .find(|(subnet, lease)| Some(**subnet) == previous.subnet && Some(lease.token) == previous.lease)
        })
        .map(|(subnet, lease)| (*subnet, lease.token))
}

/// The cluster as the store says now, for `status` and `cleanup` (no write).
pub async fn snapshot<S: LeaseStore>(store: &mut S, node: &NodeIdentity, previous: Previous) -> Result<Cluster> {
    let config = store.config().await?;
    let listing = store.leases().await?;
    // The lease names the node by its IPv4 address, by its IPv6 one in an IPv6-only cluster.
    let address = match config.v4 {
        Some(_) => node.public(Family::V4),
        None => node.public(Family::V6),
    };
    let address = address.ok_or(ConfigError::NoPublicAddressOfCluster)?;
    let Some((subnet, token)) = find_own(&listing, address, previous) else {
        return Err(StoreError::NoOwnLease(address).into());
    };
    Ok(Cluster { config, subnet, lease: Some(token), peers: listing.peers_of(subnet) })
}

/// A random index below `n` (std's randomly keyed hasher: enough to spread nodes over free subnets).
pub fn random_below(n: usize) -> usize {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0),
    );
    (hasher.finish() % n.max(1) as u64) as usize
}
/// Publishes `cluster` when it differs from what was published last (the agent wakes for changes only), and
/// sets the peers gauge: what every source does with the cluster it read.
pub fn publish(tx: &watch::Sender<Option<Cluster>>, metrics: &Metrics, cluster: &Cluster) {
    Metrics::set(&metrics.peers, cluster.peers.len() as u64);
    tx.send_if_modified(|current| {
        let changed = current.as_ref() != Some(cluster);
        if changed {
            *current = Some(cluster.clone());
        }
        changed
    });
}

/// The wait between attempts to reach a store: from `first`, doubling up to 5 s, each wait up to half again
/// longer at random, so that thousands of agents cut off together do not come back together.
pub struct Backoff {
    first: Duration,
    next: Duration,
}

impl Backoff {
    const MAX: Duration = Duration::from_secs(5);

    pub fn new(first: Duration) -> Backoff {
        Backoff { first, next: first }
    }

    /// The next wait, before its jitter.
    pub fn next(&self) -> Duration {
        self.next
    }

    /// Back to the first wait (the store answered for long enough).
    pub fn reset(&mut self) {
        self.next = self.first;
    }

    /// Sleeps the next wait with its jitter, and doubles it.
    pub async fn wait(&mut self) {
        let jitter = Duration::from_millis(random_below(self.next.as_millis() as usize / 2 + 1) as u64);
        tokio::time::sleep(self.next + jitter).await;
        self.next = (self.next * 2).min(Backoff::MAX);
    }
}
