//! Running the firewall binaries: explicit arguments, the script on stdin, never a shell.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// Searched after `PATH`: plugins are often started with a minimal `PATH` without the sbin directories.
const FALLBACK_DIRS: &[&str] = &["/usr/sbin", "/sbin", "/usr/bin", "/bin", "/usr/local/sbin"];

/// The executable `name` on `PATH` (then the usual sbin/bin directories), if any.
pub fn find_binary(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(FALLBACK_DIRS.iter().map(PathBuf::from))
        .filter(|dir| dir.is_absolute())
        .map(|dir| dir.join(name))
        .find(|candidate| is_executable(candidate))
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.metadata().is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Why running a firewall binary failed.
#[derive(Debug, Clone)]
pub struct Failure {
    /// The command, for messages (`iptables-restore --noflush --wait`).
    pub command: String,
    /// The binary is not installed.
    pub missing: bool,
    /// What it printed on stderr (or the spawn error), trimmed.
    pub stderr: String,
}

impl Failure {
    /// One-line description for an error message.
    pub fn describe(&self) -> String {
        if self.missing {
            return format!("{}: not found on PATH", self.command);
        }
        let mut text = self.stderr.trim().replace('\n', "; ");
        if text.len() > 2000 {
            text.truncate(2000);
            text.push_str("...");
        }
        format!("{} failed: {text}", self.command)
    }

    /// A CNI error naming what was being done: "not available" (50) when the binary is missing.
    pub fn to_error(&self, what: &str) -> crate::spec::Error {
        let msg = format!("{what}: {}", self.describe());
        match self.missing {
            true => crate::spec::Error::new(crate::spec::codes::NOT_AVAILABLE, msg),
            false => crate::spec::Error::internal(msg),
        }
    }

    /// True when the error says the object named does not exist (nft's ENOENT text, iptables' "does not exist").
    pub fn is_not_found(&self) -> bool {
        self.missing || self.stderr.contains("No such file or directory") || self.stderr.contains("does not exist")
    }
}

/// Runs `program args` with `stdin`; returns its stdout, or why it failed.
pub fn run(program: &str, args: &[&str], stdin: &[u8]) -> Result<String, Failure> {
    start(program, args).finish(stdin)
}

/// A firewall process started before its input is known, so that its exec and start-up (libraries, its
/// extensions: most of an `iptables-restore` run) overlap the caller's other work. [`Started::finish`] gives it
/// its input and waits; dropped unfinished, it is killed and reaped without having read anything.
#[derive(Debug)]
pub struct Started {
    command_line: String,
    /// `None` once finished.
    child: Option<Result<Child, Failure>>,
}

/// Starts `program args` with its stdin, stdout and stderr piped; a failure to start is reported by `finish`.
pub fn start(program: &str, args: &[&str]) -> Started {
    let command_line = std::iter::once(program).chain(args.iter().copied()).collect::<Vec<_>>().join(" ");
    let child = match find_binary(program) {
        None => Err(Failure { command: command_line.clone(), missing: true, stderr: String::new() }),
        Some(binary) => Command::new(&binary)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| Failure { command: command_line.clone(), missing: false, stderr: e.to_string() }),
    };
    Started { command_line, child: Some(child) }
}

impl Started {
    /// Writes `stdin`, closes it, and waits; returns the stdout, or why the process failed.
    pub fn finish(mut self, stdin: &[u8]) -> Result<String, Failure> {
        let failed = |stderr: String| Failure { command: self.command_line.clone(), missing: false, stderr };
        let mut child = self.child.take().expect("a started process is finished once")?;
        if let Some(mut pipe) = child.stdin.take() {
            // Write errors surface as the program's own failure (it exits before reading everything).
            let _ = pipe.write_all(stdin);
        }
        let output = child.wait_with_output().map_err(|e| failed(e.to_string()))?;
        if !output.status.success() {
            let mut stderr = String::from_utf8_lossy(&output.stderr).into_owned();
            if stderr.trim().is_empty() {
                stderr = format!("exit status {}", output.status);
            }
            return Err(failed(stderr));
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }
}

impl Drop for Started {
    fn drop(&mut self) {
        if let Some(Ok(child)) = &mut self.child {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_and_runs_binaries() {
        assert!(find_binary("sh").is_some());
        assert!(find_binary("no-such-binary-xyz").is_none());
        assert_eq!(run("cat", &[], b"hello").unwrap(), "hello");
        let failure = run("no-such-binary-xyz", &["a"], b"").unwrap_err();
        assert!(failure.missing && failure.is_not_found());
        let failure = run("false", &[], b"").unwrap_err();
        assert!(!failure.missing && failure.describe().contains("false failed"));
    }

    #[test]
    fn a_started_process_gets_its_input_later_or_is_killed() {
        let started = start("cat", &[]);
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert_eq!(started.finish(b"later").unwrap(), "later");
        // Unfinished: killed and reaped on drop (cat would otherwise wait for stdin forever).
        let started = start("cat", &[]);
        let pid = started.child.as_ref().unwrap().as_ref().unwrap().id();
        drop(started);
        assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists(), "cat {pid} still there");
        assert!(start("no-such-binary-xyz", &[]).finish(b"").unwrap_err().missing);
    }
}
