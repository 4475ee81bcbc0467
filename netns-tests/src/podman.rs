//! podman (Debian's 4.3, CNI backend) run by a test: every `podman` command runs in the test's node netns and
//! in a private mount namespace held by a guard process (see [`crate::daemon`]: `/run`, `/dev/shm` and
//! `/var/lib/cni` are the test's own there), with its root, runroot, tmpdir, `CONTAINERS_CONF`, CNI plugin
//! directory and network config directory in the test's directory. Dropping the guard kills the holder, conmon
//! and the containers by PID.

use std::fs;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use cnicore::netns::NetNs;

use crate::daemon::{self, toml_str, Daemon};
use crate::images;
use crate::upstream::VarLibCni;
use crate::{Node, Value};

/// What this sandbox needs on every `podman run` (its default limits are above the sandbox's).
pub const RUN_LIMITS: &[&str] = &["--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024"];

/// True if podman, runc and busybox-static are installed (else skipped, or failed under CI=true).
pub fn available() -> bool {
    crate::require(
        "podman/runc/busybox-static",
        crate::on_path("podman") && crate::on_path("runc") && images::have_busybox(),
        "run scripts/setup.sh (installs podman, runc, busybox-static)",
    )
}

/// A podman "installation" private to a test.
pub struct Podman {
    /// Everything of it: config, storage, network configs.
    pub dir: PathBuf,
    /// `network_config_dir`: podman's CNI conflists.
    pub net_dir: PathBuf,
    /// The directory mounted over `/var/lib/cni` for podman (libcni's result cache, host-local's default
    /// `dataDir` `/var/lib/cni/networks`).
    pub var_lib_cni: PathBuf,
    /// The node's netns, which podman runs in.
    node_netns: PathBuf,
    /// Killed with its mount namespace (conmon, the containers) on drop.
    holder: Daemon,
}

impl Podman {
    /// Sets podman up in `node` with the CNI plugins of `plugin_dir`, and loads the busybox image.
    pub fn new(node: &Node, plugin_dir: &Path) -> Podman {
        daemon::sweep_stale_daemons();
        let dir = node.dir().join("podman");
        let net_dir = dir.join("net.d");
        for d in [&dir, &net_dir, &dir.join("tmp")] {
            fs::create_dir_all(d).unwrap_or_else(|e| panic!("create {}: {e}", d.display()));
        }
        let conf = format!(
            r#"[network]
network_backend = "cni"
cni_plugin_dirs = [{plugins}]
network_config_dir = {net}

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
events_logfile_path = {events}
tmp_dir = {tmp}
image_copy_tmp_dir = {tmp}
"#,
            plugins = toml_str(plugin_dir),
            net = toml_str(&net_dir),
            events = toml_str(&dir.join("events.log")),
            tmp = toml_str(&dir.join("tmp")),
        );
        fs::write(dir.join("containers.conf"), conf).expect("write containers.conf");

        // The holder: a process that keeps the private mount namespace, named after the test directory so
        // that a sweep recognises it.
        let var_lib_cni = VarLibCni::new(&dir);
        let mut command = node.command("sleep");
        command
            .arg0(format!("podman-holder {}", dir.display()))
            .arg("86400")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        daemon::with_private_mounts(&mut command, &var_lib_cni, &["/run", "/dev/shm"]);
        let holder = Daemon::spawn(&mut command);
        let podman = Podman { var_lib_cni: var_lib_cni.path(), dir, net_dir, node_netns: node.path.clone(), holder };
        let archive = images::busybox_archive(&podman.dir);
        podman.ok(&["load", "--quiet", "--input", &archive.display().to_string()]);
        podman
    }

    /// A command that runs where podman runs: the node's netns and podman's private mount namespace (for a
    /// daemon podman's plugins talk to, such as the dhcp daemon on its default socket under `/run`).
    pub fn command_beside(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mnt = fs::File::open(format!("/proc/{}/ns/mnt", self.holder.id())).expect("holder's mount namespace");
        let mut command = Command::new(program);
        let netns = NetNs::open(&self.node_netns).expect("the node netns");
        daemon::entering(&mut command, mnt, netns);
        command
    }

    /// `podman run -d --name <name> <options>` of busybox's httpd (serving [`images::INDEX_HTML`] on port 80)
    /// with the test's limits; unless it starts, panics with podman's output and `context()` (what else explains
    /// the failure: the plugin calls, a daemon's log).
    pub fn run_httpd(&self, name: &str, options: &[&str], context: impl FnOnce() -> String) {
        let mut args = vec!["run", "-d", "--name", name];
        args.extend_from_slice(options);
        args.extend_from_slice(RUN_LIMITS);
        args.push(images::BUSYBOX_IMAGE);
        args.extend_from_slice(images::HTTPD_COMMAND);
        let run = self.run(&args);
        assert!(
            run.status.success(),
            "podman run: {}{}\n{}",
            String::from_utf8_lossy(&run.stdout),
            String::from_utf8_lossy(&run.stderr),
            context()
        );
    }

    /// `podman <args>` as the test's user would run it on the node.
    pub fn run(&self, args: &[&str]) -> Output {
        let mut command = self.command_beside("podman");
        command
            .env("CONTAINERS_CONF", self.dir.join("containers.conf"))
            .arg("--root")
            .arg(self.dir.join("root"))
            .arg("--runroot")
            .arg(self.dir.join("runroot"))
            .arg("--tmpdir")
            .arg(self.dir.join("tmp"))
            .args(["--storage-driver", "vfs"])
            .args(args)
            .stdin(Stdio::null());
        command.output().unwrap_or_else(|e| panic!("run podman: {e}"))
    }

    /// `podman <args>` that must succeed: its stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let output = self.run(args);
        assert!(
            output.status.success(),
            "podman {} failed ({}): {}{}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// `podman inspect` of one container.
    pub fn inspect(&self, name: &str) -> Value {
        let text = self.ok(&["inspect", name]);
        let all: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("podman inspect {text}: {e}"));
        all[0].clone()
    }

    /// A path as podman sees it (in its mount namespace), e.g. a container's `SandboxKey`.
    pub fn path_in_daemon(&self, path: &str) -> PathBuf {
        daemon::path_in_mount_ns(self.holder.id(), path)
    }

    /// The network namespaces podman has mounted (`/run/netns` in its mount namespace).
    pub fn netns_names(&self) -> Vec<String> {
        daemon::netns_names(self.holder.id())
    }
}
