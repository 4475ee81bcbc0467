//! The agent: one loop that waits for a trigger (a store change, a netlink notification, the periodic
//! resync), reconciles the data plane with the latest cluster on a blocking thread, reports, keeps the node's
//! masquerade and files, and schedules the next pass.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use cnicore::firewall::Backend;
use ipnet::IpNet;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use crate::backend::pod_mtu;
use crate::cli::Cli;
use crate::dataplane::{self, Dataplane, Report};
use crate::error::{ConfigError, Error, Result};
use crate::family::Family;
use crate::flannel::SubnetKey;
use crate::log::{log, summary};
use crate::metrics::{Endpoints, Metrics};
use crate::node::{self, Files};
use crate::source::{Cluster, SourceContext};

/// The periodic full pass.
const RESYNC: Duration = Duration::from_secs(10);

/// What woke the loop.
enum Trigger {
    Store(Instant),
    Drift,
    Resync,
    Stop,
}

struct Agent {
    metrics: Arc<Metrics>,
    /// Returned by each pass's blocking task.
    dataplane: Option<Dataplane>,
    firewall: Option<Backend>,
    /// --firewall-backend was given: it wins over the config's EnableNFTables.
    firewall_given: bool,
    ip_masq: bool,
    /// --iptables-forward-rules: flanneld's forward accept rules beside the masquerade.
    forward_rules: bool,
    /// The masquerade rules are checked this often (`--iptables-resync`), and when the cluster changes.
    masq_check: Duration,
    files: Files,
    last_masq: Option<(Instant, Cluster)>,
    /// Refused peers already logged, and why: each refusal is logged once.
    refusals: BTreeMap<IpNet, String>,
    /// Second keys for a peer's subnet already logged.
    second_keys: BTreeSet<SubnetKey>,
    next_resync: Instant,
    retry_delay: Duration,
    /// Tells the source once the data plane, the masquerade and the files are in place.
    ready: watch::Sender<bool>,
}

/// What the loop waits on: the source's clusters (and its task, whose error ends the agent) and the netlink
/// notifications.
struct Inputs {
    clusters: watch::Receiver<Option<Cluster>>,
    source: tokio::task::JoinHandle<Error>,
    events: mpsc::UnboundedReceiver<()>,
}

/// The agent, as steps: the node and its underlay, the masquerade's backend, the source, the HTTP servers,
/// the netlink notifications and sysctls, then the loop until SIGTERM.
pub async fn run(mut cli: Cli) -> Result<i32> {
    let listeners = bind_http(&cli)?;
    let metrics = Arc::new(Metrics::default());
    let source = cli.source();
    // flanneld: the node's stored public addresses (Kubernetes: its node-public-ip annotations) win.
    let (stored_v4, stored_v6) = source.stored_public_ips().await?;
    if stored_v4.is_some() || stored_v6.is_some() {
        log!(info, "public addresses from the store: {stored_v4:?} {stored_v6:?}");
    }
    cli.public_ip = stored_v4.or(cli.public_ip);
    cli.public_ipv6 = stored_v6.or(cli.public_ipv6);
    let (mut dataplane, identity) = cli.open_dataplane()?;
    cli.underlay_mtu = Some(announce(&mut dataplane, &identity)?);
    // Again, now that the underlay is known: the config's backend MTU is checked against it.
    let source = cli.source();
    let firewall = masquerade_backend(&cli)?;
    let (tx, clusters) = watch::channel::<Option<Cluster>>(None);
    let (ready_tx, ready) = watch::channel(false);
    let context = SourceContext { node: identity, previous: cli.previous(), tx, metrics: metrics.clone(), ready };
    let source = source.spawn(context)?;
    for (listener, endpoints) in listeners {
        tokio::spawn(crate::metrics::serve(listener, metrics.clone(), endpoints));
    }
    let (events_tx, events) = mpsc::unbounded_channel();
    let stop = Arc::new(AtomicBool::new(false));
    dataplane::watch_events(events_tx, stop.clone()).map_err(|e| Error::netlink("netlink events", e))?;
    node::sysctls(&cli.files().node_record()).map_err(|e| Error::io("sysctls", e))?;
    let mut agent = Agent {
        metrics,
        dataplane: Some(dataplane),
        firewall,
        firewall_given: cli.firewall_backend.is_some(),
        ip_masq: cli.ip_masq,
        forward_rules: cli.iptables_forward_rules,
        masq_check: Duration::from_secs(cli.iptables_resync.max(1)),
        files: cli.files(),
        last_masq: None,
        refusals: BTreeMap::new(),
        second_keys: BTreeSet::new(),
        next_resync: Instant::now() + RESYNC,
        retry_delay: Duration::from_millis(100),
        ready: ready_tx,
    };
    let outcome = agent.run_loop(Inputs { clusters, source, events }).await;
    stop.store(true, Ordering::Relaxed);
    outcome
}

/// Logs the node's addresses and underlay; the underlay's MTU.
fn announce(dataplane: &mut Dataplane, identity: &crate::source::NodeIdentity) -> Result<u32> {
    let underlay = dataplane.underlay().map_err(|e| Error::netlink("finding the underlay", e))?;
    let addresses: Vec<String> =
        Family::ALL.iter().filter_map(|f| identity.public(*f)).map(|a| a.to_string()).collect();
    log!(info, "node {} on {} (MTU {})", addresses.join(" "), underlay.name, underlay.mtu);
    Ok(underlay.mtu)
}

/// With --ip-masq or --iptables-forward-rules: the firewall backend, and the nat tables that do not exist yet
/// remembered for cleanup.
fn masquerade_backend(cli: &Cli) -> Result<Option<Backend>> {
    if !cli.ip_masq && !cli.iptables_forward_rules {
        return Ok(None);
    }
    if let Err(e) = node::remember_absent_tables(&cli.files().node_record(), cli.iptables_forward_rules) {
        log!(warn, "{}", Error::io("listing the nf_tables tables", e));
    }
    Backend::resolve(cli.firewall_backend.as_deref()).map(Some).map_err(|e| Error::cni("--firewall-backend", e))
}

/// The listeners of the metrics server (--metrics-addr) and flanneld's health server (--healthz-ip,
/// --healthz-port), bound before anything else: an address in use stops the agent at start.
fn bind_http(cli: &Cli) -> Result<Vec<(std::net::TcpListener, Endpoints)>> {
    let bind = |address: &str, flag: &str| {
        agent_http::bind(address).map_err(|e| Error::io(format!("{flag} {address}: cannot listen"), e.error))
    };
    let mut listeners = Vec::new();
    if !cli.metrics_addr.is_empty() {
        listeners.push((bind(&cli.metrics_addr, "--metrics-addr")?, Endpoints::Metrics));
    }
    if cli.healthz_port > 0 {
        let ip = cli.healthz_ip.parse::<std::net::IpAddr>();
        let ip = ip.map_err(|_| ConfigError::NotAnAddress { flag: "--healthz-ip", text: cli.healthz_ip.clone() })?;
        let address = std::net::SocketAddr::new(ip, cli.healthz_port).to_string();
        log!(info, "serving /healthz and /readyz on {address}");
        listeners.push((bind(&address, "--healthz-port")?, Endpoints::Health));
    }
    Ok(listeners)
}

impl Agent {
    /// Waits for a trigger and makes a pass, until SIGTERM (0) or the source's error.
    async fn run_loop(&mut self, mut inputs: Inputs) -> Result<i32> {
        let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .map_err(|e| Error::io("SIGTERM handler", e))?;
        loop {
            let trigger = tokio::select! {
                changed = inputs.clusters.changed() => match changed {
                    Ok(()) => Trigger::Store(Instant::now()),
                    // The source ended (its sender went with it): its error is the agent's.
                    Err(_) => return Err((&mut inputs.source).await.unwrap_or_else(|e| Error::io("the store's task", std::io::Error::other(e)))),
                },
                Some(()) = inputs.events.recv() => Trigger::Drift,
                _ = tokio::time::sleep_until(self.next_resync) => Trigger::Resync,
                _ = tokio::signal::ctrl_c() => Trigger::Stop,
                _ = terminate.recv() => Trigger::Stop,
            };
            if matches!(trigger, Trigger::Stop) {
                log!(info, "stopping; the data plane stays as it is (fabricd cleanup removes it)");
                return Ok(0);
            }
            // Coalesce a burst of notifications into one pass.
            while inputs.events.try_recv().is_ok() {}
            let Some(cluster) = inputs.clusters.borrow_and_update().clone() else { continue };
            self.pass(&cluster, trigger).await?;
        }
    }

    /// One pass: reconcile, report, then the node's masquerade and files, and the next pass's time.
    async fn pass(&mut self, cluster: &Cluster, trigger: Trigger) -> Result<()> {
        if let Err(e) = node::family_sysctls(&self.files.node_record(), &cluster.config) {
            log!(error, "{}", Error::io("IPv6 forwarding", e));
        }
        let timer = Instant::now();
        let outcome = self.reconcile(cluster).await?;
        self.metrics.reconcile_duration_seconds.observe(timer.elapsed().as_secs_f64());
        Metrics::inc(&self.metrics.reconciles_total);
        let ok = match outcome {
            Ok(report) => self.record(cluster, &report, &trigger),
            Err(e) => {
                log!(error, "reconcile: {e}");
                false
            }
        };
        if !ok {
            Metrics::inc(&self.metrics.reconcile_errors_total);
        }
        Metrics::set(&self.metrics.ready, ok as u64);
        let underlay = self.dataplane_mut().underlay().map_err(|e| Error::netlink("finding the underlay", e))?;
        let families = cluster.config.families().map(|f| f.family());
        let mtu = pod_mtu(&*cluster.config.backend, families, &underlay);
        self.masquerade_if_due(cluster);
        self.write_files(cluster, mtu, ok);
        if ok {
            Metrics::set(&self.metrics.started, 1);
            self.ready.send_if_modified(|ready| !std::mem::replace(ready, true));
        }
        self.schedule(ok);
        Ok(())
    }

    fn dataplane_mut(&mut self) -> &mut Dataplane {
        self.dataplane.as_mut().expect("returned after each pass")
    }

    /// Runs the reconciliation on a blocking thread (netlink is synchronous).
    async fn reconcile(&mut self, cluster: &Cluster) -> Result<std::io::Result<Report>> {
        let mut plane = self.dataplane.take().expect("returned after each pass");
        let cluster = cluster.clone();
        let (plane, outcome) = tokio::task::spawn_blocking(move || {
            let outcome = plane.reconcile(&cluster, false);
            (plane, outcome)
        })
        .await
        .map_err(|e| Error::Io { what: "the reconcile task".into(), source: std::io::Error::other(e) })?;
        self.dataplane = Some(plane);
        Ok(outcome)
    }

    /// Counts and logs a pass; true when the kernel took every change.
    fn record(&mut self, cluster: &Cluster, report: &Report, trigger: &Trigger) -> bool {
        let changes = report.changes.len() as u64;
        Metrics::add(&self.metrics.changes_total, changes);
        if matches!(trigger, Trigger::Drift) && changes > 0 {
            Metrics::add(&self.metrics.drift_repairs_total, changes);
            log!(warn, "repaired {changes} changes made by someone else: {}", summary(&report.changes));
        } else if changes > 0 {
            log!(info, "applied {changes} changes: {}", summary(&report.changes));
        }
        if let Trigger::Store(seen) = trigger {
            self.metrics.last_convergence_seconds.set(seen.elapsed().as_secs_f64());
        }
        if report.errors.is_empty() {
            self.metrics.paths(cluster.config.backend.type_name(), report.paths.iter());
        }
        self.log_refusals(report);
        self.log_second_keys(cluster);
        for error in &report.errors {
            log!(error, "{error}");
        }
        report.errors.is_empty()
    }

    /// Logs each refused peer once (again only when the reason changes), and counts them.
    fn log_refusals(&mut self, report: &Report) {
        let mut now = BTreeMap::new();
        for (subnet, refusal) in report.refused() {
            let reason = refusal.to_string();
            if self.refusals.get(subnet) != Some(&reason) {
                if refusal.is_invalid_lease() {
                    Metrics::inc(&self.metrics.refused_leases_total);
                }
                log!(error, "refusing the lease of {subnet}: {reason}");
            }
            now.insert(*subnet, reason);
        }
        for subnet in self.refusals.keys().filter(|s| !now.contains_key(s)) {
            log!(info, "the lease of {subnet} is no longer refused (fixed or gone)");
        }
        Metrics::set(&self.metrics.refused_peers, now.len() as u64);
        self.refusals = now;
    }

    /// Logs each key naming a subnet an older lease names once (the plan refuses it).
    fn log_second_keys(&mut self, cluster: &Cluster) {
        let now: BTreeMap<SubnetKey, SubnetKey> = crate::plan::second_keys(cluster).into_iter().collect();
        for (key, holder) in &now {
            if !self.second_keys.contains(key) {
                log!(error, "refusing the lease of {key}: the older lease of {holder} names that subnet");
            }
        }
        self.second_keys = now.into_keys().collect();
    }

    /// The masquerade rules, checked every --iptables-resync seconds and whenever the cluster's subnet or config changes.
    fn masquerade_if_due(&mut self, cluster: &Cluster) {
        let Some(chosen) = self.firewall else { return };
        let backend = match cluster.config.enable_nftables && !self.firewall_given {
            true => Backend::Nftables,
            false => chosen,
        };
        let due = self.last_masq.as_ref().is_none_or(|(at, last)| {
            at.elapsed() > self.masq_check || last.subnet != cluster.subnet || last.config != cluster.config
        });
        if !due {
            return;
        }
        match node::masquerade(backend, &cluster.config, cluster.subnet, self.ip_masq, self.forward_rules) {
            Ok(()) => self.last_masq = Some((Instant::now(), cluster.clone())),
            Err(e) => log!(error, "{}", Error::cni("masquerade", e)),
        }
    }

    /// subnet.env always; the conflist once the data plane is programmed (the node is ready). Each written only
    /// when it changes.
    fn write_files(&self, cluster: &Cluster, mtu: u32, ready: bool) {
        let lease = cluster.lease.map(|token| token.0);
        let env = node::subnet_env(&cluster.config, cluster.subnet, mtu, self.ip_masq, lease);
        if let Err(e) = node::write_if_changed(&self.files.subnet_file, &env) {
            log!(error, "{}", Error::io(self.files.subnet_file.display().to_string(), e));
        }
        if !ready {
            return;
        }
        let path = self.files.conflist_path();
        if let Some(stale) = self.files.stale_conflist() {
            match std::fs::remove_file(&stale) {
                Ok(()) => {
                    log!(info, "removed {}: the conflist goes by flannel's name, {}", stale.display(), path.display())
                }
                Err(e) => log!(error, "{}", Error::io(stale.display().to_string(), e)),
            }
        }
        let conflist = node::conflist(cluster.subnet, mtu, self.files.ipam_data_dir.as_deref());
        match node::write_if_changed(&path, &conflist) {
            Ok(true) => log!(info, "wrote {} (subnet {}, MTU {mtu})", path.display(), cluster.subnet),
            Ok(false) => {}
            Err(e) => log!(error, "{}", Error::io(path.display().to_string(), e)),
        }
    }

    /// The next pass: the periodic resync after a good pass, a retry with backoff after a failed one.
    fn schedule(&mut self, ok: bool) {
        if ok {
            self.retry_delay = Duration::from_millis(100);
            self.next_resync = Instant::now() + RESYNC;
        } else {
            self.next_resync = Instant::now() + self.retry_delay;
            self.retry_delay = (self.retry_delay * 2).min(RESYNC);
        }
    }
}
