//! Where the node's subnet and its peers come from: the seam between the store and the data plane.
//!
//! A [`Source`] is a task that publishes the latest [`Cluster`] on a `tokio::sync::watch` channel; the reconcile
//! loop only ever reads the latest value, and the plan, the backends and the data plane never know which source
//! it came from. While a source cannot reach its store it publishes nothing, so the data plane stays as it was
//! (no route is removed because of a store outage). Sources: [`etcd`] (flannel's layout, leases in a
//! transaction), [`kube`] (flannel's `--kube-subnet-mgr`: each Node's podCIDRs and flannel's annotations) and
//! [`static_file`] (one node and small labs).
//!
//! A store of leases is a [`LeaseStore`]: a handful of conditional operations. The allocation policy
//! ([`acquire`]), finding this node's lease for `status` and `cleanup` ([`find_own`]) and releasing it are
//! written once against that trait (tested against the in-memory store of `memory`).

pub mod etcd;
pub mod kube;
mod lease;
#[cfg(test)]
mod memory;
pub mod static_file;

pub use lease::*;

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;

use tokio::sync::watch;

use crate::error::{ConfigError, Error, Result};
use crate::flannel::SubnetKey;
use crate::metrics::Metrics;

/// A future a [`Source`] returns (boxed: sources are chosen at run time, behind `dyn Source`).
pub type SourceFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T>> + 'a>>;

/// What a running source is given: who the node is, what it remembers, where to publish, and the agent's
/// readiness (a source may tell its store once the node's data plane is programmed).
pub struct SourceContext {
    pub node: NodeIdentity,
    pub previous: Previous,
    pub tx: watch::Sender<Option<Cluster>>,
    pub metrics: Arc<Metrics>,
    /// True once the agent's first pass programmed the data plane.
    pub ready: watch::Receiver<bool>,
}

/// Where the cluster comes from: what the agent, `status`, `cleanup` and `acquire` use, whatever the store.
pub trait Source {
    /// Starts the task publishing the cluster. Configuration that cannot be read fails at once. The task ends
    /// only with the error that keeps the node from starting.
    fn spawn(&self, context: SourceContext) -> Result<tokio::task::JoinHandle<Error>>;

    /// The cluster as the store says now, for `status` and `cleanup` (this node's lease found by its public
    /// IP, else by the lease it remembers).
    fn current<'a>(&'a self, node: &'a NodeIdentity, previous: Previous) -> SourceFuture<'a, Cluster>;

    /// Gives this node's lease back (the node leaves the cluster); false when the source holds no leases.
    fn release<'a>(&'a self, cluster: &'a Cluster) -> SourceFuture<'a, bool>;

    /// Public addresses the store holds for this node, taken as --public-ip / --public-ipv6 (flanneld's
    /// `node-public-ip` annotations in Kubernetes mode); none by default.
    fn stored_public_ips(&self) -> SourceFuture<'_, (Option<std::net::Ipv4Addr>, Option<std::net::Ipv6Addr>)> {
        Box::pin(async { Ok((None, None)) })
    }

    /// Acquires (or finds) the lease of the node at `node`, touching nothing on the node.
    fn acquire<'a>(&'a self, node: &'a NodeIdentity, previous: Previous) -> SourceFuture<'a, (SubnetKey, LeaseToken)> {
        let _ = (node, previous);
        Box::pin(async { Err(ConfigError::AcquireWithoutEtcd.into()) })
    }
}

/// Static mode: the file is the cluster (its backend built with the context).
pub struct StaticSource(pub PathBuf, pub crate::backend::BackendContext);

impl Source for StaticSource {
    fn spawn(&self, context: SourceContext) -> Result<tokio::task::JoinHandle<Error>> {
        static_file::load(&self.0, &self.1)?;
        Ok(tokio::spawn(static_file::run(self.0.clone(), self.1.clone(), context.tx, context.metrics)))
    }

    fn current<'a>(&'a self, _: &'a NodeIdentity, _: Previous) -> SourceFuture<'a, Cluster> {
        Box::pin(async { static_file::load(&self.0, &self.1) })
    }

    fn release<'a>(&'a self, _: &'a Cluster) -> SourceFuture<'a, bool> {
        Box::pin(async { Ok(false) })
    }
}

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, Ipv4Addr};

    use super::memory::MemoryStore;
    use super::*;
    use crate::flannel::{LeaseAttrs, NetworkConfig};

    fn config() -> NetworkConfig {
        NetworkConfig::parse(br#"{"Network":"10.244.0.0/22","SubnetLen":24,"Backend":{"Type":"vxlan"}}"#).unwrap()
    }

    fn identity(last: u8) -> NodeIdentity {
        NodeIdentity { public_ip: Some(Ipv4Addr::new(192, 168, 50, last)), public_ipv6: None }
    }

    fn node(last: u8) -> LeaseAttrs {
        let ip = Ipv4Addr::new(192, 168, 50, last);
        NodeIdentity { public_ip: Some(ip), public_ipv6: None }.attrs(&config()).unwrap()
    }

    fn net(text: &str) -> SubnetKey {
        SubnetKey::v4(text.parse().unwrap())
    }

    fn run<T>(future: impl std::future::Future<Output = T>) -> T {
        tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(future)
    }

    #[test]
    fn a_node_keeps_its_lease_without_writing() {
        run(async {
            let mut store = MemoryStore::new(config());
            let (subnet, token) = acquire(&mut store, &config(), &node(10), Previous::default()).await.unwrap();
            let writes = store.writes;
            let again = acquire(&mut store, &config(), &node(10), Previous::default()).await.unwrap();
            assert_eq!(again, (subnet, token));
            assert_eq!(store.writes, writes, "an unchanged live lease is not rewritten");
            // Its value changed (another VNI): rewritten at the same subnet, on a new lease.
            let mut changed = node(10);
            let mut data = changed.backend_data.unwrap().value().clone();
            data["VNI"] = 4.into();
            changed.backend_data = Some(data.into());
            let (same, new_token) = acquire(&mut store, &config(), &changed, Previous::default()).await.unwrap();
            assert_eq!(same, subnet);
            assert_ne!(new_token, token);
        });
    }

    #[test]
    fn the_previous_subnet_is_taken_again_when_free_or_remembered() {
        run(async {
            let mut store = MemoryStore::new(config());
            let previous = Previous { subnet: Some(net("10.244.2.0/24")), lease: None };
            let (subnet, token) = acquire(&mut store, &config(), &node(10), previous).await.unwrap();
            assert_eq!(subnet, net("10.244.2.0/24"));
            // The node's address changed: the lease it remembers is taken over, the old one revoked.
            let previous = Previous { subnet: Some(subnet), lease: Some(token) };
            let (moved, moved_token) = acquire(&mut store, &config(), &node(11), previous).await.unwrap();
            assert_eq!(moved, subnet);
            assert!(store.revoked.contains(&token));
            assert_eq!(store.leases.get(&subnet).unwrap().attrs.public_ip, Some(Ipv4Addr::new(192, 168, 50, 11)));
            assert_ne!(moved_token, token);
            // A subnet held by another node's lease is not taken, whatever this node remembers.
            let previous = Previous { subnet: Some(subnet), lease: Some(LeaseToken(999)) };
            let (other, _) = acquire(&mut store, &config(), &node(12), previous).await.unwrap();
            assert_ne!(other, subnet);
        });
    }

    #[test]
    fn a_second_lease_with_the_nodes_address_does_not_take_its_subnet() {
        run(async {
            let mut store = MemoryStore::new(config());
            let previous = Previous { subnet: Some(net("10.244.3.0/24")), lease: None };
            let (subnet, token) = acquire(&mut store, &config(), &node(10), previous).await.unwrap();
            // Written by hand at a lower subnet, with this node's address and another MAC.
            let mut forged = node(10);
            forged.backend_data = Some(serde_json::json!({ "VNI": 1, "VtepMAC": "0e:00:00:00:00:01" }).into());
            store.create(net("10.244.1.0/24"), &forged).await.unwrap();
            let previous = Previous { subnet: Some(subnet), lease: Some(token) };
            assert_eq!(acquire(&mut store, &config(), &node(10), previous).await.unwrap(), (subnet, token));
            // Without subnet.env, the older lease is the node's.
            assert_eq!(acquire(&mut store, &config(), &node(10), Previous::default()).await.unwrap(), (subnet, token));
            let found = find_own(
                &store.leases().await.unwrap(),
                IpAddr::V4(Ipv4Addr::new(192, 168, 50, 10)),
                Previous::default(),
            );
            assert_eq!(found, Some((subnet, token)));
        });
    }

    #[test]
    fn turning_ipv6_on_keeps_the_ipv4_subnet_and_replaces_the_lease() {
        run(async {
            let v4_only = config();
            let dual = NetworkConfig::parse(
                br#"{"EnableIPv6":true,"Network":"10.244.0.0/22","SubnetLen":24,"IPv6Network":"fd00::/60","Backend":{"Type":"vxlan"}}"#,
            )
            .unwrap();
            let mut store = MemoryStore::new(v4_only.clone());
            let (old, _) = acquire(&mut store, &v4_only, &node(10), Previous::default()).await.unwrap();
            let identity = NodeIdentity {
                public_ip: Some(Ipv4Addr::new(192, 168, 50, 10)),
                public_ipv6: Some("fd00:50::10".parse().unwrap()),
            };
            let attrs = identity.attrs(&dual).unwrap();
            let (new, _) = acquire(&mut store, &dual, &attrs, Previous::default()).await.unwrap();
            assert_eq!(new.v4, old.v4, "the IPv4 subnet kept");
            assert!(new.v6.is_some());
            assert!(!store.leases.contains_key(&old), "the IPv4-only lease is gone");
            assert_eq!(store.leases.len(), 1);
        });
    }

    #[test]
    fn free_subnets_run_out_with_a_clear_error() {
        run(async {
            let mut store = MemoryStore::new(config());
            let mut seen = std::collections::BTreeSet::new();
            for last in 10..13 {
                let (subnet, _) = acquire(&mut store, &config(), &node(last), Previous::default()).await.unwrap();
                assert!(config().allows(&subnet));
                assert!(seen.insert(subnet), "{subnet} given twice");
            }
            let error = acquire(&mut store, &config(), &node(13), Previous::default()).await.unwrap_err();
            assert!(error.to_string().contains("out of subnets: every /24 of 10.244.0.0/22 is leased"), "{error}");
        });
    }

    #[test]
    fn a_lost_race_reads_again() {
        run(async {
            let mut store = MemoryStore::new(config());
            // Every create but the last loses to another node that takes the subnet first.
            store.steal_next_creates = 2;
            let (subnet, _) = acquire(&mut store, &config(), &node(10), Previous::default()).await.unwrap();
            assert_eq!(store.leases.len(), 3, "two stolen, one ours");
            assert_eq!(store.leases[&subnet].attrs.public_ip, Some(Ipv4Addr::new(192, 168, 50, 10)));
        });
    }

    #[test]
    fn a_dual_stack_twin_made_at_the_same_time_keeps_its_subnet_and_ours_is_given_back() {
        run(async {
            let dual = NetworkConfig::parse(
                br#"{"EnableIPv6":true,"Network":"10.244.0.0/22","SubnetLen":24,"IPv6Network":"fd00::/62","Backend":{"Type":"vxlan"}}"#,
            )
            .unwrap();
            let mut store = MemoryStore::new(dual.clone());
            store.twin_before_next_create = true;
            let identity = NodeIdentity {
                public_ip: Some(Ipv4Addr::new(192, 168, 50, 10)),
                public_ipv6: Some("fd00:50::10".parse().unwrap()),
            };
            let attrs = identity.attrs(&dual).unwrap();
            let (subnet, token) = acquire(&mut store, &dual, &attrs, Previous::default()).await.unwrap();
            assert_eq!(store.leases.len(), 2, "the twin and ours: {:?}", store.leases.keys());
            let twin = store.leases.keys().find(|k| **k != subnet).copied().unwrap();
            assert_ne!(twin.v6, subnet.v6, "one IPv6 subnet for two nodes");
            assert_ne!(twin.v4, subnet.v4);
            assert_eq!(store.revoked.len(), 1, "the first lease given back");
            assert!(!store.revoked.contains(&token));
        });
    }

    #[test]
    fn an_expired_lease_is_written_again() {
        run(async {
            let mut store = MemoryStore::new(config());
            let (subnet, token) = acquire(&mut store, &config(), &node(10), Previous::default()).await.unwrap();
            store.expire(token);
            let (again, new_token) = acquire(&mut store, &config(), &node(10), Previous::default()).await.unwrap();
            assert_eq!(again, subnet);
            assert_ne!(new_token, token);
        });
    }

    #[test]
    fn status_and_cleanup_find_the_node_by_address_or_by_its_remembered_lease() {
        run(async {
            let mut store = MemoryStore::new(config());
            let (a, a_token) = acquire(&mut store, &config(), &node(10), Previous::default()).await.unwrap();
            let (b, _) = acquire(&mut store, &config(), &node(11), Previous::default()).await.unwrap();
            let cluster = snapshot(&mut store, &identity(10), Previous::default()).await.unwrap();
            assert_eq!((cluster.subnet, cluster.lease), (a, Some(a_token)));
            assert_eq!(cluster.peers.keys().copied().collect::<Vec<_>>(), vec![b]);
            let previous = Previous { subnet: Some(a), lease: Some(a_token) };
            let moved = snapshot(&mut store, &identity(99), previous).await.unwrap();
            assert_eq!(moved.subnet, a);
            let error = snapshot(&mut store, &identity(99), Previous::default()).await.unwrap_err();
            assert!(error.to_string().contains("no lease in the store"), "{error}");
            store.release(a, Some(a_token)).await.unwrap();
            assert!(!store.leases.contains_key(&a));
        });
    }

    #[test]
    fn only_the_canonical_key_of_a_subnet_names_it() {
        let prefix = "/coreos.com/network/subnets/";
        let value = node(10).to_json();
        let (subnet, _) = lease_entry(prefix, &format!("{prefix}10.244.1.0-24"), value.as_bytes()).unwrap();
        assert_eq!(subnet, net("10.244.1.0/24"));
        for alias in ["10.244.1.0-024", "10.244.1.0-+24", "x/10.244.1.0-24", "10.244.1.0-24 ", " 10.244.1.0-24"] {
            let error = lease_entry(prefix, &format!("{prefix}{alias}"), value.as_bytes()).unwrap_err();
            assert!(matches!(&error, NotALease::Key { canonical: Some(c) } if c == "10.244.1.0-24"), "{alias:?}");
        }
        let error = lease_entry(prefix, &format!("{prefix}garbage"), value.as_bytes()).unwrap_err();
        assert!(matches!(error, NotALease::Key { canonical: None }), "{error:?}");
        let large = vec![b' '; MAX_LEASE_VALUE + 1];
        let error = lease_entry(prefix, &format!("{prefix}10.244.1.0-24"), &large).unwrap_err();
        assert!(matches!(error, NotALease::TooLarge { bytes } if bytes == MAX_LEASE_VALUE + 1), "{error:?}");
    }

    #[test]
    fn a_lease_overwritten_by_a_plain_put_or_while_ours_lives_is_taken_back() {
        run(async {
            let mut store = MemoryStore::new(config());
            let (subnet, token) = acquire(&mut store, &config(), &node(10), Previous::default()).await.unwrap();
            let previous = Previous { subnet: Some(subnet), lease: Some(token) };
            // Another PublicIP written over it without an etcd lease (etcdctl put).
            let lease = store.leases.get_mut(&subnet).unwrap();
            lease.attrs = node(99);
            lease.token = LeaseToken(0);
            let (again, _) = acquire(&mut store, &config(), &node(10), previous).await.unwrap();
            assert_eq!(again, subnet);
            assert_eq!(store.leases[&subnet].attrs, node(10));
            // On another etcd lease, while the one this node remembers still lives.
            let (subnet, token) = acquire(&mut store, &config(), &node(10), Previous::default()).await.unwrap();
            let previous = Previous { subnet: Some(subnet), lease: Some(token) };
            let lease = store.leases.get_mut(&subnet).unwrap();
            lease.attrs = node(98);
            lease.token = LeaseToken(7);
            lease.revision += 1;
            let (again, token) = acquire(&mut store, &config(), &node(10), previous).await.unwrap();
            assert_eq!(again, subnet);
            // Deleted and created afresh by another node (its creation is its last write) while this node's
            // remembered lease still lives: that node's now, not taken back.
            let previous = Previous { subnet: Some(subnet), lease: Some(token) };
            store.leases.remove(&subnet);
            store.create(subnet, &node(11)).await.unwrap();
            let (other, _) = acquire(&mut store, &config(), &node(10), previous).await.unwrap();
            assert_ne!(other, subnet);
            assert_eq!(store.leases[&subnet].attrs, node(11));
        });
    }

    #[test]
    fn a_node_whose_subnet_left_the_network_does_not_start() {
        run(async {
            let mut store = MemoryStore::new(config());
            let (subnet, token) = acquire(&mut store, &config(), &node(10), Previous::default()).await.unwrap();
            let moved =
                NetworkConfig::parse(br#"{"Network":"10.245.0.0/22","SubnetLen":24,"Backend":{"Type":"vxlan"}}"#)
                    .unwrap();
            let previous = Previous { subnet: Some(subnet), lease: Some(token) };
            let error = acquire(&mut store, &moved, &node(10), previous).await.unwrap_err();
            let text = error.to_string();
            assert!(text.contains(&subnet.to_string()) && text.contains("10.245.0.0/22"), "{text}");
            // Widened: the lease still fits and is kept.
            let wider =
                NetworkConfig::parse(br#"{"Network":"10.244.0.0/21","SubnetLen":24,"Backend":{"Type":"vxlan"}}"#)
                    .unwrap();
            assert_eq!(acquire(&mut store, &wider, &node(10), previous).await.unwrap().0, subnet);
        });
    }
}
