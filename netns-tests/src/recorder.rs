//! Recording what a runtime sends its plugins: [`Recorder`] makes a plugin directory in which each plugin is
//! the `cni-recorder` binary (see `src/bin/cni-recorder.rs`) standing in for the real one, and reads back
//! the calls it logged, in the order they started.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use crate::bin;

/// One plugin call as the runtime made it.
#[derive(Debug, Clone)]
pub struct Call {
    /// The plugin's binary name.
    pub plugin: String,
    /// Every `CNI_*` variable.
    pub env: BTreeMap<String, String>,
    /// The network configuration on stdin (a string if it was not JSON).
    pub stdin: Value,
    pub exit: i32,
    pub stdout: String,
    pub stderr: String,
    pub start_ns: u128,
    pub end_ns: u128,
}

impl Call {
    /// `CNI_COMMAND`.
    pub fn command(&self) -> &str {
        self.env.get("CNI_COMMAND").map(String::as_str).unwrap_or("")
    }

    /// A variable, "" if unset.
    pub fn var(&self, name: &str) -> &str {
        self.env.get(name).map(String::as_str).unwrap_or("")
    }

    /// One line for messages: `ADD bridge netns=... exit=0`.
    pub fn summary(&self) -> String {
        format!(
            "{} {} net={} netns={:?} exit={}{}",
            self.command(),
            self.plugin,
            self.stdin["name"].as_str().unwrap_or("?"),
            self.var("CNI_NETNS"),
            self.exit,
            if self.exit == 0 {
                String::new()
            } else {
                format!(" stdout={} stderr={}", self.stdout.trim(), self.stderr.trim())
            }
        )
    }
}

/// A plugin directory of recorder stand-ins for the plugins of a real directory.
pub struct Recorder {
    /// The directory to give the runtime as its plugin directory.
    pub dir: PathBuf,
    real: PathBuf,
    log: PathBuf,
}

impl Recorder {
    /// Makes `<parent>/recorded-bin` with a stand-in for each of `plugins` found in `real`.
    pub fn new(parent: &Path, real: &Path, plugins: &[&str]) -> Recorder {
        let dir = parent.join("recorded-bin");
        let log = parent.join("recorded-calls");
        for d in [&dir, &log] {
            fs::create_dir_all(d).unwrap_or_else(|e| panic!("create {}: {e}", d.display()));
        }
        let recorder = bin("cni-recorder");
        for plugin in plugins.iter().filter(|p| real.join(p).is_file()) {
            symlink(&recorder, dir.join(plugin)).expect("recorder symlink");
        }
        let recorder = Recorder { dir, real: real.to_path_buf(), log };
        recorder.write_settings(None);
        recorder
    }

    fn write_settings(&self, fail: Option<(&str, &str)>) {
        let mut settings = json!({"real": self.real, "log": self.log});
        if let Some((plugin, command)) = fail {
            settings["fail"] = json!({"plugin": plugin, "command": command});
        }
        let (path, tmp) = (self.dir.join(".recorder.json"), self.dir.join(".recorder.json.tmp"));
        fs::write(&tmp, settings.to_string()).expect("recorder settings");
        fs::rename(&tmp, &path).expect("recorder settings");
    }

    /// From now on, every call of `plugin` with CNI_COMMAND=`command` fails (a CNI error, code 999) without
    /// running the real plugin; `None` ends that.
    pub fn inject_failure(&self, failure: Option<(&str, &str)>) {
        self.write_settings(failure);
    }

    /// Every call logged so far, in the order they started.
    pub fn calls(&self) -> Vec<Call> {
        let mut names: Vec<PathBuf> =
            fs::read_dir(&self.log).map(|entries| entries.flatten().map(|e| e.path()).collect()).unwrap_or_default();
        names.retain(|p| {
            p.extension().is_some_and(|e| e == "json")
                && !p.file_name().is_some_and(|n| n.to_string_lossy().starts_with('.'))
        });
        names.sort();
        names
            .iter()
            .filter_map(|path| {
                let record: Value = serde_json::from_slice(&fs::read(path).ok()?).ok()?;
                let text = |key: &str| record[key].as_str().unwrap_or("").to_string();
                Some(Call {
                    plugin: text("plugin"),
                    env: serde_json::from_value(record["env"].clone()).unwrap_or_default(),
                    stdin: record["stdin"].clone(),
                    exit: record["exit"].as_i64().unwrap_or(-1) as i32,
                    stdout: text("stdout"),
                    stderr: text("stderr"),
                    start_ns: text("start_ns").parse().unwrap_or(0),
                    end_ns: text("end_ns").parse().unwrap_or(0),
                })
            })
            .collect()
    }

    /// Forgets the calls logged so far.
    pub fn clear(&self) {
        for entry in fs::read_dir(&self.log).into_iter().flatten().flatten() {
            let _ = fs::remove_file(entry.path());
        }
    }
}
