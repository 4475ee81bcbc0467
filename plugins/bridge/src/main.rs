//! The bridge plugin: pods on a Linux bridge through veth pairs, with the bridge as their gateway and
//! optional masquerading (kubenet's `cbr0`). See README.md for the options and the MTU rule.
//!
//! Every verb follows config → validate (nothing touched yet) → plan → apply, and ADD keeps an undo list
//! so that a failure leaves nothing behind.
//!
//! Modules: [`config`] (parsed and validated), [`add`], [`check`] and [`del`] (the verbs), [`node`] (the bridge,
//! its ports, gateway addresses and sysctls), [`mtu`] (kubenet's inference), [`spoofchk`] (`macspoofchk`).

mod add;
mod check;
mod config;
mod del;

mod mtu;
mod node;
mod spoofchk;

use cnicore::firewall::masq;
use cnicore::spec::{ipam, plugin_main, CniResult, Command, Context, Errors, Plugin, Result};

struct Bridge;

impl Plugin for Bridge {
    fn add(&self, ctx: &Context) -> Result<CniResult> {
        add::add(ctx)
    }

    fn del(&self, ctx: &Context) -> Result<()> {
        del::del(ctx)
    }

    fn check(&self, ctx: &Context) -> Result<()> {
        check::check(ctx)
    }

    /// GC goes to IPAM (stale leases) and to the masquerade rules of attachments that are not valid any more.
    fn gc(&self, ctx: &Context) -> Result<()> {
        let conf = config::Config::load(ctx)?;
        let mut errors = Errors::new();
        errors.record(ipam::exec_if(conf.layer3, ctx, Command::Gc));
        if conf.ip_masq {
            errors.record(masq::gc_with_reference(&conf.network, &ctx.valid_attachments()?));
        }
        errors.into_result()
    }

    fn status(&self, ctx: &Context) -> Result<()> {
        ipam::exec_if(config::Config::load(ctx)?.layer3, ctx, Command::Status)
    }
}

fn main() {
    plugin_main("CNI bridge plugin (cni-plugins-rs)", &Bridge)
}
