//! `cnitool`: runs a network config list against a network namespace, as upstream cnitool does.
//!
//! Environment: `NETCONFPATH` (default /etc/cni/net.d), `CNI_PATH`, `CAP_ARGS` (JSON), `CNI_ARGS`, `CNI_IFNAME`
//! (default eth0), and `CNI_CACHE_DIR` (default /var/lib/cni; ours: lets tests keep the cache in a temp dir).

use clap::{Parser, Subcommand};
use cnitool::libcni::{load_conf_list, parse_args, CniConfig, RunError, RuntimeConf, DEFAULT_CACHE_DIR};
use sha2::{Digest, Sha512};
use std::path::{Component, Path, PathBuf};
use std::process::ExitCode;

#[derive(Parser)]
#[command(name = "cnitool", about = "Add, check, or remove network interfaces from a network namespace", version)]
struct Cli {
    #[command(subcommand)]
    command: Verb,
}

#[derive(Subcommand)]
enum Verb {
    /// Attach the netns to the network.
    Add { net: String, netns: PathBuf },
    /// Check the attachment against the cached result.
    Check { net: String, netns: PathBuf },
    /// Detach the netns from the network.
    Del { net: String, netns: PathBuf },
    /// Remove every cached attachment not listed as valid, then send GC to every plugin.
    Gc {
        net: String,
        /// An attachment to keep, as CONTAINERID:IFNAME (repeatable). Without any, every attachment is removed.
        #[arg(long = "valid", value_name = "CONTAINERID:IFNAME")]
        valid: Vec<String>,
    },
    /// Ask every plugin whether it is ready to add attachments.
    Status { net: String },
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).ok().filter(|v| !v.is_empty()).unwrap_or_else(|| default.to_string())
}

fn run(cli: Cli) -> Result<(), RunError> {
    let netdir = PathBuf::from(env_or("NETCONFPATH", "/etc/cni/net.d"));
    let cni = CniConfig {
        path: std::env::split_paths(&std::env::var_os("CNI_PATH").unwrap_or_default()).collect(),
        cache_dir: PathBuf::from(env_or("CNI_CACHE_DIR", DEFAULT_CACHE_DIR)),
    };
    let runtime = |netns: &Path| -> Result<RuntimeConf, RunError> {
        let netns = absolute(netns)?;
        let digest = Sha512::digest(netns.as_os_str().as_encoded_bytes());
        let hex: String = digest[..10].iter().map(|b| format!("{b:02x}")).collect();
        let capability_args = match std::env::var("CAP_ARGS") {
            Ok(v) if !v.is_empty() => {
                serde_json::from_str(&v).map_err(|e| RunError { msg: format!("CAP_ARGS: {e}"), plugin_error: None })?
            }
            _ => Default::default(),
        };
        let args = match std::env::var("CNI_ARGS") {
            Ok(v) if !v.is_empty() => parse_args(&v)?,
            _ => Vec::new(),
        };
        Ok(RuntimeConf {
            container_id: format!("cnitool-{hex}"),
            netns: netns.display().to_string(),
            ifname: std::env::var("CNI_IFNAME").unwrap_or_else(|_| "eth0".into()),
            args,
            capability_args,
        })
    };
    match cli.command {
        Verb::Add { net, netns } => {
            let result = cni.add_network_list(&load_conf_list(&netdir, &net)?, &runtime(&netns)?)?;
            println!("{}", serde_json::to_string_pretty(&result).unwrap_or_default());
            Ok(())
        }
        Verb::Check { net, netns } => cni.check_network_list(&load_conf_list(&netdir, &net)?, &runtime(&netns)?),
        Verb::Del { net, netns } => cni.del_network_list(&load_conf_list(&netdir, &net)?, &runtime(&netns)?),
        Verb::Gc { net, valid } => {
            let valid = valid
                .iter()
                .map(|v| match v.split_once(':') {
                    Some((c, i)) if !c.is_empty() && !i.is_empty() => Ok((c.to_string(), i.to_string())),
                    _ => {
                        Err(RunError { msg: format!("--valid {v:?}: expected CONTAINERID:IFNAME"), plugin_error: None })
                    }
                })
                .collect::<Result<Vec<_>, _>>()?;
            cni.gc_network_list(&load_conf_list(&netdir, &net)?, &valid)
        }
        Verb::Status { net } => cni.status_network_list(&load_conf_list(&netdir, &net)?),
    }
}

/// Go's `filepath.Abs`: joined with the working directory when relative, then cleaned lexically, so the
/// container ID derived from it matches upstream cnitool's.
fn absolute(p: &Path) -> Result<PathBuf, RunError> {
    let joined = if p.is_absolute() {
        p.to_path_buf()
    } else {
        std::env::current_dir()
            .map_err(|e| RunError { msg: format!("working directory: {e}"), plugin_error: None })?
            .join(p)
    };
    let mut out = PathBuf::from("/");
    for c in joined.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(n) => out.push(n),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    Ok(out)
}
