//! What the runtime guards ([`crate::containerd`], [`crate::podman`]) share: a private mount namespace per
//! daemon, and ending every process of it by PID.
//!
//! A runtime started by a test runs in the test's node netns and in a mount namespace of its own, private
//! from the host's, in which the test's directory is mounted over `/var/lib/cni` (libcni's result cache) and an
//! empty tmpfs over `/run` ([`with_private_mounts`]). The pod network namespaces the runtime makes
//! (`/run/netns/cni-*`), runc's and the shims' state and sockets, the containers' rootfs and `/dev/shm` mounts
//! all live in that mount namespace: the host's mount table, its `/run` and `ip netns list` never see them,
//! and they vanish with its last process. [`kill_mount_ns_tree`] ends them all: every process in the daemon's
//! mount namespace (the daemon, containerd's shims, podman's conmon) and every descendant of those (the
//! containers, which have mount namespaces of their own).

use std::collections::BTreeSet;
use std::ffi::CString;
use std::fs;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::Once;
use std::time::Duration;

use cnicore::netns::NetNs;
use nix::sched::{setns, CloneFlags};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

pub use crate::{on_path, require};

use crate::upstream::{with_var_lib_cni, VarLibCni};
use crate::TestNetns;

/// Every test directory's name starts with this (see [`crate::Node::new`]); daemons started by tests carry
/// their directory in their command line, which is how [`sweep_stale_daemons`] recognises them.
pub const DIR_MARK: &str = "cni-test";

/// Makes `command` run in a mount namespace of its own (see the module doc): private from the host's, with
/// `var_lib_cni` as `/var/lib/cni` and an empty tmpfs on each of `tmpfs` (e.g. `/run`: pod netns under
/// `/run/netns`, runc's and the shims' state and sockets, the xtables lock; `/dev/shm`: podman's lock
/// segment), so that what a runtime keeps there is its own and goes with it.
pub fn with_private_mounts<'a>(command: &'a mut Command, var_lib_cni: &VarLibCni, tmpfs: &[&str]) -> &'a mut Command {
    with_var_lib_cni(command, var_lib_cni);
    let targets: Vec<CString> = tmpfs.iter().map(|t| CString::new(*t).expect("mount point")).collect();
    // SAFETY: mount is a plain system call on C strings owned by the closure; async-signal-safe, as pre_exec
    // requires. It runs after with_var_lib_cni's closure, in the new mount namespace.
    unsafe {
        command.pre_exec(move || {
            let flags = libc::MS_NOSUID | libc::MS_NODEV;
            for target in &targets {
                let (source, options) = (c"tmpfs", c"mode=1777");
                if libc::mount(source.as_ptr(), target.as_ptr(), source.as_ptr(), flags, options.as_ptr().cast()) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    command
}

/// Makes `command` enter the mount namespace `mnt` (an open `/proc/PID/ns/mnt`) and the network namespace
/// `net` before it runs: a client of a runtime started with [`with_private_mounts`], seeing what it sees.
pub fn entering(command: &mut Command, mnt: fs::File, net: NetNs) -> &mut Command {
    // SAFETY: setns is a plain system call on descriptors the closure owns, safe between fork and exec.
    unsafe {
        command.pre_exec(move || {
            setns(net.fd(), CloneFlags::CLONE_NEWNET).map_err(std::io::Error::from)?;
            setns(&mnt, CloneFlags::CLONE_NEWNS).map_err(std::io::Error::from)
        });
    }
    command
}

/// `path` as process `pid` sees it in its mount namespace (through `/proc/PID/root`).
pub fn path_in_mount_ns(pid: u32, path: &str) -> PathBuf {
    // An absolute symlink under /proc/PID/root resolves from our root, not the process's: follow
    // /var/run -> /run here, so that the rest is looked up in the process's mounts.
    let path = match path.strip_prefix("/var/run/") {
        Some(rest) => format!("/run/{rest}"),
        None => path.to_string(),
    };
    PathBuf::from(format!("/proc/{pid}/root{path}"))
}

/// The network namespaces mounted in `/run/netns` of the mount namespace of process `pid`.
pub fn netns_names(pid: u32) -> Vec<String> {
    let Ok(entries) = fs::read_dir(path_in_mount_ns(pid, "/run/netns")) else { return Vec::new() };
    let mut names: Vec<String> = entries.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    names
}

/// A path as a TOML basic string (JSON's escaping is valid TOML), for the runtimes' config files.
pub fn toml_str(path: &Path) -> String {
    serde_json::to_string(&path.display().to_string()).expect("string")
}

/// A process a test started (a daemon), ended by PID when the guard drops, also when the test panics: SIGKILLed
/// and reaped. A daemon in a mount namespace of its own ([`with_private_mounts`]) goes with every process of
/// that namespace and their descendants ([`kill_mount_ns_tree`]: containerd's shims, podman's conmon, the
/// containers).
pub struct Daemon {
    /// `None` once stopped (or for a guard of nothing yet).
    pub(crate) child: Option<Child>,
}

impl Daemon {
    pub fn spawn(command: &mut Command) -> Daemon {
        let child = command.spawn().unwrap_or_else(|e| panic!("cannot run {command:?}: {e}"));
        Daemon { child: Some(child) }
    }

    /// The process's PID, as [`Child::id`] (0 once stopped).
    pub fn id(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    pub fn signal(&self, signal: Signal) {
        if let Some(child) = &self.child {
            let _ = kill(Pid::from_raw(child.id() as i32), signal);
        }
    }

    /// Sends `signal` and waits for the process to end.
    pub fn stop(&mut self, signal: Signal) {
        self.signal(signal);
        if let Some(mut child) = self.child.take() {
            let _ = child.wait();
        }
    }

    /// SIGTERM, up to `grace` to end (a daemon that cleans up on exit), then SIGKILL.
    pub fn terminate(&mut self, grace: Duration) {
        self.signal(Signal::SIGTERM);
        crate::wait_for(grace, || !self.is_running());
        self.stop(Signal::SIGKILL);
    }

    pub fn is_running(&mut self) -> bool {
        self.child.as_mut().is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// True once the process has exited (a zombie not yet reaped, or gone), seen without reaping it.
    pub fn has_exited(&self) -> bool {
        let stat = fs::read_to_string(format!("/proc/{}/stat", self.id())).unwrap_or_default();
        // pid (comm) STATE ...: the comm may hold spaces and parentheses, the state follows the last ')'.
        stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().next()).is_none_or(|state| state == "Z")
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let pid = self.id();
        let own = mount_ns(std::process::id());
        if pid != 0 && own.is_some() && mount_ns(pid).is_some_and(|ns| Some(ns) != own) {
            kill_mount_ns_tree(pid);
        }
        self.stop(Signal::SIGKILL);
    }
}

/// The mount namespace of a process (`mnt:[inode]`), or None if it is gone.
fn mount_ns(pid: u32) -> Option<PathBuf> {
    fs::read_link(format!("/proc/{pid}/ns/mnt")).ok()
}

/// Every process: (pid, parent pid).
fn processes() -> Vec<(u32, u32)> {
    let Ok(entries) = fs::read_dir("/proc") else { return Vec::new() };
    entries
        .flatten()
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            // pid (comm) state ppid ...: comm may hold spaces and parentheses, so split after the last ')'.
            let ppid = stat.rsplit_once(')')?.1.split_whitespace().nth(1)?.parse().ok()?;
            Some((pid, ppid))
        })
        .collect()
}

/// The processes in the mount namespace of `root` and all their descendants (including `root`).
pub fn mount_ns_tree(root: u32) -> BTreeSet<u32> {
    let Some(ns) = mount_ns(root) else { return BTreeSet::new() };
    let all = processes();
    let mut tree: BTreeSet<u32> =
        all.iter().filter(|(pid, _)| mount_ns(*pid).as_ref() == Some(&ns)).map(|(pid, _)| *pid).collect();
    tree.insert(root);
    loop {
        let before = tree.len();
        for (pid, ppid) in &all {
            if tree.contains(ppid) {
                tree.insert(*pid);
            }
        }
        if tree.len() == before {
            return tree;
        }
    }
}

/// SIGKILLs every process of [`mount_ns_tree`]`(root)` and waits (up to 10 s) until they are gone. `root`
/// must be in a mount namespace other than the caller's (a daemon started with [`crate::upstream::with_var_lib_cni`]).
pub fn kill_mount_ns_tree(root: u32) {
    let own = mount_ns(std::process::id());
    if own.is_some() && mount_ns(root) == own {
        // Never sweep the host's namespace: only the daemon itself.
        eprintln!("process {root} shares the test's mount namespace: killing it alone");
        let _ = kill(Pid::from_raw(root as i32), Signal::SIGKILL);
        return;
    }
    let tree = mount_ns_tree(root);
    let me = std::process::id();
    for pid in tree.iter().filter(|&&pid| pid != me && pid > 1) {
        let _ = kill(Pid::from_raw(*pid as i32), Signal::SIGKILL);
    }
    // Gone, or a zombie child of ours, which its owner reaps (the guard's Child::wait).
    let ended = |pid: &u32| {
        !Path::new(&format!("/proc/{pid}")).exists()
            || fs::read_to_string(format!("/proc/{pid}/stat"))
                .is_ok_and(|s| s.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')))
    };
    crate::wait_for(Duration::from_secs(10), || tree.iter().all(ended));
}

/// Kills (see [`kill_mount_ns_tree`]) the daemons of earlier test processes that were killed before their
/// guards ran: processes whose command line names a `<tmp>/cni-test<pid>-<n>` directory of a process that is gone.
pub fn sweep_stale_daemons() {
    static SWEEP: Once = Once::new();
    SWEEP.call_once(|| {
        let mark = std::env::temp_dir().join(DIR_MARK).display().to_string();
        for (pid, _) in processes() {
            let Ok(cmdline) = fs::read(format!("/proc/{pid}/cmdline")) else { continue };
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            let Some((_, rest)) = cmdline.split_once(&mark) else { continue };
            let owner: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
            let Ok(owner) = owner.parse::<u32>() else { continue };
            if owner != std::process::id() && !Path::new(&format!("/proc/{owner}")).exists() {
                eprintln!("killing a daemon left by test process {owner}: {pid} {cmdline}");
                kill_mount_ns_tree(pid);
            }
        }
    });
}

/// An HTTP/1.0 GET of `path` from `addr`, made from inside `ns`: the response body, or an error message.
pub fn http_get(ns: &TestNetns, addr: SocketAddr, path: &str) -> Result<String, String> {
    let mut stream = ns
        .run(|| TcpStream::connect_timeout(&addr, Duration::from_secs(3)))
        .map_err(|e| format!("connect to {addr} from {}: {e}", ns.name))?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).map_err(|e| e.to_string())?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").map_err(|e| format!("send to {addr}: {e}"))?;
    let mut response = String::new();
    stream.read_to_string(&mut response).map_err(|e| format!("read from {addr}: {e}"))?;
    let (head, body) = response.split_once("\r\n\r\n").ok_or_else(|| format!("no HTTP response: {response:?}"))?;
    if !head.starts_with("HTTP/1.") || head.split_whitespace().nth(1) != Some("200") {
        return Err(format!("HTTP error from {addr}: {head}"));
    }
    Ok(body.to_string())
}

/// `/metrics` of an agent at `addr` (from inside `ns`), parsed as the Prometheus text format, strictly: every
/// line a `# HELP`, a `# TYPE` of a known type, or a sample with a number, of a family typed before it. Panics
/// with the text when it is not.
pub fn scrape(ns: &TestNetns, addr: SocketAddr) -> prometheus_parse::Scrape {
    use prometheus_parse::{LineInfo, SampleType};
    let text = http_get(ns, addr, "/metrics").unwrap_or_else(|e| panic!("/metrics: {e}"));
    let mut typed = BTreeSet::new();
    for line in text.lines() {
        match LineInfo::parse(line) {
            LineInfo::Doc { .. } => {}
            LineInfo::Type { sample_type: SampleType::Untyped, .. } => panic!("an unknown type: {line:?}\n{text}"),
            LineInfo::Type { metric_name, metric_alias, .. } => {
                typed.insert(metric_alias.unwrap_or(metric_name));
            }
            LineInfo::Sample { metric_name, value, .. } => {
                let family = ["_bucket", "_sum", "_count"]
                    .iter()
                    .find_map(|suffix| metric_name.strip_suffix(suffix).filter(|f| typed.contains(*f)))
                    .unwrap_or(metric_name);
                assert!(typed.contains(family), "a sample without a # TYPE: {line:?}\n{text}");
                let number = matches!(value, "+Inf" | "-Inf" | "NaN") || value.parse::<f64>().is_ok();
                assert!(number, "not a number: {line:?}\n{text}");
            }
            LineInfo::Empty | LineInfo::Ignored => panic!("not the Prometheus text format: {line:?}\n{text}"),
        }
    }
    prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).expect("parsed")
}

/// The value of the sample `name` with `labels` (all of them, exactly) in `scrape`: counters, gauges and
/// untyped samples; a histogram's count.
pub fn sample(scrape: &prometheus_parse::Scrape, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    use prometheus_parse::Value;
    let sample = scrape.samples.iter().find(|s| {
        s.metric == name && s.labels.len() == labels.len() && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v))
    })?;
    match &sample.value {
        Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => Some(*v),
        Value::Histogram(buckets) => buckets.iter().map(|b| b.count).reduce(f64::max),
        Value::Summary(_) => None,
    }
}
