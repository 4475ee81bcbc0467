//! The bad-input corpus (issue 7): hundreds of hostile or broken requests to every plugin and to the runner.
//!
//! Each plugin case must answer with one spec error object on stdout (`cniVersion`, `code`, a non-empty
//! message a person can read), the expected code, a non-zero exit, no panic, and no change at all to the node
//! or the pod: links, addresses, routes, iptables/nftables rules, qdiscs, sysctls and the state directories
//! are compared before and after every case ([`NodeSnapshot`]). Runner cases (cnitool) must fail with a message
//! on stderr (with the plugin's code when a plugin refused) and change nothing either.
//!
//! The cases of one plugin run one after the other in one node netns (one test per plugin, the tests run in
//! parallel). Every failure of a group is collected and reported together.
//!
//! `BAD_INPUT_VERBOSE=1` prints every case's answer, to review the messages.
//!
//! This file is the harness (cases, the rig, the checks, the cases every plugin shares); each plugin's cases and
//! its test are in the module named after it. A new plugin adds `<plugin>.rs` with `<plugin>_base`,
//! `<plugin>_cases` and a `#[test]` that runs them through [`run_group`], and a line in [`corpus_size`].

mod bandwidth;
mod bridge;
mod dhcp;
mod dummy;
mod firewall;
mod flannel;
mod host_device;
mod host_local;
mod ipvlan;
mod loopback;
mod macvlan;
mod portmap;
mod ptp;
mod runner;
mod sbr;
mod static_ipam;
mod tap;
mod tuning;
mod vlan;
mod vrf;

use std::fs;
use std::path::PathBuf;
use std::time::Duration;

use netns_tests::snapshot::NodeSnapshot;
use netns_tests::upstream::run_raw;
use netns_tests::{bin, bin_dir, json, Node, PluginOutput, TestNetns, Value};

/// The entry point's cap on stdin (cnicore's `MAX_STDIN`).
const MAX_STDIN: usize = 1 << 20;

/// Spec error codes.
const INCOMPATIBLE_VERSION: u64 = 1;
const UNKNOWN_CONTAINER: u64 = 3;
const INVALID_ENV: u64 = 4;
const IO: u64 = 5;
const DECODE: u64 = 6;
const INVALID_CONFIG: u64 = 7;
const INTERNAL: u64 = 999;

const SUPPORTED_VERSIONS: &[&str] = &["0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];
const NETWORK: &str = "bad-net";
const CONTAINER_ID: &str = "bad-input-ctr";

/// What a case must produce.
#[derive(Debug, Clone)]
enum Expect {
    /// A plugin's spec error object with this code.
    Code(u64),
    /// A runner failure; with `Some(code)` the failure is a plugin's error with that code.
    Runner(Option<u64>),
}

/// One request.
#[derive(Debug, Clone)]
struct Case {
    name: String,
    verb: &'static str,
    /// Changes to the valid environment: `(name, None)` unsets, `(name, Some(v))` sets.
    env: Vec<(&'static str, Option<String>)>,
    stdin: Vec<u8>,
    expect: Expect,
    /// A word the message must contain (case-insensitive), so that a case fails for its own reason.
    needle: Option<String>,
    /// Runner cases: the cnitool arguments and the conf dir's files.
    args: Vec<String>,
    files: Vec<(String, Vec<u8>)>,
}

impl Case {
    fn raw(name: impl Into<String>, verb: &'static str, stdin: impl Into<Vec<u8>>, code: u64) -> Case {
        Case {
            name: name.into(),
            verb,
            env: Vec::new(),
            stdin: stdin.into(),
            expect: Expect::Code(code),
            needle: None,
            args: Vec::new(),
            files: Vec::new(),
        }
    }

    fn conf(name: impl Into<String>, verb: &'static str, conf: &Value, code: u64) -> Case {
        Case::raw(name, verb, conf.to_string(), code)
    }

    fn env(mut self, var: &'static str, value: Option<&str>) -> Case {
        self.env.push((var, value.map(str::to_string)));
        self
    }

    /// Puts `depth` nested arrays into `args` (serde_json must stop at its recursion limit, not overflow the
    /// stack).
    fn nested_args(mut self, depth: usize) -> Case {
        let text = String::from_utf8(self.stdin).expect("utf-8");
        let head = &text[..text.len() - 1];
        self.stdin = format!(r#"{head},"args":{}{}}}"#, "[".repeat(depth), "]".repeat(depth)).into_bytes();
        self
    }

    fn with_code(mut self, code: u64) -> Case {
        self.expect = Expect::Code(code);
        self
    }

    fn needle(mut self, word: &str) -> Case {
        self.needle = Some(word.to_string());
        self
    }
}

/// `base` with the top-level `key` set to `value` (for keys with a `/`, such as `cni.dev/valid-attachments`).
fn with_top(base: &Value, key: &str, value: Value) -> Value {
    let mut conf = base.clone();
    conf[key] = value;
    conf
}

/// `base` with `key` set to `value` (a `/`-separated path into nested objects; `null` removes the key).
fn with(base: &Value, key: &str, value: Value) -> Value {
    let mut conf = base.clone();
    let mut target = &mut conf;
    let parts: Vec<&str> = key.split('/').collect();
    for part in &parts[..parts.len() - 1] {
        if !target.get(*part).is_some_and(Value::is_object) {
            target[*part] = json!({});
        }
        target = &mut target[*part];
    }
    let last = parts[parts.len() - 1];
    match value {
        Value::Null => {
            if let Some(o) = target.as_object_mut() {
                o.remove(last);
            }
        }
        v => target[last] = v,
    }
    conf
}

/// A node netns with an uplink-like veth to the pod (`vbi0` on the node, `eth0` in the pod, as a bridge
/// would have made it), a second veth inside the pod (`eth1` ↔ `eth1p`, whose peer is not on the node), and
/// a state directory for data dirs and caches, compared in every snapshot.
struct Rig {
    node: Node,
    pod: TestNetns,
    state: PathBuf,
    /// Conf dirs of runner cases: outside `state`, they are the input, not the state.
    confs: PathBuf,
}

const HOST_VETH: &str = "vbi0";

impl Rig {
    fn new() -> Rig {
        let node = Node::new();
        let pod = node.pod_with_eth0(HOST_VETH, "10.77.0.1/24", "10.77.0.2/24");
        let mut pod_nl = pod.netlink();
        pod_nl.create_veth("eth1", "eth1p", &pod.netns(), None, None).expect("veth inside the pod");
        let state = node.dir().join("state");
        let confs = node.dir().join("confs");
        for dir in [&state, &confs] {
            fs::create_dir_all(dir).expect("create dir");
        }
        Rig { node, pod, state, confs }
    }

    fn data_dir(&self) -> PathBuf {
        self.state.join("ipam")
    }

    fn cache_dir(&self) -> PathBuf {
        self.state.join("cache")
    }

    /// A valid `prevResult`: the pod's `eth0` with its host veth, as bridge returns it.
    fn prev_result(&self, version: &str) -> Value {
        json!({
            "cniVersion": version,
            "interfaces": [
                {"name": HOST_VETH, "mac": "02:00:00:00:00:01"},
                {"name": "eth0", "mac": "02:00:00:00:00:02", "sandbox": self.pod.path},
            ],
            "ips": [{"address": "10.77.0.2/24", "gateway": "10.77.0.1", "interface": 1}],
            "routes": [{"dst": "0.0.0.0/0", "gw": "10.77.0.1"}],
            "dns": {},
        })
    }

    fn snapshot(&self) -> (NodeSnapshot, NodeSnapshot) {
        let node = NodeSnapshot::take(&self.node, &[&self.state]);
        let pod = NodeSnapshot::take(&self.pod, &[]);
        (node, pod)
    }

    fn settled(&self) -> (NodeSnapshot, NodeSnapshot) {
        let node = NodeSnapshot::settled(&self.node, &[&self.state], Duration::from_secs(5));
        let pod = NodeSnapshot::settled(&self.pod, &[], Duration::from_secs(5));
        (node, pod)
    }

    /// Runs `plugin` in the node with the case's environment (a valid one, changed as the case says).
    fn run_plugin(&self, plugin: &str, ifname: &str, case: &Case) -> PluginOutput {
        let pod_path = self.pod.path.display().to_string();
        let path = bin_dir().display().to_string();
        let mut env: Vec<(&str, String)> = vec![
            ("CNI_COMMAND", case.verb.to_string()),
            ("CNI_CONTAINERID", CONTAINER_ID.to_string()),
            ("CNI_NETNS", pod_path),
            ("CNI_IFNAME", ifname.to_string()),
            ("CNI_PATH", path),
        ];
        for (var, value) in &case.env {
            env.retain(|(k, _)| k != var);
            if let Some(v) = value {
                env.push((var, v.clone()));
            }
        }
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        run_raw(&self.node, bin(plugin), &[], &env, &case.stdin)
    }

    /// Runs cnitool in the node with the case's arguments and a conf dir holding the case's files.
    fn run_runner(&self, index: usize, case: &Case) -> PluginOutput {
        let conf_dir = self.confs.join(index.to_string());
        fs::create_dir_all(&conf_dir).expect("conf dir");
        for (file, bytes) in &case.files {
            fs::write(conf_dir.join(file), bytes).expect("write conf");
        }
        let mut env: Vec<(&str, String)> = vec![
            ("NETCONFPATH", conf_dir.display().to_string()),
            ("CNI_PATH", bin_dir().display().to_string()),
            ("CNI_CACHE_DIR", self.cache_dir().display().to_string()),
        ];
        for (var, value) in &case.env {
            env.retain(|(k, _)| k != var);
            if let Some(v) = value {
                env.push((var, v.clone()));
            }
        }
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let args: Vec<&str> = case.args.iter().map(String::as_str).collect();
        run_raw(&self.node, bin("cnitool"), &args, &env, &case.stdin)
    }
}

/// Why a plugin's output is not the expected error, if it is not.
fn check_plugin_error(out: &PluginOutput, code: u64, needle: Option<&str>) -> Result<(), String> {
    if out.success() {
        return Err(format!("succeeded: stdout {:?}", out.stdout_text));
    }
    check_no_panic(out)?;
    let text = out.stdout_text.trim_end_matches('\n');
    if text.contains('\n') {
        return Err(format!("more than one line on stdout: {text:?}"));
    }
    let error: Value = serde_json::from_str(text)
        .map_err(|e| format!("stdout is not JSON ({e}): {text:?}; stderr {:?}", out.stderr))?;
    let fields = error.as_object().ok_or_else(|| format!("not an object: {error}"))?;
    if let Some(key) = fields.keys().find(|k| !["cniVersion", "code", "msg", "details"].contains(&k.as_str())) {
        return Err(format!("unexpected field {key}: {error}"));
    }
    let version = error["cniVersion"].as_str().unwrap_or_default();
    if !SUPPORTED_VERSIONS.contains(&version) {
        return Err(format!("bad cniVersion: {error}"));
    }
    let msg = error["msg"].as_str().unwrap_or_default();
    check_message(msg)?;
    if error["code"].as_u64() != Some(code) {
        return Err(format!("code {} instead of {code}: {error}", error["code"]));
    }
    if let Some(needle) = needle {
        if !msg.to_lowercase().contains(&needle.to_lowercase()) {
            return Err(format!("message does not mention {needle:?}: {msg:?}"));
        }
    }
    Ok(())
}

/// A message a person can act on: not empty, not huge, no Rust debug formatting.
fn check_message(msg: &str) -> Result<(), String> {
    if msg.trim().is_empty() {
        return Err("empty message".into());
    }
    if msg.len() > 1000 {
        return Err(format!("message of {} bytes: {:?}…", msg.len(), &msg[..200]));
    }
    for debug in ["Os {", "Error {", "kind: ", "Some(", "None)", "unwrap"] {
        if msg.contains(debug) {
            return Err(format!("message shows internals ({debug:?}): {msg:?}"));
        }
    }
    Ok(())
}

fn check_no_panic(out: &PluginOutput) -> Result<(), String> {
    for text in [&out.stderr, &out.stdout_text] {
        if text.contains("panicked") || text.contains("RUST_BACKTRACE") || text.contains("internal error:") {
            return Err(format!("panicked: {text}"));
        }
    }
    match out.status.code() {
        Some(_) => Ok(()),
        None => Err(format!("killed by a signal: {}", out.status)),
    }
}

fn check_runner_error(out: &PluginOutput, code: Option<u64>, needle: Option<&str>) -> Result<(), String> {
    if out.success() {
        return Err(format!("succeeded: stdout {:?}", out.stdout_text));
    }
    check_no_panic(out)?;
    if !out.stdout_text.trim().is_empty() {
        return Err(format!("printed on stdout: {:?}", out.stdout_text));
    }
    let msg = out.stderr.trim();
    if msg.is_empty() {
        return Err("no message on stderr".into());
    }
    if msg.len() > 4000 {
        return Err(format!("message of {} bytes", msg.len()));
    }
    if let Some(code) = code {
        if !msg.contains(&format!("(code {code})")) {
            return Err(format!("stderr does not give the plugin's code {code}: {msg:?}"));
        }
    }
    if let Some(needle) = needle {
        if !msg.to_lowercase().contains(&needle.to_lowercase()) {
            return Err(format!("message does not mention {needle:?}: {msg:?}"));
        }
    }
    Ok(())
}

/// Runs every case against `plugin` (or the runner, for "cnitool") and fails with every unexpected failure.
fn run_group(plugin: &str, ifname: &str, rig: &Rig, cases: Vec<Case>) {
    let mut names: Vec<&str> = cases.iter().map(|c| c.name.as_str()).collect();
    names.sort_unstable();
    if let Some(w) = names.windows(2).find(|w| w[0] == w[1]) {
        panic!("{plugin}: two cases named {:?}", w[0]);
    }
    let (mut node_before, mut pod_before) = rig.settled();
    let mut failures = Vec::new();
    for (index, case) in cases.iter().enumerate() {
        let out = if plugin == "cnitool" { rig.run_runner(index, case) } else { rig.run_plugin(plugin, ifname, case) };
        let mut problems = Vec::new();
        let verdict = match case.expect {
            Expect::Code(code) => check_plugin_error(&out, code, case.needle.as_deref()),
            Expect::Runner(code) => check_runner_error(&out, code, case.needle.as_deref()),
        };
        if let Err(why) = verdict {
            problems.push(why);
        }
        let (node_after, pod_after) = rig.snapshot();
        let node_diff = node_before.diff(&node_after);
        let pod_diff = pod_before.diff(&pod_after);
        let changed = node_diff.is_some() || pod_diff.is_some();
        if let Some(diff) = node_diff {
            problems.push(format!("the node changed:\n{diff}"));
        }
        if let Some(diff) = pod_diff {
            problems.push(format!("the pod changed:\n{diff}"));
        }
        // Later cases are judged against the state as it is now, so one change is reported once; after a change,
        // once it has settled (new links get IPv6 link-local addresses a moment later).
        (node_before, pod_before) = if changed { rig.settled() } else { (node_after, pod_after) };
        let label = format!("{plugin} [{index}] {} ({})", case.name, case.verb);
        if std::env::var_os("BAD_INPUT_VERBOSE").is_some() {
            let said = if plugin == "cnitool" { out.stderr.trim() } else { out.stdout_text.trim() };
            eprintln!("{label}: {said}");
        }
        if !problems.is_empty() {
            failures.push(format!("{label}: {}", problems.join("; ")));
        }
    }
    eprintln!("{plugin}: {} cases, {} failed", cases.len(), failures.len());
    assert!(
        failures.is_empty(),
        "{plugin}: {} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

/// A plugin's group ([`run_group`]), then its valid config `base` through ADD and DEL: the cases failed for their
/// own reason and left nothing in the way.
fn run_group_then_valid(plugin: &str, ifname: &str, rig: &Rig, cases: Vec<Case>, base: &Value) {
    run_group(plugin, ifname, rig, cases);
    rig.run_plugin(plugin, ifname, &Case::conf("valid", "ADD", base, 0)).expect_ok();
    rig.run_plugin(plugin, ifname, &Case::conf("valid", "DEL", base, 0)).expect_ok();
}

// ---------------------------------------------------------------------------------------------------------
// Cases every plugin shares: the entry point (JSON, types, versions, environment, names).
// ---------------------------------------------------------------------------------------------------------

/// `conf` padded with an unknown field to exactly `len` bytes.
fn padded(conf: &Value, len: usize) -> Vec<u8> {
    let mut text = conf.to_string().into_bytes();
    text.pop();
    let head = r#","pad":""#;
    let fill = len - text.len() - head.len() - 2;
    text.extend_from_slice(head.as_bytes());
    text.extend(std::iter::repeat_n(b'x', fill));
    text.extend_from_slice(b"\"}");
    assert_eq!(text.len(), len);
    text
}

/// Broken JSON: decode errors (code 6).
fn json_cases(base: &Value) -> Vec<Case> {
    let text = base.to_string();
    let half = text.len() / 2;
    vec![
        Case::raw("empty stdin", "ADD", "", DECODE),
        Case::raw("only whitespace", "ADD", " \n\t ", DECODE),
        Case::raw("open brace", "ADD", "{", DECODE),
        Case::raw("truncated in the middle", "ADD", &text[..half], DECODE),
        Case::raw("truncated last brace", "ADD", &text[..text.len() - 1], DECODE),
        Case::raw("truncated DEL", "DEL", &text[..text.len() / 3], DECODE),
        Case::raw("not json", "ADD", "cniVersion=1.0.0", DECODE),
        Case::raw("trailing garbage", "ADD", format!("{text} }}"), DECODE),
        Case::raw("double comma", "CHECK", text.replacen(',', ",,", 1), DECODE),
        Case::raw("single quotes", "ADD", text.replace('"', "'"), DECODE),
        Case::raw("invalid utf-8", "ADD", [&b"{\"cniVersion\":\"1.0.0\",\"name\":\"\xff\xfe\"}"[..]].concat(), DECODE),
        Case::raw("byte order mark", "ADD", [&b"\xef\xbb\xbf"[..], text.as_bytes()].concat(), DECODE),
        Case::raw("lone surrogate", "ADD", r#"{"cniVersion":"1.0.0","name":"\ud800"}"#, DECODE),
        Case::conf("args nested 100000 deep", "ADD", base, DECODE).nested_args(100_000),
        Case::raw("NaN", "ADD", r#"{"cniVersion":"1.0.0","name":"n","mtu":NaN}"#, DECODE),
        Case::raw("stdin over 1 MiB", "ADD", padded(base, MAX_STDIN + 1), DECODE),
        Case::raw("stdin of 8 MiB", "DEL", padded(base, 8 * MAX_STDIN), DECODE),
    ]
}

/// JSON of the wrong shape: invalid config (code 7).
fn type_cases(base: &Value) -> Vec<Case> {
    vec![
        Case::raw("an array", "ADD", "[1]", INVALID_CONFIG),
        Case::raw("a string", "ADD", "\"loopback\"", INVALID_CONFIG),
        Case::raw("a number", "DEL", "42", INVALID_CONFIG),
        Case::raw("null", "ADD", "null", INVALID_CONFIG),
        Case::conf("cniVersion a number", "ADD", &with(base, "cniVersion", json!(1.0)), INVALID_CONFIG),
        Case::conf("name a list", "ADD", &with(base, "name", json!(["a"])), INVALID_CONFIG),
        Case::conf("type an object", "ADD", &with(base, "type", json!({})), INVALID_CONFIG),
        Case::conf("capabilities a list", "ADD", &with(base, "capabilities", json!(["portMappings"])), INVALID_CONFIG),
        Case::conf("dns a string", "ADD", &with(base, "dns", json!("8.8.8.8")), INVALID_CONFIG),
        // serde quotes a wrongly typed string whole: the message must not carry 100 KiB of it.
        Case::conf("dns a 100 KiB string", "ADD", &with(base, "dns", json!("x".repeat(100 * 1024))), INVALID_CONFIG),
        // A duplicate key is not bad input: encoding/json takes the last one, and so do we (gojson's tests).
    ]
}

/// Versions the plugin or the verb does not support.
fn version_cases(base: &Value) -> Vec<Case> {
    vec![
        Case::conf("cniVersion 9.9.9", "ADD", &with(base, "cniVersion", json!("9.9.9")), INCOMPATIBLE_VERSION),
        Case::conf("cniVersion 1.2.0", "DEL", &with(base, "cniVersion", json!("1.2.0")), INCOMPATIBLE_VERSION),
        Case::conf("cniVersion 0.5.0", "ADD", &with(base, "cniVersion", json!("0.5.0")), INCOMPATIBLE_VERSION),
        // A malformed version string is a decoding failure in this suite (the reference says 1).
        Case::conf("cniVersion not semver", "ADD", &with(base, "cniVersion", json!("one")), DECODE),
        Case::conf(
            "cniVersion a 100 KiB string",
            "ADD",
            &with(base, "cniVersion", json!("1.".repeat(50 * 1024))),
            DECODE,
        ),
        Case::conf("CHECK at 0.3.1", "CHECK", &with(base, "cniVersion", json!("0.3.1")), INCOMPATIBLE_VERSION)
            .needle("CHECK"),
        Case::conf("GC at 1.0.0", "GC", &with(base, "cniVersion", json!("1.0.0")), INCOMPATIBLE_VERSION),
        Case::conf("STATUS at 0.4.0", "STATUS", &with(base, "cniVersion", json!("0.4.0")), INCOMPATIBLE_VERSION),
    ]
}

/// The environment: missing, malformed, hostile values (code 4), and a netns that does not exist.
fn env_cases(base: &Value, uses_netns: bool) -> Vec<Case> {
    let conf = base.to_string();
    let c = |name: &str, verb: &'static str| Case::raw(name, verb, conf.clone(), INVALID_ENV);
    let long = "a".repeat(70 * 1024);
    let mut cases = vec![
        c("unknown CNI_COMMAND", "ADD").env("CNI_COMMAND", Some("FROB")),
        c("lower-case CNI_COMMAND", "ADD").env("CNI_COMMAND", Some("add")),
        c("missing CNI_CONTAINERID", "ADD").env("CNI_CONTAINERID", None).needle("CNI_CONTAINERID"),
        c("missing CNI_IFNAME", "DEL").env("CNI_IFNAME", None).needle("CNI_IFNAME"),
        c("missing CNI_NETNS", "ADD").env("CNI_NETNS", None).needle("CNI_NETNS"),
        c("missing CNI_PATH", "ADD").env("CNI_PATH", None).needle("CNI_PATH"),
        c("empty CNI_CONTAINERID", "CHECK").env("CNI_CONTAINERID", Some("")),
        c("container ID ../", "ADD").env("CNI_CONTAINERID", Some("../../etc/passwd")),
        c("container ID with slash", "DEL").env("CNI_CONTAINERID", Some("a/b")),
        c("container ID with newline", "ADD").env("CNI_CONTAINERID", Some("ctr\n-A INPUT -j ACCEPT")),
        c("container ID with quote", "ADD").env("CNI_CONTAINERID", Some("ctr\" id: \"x")),
        c("container ID of 300 chars", "ADD").env("CNI_CONTAINERID", Some(&"c".repeat(300))),
        c("container ID starting with dash", "ADD").env("CNI_CONTAINERID", Some("-rf")),
        c("ifname of 16 bytes", "ADD").env("CNI_IFNAME", Some("abcdefghijklmnop")),
        c("ifname ..", "ADD").env("CNI_IFNAME", Some("..")),
        c("ifname with slash", "DEL").env("CNI_IFNAME", Some("../eth0")),
        c("ifname with colon", "ADD").env("CNI_IFNAME", Some("eth0:1")),
        c("ifname with newline", "ADD").env("CNI_IFNAME", Some("eth\n0")),
        c("ifname with space", "CHECK").env("CNI_IFNAME", Some("eth 0")),
        c("relative CNI_NETNS", "ADD").env("CNI_NETNS", Some("run/netns/pod")),
        c("dot CNI_NETNS", "DEL").env("CNI_NETNS", Some("./pod")),
        c("CNI_ARGS without =", "ADD").env("CNI_ARGS", Some("IP")),
        c("CNI_ARGS empty key", "ADD").env("CNI_ARGS", Some("=10.0.0.5")),
        c("CNI_ARGS two =", "ADD").env("CNI_ARGS", Some("IP=a=b")),
        c("CNI_ARGS over 64 KiB", "ADD").env("CNI_ARGS", Some(&format!("K8S_POD_NAME={long}"))),
        c("CNI_PATH over 64 KiB", "ADD").env("CNI_PATH", Some(&format!("/{long}"))),
    ];
    if uses_netns {
        cases.push(
            Case::raw("netns that does not exist", "ADD", conf.clone(), UNKNOWN_CONTAINER)
                .env("CNI_NETNS", Some("/run/netns/cnt-bad-input-no-such-netns")),
        );
        cases.push(
            Case::raw("netns that is a plain file", "ADD", conf, INTERNAL).env("CNI_NETNS", Some("/etc/hostname")),
        );
    }
    cases
}

/// Hostile network names (they become directory names, chain names and rule comments): code 7.
fn network_name_cases(base: &Value) -> Vec<Case> {
    let names = [
        ("network name ../", "../etc"),
        ("network name with slash", "a/b"),
        ("network name ..", ".."),
        ("network name empty", ""),
        ("network name with NUL", "bad\u{0}net"),
        ("network name with newline", "bad\nnet"),
        ("network name with quote", "bad\" id: \"x"),
        ("network name of 200 chars", &"n".repeat(200)),
        ("network name non-ascii", "réseau"),
    ];
    names
        .iter()
        .map(|(case, name)| {
            Case::conf(*case, "ADD", &with(base, "name", json!(name)), INVALID_CONFIG).needle("network name")
        })
        .collect()
}

fn common_cases(base: &Value, uses_netns: bool) -> Vec<Case> {
    let mut cases = json_cases(base);
    cases.extend(type_cases(base));
    cases.extend(version_cases(base));
    cases.extend(env_cases(base, uses_netns));
    cases.extend(network_name_cases(base));
    cases
}

/// Hostile iptables chain names in the config field `key` (they become `-j`/`-N` arguments): invalid config
/// naming the field.
fn chain_name_cases(base: &Value, key: &str) -> Vec<Case> {
    let names = [
        ("injection", "X\n-A INPUT -j ACCEPT".to_string()),
        ("with space", "CNI CHAIN".to_string()),
        ("of 29 chars", "C".repeat(29)),
        ("starting with dash", "-j".to_string()),
    ];
    names
        .into_iter()
        .map(|(case, name)| {
            Case::conf(format!("{key} {case}"), "ADD", &with(base, key, json!(name)), INVALID_CONFIG).needle(key)
        })
        .collect()
}

/// GC's list of valid attachments with an entry that names no interface (plugins with GC): invalid config.
fn gc_cases(base: &Value) -> Vec<Case> {
    vec![Case::conf(
        "GC valid-attachments without ifname",
        "GC",
        &with_top(
            &with(base, "cniVersion", json!("1.1.0")),
            "cni.dev/valid-attachments",
            json!([{"containerID": "x"}]),
        ),
        INVALID_CONFIG,
    )]
}

/// GC's list of valid attachments that is not a list: invalid config.
fn gc_attachments_not_a_list(base: &Value) -> Case {
    Case::conf(
        "GC with valid-attachments not a list",
        "GC",
        &with_top(&with(base, "cniVersion", json!("1.1.0")), "cni.dev/valid-attachments", json!({"containerID": "x"})),
        INVALID_CONFIG,
    )
}

/// STATUS (1.1.0) with an `ipam` section that has no type (plugins that pass STATUS on to IPAM).
fn status_with_bad_ipam(base: &Value) -> Case {
    Case::conf(
        "STATUS with bad ipam",
        "STATUS",
        &with(&with(base, "ipam", json!({"subnet": "x"})), "cniVersion", json!("1.1.0")),
        INVALID_CONFIG,
    )
}

/// The cases of a plugin that makes the pod interface itself and takes static IPAM after it (host-device,
/// tap): IPAM missing, a route IPAM asks for that the pod cannot take (after the interface is there: undone),
/// `CNI_IFNAME` already in the pod, CHECK without prevResult.
fn pod_interface_cases(base: &Value) -> Vec<Case> {
    vec![
        Case::conf("ipam plugin missing", "ADD", &with(base, "ipam/type", json!("no-such-ipam")), INVALID_CONFIG)
            .needle("no-such-ipam"),
        Case::conf(
            "route the pod cannot take",
            "ADD",
            &with(base, "ipam/routes", json!([{"dst": "10.99.0.0/16", "gw": "10.98.0.1"}])),
            INTERNAL,
        )
        .needle("route"),
        Case::conf("CNI_IFNAME taken in the pod", "ADD", base, INTERNAL)
            .env("CNI_IFNAME", Some("eth0"))
            .needle("exists"),
        Case::conf("CHECK without prevResult", "CHECK", base, INVALID_CONFIG).needle("prevResult"),
    ]
}

/// prevResult that cannot be read (chained plugins): decoding errors.
fn prev_result_cases(base: &Value) -> Vec<Case> {
    vec![
        Case::conf("prevResult a string", "ADD", &with(base, "prevResult", json!("10.0.0.2")), DECODE),
        Case::conf(
            "prevResult with a bad address",
            "ADD",
            &with(base, "prevResult", json!({"cniVersion": "1.0.0", "ips": [{"address": "10.0.0.300/24"}]})),
            DECODE,
        ),
        Case::conf(
            "prevResult with an interface index out of range",
            "ADD",
            &with(
                base,
                "prevResult",
                json!({"cniVersion": "1.0.0", "interfaces": [], "ips": [{"address": "10.0.0.2/24", "interface": 7}]}),
            ),
            DECODE,
        ),
        Case::conf(
            "prevResult of version 9.9.9",
            "ADD",
            &with(base, "prevResult", json!({"cniVersion": "9.9.9", "ips": []})),
            DECODE,
        ),
        Case::conf(
            "prevResult dns a 100 KiB string",
            "ADD",
            &with(base, "prevResult", json!({"cniVersion": "1.0.0", "dns": "x".repeat(100 * 1024)})),
            DECODE,
        ),
    ]
}

#[test]
fn corpus_size() {
    let rig = Rig::new();
    let counts = [
        ("loopback", loopback::loopback_cases().len()),
        ("host-local", host_local::host_local_cases(&rig).len()),
        ("bridge", bridge::bridge_cases(&rig).len()),
        ("portmap", portmap::portmap_cases(&rig).len()),
        ("firewall", firewall::firewall_cases(&rig).len()),
        ("bandwidth", bandwidth::bandwidth_cases(&rig).len()),
        ("tuning", tuning::tuning_cases(&rig).len()),
        ("flannel", flannel::flannel_cases(&rig).len()),
        ("static", static_ipam::static_cases().len()),
        ("host-device", host_device::host_device_cases(&rig).len()),
        ("tap", tap::tap_cases().len()),
        ("sbr", sbr::sbr_cases(&rig).len()),
        ("vrf", vrf::vrf_cases(&rig).len()),
        ("macvlan", macvlan::macvlan_cases(&rig).len()),
        ("ptp", ptp::ptp_cases(&rig).len()),
        ("ipvlan", ipvlan::ipvlan_cases(&rig).len()),
        ("vlan", vlan::vlan_cases(&rig).len()),
        ("dummy", dummy::dummy_cases(&rig).len()),
        ("dhcp", dhcp::dhcp_cases(&rig).len()),
        ("cnitool", runner::runner_cases(&rig).len()),
    ];
    let total: usize = counts.iter().map(|(_, n)| n).sum();
    eprintln!("bad-input cases: {counts:?}, total {total}");
    assert!(total >= 150, "{total} cases");
}

/// The snapshot sees every kind of change a plugin can make (so that "unchanged" means something).
#[test]
fn the_snapshot_sees_what_plugins_change() {
    let rig = Rig::new();
    let (before, _) = rig.settled();
    assert_eq!(before.diff(&NodeSnapshot::take(&rig.node, &[&rig.state])), None);

    let mut netlink = rig.node.netlink();
    let bridge = netlink.create_bridge("snap0", Some(1400)).expect("bridge");
    netlink.add_address(bridge.index, "10.99.0.1/24".parse().expect("net")).expect("address");
    let host = netlink.require_link(HOST_VETH).expect("veth");
    netlink.add_ingress_qdisc(host.index).expect("qdisc");
    rig.node.run(|| cnicore::sysctl::write("net/ipv4/ip_forward", "1")).expect("sysctl");
    let run = |program: &str, args: &[&str], stdin: &[u8]| {
        let out = rig.node.exec(program, args, &[], stdin);
        assert!(out.status.success(), "{program}: {}", String::from_utf8_lossy(&out.stderr));
    };
    run(
        "iptables-restore",
        &["--noflush"],
        b"*nat\n:SNAP-TEST - [0:0]\n-A SNAP-TEST -s 10.99.0.2/32 -j MASQUERADE\nCOMMIT\n",
    );
    run("ip6tables-restore", &["--noflush"], b"*filter\n:SNAP-TEST6 - [0:0]\nCOMMIT\n");
    run("nft", &["-f", "-"], b"table inet snaptest {\n chain c {\n type filter hook input priority 0;\n }\n}\n");
    fs::write(rig.state.join("lease"), "ctr\r\neth0").expect("file");

    let after = NodeSnapshot::take(&rig.node, &[&rig.state]);
    let diff = before.diff(&after).expect("a diff");
    for (section, needle) in [
        ("links", "snap0 kind=bridge up=false mtu=1400"),
        ("addresses", "snap0 10.99.0.1/24"),
        ("routes", "local 10.99.0.1 dev snap0"),
        ("tc", "qdisc vbi0 ingress"),
        ("sysctls", "net/ipv4/ip_forward=1"),
        ("iptables", "-A SNAP-TEST -s 10.99.0.2/32 -j MASQUERADE"),
        ("ip6tables", ":SNAP-TEST6"),
        ("nftables", "table inet snaptest"),
        ("files", "lease file size=9 mode=644"),
    ] {
        assert!(
            after.section(section).iter().any(|line| line.contains(needle)),
            "{section} lacks {needle:?}: {:?}",
            after.section(section)
        );
        assert!(diff.contains(needle), "diff lacks {needle:?}:\n{diff}");
    }
    // Counters and `# Generated` lines do not count as changes.
    run("ip", &["link", "set", "snap0", "up"], b"");
    let again = NodeSnapshot::take(&rig.node, &[&rig.state]);
    assert!(
        again.section("iptables").iter().all(|l| !l.starts_with('#') && !l.ends_with(']')),
        "{:?}",
        again.section("iptables")
    );
}
