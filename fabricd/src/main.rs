//! fabricd: the node agent that joins every node's pods into one flat network (flannel's job, on flannel's
//! etcd layout and flags). See the README of this crate for the design.

mod dataplane;
mod flannel;
mod metrics;
mod node;
mod source;

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use clap::{ArgAction, Parser, Subcommand};
use cnicore::firewall::Backend;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use dataplane::Dataplane;
use metrics::Metrics;
use source::etcd::{EtcdOptions, Previous, Store};
use source::{derived_vtep_mac, Cluster, NodeIdentity};

/// Logs one line on stderr: `fabricd <level>: <message>`.
#[macro_export]
macro_rules! log {
    ($level:ident, $($arg:tt)*) => {
        eprintln!("fabricd {}: {}", stringify!($level), format!($($arg)*))
    };
}

/// Flags named as flanneld names them mean what they mean there, so a flannel unit changes only its binary.
#[derive(Parser, Debug)]
#[command(name = "fabricd", about = "Node agent: one flat pod network across nodes, on etcd (flannel's layout)")]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// etcd endpoints, comma-separated.
    #[arg(long, default_value = "http://127.0.0.1:4001,http://127.0.0.1:2379", value_delimiter = ',')]
    etcd_endpoints: Vec<String>,
    /// etcd prefix of the network config and the leases.
    #[arg(long, default_value = flannel::DEFAULT_PREFIX)]
    etcd_prefix: String,
    /// CA certificate file to verify etcd's certificate with.
    #[arg(long)]
    etcd_cafile: Option<PathBuf>,
    /// Client certificate file (PEM) for etcd.
    #[arg(long)]
    etcd_certfile: Option<PathBuf>,
    /// Client key file (PEM) for etcd.
    #[arg(long)]
    etcd_keyfile: Option<PathBuf>,
    /// Interface (name or address) for traffic between nodes; repeatable, the first found wins. Default: the
    /// interface of the default route.
    #[arg(long)]
    iface: Vec<String>,
    /// The address other nodes reach this one at (default: the interface's first IPv4 address).
    #[arg(long)]
    public_ip: Option<Ipv4Addr>,
    /// flannel's subnet.env.
    #[arg(long, default_value = "/run/flannel/subnet.env")]
    subnet_file: PathBuf,
    /// Masquerade pod traffic leaving the cluster network.
    #[arg(long, action = ArgAction::Set, require_equals = true, default_value = "false")]
    ip_masq: bool,
    /// Renew the subnet lease this many minutes before it expires.
    #[arg(long, default_value_t = 60)]
    subnet_lease_renew_margin: u64,
    /// Where the node's CNI conflist is written.
    #[arg(long, default_value = "/etc/cni/net.d")]
    cni_conf_dir: PathBuf,
    /// Static mode: the subnet and the peers from this file; no etcd.
    #[arg(long)]
    static_config: Option<PathBuf>,
    /// TTL of the subnet lease, in seconds (flannel: 24 hours).
    #[arg(long, default_value_t = 86400)]
    subnet_lease_ttl: u64,
    /// host-local's dataDir in the conflist (default: host-local's own).
    #[arg(long)]
    cni_ipam_data_dir: Option<PathBuf>,
    /// Firewall backend for the masquerade: iptables or nftables (default: iptables when installed).
    #[arg(long)]
    firewall_backend: Option<String>,
    /// Serve Prometheus metrics here ("" to disable).
    #[arg(long, default_value = "127.0.0.1:9799")]
    metrics_addr: String,
    /// Remove everything fabricd made on this node (routes, vxlan device, rules, files, its lease) and exit.
    #[arg(long)]
    cleanup: bool,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Own lease, peers, and what differs between the node and the wanted state.
    Status,
    /// Same as --cleanup.
    Cleanup,
    /// Acquire (or find) this node's lease for --public-ip, print the subnet and exit; touches nothing on the
    /// node (a client for tests of concurrent allocation and of TLS).
    #[command(hide = true)]
    Acquire,
}

/// Go's flag package takes `-flag` as well as `--flag`, and a boolean flag alone means true (`--ip-masq`) while
/// its value must be joined (`--ip-masq=false`): accept the same.
fn go_style_args() -> Vec<String> {
    std::env::args()
        .enumerate()
        .map(|(i, arg)| {
            let bytes = arg.as_bytes();
            if arg == "--ip-masq" || arg == "-ip-masq" {
                "--ip-masq=true".to_string()
            } else if i > 0
                && bytes.len() > 2
                && bytes[0] == b'-'
                && bytes[1].is_ascii_alphabetic()
                && arg.contains(['-', '='])
                && bytes[1] != b'h'
            {
                format!("-{arg}")
            } else {
                arg
            }
        })
        .collect()
}

impl Cli {
    fn etcd_options(&self) -> EtcdOptions {
        EtcdOptions {
            endpoints: self.etcd_endpoints.clone(),
            prefix: self.etcd_prefix.clone(),
            cafile: self.etcd_cafile.clone(),
            certfile: self.etcd_certfile.clone(),
            keyfile: self.etcd_keyfile.clone(),
            lease_ttl: Duration::from_secs(self.subnet_lease_ttl),
            renew_margin: Duration::from_secs(self.subnet_lease_renew_margin * 60)
                .min(Duration::from_secs(self.subnet_lease_ttl / 2)),
        }
    }

    fn files(&self) -> node::Files {
        node::Files {
            cni_conf_dir: self.cni_conf_dir.clone(),
            subnet_file: self.subnet_file.clone(),
            ipam_data_dir: self.cni_ipam_data_dir.clone(),
        }
    }

    fn previous(&self) -> Previous {
        let text = std::fs::read_to_string(&self.subnet_file).unwrap_or_default();
        let env = cnicore::subnet_env::SubnetEnv::parse(&text).unwrap_or_default();
        Previous { subnet: env.subnet.map(|s| s.trunc()), lease_id: env.lease }
    }
}

fn main() {
    let cli = Cli::parse_from(go_style_args());
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("tokio runtime");
    let code = runtime.block_on(async move {
        let cleanup = cli.cleanup || matches!(cli.command, Some(Command::Cleanup));
        let result = match cli.command {
            _ if cleanup => cleanup_node(&cli).await,
            Some(Command::Status) => status(&cli).await,
            Some(Command::Acquire) => acquire(&cli).await,
            _ => agent(cli).await,
        };
        match result {
            Ok(code) => code,
            Err(e) => {
                log!(error, "{e}");
                1
            }
        }
    });
    std::process::exit(code);
}

/// The node's identity and its data plane handle.
fn open_dataplane(cli: &Cli) -> Result<(Dataplane, NodeIdentity), String> {
    let mut dataplane =
        Dataplane::new(cli.iface.clone(), cli.public_ip, [0; 6]).map_err(|e| format!("netlink: {e}"))?;
    let underlay = dataplane.underlay().map_err(|e| e.to_string())?;
    let identity = NodeIdentity { public_ip: underlay.public_ip, vtep_mac: derived_vtep_mac(underlay.public_ip) };
    let dataplane =
        Dataplane::new(cli.iface.clone(), cli.public_ip, identity.vtep_mac).map_err(|e| format!("netlink: {e}"))?;
    Ok((dataplane, identity))
}

async fn agent(cli: Cli) -> Result<i32, String> {
    let metrics = Arc::new(Metrics::default());
    let (mut dataplane, identity) = open_dataplane(&cli)?;
    let underlay = dataplane.underlay().map_err(|e| e.to_string())?;
    log!(info, "node {} on {} (MTU {})", identity.public_ip, underlay.name, underlay.mtu);
    let firewall =
        if cli.ip_masq { Some(Backend::resolve(cli.firewall_backend.as_deref()).map_err(|e| e.msg)?) } else { None };

    let (tx, mut clusters) = watch::channel::<Option<Cluster>>(None);
    match &cli.static_config {
        Some(path) => {
            // Fail at once on a broken file; later edits are picked up (a broken edit keeps the last state).
            source::static_file::load(path)?;
            tokio::spawn(source::static_file::run(path.clone(), tx));
        }
        None => {
            tokio::spawn(source::etcd::run(cli.etcd_options(), identity.clone(), cli.previous(), tx, metrics.clone()));
        }
    }
    if !cli.metrics_addr.is_empty() {
        tokio::spawn(metrics::serve(cli.metrics_addr.clone(), metrics.clone()));
    }
    let (events_tx, mut events) = mpsc::unbounded_channel();
    let stop = Arc::new(AtomicBool::new(false));
    dataplane::watch_events(events_tx, stop.clone()).map_err(|e| format!("netlink events: {e}"))?;
    node::sysctls().map_err(|e| format!("sysctls: {e}"))?;

    let files = cli.files();
    let mut terminate =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).map_err(|e| e.to_string())?;
    let mut dataplane = Some(dataplane);
    let resync = Duration::from_secs(10);
    let mut next_resync = Instant::now() + resync;
    let mut retry_delay = Duration::from_millis(100);
    let mut last_masq: Option<(Instant, Cluster)> = None;
    loop {
        let mut drift = false;
        let mut store_change = None;
        tokio::select! {
            changed = clusters.changed() => {
                if changed.is_err() { break; }
                store_change = Some(Instant::now());
            }
            Some(()) = events.recv() => drift = true,
            _ = tokio::time::sleep_until(next_resync) => {}
            _ = tokio::signal::ctrl_c() => break,
            _ = terminate.recv() => break,
        }
        // Coalesce a burst of notifications into one pass.
        while events.try_recv().is_ok() {}
        let Some(cluster) = clusters.borrow_and_update().clone() else { continue };
        let mut plane = dataplane.take().expect("dataplane returned after each pass");
        let for_pass = cluster.clone();
        let (plane, outcome) = tokio::task::spawn_blocking(move || {
            let outcome = plane.reconcile(&for_pass, false);
            (plane, outcome)
        })
        .await
        .map_err(|e| e.to_string())?;
        dataplane = Some(plane);
        Metrics::inc(&metrics.reconciles_total);
        let ok = match outcome {
            Ok(report) => {
                let changes = report.changes.len() as u64;
                Metrics::add(&metrics.changes_total, changes);
                Metrics::set(&metrics.refused_peers, report.refused_peers as u64);
                if drift && store_change.is_none() && changes > 0 {
                    Metrics::add(&metrics.drift_repairs_total, changes);
                    log!(warn, "repaired {changes} changes made by someone else: {}", summary(&report.changes));
                } else if changes > 0 {
                    log!(info, "applied {changes} changes: {}", summary(&report.changes));
                }
                if let Some(seen) = store_change {
                    Metrics::set(&metrics.last_convergence_seconds, seen.elapsed().as_micros() as u64);
                }
                for error in &report.errors {
                    log!(error, "{error}");
                }
                report.errors.len() == report.refused_peers
            }
            Err(e) => {
                log!(error, "reconcile: {e}");
                false
            }
        };
        if !ok {
            Metrics::inc(&metrics.reconcile_errors_total);
        }
        // The node is ready: its files say so (written only when they change).
        let underlay = dataplane.as_mut().expect("present").underlay().map_err(|e| e.to_string())?;
        let mtu = dataplane::pod_mtu(&cluster.config, &underlay);
        if let Some(backend) = firewall {
            let due = last_masq.as_ref().is_none_or(|(at, last)| {
                at.elapsed() > Duration::from_secs(30) || last.subnet != cluster.subnet || last.config != cluster.config
            });
            if due {
                match node::masquerade(backend, &cluster.config, cluster.subnet) {
                    Ok(()) => last_masq = Some((Instant::now(), cluster.clone())),
                    Err(e) => log!(error, "masquerade: {}", e.msg),
                }
            }
        }
        let env = node::subnet_env(&cluster.config, cluster.subnet, mtu, cli.ip_masq, cluster.lease_id);
        if let Err(e) = node::write_if_changed(&files.subnet_file, &env) {
            log!(error, "{}: {e}", files.subnet_file.display());
        }
        if ok {
            let conflist = node::conflist(cluster.subnet, mtu, files.ipam_data_dir.as_deref());
            match node::write_if_changed(&files.conflist_path(), &conflist) {
                Ok(true) => {
                    log!(info, "wrote {} (subnet {}, MTU {mtu})", files.conflist_path().display(), cluster.subnet)
                }
                Ok(false) => {}
                Err(e) => log!(error, "{}: {e}", files.conflist_path().display()),
            }
            retry_delay = Duration::from_millis(100);
            next_resync = Instant::now() + resync;
        } else {
            next_resync = Instant::now() + retry_delay;
            retry_delay = (retry_delay * 2).min(resync);
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    log!(info, "stopping; the data plane stays as it is (fabricd cleanup removes it)");
    Ok(0)
}

fn summary(changes: &[String]) -> String {
    const SHOWN: usize = 5;
    let mut text = changes.iter().take(SHOWN).cloned().collect::<Vec<_>>().join("; ");
    if changes.len() > SHOWN {
        text.push_str(&format!("; and {} more", changes.len() - SHOWN));
    }
    text
}

/// The cluster as the store says now, for status and cleanup (etcd: this node's lease found by its public
/// IP, else by the subnet file).
async fn current_cluster(
    cli: &Cli,
    identity: &NodeIdentity,
    metrics: Arc<Metrics>,
) -> Result<(Cluster, Option<Store>), String> {
    if let Some(path) = &cli.static_config {
        return Ok((source::static_file::load(path)?, None));
    }
    let mut store = Store::connect(&cli.etcd_options(), metrics).await?;
    let config = store.config().await?;
    let (leases, _) = store.leases().await?;
    let previous = cli.previous();
    let own = leases
        .iter()
        .find(|(_, (attrs, _, _))| attrs.public_ip == identity.public_ip)
        .or_else(|| {
            leases
                .iter()
                .find(|(subnet, (_, id, _))| Some(**subnet) == previous.subnet && Some(*id) == previous.lease_id)
        })
        .map(|(subnet, (_, id, _))| (*subnet, *id));
    let Some((subnet, lease_id)) = own else {
        return Err(format!("no lease in etcd for this node ({})", identity.public_ip));
    };
    let peers = leases.into_iter().filter(|(s, _)| *s != subnet).map(|(s, (a, _, _))| (s, a)).collect();
    Ok((Cluster { config, subnet, lease_id: Some(lease_id), peers }, Some(store)))
}

async fn status(cli: &Cli) -> Result<i32, String> {
    let (mut dataplane, identity) = open_dataplane(cli)?;
    let (cluster, _) = current_cluster(cli, &identity, Arc::new(Metrics::default())).await?;
    let underlay = dataplane.underlay().map_err(|e| e.to_string())?;
    let lease = cluster.lease_id.map(|id| format!("etcd lease {id:x}")).unwrap_or_else(|| "static".into());
    println!(
        "node {} on {}: subnet {} ({lease}), backend {}, network {}",
        identity.public_ip,
        underlay.name,
        cluster.subnet,
        cluster.config.backend.type_name(),
        cluster.config.network
    );
    let paths = dataplane::plan(&cluster, &underlay);
    println!("peers: {}", cluster.peers.len());
    for (subnet, attrs) in &cluster.peers {
        let how = match &paths[subnet] {
            dataplane::PeerPath::Direct { gateway } => format!("route via {gateway}"),
            dataplane::PeerPath::Overlay { vtep_mac, endpoint } => {
                format!("vxlan to {endpoint} (VTEP {})", cnicore::mac::format(vtep_mac))
            }
            dataplane::PeerPath::Refused(reason) => format!("REFUSED: {reason}"),
        };
        println!("  {subnet} node {}: {how}", attrs.public_ip);
    }
    let report = dataplane.reconcile(&cluster, true).map_err(|e| e.to_string())?;
    let ours = dataplane
        .netlink()
        .routes(cnicore::netlink::IpFamily::V4, cnicore::netlink::RT_TABLE_MAIN)
        .map_err(|e| e.to_string())?
        .into_iter()
        .filter(|r| r.protocol == Some(dataplane::ROUTE_PROTOCOL))
        .count();
    println!("routes made by fabricd: {ours}");
    if report.changes.is_empty() {
        println!("in sync with the wanted state");
        Ok(0)
    } else {
        println!("differs from the wanted state ({}):", report.changes.len());
        for change in &report.changes {
            println!("  {change}");
        }
        Ok(3)
    }
}

async fn acquire(cli: &Cli) -> Result<i32, String> {
    let public_ip = cli.public_ip.ok_or("acquire needs --public-ip")?;
    let identity = NodeIdentity { public_ip, vtep_mac: derived_vtep_mac(public_ip) };
    let options = cli.etcd_options();
    let mut store = Store::connect(&options, Arc::new(Metrics::default()))
        .await
        .map_err(|e| format!("etcd {}: {e}", options.endpoints.join(",")))?;
    let config = store.config().await?;
    let (subnet, lease) = store.acquire(&config, &identity.attrs(&config), cli.previous(), options.lease_ttl).await?;
    println!("{subnet} {lease:x}");
    Ok(0)
}

async fn cleanup_node(cli: &Cli) -> Result<i32, String> {
    let (mut dataplane, identity) = open_dataplane(cli)?;
    let mut code = 0;
    let mut devices = Vec::new();
    match current_cluster(cli, &identity, Arc::new(Metrics::default())).await {
        Ok((cluster, store)) => {
            devices.push(cluster.config.vxlan_device());
            if let Some(mut store) = store {
                match store.release(&cluster.subnet, cluster.lease_id).await {
                    Ok(()) => log!(info, "released the lease of {}", cluster.subnet),
                    Err(e) => {
                        log!(error, "releasing the lease of {}: {e}", cluster.subnet);
                        code = 1;
                    }
                }
            }
        }
        Err(e) => {
            log!(warn, "{e}: cleaning up the node only");
            code = 1;
        }
    }
    // A vxlan device of ours under any VNI.
    for link in dataplane.netlink().links().map_err(|e| e.to_string())? {
        if link.name.starts_with("flannel.") && link.kind.as_deref() == Some("vxlan") && !devices.contains(&link.name) {
            devices.push(link.name);
        }
    }
    let removed = dataplane.cleanup(&devices).map_err(|e| e.to_string())?;
    log!(info, "removed {} objects: {}", removed.len(), summary(&removed));
    if let Err(e) = cnicore::firewall::node_masq::teardown() {
        log!(error, "{}", e.msg);
        code = 1;
    }
    let files = cli.files();
    for path in [files.conflist_path(), files.subnet_file.clone()] {
        match std::fs::remove_file(&path) {
            Ok(()) => log!(info, "removed {}", path.display()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                log!(error, "{}: {e}", path.display());
                code = 1;
            }
        }
    }
    Ok(code)
}
