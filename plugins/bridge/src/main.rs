//! The bridge plugin: pods on a Linux bridge through veth pairs, with the bridge as their gateway and
//! optional masquerading (kubenet's `cbr0`). See README.md for the options and the MTU rule.
//!
//! Every verb follows config → validate (nothing touched yet) → plan → apply, and ADD keeps an undo list
//! so that a failure leaves nothing behind.

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
        if conf.layer3 {
            errors.record(ipam::exec(ctx, Command::Gc));
        }
        if conf.ip_masq {
            let valid = ctx.valid_attachments()?;
            errors.record(masq::gc(&conf.network, &valid));
            // Rules the reference bridge v1.6+ wrote with ipMasqBackend nftables (a node moved to ours).
            if cnicore::firewall::Backend::Nftables.available() {
                errors.record(cnicore::firewall::reference_nft::ipmasq_gc(&conf.network, &valid));
            }
        }
        errors.into_result()
    }

    fn status(&self, ctx: &Context) -> Result<()> {
        let conf = config::Config::load(ctx)?;
        if conf.layer3 {
            ipam::exec(ctx, Command::Status)?;
        }
        Ok(())
    }
}

fn main() {
    plugin_main("CNI bridge plugin (cni-plugins-rs)", &Bridge)
}
