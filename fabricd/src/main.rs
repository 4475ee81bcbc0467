//! fabricd: the node agent that joins every node's pods into one flat network (flannel's job, on flannel's
//! etcd layout and flags). See the README of this crate for the design.

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
