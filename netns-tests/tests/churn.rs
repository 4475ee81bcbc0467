//! Churn (issue 7): 8 workers at once, each adding and deleting pods over and over with the full kubenet chain
//! of `conf/` run by our cnitool (bridge + host-local, portmap with a TCP and a UDP host port, bandwidth both
//! ways), on one node; once with the iptables conflist, once with the nftables one (each on its own node).
//! Afterwards the node holds nothing of any pod (compared with the node before the first ADD, allowing only
//! the shared state described in `netns_tests::kubenet`: the bridge, node sysctls, the shared empty chains,
//! host-local's bookkeeping), and no address was ever given to two live pods.
//!
//! Every cycle is a new pod: a new netns (hence a new container ID), ADD, a ping of the gateway from the pod;
//! then the worker's previous pod is deleted (DEL, then its netns), so that each worker has one or two pods
//! live at any moment (8 to 16 in all). "Live" is tracked under one mutex shared by the workers: an address
//! joins the live set when its ADD has returned and leaves it just before its DEL starts, a window in which
//! the pod surely holds its lease, so an address found already live when an ADD returns was given to two
//! live pods.
//!
//! Environment: `CHURN_CYCLES` (ADD/DEL cycles of each test, default 320), `CHURN_WORKERS` (default 8).
//! `scripts/churn.sh CYCLES` runs long ones.

use netns_tests::kubenet;

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use kubenet::{cap_args, result_ips, Kubenet, GATEWAY_V4};
use netns_tests::{TestNetns, Value};

const DEFAULT_CYCLES: usize = 320;
const DEFAULT_WORKERS: usize = 8;
/// The first host port mapped (see [`host_port`]).
const FIRST_HOST_PORT: u16 = 30000;

fn env_number(name: &str, default: usize) -> usize {
    match std::env::var(name) {
        Ok(v) => v.parse().unwrap_or_else(|_| panic!("{name}={v:?} is not a number")),
        Err(_) => default,
    }
}

/// The addresses of live pods, with who holds them.
#[derive(Default)]
struct Live {
    holders: HashMap<IpAddr, String>,
    /// Addresses found live when another pod's ADD returned them.
    doubles: Vec<String>,
    /// The most pods live at once.
    peak: usize,
}

impl Live {
    fn added(&mut self, pod: &str, ips: &[IpAddr]) {
        for ip in ips {
            if let Some(holder) = self.holders.insert(*ip, pod.to_string()) {
                self.doubles.push(format!("{ip} given to {pod} while {holder} held it"));
            }
        }
        self.peak = self.peak.max(self.holders.len());
    }

    fn deleting(&mut self, ips: &[IpAddr]) {
        for ip in ips {
            self.holders.remove(ip);
        }
    }
}

/// What the workers share.
struct Shared<'a> {
    k: &'a Kubenet,
    live: Mutex<Live>,
    /// Cycles handed out so far (a worker takes the next until the total is reached).
    started: AtomicUsize,
    total: usize,
    /// Set by the first failure: the others stop.
    failed: AtomicBool,
    errors: Mutex<Vec<String>>,
}

impl Shared<'_> {
    fn fail(&self, msg: String) {
        self.failed.store(true, Ordering::SeqCst);
        self.errors.lock().expect("errors lock").push(msg);
    }
}

/// A pod added by a worker and not yet deleted.
struct Pod {
    netns: TestNetns,
    name: String,
    ips: Vec<IpAddr>,
    /// Its CAP_ARGS, which its DEL gets too.
    caps: Value,
}

/// Adds pod number `n` (overall) of `worker`, mapping host port `port`, and pings its gateway from it.
fn add_pod(shared: &Shared, worker: usize, n: usize, port: u16) -> Result<Pod, String> {
    let netns = TestNetns::new("chrn");
    let name = format!("pod {n} (worker {worker}, {})", netns.name);
    let caps = cap_args(port);
    let out = shared.k.cnitool("add", &netns, &caps, None);
    if !out.success() {
        return Err(format!("{name}: ADD failed ({}): {}{}", out.status, out.stdout_text, out.stderr));
    }
    let ips = result_ips(&out.stdout);
    if ips.is_empty() {
        return Err(format!("{name}: no address in {}", out.stdout_text));
    }
    shared.live.lock().expect("live lock").added(&name, &ips);
    let pod = Pod { netns, name, ips, caps };
    let gateway: IpAddr = GATEWAY_V4.parse().expect("constant");
    if !pod.netns.ping(gateway) {
        let e = format!("{}: no answer from the gateway {gateway} (address {:?})", pod.name, pod.ips);
        // Deleted all the same, so that the failure is about the ping only.
        return Err(del_pod(shared, pod).err().unwrap_or(e));
    }
    Ok(pod)
}

/// Deletes `pod` (its netns goes afterwards, as a runtime does).
fn del_pod(shared: &Shared, pod: Pod) -> Result<(), String> {
    shared.live.lock().expect("live lock").deleting(&pod.ips);
    let out = shared.k.cnitool("del", &pod.netns, &pod.caps, None);
    if !out.success() {
        return Err(format!("{}: DEL failed ({}): {}{}", pod.name, out.status, out.stdout_text, out.stderr));
    }
    Ok(())
}

/// The host port of a worker's pod in `slot` (0 or 1, alternating): the two live pods of a worker map
/// different ports, as two pods of one node must.
fn host_port(worker: usize, slot: usize) -> u16 {
    FIRST_HOST_PORT + (2 * worker + slot) as u16
}

/// Adds pods until the total is reached, each time deleting the previous one after the next was added, so
/// that 1 or 2 pods of each worker are live at any moment. Stops at the first failure.
fn worker(shared: &Shared, worker: usize) {
    let mut previous: Option<Pod> = None;
    let mut slot = 0;
    while !shared.failed.load(Ordering::SeqCst) {
        let n = shared.started.fetch_add(1, Ordering::SeqCst);
        if n >= shared.total {
            break;
        }
        let added = add_pod(shared, worker, n, host_port(worker, slot));
        slot = 1 - slot;
        if let Some(pod) = previous.take() {
            if let Err(e) = del_pod(shared, pod) {
                shared.fail(e);
            }
        }
        match added {
            Ok(pod) => previous = Some(pod),
            Err(e) => shared.fail(e),
        }
    }
    if let Some(pod) = previous {
        if let Err(e) = del_pod(shared, pod) {
            shared.fail(e);
        }
    }
}

/// The iptables chain (`conf/10-kubenet.conflist`: masquerade and host ports in iptables).
#[test]
fn churn_iptables() {
    churn("10-kubenet.conflist");
}

/// The nftables chain (`conf/30-kubenet-nftables.conflist`: masquerade and host ports in nftables sets).
#[test]
fn churn_nftables() {
    churn("30-kubenet-nftables.conflist");
}

/// The whole churn of the module doc with `conf/<conf>`.
fn churn(conf: &str) {
    let total = env_number("CHURN_CYCLES", DEFAULT_CYCLES);
    let workers = env_number("CHURN_WORKERS", DEFAULT_WORKERS);
    let k = Kubenet::new(conf, |_| {});
    let before = k.snapshot();

    let shared = Shared {
        k: &k,
        live: Mutex::new(Live::default()),
        started: AtomicUsize::new(0),
        total,
        failed: AtomicBool::new(false),
        errors: Mutex::new(Vec::new()),
    };
    let start = Instant::now();
    std::thread::scope(|s| {
        for w in 0..workers {
            let shared = &shared;
            s.spawn(move || worker(shared, w));
        }
    });
    let elapsed = start.elapsed();
    let done = shared.started.load(Ordering::SeqCst).min(total);
    let live = shared.live.into_inner().expect("live lock");
    eprintln!(
        "churn: {done} cycles of {conf} by {workers} workers in {:.1} s ({:.1} ms per cycle, {:.1} cycles/s), \
         at most {} pods live at once",
        elapsed.as_secs_f64(),
        elapsed.as_secs_f64() * 1000.0 / done.max(1) as f64,
        done as f64 / elapsed.as_secs_f64().max(f64::EPSILON),
        live.peak
    );

    let errors = shared.errors.into_inner().expect("errors lock");
    assert!(errors.is_empty(), "churn failed:\n  {}", errors.join("\n  "));
    assert!(live.doubles.is_empty(), "addresses given to two live pods:\n  {}", live.doubles.join("\n  "));
    assert!(live.holders.is_empty(), "bookkeeping: still live: {:?}", live.holders);
    assert!(live.peak > workers, "at most {} pods were live at once: too little overlap", live.peak);

    let after = k.snapshot();
    k.assert_no_residue(&before, &after, &format!("after {done} ADD/DEL cycles"));
    assert!(k.leases().is_empty(), "leases left: {:?}", k.leases());
    assert!(k.cache_files().is_empty(), "cache files left: {:?}", k.cache_files());
}
