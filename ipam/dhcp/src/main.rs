//! `dhcp`: the DHCP IPAM plugin and, as `dhcp daemon [flags]`, the daemon that acquires, renews and releases
//! the leases (one binary, as the reference).

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
