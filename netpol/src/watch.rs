//! The Kubernetes source: Pods, Namespaces and NetworkPolicies watched through kube-runtime's watchers into
//! reflector stores, and the whole view handed to the [`Agent`] after each burst of events.
//!
//! - The first view is applied only when all three stores hold a complete list: a policy not yet listed
//!   would otherwise leave its pods open for a moment.
//! - A watch that ends with 410 Gone (its resource version too old) is relisted by the watcher; the store
//!   takes the new list whole when it is complete, so objects deleted meanwhile go.
//! - When the API server is lost, the watchers retry with backoff and the stores keep their last content:
//!   nothing is applied, the rules in force stay. The agent logs the loss once, and the return.
//! - Objects are converted to the compiler's [`crate::model`] through their JSON (the API's field names); one
//!   that cannot be is logged and fails closed ([`Stores::view`]), never becomes a default.
//!
//! The types are k8s-openapi's of v1.33 (`earliest`); the fields read here (metadata name, namespace and
//! labels; a Pod's containers' ports, hostNetwork, phase and podIPs; a NetworkPolicy's spec; a Node's
//! podCIDRs) are the same on the v1.28 server of the tests.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::sync::Notify;

use crate::agent::Agent;
use crate::error::Error;
use crate::metrics::Metrics;
use crate::model::{self, Cluster};

/// How long the agent waits after an event for the rest of its burst (a Deployment's rollout, say).
const SETTLE: Duration = Duration::from_millis(50);

/// The three stores.
struct Stores {
    pods: Store<Pod>,
    namespaces: Store<Namespace>,
    policies: Store<NetworkPolicy>,
}

/// A client from a kubeconfig file, or the default (in-cluster, `KUBECONFIG`, `~/.kube/config`).
pub async fn client(kubeconfig: Option<&std::path::Path>) -> Result<Client, Error> {
    let config = match kubeconfig {
        Some(path) => {
            let file = kube::config::Kubeconfig::read_from(path).map_err(Error::Kubeconfig)?;
            kube::Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(Error::Kubeconfig)?
        }
        None => kube::Config::infer().await.map_err(Error::InferConfig)?,
    };
    Client::try_from(config).map_err(Error::Kube)
}

/// The pod CIDRs of Node `name` (`spec.podCIDRs`).
pub async fn node_pod_cidrs(client: &Client, name: &str) -> Result<Vec<ipnet::IpNet>, Error> {
    let node = Api::<Node>::all(client.clone()).get(name).await.map_err(Error::Kube)?;
    let cidrs = node.spec.and_then(|s| s.pod_cidrs).unwrap_or_default();
    let parse = |cidr: &String| cidr.parse().map_err(|_| Error::NodePodCidr { node: name.into(), cidr: cidr.clone() });
    cidrs.iter().map(parse).collect()
}

/// [`node_pod_cidrs`] once the Node exists and has its podCIDRs: an agent started with its node (before the
/// kubelet registered it, or before kube-controller-manager gave it a podCIDR) waits, as flanneld does, saying
/// once why.
pub async fn wait_node_pod_cidrs(client: &Client, name: &str) -> Vec<ipnet::IpNet> {
    let mut said = false;
    loop {
        match node_pod_cidrs(client, name).await {
            Ok(cidrs) if !cidrs.is_empty() => return cidrs,
            Ok(_) if !said => log!("Node {name} has no podCIDR yet: waiting"),
            Err(e) if !said => log!("{e}: waiting"),
            _ => {}
        }
        said = true;
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
}

/// Watches one kind into a store; `changed` is notified on every event. Errors (the API server lost, 410
/// Gone) are logged when they start and end, and counted; the watcher relists and retries with backoff.
fn watch<K>(client: &Client, changed: Arc<Notify>, metrics: Arc<Metrics>) -> Store<K>
where
    K: Resource<DynamicType = ()> + Clone + std::fmt::Debug + DeserializeOwned + Send + Sync + 'static,
{
    let (reader, writer) = reflector::store();
    let stream = reflector::reflector(writer, watcher(Api::<K>::all(client.clone()), watcher::Config::default()))
        .default_backoff();
    tokio::spawn(async move {
        let mut failing = false;
        let mut stream = std::pin::pin!(stream);
        while let Some(event) = stream.next().await {
            match event {
                // A (re)list starting is not the API server being back; its first object is.
                Ok(watcher::Event::Init) => {}
                Ok(_) => {
                    if failing {
                        log!("watching {}: back", K::plural(&()));
                        failing = false;
                    }
                    metrics.event();
                    changed.notify_one();
                }
                // The watch's resourceVersion is older than the server keeps (after a restart, a compaction):
                // the watcher lists everything again. Said every time: a relist is no failure to wait out.
                Err(watcher::Error::WatchError(status)) if status.code == 410 => {
                    metrics.watch_restart(&K::plural(&()), true);
                    log!(
                        "watching {}: resourceVersion expired (410 Gone): listing again, the rules in \
                         force until the list is complete",
                        K::plural(&())
                    );
                    failing = true;
                }
                Err(e) if !failing => {
                    metrics.watch_restart(&K::plural(&()), false);
                    let cause = std::error::Error::source(&e).map(|s| format!(" ({s})")).unwrap_or_default();
                    log!("watching {}: {e}{cause}: keeping the rules in force", K::plural(&()));
                    failing = true;
                }
                Err(_) => metrics.watch_restart(&K::plural(&()), false),
            }
        }
    });
    reader
}

/// One object as the compiler's model (through the API's JSON).
fn convert<K: Serialize, M: DeserializeOwned>(object: &K) -> Result<M, serde_json::Error> {
    serde_json::from_value(serde_json::to_value(object)?)
}

/// Each object of `store` as the model, or when it cannot be converted, `unreadable`'s stand-in (none: left
/// out) and a line saying why in `problems`.
fn converted<K, M>(
    store: &Store<K>,
    unreadable: impl Fn(&str, &str) -> Option<M>,
    problems: &mut BTreeSet<String>,
) -> Vec<M>
where
    K: Resource<DynamicType = ()> + Clone + Serialize,
    M: DeserializeOwned,
{
    let mut out = Vec::new();
    for object in store.state() {
        match convert(object.as_ref()) {
            Ok(model) => out.push(model),
            Err(e) => {
                let meta = object.meta();
                let (namespace, name) = (meta.namespace.as_deref().unwrap_or(""), meta.name.as_deref().unwrap_or(""));
                let stand_in = unreadable(namespace, name);
                let fate = if stand_in.is_some() { "isolating its namespace" } else { "left out" };
                problems.insert(format!("{} {namespace}/{name} not readable ({e}): {fate}", K::kind(&())));
                out.extend(stand_in);
            }
        }
    }
    out
}

impl Stores {
    /// The cluster as the stores hold it, and what of them could not be read. Failing closed: a pod left out
    /// is one the agent does not know (unreachable), a namespace left out has no labels to be selected by, a
    /// policy becomes [`model::NetworkPolicy::unreadable`].
    fn view(&self) -> (Cluster, BTreeSet<String>) {
        let mut problems = BTreeSet::new();
        let cluster = Cluster {
            namespaces: converted(&self.namespaces, |_, _| None, &mut problems),
            pods: converted(&self.pods, |_, _| None, &mut problems),
            policies: converted(
                &self.policies,
                |namespace, name| Some(model::NetworkPolicy::unreadable(namespace, name)),
                &mut problems,
            ),
        };
        (cluster, problems)
    }

    /// [`Stores::view`], saying each problem once (when it starts).
    fn view_logged(&self, logged: &mut BTreeSet<String>) -> Cluster {
        let (cluster, problems) = self.view();
        for problem in problems.difference(logged) {
            log!("{problem}");
        }
        *logged = problems;
        cluster
    }
}

/// Runs the agent on the cluster's objects until killed.
pub async fn run(agent: &mut Agent, client: Client, tick: Duration) -> Result<(), Error> {
    let changed = Arc::new(Notify::new());
    let metrics = agent.metrics.clone();
    let stores = Stores {
        pods: watch(&client, changed.clone(), metrics.clone()),
        namespaces: watch(&client, changed.clone(), metrics.clone()),
        policies: watch(&client, changed.clone(), metrics.clone()),
    };
    for ready in [stores.pods.wait_until_ready().await, stores.namespaces.wait_until_ready().await] {
        ready.map_err(|_| Error::WatchEnded)?;
    }
    stores.policies.wait_until_ready().await.map_err(|_| Error::WatchEnded)?;
    // The lists' events: the start, not an event to time.
    metrics.take_event();
    let mut logged = BTreeSet::new();
    if let Err(e) = agent.apply(&stores.view_logged(&mut logged)) {
        log!("{e}");
    }
    let mut interval = tokio::time::interval(tick);
    loop {
        tokio::select! {
            _ = changed.notified() => {
                tokio::time::sleep(SETTLE).await;
                let since = metrics.take_event();
                let applied = agent.apply(&stores.view_logged(&mut logged));
                metrics.event_applied(since, applied.as_ref().ok().copied());
                if let Err(e) = applied {
                    log!("{e}");
                }
            }
            _ = interval.tick() => {
                if let Err(e) = agent.repair() {
                    log!("{e}");
                }
            }
        }
    }
}
