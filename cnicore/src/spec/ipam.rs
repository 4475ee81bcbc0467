//! Delegation to an IPAM plugin (or any delegate) found on `CNI_PATH`: same environment, same stdin.

use super::config::validate_plugin_type;
use super::env::Command;
use super::error::{codes, Error, Result};
use super::result::CniResult;
use super::skel::Context;
use serde_json::Value;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command as Process, Stdio};

/// Finds a plugin binary by name in the given directories.
pub fn find_plugin(name: &str, path: &[PathBuf]) -> Result<PathBuf> {
    validate_plugin_type(name)?;
    path.iter()
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
        .ok_or_else(|| Error::config(format!("failed to find plugin {name:?} in path {path:?}")))
}

/// Runs `plugin` with `command`, the caller's environment and `stdin`; returns its stdout JSON, if any.
pub fn exec_plugin(binary: &Path, command: Command, ctx: &Context, stdin: &[u8]) -> Result<Option<Value>> {
    let mut p = Process::new(binary);
    p.env("CNI_COMMAND", command.as_str())
        .env("CNI_CONTAINERID", &ctx.env.container_id)
        .env("CNI_IFNAME", &ctx.env.ifname)
        .env("CNI_ARGS", &ctx.env.args_raw)
        .env("CNI_PATH", std::env::join_paths(&ctx.env.path).unwrap_or_default())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    match &ctx.env.netns {
        Some(ns) => p.env("CNI_NETNS", ns),
        None => p.env_remove("CNI_NETNS"),
    };
    run_with_stdin(p, binary, stdin)
}

/// Spawns, feeds stdin, and decodes stdout: a result/answer on success, the plugin's error object on failure.
pub fn run_with_stdin(mut p: Process, binary: &Path, stdin: &[u8]) -> Result<Option<Value>> {
    let name = binary.display();
    let mut child = p.spawn().map_err(|e| Error::io(format!("failed to run plugin {name}: {e}")))?;
    if let Some(mut input) = child.stdin.take() {
        // A plugin may exit without reading stdin; a broken pipe is then not our error.
        let _ = input.write_all(stdin);
    }
    let out = child.wait_with_output().map_err(|e| Error::io(format!("failed to wait for plugin {name}: {e}")))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let json: Option<Value> = if text.trim().is_empty() { None } else { serde_json::from_str(text.trim()).ok() };
    if out.status.success() {
        if json.is_none() && !text.trim().is_empty() {
            return Err(Error::decode(format!(
                "plugin {name} printed something that is not JSON: {:.200}",
                text.trim()
            )));
        }
        return Ok(json);
    }
    Err(json.as_ref().and_then(Error::from_json).unwrap_or_else(|| {
        Error::new(codes::INTERNAL, format!("plugin {name} failed ({}): {:.200}", out.status, text.trim()))
    }))
}

fn ipam_binary(ctx: &Context) -> Result<PathBuf> {
    find_plugin(ctx.conf.ipam_type()?, &ctx.env.path)
}

/// IPAM ADD: the delegate's result, in canonical form.
pub fn add(ctx: &Context) -> Result<CniResult> {
    let bin = ipam_binary(ctx)?;
    let out = exec_plugin(&bin, Command::Add, ctx, &ctx.stdin)?
        .ok_or_else(|| Error::decode(format!("IPAM plugin {} returned no result", bin.display())))?;
    CniResult::from_json(&out)
}

/// IPAM ADD within a plugin's ADD: the lease, released by `undo` when a later step fails. An answer without
/// addresses is refused (after the release is registered), as the reference does.
pub fn add_undoable<'a>(ctx: &'a Context, undo: &mut crate::undo::Undo<'a>) -> Result<CniResult> {
    let lease = add(ctx)?;
    undo.push("release the IPAM lease", move || exec(ctx, Command::Del));
    if lease.ips.is_empty() {
        return Err(Error::internal("IPAM plugin returned missing IP config"));
    }
    Ok(lease)
}

/// IPAM with a verb that returns nothing (DEL, CHECK, GC, STATUS).
pub fn exec(ctx: &Context, command: Command) -> Result<()> {
    let bin = ipam_binary(ctx)?;
    exec_plugin(&bin, command, ctx, &ctx.stdin).map(|_| ())
}

/// IPAM plugins that keep their state on the node and need nothing of the pod's interface to release an
/// address. Any other runs its DEL before the interface is deleted, as the reference orders DEL: dhcp sends
/// its DHCPRELEASE through the interface, and a plugin we do not know may need it too.
const RELEASE_WITHOUT_INTERFACE: &[&str] = &["host-local", "static"];

/// One step of a DEL, run on a thread of its own.
pub type TeardownStep<'a> = Box<dyn FnOnce() -> Result<()> + Send + 'a>;

/// Runs a DEL's teardown: IPAM's DEL (when `ipam`), the deletion of the pod's interface (`interface`) and the
/// steps that need neither (`others`: firewall rules...), all at the same time, since they mostly wait (for the
/// kernel, for processes); except that the interface is deleted only after IPAM's DEL has returned, unless the
/// IPAM plugin is one that releases without it. Returns every step's outcome.
pub fn teardown<'a>(
    ctx: &'a Context,
    ipam: bool,
    interface: Option<TeardownStep<'a>>,
    others: Vec<TeardownStep<'a>>,
) -> Vec<Result<()>> {
    let interface_waits =
        ipam && !matches!(ctx.conf.ipam_type_if_any(), Ok(Some(t)) if RELEASE_WITHOUT_INTERFACE.contains(&t));
    std::thread::scope(|s| {
        let mut workers: Vec<_> = others.into_iter().map(|step| s.spawn(step)).collect();
        let mut outcomes = Vec::new();
        if interface_waits {
            outcomes.push(exec(ctx, Command::Del));
        }
        workers.extend(interface.map(|step| s.spawn(step)));
        if ipam && !interface_waits {
            outcomes.push(exec(ctx, Command::Del));
        }
        let joined =
            workers.into_iter().map(|w| w.join().unwrap_or_else(|_| Err(Error::internal("a worker thread panicked"))));
        outcomes.extend(joined);
        outcomes
    })
}

/// [`exec`] when the plugin's config has an IPAM section (`configured`), nothing otherwise: how the interface
/// plugins with optional IPAM pass CHECK, GC and STATUS on.
pub fn exec_if(configured: bool, ctx: &Context, command: Command) -> Result<()> {
    if configured {
        exec(ctx, command)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exec_if_runs_nothing_without_ipam() {
        // No IPAM plugin anywhere on CNI_PATH: only a call that is made can fail.
        let ctx = Context::for_test(Command::Gc, r#"{"cniVersion":"1.1.0","name":"n","ipam":{"type":"none"}}"#, "");
        assert!(exec_if(false, &ctx, Command::Gc).is_ok());
        assert!(exec_if(true, &ctx, Command::Gc).unwrap_err().msg.contains("none"));
    }
}
