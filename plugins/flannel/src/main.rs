//! `flannel`: flannel's CNI meta-plugin (flannel-io/cni-plugin), so that conflists whose first plugin is
//! `"type": "flannel"` keep working on these binaries unchanged.
//!
//! ADD reads the node agent's `subnet.env` (`subnetFile`, default `/run/flannel/subnet.env`), completes the
//! `delegate` config (type `bridge`; `name`, `ipMasq` = !FLANNEL_IPMASQ, `mtu` = FLANNEL_MTU, `isGateway` for
//! a bridge, `cniVersion`, an `ipam` of host-local over the node's subnet with routes to the cluster
//! networks, `runtimeConfig`), saves it as `<dataDir>/<containerID>` (default `/var/lib/cni/flannel`) and
//! runs the delegate's ADD with it. DEL runs the delegate's DEL with the saved config and removes the file;
//! nothing saved is success. CHECK succeeds, as flannel's does.
//!
//! Stricter than flannel where its input is hostile: `dataDir` and `subnetFile` are absolute paths without
//! `..`; `subnet.env` is a regular file of at most 64 KiB; `runtimeConfig` is an object; a `prevResult` is read
//! as every plugin reads it; everything is checked, and the pod's netns opened, before the config is saved.

use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use cnicore::spec::ipam::{exec_plugin, find_plugin};
use cnicore::spec::{plugin_main, truncate_for_msg, CniResult, Command, Context, Error, Plugin, Result};
use cnicore::subnet_env::SubnetEnv;
use serde::Deserialize;
use serde_json::{json, Map, Value};

const DEFAULT_SUBNET_FILE: &str = "/run/flannel/subnet.env";
const DEFAULT_DATA_DIR: &str = "/var/lib/cni/flannel";
/// The node agent writes a few hundred bytes; more is not a subnet.env.
const MAX_SUBNET_FILE: u64 = 64 * 1024;

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct Conf {
    #[serde(default)]
    name: String,
    #[serde(default)]
    cni_version: String,
    ipam: Option<Map<String, Value>>,
    subnet_file: Option<PathBuf>,
    data_dir: Option<PathBuf>,
    delegate: Option<Map<String, Value>>,
    runtime_config: Option<Map<String, Value>>,
}

impl Conf {
    fn data_dir(&self) -> Result<&Path> {
        configured_path("dataDir", self.data_dir.as_deref(), DEFAULT_DATA_DIR)
    }

    fn subnet_file(&self) -> Result<&Path> {
        configured_path("subnetFile", self.subnet_file.as_deref(), DEFAULT_SUBNET_FILE)
    }
}

/// `dataDir` or `subnetFile` (the default when absent or empty): an absolute path without `..`, so that what
/// is written and read does not depend on the runtime's working directory or climb out of the named place.
fn configured_path<'a>(what: &str, path: Option<&'a Path>, default: &'static str) -> Result<&'a Path> {
    let Some(path) = path.filter(|p| !p.as_os_str().is_empty()) else { return Ok(Path::new(default)) };
    let hostile = !path.is_absolute()
        || path.components().any(|c| c == Component::ParentDir)
        || path.as_os_str().as_bytes().contains(&0);
    if hostile {
        let shown = truncate_for_msg(&path.to_string_lossy());
        return Err(Error::config(format!("{what} must be an absolute path without '..' or NUL, got {shown:?}")));
    }
    Ok(path)
}

fn load_subnet_env(path: &Path) -> Result<SubnetEnv> {
    let failed = |e: std::io::Error| Error::io(format!("open {}: {e}", path.display()));
    // A regular file only: a FIFO would block the plugin forever, a device such as /dev/zero never end.
    if !std::fs::metadata(path).map_err(failed)?.is_file() {
        return Err(Error::io(format!("{} is not a regular file", path.display())));
    }
    let mut bytes = Vec::new();
    std::fs::File::open(path).map_err(failed)?.take(MAX_SUBNET_FILE + 1).read_to_end(&mut bytes).map_err(failed)?;
    if bytes.len() as u64 > MAX_SUBNET_FILE {
        return Err(Error::io(format!("{} is larger than {MAX_SUBNET_FILE} bytes", path.display())));
    }
    // As flannel's line scanner: bytes that are not text matter only in the values they spoil.
    let env = SubnetEnv::parse(&String::from_utf8_lossy(&bytes))
        .map_err(|e| Error::config(format!("{}: {e}", path.display())))?;
    let missing = env.missing();
    if !missing.is_empty() {
        return Err(Error::config(format!("{} is missing {}", path.display(), missing.join(", "))));
    }
    Ok(env)
}

/// The delegate's config, completed as flannel completes it.
fn delegate_conf(conf: &Conf, env: &SubnetEnv) -> Result<Map<String, Value>> {
    let mut delegate = conf.delegate.clone().unwrap_or_default();
    if delegate.get("type").is_some_and(|t| !t.is_string()) {
        return Err(Error::config("'delegate' dictionary, if present, must have (string) 'type' field"));
    }
    if delegate.contains_key("name") {
        return Err(Error::config("'delegate' dictionary must not have 'name' field, it'll be set by flannel"));
    }
    if delegate.contains_key("ipam") {
        return Err(Error::config("'delegate' dictionary must not have 'ipam' field, it'll be set by flannel"));
    }
    if let Some(runtime_config) = &conf.runtime_config {
        delegate.insert("runtimeConfig".into(), Value::Object(runtime_config.clone()));
    }
    delegate.insert("name".into(), json!(conf.name));
    delegate.entry("type").or_insert(json!("bridge"));
    delegate.entry("ipMasq").or_insert(json!(!env.ipmasq.unwrap_or(false)));
    delegate.entry("mtu").or_insert(json!(env.mtu));
    if delegate["type"] == "bridge" {
        delegate.entry("isGateway").or_insert(json!(true));
    }
    if !conf.cni_version.is_empty() {
        delegate.insert("cniVersion".into(), json!(conf.cni_version));
    }
    let mut ipam = conf.ipam.clone().unwrap_or_default();
    ipam.entry("type").or_insert(json!("host-local"));
    // The subnets as Go's net.ParseCIDR gives them: the network, not the node's first address.
    let ranges: Vec<Value> =
        [env.subnet.map(|s| s.trunc().to_string()), env.ipv6_subnet.map(|s| s.trunc().to_string())]
            .into_iter()
            .flatten()
            .map(|s| json!([{ "subnet": s }]))
            .collect();
    ipam.insert("ranges".into(), Value::Array(ranges));
    let mut routes = match ipam.get("routes") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(routes)) => routes.clone(),
        Some(_) => {
            return Err(Error::config(
                "failed to assemble Delegate IPAM: failed to read IPAM routes: ipam.routes must be a list",
            ))
        }
    };
    routes.extend(env.networks.iter().map(|n| json!({ "dst": n.to_string() })));
    routes.extend(env.ipv6_networks.iter().map(|n| json!({ "dst": n.to_string() })));
    ipam.insert("routes".into(), Value::Array(routes));
    delegate.insert("ipam".into(), Value::Object(ipam));
    Ok(delegate)
}

fn scratch_path(ctx: &Context, conf: &Conf) -> Result<PathBuf> {
    cnicore::state::validate_path_component("container ID", &ctx.env.container_id)?;
    Ok(conf.data_dir()?.join(&ctx.env.container_id))
}

fn delegate_binary(ctx: &Context, delegate: &Map<String, Value>) -> Result<PathBuf> {
    let kind = delegate.get("type").and_then(Value::as_str).unwrap_or_default();
    find_plugin(kind, &ctx.env.path)
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
        let bytes = serde_json::to_vec(&delegate)
            .map_err(|e| Error::internal(format!("error serializing delegate netconf: {e}")))?;
        // The delegate would refuse a pod netns that is not there, after the config below is saved.
        ctx.open_netns()?;
        // Saved first, so that DEL can undo even an ADD that failed half-way.
        let data_dir = conf.data_dir()?;
        cnicore::state::ensure_dir(data_dir, 0o700).map_err(|e| Error::io(format!("{}: {e}", data_dir.display())))?;
        cnicore::state::write_atomic(&path, &bytes, 0o600)
            .map_err(|e| Error::io(format!("{}: {e}", path.display())))?;
        let answer = exec_plugin(&binary, Command::Add, ctx, &bytes)
            .map_err(|e| Error::new(e.code, format!("failed to delegate add: {}", e.msg)))?
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
            Err(e) => return Err(Error::io(format!("{}: {e}", path.display()))),
        };
        let Ok(Value::Object(saved)) = serde_json::from_slice::<Value>(&bytes) else {
            // As flannel: an unreadable saved config leaves the interface to be removed with the pod.
            eprintln!("failed to parse netconf saved in {}", path.display());
            return Ok(());
        };
        let binary = delegate_binary(ctx, &saved)?;
        exec_plugin(&binary, Command::Del, ctx, &bytes)?;
        // Removed only once the delegate succeeded, so that a retried DEL can still undo.
        let _ = std::fs::remove_file(&path);
        Ok(())
    }

    fn check(&self, _ctx: &Context) -> Result<()> {
        Ok(())
    }
}

fn main() {
    plugin_main(concat!("CNI flannel plugin (cnicore) v", env!("CARGO_PKG_VERSION")), &Flannel)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env() -> SubnetEnv {
        SubnetEnv::parse(
            "FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.244.3.1/24\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n",
        )
        .unwrap()
    }

    fn conf(value: Value) -> Conf {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn completes_the_delegate_as_flannel_does() {
        let c = conf(json!({ "cniVersion": "0.3.1", "name": "cbr0", "type": "flannel",
                             "delegate": { "hairpinMode": true, "isDefaultGateway": true } }));
        let delegate = delegate_conf(&c, &env()).unwrap();
        assert_eq!(
            Value::Object(delegate),
            json!({
                "cniVersion": "0.3.1", "name": "cbr0", "type": "bridge", "hairpinMode": true, "isDefaultGateway": true,
                "ipMasq": false, "mtu": 1450, "isGateway": true,
                "ipam": { "type": "host-local", "ranges": [[{ "subnet": "10.244.3.0/24" }]], "routes": [{ "dst": "10.244.0.0/16" }] }
            })
        );
    }

    #[test]
    fn explicit_values_win_and_bad_delegates_are_refused() {
        let c = conf(json!({ "name": "n", "delegate": { "type": "ipvlan", "mtu": 1300, "ipMasq": true },
                             "ipam": { "routes": [{ "dst": "0.0.0.0/0" }] }, "runtimeConfig": { "portMappings": [] } }));
        let delegate = delegate_conf(&c, &env()).unwrap();
        assert_eq!((delegate["mtu"].clone(), delegate["ipMasq"].clone()), (json!(1300), json!(true)));
        assert!(!delegate.contains_key("isGateway") && !delegate.contains_key("cniVersion"));
        assert_eq!(delegate["ipam"]["routes"], json!([{ "dst": "0.0.0.0/0" }, { "dst": "10.244.0.0/16" }]));
        assert_eq!(delegate["runtimeConfig"], json!({ "portMappings": [] }));
        for (bad, says) in [
            (json!({ "name": "x" }), "must not have 'name'"),
            (json!({ "ipam": {} }), "must not have 'ipam'"),
            (json!({ "type": 3 }), "(string) 'type'"),
        ] {
            let c = conf(json!({ "name": "n", "delegate": bad }));
            assert!(delegate_conf(&c, &env()).unwrap_err().msg.contains(says));
        }
    }

    #[test]
    fn missing_variables_are_named() {
        let dir = std::env::temp_dir().join(format!("flannel-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("subnet.env");
        std::fs::write(&path, "FLANNEL_NETWORK=10.244.0.0/16\n").unwrap();
        let e = load_subnet_env(&path).unwrap_err();
        assert!(
            e.msg.contains("is missing FLANNEL_SUBNET, FLANNEL_IPV6_SUBNET, FLANNEL_MTU, FLANNEL_IPMASQ"),
            "{}",
            e.msg
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
