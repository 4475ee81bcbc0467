//! `flannel`: flannel's CNI meta-plugin (flannel-io/cni-plugin), so that conflists whose first plugin is
//! `"type": "flannel"` keep working on these binaries unchanged.
//!
//! ADD reads the node agent's `subnet.env` (`subnetFile`, default `/run/flannel/subnet.env`; IPv4, IPv6 or
//! both), completes the `delegate` config ([`delegate`]: type `bridge`; `name`, `ipMasq` = !FLANNEL_IPMASQ,
//! `mtu` = FLANNEL_MTU, `isGateway` for a bridge, `cniVersion`, an `ipam` of host-local with one range per
//! family the node has a subnet of and routes to the cluster networks of both families, `runtimeConfig`),
//! saves it as `<dataDir>/<containerID>` (default `/var/lib/cni/flannel`) and runs the delegate's ADD with
//! it. DEL runs the delegate's DEL with the saved config and removes the file; nothing saved is success.
//! CHECK succeeds, as flannel's does. GC (a no-op in flannel's) runs the delegate's GC with the config ADD
//! would build and forgets the saved configs of this network's containers that are not valid any more.
//!
//! Stricter than flannel where its input is hostile: `dataDir` and `subnetFile` are absolute paths without
//! `..`; `subnet.env` is a regular file of at most 64 KiB whose families are whole (a subnet with its
//! network, inside it); `runtimeConfig` is an object; `ipam.routes` are routes; a `prevResult` is read as
//! every plugin reads it; everything is checked, and the pod's netns opened, before the config is saved.
//!
//! Modules: [`conf`] (the plugin's config and files) and [`delegate`].

use std::io::Read;
use std::path::{Path, PathBuf};

use cnicore::spec::ipam::{exec_plugin, find_plugin};
use cnicore::spec::{io_error, plugin_main, CniResult, Command, Context, Error, Plugin, Result};
use cnicore::subnet_env::SubnetEnv;
use conf::Conf;
use delegate::delegate_conf;
use serde_json::{Map, Value};

mod conf;
mod delegate;

/// The node agent writes a few hundred bytes; more is not a subnet.env.
const MAX_SUBNET_FILE: u64 = 64 * 1024;

/// The node agent's `subnet.env`, complete and coherent (flannel's message prefix on every failure).
fn load_subnet_env(path: &Path) -> Result<SubnetEnv> {
    read_subnet_env(path).map_err(|e| e.within("failed to load flannel 'subnet.env' file"))
}

fn read_subnet_env(path: &Path) -> Result<SubnetEnv> {
    let shown = path.display();
    // A regular file only: a FIFO would block the plugin forever, a device such as /dev/zero never end.
    if !std::fs::metadata(path).map_err(io_error(format_args!("open {shown}")))?.is_file() {
        return Err(Error::io(format!("{shown} is not a regular file")));
    }
    let mut bytes = Vec::new();
    let file = std::fs::File::open(path).map_err(io_error(format_args!("open {shown}")))?;
    file.take(MAX_SUBNET_FILE + 1).read_to_end(&mut bytes).map_err(io_error(format_args!("read {shown}")))?;
    if bytes.len() as u64 > MAX_SUBNET_FILE {
        return Err(Error::io(format!("{shown} is larger than {MAX_SUBNET_FILE} bytes")));
    }
    // As flannel's line scanner: bytes that are not text matter only in the values they spoil.
    let env = SubnetEnv::parse(&String::from_utf8_lossy(&bytes)).map_err(|e| e.within(&shown))?;
    let missing = env.missing();
    if !missing.is_empty() {
        return Err(Error::config(format!("{shown} is missing {}", missing.join(", "))));
    }
    env.check_families().map_err(|e| e.within(&shown))?;
    Ok(env)
}

fn scratch_path(ctx: &Context, conf: &Conf) -> Result<PathBuf> {
    cnicore::state::validate_path_component("container ID", &ctx.env.container_id)?;
    Ok(conf.data_dir()?.join(&ctx.env.container_id))
}

fn delegate_binary(ctx: &Context, delegate: &Map<String, Value>) -> Result<PathBuf> {
    let kind = delegate.get("type").and_then(Value::as_str).unwrap_or_default();
    find_plugin(kind, &ctx.env.path)
}

fn to_bytes(delegate: &Map<String, Value>) -> Result<Vec<u8>> {
    serde_json::to_vec(delegate).map_err(|e| Error::internal(format!("error serializing delegate netconf: {e}")))
}

/// The saved configs of `data_dir`, by container ID (a missing directory holds none).
fn saved_container_ids(data_dir: &Path) -> Result<Vec<String>> {
    let entries = match std::fs::read_dir(data_dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io_error(format_args!("listing {}", data_dir.display()))(e)),
    };
    let names = entries.flatten().filter(|e| e.file_type().is_ok_and(|t| t.is_file()));
    Ok(names.filter_map(|e| e.file_name().into_string().ok()).collect())
}

struct Flannel;

impl Plugin for Flannel {
    fn add(&self, ctx: &Context) -> Result<CniResult> {
        let conf: Conf = ctx.parse_conf()?;
        let path = scratch_path(ctx, &conf)?;
        // flannel is the first plugin of its chain and does not use a prevResult, but one it cannot read is
        // refused as every plugin refuses it, not passed over.
        ctx.prev_result()?;
        let env = load_subnet_env(conf.subnet_file()?)?;
        let delegate = delegate_conf(&conf, &env)?;
        let binary = delegate_binary(ctx, &delegate)?;
        let bytes = to_bytes(&delegate)?;
        // The delegate would refuse a pod netns that is not there, after the config below is saved.
        ctx.open_netns()?;
        // Saved first, so that DEL can undo even an ADD that failed half-way.
        let data_dir = conf.data_dir()?;
        cnicore::state::ensure_dir(data_dir, 0o700).map_err(io_error(data_dir.display()))?;
        cnicore::state::write_atomic(&path, &bytes, 0o600).map_err(io_error(path.display()))?;
        let answer = exec_plugin(&binary, Command::Add, ctx, &bytes)
            .map_err(|e| e.within("failed to delegate add"))?
            .ok_or_else(|| Error::decode(format!("delegate {} returned no result", binary.display())))?;
        CniResult::from_json(&answer)
    }

    fn del(&self, ctx: &Context) -> Result<()> {
        let conf: Conf = ctx.load_for_teardown(Context::parse_conf)?;
        let path = scratch_path(ctx, &conf)?;
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            // Nothing saved: nothing to undo (the spec's DEL of what is already gone).
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(io_error(format_args!("reading {}", path.display()))(e)),
        };
        let Ok(Value::Object(saved)) = serde_json::from_slice::<Value>(&bytes) else {
            // As flannel: an unreadable saved config leaves the interface to be removed with the pod.
            cnicore::warn!("failed to parse netconf saved in {}: nothing to delegate", path.display());
            return Ok(());
        };
        let binary = delegate_binary(ctx, &saved)?;
        exec_plugin(&binary, Command::Del, ctx, &bytes).map_err(|e| e.within("failed to delegate del"))?;
        // Removed only once the delegate succeeded, so that a retried DEL can still undo.
        remove_saved(&path);
        Ok(())
    }

    fn check(&self, _ctx: &Context) -> Result<()> {
        Ok(())
    }

    /// flannel's own plugin does nothing on GC; ours passes it to the delegate, completed as for ADD (bridge
    /// and host-local then release what the runtime no longer knows), then forgets the saved configs of
    /// containers that are not among the valid attachments. A failed delegate GC keeps them (they are only
    /// bookkeeping, and the next GC comes back to them): a GC that fails changes nothing of ours.
    fn gc(&self, ctx: &Context) -> Result<()> {
        let conf: Conf = ctx.parse_conf()?;
        let Some(valid) = ctx.gc_attachments()? else { return Ok(()) };
        let data_dir = conf.data_dir()?;
        delegate_gc(ctx, &conf)?;
        forget_stale_configs(data_dir, &conf.name, &valid)
    }
}

/// The delegate's GC with the config ADD would build today and the runtime's lists of valid attachments.
fn delegate_gc(ctx: &Context, conf: &Conf) -> Result<()> {
    let env = load_subnet_env(conf.subnet_file()?)?;
    let mut delegate = delegate_conf(conf, &env)?;
    let request: Map<String, Value> = serde_json::from_slice(&ctx.stdin).unwrap_or_default();
    for key in ["cni.dev/valid-attachments", "cni.dev/attachments"] {
        if let Some(list) = request.get(key) {
            delegate.insert(key.into(), list.clone());
        }
    }
    let binary = delegate_binary(ctx, &delegate)?;
    exec_plugin(&binary, Command::Gc, ctx, &to_bytes(&delegate)?).map_err(|e| e.within("failed to delegate gc"))?;
    Ok(())
}

/// Removes the saved configs of the network `name` in `data_dir` whose containers have no valid attachment.
fn forget_stale_configs(data_dir: &Path, name: &str, valid: &[(String, String)]) -> Result<()> {
    for container_id in saved_container_ids(data_dir)? {
        let path = data_dir.join(&container_id);
        if !valid.iter().any(|(id, _)| *id == container_id) && saved_for_network(&path, name) {
            remove_saved(&path);
        }
    }
    Ok(())
}

/// Whether `path` holds a config this plugin saved for the network `name` (a `dataDir` may be shared, or
/// hold what is not ours).
fn saved_for_network(path: &Path, name: &str) -> bool {
    let Ok(bytes) = std::fs::read(path) else { return false };
    let Ok(Value::Object(saved)) = serde_json::from_slice::<Value>(&bytes) else { return false };
    saved.get("name").and_then(Value::as_str) == Some(name) && saved.get("type").is_some_and(Value::is_string)
}

/// Forgets a saved config; one that cannot be removed is only stale bookkeeping, so a warning.
fn remove_saved(path: &Path) {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            cnicore::warn!("removing the saved config {}: {e}", path.display())
        }
        _ => {}
    }
}

fn main() {
    plugin_main(concat!("CNI flannel plugin (cnicore) v", env!("CARGO_PKG_VERSION")), &Flannel)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_file(name: &str, text: &str) -> (PathBuf, PathBuf) {
        let dir = std::env::temp_dir().join(format!("flannel-test-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("subnet.env");
        std::fs::write(&path, text).unwrap();
        (dir, path)
    }

    #[test]
    fn missing_variables_are_named() {
        let (dir, path) = temp_file("missing", "FLANNEL_NETWORK=10.244.0.0/16\n");
        let e = load_subnet_env(&path).unwrap_err();
        assert_eq!(e.code, cnicore::spec::codes::INVALID_CONFIG);
        assert!(
            e.msg.contains("is missing FLANNEL_SUBNET, FLANNEL_IPV6_SUBNET, FLANNEL_MTU, FLANNEL_IPMASQ"),
            "{}",
            e.msg
        );
        assert!(e.msg.starts_with("failed to load flannel 'subnet.env' file: "), "{}", e.msg);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn subnet_env_errors_name_the_file_and_the_variable() {
        let (dir, path) = temp_file(
            "outside",
            "FLANNEL_IPV6_NETWORK=fd66::/56\nFLANNEL_IPV6_SUBNET=fd67::1/64\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n",
        );
        let e = load_subnet_env(&path).unwrap_err();
        assert_eq!(e.code, cnicore::spec::codes::INVALID_CONFIG);
        let says =
            format!("{}: FLANNEL_IPV6_SUBNET=fd67::1/64 is not inside FLANNEL_IPV6_NETWORK=fd66::/56", path.display());
        assert!(e.msg.ends_with(&says), "{}", e.msg);
        let e = load_subnet_env(&dir.join("absent.env")).unwrap_err();
        assert_eq!(e.code, cnicore::spec::codes::IO);
        assert!(e.msg.contains("absent.env: No such file"), "{}", e.msg);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
