//! cni-netpol: Kubernetes NetworkPolicy on this node, in nftables (see the crate's README).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, Subcommand};
use ipnet::IpNet;

use netpol::agent::{ensure_bridge_netfilter, Agent, StaticFile};
use netpol::compile::NodeOptions;
use netpol::metrics::Metrics;
use netpol::plan::TABLE;
use netpol::verdicts::{self, DropLogArgs};

#[derive(Parser, Debug)]
#[command(name = "cni-netpol", about = "NetworkPolicy enforced natively in nftables")]
struct Cli {
    /// The nftables table (family inet) the agent owns.
    #[arg(long, default_value = TABLE, global = true)]
    table: String,
    /// Serve /metrics (Prometheus text), /healthz and /readyz on this address (host:port; default: none).
    #[arg(long, global = true)]
    metrics_addr: Option<String>,
    /// The agent's run directory: its drop log and the view in force (`drops`, `explain`).
    #[arg(long, default_value = verdicts::RUN_DIR, global = true)]
    run_dir: PathBuf,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Enforce the policies of a cluster view read from a JSON file (namespaces, pods, policies as the API
    /// writes them), applying every change to the file; runs until killed, leaving the rules in force.
    Run {
        /// The cluster view.
        #[arg(long = "static")]
        file: PathBuf,
        /// A pod CIDR of this node: its addresses that no known pod holds are dropped until the agent knows
        /// the pod (repeat for each family).
        #[arg(long = "pod-cidr")]
        pod_cidrs: Vec<IpNet>,
        /// How often the source is read, in milliseconds.
        #[arg(long, default_value_t = 200)]
        interval_ms: u64,
        /// Apply once and exit.
        #[arg(long)]
        once: bool,
        #[command(flatten)]
        drop_log: DropLogArgs,
    },
    /// Enforce the cluster's policies, watching Pods, Namespaces and NetworkPolicies on the API server; runs
    /// until killed, leaving the rules in force.
    Watch {
        /// The kubeconfig (default: in-cluster, then KUBECONFIG, then ~/.kube/config).
        #[arg(long)]
        kubeconfig: Option<PathBuf>,
        /// This node's name: its Node's podCIDRs are the pod CIDRs (see --pod-cidr).
        #[arg(long)]
        node_name: Option<String>,
        /// A pod CIDR of this node (instead of the Node's).
        #[arg(long = "pod-cidr")]
        pod_cidrs: Vec<IpNet>,
        /// How often the table's presence is checked, in milliseconds.
        #[arg(long, default_value_t = 10_000)]
        repair_ms: u64,
        #[command(flatten)]
        drop_log: DropLogArgs,
    },
    /// Print the drops this node's agent logged (one JSON line per dropped flow); --follow: then each new one.
    Drops {
        #[arg(long)]
        follow: bool,
    },
    /// Judge a flow (FROM and TO: namespace/pod or an address; PORT/PROTO: 80/tcp) on the view the agent put
    /// in force, naming the policy rule that allows it or the isolation that drops it.
    Explain {
        from: String,
        to: String,
        port: String,
        /// Judge it on a cluster file instead (with --pod-cidr).
        #[arg(long = "static")]
        file: Option<PathBuf>,
        #[arg(long = "pod-cidr")]
        pod_cidrs: Vec<IpNet>,
    },
    /// Remove the table, and nothing else.
    Cleanup,
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run { file, pod_cidrs, interval_ms, once, drop_log } => serve(cli.metrics_addr)
            .and_then(|metrics| run(&cli.table, file, pod_cidrs, interval_ms, once, (&cli.run_dir, drop_log, metrics))),
        Command::Watch { kubeconfig, node_name, pod_cidrs, repair_ms, drop_log } => {
            let repair = Duration::from_millis(repair_ms);
            serve(cli.metrics_addr).and_then(|metrics| {
                watch(&cli.table, kubeconfig, node_name, pod_cidrs, repair, (&cli.run_dir, drop_log, metrics))
            })
        }
        Command::Drops { follow } => verdicts::drops_command(&cli.run_dir, follow),
        Command::Explain { from, to, port, file, pod_cidrs } => {
            verdicts::explain_command(&cli.run_dir, file, pod_cidrs, [&from, &to, &port])
        }
        Command::Cleanup => netpol::apply::remove(&cli.table)
            .map_err(|error| netpol::error::Error::Nftables { doing: "removing the table", error }),
    };
    if let Err(e) = result {
        netpol::log!("{e}");
        std::process::exit(1);
    }
}

/// The agent's metrics, served on `address` (bound now: an address in use stops the agent at start).
fn serve(address: Option<String>) -> Result<Arc<Metrics>, netpol::error::Error> {
    let metrics = Arc::new(Metrics::default());
    if let Some(address) = address {
        netpol::metrics::serve(&address, metrics.clone()).map_err(netpol::error::Error::Listen)?;
    }
    Ok(metrics)
}

fn run(
    table: &str,
    file: PathBuf,
    pod_cidrs: Vec<IpNet>,
    interval_ms: u64,
    once: bool,
    agent_args: AgentArgs,
) -> Result<(), netpol::error::Error> {
    ensure_bridge_netfilter()?;
    let mut agent = agent(table, pod_cidrs, agent_args);
    let mut source = StaticFile::new(file);
    let first = source.poll()?.unwrap_or_default();
    agent.apply(&first)?;
    if once {
        return Ok(());
    }
    agent.run(&mut source, Duration::from_millis(interval_ms))
}

fn watch(
    table: &str,
    kubeconfig: Option<PathBuf>,
    node_name: Option<String>,
    mut pod_cidrs: Vec<IpNet>,
    repair: Duration,
    agent_args: AgentArgs,
) -> Result<(), netpol::error::Error> {
    ensure_bridge_netfilter()?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("tokio runtime");
    runtime.block_on(async move {
        let client = netpol::watch::client(kubeconfig.as_deref()).await?;
        if let (true, Some(name)) = (pod_cidrs.is_empty(), &node_name) {
            pod_cidrs = netpol::watch::wait_node_pod_cidrs(&client, name).await;
        }
        if pod_cidrs.is_empty() {
            netpol::log!("no pod CIDR: a pod is open until the agent knows it");
        }
        let mut agent = agent(table, pod_cidrs, agent_args);
        netpol::watch::run(&mut agent, client, repair).await
    })
}

/// What every agent is given beside its table and pod CIDRs: the run directory, the drop log's flags, the metrics.
type AgentArgs<'a> = (&'a std::path::Path, DropLogArgs, Arc<Metrics>);

/// The agent, its drops logged, its views kept for `explain` ([`verdicts::start`]) and its metrics served.
fn agent(table: &str, pod_cidrs: Vec<IpNet>, (run_dir, args, metrics): AgentArgs) -> Agent {
    let drop_log = args.drop_log();
    let on_applied = verdicts::start(run_dir.to_path_buf(), pod_cidrs.clone(), drop_log);
    let mut agent = Agent::new(table, NodeOptions { pod_cidrs, drop_log });
    agent.on_applied = Some(on_applied);
    agent.metrics = metrics;
    agent
}
