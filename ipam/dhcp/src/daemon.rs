//! `dhcp daemon`: the reference's flags (`-socketpath`, `-pidfile`, `-hostprefix`, `-broadcast`, `-timeout`,
//! `-resendmax`, `-resendtimeout`) plus `-statedir`, a unix socket (or one fd from systemd socket
//! activation), a thread per connection and one per lease.

use crate::conf::{self, DEFAULT_SOCKET_PATH};
use crate::lease::{self, Lease, Settings, Wanted};
use crate::log::say;
use crate::rpc::{self, Request};
use cnicore::spec::{codes, io_error, parse_cni_args, CniResult, Error, Result};
use std::collections::HashMap;
use std::os::fd::FromRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub const DEFAULT_STATE_DIR: &str = "/var/lib/cni/dhcp";

#[derive(Debug, PartialEq)]
struct Flags {
    pidfile: String,
    host_prefix: String,
    socket_path: String,
    broadcast: bool,
    timeout: Duration,
    resend_max: Duration,
    resend_timeout: Duration,
    state_dir: String,
}

const USAGE: &str = "Usage of daemon:
  -broadcast          broadcast DHCP leases
  -hostprefix string  optional prefix to host root
  -pidfile string     optional path to write daemon PID to
  -resendmax duration optional dhcp client max resend delay between requests (default 1m2s)
  -resendtimeout duration
                      optional dhcp client resend timeout, no more retries after this timeout (default 3m28s)
  -socketpath string  optional dhcp server socketpath (default /run/cni/dhcp.sock)
  -statedir string    where the leases held are saved, to be kept across restarts (default /var/lib/cni/dhcp)
  -timeout duration   optional dhcp client timeout duration for each request (default 10s)";

/// Go's `time.ParseDuration`: `[-+]?(number unit)+` or `0`; units ns, us, µs, ms, s, m, h.
fn parse_duration(s: &str) -> Option<Duration> {
    if s == "0" {
        return Some(Duration::ZERO);
    }
    let mut rest = s.strip_prefix('+').unwrap_or(s);
    if rest.is_empty() || rest.starts_with('-') {
        return None;
    }
    let mut total = 0f64;
    while !rest.is_empty() {
        let num_len = rest.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(rest.len());
        let number: f64 = rest[..num_len].parse().ok()?;
        rest = &rest[num_len..];
        let unit_len = rest.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(rest.len());
        let scale = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        rest = &rest[unit_len..];
        total += number * scale;
    }
    Duration::try_from_secs_f64(total).ok()
}

/// Why the flags were not parsed: help asked for (usage on stdout, exit 0) or a bad flag (Go's `flag`
/// message, usage on stderr, exit 2).
#[derive(Debug, PartialEq)]
enum FlagError {
    Help,
    Invalid(String),
}

impl std::fmt::Display for FlagError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FlagError::Help => f.write_str("help requested"),
            FlagError::Invalid(why) => f.write_str(why),
        }
    }
}

/// Go's `flag` package rules: `-name value`, `-name=value`, one or two dashes, booleans without a value.
fn parse_flags(args: &[String]) -> std::result::Result<Flags, FlagError> {
    let invalid = FlagError::Invalid;
    let mut f = Flags {
        pidfile: String::new(),
        host_prefix: String::new(),
        socket_path: String::new(),
        broadcast: false,
        timeout: Duration::from_secs(10),
        resend_max: Duration::from_secs(62),
        resend_timeout: Duration::from_secs(208),
        state_dir: DEFAULT_STATE_DIR.into(),
    };
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        if arg == "--" || !arg.starts_with('-') || arg == "-" {
            break;
        }
        let body = arg.strip_prefix("--").unwrap_or(&arg[1..]);
        let (name, inline) = match body.split_once('=') {
            Some((n, v)) => (n, Some(v.to_string())),
            None => (body, None),
        };
        if name == "h" || name == "help" {
            return Err(FlagError::Help);
        }
        if name == "broadcast" {
            f.broadcast = match inline.as_deref() {
                None | Some("1" | "t" | "T" | "true" | "TRUE" | "True") => true,
                Some("0" | "f" | "F" | "false" | "FALSE" | "False") => false,
                Some(v) => return Err(invalid(format!("invalid boolean value {v:?} for -broadcast"))),
            };
            continue;
        }
        if !["pidfile", "hostprefix", "socketpath", "statedir", "timeout", "resendmax", "resendtimeout"].contains(&name)
        {
            return Err(invalid(format!("flag provided but not defined: -{name}")));
        }
        let value = match inline {
            Some(v) => v,
            None => it.next().cloned().ok_or_else(|| invalid(format!("flag needs an argument: -{name}")))?,
        };
        let duration = |v: &str| {
            parse_duration(v).ok_or_else(|| invalid(format!("invalid value {v:?} for flag -{name}: parse error")))
        };
        match name {
            "pidfile" => f.pidfile = value,
            "hostprefix" => f.host_prefix = value,
            "socketpath" => f.socket_path = value,
            "statedir" => f.state_dir = value,
            "timeout" => f.timeout = duration(&value)?,
            "resendmax" => f.resend_max = duration(&value)?,
            _ => f.resend_timeout = duration(&value)?,
        }
    }
    if f.socket_path.is_empty() {
        f.socket_path = DEFAULT_SOCKET_PATH.into();
    }
    Ok(f)
}

/// The payload of our `DHCP.GC`: the network and its valid attachments (containerID, ifname).
#[derive(serde::Serialize, serde::Deserialize)]
pub struct GcRequest {
    pub network: String,
    pub valid: Vec<(String, String)>,
}

struct Daemon {
    settings: Arc<Settings>,
    leases: Mutex<HashMap<Vec<u8>, Arc<Lease>>>,
}

impl Daemon {
    fn lease(&self, client_id: &[u8]) -> Option<Arc<Lease>> {
        self.leases.lock().unwrap().get(client_id).cloned()
    }

    fn allocate(&self, req: &Request) -> Result<Option<CniResult>> {
        let conf = conf::parse(&req.stdin, &parse_cni_args(&req.args)?)?;
        let client_id = conf::client_id(&req.container_id, &conf.name, &req.ifname);
        let held = match self.lease(&client_id).filter(|l| l.is_alive()) {
            // A second ADD (or the reference's CHECK) of an attachment: the lease it has.
            Some(existing) => existing.held.clone(),
            None => {
                if req.netns.is_empty() {
                    return Err(Error::env("CNI_NETNS is required"));
                }
                let wanted = Wanted {
                    client_id: client_id.clone(),
                    container_id: req.container_id.clone(),
                    network: conf.name.clone(),
                    netns: req.netns.clone(),
                    ifname: req.ifname.clone(),
                    options: conf.options,
                    priority: conf.priority,
                };
                let lease = Arc::new(lease::acquire(self.settings.clone(), wanted)?);
                let held = lease.held.clone();
                // Two ADDs of one attachment at once: the later lease stays, the other is given back.
                let replaced = self.leases.lock().unwrap().insert(client_id, lease);
                if let Some(old) = replaced {
                    old.release();
                }
                held
            }
        };
        let result = held.lock().unwrap().result()?;
        Ok(Some(result))
    }

    fn release(&self, req: &Request) -> Result<Option<CniResult>> {
        // Only the name: a config this daemon would refuse for an ADD must not keep its lease from going.
        let (name, _) = conf::for_release(&req.stdin)?;
        let client_id = conf::client_id(&req.container_id, &name, &req.ifname);
        let lease = self.leases.lock().unwrap().remove(&client_id);
        if let Some(lease) = lease {
            lease.release();
        }
        Ok(None)
    }

    fn check(&self, req: &Request) -> Result<Option<CniResult>> {
        let conf = conf::parse(&req.stdin, &parse_cni_args(&req.args)?)?;
        let client_id = conf::client_id(&req.container_id, &conf.name, &req.ifname);
        match self.lease(&client_id) {
            Some(l) if l.is_alive() => Ok(None),
            _ => Err(Error::new(
                codes::INTERNAL,
                format!("the DHCP daemon holds no lease for {}", String::from_utf8_lossy(&client_id)),
            )),
        }
    }

    /// Releases the leases of the network that no valid attachment has (ours only: the reference has no GC).
    fn gc(&self, req: &Request) -> Result<Option<CniResult>> {
        let gc: GcRequest =
            serde_json::from_slice(&req.stdin).map_err(|e| Error::decode(format!("invalid DHCP.GC request: {e}")))?;
        let stale: Vec<(Vec<u8>, Arc<Lease>)> = {
            let mut leases = self.leases.lock().unwrap();
            let ids: Vec<Vec<u8>> = leases
                .iter()
                .filter(|(_, l)| {
                    let h = l.held.lock().unwrap();
                    h.network == gc.network && !gc.valid.iter().any(|(c, i)| *c == h.container_id && *i == h.ifname)
                })
                .map(|(id, _)| id.clone())
                .collect();
            ids.into_iter().filter_map(|id| leases.remove(&id).map(|l| (id, l))).collect()
        };
        for (id, lease) in stale {
            say(format_args!(
                "{}: not a valid attachment of {}: released by GC",
                String::from_utf8_lossy(&id),
                gc.network
            ));
            lease.release();
        }
        Ok(None)
    }

    fn handle(&self, req: &Request) -> Result<Option<CniResult>> {
        match req.method.as_str() {
            "DHCP.Allocate" => self.allocate(req),
            "DHCP.Release" => self.release(req),
            "DHCP.Check" => self.check(req),
            "DHCP.GC" => self.gc(req),
            m => Err(Error::internal(format!("rpc: can't find method {m}"))),
        }
    }

    fn serve(&self, stream: UnixStream) {
        if let Err(e) = rpc::serve(stream, |req| self.handle(req)) {
            say(format_args!("a client's connection: {e}"));
        }
    }
}

/// The socket systemd passed (LISTEN_FDS=1), else a new one at `path`. A socket file left by a daemon that
/// died is replaced; one a live daemon answers on is not.
fn listener(path: &Path) -> Result<UnixListener> {
    let ours = std::env::var("LISTEN_PID").ok().and_then(|p| p.parse::<u32>().ok()) == Some(std::process::id());
    match std::env::var("LISTEN_FDS").ok().filter(|_| ours).as_deref() {
        Some("1") => {
            // SAFETY: systemd hands fd 3 to this process for it to own (sd_listen_fds(3)).
            return Ok(unsafe { UnixListener::from_raw_fd(3) });
        }
        Some(n) if n != "0" => return Err(Error::io(format!("Too many ({n}) FDs passed through socket activation"))),
        _ => {}
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(io_error(format!("creating {}", dir.display())))?;
    }
    if path.exists() {
        if UnixStream::connect(path).is_ok() {
            return Err(Error::io(format!("a daemon is already listening on {}", path.display())));
        }
        let _ = std::fs::remove_file(path);
    }
    UnixListener::bind(path).map_err(io_error(format!("listen unix {}", path.display())))
}

fn fail(msg: &str) -> ! {
    say(format_args!("{msg}"));
    std::process::exit(1)
}

/// `-pidfile`: the daemon's pid, as the reference writes it (an absolute path or nothing).
fn write_pidfile(pidfile: &str) {
    if pidfile.is_empty() {
        return;
    }
    if !pidfile.starts_with('/') {
        fail(&format!("Error writing pidfile {pidfile:?}: path not absolute"));
    }
    if let Err(e) = std::fs::write(pidfile, std::process::id().to_string()) {
        fail(&format!("Error writing pidfile {pidfile:?}: {e}"));
    }
}

/// A thread that waits for SIGINT or SIGTERM, then removes the socket and the pidfile and exits. The leases stay
/// saved: a new daemon resumes them.
fn exit_on_signal(signals: nix::sys::signal::SigSet, socket_path: PathBuf, pidfile: String) {
    std::thread::spawn(move || {
        let _ = signals.wait();
        let _ = std::fs::remove_file(&socket_path);
        if !pidfile.is_empty() {
            let _ = std::fs::remove_file(&pidfile);
        }
        std::process::exit(0)
    });
}

pub fn main(args: &[String]) -> ! {
    let flags = match parse_flags(args) {
        Ok(f) => f,
        Err(FlagError::Help) => {
            eprintln!("{USAGE}");
            std::process::exit(0)
        }
        Err(e) => {
            eprintln!("{e}\n{USAGE}");
            std::process::exit(2)
        }
    };
    // SIGINT and SIGTERM are taken by one thread (blocked in all others, which inherit the mask).
    let signals = {
        use nix::sys::signal::{SigSet, Signal};
        let mut set = SigSet::empty();
        set.add(Signal::SIGINT);
        set.add(Signal::SIGTERM);
        set.thread_block().unwrap_or_else(|e| fail(&format!("blocking signals: {e}")));
        set
    };
    write_pidfile(&flags.pidfile);
    let socket_path = PathBuf::from(format!("{}{}", flags.host_prefix, flags.socket_path));
    let listener = listener(&socket_path).unwrap_or_else(|e| fail(&format!("Error getting listener: {e}")));
    let state_dir = PathBuf::from(&flags.state_dir);
    if let Err(e) = cnicore::state::ensure_dir(&state_dir, 0o700) {
        fail(&format!("state directory {}: {e}", state_dir.display()));
    }
    exit_on_signal(signals, socket_path.clone(), flags.pidfile.clone());
    let settings = Arc::new(Settings {
        broadcast: flags.broadcast,
        timeout: flags.timeout,
        resend_max: flags.resend_max,
        resend_timeout: flags.resend_timeout,
        host_prefix: flags.host_prefix.clone(),
        state_dir: state_dir.clone(),
    });
    let daemon = Arc::new(Daemon { settings: settings.clone(), leases: Mutex::new(HashMap::new()) });
    for held in lease::load_saved(&state_dir) {
        let id = held.client_id.clone();
        daemon.leases.lock().unwrap().insert(id, Arc::new(lease::resume(settings.clone(), held)));
    }
    say(format_args!("listening on {}", socket_path.display()));
    for stream in listener.incoming() {
        match stream {
            Ok(stream) => {
                let daemon = daemon.clone();
                std::thread::spawn(move || daemon.serve(stream));
            }
            Err(e) => say(format_args!("accept: {e}")),
        }
    }
    std::process::exit(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn go_durations() {
        assert_eq!(parse_duration("10s"), Some(Duration::from_secs(10)));
        assert_eq!(parse_duration("1m2s"), Some(Duration::from_secs(62)));
        assert_eq!(parse_duration("1.5h"), Some(Duration::from_secs(5400)));
        assert_eq!(parse_duration("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(parse_duration("0"), Some(Duration::ZERO));
        for bad in ["", "10", "s", "-1s", "1x", "1.2.3s"] {
            assert_eq!(parse_duration(bad), None, "{bad}");
        }
    }

    #[test]
    fn go_flags() {
        let f = parse_flags(&args(&["-socketpath", "/t/s.sock", "--broadcast", "-timeout=3s", "-resendmax", "8s"]))
            .unwrap();
        assert_eq!(f.socket_path, "/t/s.sock");
        assert!(f.broadcast);
        assert_eq!(f.timeout, Duration::from_secs(3));
        assert_eq!(f.resend_max, Duration::from_secs(8));
        assert_eq!(f.resend_timeout, Duration::from_secs(208));
        assert_eq!(f.state_dir, DEFAULT_STATE_DIR);
        let f = parse_flags(&args(&["-broadcast=false", "-statedir", "/s"])).unwrap();
        assert!(!f.broadcast);
        assert_eq!(f.socket_path, DEFAULT_SOCKET_PATH);
        assert_eq!(f.state_dir, "/s");
        assert!(parse_flags(&args(&["-nope"])).unwrap_err().to_string().contains("not defined"));
        assert!(parse_flags(&args(&["-timeout"])).unwrap_err().to_string().contains("needs an argument"));
        assert!(parse_flags(&args(&["-timeout", "x"])).is_err());
        assert_eq!(parse_flags(&args(&["-h"])).unwrap_err(), FlagError::Help);
    }
}
