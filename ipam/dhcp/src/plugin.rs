//! The IPAM plugin: validates its config, then asks the daemon (ours or the reference's), which holds the
//! lease.

use crate::conf;
use crate::rpc::{self, CallError, Request, Unreachable};
use cnicore::spec::{codes, CniResult, Context, Error, Result};

pub struct Dhcp;

fn request(ctx: &Context, method: &str) -> Result<Request> {
    let netns = match ctx.env.netns.as_deref() {
        Some(p) => std::path::absolute(p)
            .map_err(|e| Error::env(format!("failed to make {} an absolute path: {e}", p.display())))?
            .to_string_lossy()
            .into_owned(),
        None => String::new(),
    };
    let path: Vec<String> = ctx.env.path.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    Ok(Request {
        method: method.to_string(),
        container_id: ctx.env.container_id.clone(),
        netns,
        ifname: ctx.env.ifname.clone(),
        args: ctx.env.args_raw.clone(),
        path: path.join(":"),
        stdin: ctx.stdin.clone(),
    })
}

fn load(ctx: &Context) -> Result<conf::Conf> {
    conf::parse(&ctx.stdin, &ctx.env.args)
}

fn flatten(e: CallError) -> Error {
    e.unwrap_or_else(|Unreachable(e)| e)
}

impl cnicore::spec::Plugin for Dhcp {
    fn add(&self, ctx: &Context) -> Result<CniResult> {
        let conf = load(ctx)?;
        // The daemon opens it too; a missing netns is the runtime's error (code 3), told before asking.
        ctx.open_netns()?;
        rpc::call(&conf.socket_path, &request(ctx, "DHCP.Allocate")?)
            .map_err(flatten)?
            .ok_or_else(|| Error::internal("the DHCP daemon answered DHCP.Allocate without a result"))
    }

    /// Tolerates a daemon that is not running: there is then no lease to release, and a DEL that fails would
    /// keep the pod's sandbox from going away. Reads only the name and the socket path: options an ADD would
    /// refuse must not keep a lease from being released.
    fn del(&self, ctx: &Context) -> Result<()> {
        let (_, socket_path) = conf::for_release(&ctx.stdin)?;
        match rpc::call(&socket_path, &request(ctx, "DHCP.Release")?) {
            Ok(_) => Ok(()),
            Err(Err(Unreachable(e))) => {
                cnicore::warn!("{}: nothing released", e.msg);
                Ok(())
            }
            Err(Ok(e)) => Err(e),
        }
    }

    /// Asks our daemon to release the network's leases that no valid attachment has; a reference daemon has
    /// no such method (nor their plugin GC), and there nothing is done.
    fn gc(&self, ctx: &Context) -> Result<()> {
        let conf = load(ctx)?;
        let Some(valid) = ctx.gc_attachments()? else { return Ok(()) };
        let payload = crate::daemon::GcRequest { network: conf.name.clone(), valid };
        let mut req = request(ctx, "DHCP.GC")?;
        req.stdin = serde_json::to_vec(&payload).map_err(|e| Error::internal(e.to_string()))?;
        match rpc::call(&conf.socket_path, &req) {
            Ok(_) => Ok(()),
            Err(Ok(e)) if e.msg.contains("can't find method") => Ok(()),
            Err(Err(Unreachable(e))) => {
                cnicore::warn!("{}: nothing collected", e.msg);
                Ok(())
            }
            Err(Ok(e)) => Err(e),
        }
    }

    /// Ready when a daemon listens on the socket (the reference has no STATUS; without a daemon every ADD
    /// fails, which is what STATUS is for).
    fn status(&self, ctx: &Context) -> Result<()> {
        let conf = load(ctx)?;
        std::os::unix::net::UnixStream::connect(&conf.socket_path).map(drop).map_err(|e| {
            Error::new(codes::NOT_AVAILABLE, format!("the DHCP daemon at {} is not reachable: {e}", conf.socket_path))
        })
    }

    /// Ours answers `DHCP.Check` (is the lease held?); the reference's daemon has no such method, and its own
    /// plugin checks with `DHCP.Allocate`, which is asked then.
    fn check(&self, ctx: &Context) -> Result<()> {
        let conf = load(ctx)?;
        ctx.open_netns()?;
        match rpc::call(&conf.socket_path, &request(ctx, "DHCP.Check")?) {
            Err(Ok(e)) if e.msg.contains("can't find method") => {
                rpc::call(&conf.socket_path, &request(ctx, "DHCP.Allocate")?).map_err(flatten).map(drop)
            }
            other => other.map_err(flatten).map(drop),
        }
    }
}
