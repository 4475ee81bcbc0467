//! `host-local`: IP address management from ranges on the local node, with leases stored as files in the
//! reference plugin's layout so that either implementation can take over the other's node.

mod config;
mod dns;
mod index;
mod lease;
mod ops;
mod range;
mod store;

use cnicore::spec::{plugin_main, CniResult, Context, Plugin, Result};

struct HostLocal;

impl Plugin for HostLocal {
    fn add(&self, ctx: &Context) -> Result<CniResult> {
        ops::add(ctx)
    }
    fn del(&self, ctx: &Context) -> Result<()> {
        ops::del(ctx)
    }
    fn check(&self, ctx: &Context) -> Result<()> {
        ops::check(ctx)
    }
    fn gc(&self, ctx: &Context) -> Result<()> {
        ops::gc(ctx)
    }
    fn status(&self, ctx: &Context) -> Result<()> {
        ops::status(ctx)
    }
}

fn main() {
    plugin_main("CNI host-local plugin (Rust)", &HostLocal)
}
