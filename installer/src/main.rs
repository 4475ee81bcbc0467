//! `cni-installer`: the entrypoint of the installer image (an init container of the DaemonSet in `deploy/`).
//! Copies every binary of `--source` into the node's `--bin-dir` and writes the node's conflist into
//! `--conf-dir`, then exits 0, as flannel's install-cni step does.
//!
//! A runtime may exec a plugin at any moment, so a binary is never written in place: its new content goes to a
//! temporary file beside it, is fsynced and renamed over the old name (a process running the old binary keeps
//! its inode; a new exec sees the old file or the new one, never a torn one). A binary whose content and mode
//! are already those of the image is left alone (no rename, no new inode), so a restarted pod changes nothing.

use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Parser;
use cnicore::spec::{io_error, Error, Result};
use cnicore::state::write_atomic;

/// The mode of an installed plugin.
const BINARY_MODE: u32 = 0o755;
/// The mode of the conflist (the runtimes only read it).
const CONFLIST_MODE: u32 = 0o644;

#[derive(Parser, Debug)]
#[command(
    name = "cni-installer",
    about = "Installs the CNI plugins of this image into the node's bin dir and writes the node's conflist"
)]
struct Cli {
    /// Where the image keeps the binaries to install (every regular file there is installed).
    #[arg(long, default_value = "/opt/cni-rs/bin")]
    source: PathBuf,
    /// The node's CNI bin dir (a hostPath mount).
    #[arg(long, default_value = "/host/opt/cni/bin")]
    bin_dir: PathBuf,
    /// The node's CNI conf dir (a hostPath mount).
    #[arg(long, default_value = "/host/etc/cni/net.d")]
    conf_dir: PathBuf,
    /// The conflist to write into --conf-dir, under its own file name (see --conflist-name).
    #[arg(long, default_value = "/etc/cni-rs/10-flannel.conflist")]
    conflist: PathBuf,
    /// The name of the conflist in --conf-dir (default: the file name of --conflist).
    #[arg(long)]
    conflist_name: Option<String>,
    /// Install the binaries only; write no conflist.
    #[arg(long)]
    skip_conflist: bool,
}

/// What happened to one file.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    Installed,
    Unchanged,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // The modes written are the modes wanted, whatever umask the container runtime set.
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o022));
    match run(&cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cni-installer: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: &Cli) -> Result<()> {
    let binaries = binaries_in(&cli.source).map_err(io_error(format!("list {}", cli.source.display())))?;
    if binaries.is_empty() {
        return Err(Error::io(format!("no binaries in {}", cli.source.display())));
    }
    cnicore::state::ensure_dir(&cli.bin_dir, 0o755).map_err(io_error(format!("create {}", cli.bin_dir.display())))?;
    let (mut installed, mut unchanged) = (0, 0);
    for source in &binaries {
        let name = source.file_name().expect("a directory entry has a name");
        let dest = cli.bin_dir.join(name);
        match install_file(source, &dest, BINARY_MODE).map_err(io_error(format!("install {}", dest.display())))? {
            Outcome::Installed => installed += 1,
            Outcome::Unchanged => unchanged += 1,
        }
    }
    sync_dir(&cli.bin_dir).map_err(io_error(format!("sync {}", cli.bin_dir.display())))?;
    println!("cni-installer: {installed} binaries installed, {unchanged} unchanged in {}", cli.bin_dir.display());

    if !cli.skip_conflist {
        let name = match &cli.conflist_name {
            Some(name) => name.clone(),
            None => cli.conflist.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
        };
        cnicore::state::validate_path_component("conflist name", &name)?;
        let text = fs::read(&cli.conflist).map_err(io_error(format!("read {}", cli.conflist.display())))?;
        // A conflist that does not parse would hide the node's network from the runtime: refuse it here.
        serde_json_check(&text).map_err(|e| e.within(cli.conflist.display()))?;
        cnicore::state::ensure_dir(&cli.conf_dir, 0o755)
            .map_err(io_error(format!("create {}", cli.conf_dir.display())))?;
        let dest = cli.conf_dir.join(&name);
        let outcome =
            install_file(&cli.conflist, &dest, CONFLIST_MODE).map_err(io_error(format!("write {}", dest.display())))?;
        sync_dir(&cli.conf_dir).map_err(io_error(format!("sync {}", cli.conf_dir.display())))?;
        let what = if outcome == Outcome::Installed { "written" } else { "unchanged" };
        println!("cni-installer: {} {what}", dest.display());
    }
    Ok(())
}

/// The regular files of `dir` (symlinks followed), sorted by name.
fn binaries_in(dir: &Path) -> io::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for entry in fs::read_dir(dir)? {
        let path = entry?.path();
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        if !name.starts_with('.') && fs::metadata(&path)?.is_file() {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}

/// Puts the content of `source` at `dest` with `mode`: nothing when `dest` is already a regular file with that
/// content and mode, else a temporary file beside `dest`, fsynced and renamed over it.
fn install_file(source: &Path, dest: &Path, mode: u32) -> io::Result<Outcome> {
    let content = fs::read(source)?;
    if is_same(dest, &content, mode)? {
        return Ok(Outcome::Unchanged);
    }
    remove_stale_temporary(dest)?;
    write_atomic(dest, &content, mode)?;
    Ok(Outcome::Installed)
}

/// An init container is PID 1 every time, so a run killed mid-write leaves the very temporary name
/// (`write_atomic`'s `.tmp-<name>-<pid>`) the next run would create exclusively: remove it first.
fn remove_stale_temporary(dest: &Path) -> io::Result<()> {
    let name = dest.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let temporary = dest.with_file_name(format!(".tmp-{name}-{}", std::process::id()));
    match fs::remove_file(temporary) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// True when `path` is a regular file (not a symlink) with exactly `content` and `mode`.
fn is_same(path: &Path, content: &[u8], mode: u32) -> io::Result<bool> {
    let meta = match fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    if !meta.is_file() || meta.len() != content.len() as u64 || meta.permissions().mode() & 0o7777 != mode {
        return Ok(false);
    }
    Ok(fs::read(path)? == content)
}

/// Makes the renames in `dir` durable.
fn sync_dir(dir: &Path) -> io::Result<()> {
    fs::File::open(dir)?.sync_all()
}

/// Checks that `text` is one JSON object (the conflist's own fields are the runtime's to judge).
fn serde_json_check(text: &[u8]) -> Result<()> {
    match serde_json::from_slice::<serde_json::Value>(text) {
        Ok(value) if value.is_object() => Ok(()),
        Ok(_) => Err(Error::decode("not a JSON object")),
        Err(e) => Err(Error::decode(format!("not JSON: {e}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("cni-installer-test-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn installs_then_skips_unchanged_content() {
        let dir = scratch("skip");
        let source = dir.join("bridge");
        fs::write(&source, b"new binary").unwrap();
        let dest = dir.join("installed");
        assert_eq!(install_file(&source, &dest, BINARY_MODE).unwrap(), Outcome::Installed);
        assert_eq!(fs::read(&dest).unwrap(), b"new binary");
        assert_eq!(fs::metadata(&dest).unwrap().permissions().mode() & 0o7777, BINARY_MODE);
        let inode = fs::metadata(&dest).unwrap().ino();
        assert_eq!(install_file(&source, &dest, BINARY_MODE).unwrap(), Outcome::Unchanged);
        assert_eq!(fs::metadata(&dest).unwrap().ino(), inode, "an unchanged binary keeps its inode");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn replaces_a_binary_in_use_by_rename_not_by_writing_into_it() {
        let dir = scratch("rename");
        let source = dir.join("bridge");
        fs::write(&source, b"new binary").unwrap();
        let dest = dir.join("installed");
        fs::write(&dest, b"old binary").unwrap();
        // An open handle stands for a process executing the old binary: it must keep seeing the old bytes.
        let old = fs::File::open(&dest).unwrap();
        let old_inode = old.metadata().unwrap().ino();
        assert_eq!(install_file(&source, &dest, BINARY_MODE).unwrap(), Outcome::Installed);
        assert_ne!(fs::metadata(&dest).unwrap().ino(), old_inode, "a new inode, renamed over the old name");
        assert_eq!(io::read_to_string(old).unwrap(), "old binary", "the old file is untouched");
        assert_eq!(fs::read(&dest).unwrap(), b"new binary");
        let leftovers: Vec<_> = fs::read_dir(&dir).unwrap().filter_map(|e| e.ok()).map(|e| e.file_name()).collect();
        assert_eq!(leftovers.len(), 2, "no temporary file left: {leftovers:?}");
        fs::remove_dir_all(&dir).unwrap();
    }

    /// A shell (another process, as a runtime is) executes the installed binary in a loop while it is replaced
    /// again and again: no exec ever fails (ETXTBSY from a file still open for writing, ENOENT between two names,
    /// ENOEXEC from a half-written file).
    #[test]
    fn a_binary_executed_in_a_loop_is_replaced_without_a_failed_exec() {
        let dir = scratch("exec");
        let dest = dir.join("plugin");
        let elf = fs::read("/bin/true").unwrap();
        // Two contents that both run: an ELF ignores bytes appended to it.
        let (first, second) = (dir.join("first"), dir.join("second"));
        fs::write(&first, &elf).unwrap();
        fs::write(&second, [elf.as_slice(), b"\0"].concat()).unwrap();
        install_file(&first, &dest, BINARY_MODE).unwrap();
        let errors = dir.join("errors");
        /// Stops the shell and removes the directory, also when the test fails.
        struct Loop(std::process::Child, PathBuf);
        impl Drop for Loop {
            fn drop(&mut self) {
                let _ = self.0.kill();
                let _ = self.0.wait();
                let _ = fs::remove_dir_all(&self.1);
            }
        }
        let shell = std::process::Command::new("sh")
            .arg("-c")
            .arg(r#"while [ ! -e "$1.stop" ]; do "$1" 2>>"$2"; done"#)
            .arg("sh")
            .arg(&dest)
            .arg(&errors)
            .spawn()
            .unwrap();
        let mut guard = Loop(shell, dir.clone());
        for round in 0..300 {
            let source = if round % 2 == 0 { &second } else { &first };
            assert_eq!(install_file(source, &dest, BINARY_MODE).unwrap(), Outcome::Installed);
        }
        fs::write(dir.join("plugin.stop"), b"").unwrap();
        guard.0.wait().unwrap();
        let errors = fs::read_to_string(&errors).unwrap_or_default();
        assert!(errors.is_empty(), "execs failed while the binary was replaced: {errors}");
    }

    #[test]
    fn a_temporary_file_left_by_a_killed_run_is_no_obstacle() {
        let dir = scratch("stale");
        let source = dir.join("bridge");
        fs::write(&source, b"new binary").unwrap();
        let dest = dir.join("installed");
        let stale = dir.join(format!(".tmp-installed-{}", std::process::id()));
        fs::write(&stale, b"half a bin").unwrap();
        assert_eq!(install_file(&source, &dest, BINARY_MODE).unwrap(), Outcome::Installed);
        assert_eq!(fs::read(&dest).unwrap(), b"new binary");
        assert!(!stale.exists());
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_wrong_mode_or_a_symlink_is_replaced() {
        let dir = scratch("mode");
        let source = dir.join("bridge");
        fs::write(&source, b"same").unwrap();
        let dest = dir.join("installed");
        fs::write(&dest, b"same").unwrap();
        fs::set_permissions(&dest, fs::Permissions::from_mode(0o700)).unwrap();
        assert_eq!(install_file(&source, &dest, BINARY_MODE).unwrap(), Outcome::Installed);
        assert_eq!(fs::metadata(&dest).unwrap().permissions().mode() & 0o7777, BINARY_MODE);
        let link = dir.join("link");
        std::os::unix::fs::symlink(&source, &link).unwrap();
        assert_eq!(install_file(&source, &link, BINARY_MODE).unwrap(), Outcome::Installed);
        assert!(fs::symlink_metadata(&link).unwrap().is_file(), "the symlink itself is replaced, not its target");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn binaries_are_the_regular_files_of_the_source() {
        let dir = scratch("list");
        for name in ["loopback", "bridge", ".hidden"] {
            fs::write(dir.join(name), b"x").unwrap();
        }
        fs::create_dir(dir.join("subdir")).unwrap();
        let names: Vec<_> = binaries_in(&dir).unwrap().iter().map(|p| p.file_name().unwrap().to_owned()).collect();
        assert_eq!(names, ["bridge", "loopback"]);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_conflist_must_be_a_json_object() {
        assert!(serde_json_check(br#"{"name":"cbr0","plugins":[]}"#).is_ok());
        assert!(serde_json_check(b"[]").is_err());
        assert!(serde_json_check(b"{").is_err());
    }
}
