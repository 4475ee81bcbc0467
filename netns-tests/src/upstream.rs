//! Running binaries we do not control the environment of through [`crate::run_plugin`]: raw stdin and an exact
//! environment (entry-point tests), a runner with a plugin directory made for the test, the reference plugins, and
//! upstream cnitool, which always keeps its result cache in `/var/lib/cni` and so runs in a private mount
//! namespace where a per-test directory is mounted there.

use std::ffi::{CString, OsStr};
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::symlink;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

pub use crate::{clean_command, output};
use crate::{PluginOutput, TestNetns};

/// Debian's reference plugins (containernetworking-plugins v1.1.1).
pub const REFERENCE_DIR: &str = "/usr/lib/cni";
/// Where `../shared/tools/build-cnitool.sh` puts upstream cnitool unless `$UPSTREAM_CNITOOL` says otherwise.
const DEFAULT_UPSTREAM_CNITOOL: &str = "/var/tmp/cnitool-bin/cnitool";
/// The cache directory libcni hard-codes.
pub const VAR_LIB_CNI: &str = "/var/lib/cni";

/// The reference plugin `name`; panics (saying how to install it) when it is missing.
pub fn reference(name: &str) -> PathBuf {
    let path = Path::new(REFERENCE_DIR).join(name);
    assert!(
        path.is_file(),
        "reference plugin {} missing: run scripts/setup.sh (installs containernetworking-plugins)",
        path.display()
    );
    path
}

/// Whether the reference plugin `name` is installed, by the rig's missing-tool policy ([`crate::require`]): a
/// test that can do without it returns when this is false.
pub fn have_reference(name: &str) -> bool {
    let path = Path::new(REFERENCE_DIR).join(name);
    crate::require(
        &format!("reference plugin {}", path.display()),
        path.is_file(),
        "run scripts/setup.sh (installs containernetworking-plugins)",
    )
}

/// Upstream cnitool (`$UPSTREAM_CNITOOL`, else /var/tmp/cnitool-bin/cnitool), or `None` by the rig's
/// missing-tool policy ([`crate::require`]) when it has not been built: the interop tests are then skipped.
pub fn upstream_cnitool() -> Option<PathBuf> {
    let path = std::env::var_os("UPSTREAM_CNITOOL")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_UPSTREAM_CNITOOL));
    let install = "build it with ../shared/tools/build-cnitool.sh, as scripts/setup.sh does";
    crate::require(&format!("upstream cnitool {}", path.display()), path.is_file(), install).then_some(path)
}

/// Makes `dir` a plugin directory (for `CNI_PATH`) holding exactly the given plugins, as symlinks
/// `(name, binary)`, so a test picks e.g. the reference bridge next to our loopback. Returns `dir`.
pub fn plugin_dir(dir: &Path, plugins: &[(&str, &Path)]) -> PathBuf {
    fs::create_dir_all(dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
    for (name, binary) in plugins {
        let link = dir.join(name);
        symlink(binary, &link).unwrap_or_else(|e| panic!("symlink {} -> {}: {e}", link.display(), binary.display()));
    }
    dir.to_path_buf()
}

/// Runs `program args` in `ns` with exactly `env` (plus `PATH`) and the raw bytes `stdin`: for tests of the
/// entry point, where the environment and the input themselves are under test.
pub fn run_raw(
    ns: &TestNetns,
    program: impl AsRef<OsStr>,
    args: &[&str],
    env: &[(&str, &str)],
    stdin: &[u8],
) -> PluginOutput {
    let mut command = clean_command(ns, program);
    command.args(args).envs(env.iter().copied());
    output(&mut command, stdin)
}

/// A per-test directory that a command sees as `/var/lib/cni` (see [`with_var_lib_cni`]).
///
/// It is `<parent>/var-lib/cni`: when the host has no `/var/lib/cni` to mount over, `<parent>/var-lib` is
/// mounted on `/var/lib` instead (the command then sees no other part of the host's `/var/lib`), so that nothing
/// is created on the host's root filesystem.
pub struct VarLibCni {
    var_lib: PathBuf,
}

impl VarLibCni {
    /// Creates `<parent>/var-lib/cni`.
    pub fn new(parent: &Path) -> VarLibCni {
        let var_lib = parent.join("var-lib");
        let cni = var_lib.join("cni");
        fs::create_dir_all(&cni).unwrap_or_else(|e| panic!("create {}: {e}", cni.display()));
        VarLibCni { var_lib }
    }

    /// The directory the command sees as `/var/lib/cni` (e.g. for our runner's `CNI_CACHE_DIR`).
    pub fn path(&self) -> PathBuf {
        self.var_lib.join("cni")
    }

    /// What to mount where: (source, target).
    fn mount(&self) -> (PathBuf, PathBuf) {
        if Path::new(VAR_LIB_CNI).is_dir() {
            (self.path(), PathBuf::from(VAR_LIB_CNI))
        } else {
            (self.var_lib.clone(), PathBuf::from("/var/lib"))
        }
    }
}

fn c_path(path: &Path) -> CString {
    CString::new(path.as_os_str().as_bytes()).unwrap_or_else(|_| panic!("path with a NUL byte: {}", path.display()))
}

/// Makes `command` run in a private mount namespace in which `dir` is `/var/lib/cni`. The mounts are private
/// to the child: the host's mount table is unchanged, and they vanish when the child (and the plugins it
/// runs, which inherit the namespace) exit.
pub fn with_var_lib_cni<'a>(command: &'a mut Command, dir: &VarLibCni) -> &'a mut Command {
    let (source, target) = dir.mount();
    with_bind_mount(command, &source, &target)
}

/// Makes `command` run in a private mount namespace in which `source` is mounted on `target` (an existing
/// directory), e.g. a test's own `/etc/cni/tuning` over the host's `/etc/cni`: a fixed host path a binary
/// reads, given to it without writing to the host.
pub fn with_bind_mount<'a>(command: &'a mut Command, source: &Path, target: &Path) -> &'a mut Command {
    // Everything the child needs is allocated here, before fork: only system calls run after it.
    let (source, target, root) = (c_path(source), c_path(target), c_path(Path::new("/")));
    // Errors are returned bare (no formatting, which would allocate after fork); spawn() reports them.
    // SAFETY: unshare and mount are plain system calls on pointers to C strings that outlive the closure;
    // they are async-signal-safe, which is what a pre_exec closure requires.
    unsafe {
        command.pre_exec(move || {
            if libc::unshare(libc::CLONE_NEWNS) != 0 {
                return Err(io::Error::last_os_error());
            }
            // Without this, the bind mount below would propagate back to the host's mount namespace.
            let private = libc::MS_REC | libc::MS_PRIVATE;
            if libc::mount(std::ptr::null(), root.as_ptr(), std::ptr::null(), private, std::ptr::null()) != 0 {
                return Err(io::Error::last_os_error());
            }
            let bind = libc::MS_BIND | libc::MS_REC;
            if libc::mount(source.as_ptr(), target.as_ptr(), std::ptr::null(), bind, std::ptr::null()) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    command
}
