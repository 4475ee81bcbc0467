//! `dhcp`: the DHCP IPAM plugin and, as `dhcp daemon [flags]`, the daemon that acquires, renews and releases
//! the leases (one binary, as the reference).
//!
//! Modules: [`plugin`] (the IPAM verbs, asking the daemon) with [`conf`] (its config and the options it
//! turns into) and [`rpc`] (Go's `net/rpc` over the daemon's socket, in [`gob`]); [`daemon`] (`dhcp daemon`'s
//! flags and socket) keeping each [`lease`] in its own thread, whose exchanges are [`client`]'s, its messages
//! [`packet`]'s and its renewal times [`timing`]'s; [`log`] (the daemon's log in Go's format).

mod client;
mod conf;
mod daemon;
mod gob;
mod lease;
mod log;
mod packet;
mod plugin;
mod rpc;
mod timing;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("daemon") {
        daemon::main(&args[2..]);
    }
    cnicore::spec::plugin_main("CNI dhcp plugin (Rust)", &plugin::Dhcp)
}
