//! A CNI plugin wrapper that records each call: installed (as a symlink named after a plugin) in a plugin
//! directory made by [`netns_tests::recorder::Recorder`], it reads `.recorder.json` beside itself
//! (`{"real": DIR, "log": DIR}`), runs `DIR/<its own name>` with the same arguments, environment and stdin,
//! passes its stdout, stderr and exit status through, and writes one JSON record per call into the log
//! directory: the plugin, every `CNI_*` variable, stdin, the exit status, stdout, stderr and the times.
//! No shell, no parsing of the call itself: what the runtime sent is what is recorded.
//!
//! With `"fail": {"plugin": P, "command": C}` in the settings, a call of plugin P with CNI_COMMAND=C does not
//! run the real plugin: it fails with a CNI error (code 999, "injected failure"), recorded like any call, so a
//! test can make e.g. the last plugin's ADD fail and watch the runtime roll back.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{exit, Command, ExitStatus, Output, Stdio};
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

fn now_ns() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0)
}

fn fail(message: String) -> ! {
    // A CNI error on stdout, as a plugin would report it.
    println!("{}", json!({"cniVersion": "0.4.0", "code": 999, "msg": message}));
    exit(1)
}

fn main() {
    let start = now_ns();
    let argv0 = PathBuf::from(std::env::args_os().next().unwrap_or_default());
    let name = argv0.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let dir = argv0.parent().map(Path::to_path_buf).unwrap_or_default();
    let settings_path = dir.join(".recorder.json");
    let settings: Value = std::fs::read(&settings_path)
        .ok()
        .and_then(|bytes| serde_json::from_slice(&bytes).ok())
        .unwrap_or_else(|| fail(format!("cni-recorder: cannot read {}", settings_path.display())));
    let (Some(real), Some(log)) = (settings["real"].as_str(), settings["log"].as_str()) else {
        fail(format!("cni-recorder: {} needs \"real\" and \"log\"", settings_path.display()))
    };

    let mut stdin = Vec::new();
    if let Err(e) = std::io::stdin().read_to_end(&mut stdin) {
        fail(format!("cni-recorder: read stdin: {e}"));
    }
    let command = std::env::var("CNI_COMMAND").unwrap_or_default();
    let fail_here = settings["fail"]["plugin"] == name.as_str() && settings["fail"]["command"] == command.as_str();
    let output = if fail_here { injected_failure(&stdin) } else { run_real(real, &name, &stdin) };
    let end = now_ns();
    let _ = std::io::stdout().write_all(&output.stdout);
    let _ = std::io::stderr().write_all(&output.stderr);

    let env: BTreeMap<String, String> = std::env::vars().filter(|(k, _)| k.starts_with("CNI_")).collect();
    let stdin_value =
        serde_json::from_slice(&stdin).unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&stdin).into_owned()));
    let record = json!({
        "plugin": name,
        "env": env,
        "stdin": stdin_value,
        "exit": output.status.code().unwrap_or(-1),
        "stdout": String::from_utf8_lossy(&output.stdout),
        "stderr": String::from_utf8_lossy(&output.stderr),
        "start_ns": start.to_string(),
        "end_ns": end.to_string(),
    });
    let file = format!("{start:024}-{}.json", std::process::id());
    let tmp = Path::new(log).join(format!(".tmp-{file}"));
    if std::fs::write(&tmp, record.to_string()).is_ok() {
        let _ = std::fs::rename(&tmp, Path::new(log).join(file));
    }
    exit(output.status.code().unwrap_or(1));
}

/// Runs the real plugin `dir/name` with our arguments and environment and `stdin`.
fn run_real(dir: &str, name: &str, stdin: &[u8]) -> Output {
    let mut child = Command::new(Path::new(dir).join(name))
        .args(std::env::args_os().skip(1))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| fail(format!("cni-recorder: run {dir}/{name}: {e}")));
    if let Some(mut pipe) = child.stdin.take() {
        let _ = pipe.write_all(stdin);
    }
    child.wait_with_output().unwrap_or_else(|e| fail(format!("cni-recorder: wait for {name}: {e}")))
}

/// What a plugin failing with a CNI error prints, in the config's version.
fn injected_failure(stdin: &[u8]) -> Output {
    let conf: Value = serde_json::from_slice(stdin).unwrap_or(Value::Null);
    let version = conf["cniVersion"].as_str().unwrap_or("1.0.0");
    let error = json!({"cniVersion": version, "code": 999, "msg": "injected failure"});
    Output { status: ExitStatus::from_raw(1 << 8), stdout: format!("{error}\n").into_bytes(), stderr: Vec::new() }
}
