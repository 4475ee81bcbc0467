//! The entry point every plugin's `main` calls: read the environment and the config, dispatch the verb,
//! print the result in the config's version or the error object, exit.

use super::config::{json_error_in, validate_network_name, NetConf};
use super::env::{Command, Env};
use super::error::{codes, Error, Result};
use super::gojson;
use super::result::CniResult;
use super::version::{Version, SUPPORTED_VERSIONS};
use serde::de::DeserializeOwned;
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::path::Path;

/// The largest config accepted on stdin. Real configs are a few KiB; this bounds hostile input.
pub const MAX_STDIN: u64 = 1 << 20;

/// Everything one invocation knows: the environment, the config bytes and their common fields.
#[derive(Clone)]
pub struct Context {
    pub env: Env,
    /// The raw config, as delegated plugins must receive it.
    pub stdin: Vec<u8>,
    pub conf: NetConf,
    /// The version the config asks for; the result is printed in it.
    pub version: Version,
}

impl Context {
    /// Parses the plugin's own config type from the same bytes, with Go's JSON semantics ([`gojson`]).
    pub fn parse_conf<T: DeserializeOwned>(&self) -> Result<T> {
        gojson::from_slice(&self.stdin).map_err(|e| json_error_in("invalid network config", &e, &self.stdin))
    }

    /// A context as the entry point would build it, for unit tests: `stdin` parsed leniently (a config that is
    /// not valid leaves the common fields empty, so that the plugin's own parser meets it), version 1.1.0 when
    /// the config names none, container `c`, interface `eth0`, no netns.
    #[cfg(any(test, feature = "testing"))]
    pub fn for_test(command: super::env::Command, stdin: impl Into<Vec<u8>>, cni_args: &str) -> Context {
        let stdin = stdin.into();
        let conf: NetConf = gojson::from_slice(&stdin).unwrap_or_default();
        let version = Version::parse_supported(&conf.cni_version).unwrap_or(Version::V110);
        let env = Env {
            command,
            container_id: "c".into(),
            netns: None,
            ifname: "eth0".into(),
            args: super::env::parse_cni_args(cni_args).unwrap_or_default(),
            args_raw: cni_args.into(),
            path: vec![],
        };
        Context { env, stdin, conf, version }
    }

    /// Loads a plugin's config with `load`; on DEL, a failure caused by the runtime's per-attachment inputs
    /// (`runtimeConfig`, `args`, `CNI_ARGS`) is retried without them. DEL needs none of them to find what the
    /// attachment has, and a DEL that fails on them leaks the pod: containerd keeps the sandbox, its veth and
    /// its lease when its rollback DEL fails. A config that is bad without them stays an error.
    pub fn load_for_teardown<T>(&self, load: impl Fn(&Context) -> Result<T>) -> Result<T> {
        let error = match load(self) {
            Ok(conf) => return Ok(conf),
            Err(e) if self.env.command != super::env::Command::Del => return Err(e),
            Err(e) => e,
        };
        let Ok(Value::Object(mut raw)) = serde_json::from_slice::<Value>(&self.stdin) else { return Err(error) };
        raw.retain(|key, _| !["runtimeConfig", "args"].iter().any(|k| gojson::fold_eq(key, k)));
        let mut bare = self.clone();
        bare.stdin = serde_json::to_vec(&raw).map_err(|_| error.clone())?;
        bare.conf.runtime_config = None;
        bare.conf.args = None;
        bare.env.args = Default::default();
        bare.env.args_raw.clear();
        match load(&bare) {
            Ok(conf) => {
                crate::warn!("ignoring inputs DEL does not need: {}", error.msg);
                Ok(conf)
            }
            Err(_) => Err(error),
        }
    }

    /// `CNI_NETNS`, which the environment check guarantees for ADD and CHECK.
    pub fn netns(&self) -> Result<&Path> {
        self.env.netns.as_deref().ok_or_else(|| Error::env("CNI_NETNS is required"))
    }

    /// Opens the pod's netns (`CNI_NETNS`). A netns that does not exist is "unknown container" (code 3).
    pub fn open_netns(&self) -> Result<crate::netns::NetNs> {
        let path = self.netns()?;
        crate::netns::NetNs::open(path).map_err(|e| {
            let code =
                if e.kind() == std::io::ErrorKind::NotFound { codes::UNKNOWN_CONTAINER } else { codes::INTERNAL };
            Error::new(code, format!("failed to open netns {}: {e}", path.display()))
        })
    }

    /// Like [`Context::open_netns`], but `None` when there is no netns to act on (DEL after the pod is gone).
    pub fn open_netns_if_exists(&self) -> Result<Option<crate::netns::NetNs>> {
        match self.env.netns.as_deref() {
            None => Ok(None),
            Some(_) => match self.open_netns() {
                Ok(ns) => Ok(Some(ns)),
                Err(e) if e.code == codes::UNKNOWN_CONTAINER => Ok(None),
                Err(e) => Err(e),
            },
        }
    }

    /// The `prevResult` of a chained plugin, in canonical form.
    pub fn prev_result(&self) -> Result<Option<CniResult>> {
        match &self.conf.prev_result {
            None | Some(Value::Null) => Ok(None),
            Some(v) if !v.is_object() => Err(Error::decode("failed to parse prevResult: it must be a JSON object")),
            Some(v) => {
                // A prevResult may omit cniVersion; it is then in the config's version.
                let mut v = v.clone();
                if gojson::field(&v, "cniVersion").is_none() {
                    if let Some(o) = v.as_object_mut() {
                        o.insert("cniVersion".into(), self.version.to_string().into());
                    }
                }
                CniResult::from_json(&v)
                    .map(Some)
                    .map_err(|e| Error::decode(format!("failed to parse prevResult: {}", e.msg)))
            }
        }
    }

    /// The `prevResult`, required (chained plugins such as portmap and bandwidth).
    pub fn require_prev_result(&self) -> Result<CniResult> {
        self.prev_result()?.ok_or_else(|| {
            let plugin = super::env::truncate(&self.conf.plugin_type);
            Error::config(format!("must be called as a chained plugin: {plugin} needs prevResult"))
        })
    }

    /// `cni.dev/valid-attachments` (or the older `cni.dev/attachments`) of a GC call, as (containerID, ifname).
    pub fn valid_attachments(&self) -> Result<Vec<(String, String)>> {
        Ok(self.gc_attachments()?.unwrap_or_default())
    }

    /// Like [`Context::valid_attachments`], but `None` when the config has no list at all (as opposed to an
    /// empty one).
    pub fn gc_attachments(&self) -> Result<Option<Vec<(String, String)>>> {
        #[derive(serde::Deserialize)]
        struct GcConf {
            #[serde(default, rename = "cni.dev/valid-attachments")]
            valid: Option<Vec<Attachment>>,
            #[serde(default, rename = "cni.dev/attachments")]
            older: Option<Vec<Attachment>>,
        }
        #[derive(serde::Deserialize)]
        struct Attachment {
            #[serde(default, rename = "containerID")]
            container_id: String,
            #[serde(default)]
            ifname: String,
        }
        let conf: GcConf = self.parse_conf()?;
        let Some(list) = conf.valid.or(conf.older) else { return Ok(None) };
        list.into_iter()
            .map(|a| match (a.container_id.is_empty(), a.ifname.is_empty()) {
                (false, false) => Ok((a.container_id, a.ifname)),
                _ => Err(Error::config("each valid attachment needs containerID and ifname")),
            })
            .collect::<Result<_>>()
            .map(Some)
    }
}

/// What a plugin implements. GC and STATUS default to "nothing to do" / "ready".
pub trait Plugin {
    fn add(&self, ctx: &Context) -> Result<CniResult>;
    fn del(&self, ctx: &Context) -> Result<()>;
    fn check(&self, ctx: &Context) -> Result<()>;
    fn gc(&self, _ctx: &Context) -> Result<()> {
        Ok(())
    }
    fn status(&self, _ctx: &Context) -> Result<()> {
        Ok(())
    }
}

/// A plugin whose verbs are plain functions, for plugins with no state to carry between them:
/// `plugin_main(about, &Verbs::new(add, del, check).gc(gc))`. GC and STATUS default to nothing to do.
pub struct Verbs {
    add: fn(&Context) -> Result<CniResult>,
    del: fn(&Context) -> Result<()>,
    check: fn(&Context) -> Result<()>,
    gc: fn(&Context) -> Result<()>,
    status: fn(&Context) -> Result<()>,
}

impl Verbs {
    pub fn new(
        add: fn(&Context) -> Result<CniResult>,
        del: fn(&Context) -> Result<()>,
        check: fn(&Context) -> Result<()>,
    ) -> Verbs {
        Verbs { add, del, check, gc: |_| Ok(()), status: |_| Ok(()) }
    }

    pub fn gc(self, gc: fn(&Context) -> Result<()>) -> Verbs {
        Verbs { gc, ..self }
    }

    pub fn status(self, status: fn(&Context) -> Result<()>) -> Verbs {
        Verbs { status, ..self }
    }
}

impl Plugin for Verbs {
    fn add(&self, ctx: &Context) -> Result<CniResult> {
        (self.add)(ctx)
    }
    fn del(&self, ctx: &Context) -> Result<()> {
        (self.del)(ctx)
    }
    fn check(&self, ctx: &Context) -> Result<()> {
        (self.check)(ctx)
    }
    fn gc(&self, ctx: &Context) -> Result<()> {
        (self.gc)(ctx)
    }
    fn status(&self, ctx: &Context) -> Result<()> {
        (self.status)(ctx)
    }
}

/// Runs the plugin for this process and exits: 0 with the result (or nothing) on stdout, 1 with the error object.
pub fn plugin_main(about: &str, plugin: &dyn Plugin) -> ! {
    install_panic_hook();
    let mut stdin = Vec::new();
    let env = Env::from_process();
    let read_stdin = |buf: &mut Vec<u8>| -> Result<()> {
        std::io::stdin()
            .lock()
            .take(MAX_STDIN + 1)
            .read_to_end(buf)
            .map_err(|e| Error::io(format!("reading stdin: {e}")))?;
        if buf.len() as u64 > MAX_STDIN {
            return Err(Error::decode(format!("config on stdin is larger than {MAX_STDIN} bytes")));
        }
        Ok(())
    };
    let (version, outcome) = match env {
        Err(e) if std::env::var_os("CNI_COMMAND").is_none_or(|c| c.is_empty()) => {
            // As the reference plugins: a bare invocation prints what the binary is.
            eprintln!("{about}");
            let _ = e;
            std::process::exit(0);
        }
        Err(e) => (Version::LATEST, Err(e)),
        Ok(env) => match read_stdin(&mut stdin) {
            Err(e) => (Version::LATEST, Err(e)),
            Ok(()) => run(env, stdin, plugin),
        },
    };
    let mut out = std::io::stdout().lock();
    // Verbs without an answer print nothing at all, as the reference plugins do.
    let (code, answer) = match outcome {
        Ok(answer) => (0, answer),
        Err(e) => (1, Some(e.to_json(&version.to_string()))),
    };
    if let Some(answer) = answer {
        let _ = serde_json::to_writer(&mut out, &answer);
        let _ = out.write_all(b"\n");
    }
    let _ = out.flush();
    std::process::exit(code)
}

/// Dispatches one verb. Returns the version errors are reported in, and the JSON to print, if any.
pub fn run(env: Env, stdin: Vec<u8>, plugin: &dyn Plugin) -> (Version, Result<Option<Value>>) {
    if env.command == Command::Version {
        return (Version::LATEST, Ok(Some(version_info(&stdin))));
    }
    let conf: NetConf = match gojson::from_slice(&stdin) {
        Ok(c) => c,
        Err(e) => return (Version::LATEST, Err(json_error_in("invalid network config", &e, &stdin))),
    };
    let version = match Version::parse_supported(&conf.cni_version) {
        Ok(v) => v,
        Err(e) => return (Version::LATEST, Err(e)),
    };
    let allowed = match env.command {
        Command::Check => version.allows_check(),
        Command::Gc | Command::Status => version.allows_gc_and_status(),
        _ => true,
    };
    if !allowed {
        let msg = format!("config version {version} does not allow {}", env.command.as_str());
        return (version, Err(Error::new(codes::INCOMPATIBLE_VERSION, msg)));
    }
    if let Err(e) = validate_network_name(&conf.name) {
        return (version, Err(e));
    }
    let ctx = Context { env, stdin, conf, version };
    let outcome = match ctx.env.command {
        Command::Add => plugin.add(&ctx).and_then(|r| r.to_json(version)).map(Some),
        Command::Del => plugin.del(&ctx).map(|_| None),
        Command::Check => plugin.check(&ctx).map(|_| None),
        Command::Gc => plugin.gc(&ctx).map(|_| None),
        Command::Status => plugin.status(&ctx).map(|_| None),
        Command::Version => unreachable!("handled above"),
    };
    (version, outcome)
}

/// The VERSION answer: every supported version, in the version the caller asked about when it is valid.
fn version_info(stdin: &[u8]) -> Value {
    let asked = serde_json::from_slice::<Value>(stdin)
        .ok()
        .and_then(|v| gojson::field(&v, "cniVersion").and_then(Value::as_str).map(str::to_string))
        .filter(|v| Version::parse_supported(v).is_ok())
        .unwrap_or_else(|| Version::LATEST.to_string());
    json!({ "cniVersion": asked, "supportedVersions": SUPPORTED_VERSIONS })
}

/// A bug must still answer with an error object, never with a bare abort.
fn install_panic_hook() {
    std::panic::set_hook(Box::new(|info| {
        let msg = format!("internal error: {info}");
        eprintln!("{msg}");
        let e = Error::new(codes::INTERNAL, msg);
        let _ = serde_json::to_writer(std::io::stdout().lock(), &e.to_json(&Version::LATEST.to_string()));
        std::process::exit(1);
    }));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{CniArgs, Interface};

    struct Fake;
    impl Plugin for Fake {
        fn add(&self, ctx: &Context) -> Result<CniResult> {
            let mut r = ctx.prev_result()?.unwrap_or_default();
            r.interfaces.push(Interface { name: ctx.env.ifname.clone(), ..Default::default() });
            r.ips.push(crate::spec::IpConfig {
                address: "10.0.0.2/24".parse().unwrap(),
                gateway: None,
                interface: Some(0),
            });
            Ok(r)
        }
        fn del(&self, _: &Context) -> Result<()> {
            Ok(())
        }
        fn check(&self, _: &Context) -> Result<()> {
            Err(Error::internal("checked"))
        }
    }

    fn env(cmd: Command) -> Env {
        Env {
            command: cmd,
            container_id: "c1".into(),
            netns: Some("/run/netns/x".into()),
            ifname: "eth0".into(),
            args: CniArgs::default(),
            args_raw: String::new(),
            path: vec![],
        }
    }

    fn call(cmd: Command, stdin: &str) -> (Version, Result<Option<Value>>) {
        run(env(cmd), stdin.as_bytes().to_vec(), &Fake)
    }

    #[test]
    fn verbs_route_each_verb_to_its_function() {
        fn del(_: &Context) -> Result<()> {
            Err(Error::internal("del"))
        }
        fn gc(_: &Context) -> Result<()> {
            Err(Error::internal("gc"))
        }
        let verbs = Verbs::new(|ctx| Fake.add(ctx), del, |_| Err(Error::internal("check")));
        let conf = r#"{"cniVersion":"1.1.0","name":"n","type":"fake"}"#;
        let run_verbs = |verbs: &Verbs, cmd| run(env(cmd), conf.as_bytes().to_vec(), verbs).1;
        assert_eq!(run_verbs(&verbs, Command::Add).unwrap().unwrap()["ips"][0]["address"], "10.0.0.2/24");
        assert_eq!(run_verbs(&verbs, Command::Del).unwrap_err().msg, "del");
        assert_eq!(run_verbs(&verbs, Command::Check).unwrap_err().msg, "check");
        // GC and STATUS: nothing to do unless given.
        assert!(run_verbs(&verbs, Command::Gc).unwrap().is_none());
        assert!(run_verbs(&verbs, Command::Status).unwrap().is_none());
        let verbs = verbs.gc(gc).status(del);
        assert_eq!(run_verbs(&verbs, Command::Gc).unwrap_err().msg, "gc");
        assert_eq!(run_verbs(&verbs, Command::Status).unwrap_err().msg, "del");
    }

    #[test]
    fn answers_in_config_version() {
        for v in SUPPORTED_VERSIONS {
            let (_, out) = call(Command::Add, &format!(r#"{{"cniVersion":"{v}","name":"n","type":"fake"}}"#));
            assert_eq!(out.unwrap().unwrap()["cniVersion"], *v);
        }
    }

    #[test]
    fn bad_json_and_versions() {
        for cmd in [Command::Add, Command::Del, Command::Check, Command::Gc, Command::Status] {
            assert_eq!(call(cmd, "{").1.unwrap_err().code, codes::DECODE);
            assert_eq!(call(cmd, "").1.unwrap_err().code, codes::DECODE);
            assert_eq!(call(cmd, "[1]").1.unwrap_err().code, codes::INVALID_CONFIG);
            assert_eq!(
                call(cmd, r#"{"cniVersion":"7.0.0","name":"n"}"#).1.unwrap_err().code,
                codes::INCOMPATIBLE_VERSION
            );
            assert_eq!(call(cmd, r#"{"cniVersion":"1.1.0","name":"../x"}"#).1.unwrap_err().code, codes::INVALID_CONFIG);
        }
    }

    #[test]
    fn verbs_gated_by_version() {
        assert_eq!(
            call(Command::Check, r#"{"cniVersion":"0.3.1","name":"n"}"#).1.unwrap_err().code,
            codes::INCOMPATIBLE_VERSION
        );
        assert_eq!(call(Command::Check, r#"{"cniVersion":"0.4.0","name":"n"}"#).1.unwrap_err().msg, "checked");
        assert_eq!(
            call(Command::Gc, r#"{"cniVersion":"1.0.0","name":"n"}"#).1.unwrap_err().code,
            codes::INCOMPATIBLE_VERSION
        );
        assert!(call(Command::Status, r#"{"cniVersion":"1.1.0","name":"n"}"#).1.is_ok());
    }

    #[test]
    fn version_verb() {
        let (_, out) = call(Command::Version, "");
        let v = out.unwrap().unwrap();
        assert_eq!(v["supportedVersions"].as_array().unwrap().len(), SUPPORTED_VERSIONS.len());
        assert_eq!(v["cniVersion"], "1.1.0");
        let (_, out) = call(Command::Version, r#"{"cniVersion":"0.4.0"}"#);
        assert_eq!(out.unwrap().unwrap()["cniVersion"], "0.4.0");
    }

    #[test]
    fn prev_result_is_converted() {
        let stdin = r#"{"cniVersion":"1.0.0","name":"n","type":"fake",
            "prevResult":{"cniVersion":"0.2.0","ip4":{"ip":"10.9.0.2/16"}}}"#;
        let out = call(Command::Add, stdin).1.unwrap().unwrap();
        assert_eq!(out["ips"][0]["address"], "10.9.0.2/16");
        assert_eq!(out["cniVersion"], "1.0.0");
    }

    #[test]
    fn valid_attachments() {
        let ctx = Context {
            env: env(Command::Gc),
            stdin: br#"{"cni.dev/valid-attachments":[{"containerID":"a","ifname":"eth0"}]}"#.to_vec(),
            conf: NetConf::default(),
            version: Version::V110,
        };
        assert_eq!(ctx.valid_attachments().unwrap(), vec![("a".to_string(), "eth0".to_string())]);
    }
}
