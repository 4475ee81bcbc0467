//! containerd (the machine's, or Debian's 1.6, 1.7 or 2.1 as `scripts/cluster.sh containerd` fetches them) started
//! by a test, as a node runs it for the kubelet: the CRI plugin with CNI,
//! inside the test's node netns (see [`crate::daemon`] for its private mount namespace), with its root, state,
//! socket, CNI `conf_dir`, the plugins' `bin_dir` and the result cache all in the test's directory. The guard
//! kills it, its shims and the containers by PID when dropped, also when the test panics.
//!
//! The sandbox image is the busybox image of [`crate::images`], imported before any pod runs, so containerd
//! never tries to pull (and could not: the node netns has no route out, the registry name cannot resolve).

use std::fs;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::daemon::{self, http_get, Daemon};
use crate::images::{self, BUSYBOX_IMAGE};
use crate::upstream::VarLibCni;
use crate::{Node, Value};

/// The metrics address, on the node netns' own loopback.
pub const METRICS_ADDR: &str = "127.0.0.1:1338";

/// True if containerd, ctr and runc are installed (else skipped, or failed under CI=true).
pub fn available() -> bool {
    let tools = ["containerd", "ctr", "runc", "containerd-shim-runc-v2"];
    crate::require(
        "containerd/ctr/runc/busybox-static",
        tools.iter().all(|t| crate::on_path(t)) && images::have_busybox(),
        "run scripts/setup.sh (installs containerd, runc, busybox-static)",
    )
}

/// How to run containerd's CRI plugin.
pub struct ContainerdConfig {
    /// CNI `bin_dir`: where containerd finds the plugins.
    pub cni_bin_dir: PathBuf,
    /// A conflist written into the CNI `conf_dir` before containerd starts, as `10-test.conflist`.
    pub conflist: Option<Value>,
    /// containerd's `conf_template` (a Go template): rendered into the conf_dir on UpdateRuntimeConfig.
    pub conf_template: Option<String>,
}

/// Where containerd VERSION's binaries are: `None` for the machine's own (`system`, found on PATH), else the
/// directory `scripts/cluster.sh containerd VERSION` prints (Debian's package, fetched and unpacked once).
pub fn binaries(version: &str) -> Option<PathBuf> {
    if version == "system" {
        return None;
    }
    Some(PathBuf::from(cluster_script(&["containerd", version]).trim()))
}

/// `scripts/cluster.sh ARGS...`'s output, for commands that concern no cluster.
fn cluster_script(args: &[&str]) -> String {
    crate::cluster::script_stdout(crate::cluster::DEFAULT_NAME, args)
}

/// A running containerd.
pub struct Containerd {
    /// Everything of this daemon: config, root, state, socket, logs.
    pub dir: PathBuf,
    /// The CRI (and containerd) gRPC socket.
    pub socket: PathBuf,
    /// The CNI conf_dir.
    pub conf_dir: PathBuf,
    /// The directory mounted over `/var/lib/cni` in containerd's mount namespace (libcni's result cache).
    pub var_lib_cni: PathBuf,
    log: PathBuf,
    daemon: Daemon,
    /// `ctr` of the same version.
    ctr: PathBuf,
}

impl Containerd {
    /// Starts the machine's containerd in `node`, waits for its socket and imports the busybox image.
    pub fn start(node: &Node, config: ContainerdConfig) -> Containerd {
        Containerd::start_version(node, config, "system")
    }

    /// [`Containerd::start`] with containerd `version` (`system`, `1.6`, `1.7`, `2.1`; see [`binaries`]): its
    /// directory first on PATH, so containerd runs its own shim; config version 3 for 2.x.
    pub fn start_version(node: &Node, config: ContainerdConfig, version: &str) -> Containerd {
        daemon::sweep_stale_daemons();
        let dir = node.dir().join("containerd");
        let conf_dir = dir.join("net.d");
        for d in [&dir, &conf_dir] {
            fs::create_dir_all(d).unwrap_or_else(|e| panic!("create {}: {e}", d.display()));
        }
        let socket = dir.join("containerd.sock");
        if let Some(conflist) = &config.conflist {
            let text = serde_json::to_vec_pretty(conflist).expect("conflist json");
            fs::write(conf_dir.join("10-test.conflist"), text).expect("write conflist");
        }
        let template = config.conf_template.as_ref().map(|text| {
            let path = dir.join("cni-conf-template");
            fs::write(&path, text).expect("write conf_template");
            path
        });
        let toml = config_toml(version, &dir, &socket, &config.cni_bin_dir, &conf_dir, template.as_deref());
        let config_path = dir.join("config.toml");
        fs::write(&config_path, toml).expect("write containerd config");

        let var_lib_cni = VarLibCni::new(&dir);
        let log = dir.join("containerd.log");
        let log_file = fs::File::create(&log).expect("containerd log");
        let bin = binaries(version);
        let program = |name: &str| bin.as_ref().map_or_else(|| PathBuf::from(name), |b| b.join(name));
        let mut command = node.command(program("containerd"));
        if let Some(bin) = &bin {
            let path = std::env::var("PATH").unwrap_or_default();
            command.env("PATH", format!("{}:{path}", bin.display()));
        }
        command
            .arg("--config")
            .arg(&config_path)
            .stdin(Stdio::null())
            .stdout(log_file.try_clone().expect("log fd"))
            .stderr(log_file);
        daemon::with_private_mounts(&mut command, &var_lib_cni, &["/run"]);
        let daemon = Daemon::spawn(&mut command);
        let containerd =
            Containerd { var_lib_cni: var_lib_cni.path(), dir, socket, conf_dir, log, daemon, ctr: program("ctr") };
        containerd.wait_for_socket(Duration::from_secs(20));
        let archive = images::busybox_archive(&containerd.dir);
        containerd.ctr(&["images", "import", &archive.display().to_string()]);
        containerd
    }

    /// containerd's PID.
    pub fn pid(&self) -> u32 {
        self.daemon.id()
    }

    fn wait_for_socket(&self, timeout: Duration) {
        let alive = || Path::new(&format!("/proc/{}", self.pid())).exists();
        crate::wait_for(timeout, || self.socket.exists() || !alive());
        assert!(self.socket.exists(), "containerd did not start:\n{}", self.log_tail(30));
    }

    /// Runs `ctr -n k8s.io <args>` against this daemon; panics if it fails. Returns stdout.
    pub fn ctr(&self, args: &[&str]) -> String {
        let output = Command::new(&self.ctr)
            .arg("--address")
            .arg(&self.socket)
            .args(["--namespace", "k8s.io"])
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("run ctr: {e}"));
        assert!(
            output.status.success(),
            "ctr {}: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// The last `lines` lines of containerd's log.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// The last `lines` warnings and errors of containerd's log (what explains a failed CRI call).
    pub fn log_problems(&self, lines: usize) -> String {
        let text = fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().filter(|l| l.contains("level=error") || l.contains("level=warn")).collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// containerd's whole log.
    pub fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// A path as containerd sees it (in its mount namespace), e.g. a pod netns `/var/run/netns/cni-...`.
    pub fn path_in_daemon(&self, path: &str) -> PathBuf {
        daemon::path_in_mount_ns(self.pid(), path)
    }

    /// The network namespaces containerd has mounted (`/run/netns` in its mount namespace).
    pub fn netns_names(&self) -> Vec<String> {
        daemon::netns_names(self.pid())
    }

    /// The text of containerd's Prometheus metrics endpoint (read from inside the node netns).
    pub fn metrics(&self, node: &Node) -> String {
        let addr: SocketAddr = METRICS_ADDR.parse().expect("constant");
        http_get(node, addr, "/v1/metrics").unwrap_or_else(|e| panic!("containerd metrics: {e}"))
    }
}

/// The nodes' containerd config (`cluster.sh containerd-config`: the one template, version 2 or 3 as `version`
/// wants) with every path in the test's directory and busybox as the sandbox image.
fn config_toml(
    version: &str,
    dir: &Path,
    socket: &Path,
    bin_dir: &Path,
    conf_dir: &Path,
    template: Option<&Path>,
) -> String {
    let setting = |key: &str, path: &Path| format!("{key}={}", path.display());
    let mut args = vec![
        "containerd-config".to_string(),
        version.to_string(),
        setting("root", &dir.join("root")),
        setting("state", &dir.join("state")),
        setting("socket", socket),
        setting("ttrpc", &dir.join("containerd.sock.ttrpc")),
        setting("opt", &dir.join("opt")),
        format!("sandbox={BUSYBOX_IMAGE}"),
        setting("bin-dir", bin_dir),
        setting("conf-dir", conf_dir),
    ];
    args.extend(template.map(|t| setting("template", t)));
    cluster_script(&args.iter().map(String::as_str).collect::<Vec<_>>())
}
