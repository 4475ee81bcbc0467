//! The `CNI_*` environment, validated as the spec and libcni's skel do.

use super::error::{Error, Result};
use std::path::PathBuf;

/// The longest container ID accepted: runtimes use 64 hex characters; anything far longer is hostile input.
const MAX_CONTAINER_ID: usize = 256;
/// `IFNAMSIZ - 1`.
const MAX_IFNAME: usize = 15;
/// Bound on `CNI_ARGS` and path-like variables.
const MAX_ENV_VALUE: usize = 64 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    Add,
    Del,
    Check,
    Version,
    Gc,
    Status,
}

impl Command {
    pub fn parse(s: &str) -> Result<Command> {
        Ok(match s {
            "ADD" => Command::Add,
            "DEL" => Command::Del,
            "CHECK" => Command::Check,
            "VERSION" => Command::Version,
            "GC" => Command::Gc,
            "STATUS" => Command::Status,
            _ => return Err(Error::env(format!("unknown CNI_COMMAND: {:?}", truncate(s)))),
        })
    }
    pub fn as_str(self) -> &'static str {
        match self {
            Command::Add => "ADD",
            Command::Del => "DEL",
            Command::Check => "CHECK",
            Command::Version => "VERSION",
            Command::Gc => "GC",
            Command::Status => "STATUS",
        }
    }
    /// Verbs that act on one attachment and so need a container ID and an interface name.
    pub fn is_attachment_verb(self) -> bool {
        matches!(self, Command::Add | Command::Del | Command::Check)
    }
}

/// The validated environment of one invocation.
#[derive(Debug, Clone)]
pub struct Env {
    pub command: Command,
    pub container_id: String,
    /// `CNI_NETNS`; required for ADD and CHECK, optional for DEL.
    pub netns: Option<PathBuf>,
    pub ifname: String,
    pub args: CniArgs,
    /// The raw `CNI_ARGS`, passed on unchanged to delegated plugins.
    pub args_raw: String,
    pub path: Vec<PathBuf>,
}

impl Env {
    /// Reads and validates the environment through `get` (the process environment in plugins, a map in tests).
    pub fn from_getter(get: impl Fn(&str) -> Option<String>) -> Result<Env> {
        let command = Command::parse(&get("CNI_COMMAND").unwrap_or_default())?;
        if command == Command::Version {
            // VERSION needs nothing else, and runtimes fill the rest with anything (libcni's validation sends
            // CNI_NETNS=dummy CNI_PATH=dummy): it must answer whatever they hold.
            return Ok(Env {
                command,
                container_id: String::new(),
                netns: None,
                ifname: String::new(),
                args: CniArgs::default(),
                args_raw: String::new(),
                path: Vec::new(),
            });
        }
        let value = |name: &str| -> Result<Option<String>> {
            match get(name) {
                Some(v) if v.len() > MAX_ENV_VALUE => {
                    Err(Error::env(format!("{name} is longer than {MAX_ENV_VALUE} bytes")))
                }
                Some(v) if v.is_empty() => Ok(None),
                v => Ok(v),
            }
        };
        let mut missing = Vec::new();
        let mut require = |name: &'static str, required: bool| -> Result<String> {
            let v = value(name)?;
            if required && v.is_none() {
                missing.push(name);
            }
            Ok(v.unwrap_or_default())
        };
        let attachment = command.is_attachment_verb();
        let needs_netns = matches!(command, Command::Add | Command::Check);
        let container_id = require("CNI_CONTAINERID", attachment)?;
        let netns = require("CNI_NETNS", needs_netns)?;
        let ifname = require("CNI_IFNAME", attachment)?;
        let path = require("CNI_PATH", true)?;
        if !missing.is_empty() {
            return Err(Error::env(format!("required env variables [{}] missing", missing.join(","))));
        }
        let args_raw = value("CNI_ARGS")?.unwrap_or_default();
        if attachment {
            validate_container_id(&container_id)?;
            validate_ifname(&ifname)?;
        }
        let netns = if netns.is_empty() {
            None
        } else {
            if !netns.starts_with('/') || netns.contains('\0') {
                return Err(Error::env(format!("CNI_NETNS must be an absolute path, got {:?}", truncate(&netns))));
            }
            Some(PathBuf::from(netns))
        };
        Ok(Env {
            command,
            container_id,
            netns,
            ifname,
            args: parse_cni_args(&args_raw)?,
            args_raw,
            path: std::env::split_paths(&path).filter(|p| !p.as_os_str().is_empty()).collect(),
        })
    }

    pub fn from_process() -> Result<Env> {
        Env::from_getter(|k| std::env::var_os(k).map(|v| v.to_string_lossy().into_owned()))
    }
}

/// Container IDs as libcni accepts them: `^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$`, bounded in length.
pub fn validate_container_id(id: &str) -> Result<()> {
    let mut bytes = id.bytes();
    let first_ok = bytes.next().is_some_and(|b| b.is_ascii_alphanumeric());
    if !first_ok || !bytes.all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-')) {
        return Err(Error::env(format!("invalid characters in containerID {:?}", truncate(id))));
    }
    if id.len() > MAX_CONTAINER_ID {
        return Err(Error::env(format!("containerID is longer than {MAX_CONTAINER_ID} characters")));
    }
    Ok(())
}

/// Interface names as the kernel and libcni accept them.
pub fn validate_ifname(name: &str) -> Result<()> {
    let bad = |why: &str| Error::env(format!("invalid interface name {:?}: {why}", truncate(name)));
    if name.is_empty() {
        return Err(bad("empty"));
    }
    if name.len() > MAX_IFNAME {
        return Err(bad("longer than 15 bytes"));
    }
    if name == "." || name == ".." {
        return Err(bad("'.' and '..' are not allowed"));
    }
    if name.chars().any(|c| c == '/' || c == ':' || c.is_whitespace() || c.is_control()) {
        return Err(bad("contains '/', ':', whitespace or a control character"));
    }
    Ok(())
}

/// `CNI_ARGS`: `K=V;K=V`. Values are kept as given; plugins look up the keys they know.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CniArgs(pub Vec<(String, String)>);

pub fn parse_cni_args(raw: &str) -> Result<CniArgs> {
    let mut pairs = Vec::new();
    for pair in raw.split(';').filter(|p| !p.is_empty()) {
        let (k, v) = pair
            .split_once('=')
            .filter(|(k, v)| !k.is_empty() && !v.contains('='))
            .ok_or_else(|| Error::env(format!("CNI_ARGS: invalid pair {:?}", truncate(pair))))?;
        pairs.push((k.to_string(), v.to_string()));
    }
    Ok(CniArgs(pairs))
}

impl CniArgs {
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    /// `IgnoreUnknown=1` (or `true`) tolerates keys a plugin does not know, as libcni's LoadArgs does.
    pub fn ignore_unknown(&self) -> bool {
        self.get("IgnoreUnknown").is_some_and(|v| v == "1" || v.eq_ignore_ascii_case("true"))
    }

    /// Fails on keys outside `known` unless `IgnoreUnknown` is set. The Kubernetes keys are always known.
    pub fn check_known(&self, known: &[&str]) -> Result<()> {
        const ALWAYS: &[&str] =
            &["IgnoreUnknown", "K8S_POD_NAMESPACE", "K8S_POD_NAME", "K8S_POD_INFRA_CONTAINER_ID", "K8S_POD_UID"];
        if self.ignore_unknown() {
            return Ok(());
        }
        match self.0.iter().find(|(k, _)| !ALWAYS.contains(&k.as_str()) && !known.contains(&k.as_str())) {
            Some((k, _)) => Err(Error::env(format!("CNI_ARGS: unknown args [{:?}]", truncate(k)))),
            None => Ok(()),
        }
    }
}

/// Keeps hostile inputs from flooding an error message.
pub fn truncate(s: &str) -> String {
    const MAX: usize = 80;
    if s.len() <= MAX {
        return s.to_string();
    }
    let mut end = MAX;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::codes;
    use std::collections::HashMap;

    fn env(vars: &[(&str, &str)]) -> Result<Env> {
        let m: HashMap<String, String> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Env::from_getter(|k| m.get(k).cloned())
    }

    const FULL: &[(&str, &str)] = &[
        ("CNI_COMMAND", "ADD"),
        ("CNI_CONTAINERID", "abc123"),
        ("CNI_NETNS", "/run/netns/x"),
        ("CNI_IFNAME", "eth0"),
        ("CNI_PATH", "/opt/cni/bin:/usr/lib/cni"),
    ];

    fn with(over: &[(&'static str, &'static str)]) -> Vec<(&'static str, &'static str)> {
        let mut v: Vec<_> = FULL.iter().filter(|(k, _)| !over.iter().any(|(o, _)| o == k)).cloned().collect();
        v.extend(over.iter().filter(|(_, val)| !val.is_empty()));
        v
    }

    #[test]
    fn full_add_env() {
        let e = env(FULL).unwrap();
        assert_eq!(e.command, Command::Add);
        assert_eq!(e.path.len(), 2);
        assert_eq!(e.netns.as_deref(), Some(std::path::Path::new("/run/netns/x")));
    }

    #[test]
    fn required_vars_per_verb() {
        for (cmd, missing, ok) in [
            ("ADD", "CNI_NETNS", false),
            ("CHECK", "CNI_NETNS", false),
            ("DEL", "CNI_NETNS", true),
            ("DEL", "CNI_CONTAINERID", false),
            ("DEL", "CNI_IFNAME", false),
            ("ADD", "CNI_PATH", false),
            ("GC", "CNI_CONTAINERID", true),
            ("STATUS", "CNI_IFNAME", true),
            ("VERSION", "CNI_PATH", true),
        ] {
            let r = env(&with(&[("CNI_COMMAND", cmd), (missing, "")]));
            assert_eq!(r.is_ok(), ok, "{cmd} without {missing}");
            if let Err(e) = r {
                assert_eq!(e.code, codes::INVALID_ENV);
                assert!(e.msg.contains(missing), "{}", e.msg);
            }
        }
    }

    #[test]
    fn version_ignores_everything_else() {
        // libcni's ValidateNetworkList (podman) and hostile or stale runtimes.
        let dummy =
            [("CNI_COMMAND", "VERSION"), ("CNI_NETNS", "dummy"), ("CNI_IFNAME", "dummy"), ("CNI_PATH", "dummy")];
        assert_eq!(env(&dummy).unwrap().command, Command::Version);
        let hostile =
            [("CNI_COMMAND", "VERSION"), ("CNI_CONTAINERID", "a/b"), ("CNI_ARGS", "nonsense"), ("CNI_IFNAME", "x/y")];
        assert!(env(&hostile).unwrap().netns.is_none());
        assert!(env(&[("CNI_COMMAND", "VERSION")]).is_ok());
    }

    #[test]
    fn bad_values() {
        for over in [
            ("CNI_COMMAND", "FROB"),
            ("CNI_CONTAINERID", "-abc"),
            ("CNI_CONTAINERID", "a/b"),
            ("CNI_CONTAINERID", "a\nb"),
            ("CNI_IFNAME", "eth0:1"),
            ("CNI_IFNAME", "a/b"),
            ("CNI_IFNAME", ".."),
            ("CNI_IFNAME", "abcdefghijklmnop"),
            ("CNI_IFNAME", "et h"),
            ("CNI_NETNS", "run/netns/x"),
            ("CNI_ARGS", "IP"),
            ("CNI_ARGS", "=x"),
        ] {
            let e = env(&with(&[over])).unwrap_err();
            assert_eq!(e.code, codes::INVALID_ENV, "{over:?}");
        }
        let long = "a".repeat(300);
        let e = Env::from_getter(|k| match k {
            "CNI_CONTAINERID" => Some(long.clone()),
            _ => FULL.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string()),
        })
        .unwrap_err();
        assert_eq!(e.code, codes::INVALID_ENV);
        assert!(e.msg.len() < 200);
    }

    #[test]
    fn cni_args() {
        let a = parse_cni_args("IgnoreUnknown=1;IP=10.0.0.5,10.0.0.6;K8S_POD_NAME=x;").unwrap();
        assert_eq!(a.get("IP"), Some("10.0.0.5,10.0.0.6"));
        assert!(a.check_known(&[]).is_ok());
        let b = parse_cni_args("FOO=bar").unwrap();
        assert_eq!(b.check_known(&["IP"]).unwrap_err().code, codes::INVALID_ENV);
        assert!(parse_cni_args("FOO=bar").unwrap().check_known(&["FOO"]).is_ok());
        assert!(parse_cni_args("a=b=c").is_err());
        assert_eq!(parse_cni_args("").unwrap(), CniArgs::default());
    }
}
