//! libcni 1.x behaviour: load a config list, run its plugins in order with `prevResult` chaining, cache the
//! result, DEL in reverse with the cached result, CHECK, GC and STATUS.
//!
//! The cache is libcni's `cniCacheV1` format at `<cacheDir>/results/<net>-<containerID>-<ifname>`, mode 0600,
//! so that this runner and upstream cnitool (or containerd/CRI-O) can take over each other's attachments.

use cnicore::spec::ipam::{find_plugin, run_with_stdin};
use cnicore::spec::{
    gojson, shorten_json_error, validate_container_id, validate_ifname, validate_network_name, CniResult,
    Error as CniError, Version,
};
use cnicore::state;
use serde_json::{json, Map, Value};
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

pub const DEFAULT_CACHE_DIR: &str = "/var/lib/cni";
pub const CACHE_KIND: &str = "cniCacheV1";

/// A runner failure: what failed, and the plugin's error object when there is one.
#[derive(Debug)]
pub struct RunError {
    pub msg: String,
    pub plugin_error: Option<CniError>,
}

impl RunError {
    fn new(msg: impl Into<String>) -> RunError {
        RunError { msg: msg.into(), plugin_error: None }
    }
    fn plugin(what: String, e: CniError) -> RunError {
        RunError { msg: format!("{what}: {e}"), plugin_error: Some(e) }
    }
    /// The spec code of the underlying plugin error, if a plugin failed.
    pub fn code(&self) -> Option<u32> {
        self.plugin_error.as_ref().map(|e| e.code)
    }
}

impl fmt::Display for RunError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.code() {
            Some(code) => write!(f, "{} (code {code})", self.msg),
            None => f.write_str(&self.msg),
        }
    }
}

impl From<CniError> for RunError {
    fn from(e: CniError) -> RunError {
        RunError { msg: e.to_string(), plugin_error: None }
    }
}

type Result<T> = std::result::Result<T, RunError>;

/// What the runtime knows of one attachment.
#[derive(Debug, Clone, Default)]
pub struct RuntimeConf {
    pub container_id: String,
    pub netns: String,
    pub ifname: String,
    pub args: Vec<(String, String)>,
    /// Capability arguments (`CAP_ARGS`): injected into `runtimeConfig` only for capabilities a plugin declares.
    pub capability_args: Map<String, Value>,
}

impl RuntimeConf {
    fn validate(&self) -> Result<()> {
        validate_container_id(&self.container_id)?;
        validate_ifname(&self.ifname)?;
        Ok(())
    }
    fn args_env(&self) -> String {
        self.args.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(";")
    }
}

/// A loaded config list.
#[derive(Debug, Clone)]
pub struct ConfList {
    pub name: String,
    pub cni_version: String,
    pub disable_check: bool,
    pub disable_gc: bool,
    /// `loadOnlyInlinedPlugins` (libcni 1.3): when false, plugins in `<conf dir>/<network>/*.conf` are appended.
    pub load_only_inlined_plugins: bool,
    pub plugins: Vec<Map<String, Value>>,
    /// The file's bytes, stored in the cache as libcni does.
    pub bytes: Vec<u8>,
}

impl ConfList {
    /// Parses a conflist as libcni does: the list's own keys (`name`, `cniVersion`, `plugins`, ...) are read
    /// from a map, so they match exactly; each plugin's config is a struct to libcni, so its `type` matches as
    /// encoding/json matches fields ([`gojson`]).
    pub fn from_bytes(bytes: &[u8]) -> Result<ConfList> {
        let raw: Map<String, Value> = serde_json::from_slice(bytes)
            .map_err(|e| RunError::new(format!("error parsing configuration list: {}", shorten_json_error(&e))))?;
        let name = match raw.get("name") {
            Some(Value::String(n)) => n.clone(),
            Some(_) => return Err(RunError::new("error parsing configuration list: invalid name type")),
            None => return Err(RunError::new("error parsing configuration list: no name")),
        };
        validate_network_name(&name)?;
        let cni_version = pick_version(&raw)?;
        let load_only_inlined_plugins = flag(&raw, "loadOnlyInlinedPlugins")?;
        // libcni 1.3: without `plugins`, the plugins come from the network's directory (unless only inlined
        // ones may be loaded); a `plugins` key that is there must be a non-empty list.
        let plugins = match raw.get("plugins") {
            None if !load_only_inlined_plugins => Vec::new(),
            None => {
                return Err(RunError::new(
                    "error parsing configuration list: `loadOnlyInlinedPlugins` is true, and no 'plugins' key",
                ))
            }
            Some(Value::Array(list)) if !list.is_empty() => list
                .iter()
                .enumerate()
                .map(|(i, p)| plugin_conf(p, &format!("error parsing configuration list: plugin {i}")))
                .collect::<Result<Vec<_>>>()?,
            _ => return Err(RunError::new(format!("error parsing configuration list: no plugins in list {name:?}"))),
        };
        Ok(ConfList {
            name,
            cni_version,
            disable_check: flag(&raw, "disableCheck")?,
            disable_gc: flag(&raw, "disableGC")?,
            load_only_inlined_plugins,
            plugins,
            bytes: bytes.to_vec(),
        })
    }

    /// A single plugin config (`.conf`/`.json`) as a list of one, as libcni's `ConfListFromConf` does.
    pub fn from_single_conf(bytes: &[u8]) -> Result<ConfList> {
        let conf: Map<String, Value> = serde_json::from_slice(bytes)
            .map_err(|e| RunError::new(format!("error parsing configuration: {}", shorten_json_error(&e))))?;
        let list = json!({
            "cniVersion": gojson::member(&conf, "cniVersion").cloned().unwrap_or_else(|| "".into()),
            "name": gojson::member(&conf, "name").cloned().unwrap_or(Value::Null),
            "plugins": [conf],
        });
        let bytes = serde_json::to_vec(&list).map_err(|e| RunError::new(e.to_string()))?;
        ConfList::from_bytes(&bytes)
    }

    fn version(&self) -> Result<Version> {
        Ok(Version::parse_supported(&self.cni_version)?)
    }
}

/// A plugin config object: it must have a `type`. `what` says where it comes from, for the error.
fn plugin_conf(value: &Value, what: &str) -> Result<Map<String, Value>> {
    match value {
        Value::Object(o) if gojson::member(o, "type").and_then(Value::as_str).is_some_and(|t| !t.is_empty()) => {
            Ok(o.clone())
        }
        Value::Object(_) => Err(RunError::new(format!("{what}: missing 'type'"))),
        _ => Err(RunError::new(format!("{what}: not an object"))),
    }
}

/// A boolean of the list as libcni 1.2/1.3 reads it: `true`/`false`, or the strings "true"/"false" in any case.
fn flag(raw: &Map<String, Value>, key: &str) -> Result<bool> {
    match raw.get(key) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(Value::String(s)) if s.eq_ignore_ascii_case("true") => Ok(true),
        Some(Value::String(s)) if s.eq_ignore_ascii_case("false") => Ok(false),
        Some(Value::String(s)) => Err(RunError::new(format!(
            "error parsing configuration list: invalid value {:?} for {key}",
            cnicore::spec::truncate_for_msg(&s.to_ascii_lowercase())
        ))),
        Some(_) => Err(RunError::new(format!("error parsing configuration list: invalid type for {key}"))),
    }
}

/// The version to run, as libcni 1.2/1.3 picks it: the highest of `cniVersions` and `cniVersion` that is not
/// above the latest spec version (1.1.0); a malformed entry is an error; without `cniVersions`, `cniVersion`.
fn pick_version(raw: &Map<String, Value>) -> Result<String> {
    let declared = match raw.get("cniVersion") {
        Some(Value::String(v)) => v.clone(),
        None | Some(Value::Null) => String::new(),
        Some(_) => return Err(RunError::new("error parsing configuration list: invalid cniVersion type")),
    };
    let list = match raw.get("cniVersions") {
        None | Some(Value::Null) => return Ok(declared),
        Some(Value::Array(list)) => list,
        Some(_) => return Err(RunError::new("error parsing configuration list: invalid type for cniVersions")),
    };
    let mut candidates = Vec::new();
    for (i, entry) in list.iter().enumerate() {
        let text = entry.as_str().ok_or_else(|| {
            RunError::new(format!("error parsing configuration list: invalid type for cniVersions index {i}"))
        })?;
        let v = Version::parse(text).map_err(|e| {
            RunError::new(format!(
                "error parsing configuration list: invalid cniVersions entry at index {i}: {}",
                e.msg
            ))
        })?;
        if v <= Version::LATEST {
            candidates.push(v);
        }
    }
    if !declared.is_empty() {
        let v = Version::parse(&declared)
            .map_err(|e| RunError::new(format!("error parsing configuration list: invalid cniVersion: {}", e.msg)))?;
        if v <= Version::LATEST {
            candidates.push(v);
        }
    }
    Ok(candidates.into_iter().max().map_or(declared, |v| v.to_string()))
}

/// Plugins of `network` in `<dir>/<network>/*.conf`, in file name order (libcni 1.3
/// `NetworkPluginConfsFromFiles`).
fn plugins_from_dir(dir: &Path, network: &str) -> Result<Vec<Map<String, Value>>> {
    let plugin_dir = dir.join(network);
    let entries = match std::fs::read_dir(&plugin_dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => {
            return Err(RunError::new(format!("failed to read plugin config files in {}: {e}", plugin_dir.display())))
        }
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.is_file() && p.extension().is_some_and(|x| x == "conf"))
        .collect();
    files.sort();
    files
        .iter()
        .map(|file| {
            let bytes =
                std::fs::read(file).map_err(|e| RunError::new(format!("error reading {}: {e}", file.display())))?;
            let value: Value = serde_json::from_slice(&bytes).map_err(|e| {
                RunError::new(format!("error parsing configuration {}: {}", file.display(), shorten_json_error(&e)))
            })?;
            plugin_conf(&value, &format!("error parsing configuration {}", file.display()))
        })
        .collect()
}

/// Finds the list named `name` in `dir`: `.conflist` files in name order first, then `.conf`/`.json`.
pub fn load_conf_list(dir: &Path, name: &str) -> Result<ConfList> {
    let files = |exts: &[&str]| -> Result<Vec<PathBuf>> {
        let entries = match std::fs::read_dir(dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(RunError::new(format!("reading {}: {e}", dir.display()))),
        };
        let mut v: Vec<PathBuf> = entries
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .filter(|p| p.is_file() && p.extension().is_some_and(|x| exts.iter().any(|e| x == *e)))
            .collect();
        v.sort();
        Ok(v)
    };
    let read = |p: &Path| std::fs::read(p).map_err(|e| RunError::new(format!("reading {}: {e}", p.display())));
    for file in files(&["conflist"])? {
        let mut list =
            ConfList::from_bytes(&read(&file)?).map_err(|e| RunError::new(format!("{}: {e}", file.display())))?;
        if !list.load_only_inlined_plugins {
            list.plugins.extend(plugins_from_dir(dir, &list.name)?);
        }
        if list.plugins.is_empty() {
            return Err(RunError::new(format!("{}: no plugin configs found", file.display())));
        }
        if list.name == name {
            return Ok(list);
        }
    }
    for file in files(&["conf", "json"])? {
        let bytes = read(&file)?;
        let is_it = serde_json::from_slice::<Value>(&bytes).ok().and_then(|v| gojson::field(&v, "name").cloned())
            == Some(name.into());
        if is_it {
            return ConfList::from_single_conf(&bytes);
        }
    }
    Err(RunError::new(format!("no net configuration with name {name:?} in {}", dir.display())))
}

/// The plugin search path and the cache directory.
#[derive(Debug, Clone)]
pub struct CniConfig {
    pub path: Vec<PathBuf>,
    pub cache_dir: PathBuf,
}

fn describe(plugin: &Map<String, Value>) -> String {
    let t = gojson::member(plugin, "type").and_then(Value::as_str).unwrap_or("");
    match gojson::member(plugin, "name").and_then(Value::as_str) {
        Some(n) if !n.is_empty() => format!("type={t:?} name={n:?}"),
        _ => format!("type={t:?}"),
    }
}

impl CniConfig {
    /// The stdin of one plugin: its config with the list's name and version, `prevResult`, and the capability
    /// arguments it declares under `runtimeConfig` (libcni's `buildOneConfig`).
    fn build_config(
        &self,
        list: &ConfList,
        plugin: &Map<String, Value>,
        prev: Option<&Value>,
        rt: &RuntimeConf,
    ) -> Map<String, Value> {
        let mut conf = plugin.clone();
        conf.insert("name".into(), list.name.clone().into());
        conf.insert("cniVersion".into(), list.cni_version.clone().into());
        if let Some(prev) = prev {
            conf.insert("prevResult".into(), prev.clone());
        }
        let mut runtime = Map::new();
        if let Some(Value::Object(caps)) = gojson::member(plugin, "capabilities") {
            for (cap, on) in caps {
                if on.as_bool() == Some(true) {
                    if let Some(v) = rt.capability_args.get(cap) {
                        runtime.insert(cap.clone(), v.clone());
                    }
                }
            }
        }
        if !runtime.is_empty() {
            conf.insert("runtimeConfig".into(), Value::Object(runtime));
        }
        conf
    }

    fn exec(
        &self,
        command: &str,
        plugin: &Map<String, Value>,
        stdin: &Map<String, Value>,
        rt: &RuntimeConf,
    ) -> Result<Option<Value>> {
        let plugin_type = gojson::member(plugin, "type").and_then(Value::as_str).unwrap_or("");
        let binary = find_plugin(plugin_type, &self.path)?;
        let mut p = Command::new(&binary);
        p.env("CNI_COMMAND", command)
            .env("CNI_CONTAINERID", &rt.container_id)
            .env("CNI_NETNS", &rt.netns)
            .env("CNI_IFNAME", &rt.ifname)
            .env("CNI_ARGS", rt.args_env())
            .env("CNI_PATH", std::env::join_paths(&self.path).unwrap_or_default())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let bytes = serde_json::to_vec(stdin).map_err(|e| RunError::new(e.to_string()))?;
        let verb = command.to_ascii_lowercase();
        run_with_stdin(p, &binary, &bytes)
            .map_err(|e| RunError::plugin(format!("plugin {} failed ({verb})", describe(plugin)), e))
    }

    /// ADD every plugin in order, chaining results; caches and returns the final result in the list's version.
    pub fn add_network_list(&self, list: &ConfList, rt: &RuntimeConf) -> Result<Value> {
        rt.validate()?;
        let version = list.version()?;
        let mut result: Option<Value> = None;
        for plugin in &list.plugins {
            let stdin = self.build_config(list, plugin, result.as_ref(), rt);
            let out = self
                .exec("ADD", plugin, &stdin, rt)?
                .ok_or_else(|| RunError::new(format!("plugin {} returned no result", describe(plugin))))?;
            // Every plugin answers in the list's version; convert in case one did not.
            let converted = CniResult::convert(&out, version)
                .map_err(|e| RunError::new(format!("plugin {} returned an invalid result: {e}", describe(plugin))))?;
            result = Some(converted);
        }
        let result = result.unwrap_or(Value::Null);
        self.cache_add(list, rt, &result)
            .map_err(|e| RunError::new(format!("failed to set network {:?} cached result: {e}", list.name)))?;
        Ok(result)
    }

    /// DEL every plugin in reverse, with the cached result as `prevResult` (spec ≥ 0.4.0); then drops the cache.
    pub fn del_network_list(&self, list: &ConfList, rt: &RuntimeConf) -> Result<()> {
        rt.validate()?;
        let version = list.version()?;
        let cached = if version >= Version::V040 { self.cached_result(list, rt)? } else { None };
        for plugin in list.plugins.iter().rev() {
            let stdin = self.build_config(list, plugin, cached.as_ref(), rt);
            self.exec("DEL", plugin, &stdin, rt)?;
        }
        let _ = std::fs::remove_file(self.cache_path(&list.name, rt));
        self.remove_cache_temp_files(&list.name, rt);
        Ok(())
    }

    /// Removes the temporary files of this attachment's cache entry that a runner killed while writing it left
    /// behind (`.tmp-<entry>-<pid>`, see `state::write_atomic`): the runtime never runs two operations on one
    /// attachment at once, so none of them is being written now.
    fn remove_cache_temp_files(&self, net: &str, rt: &RuntimeConf) {
        let entry = self.cache_path(net, rt);
        let (Some(dir), Some(name)) = (entry.parent(), entry.file_name()) else { return };
        let Ok(entries) = std::fs::read_dir(dir) else { return };
        let prefix = format!(".tmp-{}-", name.to_string_lossy());
        for e in entries.filter_map(|e| e.ok()) {
            let file = e.file_name();
            let is_ours = file
                .to_str()
                .and_then(|f| f.strip_prefix(&prefix))
                .is_some_and(|pid| !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit()));
            if is_ours {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }

    /// CHECK every plugin in order with the cached result.
    pub fn check_network_list(&self, list: &ConfList, rt: &RuntimeConf) -> Result<()> {
        rt.validate()?;
        if !list.version()?.allows_check() {
            return Err(RunError::new(format!(
                "configuration version {:?} does not support the CHECK command",
                list.cni_version
            )));
        }
        if list.disable_check {
            return Ok(());
        }
        let cached = self.cached_result(list, rt)?;
        if cached.is_none() {
            return Err(RunError::new(format!("no cached result for network {:?}: was it added?", list.name)));
        }
        for plugin in &list.plugins {
            let stdin = self.build_config(list, plugin, cached.as_ref(), rt);
            self.exec("CHECK", plugin, &stdin, rt)?;
        }
        Ok(())
    }

    /// GC: DEL every cached attachment of this network that is not in `valid`, then (spec ≥ 1.1.0) send GC with
    /// `cni.dev/valid-attachments` to every plugin. Errors are collected; the first is returned.
    pub fn gc_network_list(&self, list: &ConfList, valid: &[(String, String)]) -> Result<()> {
        // libcni 1.2+: disableGC skips GC entirely, the cached attachments' DEL included.
        if list.disable_gc {
            return Ok(());
        }
        let mut first_error = None;
        for cached in self.cached_attachments(&list.name) {
            if valid.iter().any(|(c, i)| *c == cached.rt.container_id && *i == cached.rt.ifname) {
                continue;
            }
            // Delete with the config the attachment was added with, when the cache holds it.
            let conf =
                cached.config.as_deref().and_then(|b| ConfList::from_bytes(b).ok()).unwrap_or_else(|| list.clone());
            if let Err(e) = self.del_network_list(&conf, &cached.rt) {
                first_error.get_or_insert(e);
            }
        }
        if list.version()? >= Version::V110 {
            let attachments: Vec<Value> = valid.iter().map(|(c, i)| json!({"containerID": c, "ifname": i})).collect();
            let rt = RuntimeConf::default();
            for plugin in &list.plugins {
                let mut stdin = self.build_config(list, plugin, None, &rt);
                stdin.insert("cni.dev/valid-attachments".into(), Value::Array(attachments.clone()));
                // libcni 1.2+ also sends the key an earlier spec draft named (containernetworking/cni#1101).
                stdin.insert("cni.dev/attachments".into(), Value::Array(attachments.clone()));
                if let Err(e) = self.exec("GC", plugin, &stdin, &rt) {
                    first_error.get_or_insert(e);
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// STATUS (spec ≥ 1.1.0): every plugin must be ready; the first that is not is the answer.
    pub fn status_network_list(&self, list: &ConfList) -> Result<()> {
        if list.version()? < Version::V110 {
            return Ok(());
        }
        let rt = RuntimeConf::default();
        for plugin in &list.plugins {
            let stdin = self.build_config(list, plugin, None, &rt);
            self.exec("STATUS", plugin, &stdin, &rt)?;
        }
        Ok(())
    }

    pub fn cache_path(&self, net: &str, rt: &RuntimeConf) -> PathBuf {
        self.cache_dir.join("results").join(format!("{net}-{}-{}", rt.container_id, rt.ifname))
    }

    fn cache_add(&self, list: &ConfList, rt: &RuntimeConf, result: &Value) -> std::io::Result<()> {
        let mut cached = json!({
            "kind": CACHE_KIND,
            "containerId": rt.container_id,
            "config": crate::base64::encode(&list.bytes),
            "ifName": rt.ifname,
            "networkName": list.name,
            "netns": rt.netns,
            "result": result,
        });
        if !rt.args.is_empty() {
            cached["cniArgs"] = rt.args.iter().map(|(k, v)| json!([k, v])).collect();
        }
        if !rt.capability_args.is_empty() {
            cached["capabilityArgs"] = Value::Object(rt.capability_args.clone());
        }
        let dir = self.cache_dir.join("results");
        state::ensure_dir(&dir, 0o700)?;
        let bytes = serde_json::to_vec(&cached).map_err(std::io::Error::other)?;
        state::write_atomic(&self.cache_path(&list.name, rt), &bytes, 0o600)
    }

    /// The cached result converted to the list's version; `None` when nothing is cached (or the file is not ours
    /// to read), as libcni ignores read errors here.
    pub fn cached_result(&self, list: &ConfList, rt: &RuntimeConf) -> Result<Option<Value>> {
        let Ok(bytes) = std::fs::read(self.cache_path(&list.name, rt)) else { return Ok(None) };
        let Ok(cached) = serde_json::from_slice::<Value>(&bytes) else { return Ok(None) };
        if gojson::field(&cached, "kind").and_then(Value::as_str) != Some(CACHE_KIND) {
            return Ok(None);
        }
        match gojson::field(&cached, "result") {
            None | Some(Value::Null) => Ok(None),
            Some(r) => CniResult::convert(r, list.version()?).map(Some).map_err(|e| {
                RunError::new(format!("failed to convert cached result to config version {:?}: {e}", list.cni_version))
            }),
        }
    }

    /// Every cached attachment of network `net`.
    pub fn cached_attachments(&self, net: &str) -> Vec<CachedAttachment> {
        let Ok(entries) = std::fs::read_dir(self.cache_dir.join("results")) else { return Vec::new() };
        let prefix = format!("{net}-");
        entries
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
            .filter_map(|e| std::fs::read(e.path()).ok())
            .filter_map(|b| CachedAttachment::parse(&b))
            .filter(|a| a.network == net)
            .collect()
    }
}

/// One entry of the result cache.
#[derive(Debug, Clone)]
pub struct CachedAttachment {
    pub network: String,
    pub rt: RuntimeConf,
    pub config: Option<Vec<u8>>,
    pub result: Option<Value>,
}

impl CachedAttachment {
    pub fn parse(bytes: &[u8]) -> Option<CachedAttachment> {
        let v: Value = serde_json::from_slice(bytes).ok()?;
        if gojson::field(&v, "kind")?.as_str()? != CACHE_KIND {
            return None;
        }
        let s = |k: &str| gojson::field(&v, k).and_then(Value::as_str).unwrap_or("").to_string();
        let rt = RuntimeConf {
            container_id: s("containerId"),
            netns: s("netns"),
            ifname: s("ifName"),
            args: gojson::field(&v, "cniArgs")
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(|p| Some((p.get(0)?.as_str()?.to_string(), p.get(1)?.as_str()?.to_string())))
                        .collect()
                })
                .unwrap_or_default(),
            capability_args: gojson::field(&v, "capabilityArgs")
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default(),
        };
        if rt.container_id.is_empty() || rt.ifname.is_empty() || s("networkName").is_empty() {
            return None;
        }
        Some(CachedAttachment {
            network: s("networkName"),
            config: gojson::field(&v, "config").and_then(Value::as_str).and_then(crate::base64::decode),
            result: gojson::field(&v, "result").cloned(),
            rt,
        })
    }
}

/// Parses `CNI_ARGS` as upstream cnitool does: `K=V;K=V`, every pair with a key and a value.
pub fn parse_args(raw: &str) -> Result<Vec<(String, String)>> {
    raw.split(';')
        .map(|pair| match pair.split('=').collect::<Vec<_>>().as_slice() {
            [k, v] if !k.is_empty() && !v.is_empty() => Ok((k.to_string(), v.to_string())),
            _ => Err(RunError::new(format!("invalid CNI_ARGS pair {pair:?}"))),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conflist_parsing() {
        let l = ConfList::from_bytes(br#"{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"bridge"}]}"#).unwrap();
        assert_eq!(l.cni_version, "1.0.0");
        let l = ConfList::from_bytes(
            br#"{"cniVersions":["0.4.0","1.1.0","9.0.0"],"cniVersion":"0.3.1","name":"n","plugins":[{"type":"a"}]}"#,
        )
        .unwrap();
        assert_eq!(l.cni_version, "1.1.0");
        for bad in [
            r#"{"name":"n","plugins":[]}"#,
            r#"{"plugins":[{"type":"a"}]}"#,
            r#"{"name":"../x","plugins":[{"type":"a"}]}"#,
            r#"{"name":"n","plugins":[{"name":"x"}]}"#,
            r#"{"name":5,"plugins":[{"type":"a"}]}"#,
            "{",
        ] {
            assert!(ConfList::from_bytes(bad.as_bytes()).is_err(), "{bad}");
        }
        let single = ConfList::from_single_conf(br#"{"cniVersion":"0.3.1","name":"lo","type":"loopback"}"#).unwrap();
        assert_eq!(single.plugins.len(), 1);
        assert_eq!(single.name, "lo");
    }

    fn scratch(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("cnitool-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn libcni_1_3_list_fields() {
        // Booleans also as strings, any case; anything else is an error naming the key.
        let l = ConfList::from_bytes(
            br#"{"cniVersion":"1.1.0","name":"n","disableCheck":"TRUE","disableGC":"false","plugins":[{"type":"a"}]}"#,
        )
        .unwrap();
        assert!(l.disable_check && !l.disable_gc && !l.load_only_inlined_plugins);
        let e = ConfList::from_bytes(br#"{"name":"n","disableGC":"yes","plugins":[{"type":"a"}]}"#).unwrap_err();
        assert!(e.to_string().contains("invalid value \"yes\" for disableGC"), "{e}");
        assert!(ConfList::from_bytes(br#"{"name":"n","disableCheck":1,"plugins":[{"type":"a"}]}"#).is_err());
        // cniVersions: the highest of the list and cniVersion not above 1.1.0; a malformed entry is an error.
        let pick = |extra: &str| {
            ConfList::from_bytes(format!(r#"{{"name":"n"{extra},"plugins":[{{"type":"a"}}]}}"#).as_bytes())
                .map(|l| l.cni_version)
        };
        assert_eq!(pick(r#","cniVersion":"1.0.0","cniVersions":["0.4.0"]"#).unwrap(), "1.0.0");
        assert_eq!(pick(r#","cniVersion":"0.3.1","cniVersions":["0.4.0","1.1.0","9.0.0"]"#).unwrap(), "1.1.0");
        assert_eq!(pick(r#","cniVersion":"2.0.0","cniVersions":["3.0.0"]"#).unwrap(), "2.0.0");
        assert!(pick(r#","cniVersions":["1.0"]"#).is_err());
        // loadOnlyInlinedPlugins without plugins is an error; plugins may be absent otherwise.
        assert!(ConfList::from_bytes(br#"{"name":"n","loadOnlyInlinedPlugins":true}"#).is_err());
        assert!(ConfList::from_bytes(br#"{"name":"n"}"#).unwrap().plugins.is_empty());
    }

    #[test]
    fn plugins_from_the_network_directory() {
        let dir = scratch("netdir");
        std::fs::write(
            dir.join("10-n.conflist"),
            br#"{"cniVersion":"1.1.0","name":"n","plugins":[{"type":"bridge"}]}"#,
        )
        .unwrap();
        std::fs::create_dir_all(dir.join("n")).unwrap();
        std::fs::write(dir.join("n/20-b.conf"), br#"{"type":"tuning"}"#).unwrap();
        std::fs::write(dir.join("n/10-a.conf"), br#"{"type":"portmap"}"#).unwrap();
        std::fs::write(dir.join("n/ignored.json"), br#"{"type":"x"}"#).unwrap();
        let types =
            |l: &ConfList| l.plugins.iter().map(|p| p["type"].as_str().unwrap().to_string()).collect::<Vec<_>>();
        assert_eq!(types(&load_conf_list(&dir, "n").unwrap()), ["bridge", "portmap", "tuning"]);
        std::fs::write(
            dir.join("10-n.conflist"),
            br#"{"cniVersion":"1.1.0","name":"n","loadOnlyInlinedPlugins":true,"plugins":[{"type":"bridge"}]}"#,
        )
        .unwrap();
        assert_eq!(types(&load_conf_list(&dir, "n").unwrap()), ["bridge"]);
        std::fs::write(dir.join("10-n.conflist"), br#"{"cniVersion":"1.1.0","name":"n"}"#).unwrap();
        assert_eq!(types(&load_conf_list(&dir, "n").unwrap()), ["portmap", "tuning"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn gc_sends_both_keys_and_disable_gc_skips_it() {
        use std::os::unix::fs::PermissionsExt;
        let dir = scratch("gc");
        let seen = dir.join("stdin.json");
        let plugin = dir.join("recorder");
        std::fs::write(&plugin, format!("#!/bin/sh\ncat > {}\n", seen.display())).unwrap();
        std::fs::set_permissions(&plugin, std::fs::Permissions::from_mode(0o755)).unwrap();
        let cfg = CniConfig { path: vec![dir.clone()], cache_dir: dir.join("cache") };
        let valid = [("c1".to_string(), "eth0".to_string())];
        let list =
            ConfList::from_bytes(br#"{"cniVersion":"1.1.0","name":"n","plugins":[{"type":"recorder"}]}"#).unwrap();
        cfg.gc_network_list(&list, &valid).unwrap();
        let sent: Value = serde_json::from_slice(&std::fs::read(&seen).unwrap()).unwrap();
        let want = json!([{"containerID": "c1", "ifname": "eth0"}]);
        assert_eq!((&sent["cni.dev/valid-attachments"], &sent["cni.dev/attachments"]), (&want, &want));
        std::fs::remove_file(&seen).unwrap();
        let disabled = ConfList::from_bytes(
            br#"{"cniVersion":"1.1.0","name":"n","disableGC":"true","plugins":[{"type":"recorder"}]}"#,
        )
        .unwrap();
        cfg.gc_network_list(&disabled, &valid).unwrap();
        assert!(!seen.exists(), "GC ran with disableGC");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn conflist_go_spellings() {
        // libcni reads the list from a map (exact keys) and each plugin into a struct (keys folded); the
        // capabilities are a map again, matched exactly.
        assert!(ConfList::from_bytes(br#"{"cniVersion":"0.4.0","Name":"n","plugins":[{"type":"bridge"}]}"#).is_err());
        let l = ConfList::from_bytes(
            br#"{"cniVersion":"0.4.0","name":"n","disableCheck":true,"DisableCheck":false,"plugins":[{"Type":"bridge"},{"type":"portmap"}]}"#,
        )
        .unwrap();
        assert_eq!(
            (l.cni_version.as_str(), l.name.as_str(), l.disable_check, l.plugins.len()),
            ("0.4.0", "n", true, 2)
        );
        let cfg = CniConfig { path: vec![], cache_dir: "/tmp".into() };
        let plugin =
            serde_json::from_str(r#"{"type":"portmap","Capabilities":{"portMappings":true,"PortMappings":false}}"#)
                .unwrap();
        let rt = RuntimeConf {
            capability_args: json!({"portMappings":[1]}).as_object().unwrap().clone(),
            ..Default::default()
        };
        let built = cfg.build_config(&l, &plugin, None, &rt);
        assert_eq!(built["runtimeConfig"]["portMappings"], json!([1]));
    }

    #[test]
    fn runtime_config_only_for_declared_capabilities() {
        let cfg = CniConfig { path: vec![], cache_dir: "/tmp".into() };
        let list = ConfList::from_bytes(br#"{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"a"}]}"#).unwrap();
        let mut rt = RuntimeConf::default();
        rt.capability_args.insert("portMappings".into(), json!([{"hostPort": 80}]));
        rt.capability_args.insert("bandwidth".into(), json!({}));
        let plugin =
            serde_json::from_str(r#"{"type":"portmap","capabilities":{"portMappings":true,"bandwidth":false}}"#)
                .unwrap();
        let c = cfg.build_config(&list, &plugin, Some(&json!({"cniVersion":"1.0.0"})), &rt);
        assert_eq!(c["runtimeConfig"], json!({"portMappings": [{"hostPort": 80}]}));
        assert_eq!(c["name"], "n");
        assert!(c.contains_key("prevResult"));
        let none = cfg.build_config(&list, &serde_json::from_str(r#"{"type":"x"}"#).unwrap(), None, &rt);
        assert!(!none.contains_key("runtimeConfig") && !none.contains_key("prevResult"));
    }

    #[test]
    fn cni_args() {
        assert_eq!(parse_args("A=1;B=2").unwrap().len(), 2);
        assert!(parse_args("A=1;B").is_err());
        assert!(parse_args("A=").is_err());
    }

    #[test]
    fn cache_entry_round_trip() {
        let raw = br#"{"kind":"cniCacheV1","containerId":"c","config":"e30=","ifName":"eth0","networkName":"n","cniArgs":[["K","V"]],"result":{"cniVersion":"1.0.0"}}"#;
        let a = CachedAttachment::parse(raw).unwrap();
        assert_eq!(a.config.as_deref(), Some(&b"{}"[..]));
        assert_eq!(a.rt.args, vec![("K".to_string(), "V".to_string())]);
        assert!(CachedAttachment::parse(br#"{"kind":"other"}"#).is_none());
        assert!(CachedAttachment::parse(b"not json").is_none());
    }
}
