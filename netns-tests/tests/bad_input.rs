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

use std::fs;
use std::path::PathBuf;
use std::time::Duration;

use netns_tests::snapshot::NodeSnapshot;
use netns_tests::upstream::run_raw;
use netns_tests::{bin, bin_dir, json, veth_between, Node, PluginOutput, TestNetns, Value};

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
        let pod = node.pod_netns();
        veth_between(
            &node,
            &pod,
            HOST_VETH,
            "eth0",
            &["10.77.0.1/24".parse().expect("net")],
            &["10.77.0.2/24".parse().expect("net")],
        );
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

// ---------------------------------------------------------------------------------------------------------
// Plugins.
// ---------------------------------------------------------------------------------------------------------

fn loopback_base() -> Value {
    json!({"cniVersion": "1.0.0", "name": NETWORK, "type": "loopback"})
}

fn loopback_cases() -> Vec<Case> {
    let base = loopback_base();
    let mut cases = common_cases(&base, true);
    cases.extend(prev_result_cases(&base));
    cases
}

#[test]
fn loopback() {
    let rig = Rig::new();
    run_group("loopback", "lo", &rig, loopback_cases());
    // The base config is valid: the cases failed for their own reason.
    let valid = Case::conf("valid", "ADD", &loopback_base(), 0);
    rig.run_plugin("loopback", "lo", &valid).expect_ok();
}

fn host_local_base(rig: &Rig) -> Value {
    json!({
        "cniVersion": "1.0.0",
        "name": NETWORK,
        "type": "bridge",
        "ipam": {
            "type": "host-local",
            "dataDir": rig.data_dir(),
            "ranges": [[{"subnet": "10.88.0.0/24"}], [{"subnet": "fd88::/64"}]],
            "routes": [{"dst": "0.0.0.0/0"}]
        }
    })
}

fn host_local_cases(rig: &Rig) -> Vec<Case> {
    let base = host_local_base(rig);
    let ipam = |key: &str, value: Value| with(&base, &format!("ipam/{key}"), value);
    let ranges = |sets: Value| ipam("ranges", sets);
    let add = |name: &str, conf: Value, needle: &str| Case::conf(name, "ADD", &conf, INVALID_CONFIG).needle(needle);
    let mut cases = common_cases(&base, false);
    cases.extend([
        add("no ipam section", with(&base, "ipam", Value::Null), "ipam"),
        add("ipam a string", with(&base, "ipam", json!("host-local")), "ipam"),
        add("no ranges nor subnet", ipam("ranges", Value::Null), "range"),
        add("empty range set", ranges(json!([[]])), "range"),
        add("ranges a string", ranges(json!("10.0.0.0/24")), "ranges"),
        add("subnet not a CIDR", ranges(json!([[{"subnet": "banana"}]])), "banana"),
        add("subnet /33", ranges(json!([[{"subnet": "10.0.0.0/33"}]])), "10.0.0.0/33"),
        add("subnet with host bits", ranges(json!([[{"subnet": "10.0.0.1/24"}]])), "host bits"),
        add("subnet /31 too small", ranges(json!([[{"subnet": "10.0.0.0/31"}]])), "too small"),
        add("subnet /127 too small", ranges(json!([[{"subnet": "fd00::/127"}]])), "too small"),
        add("subnet a number", ranges(json!([[{"subnet": 10}]])), "subnet"),
        add(
            "rangeStart outside subnet",
            ranges(json!([[{"subnet": "10.0.0.0/24", "rangeStart": "10.0.1.5"}]])),
            "rangeStart",
        ),
        add(
            "rangeEnd outside subnet",
            ranges(json!([[{"subnet": "10.0.0.0/24", "rangeEnd": "10.1.0.5"}]])),
            "rangeEnd",
        ),
        add(
            "rangeStart after rangeEnd",
            ranges(json!([[{"subnet": "10.0.0.0/24", "rangeStart": "10.0.0.50", "rangeEnd": "10.0.0.20"}]])),
            "after",
        ),
        add("rangeStart not an address", ranges(json!([[{"subnet": "10.0.0.0/24", "rangeStart": "ten"}]])), "ten"),
        add(
            "gateway outside subnet",
            ranges(json!([[{"subnet": "10.0.0.0/24", "gateway": "192.168.0.1"}]])),
            "gateway",
        ),
        add(
            "gateway of the other family",
            ranges(json!([[{"subnet": "10.0.0.0/24", "gateway": "fd00::1"}]])),
            "gateway",
        ),
        add("mixed families in a set", ranges(json!([[{"subnet": "10.0.0.0/24"}, {"subnet": "fd00::/64"}]])), "famil"),
        add(
            "overlapping range sets",
            ranges(json!([[{"subnet": "10.0.0.0/16"}], [{"subnet": "10.0.3.0/24"}]])),
            "overlap",
        ),
        add(
            "overlapping ranges in a set",
            ranges(json!([[{"subnet": "10.0.0.0/24"}, {"subnet": "10.0.0.0/25"}]])),
            "overlap",
        ),
        add("relative dataDir", ipam("dataDir", json!("var/lib/cni")), "dataDir"),
        add("dataDir with NUL", ipam("dataDir", json!("/tmp/x\u{0}y")), "dataDir"),
        add("dataDir a number", ipam("dataDir", json!(5)), "dataDir"),
        add("route dst not a CIDR", ipam("routes", json!([{"dst": "default"}])), "dst"),
        add("route gw of the other family", ipam("routes", json!([{"dst": "0.0.0.0/0", "gw": "fd00::1"}])), "gw"),
        add("route without dst", ipam("routes", json!([{"gw": "10.88.0.1"}])), "dst"),
        add("runtimeConfig.ips not an IP", with(&base, "runtimeConfig", json!({"ips": ["banana"]})), "banana"),
        add("runtimeConfig.ips a string", with(&base, "runtimeConfig", json!({"ips": "10.88.0.5"})), "ips"),
        add("args.cni.ips not an IP", with(&base, "args", json!({"cni": {"ips": ["10.88.0.300"]}})), "10.88.0.300"),
        add(
            "requested IP outside every range",
            with(&base, "runtimeConfig", json!({"ips": ["192.168.9.9"]})),
            "192.168.9.9",
        ),
        add("requested IP is the gateway", with(&base, "runtimeConfig", json!({"ips": ["10.88.0.1"]})), "gateway"),
        add(
            "two requested IPs in one range set",
            with(&base, "runtimeConfig", json!({"ips": ["10.88.0.5", "10.88.0.6"]})),
            "range set",
        ),
        add(
            "runtimeConfig.ipRanges bad subnet",
            with(&base, "runtimeConfig", json!({"ipRanges": [[{"subnet": "10.0.0.0/99"}]]})),
            "10.0.0.0/99",
        ),
        Case::conf("CNI_ARGS IP not an IP", "ADD", &base, INVALID_ENV)
            .env("CNI_ARGS", Some("IP=10.88.0.999"))
            .needle("10.88.0.999"),
        Case::conf("CNI_ARGS unknown key", "ADD", &base, INVALID_ENV).env("CNI_ARGS", Some("FOO=bar")).needle("FOO"),
        Case::conf("resolvConf missing", "ADD", &ipam("resolvConf", json!("/nonexistent/resolv.conf")), IO)
            .needle("resolv"),
        Case::conf("DEL with bad ranges", "DEL", &ranges(json!([[{"subnet": "banana"}]])), INVALID_CONFIG),
        Case::conf("CHECK with bad ranges", "CHECK", &ranges(json!([[{"subnet": "banana"}]])), INVALID_CONFIG),
        Case::conf(
            "GC with bad ranges",
            "GC",
            &with(&ranges(json!([[{"subnet": "banana"}]])), "cniVersion", json!("1.1.0")),
            INVALID_CONFIG,
        ),
        Case::conf(
            "GC with valid-attachments not a list",
            "GC",
            &with_top(
                &with(&base, "cniVersion", json!("1.1.0")),
                "cni.dev/valid-attachments",
                json!({"containerID": "x"}),
            ),
            INVALID_CONFIG,
        ),
        Case::conf(
            "STATUS with a relative dataDir",
            "STATUS",
            &with(&ipam("dataDir", json!("relative")), "cniVersion", json!("1.1.0")),
            INVALID_CONFIG,
        ),
        Case::conf(
            "two v4 sets at 0.2.0",
            "ADD",
            &with(
                &ranges(json!([[{"subnet": "10.0.0.0/24"}], [{"subnet": "10.1.0.0/24"}]])),
                "cniVersion",
                json!("0.2.0"),
            ),
            INCOMPATIBLE_VERSION,
        ),
    ]);
    cases
}

#[test]
fn host_local() {
    let rig = Rig::new();
    let cases = host_local_cases(&rig);
    run_group("host-local", "eth0", &rig, cases);
    let base = host_local_base(&rig);
    rig.run_plugin("host-local", "eth0", &Case::conf("valid", "ADD", &base, 0)).expect_ok();
    rig.run_plugin("host-local", "eth0", &Case::conf("valid", "DEL", &base, 0)).expect_ok();
}

fn bridge_base(rig: &Rig) -> Value {
    json!({
        "cniVersion": "1.0.0",
        "name": NETWORK,
        "type": "bridge",
        "bridge": "cbr-bad",
        "isGateway": true,
        "ipMasq": true,
        "ipam": {"type": "host-local", "dataDir": rig.data_dir(), "subnet": "10.89.0.0/24"}
    })
}

fn bridge_cases(rig: &Rig) -> Vec<Case> {
    let base = bridge_base(rig);
    let add = |name: &str, key: &str, value: Value, needle: &str| {
        Case::conf(name, "ADD", &with(&base, key, value), INVALID_CONFIG).needle(needle)
    };
    let mut cases = common_cases(&base, true);
    cases.extend([
        add("ipam without type", "ipam", json!({"subnet": "10.89.0.0/24"}), "type"),
        add("ipam a string", "ipam", json!("host-local"), "ipam"),
        add("ipam type ../", "ipam", json!({"type": "../../bin/sh"}), "../../bin/sh"),
        add("ipam type with NUL", "ipam", json!({"type": "host-local\u{0}"}), "type"),
        add("bridge name of 16 bytes", "bridge", json!("cbr-0123456789ab"), "bridge"),
        add("bridge name ../", "bridge", json!("../cbr0"), "bridge"),
        add("bridge name ..", "bridge", json!(".."), "bridge"),
        add("bridge name with space", "bridge", json!("cbr 0"), "bridge"),
        add("bridge name with newline", "bridge", json!("cbr\n0"), "bridge"),
        add("bridge name with NUL", "bridge", json!("cbr\u{0}"), "bridge"),
        add("bridge name with colon", "bridge", json!("cbr:0"), "bridge"),
        add("bridge name a number", "bridge", json!(0), "bridge"),
        add("mtu 67", "mtu", json!(67), "mtu"),
        add("mtu 65536", "mtu", json!(65536), "mtu"),
        add("mtu negative", "mtu", json!(-1500), "mtu"),
        add("mtu a string", "mtu", json!("1500"), "mtu"),
        add("mtu a 100 KiB string", "mtu", json!("9".repeat(100 * 1024)), "expected i64"),
        add("mtu huge", "mtu", json!(1u64 << 40), "mtu"),
        add("vlan 4095", "vlan", json!(4095), "vlan"),
        add("vlan negative", "vlan", json!(-1), "vlan"),
        add("vlanTrunk minID above maxID", "vlanTrunk", json!([{"minID": 20, "maxID": 10}]), "minID"),
        add("vlanTrunk minID alone", "vlanTrunk", json!([{"minID": 20}]), "maxID"),
        add("vlanTrunk maxID alone", "vlanTrunk", json!([{"maxID": 20}]), "minID"),
        add("vlanTrunk id 0", "vlanTrunk", json!([{"id": 0}]), "trunk"),
        add("vlanTrunk id 5000", "vlanTrunk", json!([{"id": 5000}]), "trunk"),
        add("vlanTrunk not a list", "vlanTrunk", json!({"id": 5}), "vlanTrunk"),
        add("unknown ipMasqBackend", "ipMasqBackend", json!("ebtables"), "ebtables"),
        add("nonMasqueradeCIDRs not a list", "nonMasqueradeCIDRs", json!("10.244.0.0/16"), "nonMasqueradeCIDRs"),
        add(
            "nonMasqueradeCIDRs an object",
            "nonMasqueradeCIDRs",
            json!({"cidr": "10.244.0.0/16"}),
            "nonMasqueradeCIDRs",
        ),
        add("nonMasqueradeCIDRs entry a number", "nonMasqueradeCIDRs", json!([16]), "nonMasqueradeCIDRs"),
        add("nonMasqueradeCIDRs entry without length", "nonMasqueradeCIDRs", json!(["10.244.0.0"]), "10.244.0.0"),
        add("nonMasqueradeCIDRs entry /33", "nonMasqueradeCIDRs", json!(["10.244.0.0/33"]), "10.244.0.0/33"),
        add("nonMasqueradeCIDRs entry /129", "nonMasqueradeCIDRs", json!(["fd00::/129"]), "fd00::/129"),
        add("nonMasqueradeCIDRs entry a name", "nonMasqueradeCIDRs", json!(["cluster"]), "cluster"),
        add(
            "nonMasqueradeCIDRs entry with newline",
            "nonMasqueradeCIDRs",
            json!(["10.0.0.0/8\n-j ACCEPT"]),
            "nonMasqueradeCIDRs",
        ),
        add(
            "nonMasqueradeCIDRs entry a 100 KiB string",
            "nonMasqueradeCIDRs",
            json!(["1".repeat(100 * 1024)]),
            "nonMasqueradeCIDRs",
        ),
        add("nonMasqueradeCIDRs of 257 entries", "nonMasqueradeCIDRs", json!(vec!["10.0.0.0/8"; 257]), "at most"),
        add("isGateway a string", "isGateway", json!("yes"), "isGateway"),
        add("runtimeConfig.mac not a MAC", "runtimeConfig", json!({"mac": "not-a-mac"}), "MAC"),
        add("runtimeConfig.mac multicast", "runtimeConfig", json!({"mac": "01:00:5e:00:00:01"}), "multicast"),
        add("args.cni.mac a number", "args", json!({"cni": {"mac": 5}}), "mac"),
        Case::conf("CNI_ARGS MAC not a MAC", "ADD", &base, INVALID_CONFIG)
            .env("CNI_ARGS", Some("MAC=zz:zz:zz:zz:zz:zz"))
            .needle("MAC"),
        Case::conf("CNI_ARGS unknown key", "ADD", &base, INVALID_ENV).env("CNI_ARGS", Some("FOO=bar")).needle("FOO"),
        Case::conf(
            "hairpin and promisc",
            "ADD",
            &with(&with(&base, "hairpinMode", json!(true)), "promiscMode", json!(true)),
            INVALID_CONFIG,
        ),
        Case::conf("ipMasq without ipam", "ADD", &with(&base, "ipam", Value::Null), INVALID_CONFIG).needle("ipam"),
        Case::conf(
            "disableContainerInterface with ipam",
            "ADD",
            &with(&base, "disableContainerInterface", json!(true)),
            INVALID_CONFIG,
        ),
        Case::conf(
            "a non-bridge link has the bridge name",
            "ADD",
            &with(&base, "bridge", json!(HOST_VETH)),
            INVALID_CONFIG,
        )
        .needle("not a bridge"),
        Case::conf("CNI_IFNAME already in the pod", "ADD", &base, INTERNAL)
            .env("CNI_IFNAME", Some("eth0"))
            .needle("already exists"),
        // Each with its own bridge name: a bridge left behind by one must not hide one left by the other.
        Case::conf(
            "ipam plugin not found",
            "ADD",
            &with(&with(&base, "ipam", json!({"type": "no-such-ipam"})), "bridge", json!("cbr-bad1")),
            INVALID_CONFIG,
        )
        .needle("no-such-ipam"),
        Case::conf(
            "ipam refuses its config",
            "ADD",
            &with(
                &with(
                    &base,
                    "ipam",
                    json!({"type": "host-local", "dataDir": rig.data_dir(), "subnet": "10.89.0.0/31"}),
                ),
                "bridge",
                json!("cbr-bad2"),
            ),
            INVALID_CONFIG,
        )
        .needle("too small"),
        Case::conf(
            "CHECK with bad mtu",
            "CHECK",
            &with(&with(&base, "mtu", json!(1)), "prevResult", rig.prev_result("1.0.0")),
            INVALID_CONFIG,
        ),
        Case::conf(
            "STATUS with bad ipam",
            "STATUS",
            &with(&with(&base, "ipam", json!({"subnet": "x"})), "cniVersion", json!("1.1.0")),
            INVALID_CONFIG,
        ),
    ]);
    cases
}

#[test]
fn bridge() {
    let rig = Rig::new();
    let cases = bridge_cases(&rig);
    run_group("bridge", "eth9", &rig, cases);
    let base = bridge_base(&rig);
    rig.run_plugin("bridge", "eth9", &Case::conf("valid", "ADD", &base, 0)).expect_ok();
    rig.run_plugin("bridge", "eth9", &Case::conf("valid", "DEL", &base, 0)).expect_ok();
}

fn portmap_base(rig: &Rig) -> Value {
    json!({
        "cniVersion": "1.0.0",
        "name": NETWORK,
        "type": "portmap",
        "capabilities": {"portMappings": true},
        "runtimeConfig": {"portMappings": [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}]},
        "prevResult": rig.prev_result("1.0.0")
    })
}

fn portmap_cases(rig: &Rig) -> Vec<Case> {
    let base = portmap_base(rig);
    let add = |name: &str, key: &str, value: Value, needle: &str| {
        Case::conf(name, "ADD", &with(&base, key, value), INVALID_CONFIG).needle(needle)
    };
    let mapping = |m: Value| json!({"portMappings": [m]});
    let map = |name: &str, m: Value, needle: &str| add(name, "runtimeConfig", mapping(m), needle);
    let mut cases = common_cases(&base, false);
    cases.extend(prev_result_cases(&base));
    cases.extend([
        map("hostPort 0", json!({"hostPort": 0, "containerPort": 80, "protocol": "tcp"}), "port"),
        map("hostPort 65536", json!({"hostPort": 65536, "containerPort": 80, "protocol": "tcp"}), "port"),
        map("containerPort negative", json!({"hostPort": 8080, "containerPort": -80, "protocol": "tcp"}), "port"),
        map("containerPort missing", json!({"hostPort": 8080, "protocol": "tcp"}), "container port"),
        map("hostPort a string", json!({"hostPort": "8080", "containerPort": 80, "protocol": "tcp"}), "hostPort"),
        map("hostPort a float", json!({"hostPort": 80.5, "containerPort": 80, "protocol": "tcp"}), "hostPort"),
        map("protocol icmp", json!({"hostPort": 8080, "containerPort": 80, "protocol": "icmp"}), "protocol"),
        map("protocol empty", json!({"hostPort": 8080, "containerPort": 80, "protocol": ""}), "protocol"),
        map(
            "protocol with newline",
            json!({"hostPort": 8080, "containerPort": 80, "protocol": "tcp\n-A INPUT"}),
            "protocol",
        ),
        map(
            "hostIP not an IP",
            json!({"hostPort": 8080, "containerPort": 80, "protocol": "tcp", "hostIP": "1.2.3"}),
            "hostIP",
        ),
        map(
            "hostIP a name",
            json!({"hostPort": 8080, "containerPort": 80, "protocol": "tcp", "hostIP": "localhost"}),
            "hostIP",
        ),
        map(
            "hostIP a CIDR",
            json!({"hostPort": 8080, "containerPort": 80, "protocol": "tcp", "hostIP": "10.0.0.0/8"}),
            "hostIP",
        ),
        add(
            "two mappings of one host port",
            "runtimeConfig",
            json!({"portMappings": [
                {"hostPort": 8080, "containerPort": 80, "protocol": "tcp"},
                {"hostPort": 8080, "containerPort": 81, "protocol": "TCP"}]}),
            "twice",
        ),
        add("portMappings an object", "runtimeConfig", json!({"portMappings": {"hostPort": 8080}}), "portMappings"),
        add("markMasqBit 32", "markMasqBit", json!(32), "markMasqBit"),
        add("markMasqBit negative", "markMasqBit", json!(-1), "markMasqBit"),
        add("markMasqBit a string", "markMasqBit", json!("13"), "markMasqBit"),
        Case::conf(
            "markMasqBit with externalSetMarkChain",
            "ADD",
            &with(&with(&base, "markMasqBit", json!(13)), "externalSetMarkChain", json!("KUBE-MARK-MASQ")),
            INVALID_CONFIG,
        )
        .needle("externalSetMarkChain"),
        add(
            "externalSetMarkChain injection",
            "externalSetMarkChain",
            json!("X\n-A INPUT -j ACCEPT"),
            "externalSetMarkChain",
        ),
        add("externalSetMarkChain with space", "externalSetMarkChain", json!("KUBE MARK"), "externalSetMarkChain"),
        add("externalSetMarkChain of 29 chars", "externalSetMarkChain", json!("K".repeat(29)), "externalSetMarkChain"),
        add("externalSetMarkChain starting with dash", "externalSetMarkChain", json!("-j"), "externalSetMarkChain"),
        add("unknown backend", "backend", json!("ebtables"), "ebtables"),
        add("backend a number", "backend", json!(1), "backend"),
        add("snat a string", "snat", json!("true"), "snat"),
        add("condition adds a target", "conditionsV4", json!(["-j", "ACCEPT"]), "-j"),
        add("condition adds a rule", "conditionsV4", json!(["-d", "10.0.0.0/8\n-A INPUT -j ACCEPT"]), "-d"),
        add(
            "condition match with a target",
            "conditionsV4",
            json!(["-m", "comment", "--comment", "x", "-j", "ACCEPT"]),
            "-j",
        ),
        add("condition with a goto", "conditionsV4", json!(["-s", "10.0.0.0/8", "-g", "KUBE-SERVICES"]), "-g"),
        add("condition with a table", "conditionsV4", json!(["-t", "filter"]), "-t"),
        add("nft condition ending the rule", "conditionsV4", json!(["ip", "daddr", "1.2.3.4", ";", "accept"]), ";"),
        add("nft condition with a verdict", "conditionsV4", json!(["ip", "daddr", "1.2.3.4", "accept"]), "accept"),
        add("nft condition setting the mark", "conditionsV6", json!(["meta", "mark", "set", "1"]), "set"),
        add("condition lone !", "conditionsV4", json!(["!"]), "!"),
        add("condition option without value", "conditionsV4", json!(["-d"]), "-d"),
        add("condition IPv6 address in V4", "conditionsV4", json!(["-d", "fd00::/64"]), "IPv4"),
        add("condition IPv4 address in V6", "conditionsV6", json!(["-s", "10.0.0.0/8"]), "IPv6"),
        add("condition bad interface", "conditionsV4", json!(["-i", "eth0\"; drop"]), "interface"),
        add("condition unknown addrtype", "conditionsV4", json!(["-m", "addrtype", "--dst-type", "EVIL"]), "EVIL"),
        add("conditions a string", "conditionsV4", json!("-d 10.0.0.0/8"), "conditionsV4"),
        Case::conf("missing prevResult", "ADD", &with(&base, "prevResult", Value::Null), INVALID_CONFIG)
            .needle("prevResult"),
        Case::conf(
            "missing prevResult, type a 100 KiB string",
            "ADD",
            &with(&with(&base, "prevResult", Value::Null), "type", json!("p".repeat(100 * 1024))),
            INVALID_CONFIG,
        )
        .needle("prevResult"),
        Case::conf("CHECK missing prevResult", "CHECK", &with(&base, "prevResult", Value::Null), INVALID_CONFIG)
            .needle("prevResult"),
        Case::conf("DEL with bad markMasqBit", "DEL", &with(&base, "markMasqBit", json!(99)), INVALID_CONFIG),
        Case::conf(
            "externalSetMarkChain with nftables",
            "ADD",
            &with(&with(&base, "backend", json!("nftables")), "externalSetMarkChain", json!("KUBE-MARK-MASQ")),
            INVALID_CONFIG,
        ),
        Case::conf(
            "GC valid-attachments without ifname",
            "GC",
            &with_top(
                &with(&base, "cniVersion", json!("1.1.0")),
                "cni.dev/valid-attachments",
                json!([{"containerID": "x"}]),
            ),
            INVALID_CONFIG,
        ),
    ]);
    cases
}

#[test]
fn portmap() {
    let rig = Rig::new();
    let cases = portmap_cases(&rig);
    run_group("portmap", "eth0", &rig, cases);
    let base = portmap_base(&rig);
    rig.run_plugin("portmap", "eth0", &Case::conf("valid", "ADD", &base, 0)).expect_ok();
    rig.run_plugin("portmap", "eth0", &Case::conf("valid", "DEL", &base, 0)).expect_ok();
}

fn firewall_base(rig: &Rig) -> Value {
    json!({
        "cniVersion": "1.0.0",
        "name": NETWORK,
        "type": "firewall",
        // Explicit: "" would look for firewalld on the machine's system bus, which tests never touch.
        "backend": "iptables",
        "dataDir": rig.state.join("firewall"),
        "prevResult": rig.prev_result("1.0.0")
    })
}

fn firewall_cases(rig: &Rig) -> Vec<Case> {
    let base = firewall_base(rig);
    let add = |name: &str, key: &str, value: Value, needle: &str| {
        Case::conf(name, "ADD", &with(&base, key, value), INVALID_CONFIG).needle(needle)
    };
    let same_bridge = with(&base, "ingressPolicy", json!("same-bridge"));
    let bridge_named = |name: &str| {
        let mut conf = same_bridge.clone();
        conf["prevResult"]["interfaces"][0]["name"] = json!(name);
        conf
    };
    let mut cases = common_cases(&base, false);
    cases.extend(prev_result_cases(&base));
    cases.extend([
        add("unknown backend", "backend", json!("ipfw"), "ipfw"),
        add("backend a number", "backend", json!(1), "backend"),
        add(
            "admin chain injection",
            "iptablesAdminChainName",
            json!("X\n-A INPUT -j ACCEPT"),
            "iptablesAdminChainName",
        ),
        add("admin chain with space", "iptablesAdminChainName", json!("CNI ADMIN"), "iptablesAdminChainName"),
        add("admin chain of 29 chars", "iptablesAdminChainName", json!("A".repeat(29)), "iptablesAdminChainName"),
        add("admin chain starting with dash", "iptablesAdminChainName", json!("-j"), "iptablesAdminChainName"),
        add("unknown ingressPolicy", "ingressPolicy", json!("closed"), "closed"),
        add("ingressPolicy a list", "ingressPolicy", json!(["same-bridge"]), "ingressPolicy"),
        add("firewalldZone with NUL", "firewalldZone", json!("a\u{0}b"), "firewalldZone"),
        add("firewalldZone a number", "firewalldZone", json!(7), "firewalldZone"),
        add("dataDir relative", "dataDir", json!("var/lib/cni"), "dataDir"),
        Case::conf(
            "same-bridge, bridge name injection",
            "ADD",
            &bridge_named("br0\n-A INPUT -j ACCEPT"),
            INVALID_CONFIG,
        )
        .needle("bridge name"),
        Case::conf("same-bridge, bridge name with quote", "ADD", &bridge_named("br\"0"), INVALID_CONFIG)
            .needle("bridge name"),
        Case::conf("same-bridge, bridge name of 16 bytes", "ADD", &bridge_named(&"b".repeat(16)), INVALID_CONFIG)
            .needle("bridge name"),
        Case::conf("same-bridge, empty bridge name", "ADD", &bridge_named(""), INVALID_CONFIG).needle("same-bridge"),
        Case::conf(
            "isolated, bridge name injection",
            "ADD",
            &with(&bridge_named("br0 -j ACCEPT"), "ingressPolicy", json!("isolated")),
            INVALID_CONFIG,
        )
        .needle("bridge name"),
        Case::conf(
            "isolated, empty bridge name",
            "ADD",
            &with(&bridge_named(""), "ingressPolicy", json!("isolated")),
            INVALID_CONFIG,
        )
        .needle("isolated"),
        Case::conf("missing prevResult", "ADD", &with(&base, "prevResult", Value::Null), INVALID_CONFIG)
            .needle("prevResult"),
        Case::conf("CHECK missing prevResult", "CHECK", &with(&base, "prevResult", Value::Null), INVALID_CONFIG)
            .needle("prevResult"),
        Case::conf("DEL with unknown backend", "DEL", &with(&base, "backend", json!("ipfw")), INVALID_CONFIG),
        Case::conf(
            "GC valid-attachments without ifname",
            "GC",
            &with_top(
                &with(&base, "cniVersion", json!("1.1.0")),
                "cni.dev/valid-attachments",
                json!([{"containerID": "x"}]),
            ),
            INVALID_CONFIG,
        ),
    ]);
    cases
}

#[test]
fn firewall() {
    let rig = Rig::new();
    let cases = firewall_cases(&rig);
    run_group("firewall", "eth0", &rig, cases);
    let base = firewall_base(&rig);
    rig.run_plugin("firewall", "eth0", &Case::conf("valid", "ADD", &base, 0)).expect_ok();
    rig.run_plugin("firewall", "eth0", &Case::conf("valid", "DEL", &base, 0)).expect_ok();
}

fn bandwidth_base(rig: &Rig) -> Value {
    json!({
        "cniVersion": "1.0.0",
        "name": NETWORK,
        "type": "bandwidth",
        "ingressRate": 1_000_000,
        "ingressBurst": 100_000,
        "egressRate": 2_000_000,
        "egressBurst": 200_000,
        "prevResult": rig.prev_result("1.0.0")
    })
}

fn bandwidth_cases(rig: &Rig) -> Vec<Case> {
    let base = bandwidth_base(rig);
    let add = |name: &str, key: &str, value: Value, needle: &str| {
        Case::conf(name, "ADD", &with(&base, key, value), INVALID_CONFIG).needle(needle)
    };
    let only = |fields: Value| {
        let mut conf = base.clone();
        for key in ["ingressRate", "ingressBurst", "egressRate", "egressBurst"] {
            if let Some(o) = conf.as_object_mut() {
                o.remove(key);
            }
        }
        for (k, v) in fields.as_object().expect("object") {
            conf[k] = v.clone();
        }
        conf
    };
    let limits =
        |name: &str, fields: Value, needle: &str| Case::conf(name, "ADD", &only(fields), INVALID_CONFIG).needle(needle);
    let mut cases = common_cases(&base, true);
    cases.extend(prev_result_cases(&base));
    cases.extend([
        limits("ingressRate without burst", json!({"ingressRate": 1_000_000}), "burst"),
        limits("ingressBurst without rate", json!({"ingressBurst": 1_000_000}), "rate"),
        limits("egressRate without burst", json!({"egressRate": 1_000_000}), "burst"),
        limits("egressBurst without rate", json!({"egressBurst": 1_000_000}), "rate"),
        limits("ingressRate 0 with a burst", json!({"ingressRate": 0, "ingressBurst": 100}), "rate"),
        limits("rate below 8 bit/s", json!({"egressRate": 4, "egressBurst": 8000}), "rate"),
        limits("burst below 8 bits", json!({"egressRate": 8000, "egressBurst": 4}), "burst"),
        limits("burst over 4 GB", json!({"ingressRate": 8000, "ingressBurst": 34_359_738_368u64}), "4GB"),
        limits("rate u64 max", json!({"ingressRate": u64::MAX, "ingressBurst": 8000}), "ingress"),
        limits("rate negative", json!({"ingressRate": -1, "ingressBurst": 8000}), "ingressRate"),
        limits("rate a float", json!({"ingressRate": 1.5e6, "ingressBurst": 8000}), "ingressRate"),
        limits("rate a string", json!({"egressRate": "1M", "egressBurst": 8000}), "egressRate"),
        limits("rate beyond u64", json!({"egressRate": 1e30, "egressBurst": 8000}), "egressRate"),
        Case::conf(
            "runtimeConfig.bandwidth a list",
            "ADD",
            &with(&only(json!({})), "runtimeConfig", json!({"bandwidth": [1000]})),
            INVALID_CONFIG,
        )
        .needle("bandwidth"),
        Case::conf(
            "runtimeConfig.bandwidth rate without burst",
            "ADD",
            &with(&only(json!({})), "runtimeConfig", json!({"bandwidth": {"egressRate": 8000}})),
            INVALID_CONFIG,
        )
        .needle("burst"),
        add("missing prevResult", "prevResult", Value::Null, "prevResult"),
        Case::conf(
            "prevResult without interfaces",
            "ADD",
            &with(&base, "prevResult", json!({"cniVersion": "1.0.0", "ips": [{"address": "10.77.0.2/24"}]})),
            INVALID_CONFIG,
        )
        .needle("interfaces"),
        Case::conf("pod interface missing", "ADD", &base, INTERNAL).env("CNI_IFNAME", Some("eth7")).needle("eth7"),
        Case::conf("pod interface's peer not on the host", "ADD", &base, INTERNAL).env("CNI_IFNAME", Some("eth1")).needle("host"),
        Case::conf(
            "host veth not in prevResult",
            "ADD",
            &with(&base, "prevResult", json!({"cniVersion": "1.0.0", "interfaces": [{"name": "other0"}, {"name": "eth0", "sandbox": rig.pod.path}], "ips": []})),
            INTERNAL,
        )
        .needle("peer"),
        Case::conf("CHECK with bad limits", "CHECK", &only(json!({"ingressRate": 5})), INVALID_CONFIG).needle("burst"),
    ]);
    cases
}

#[test]
fn bandwidth() {
    let rig = Rig::new();
    let cases = bandwidth_cases(&rig);
    run_group("bandwidth", "eth0", &rig, cases);
    let base = bandwidth_base(&rig);
    rig.run_plugin("bandwidth", "eth0", &Case::conf("valid", "ADD", &base, 0)).expect_ok();
    rig.run_plugin("bandwidth", "eth0", &Case::conf("valid", "DEL", &base, 0)).expect_ok();
}

fn tuning_base(rig: &Rig) -> Value {
    json!({
        "cniVersion": "1.0.0",
        "name": NETWORK,
        "type": "tuning",
        "dataDir": rig.state.join("tuning"),
        "mtu": 1400,
        "sysctl": {"net.ipv4.conf.IFNAME.arp_filter": "1"},
        "prevResult": rig.prev_result("1.0.0")
    })
}

fn tuning_cases(rig: &Rig) -> Vec<Case> {
    let base = tuning_base(rig);
    let add = |name: &str, key: &str, value: Value, needle: &str| {
        Case::conf(name, "ADD", &with(&base, key, value), INVALID_CONFIG).needle(needle)
    };
    let sysctl = |name: &str, key: &str| add(name, "sysctl", json!({"net.core.somaxconn": "999", key: "1"}), "net");
    let mut cases = common_cases(&base, true);
    cases.extend(prev_result_cases(&base));
    cases.extend([
        sysctl("sysctl outside net", "kernel.hostname"),
        sysctl("sysctl leaving net by ..", "net/../kernel/hostname"),
        sysctl("sysctl leaving net by .. in dotted form", "net.ipv4/../../kernel/hostname"),
        sysctl("sysctl a path to /etc", "../../etc/passwd"),
        sysctl("sysctl net alone", "net"),
        sysctl("sysctl vm", "vm.swappiness"),
        add("sysctl twice in two spellings", "sysctl", json!({"net.core.somaxconn": "1", "net/core/somaxconn": "2"}), "twice"),
        Case::raw(
            "sysctl key duplicated",
            "ADD",
            r#"{"cniVersion":"1.0.0","name":"bad-net","type":"tuning","sysctl":{"net.core.somaxconn":"1","net.core.somaxconn":"2"}}"#,
            INVALID_CONFIG,
        )
        .needle("duplicated"),
        add("sysctl a list", "sysctl", json!(["net.core.somaxconn"]), "sysctl"),
        add("sysctl value a number", "sysctl", json!({"net.core.somaxconn": 5}), "sysctl"),
        add("mtu negative", "mtu", json!(-1), "mtu"),
        add("mtu a string", "mtu", json!("1500"), "mtu"),
        add("mtu a float", "mtu", json!(1500.5), "mtu"),
        add("txQLen negative", "txQLen", json!(-1), "txQLen"),
        add("txQLen beyond u32", "txQLen", json!(1u64 << 33), "txQLen"),
        add("mac not a MAC", "mac", json!("nope"), "MAC"),
        add("mac multicast", "mac", json!("01:00:5e:00:00:01"), "multicast"),
        add("mac all zero", "mac", json!("00:00:00:00:00:00"), "zero"),
        add("promisc a string", "promisc", json!("yes"), "promisc"),
        add("allmulti a number", "allmulti", json!(1), "allmulti"),
        add("runtimeConfig.mac a number", "runtimeConfig", json!({"mac": 5}), "mac"),
        add("args.cni.mtu negative", "args", json!({"cni": {"mtu": -5}}), "mtu"),
        add("args.cni.sysctl hostile", "args", json!({"cni": {"sysctl": {"kernel.hostname": "x"}}}), "net"),
        Case::conf("CNI_ARGS MAC not a MAC", "ADD", &base, INVALID_CONFIG).env("CNI_ARGS", Some("IgnoreUnknown=1;MAC=zz")).needle("MAC"),
        Case::conf("CNI_ARGS unknown key", "ADD", &base, INVALID_ENV).env("CNI_ARGS", Some("FOO=1")).needle("FOO"),
        add("missing prevResult", "prevResult", Value::Null, "prevResult"),
        Case::conf("pod interface missing", "ADD", &base, INTERNAL).env("CNI_IFNAME", Some("eth7")).needle("eth7"),
        add("sysctl that does not exist", "sysctl", json!({"net.ipv4.conf.IFNAME.no_such_sysctl": "1"}), "no_such_sysctl")
            .with_code(INTERNAL),
        // Changed before the MTU: the sysctl is put back when the kernel refuses the MTU.
        add("MTU the kernel refuses", "mtu", json!(70000), "MTU").with_code(INTERNAL),
        Case::conf("CHECK with a hostile key", "CHECK", &with(&base, "sysctl", json!({"kernel.hostname": "x"})), INVALID_CONFIG)
            .needle("net"),
    ]);
    cases
}

#[test]
fn tuning() {
    let rig = Rig::new();
    // The data directory is bookkeeping that stays once made (as the reference's does); the cases judge files.
    fs::create_dir_all(rig.state.join("tuning")).expect("tuning dataDir");
    let cases = tuning_cases(&rig);
    run_group("tuning", "eth0", &rig, cases);
    let base = tuning_base(&rig);
    rig.run_plugin("tuning", "eth0", &Case::conf("valid", "ADD", &base, 0)).expect_ok();
    rig.run_plugin("tuning", "eth0", &Case::conf("valid", "DEL", &base, 0)).expect_ok();
}

/// The `subnet.env` files of the flannel cases (inputs, so outside the compared state directory), by name.
fn flannel_subnet_files(rig: &Rig) -> PathBuf {
    let dir = rig.node.dir().join("flannel-env");
    fs::create_dir_all(dir.join("a-directory")).expect("flannel env dir");
    let valid = "FLANNEL_NETWORK=10.66.0.0/16\nFLANNEL_SUBNET=10.66.5.1/24\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n";
    let files: &[(&str, &[u8])] = &[
        ("subnet.env", valid.as_bytes()),
        ("empty.env", b""),
        ("no-subnet.env", b"FLANNEL_NETWORK=10.66.0.0/16\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n"),
        ("no-network.env", b"FLANNEL_SUBNET=10.66.5.1/24\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n"),
        ("no-mtu.env", b"FLANNEL_NETWORK=10.66.0.0/16\nFLANNEL_SUBNET=10.66.5.1/24\nFLANNEL_IPMASQ=true\n"),
        ("subnet-octet.env", b"FLANNEL_NETWORK=10.66.0.0/16\nFLANNEL_SUBNET=10.66.5.300/24\nFLANNEL_MTU=1450\n"),
        ("subnet-no-length.env", b"FLANNEL_NETWORK=10.66.0.0/16\nFLANNEL_SUBNET=10.66.5.1\nFLANNEL_MTU=1450\n"),
        ("subnet-length-33.env", b"FLANNEL_NETWORK=10.66.0.0/16\nFLANNEL_SUBNET=10.66.5.1/33\nFLANNEL_MTU=1450\n"),
        ("subnet-words.env", b"FLANNEL_NETWORK=10.66.0.0/16\nFLANNEL_SUBNET=$(reboot)\nFLANNEL_MTU=1450\n"),
        ("network-bad.env", b"FLANNEL_NETWORK=10.66.0.0/16,nope\nFLANNEL_SUBNET=10.66.5.1/24\nFLANNEL_MTU=1450\n"),
        ("ipv6-subnet-bad.env", b"FLANNEL_IPV6_NETWORK=fd66::/56\nFLANNEL_IPV6_SUBNET=fd66::g/64\nFLANNEL_MTU=1450\n"),
        ("mtu-words.env", b"FLANNEL_NETWORK=10.66.0.0/16\nFLANNEL_SUBNET=10.66.5.1/24\nFLANNEL_MTU=big\n"),
        ("mtu-negative.env", b"FLANNEL_NETWORK=10.66.0.0/16\nFLANNEL_SUBNET=10.66.5.1/24\nFLANNEL_MTU=-1\n"),
        ("mtu-beyond-u32.env", b"FLANNEL_NETWORK=10.66.0.0/16\nFLANNEL_SUBNET=10.66.5.1/24\nFLANNEL_MTU=4294967296\n"),
        ("binary.env", b"\xff\xfe\x00\x01FLANNEL_SUBNET=\xff\n\x00\x00"),
    ];
    for (name, bytes) in files {
        fs::write(dir.join(name), bytes).expect("write subnet.env");
    }
    fs::write(dir.join("huge.env"), valid.repeat(100_000)).expect("write huge subnet.env");
    let fifo = dir.join("fifo.env");
    if !fifo.exists() {
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).expect("mkfifo");
    }
    dir
}

fn flannel_base(rig: &Rig) -> Value {
    json!({
        "cniVersion": "1.0.0",
        "name": NETWORK,
        "type": "flannel",
        "subnetFile": flannel_subnet_files(rig).join("subnet.env"),
        "dataDir": rig.state.join("flannel"),
        "ipam": {"dataDir": rig.data_dir()},
        "delegate": {"bridge": "flbad0"}
    })
}

fn flannel_cases(rig: &Rig) -> Vec<Case> {
    let base = flannel_base(rig);
    let env_dir = flannel_subnet_files(rig);
    let data_dir = rig.state.join("flannel");
    let add = |name: &str, key: &str, value: Value, needle: &str| {
        Case::conf(name, "ADD", &with(&base, key, value), INVALID_CONFIG).needle(needle)
    };
    let subnet_file = |name: &str, file: &str, code: u64, needle: &str| {
        Case::conf(name, "ADD", &with(&base, "subnetFile", json!(env_dir.join(file))), code).needle(needle)
    };
    let mut cases = common_cases(&base, true);
    cases.extend(prev_result_cases(&base));
    cases.extend([
        // subnet.env: where the node agent tells the node's subnet.
        subnet_file("subnetFile missing", "no-such.env", IO, "no-such.env"),
        subnet_file("subnetFile a directory", "a-directory", IO, "a-directory"),
        subnet_file("subnetFile a FIFO nobody writes", "fifo.env", IO, "fifo.env"),
        subnet_file("subnetFile of 8 MB", "huge.env", IO, "huge.env"),
        add("subnetFile /dev/zero", "subnetFile", json!("/dev/zero"), "/dev/zero").with_code(IO),
        add("subnetFile relative", "subnetFile", json!("run/flannel/subnet.env"), "subnetFile"),
        add(
            "subnetFile with ..",
            "subnetFile",
            json!(format!("{}/../flannel-env/subnet.env", env_dir.display())),
            "subnetFile",
        ),
        add("subnetFile a number", "subnetFile", json!(5), "subnetFile"),
        subnet_file("subnet.env empty", "empty.env", INVALID_CONFIG, "missing FLANNEL_NETWORK"),
        subnet_file("subnet.env without FLANNEL_SUBNET", "no-subnet.env", INVALID_CONFIG, "missing FLANNEL_SUBNET"),
        subnet_file("subnet.env without FLANNEL_NETWORK", "no-network.env", INVALID_CONFIG, "missing FLANNEL_NETWORK"),
        subnet_file("subnet.env without FLANNEL_MTU", "no-mtu.env", INVALID_CONFIG, "missing FLANNEL_MTU"),
        subnet_file("FLANNEL_SUBNET octet 300", "subnet-octet.env", INVALID_CONFIG, "FLANNEL_SUBNET"),
        subnet_file("FLANNEL_SUBNET without length", "subnet-no-length.env", INVALID_CONFIG, "FLANNEL_SUBNET"),
        subnet_file("FLANNEL_SUBNET length 33", "subnet-length-33.env", INVALID_CONFIG, "FLANNEL_SUBNET"),
        subnet_file("FLANNEL_SUBNET a command", "subnet-words.env", INVALID_CONFIG, "FLANNEL_SUBNET"),
        subnet_file("FLANNEL_NETWORK with garbage", "network-bad.env", INVALID_CONFIG, "FLANNEL_NETWORK"),
        subnet_file("FLANNEL_IPV6_SUBNET malformed", "ipv6-subnet-bad.env", INVALID_CONFIG, "FLANNEL_IPV6_SUBNET"),
        subnet_file("FLANNEL_MTU a word", "mtu-words.env", INVALID_CONFIG, "FLANNEL_MTU"),
        subnet_file("FLANNEL_MTU negative", "mtu-negative.env", INVALID_CONFIG, "FLANNEL_MTU"),
        subnet_file("FLANNEL_MTU beyond u32", "mtu-beyond-u32.env", INVALID_CONFIG, "FLANNEL_MTU"),
        subnet_file("subnet.env binary", "binary.env", INVALID_CONFIG, "FLANNEL_SUBNET"),
        // dataDir: where the delegate's config is saved for DEL, one file per container.
        add("dataDir relative", "dataDir", json!("var/lib/cni/flannel"), "dataDir"),
        add("dataDir with ..", "dataDir", json!(format!("{}/../escaped", data_dir.display())), "dataDir"),
        add("dataDir with NUL", "dataDir", json!(format!("{}\u{0}x", data_dir.display())), "dataDir"),
        add("dataDir a list", "dataDir", json!(["/var/lib/cni"]), "dataDir"),
        add("dataDir a regular file", "dataDir", json!(rig.state.join("not-a-directory")), "not-a-directory")
            .with_code(IO),
        Case::conf("DEL with a relative dataDir", "DEL", &with(&base, "dataDir", json!("flannel")), INVALID_CONFIG)
            .needle("dataDir"),
        Case::conf(
            "DEL with a dataDir with ..",
            "DEL",
            &with(&base, "dataDir", json!(format!("{}/../escaped", data_dir.display()))),
            INVALID_CONFIG,
        )
        .needle("dataDir"),
        Case::conf("DEL of a saved config with a hostile type", "DEL", &base, INVALID_CONFIG)
            .env("CNI_CONTAINERID", Some("saved-hostile-type"))
            .needle("plugin type"),
        Case::conf("DEL of a saved config of an unknown plugin", "DEL", &base, INVALID_CONFIG)
            .env("CNI_CONTAINERID", Some("saved-unknown-type"))
            .needle("no-such-plugin"),
        // The delegate: the plugin flannel runs with the completed config.
        add("delegate a string", "delegate", json!("bridge"), "delegate"),
        add("delegate a list", "delegate", json!([{"type": "bridge"}]), "delegate"),
        add("delegate a number", "delegate", json!(1), "delegate"),
        add("delegate type a number", "delegate", json!({"type": 7}), "type"),
        add("delegate type ../x", "delegate", json!({"type": "../x"}), "plugin type"),
        add("delegate type an absolute path", "delegate", json!({"type": "/bin/sh"}), "plugin type"),
        add("delegate type ..", "delegate", json!({"type": ".."}), "plugin type"),
        add("delegate type empty", "delegate", json!({"type": ""}), "plugin type"),
        add("delegate type with newline", "delegate", json!({"type": "bridge\n"}), "plugin type"),
        add("delegate type unknown", "delegate", json!({"type": "no-such-plugin"}), "no-such-plugin"),
        add("delegate with a name", "delegate", json!({"name": "other"}), "name"),
        add("delegate with an ipam", "delegate", json!({"ipam": {"type": "host-local"}}), "ipam"),
        Case::conf("no delegate in CNI_PATH", "ADD", &base, INVALID_CONFIG)
            .env("CNI_PATH", Some("/nonexistent/cni/bin"))
            .needle("bridge"),
        // ipam and runtimeConfig: merged into the delegate's config.
        add("ipam a string", "ipam", json!("host-local"), "ipam"),
        add("ipam routes an object", "ipam/routes", json!({"dst": "0.0.0.0/0"}), "routes"),
        add("runtimeConfig a string", "runtimeConfig", json!("portMappings"), "runtimeConfig"),
        add("runtimeConfig a list", "runtimeConfig", json!([1]), "runtimeConfig"),
    ]);
    cases
}

#[test]
fn flannel() {
    let rig = Rig::new();
    // The data directory is bookkeeping that stays once made; the cases judge the files in it. Two saved configs
    // DEL must refuse to run.
    let data_dir = rig.state.join("flannel");
    fs::create_dir_all(&data_dir).expect("flannel dataDir");
    fs::write(data_dir.join("saved-hostile-type"), r#"{"cniVersion":"1.0.0","name":"bad-net","type":"../../bin/sh"}"#)
        .expect("saved config");
    fs::write(
        data_dir.join("saved-unknown-type"),
        r#"{"cniVersion":"1.0.0","name":"bad-net","type":"no-such-plugin"}"#,
    )
    .expect("saved config");
    fs::write(rig.state.join("not-a-directory"), "").expect("a file");
    let cases = flannel_cases(&rig);
    run_group("flannel", "eth2", &rig, cases);
    // The base config is valid: flannel completes it, bridge and host-local attach eth2, DEL removes it.
    let base = flannel_base(&rig);
    let result = rig.run_plugin("flannel", "eth2", &Case::conf("valid", "ADD", &base, 0)).expect_ok().clone();
    assert_eq!(result["ips"][0]["address"], "10.66.5.2/24", "{result}");
    assert!(data_dir.join(CONTAINER_ID).exists(), "the delegate's config is saved for DEL");
    rig.run_plugin("flannel", "eth2", &Case::conf("valid", "DEL", &base, 0)).expect_ok();
    assert!(!data_dir.join(CONTAINER_ID).exists(), "DEL removes the saved config");
}

// ---------------------------------------------------------------------------------------------------------
// The runner.
// ---------------------------------------------------------------------------------------------------------

fn runner_case(name: &str, args: &[&str], files: &[(&str, &[u8])], code: Option<u64>) -> Case {
    Case {
        name: name.to_string(),
        verb: "-",
        env: Vec::new(),
        stdin: Vec::new(),
        expect: Expect::Runner(code),
        needle: None,
        args: args.iter().map(|a| a.to_string()).collect(),
        files: files.iter().map(|(f, b)| (f.to_string(), b.to_vec())).collect(),
    }
}

fn runner_cases(rig: &Rig) -> Vec<Case> {
    let pod = rig.pod.path.display().to_string();
    let pod = pod.as_str();
    let list =
        |plugins: Value| json!({"cniVersion": "1.0.0", "name": NETWORK, "plugins": plugins}).to_string().into_bytes();
    let lo = list(json!([{"type": "loopback"}]));
    let file = |bytes: &[u8]| -> Vec<(&str, Vec<u8>)> { vec![("10-bad.conflist", bytes.to_vec())] };
    let case = |name: &str, args: &[&str], files: Vec<(&str, Vec<u8>)>, code: Option<u64>| {
        let refs: Vec<(&str, &[u8])> = files.iter().map(|(f, b)| (*f, b.as_slice())).collect();
        runner_case(name, args, &refs, code)
    };
    let add = |name: &str, bytes: &[u8], code: Option<u64>| case(name, &["add", NETWORK, pod], file(bytes), code);
    let with_list = |conf: Value| conf.to_string().into_bytes();
    let text = String::from_utf8(lo.clone()).expect("utf-8");
    let padded_plugin = json!({"type": "loopback", "pad": "x".repeat(MAX_STDIN + 10)});
    let bridge = |extra: (&str, Value)| {
        let mut b = bridge_base(rig);
        if let Some(o) = b.as_object_mut() {
            o.remove("cniVersion");
            o.remove("name");
        }
        b[extra.0] = extra.1;
        b
    };
    vec![
        add("conflist not JSON", b"{", None).needle("parsing"),
        add("conflist truncated", &lo[..lo.len() / 2], None).needle("parsing"),
        add("conflist a list", b"[]", None).needle("parsing"),
        add(
            "conflist without name",
            &with_list(json!({"cniVersion": "1.0.0", "plugins": [{"type": "loopback"}]})),
            None,
        ),
        add(
            "conflist name a number",
            &with_list(json!({"cniVersion": "1.0.0", "name": 5, "plugins": [{"type": "loopback"}]})),
            None,
        ),
        add(
            "conflist name ../",
            &with_list(json!({"cniVersion": "1.0.0", "name": "../x", "plugins": [{"type": "loopback"}]})),
            None,
        )
        .needle("network name"),
        add(
            "conflist name with NUL",
            &with_list(json!({"cniVersion": "1.0.0", "name": "bad\u{0}net", "plugins": [{"type": "loopback"}]})),
            None,
        )
        .needle("network name"),
        add(
            "conflist name with newline",
            &with_list(json!({"cniVersion": "1.0.0", "name": "bad\nnet", "plugins": [{"type": "loopback"}]})),
            None,
        )
        .needle("network name"),
        add("no plugins", &list(json!([])), None).needle("plugins"),
        add(
            "plugins not a list",
            &with_list(json!({"cniVersion": "1.0.0", "name": NETWORK, "plugins": {"type": "loopback"}})),
            None,
        ),
        add("plugin without type", &list(json!([{"name": "x"}])), None).needle("type"),
        add("plugin type ../", &list(json!([{"type": "../../../../bin/true"}])), None).needle("plugin type"),
        add("plugin type absolute", &list(json!([{"type": "/bin/true"}])), None).needle("plugin type"),
        add("plugin type not installed", &list(json!([{"type": "no-such-plugin"}])), None).needle("no-such-plugin"),
        add(
            "cniVersion 9.9.9",
            &with_list(json!({"cniVersion": "9.9.9", "name": NETWORK, "plugins": [{"type": "loopback"}]})),
            None,
        )
        .needle("incompatible"),
        add(
            "cniVersion a number",
            &with_list(json!({"cniVersion": 1, "name": NETWORK, "plugins": [{"type": "loopback"}]})),
            None,
        )
        .needle("cniVersion"),
        add("conflist over 1 MiB for the plugin", &list(json!([padded_plugin])), Some(DECODE)),
        add("conflist of 2 MiB of junk", &vec![b'['; 2 * MAX_STDIN], None),
        add("conflist a 100 KiB string", format!("\"{}\"", "x".repeat(100 * 1024)).as_bytes(), None),
        add("bridge refuses its mtu", &list(json!([bridge(("mtu", json!(1)))])), Some(INVALID_CONFIG)).needle("mtu"),
        add("bridge refuses its name", &list(json!([bridge(("bridge", json!("../../x")))])), Some(INVALID_CONFIG)),
        add(
            "portmap first without prevResult",
            &list(json!([{"type": "portmap", "capabilities": {"portMappings": true}}])),
            Some(INVALID_CONFIG),
        )
        .env("CAP_ARGS", Some(r#"{"portMappings":[{"hostPort":8080,"containerPort":80,"protocol":"tcp"}]}"#)),
        add(
            "bandwidth first without prevResult",
            &list(json!([{"type": "bandwidth", "ingressRate": 8000, "ingressBurst": 800}])),
            Some(INVALID_CONFIG),
        ),
        add("CAP_ARGS not JSON", &lo, None).env("CAP_ARGS", Some("{portMappings")).needle("CAP_ARGS"),
        add("CAP_ARGS a list", &lo, None).env("CAP_ARGS", Some("[1,2]")).needle("CAP_ARGS"),
        add("CNI_ARGS without =", &lo, None).env("CNI_ARGS", Some("IP")).needle("CNI_ARGS"),
        add("CNI_ARGS empty value", &lo, None).env("CNI_ARGS", Some("IP=")).needle("CNI_ARGS"),
        add("CNI_IFNAME of 16 bytes", &lo, None).env("CNI_IFNAME", Some("abcdefghijklmnop")).needle("interface name"),
        add("CNI_IFNAME ../", &lo, None).env("CNI_IFNAME", Some("../x")).needle("interface name"),
        add("CNI_IFNAME with newline", &lo, None).env("CNI_IFNAME", Some("eth\n0")).needle("interface name"),
        case(
            "pod netns that does not exist",
            &["add", NETWORK, "/run/netns/cnt-bad-input-no-such-netns"],
            file(&lo),
            Some(UNKNOWN_CONTAINER),
        ),
        case("pod netns relative and missing", &["add", NETWORK, "no/such/netns"], file(&lo), Some(UNKNOWN_CONTAINER)),
        case("network not found", &["add", "no-such-net", pod], file(&lo), None).needle("no-such-net"),
        case("network name ../ on the command line", &["add", "../10-bad", pod], file(&lo), None),
        case("conf dir missing", &["add", NETWORK, pod], vec![], None).env("NETCONFPATH", Some("/nonexistent/net.d")),
        case("CHECK at 0.3.1", &["check", NETWORK, pod], file(text.replace("1.0.0", "0.3.1").as_bytes()), None)
            .needle("CHECK"),
        case("GC --valid without ifname", &["gc", NETWORK, "--valid", "abc"], file(&lo), None).needle("valid"),
        case("GC with a hostile cache entry", &["gc", NETWORK], file(&lo), None).needle("containerID"),
        case("no verb", &[], file(&lo), None),
        case("unknown verb", &["frob", NETWORK, pod], file(&lo), None),
        case("add without netns", &["add", NETWORK], file(&lo), None),
    ]
}

/// A cache entry another runtime (or an attacker) left in the result cache, naming a container ID that would
/// escape the cache directory: GC must refuse it and delete nothing.
fn plant_hostile_cache_entry(rig: &Rig) {
    let entry = json!({
        "kind": "cniCacheV1", "containerId": "../../../etc", "ifName": "eth0", "networkName": NETWORK,
        "config": "", "netns": rig.pod.path, "result": {"cniVersion": "1.0.0"}
    });
    let results = rig.cache_dir().join("results");
    fs::create_dir_all(&results).expect("results dir");
    fs::write(results.join(format!("{NETWORK}-planted-eth0")), entry.to_string()).expect("plant cache entry");
}

#[test]
fn runner() {
    let rig = Rig::new();
    plant_hostile_cache_entry(&rig);
    let cases = runner_cases(&rig);
    run_group("cnitool", "eth0", &rig, cases);
}

/// The corpus is as large as the issue asks.
#[test]
fn corpus_size() {
    let rig = Rig::new();
    let counts = [
        ("loopback", loopback_cases().len()),
        ("host-local", host_local_cases(&rig).len()),
        ("bridge", bridge_cases(&rig).len()),
        ("portmap", portmap_cases(&rig).len()),
        ("firewall", firewall_cases(&rig).len()),
        ("bandwidth", bandwidth_cases(&rig).len()),
        ("tuning", tuning_cases(&rig).len()),
        ("flannel", flannel_cases(&rig).len()),
        ("cnitool", runner_cases(&rig).len()),
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
