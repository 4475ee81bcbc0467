//! `static`: IPAM that hands out the addresses, routes and DNS written in the config (or given by the runtime
//! through `CNI_ARGS`, `args.cni.ips` or the `ips` capability). Nothing is allocated, so DEL has nothing to do.
//!
//! [`config`]: the addresses, routes and DNS, from the reference's sources in its precedence.

mod config;

use cnicore::spec::{plugin_main, CniResult, Context, Error, IpConfig, Plugin, Result};

struct Static;

impl Plugin for Static {
    fn add(&self, ctx: &Context) -> Result<CniResult> {
        let conf = config::load(ctx)?;
        Ok(CniResult {
            interfaces: vec![],
            ips: conf
                .addresses
                .iter()
                .map(|a| IpConfig { address: a.address, gateway: a.gateway, interface: None })
                .collect(),
            routes: conf.routes,
            dns: conf.dns,
        })
    }

    fn del(&self, _ctx: &Context) -> Result<()> {
        // No allocation to release; a DEL with a broken config must still succeed, as the reference's does.
        Ok(())
    }

    fn check(&self, ctx: &Context) -> Result<()> {
        let conf = config::load(ctx)?;
        let prev = ctx.prev_result()?.ok_or_else(|| Error::config("Required prevResult missing"))?;
        for want in &conf.addresses {
            let Some(found) = prev.ips.iter().find(|ip| ip.address.addr() == want.address.addr()) else {
                // The reference passes a configured address missing from the result; it is drift all the same.
                return Err(Error::internal(format!(
                    "static: address {} is not in the result for interface {:?}",
                    want.address, ctx.env.ifname
                )));
            };
            if want.gateway.is_some() && want.gateway != found.gateway {
                return Err(Error::internal(format!(
                    "static: Failed to match addr {} on interface {}",
                    found.address.addr(),
                    ctx.env.ifname
                )));
            }
        }
        Ok(())
    }
}

fn main() {
    plugin_main(concat!("CNI static IPAM plugin (cnicore) v", env!("CARGO_PKG_VERSION")), &Static)
}
