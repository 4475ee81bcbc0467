//! fabricd: the node agent that joins every node's pods into one flat network (flannel's job, on flannel's
//! etcd layout and flags). See the README of this crate for the design. The modules, from the command line
//! down to the kernel:
//!
//! - [`cli`]: flanneld's flags with their meaning, and fabricd's own; [`commands`]: `status`, `cleanup` and
//!   the hidden `acquire`.
//! - [`agent`]: the loop that waits for a trigger, reconciles the data plane and reports; [`metrics`]: its
//!   counters served on a local address; [`log`]: one line per event on stderr.
//! - [`source`]: where the node's subnet and its peers come from (etcd, Kubernetes Nodes, a static file),
//!   published as one cluster value; [`flannel`]: flannel's config and lease formats, byte for byte.
//! - [`plan`]: for each peer's lease, whether it is used and how its pods are reached (pure); [`path`]: that
//!   decision as data, and why a lease is refused.
//! - [`backend`]: host-gw, vxlan, ipip and wireguard behind one trait, chosen from its registry.
//! - [`dataplane`]: what the node should hold and holds, and the difference applied over netlink;
//!   [`node`]: forwarding sysctls, masquerade, the CNI conflist and `subnet.env`; [`underlay`]: the interface
//!   between nodes and the marks of fabricd's kernel objects.
//! - [`family`]: IPv4 and IPv6 (cnicore's family); [`error`]: fabricd's errors, classified by kind.

mod agent;
mod backend;
mod cli;
mod commands;
mod dataplane;
mod error;
mod family;
mod flannel;
mod log;
mod metrics;
mod node;
mod path;
mod plan;
mod source;
mod underlay;

use clap::Parser;

use cli::{go_style_args, Cli, Command};
use log::log;

fn main() {
    let cli = Cli::parse_from(go_style_args());
    if cli.version {
        // flanneld prints its version on stderr.
        eprintln!("v{} (fabricd, flanneld v0.28's flags)", env!("CARGO_PKG_VERSION"));
        std::process::exit(0);
    }
    if let Err(e) = cli.refused.check() {
        log!(error, "{e}");
        std::process::exit(1);
    }
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("tokio runtime");
    let code = runtime.block_on(async move {
        let command = if cli.cleanup { Some(Command::Cleanup) } else { cli.command.clone() };
        let result = match command {
            Some(Command::Cleanup) => commands::cleanup(&cli).await,
            Some(Command::Status) => commands::status(&cli).await,
            Some(Command::Acquire) => commands::acquire(&cli).await,
            None => agent::run(cli).await,
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
