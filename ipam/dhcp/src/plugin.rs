//! The IPAM plugin: validates its config, then asks the daemon, which holds the lease.

use crate::conf;
use crate::rpc::{self, Request, Unreachable};
use cnicore::spec::{CniResult, Context, Error, Result};

pub struct Dhcp;

fn request(ctx: &Context, method: &str) -> Result<Request> {
    let netns = match ctx.env.netns.as_deref() {
        Some(p) => std::path::absolute(p)
            .map_err(|e| Error::env(format!("failed to make {} an absolute path: {e}", p.display())))?
            .to_string_lossy()
            .into_owned(),
        None => String::new(),
    };
    Ok(Request {
        method: method.to_string(),
        container_id: ctx.env.container_id.clone(),
        netns,
        ifname: ctx.env.ifname.clone(),
        args: ctx.env.args_raw.clone(),
        stdin: String::from_utf8_lossy(&ctx.stdin).into_owned(),
    })
}

fn load(ctx: &Context) -> Result<conf::Conf> {
    conf::parse(&ctx.stdin, &ctx.env.args)
}

impl cnicore::spec::Plugin for Dhcp {
    fn add(&self, ctx: &Context) -> Result<CniResult> {
        let conf = load(ctx)?;
        // The daemon opens it too; a missing netns is the runtime's error (code 3), told before asking.
        ctx.open_netns()?;
        let result = rpc::call(&conf.socket_path, &request(ctx, "DHCP.Allocate")?)
            .map_err(|e| e.unwrap_or_else(|Unreachable(e)| e))?
            .ok_or_else(|| Error::internal("the DHCP daemon answered DHCP.Allocate without a result"))?;
        CniResult::from_json(&result)
    }

    /// Tolerates a daemon that is not running: there is then no lease to release, and a DEL that fails would
    /// keep the pod's sandbox from going away.
    fn del(&self, ctx: &Context) -> Result<()> {
        let conf = ctx.load_for_teardown(load)?;
        match rpc::call(&conf.socket_path, &request(ctx, "DHCP.Release")?) {
            Ok(_) => Ok(()),
            Err(Err(Unreachable(e))) => {
                cnicore::warn!("{}: nothing released", e.msg);
                Ok(())
            }
            Err(Ok(e)) => Err(e),
        }
    }

    fn check(&self, ctx: &Context) -> Result<()> {
        let conf = load(ctx)?;
        ctx.open_netns()?;
        rpc::call(&conf.socket_path, &request(ctx, "DHCP.Check")?).map_err(|e| e.unwrap_or_else(|Unreachable(e)| e))?;
        Ok(())
    }
}
