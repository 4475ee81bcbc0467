//! flannel's `--kube-subnet-mgr` as a [`Source`]: each Node's `spec.podCIDRs` (as kube-controller-manager
//! allocates them) is its lease, flannel's annotations (see [`annotations`]) its value. This node writes its own
//! annotations (through `nodes/status`, as flanneld, so that flannel's ClusterRole is enough), watches every
//! Node, and publishes the cluster the plan reads: the same value the etcd source publishes.
//!
//! The watch is kube-runtime's: it lists, watches from the list's resourceVersion, lists again on 410 Gone, and
//! comes back after an API server restart or a lost connection with backoff. Until the first list is complete,
//! and while the API server is unreachable, nothing is published: the data plane stays as it is.

pub mod annotations;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{Node, NodeCondition, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Client, Config};
use tokio::sync::watch;
use tokio::time::{sleep, Instant};

use self::annotations::{config_for, enabled, node_lease, own_annotations, Annotations, NodeRecord, NodeRefusal};
use super::lease::{publish, Backoff, Cluster, NodeIdentity, Peer, Previous};
use super::{Source, SourceContext, SourceFuture};
use crate::error::{ConfigError, Error, Result, StoreError};
use crate::family::Family;
use crate::flannel::{NetworkConfig, SubnetKey};
use crate::log::log;
use crate::metrics::Metrics;

/// flanneld's flags of Kubernetes mode.
#[derive(Debug, Clone)]
pub struct KubeOptions {
    /// `--kube-api-url`: the API server (with --kubeconfig-file: instead of the file's).
    pub api_url: Option<String>,
    /// `--kubeconfig-file`; neither: in-cluster (the service account's token, `KUBERNETES_SERVICE_HOST`).
    pub kubeconfig: Option<PathBuf>,
    /// `--kube-annotation-prefix`.
    pub annotation_prefix: String,
    /// `--net-config-path`: the ConfigMap's `net-conf.json`.
    pub net_config_path: PathBuf,
    /// `--set-node-network-unavailable`: clear the Node's NetworkUnavailable condition once ready.
    pub set_node_network_unavailable: bool,
    /// What the config's backend is built with.
    pub backend: crate::backend::BackendContext,
}

impl KubeOptions {
    fn net_config(&self) -> Result<NetworkConfig> {
        let path = &self.net_config_path;
        let text = std::fs::read(path).map_err(|e| Error::io(format!("--net-config-path {}", path.display()), e))?;
        NetworkConfig::parse_with(&text, &self.backend).map_err(Error::Format)
    }

    /// The client, from --kubeconfig-file, --kube-api-url, or the pod's service account (flanneld's order).
    async fn client(&self) -> Result<Client> {
        let mut config = match (&self.kubeconfig, &self.api_url) {
            (Some(path), _) => {
                let what = format!("--kubeconfig-file {}", path.display());
                let file = Kubeconfig::read_from(path).map_err(client_error(&what))?;
                Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
                    .await
                    .map_err(client_error(&what))?
            }
            (None, Some(url)) => Config::new(url.parse().map_err(client_error("--kube-api-url"))?),
            (None, None) => Config::incluster().map_err(client_error("in-cluster credentials"))?,
        };
        if let Some(url) = &self.api_url {
            config.cluster_url = url.parse().map_err(client_error("--kube-api-url"))?;
        }
        Client::try_from(config).map_err(|e| Error::kube("the API client", e))
    }

    /// Reads what can be read before the API server is reached: the annotation keys and net-conf.json.
    fn local(&self) -> Result<(Annotations, NetworkConfig)> {
        Ok((Annotations::new(&self.annotation_prefix)?, self.net_config()?))
    }
}

/// The error of configuring the API client from `what` (a kubeconfig, the URL, in-cluster credentials).
fn client_error<E: std::error::Error + Send + Sync + 'static>(what: &str) -> impl FnOnce(E) -> Error + '_ {
    move |error| ConfigError::KubeClient { what: what.to_string(), error: Box::new(error) }.into()
}

/// flanneld's environment of Kubernetes mode, checked as flanneld checks it; what it means for fabricd, to log.
///
/// - `EVENT_QUEUE_DEPTH` (flanneld: the size of its queue of Node events, default 5000; not an integer: an
///   error at start): fabricd has no such queue, as each Node event updates the one cluster value the agent
///   reads (a burst of events is one pass), so the value is checked and has nothing to size.
/// - `CONT_WHEN_CACHE_NOT_READY` (flanneld: `true` keeps running when its Node list has not synced within 10
///   minutes, else it exits): fabricd never exits for that; it keeps waiting for a complete list, the data
///   plane as it is, and never routes from a partial one (which would remove routes to Nodes not listed yet).
pub fn kube_environment(variable: impl Fn(&str) -> Option<String>) -> Result<Vec<String>> {
    let mut notes = Vec::new();
    if let Some(text) = variable("EVENT_QUEUE_DEPTH").filter(|t| !t.is_empty()) {
        let depth: i64 = text.parse().map_err(|error| ConfigError::Variable {
            name: "EVENT_QUEUE_DEPTH",
            value: text.clone(),
            error,
        })?;
        notes.push(format!(
            "EVENT_QUEUE_DEPTH={depth}: fabricd keeps no queue of Node events (each updates the one cluster the \
             agent reads; a burst is one pass)"
        ));
    }
    if let Some(text) = variable("CONT_WHEN_CACHE_NOT_READY").filter(|t| !t.is_empty()) {
        notes.push(format!(
            "CONT_WHEN_CACHE_NOT_READY={text}: fabricd never exits while the Node list is not synced; it waits, \
             keeping the data plane as it is"
        ));
    }
    Ok(notes)
}

impl Source for KubeOptions {
    fn spawn(&self, context: SourceContext) -> Result<tokio::task::JoinHandle<Error>> {
        for note in kube_environment(|name| std::env::var(name).ok())? {
            log!(info, "{note}");
        }
        let (keys, config) = self.local()?;
        let options = self.clone();
        Ok(tokio::spawn(async move {
            let Err(e) = run(options, keys, config, context).await;
            e
        }))
    }

    fn current<'a>(&'a self, node: &'a NodeIdentity, _: Previous) -> SourceFuture<'a, Cluster> {
        Box::pin(async move {
            let (keys, base) = self.local()?;
            let client = self.client().await?;
            let name = node_name(&client).await?;
            let api: Api<Node> = Api::all(client);
            let list = api.list(&Default::default()).await.map_err(|e| Error::kube("listing the Nodes", e))?;
            let records = list.items.iter().map(|n| (name_of(n), NodeRecord::from_node(n, &keys))).collect();
            let mut view = View { keys, base, name, records, refusals: BTreeMap::new() };
            let own = view.records.get(&view.name).cloned().ok_or_else(|| no_node(&view.name))?;
            let (config, subnet) = view.own_config(&own)?;
            node.attrs(&config)?;
            Ok(view.cluster(config, subnet))
        })
    }

    fn stored_public_ips(&self) -> SourceFuture<'_, (Option<std::net::Ipv4Addr>, Option<std::net::Ipv6Addr>)> {
        Box::pin(async move {
            let (keys, _) = self.local()?;
            let client = self.client().await?;
            let name = retrying("finding this node's name", || node_name(&client)).await?;
            let api: Api<Node> = Api::all(client);
            let node = retrying("reading this Node", || async {
                api.get_opt(&name).await.map_err(|e| Error::kube(format!("reading Node {name:?}"), e))
            })
            .await?;
            let annotations = node.and_then(|n| n.metadata.annotations).unwrap_or_default();
            let read = |key: &str| annotations.get(key).filter(|v| !v.is_empty()).cloned();
            let parse = |key: &str| -> Result<Option<std::net::IpAddr>> {
                read(key)
                    .map(|text| {
                        text.parse().map_err(|_| {
                            Error::from(ConfigError::AnnotationNotAnAddress {
                                key: key.to_string(),
                                text: text.clone(),
                            })
                        })
                    })
                    .transpose()
            };
            let v4 = match parse(&keys.node_public_ip)? {
                Some(std::net::IpAddr::V4(ip)) => Some(ip),
                Some(_) => return Err(not_of_family(&keys.node_public_ip, Family::V4)),
                None => None,
            };
            let v6 = match parse(&keys.node_public_ipv6)? {
                Some(std::net::IpAddr::V6(ip)) => Some(ip),
                Some(_) => return Err(not_of_family(&keys.node_public_ipv6, Family::V6)),
                None => None,
            };
            Ok((v4, v6))
        })
    }

    fn release<'a>(&'a self, _: &'a Cluster) -> SourceFuture<'a, bool> {
        // The Node's podCIDR is kube-controller-manager's; the node leaves when its Node is deleted.
        Box::pin(async { Ok(false) })
    }
}

fn name_of(node: &Node) -> String {
    node.metadata.name.clone().unwrap_or_default()
}

fn no_node(name: &str) -> Error {
    StoreError::NoNode(name.to_string()).into()
}

fn not_of_family(key: &str, family: Family) -> Error {
    ConfigError::AnnotationFamily { key: key.to_string(), family }.into()
}

/// This node's name, as flanneld finds it: `NODE_NAME`, else the `spec.nodeName` of the pod `POD_NAME` in
/// `POD_NAMESPACE`.
async fn node_name(client: &Client) -> Result<String> {
    let variable = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    if let Some(name) = variable("NODE_NAME") {
        return Ok(name);
    }
    let (Some(pod), Some(namespace)) = (variable("POD_NAME"), variable("POD_NAMESPACE")) else {
        return Err(ConfigError::NoNodeName.into());
    };
    let api: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    let pod_spec = api.get(&pod).await.map_err(|e| Error::kube(format!("reading pod {namespace}/{pod}"), e))?.spec;
    pod_spec
        .and_then(|spec| spec.node_name)
        .filter(|name| !name.is_empty())
        .ok_or_else(|| StoreError::PodWithoutNode { namespace, pod }.into())
}

/// The Nodes as last seen, and what they mean: this node's subnets and config, the peers.
struct View {
    keys: Annotations,
    base: NetworkConfig,
    name: String,
    records: BTreeMap<String, NodeRecord>,
    /// Nodes refused and why, each logged once (again when the reason changes).
    refusals: BTreeMap<String, String>,
}

impl View {
    /// This node's subnets of the enabled families and the config with their lengths.
    fn own_config(&self, own: &NodeRecord) -> Result<(NetworkConfig, SubnetKey)> {
        let subnets = own.subnets().map_err(|problem| StoreError::OwnPodCidrs { name: self.name.clone(), problem })?;
        let subnets = enabled(subnets, &self.base);
        let config = config_for(self.base.clone(), &subnets)?;
        Ok((config, subnets))
    }

    /// The cluster: every other managed Node, oldest first, the plan judging each lease (overlaps included, by
    /// seniority). A subnet is the cluster's key, so of two Nodes naming the same one only one can be in it: the
    /// older (this node before any), as the plan would judge, the newer refused here by name. A map lookup per
    /// subnet: the scan of every held subnet it replaces made each event quadratic in the Nodes.
    fn cluster(&mut self, config: NetworkConfig, subnet: SubnetKey) -> Cluster {
        let mut nodes: Vec<&NodeRecord> = self.records.values().filter(|n| n.name != self.name).collect();
        nodes.sort_by_key(|n| (n.created, n.name.clone()));
        let mut held: HashMap<ipnet::IpNet, &str> =
            subnet.subnets().into_iter().map(|s| (s, self.name.as_str())).collect();
        let mut peers = BTreeMap::new();
        let mut refusals = BTreeMap::new();
        for (rank, node) in nodes.into_iter().enumerate() {
            let lease = node_lease(node, &self.keys, &config).and_then(|(key, attrs)| {
                let clash = key.subnets().into_iter().find_map(|s| held.get(&s).map(|holder| (s, holder.to_string())));
                match clash {
                    Some((subnet, holder)) => Err(NodeRefusal::Overlap { subnet, holder }),
                    None => Ok((key, attrs)),
                }
            });
            match lease {
                Ok((key, attrs)) => {
                    held.extend(key.subnets().into_iter().map(|s| (s, node.name.as_str())));
                    peers.insert(key, Peer { attrs, created: rank as i64 });
                }
                Err(NodeRefusal::NotManaged) => {}
                Err(why) => {
                    refusals.insert(node.name.clone(), why.to_string());
                }
            }
        }
        for (name, why) in &refusals {
            if self.refusals.get(name) != Some(why) {
                log!(error, "refusing Node {name:?}: {why}");
            }
        }
        for name in self.refusals.keys().filter(|n| !refusals.contains_key(*n)) {
            log!(info, "Node {name:?} is no longer refused (fixed or gone)");
        }
        self.refusals = refusals;
        Cluster { config, subnet, lease: None, peers }
    }
}

enum Never {}

/// The running source: find the node, wait for its podCIDR, annotate it, then watch every Node. Returns only
/// with the error that keeps the node from starting.
async fn run(options: KubeOptions, keys: Annotations, base: NetworkConfig, context: SourceContext) -> Result<Never> {
    let client = options.client().await?;
    let name = retrying("finding this node's name", || node_name(&client)).await?;
    log!(info, "Kubernetes mode: node {name:?}, annotations under {}", keys.prefix);
    let api: Api<Node> = Api::all(client);
    let mut session = Session {
        api,
        identity: context.node,
        view: View { keys, base, name, records: BTreeMap::new(), refusals: BTreeMap::new() },
        tx: context.tx,
        metrics: context.metrics,
        own: None,
        patch_due: false,
        listed: false,
        outage: None,
    };
    let own = session.wait_for_pod_cidr().await?;
    session.own_changed(own, true).await?;
    let mut ready = context.ready;
    let mut condition_due = options.set_node_network_unavailable;
    let mut stream = watcher(session.api.clone(), watcher::Config::default()).default_backoff().boxed();
    let mut buffer = BTreeMap::new();
    let mut tick = tokio::time::interval(Duration::from_secs(10));
    loop {
        tokio::select! {
            event = stream.next() => match event {
                Some(Ok(event)) => session.apply(event, &mut buffer).await?,
                Some(Err(e)) => session.lost(&e),
                None => return Err(StoreError::WatchEnded.into()),
            },
            Ok(()) = ready.changed(), if condition_due => {
                condition_due = !session.clear_network_unavailable().await;
            }
            _ = tick.tick() => {
                if session.patch_due {
                    session.patch_own().await;
                }
                if condition_due && *ready.borrow() {
                    condition_due = !session.clear_network_unavailable().await;
                }
            }
        }
    }
}

/// Calls `f` until it succeeds or fails with something other than the API server's unavailability, logging
/// the first failure and the recovery.
async fn retrying<T, F, Fut>(what: &str, mut f: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    let mut backoff = Backoff::new(Duration::from_millis(200));
    let mut failing = None;
    loop {
        match f().await {
            Ok(value) => {
                if let Some(since) = failing {
                    log!(info, "{what}: the API server answers again (after {:.1?})", Instant::elapsed(&since));
                }
                return Ok(value);
            }
            Err(e @ Error::Kube { .. }) => {
                if failing.is_none() {
                    log!(error, "{what}: {e}; retrying");
                    failing = Some(Instant::now());
                }
                backoff.wait().await;
            }
            Err(e) => return Err(e),
        }
    }
}

struct Session {
    api: Api<Node>,
    identity: NodeIdentity,
    view: View,
    tx: watch::Sender<Option<Cluster>>,
    metrics: Arc<Metrics>,
    /// This node's config and subnets, once its podCIDR is known.
    own: Option<(NetworkConfig, SubnetKey)>,
    /// The node's annotations differ from what it announces and the last patch failed.
    patch_due: bool,
    /// The first list is complete: the cluster may be published.
    listed: bool,
    /// Since when the API server has been unreachable.
    outage: Option<Instant>,
}

impl Session {
    /// Waits for this Node to exist with a podCIDR (kube-controller-manager allocates it when the Node
    /// registers), logging each wait once.
    async fn wait_for_pod_cidr(&mut self) -> Result<NodeRecord> {
        let mut logged = None;
        loop {
            let name = self.view.name.clone();
            let node = retrying("reading this Node", || async {
                self.api.get_opt(&name).await.map_err(|e| Error::kube(format!("reading Node {name:?}"), e))
            })
            .await?;
            let record = node.as_ref().map(|n| NodeRecord::from_node(n, &self.view.keys));
            let waiting = match &record {
                None => "the Node to be registered",
                Some(r) if r.pod_cidrs.is_empty() => "its podCIDR (kube-controller-manager's --allocate-node-cidrs)",
                Some(r) => return Ok(r.clone()),
            };
            if logged != Some(waiting) {
                log!(info, "Node {name:?}: waiting for {waiting}");
                logged = Some(waiting);
            }
            sleep(Duration::from_secs(1)).await;
        }
    }

    /// This Node changed (or was first read): its subnets and config, and its annotations written when they
    /// differ from what this node announces.
    async fn own_changed(&mut self, own: NodeRecord, first: bool) -> Result<()> {
        let (config, subnet) = match self.view.own_config(&own) {
            Ok(found) => found,
            Err(e) if first => return Err(e),
            Err(e) => {
                log!(error, "{e}; keeping subnet {}", self.own.as_ref().map_or(String::new(), |o| o.1.to_string()));
                return Ok(());
            }
        };
        let attrs = self.identity.attrs(&config)?;
        match &self.own {
            Some((_, old)) if *old != subnet => log!(warn, "this Node's podCIDR changed: {old} -> {subnet}"),
            None => log!(info, "subnet {subnet} from Node {:?}'s podCIDR", self.view.name),
            _ => {}
        }
        self.own = Some((config, subnet));
        self.view.records.insert(own.name.clone(), own.clone());
        if let Some(patch) = own_annotations(&own, &self.view.keys, &attrs) {
            // A Node without flannel's annotations is new (registered again), not changed by someone else.
            let fresh = first || !own.annotations.contains_key(&self.view.keys.kube_subnet_manager);
            if !fresh {
                let keys: Vec<&String> = patch.keys().collect();
                log!(warn, "this Node's annotations were changed by someone else; writing them back: {keys:?}");
                Metrics::inc(&self.metrics.own_lease_rewrites_total);
            }
            self.patch_due = true;
            self.patch_own().await;
        }
        Ok(())
    }

    /// Writes this node's annotations (through nodes/status, as flanneld); on failure, tried again later.
    async fn patch_own(&mut self) {
        let Some((config, _)) = &self.own else { return };
        let Ok(attrs) = self.identity.attrs(config) else { return };
        let name = self.view.name.clone();
        let own = self.view.records.get(&name).cloned();
        let Some(own) = own else { return };
        let Some(patch) = own_annotations(&own, &self.view.keys, &attrs) else {
            self.patch_due = false;
            return;
        };
        let body = serde_json::json!({ "metadata": { "annotations": patch } });
        match self.api.patch_status(&name, &PatchParams::default(), &Patch::Strategic(body)).await {
            Ok(node) => {
                Metrics::inc(&self.metrics.lease_acquisitions_total);
                log!(info, "annotated Node {name:?} ({} keys)", patch.len());
                self.view.records.insert(name, NodeRecord::from_node(&node, &self.view.keys));
                self.patch_due = false;
            }
            Err(e) => log!(error, "{}; retrying", Error::kube(format!("annotating Node {name:?}"), e)),
        }
    }

    /// Sets the Node's NetworkUnavailable condition to False, as flanneld does once it runs; true when done.
    async fn clear_network_unavailable(&self) -> bool {
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let condition = NodeCondition {
            type_: "NetworkUnavailable".into(),
            status: "False".into(),
            reason: Some("FlannelIsUp".into()),
            message: Some("Flannel is running on this node".into()),
            last_transition_time: Some(now.clone()),
            last_heartbeat_time: Some(now),
        };
        let body = serde_json::json!({ "status": { "conditions": [condition] } });
        let name = &self.view.name;
        match self.api.patch_status(name, &PatchParams::default(), &Patch::Strategic(body)).await {
            Ok(_) => {
                log!(info, "Node {name:?}: NetworkUnavailable=False");
                true
            }
            Err(e) => {
                log!(error, "{}; retrying", Error::kube(format!("setting Node {name:?}'s NetworkUnavailable"), e));
                false
            }
        }
    }

    /// One event of the watch.
    async fn apply(&mut self, event: watcher::Event<Node>, buffer: &mut BTreeMap<String, NodeRecord>) -> Result<()> {
        if let Some(since) = self.outage.take() {
            log!(info, "the API server answers again (after {:.1?})", since.elapsed());
            Metrics::set(&self.metrics.store_connected, 1);
        }
        let keys = &self.view.keys;
        let changed_own = match event {
            watcher::Event::Init => {
                if self.listed {
                    log!(info, "listing every Node again (the watch's resourceVersion expired: 410 Gone)");
                }
                buffer.clear();
                Metrics::inc(&self.metrics.watch_restarts_total);
                return Ok(());
            }
            watcher::Event::InitApply(node) => {
                buffer.insert(name_of(&node), NodeRecord::from_node(&node, keys));
                return Ok(());
            }
            watcher::Event::InitDone => {
                let own = self.view.records.get(&self.view.name).cloned();
                self.view.records = std::mem::take(buffer);
                self.listed = true;
                match self.view.records.get(&self.view.name) {
                    Some(now) if Some(now) != own.as_ref() => Some(now.clone()),
                    _ => None,
                }
            }
            watcher::Event::Apply(node) => {
                let record = NodeRecord::from_node(&node, keys);
                // Most updates of a Node are the kubelet's status: nothing flannel reads changed.
                if self.view.records.get(&record.name) == Some(&record) {
                    return Ok(());
                }
                let own = record.name == self.view.name;
                self.view.records.insert(record.name.clone(), record.clone());
                own.then_some(record)
            }
            watcher::Event::Delete(node) => {
                let name = name_of(&node);
                if name == self.view.name {
                    log!(warn, "this Node was deleted; the data plane stays as it is");
                } else {
                    log!(info, "Node {name:?} was deleted: its routes go");
                }
                self.view.records.remove(&name);
                None
            }
        };
        if let Some(own) = changed_own {
            self.own_changed(own, false).await?;
        }
        self.publish();
        Ok(())
    }

    /// The watch failed (it is retried with backoff, and lists again when its resourceVersion expired).
    fn lost(&mut self, error: &watcher::Error) {
        Metrics::inc(&self.metrics.kube_errors_total);
        if self.outage.is_none() {
            Metrics::set(&self.metrics.store_connected, 0);
            log!(error, "watching the Nodes: {error}; the data plane is kept as it is, retrying");
            self.outage = Some(Instant::now());
        }
    }

    fn publish(&mut self) {
        let Some((config, subnet)) = self.own.clone() else { return };
        if !self.listed {
            return;
        }
        let cluster = self.view.cluster(config, subnet);
        publish(&self.tx, &self.metrics, &cluster);
    }
}

#[cfg(test)]
mod tests {
    use super::annotations::{NodeRecord, DEFAULT_PREFIX};
    use super::*;

    fn node(name: &str, created: i64, cidr: &str, public_ip: &str) -> NodeRecord {
        let annotations = [
            ("kube-subnet-manager", "true".to_string()),
            ("backend-type", "vxlan".to_string()),
            ("public-ip", public_ip.to_string()),
            ("backend-data", format!(r#"{{"VNI":1,"VtepMAC":"0e:fa:00:00:00:{created:02x}"}}"#)),
        ];
        NodeRecord {
            name: name.into(),
            created,
            pod_cidrs: vec![cidr.into()],
            annotations: annotations.into_iter().map(|(k, v)| (format!("{DEFAULT_PREFIX}/{k}"), v)).collect(),
        }
    }

    /// The source refuses by name only the Nodes whose subnet is already a key of the cluster; a podCIDR that
    /// merely overlaps another reaches the plan, which judges it by seniority as it judges etcd's leases.
    #[test]
    fn only_a_subnet_already_held_is_refused_by_the_source() {
        let base = NetworkConfig::parse(br#"{"Network":"10.244.0.0/16","Backend":{"Type":"vxlan"}}"#).unwrap();
        let records = [
            node("me", 0, "10.244.0.0/24", "192.168.50.10"),
            node("older", 1, "10.244.1.0/24", "192.168.50.11"),
            node("same-as-older", 2, "10.244.1.0/24", "192.168.50.12"),
            node("same-as-mine", 3, "10.244.0.0/24", "192.168.50.13"),
            node("wider", 4, "10.244.0.0/23", "192.168.50.14"),
        ];
        let mut view = View {
            keys: Annotations::new(DEFAULT_PREFIX).unwrap(),
            base,
            name: "me".into(),
            records: records.into_iter().map(|r| (r.name.clone(), r)).collect(),
            refusals: BTreeMap::new(),
        };
        let (config, subnet) = view.own_config(&view.records["me"].clone()).unwrap();
        let cluster = view.cluster(config, subnet);
        let peers: Vec<String> = cluster.peers.keys().map(|k| k.subnets()[0].to_string()).collect();
        assert_eq!(peers, ["10.244.0.0/23", "10.244.1.0/24"], "the older and the merely overlapping Node");
        assert_eq!(view.refusals["same-as-older"], "its podCIDR 10.244.1.0/24 overlaps older's");
        assert_eq!(view.refusals["same-as-mine"], "its podCIDR 10.244.0.0/24 overlaps me's");
        assert_eq!(view.refusals.len(), 2, "{:?}", view.refusals);
    }

    fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| pairs.iter().find(|(k, _)| *k == name).map(|(_, v)| v.to_string())
    }

    #[test]
    fn flanneld_s_kube_variables_are_checked_as_flanneld_checks_them() {
        assert!(kube_environment(env(&[])).unwrap().is_empty());
        let notes =
            kube_environment(env(&[("EVENT_QUEUE_DEPTH", "10000"), ("CONT_WHEN_CACHE_NOT_READY", "true")])).unwrap();
        assert_eq!(notes.len(), 2);
        assert!(notes[0].starts_with("EVENT_QUEUE_DEPTH=10000: fabricd keeps no queue"), "{notes:?}");
        assert!(notes[1].starts_with("CONT_WHEN_CACHE_NOT_READY=true: fabricd never exits"), "{notes:?}");
        // flanneld: strconv.Atoi, an error at start; 0 and negative numbers are accepted (its default used).
        let error = kube_environment(env(&[("EVENT_QUEUE_DEPTH", "lots")])).unwrap_err().to_string();
        assert!(error.contains("env EVENT_QUEUE_DEPTH=lots format error"), "{error}");
        assert!(kube_environment(env(&[("EVENT_QUEUE_DEPTH", "-1")])).is_ok());
    }
}
