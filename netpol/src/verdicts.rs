//! Verdicts an operator can read, beside the enforcing agent: the drop log's flags, the NFLOG reader
//! thread writing [`crate::drops`], and the view in force kept in the run directory (`view.json`) for
//! `cni-netpol explain`. Logging is best effort: a group another program holds is reported once, and the
//! rules (drops included) are in force all the same.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use crate::compile::NodeOptions;
use crate::drops::{Directory, DropFile, RecentFlows};
use crate::error::Error;
use crate::explain::{explain, parse_port, Endpoint};
use crate::model::Cluster;
use crate::nflog::{parse_headers, Nflog};
use crate::plan::{DropLog, Isolation, Plan};

/// The view file in the run directory.
pub const VIEW_FILE: &str = "view.json";
/// The default run directory.
pub const RUN_DIR: &str = "/run/cni-netpol";

/// The drop log's flags (`run` and `watch`).
#[derive(clap::Args, Debug, Clone)]
pub struct DropLogArgs {
    /// The NFLOG group the drop rules log to (and the agent reads).
    #[arg(long, default_value_t = 100)]
    pub drop_log_group: u16,
    /// Logged drops per second, per drop rule, in the kernel (`limit rate N/second`); 0 (the default until the
    /// truth-table flake seen with logging on is explained: netpol README): drops are not logged.
    #[arg(long, default_value_t = 0)]
    pub drop_log_rate: u32,
    /// Drops logged at once before the rate applies (`burst N packets`).
    #[arg(long, default_value_t = 20)]
    pub drop_log_burst: u32,
}

impl DropLogArgs {
    /// The drop rules' log settings, `None` when the rate is 0.
    pub fn drop_log(&self) -> Option<DropLog> {
        (self.drop_log_rate > 0).then_some(DropLog {
            group: self.drop_log_group,
            rate: self.drop_log_rate,
            burst: self.drop_log_burst.max(1),
        })
    }
}

/// What `explain` reads: the view the agent last put in force, and the node's pod CIDRs.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct View {
    pub pod_cidrs: Vec<IpNet>,
    pub cluster: Cluster,
}

impl View {
    pub fn read(run_dir: &Path) -> io::Result<View> {
        let bytes = std::fs::read(run_dir.join(VIEW_FILE))?;
        serde_json::from_slice(&bytes).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
    }

    pub fn node(&self) -> NodeOptions {
        NodeOptions { pod_cidrs: self.pod_cidrs.clone(), drop_log: None }
    }
}

/// The hook the agent calls after each view it puts in force.
pub type OnApplied = Box<dyn FnMut(&Cluster, &Plan) + Send>;

/// Starts the drop log's reader (when drops are logged) and returns the agent's hook: each view in force
/// updates the reader's directory and is written to `view.json` (atomically). Best effort: a run directory
/// that cannot be made (a read-only root) is reported, and the agent enforces without it.
pub fn start(run_dir: PathBuf, pod_cidrs: Vec<IpNet>, drop_log: Option<DropLog>) -> OnApplied {
    let directory = Arc::new(Mutex::new(Directory::default()));
    if let Err(e) = std::fs::create_dir_all(&run_dir) {
        log!("{}: {e}: no drop log, no view for explain", run_dir.display());
        return Box::new(|_: &Cluster, _: &Plan| {});
    }
    if let Some(log) = drop_log {
        let (reader, file) = (directory.clone(), DropFile::new(&run_dir));
        let spawned =
            std::thread::Builder::new().name("nflog".into()).spawn(move || read_drops(log.group, &reader, &file));
        if let Err(e) = spawned {
            log!("the drop log's reader: {e}: drops are enforced but not logged");
        }
    }
    let mut write_failed = false;
    Box::new(move |cluster: &Cluster, plan: &Plan| {
        *directory.lock().unwrap_or_else(PoisonError::into_inner) = Directory::new(cluster, plan);
        let view = View { pod_cidrs: pod_cidrs.clone(), cluster: cluster.clone() };
        let written = serde_json::to_vec(&view)
            .map_err(io::Error::other)
            .and_then(|bytes| cnicore::state::write_atomic(&run_dir.join(VIEW_FILE), &bytes, 0o640));
        match written {
            Err(e) if !write_failed => {
                log!("writing {VIEW_FILE}: {e}: explain reads an older view");
                write_failed = true;
            }
            Err(_) => {}
            Ok(()) => write_failed = false,
        }
    })
}

/// The reader thread: every packet the drop rules log becomes a line of the drop log. Returns (with one
/// line on stderr) when the group cannot be read; the rules are not touched.
fn read_drops(group: u16, directory: &Mutex<Directory>, file: &DropFile) {
    let mut nflog = match Nflog::bind(group) {
        Ok(nflog) => nflog,
        Err(e) => {
            log!("{e}: drops are enforced but not logged");
            return;
        }
    };
    let mut recent = RecentFlows::default();
    let mut failing = false;
    loop {
        let logged = match nflog.receive() {
            Ok(logged) => logged,
            Err(e) => {
                log!("reading NFLOG group {group}: {e}: drops are enforced but no longer logged");
                return;
            }
        };
        for packet in logged {
            let (Some(isolation), Some(headers)) =
                (Isolation::from_prefix(&packet.prefix), parse_headers(&packet.payload))
            else {
                continue;
            };
            if !recent.is_new(isolation, &headers, Instant::now()) {
                continue;
            }
            let time = format!("{:.3}", k8s_openapi::jiff::Timestamp::now());
            let record = directory.lock().unwrap_or_else(PoisonError::into_inner).record(isolation, &headers, time);
            match file.append(&record) {
                Err(e) if !failing => {
                    log!("writing the drop log: {e}");
                    failing = true;
                }
                Err(_) => {}
                Ok(()) => failing = false,
            }
        }
    }
}

/// `cni-netpol drops [--follow]`.
pub fn drops_command(run_dir: &Path, follow: bool) -> Result<(), Error> {
    let mut out = io::stdout().lock();
    crate::drops::print(run_dir, follow, &mut out).map_err(|error| Error::RunDir { path: run_dir.to_path_buf(), error })
}

/// `cni-netpol explain FROM TO PORT/PROTO`: the flow judged on the view in force (the agent's `view.json`),
/// or on a cluster file (`--static`, with `--pod-cidr`).
pub fn explain_command(
    run_dir: &Path,
    file: Option<PathBuf>,
    pod_cidrs: Vec<IpNet>,
    flow: [&str; 3],
) -> Result<(), Error> {
    let view = match file {
        Some(path) => {
            let bytes = std::fs::read(&path).map_err(|error| Error::Read { path: path.clone(), error })?;
            let cluster = serde_json::from_slice(&bytes).map_err(|error| Error::Parse { path, error })?;
            View { pod_cidrs, cluster }
        }
        None => View::read(run_dir).map_err(|error| Error::RunDir { path: run_dir.join(VIEW_FILE), error })?,
    };
    let [from, to, port] = flow;
    let judgements = (|| {
        let (from, to, port) = (Endpoint::parse(from)?, Endpoint::parse(to)?, parse_port(port)?);
        explain(&view.cluster, &view.node(), &from, &to, port)
    })()
    .map_err(Error::Explain)?;
    for judgement in judgements {
        print!("{judgement}");
    }
    Ok(())
}
