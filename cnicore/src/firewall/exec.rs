//! Running the firewall binaries: explicit arguments, the script on stdin, never a shell.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

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
    let command_line = std::iter::once(program).chain(args.iter().copied()).collect::<Vec<_>>().join(" ");
    let Some(binary) = find_binary(program) else {
        return Err(Failure { command: command_line, missing: true, stderr: String::new() });
    };
    let spawned = Command::new(&binary)
        .args(args)
        .stdin(if stdin.is_empty() { Stdio::null() } else { Stdio::piped() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match spawned {
        Ok(child) => child,
        Err(e) => return Err(Failure { command: command_line, missing: false, stderr: e.to_string() }),
    };
    if let Some(mut pipe) = child.stdin.take() {
        // Write errors surface as the program's own failure (it exits before reading everything).
        let _ = pipe.write_all(stdin);
    }
    let output = match child.wait_with_output() {
        Ok(output) => output,
        Err(e) => return Err(Failure { command: command_line, missing: false, stderr: e.to_string() }),
    };
    if !output.status.success() {
        let mut stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        if stderr.trim().is_empty() {
            stderr = format!("exit status {}", output.status);
        }
        return Err(Failure { command: command_line, missing: false, stderr });
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
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
}
