//! A lease store in memory, with etcd's semantics (conditional writes, leases that expire or are revoked with
//! their key), for unit tests of the allocation policy.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::time::Duration;

use ipnet::IpNet;

use super::lease::{LeaseStore, LeaseToken, Listing, StoredLease};
use crate::error::{Result, StoreError};
use crate::family::Family;
use crate::flannel::{LeaseAttrs, NetworkConfig, SubnetKey};

pub struct MemoryStore {
    config: NetworkConfig,
    pub leases: BTreeMap<SubnetKey, StoredLease>,
    pub revoked: BTreeSet<LeaseToken>,
    expired: BTreeSet<LeaseToken>,
    revision: i64,
    next_token: i64,
    /// Writes made (creates and replaces that succeeded).
    pub writes: usize,
    /// The next creates find their subnet taken by another node first (a lost race).
    pub steal_next_creates: usize,
    /// The next create of a dual-stack key finds a twin made first by another node: a lease with the same IPv6
    /// subnet and another IPv4 one, which the key's create-if-absent does not see.
    pub twin_before_next_create: bool,
}

impl MemoryStore {
    pub fn new(config: NetworkConfig) -> MemoryStore {
        MemoryStore {
            config,
            leases: BTreeMap::new(),
            revoked: BTreeSet::new(),
            expired: BTreeSet::new(),
            revision: 1,
            next_token: 100,
            writes: 0,
            steal_next_creates: 0,
            twin_before_next_create: false,
        }
    }

    /// The lease's time runs out (its key stays until the next read, as etcd's does until it is swept).
    pub fn expire(&mut self, token: LeaseToken) {
        self.expired.insert(token);
    }

    fn put(&mut self, subnet: SubnetKey, attrs: &LeaseAttrs) -> LeaseToken {
        self.revision += 1;
        self.next_token += 1;
        let token = LeaseToken(self.next_token);
        let created = self.leases.get(&subnet).map(|l| l.created).unwrap_or(self.revision);
        self.leases.insert(subnet, StoredLease { attrs: attrs.clone(), token, revision: self.revision, created });
        self.writes += 1;
        token
    }
}

impl LeaseStore for MemoryStore {
    async fn config(&mut self) -> Result<NetworkConfig> {
        Ok(self.config.clone())
    }

    async fn leases(&mut self) -> Result<Listing> {
        Ok(Listing { leases: self.leases.clone(), revision: self.revision })
    }

    async fn create(&mut self, subnet: SubnetKey, attrs: &LeaseAttrs) -> Result<Option<LeaseToken>> {
        if self.steal_next_creates > 0 && !self.leases.contains_key(&subnet) {
            self.steal_next_creates -= 1;
            let thief = LeaseAttrs {
                public_ip: Some(Ipv4Addr::new(192, 168, 99, self.steal_next_creates as u8)),
                ..attrs.clone()
            };
            self.put(subnet, &thief);
        }
        if self.twin_before_next_create && subnet.v6.is_some() {
            self.twin_before_next_create = false;
            let taken: Vec<IpNet> = self.leases.keys().chain([&subnet]).filter_map(|k| k.get(Family::V4)).collect();
            let v4 = self
                .config
                .families()
                .find(|plan| plan.family() == Family::V4)
                .map(|plan| plan.free_subnets(&taken, 1));
            let Some(IpNet::V4(v4)) = v4.and_then(|free| free.first().copied()) else { panic!("no IPv4 subnet left") };
            let twin = LeaseAttrs { public_ip: Some(Ipv4Addr::new(192, 168, 99, 1)), ..attrs.clone() };
            self.put(SubnetKey { v4: Some(v4), ..subnet }, &twin);
        }
        if self.leases.contains_key(&subnet) {
            return Ok(None);
        }
        Ok(Some(self.put(subnet, attrs)))
    }

    async fn replace(&mut self, subnet: SubnetKey, attrs: &LeaseAttrs, revision: i64) -> Result<Option<LeaseToken>> {
        if self.leases.get(&subnet).map(|l| l.revision) != Some(revision) {
            return Ok(None);
        }
        Ok(Some(self.put(subnet, attrs)))
    }

    async fn alive(&mut self, token: LeaseToken) -> Result<bool> {
        // Only a lease granted here lives (as in etcd, where an unknown id has no time to live).
        let granted = (101..=self.next_token).contains(&token.0);
        Ok(granted && !self.expired.contains(&token) && !self.revoked.contains(&token))
    }

    async fn revoke(&mut self, token: LeaseToken) {
        self.revoked.insert(token);
        self.leases.retain(|_, lease| lease.token != token);
    }

    async fn renew(&mut self, token: LeaseToken) -> Result<Option<Duration>> {
        Ok(self.alive(token).await?.then_some(Duration::from_secs(86400)))
    }

    async fn release(&mut self, subnet: SubnetKey, token: Option<LeaseToken>) -> Result<()> {
        if self.leases.remove(&subnet).is_none() && token.is_none() {
            return Err(StoreError::NoLeaseAt(subnet).into());
        }
        if let Some(token) = token {
            self.revoke(token).await;
        }
        Ok(())
    }
}
