//! The plugin entry point, exercised on a real binary (loopback) for every verb: bad JSON, wrong types, versions,
//! the environment, oversize input, VERSION. Every failure must be one spec error object on stdout with a
//! non-zero exit and no change to the pod; successful verbs without an answer print nothing.

use netns_tests::cnicore::spec::SUPPORTED_VERSIONS;
use netns_tests::upstream::{reference, run_raw};
use netns_tests::{bin, bin_dir, json, pod_rig, NodeWithPod, PluginOutput, Value};

/// The entry point's cap on stdin (cnicore's `MAX_STDIN`).
const MAX_STDIN: usize = 1 << 20;
const VERBS: &[&str] = &["ADD", "DEL", "CHECK", "GC", "STATUS"];

pod_rig!(
    /// A node to run in and a pod whose `lo` is down: any request that is refused must leave it down.
    Rig
);

impl Rig {
    fn new() -> Rig {
        let rig = Rig { lab: NodeWithPod::new() };
        let mut netlink = rig.pod.netlink();
        let lo = netlink.require_link("lo").expect("lo");
        netlink.set_down(lo.index).expect("set lo down");
        rig
    }

    /// The complete, valid environment of `verb`, as `(name, value)` pairs.
    fn env(&self, verb: &str) -> Vec<(String, String)> {
        [
            ("CNI_COMMAND", verb.to_string()),
            ("CNI_CONTAINERID", "entry-point-test".to_string()),
            ("CNI_NETNS", self.pod.path.display().to_string()),
            ("CNI_IFNAME", "lo".to_string()),
            ("CNI_PATH", bin_dir().display().to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }

    /// `verb`'s valid environment with `name` replaced by `value` (`None`: unset).
    fn env_with(&self, verb: &str, name: &str, value: Option<&str>) -> Vec<(String, String)> {
        let mut env: Vec<_> = self.env(verb).into_iter().filter(|(k, _)| k != name).collect();
        if let Some(value) = value {
            env.push((name.to_string(), value.to_string()));
        }
        env
    }

    fn call(&self, env: &[(String, String)], stdin: &[u8]) -> PluginOutput {
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        run_raw(&self.node, bin("loopback"), &[], &env, stdin)
    }

    fn lo_is_up(&self) -> bool {
        self.pod.netlink().require_link("lo").expect("lo").up
    }
}

/// The lowest version that allows `verb`... and the one a valid request for it uses.
fn version_for(verb: &str) -> &'static str {
    match verb {
        "GC" | "STATUS" => "1.1.0",
        _ => "1.0.0",
    }
}

fn conf(version: &str) -> Vec<u8> {
    json!({"cniVersion": version, "name": "lo-net", "type": "loopback"}).to_string().into_bytes()
}

/// Panics unless `out` is a failure with exactly one spec error object of `code` on stdout.
fn assert_error(out: &PluginOutput, code: u64, case: &str) {
    assert!(!out.success(), "{case}: succeeded, stdout {:?}", out.stdout_text);
    let text = out.stdout_text.trim_end_matches('\n');
    assert!(!text.contains('\n'), "{case}: more than one line on stdout: {text:?}");
    let error: Value = serde_json::from_str(text)
        .unwrap_or_else(|e| panic!("{case}: stdout is not JSON ({e}): {:?}, stderr {}", out.stdout_text, out.stderr));
    let fields = error.as_object().unwrap_or_else(|| panic!("{case}: not an object: {error}"));
    assert_eq!(error["code"].as_u64(), Some(code), "{case}: {error}");
    let version = error["cniVersion"].as_str().unwrap_or_else(|| panic!("{case}: no cniVersion: {error}"));
    assert!(SUPPORTED_VERSIONS.contains(&version), "{case}: {error}");
    let msg = error["msg"].as_str().unwrap_or_default();
    assert!(!msg.is_empty(), "{case}: no msg: {error}");
    assert!(!out.stderr.contains("panicked"), "{case}: panicked: {}", out.stderr);
    for key in fields.keys() {
        assert!(["cniVersion", "code", "msg", "details"].contains(&key.as_str()), "{case}: field {key}: {error}");
    }
}

#[test]
fn valid_calls_succeed_and_print_only_results() {
    let rig = Rig::new();
    for verb in ["ADD", "CHECK", "GC", "STATUS", "DEL"] {
        let out = rig.call(&rig.env(verb), &conf(version_for(verb)));
        assert!(out.success(), "{verb}: {} {}", out.stdout_text, out.stderr);
        if verb == "ADD" {
            assert_eq!(out.stdout["cniVersion"], "1.0.0", "{}", out.stdout_text);
            assert!(out.stdout_text.ends_with("}\n"), "{:?}", out.stdout_text);
        } else {
            assert_eq!(out.stdout_text, "", "{verb} printed something");
        }
    }
    assert!(!rig.lo_is_up(), "DEL ran last: lo must be down");
}

#[test]
fn bad_json_is_a_decode_error_for_every_verb() {
    let rig = Rig::new();
    let inputs: &[&[u8]] = &[
        b"",
        b"{",
        b"{\"cniVersion\": \"1.0.0\", \"name\": ",
        b"{\"cniVersion\": \"1.0.0\",, \"name\": \"n\"}",
        b"not json",
        b"\xff\xfe{}",
        b"{\"cniVersion\": \"1.0.0\", \"name\": \"n\"} trailing",
    ];
    for verb in VERBS {
        for stdin in inputs {
            let case = format!("{verb} {:?}", String::from_utf8_lossy(stdin));
            assert_error(&rig.call(&rig.env(verb), stdin), 6, &case);
        }
    }
    assert!(!rig.lo_is_up());
}

#[test]
fn json_of_the_wrong_type_is_an_invalid_config() {
    let rig = Rig::new();
    let inputs = [
        json!([1]),
        json!("loopback"),
        json!(42),
        json!({"cniVersion": 1, "name": "lo-net", "type": "loopback"}),
        json!({"cniVersion": "1.0.0", "name": 5, "type": "loopback"}),
        json!({"cniVersion": "1.0.0", "name": "lo-net", "type": ["loopback"]}),
        json!({"cniVersion": "1.1.0", "name": "../etc", "type": "loopback"}),
    ];
    for verb in VERBS {
        for stdin in &inputs {
            let case = format!("{verb} {stdin}");
            assert_error(&rig.call(&rig.env(verb), stdin.to_string().as_bytes()), 7, &case);
        }
    }
    assert!(!rig.lo_is_up());
}

#[test]
fn versions_the_plugin_or_the_verb_does_not_support() {
    let rig = Rig::new();
    for verb in VERBS {
        for version in ["0.5.0", "7.0.0", "1.2.0", "0.0.1"] {
            assert_error(&rig.call(&rig.env(verb), &conf(version)), 1, &format!("{verb} {version}"));
        }
    }
    for version in ["0.1.0", "0.2.0", "0.3.0", "0.3.1"] {
        let out = rig.call(&rig.env("CHECK"), &conf(version));
        assert_error(&out, 1, &format!("CHECK {version}"));
        assert_eq!(out.stdout["cniVersion"], version, "the error is in the config's version");
    }
    for verb in ["GC", "STATUS"] {
        for version in ["0.4.0", "1.0.0"] {
            assert_error(&rig.call(&rig.env(verb), &conf(version)), 1, &format!("{verb} {version}"));
        }
    }
    assert!(!rig.lo_is_up());
}

#[test]
fn missing_environment_variables() {
    let rig = Rig::new();
    // What each verb needs (CNI_NETNS is optional for DEL; GC and STATUS act on no attachment).
    let required: &[(&str, &[&str])] = &[
        ("ADD", &["CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_PATH"]),
        ("CHECK", &["CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_PATH"]),
        ("DEL", &["CNI_CONTAINERID", "CNI_IFNAME", "CNI_PATH"]),
        ("GC", &["CNI_PATH"]),
        ("STATUS", &["CNI_PATH"]),
    ];
    for (verb, names) in required {
        for name in *names {
            for value in [None, Some("")] {
                let out = rig.call(&rig.env_with(verb, name, value), &conf(version_for(verb)));
                let case = format!("{verb} with {name}={value:?}");
                assert_error(&out, 4, &case);
                assert!(out.stdout["msg"].as_str().is_some_and(|m| m.contains(name)), "{case}: {}", out.stdout);
            }
        }
    }
    // The optional ones really are optional.
    for (verb, name) in [("DEL", "CNI_NETNS"), ("GC", "CNI_CONTAINERID"), ("GC", "CNI_IFNAME"), ("STATUS", "CNI_NETNS")]
    {
        let out = rig.call(&rig.env_with(verb, name, None), &conf(version_for(verb)));
        assert!(out.success(), "{verb} without {name}: {}", out.stdout_text);
    }
    assert!(!rig.lo_is_up());
}

#[test]
fn bad_container_id_ifname_and_netns() {
    let rig = Rig::new();
    let long_id = "a".repeat(300);
    let cases: &[(&str, &str)] = &[
        ("CNI_CONTAINERID", "-starts-with-dash"),
        ("CNI_CONTAINERID", ".hidden"),
        ("CNI_CONTAINERID", "a/b"),
        ("CNI_CONTAINERID", "../../etc"),
        ("CNI_CONTAINERID", "with space"),
        ("CNI_CONTAINERID", "new\nline"),
        ("CNI_CONTAINERID", &long_id),
        ("CNI_IFNAME", "eth0:1"),
        ("CNI_IFNAME", "a/b"),
        ("CNI_IFNAME", "."),
        ("CNI_IFNAME", ".."),
        ("CNI_IFNAME", "sixteen-chars-xx"),
        ("CNI_IFNAME", "et h"),
        ("CNI_IFNAME", "tab\t"),
        ("CNI_NETNS", "run/netns/x"),
        ("CNI_NETNS", "./netns"),
        ("CNI_ARGS", "IP"),
        ("CNI_ARGS", "=value"),
    ];
    for verb in ["ADD", "DEL", "CHECK"] {
        for (name, value) in cases {
            let out = rig.call(&rig.env_with(verb, name, Some(value)), &conf(version_for(verb)));
            let case = format!("{verb} with {name}={value:?}");
            assert_error(&out, 4, &case);
            assert!(out.stdout["msg"].as_str().is_some_and(|m| m.len() < 300), "{case}: message too long");
        }
    }
    assert!(!rig.lo_is_up());
}

#[test]
fn unknown_commands() {
    let rig = Rig::new();
    for command in ["FROB", "add", "Add", "ADD ", "VERSION2", "DELETE"] {
        let out = rig.call(&rig.env_with("ADD", "CNI_COMMAND", Some(command)), &conf("1.0.0"));
        assert_error(&out, 4, &format!("CNI_COMMAND={command:?}"));
    }
    assert!(!rig.lo_is_up());
}

#[test]
fn a_bare_invocation_says_what_the_binary_is() {
    let rig = Rig::new();
    let out = rig.call(&rig.env_with("ADD", "CNI_COMMAND", None), &conf("1.0.0"));
    assert!(out.success(), "{}", out.stdout_text);
    assert_eq!(out.stdout_text, "");
    assert!(out.stderr.contains("loopback"), "{}", out.stderr);
    assert!(!rig.lo_is_up());
}

/// A valid config padded with an unknown field to exactly `len` bytes.
fn padded_conf(version: &str, len: usize) -> Vec<u8> {
    let mut stdin = conf(version);
    let overhead = stdin.len() + r#","pad":"""#.len();
    let pad = "x".repeat(len - overhead);
    stdin.pop(); // the closing brace
    stdin.extend_from_slice(format!(r#","pad":"{pad}"}}"#).as_bytes());
    assert_eq!(stdin.len(), len);
    stdin
}

#[test]
fn oversize_stdin_is_refused() {
    let rig = Rig::new();
    for verb in VERBS {
        let version = version_for(verb);
        for len in [MAX_STDIN + 1, 4 * MAX_STDIN] {
            let out = rig.call(&rig.env(verb), &padded_conf(version, len));
            assert_error(&out, 6, &format!("{verb} with {len} bytes"));
        }
    }
    assert!(!rig.lo_is_up());
    // Right at the cap the config is still read.
    for verb in ["STATUS", "DEL"] {
        let out = rig.call(&rig.env(verb), &padded_conf(version_for(verb), MAX_STDIN));
        assert!(out.success(), "{verb} with {MAX_STDIN} bytes: {}", out.stdout_text);
    }
}

#[test]
fn version_lists_every_supported_version() {
    let rig = Rig::new();
    let env = vec![("CNI_COMMAND".to_string(), "VERSION".to_string())];
    for (stdin, asked) in [
        (&b""[..], "1.1.0"),
        (br#"{"cniVersion":"0.4.0"}"#, "0.4.0"),
        (br#"{"cniVersion":"0.1.0","name":"n","type":"loopback"}"#, "0.1.0"),
        (br#"{"cniVersion":"9.9.9"}"#, "1.1.0"),
        (b"not json", "1.1.0"),
    ] {
        let out = rig.call(&env, stdin);
        assert!(out.success(), "{}", out.stdout_text);
        assert_eq!(
            out.stdout,
            json!({"cniVersion": asked, "supportedVersions": ["0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]}),
            "stdin {:?}",
            String::from_utf8_lossy(stdin)
        );
    }
}

#[test]
fn add_answers_as_the_reference_plugin_does() {
    // The reference (libcni 1.1.2) speaks up to 1.0.0; compare the answer for that version.
    let rig = Rig::new();
    let mut answers = Vec::new();
    for plugin in [bin("loopback"), reference("loopback")] {
        let env: Vec<(String, String)> = rig.env("ADD");
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let out = run_raw(&rig.node, &plugin, &[], &env, &conf("1.0.0"));
        let mut answer = out.expect_ok().clone();
        // Go prints an empty `dns` object; ours leaves it out.
        if answer["dns"] == json!({}) {
            answer.as_object_mut().map(|o| o.remove("dns"));
        }
        answers.push(answer);
    }
    assert_eq!(answers[0], answers[1]);
}
