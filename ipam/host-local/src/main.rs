//! `host-local`: IP address management from ranges on the local node, with leases stored as files in the
//! reference plugin's layout so that either implementation can take over the other's node.
//!
//! Modules: [`ops`] (the verbs) on [`config`] (the parsed, validated config, [`dns`] its `resolvConf`),
//! [`range`] (ranges and their round-robin order) and [`store`] (the lease files in the reference's layout,
//! each read by [`lease`], found by owner through [`index`]).

mod config;
mod dns;
mod index;
mod lease;
mod ops;
mod range;
mod store;

use cnicore::spec::{plugin_main, Verbs};

fn main() {
    plugin_main(
        "CNI host-local plugin (Rust)",
        &Verbs::new(ops::add, ops::del, ops::check).gc(ops::gc).status(ops::status),
    )
}
