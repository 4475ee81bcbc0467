//! The containerd path of `scripts/bench.sh`: pods run through containerd's CRI API as the kubelet runs them,
//! with our plugins and with the reference plugins side by side (two containerd daemons, each in a node netns
//! of its own, pods alternating between them), on the kubenet conflist of `conf/` with a hostPort and the
//! bandwidth annotations.
//!
//! Per pod: the wall time of RunPodSandbox and of the first StopPodSandbox (seen by the client), and the CNI
//! ADD and DEL as containerd itself measures them: the increase of its
//! `network_plugin_operations_duration_seconds` sum (`set_up_pod`, `tear_down_pod`) across that call, read
//! from its metrics endpoint on the node netns' loopback. Prints a Markdown table of medians.
//!
//! Usage (as root): `cri-bench RUNS OURS_DIR REFERENCE_DIR` (plugin directories).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cri_client::{pod_config, Cri, HostPort, EGRESS_BANDWIDTH, INGRESS_BANDWIDTH};
use netns_tests::containerd::{self, Containerd, ContainerdConfig};
use netns_tests::{json, Node, Value};

struct Side {
    name: &'static str,
    // Field order: the client and the daemon go before the node.
    cri: Cri,
    containerd: Containerd,
    node: Node,
    run: Vec<f64>,
    stop: Vec<f64>,
    add: Vec<f64>,
    del: Vec<f64>,
    error: Option<String>,
}

fn kubenet_conflist(ipam_dir: &Path) -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../conf/10-kubenet.conflist");
    let mut conf: Value = serde_json::from_slice(&std::fs::read(path).expect("read conflist")).expect("json");
    conf["plugins"][0]["ipam"]["dataDir"] = json!(ipam_dir);
    conf
}

impl Side {
    fn new(name: &'static str, plugins: &Path) -> Side {
        let node = Node::new();
        let conflist = kubenet_conflist(&node.dir().join("ipam"));
        let config =
            ContainerdConfig { cni_bin_dir: plugins.to_path_buf(), conflist: Some(conflist), conf_template: None };
        let containerd = Containerd::start(&node, config);
        let cri = Cri::connect(&containerd.socket, Duration::from_secs(20)).expect("connect to containerd");
        Side { name, cri, containerd, node, run: vec![], stop: vec![], add: vec![], del: vec![], error: None }
    }

    /// containerd's own sum of seconds spent in CNI for `operation` (set_up_pod, tear_down_pod).
    fn cni_seconds(&self, operation: &str) -> f64 {
        let text = self.containerd.metrics(&self.node);
        let label = format!("operation_type=\"{operation}\"");
        text.lines()
            // containerd_cri_network_plugin_operations_duration_seconds_seconds_sum{operation_type="..."} S
            .find(|l| {
                l.contains("network_plugin_operations_duration_seconds") && l.contains("_sum{") && l.contains(&label)
            })
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
            // A series appears with its first observation.
            .unwrap_or(0.0)
    }

    /// One pod: run, stop, stop again, remove; records the times of the first run and stop.
    fn pod(&mut self, n: usize) {
        if self.error.is_some() {
            return;
        }
        let logs = self.node.dir().join("logs");
        std::fs::create_dir_all(&logs).expect("log dir");
        let ports = [HostPort { host_port: 8080, container_port: 80, udp: false }];
        let annotations = [(INGRESS_BANDWIDTH, "10M"), (EGRESS_BANDWIDTH, "10M")];
        let config = pod_config("bench", &format!("pod-{n}"), &format!("uid-{n}"), &ports, &annotations, &logs);

        let add_before = self.cni_seconds("set_up_pod");
        let start = Instant::now();
        let id = match self.cri.run_pod_sandbox(config) {
            Ok(id) => id,
            Err(e) => {
                self.error = Some(format!("RunPodSandbox: {}", e.message()));
                return;
            }
        };
        self.run.push(start.elapsed().as_secs_f64());
        self.add.push(self.cni_seconds("set_up_pod") - add_before);

        let del_before = self.cni_seconds("tear_down_pod");
        let start = Instant::now();
        if let Err(e) = self.cri.stop_pod_sandbox(&id) {
            self.error = Some(format!("StopPodSandbox: {}", e.message()));
            return;
        }
        self.stop.push(start.elapsed().as_secs_f64());
        self.del.push(self.cni_seconds("tear_down_pod") - del_before);
        let second = self.cri.stop_pod_sandbox(&id).and_then(|_| self.cri.remove_pod_sandbox(&id));
        if let Err(e) = second {
            self.error = Some(format!("second StopPodSandbox/RemovePodSandbox: {}", e.message()));
        }
    }
}

fn median(values: &[f64]) -> Option<f64> {
    let mut v = values.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    match v.len() {
        0 => None,
        n if n % 2 == 1 => Some(v[n / 2]),
        n => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
}

fn cell(side: &Side, values: &[f64]) -> String {
    match (median(values), &side.error) {
        (_, Some(e)) => format!("fails: {}", e.replace('|', "/")),
        (Some(m), None) => format!("{:.1} ms", m * 1000.0),
        (None, None) => "-".into(),
    }
}

fn ratio(reference: &Side, ours: &Side, pick: fn(&Side) -> &Vec<f64>) -> String {
    match (median(pick(reference)), median(pick(ours)), &ours.error, &reference.error) {
        (Some(r), Some(o), None, None) if o > 0.0 => format!("{:.1}x", r / o),
        _ => String::new(),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, runs, ours, reference] = args.as_slice() else {
        eprintln!("usage: cri-bench RUNS OURS_DIR REFERENCE_DIR");
        std::process::exit(2);
    };
    let runs: usize = runs.parse().expect("RUNS");
    if !containerd::available() {
        std::process::exit(1);
    }
    let mut reference = Side::new("reference", &PathBuf::from(reference));
    let mut ours = Side::new("ours", &PathBuf::from(ours));
    // One pod each first, not counted: image unpacking, the bridge and the shared chains are made then.
    for side in [&mut reference, &mut ours] {
        side.pod(0);
        for v in [&mut side.run, &mut side.stop, &mut side.add, &mut side.del] {
            v.clear();
        }
    }
    for n in 1..=runs {
        reference.pod(n);
        ours.pod(n);
    }
    for side in [&reference, &ours] {
        if side.error.is_none() && side.add.iter().chain(&side.del).any(|&s| s <= 0.0) {
            panic!("{}: containerd's metrics lack network_plugin_operations_duration_seconds", side.name);
        }
        if let Some(e) = &side.error {
            eprintln!("cri-bench: {} plugins: {e}\n{}", side.name, side.containerd.log_problems(5));
        }
    }
    let version = String::from_utf8_lossy(
        &std::process::Command::new("containerd").arg("--version").output().map(|o| o.stdout).unwrap_or_default(),
    )
    .trim()
    .to_string();
    println!(
        "containerd: {version}; {runs} pods per side, alternating; hostPort + ingress/egress bandwidth annotations."
    );
    println!();
    println!("| figure (median) | reference | ours | speed-up |");
    println!("| --- | --- | --- | --- |");
    type Figure = fn(&Side) -> &Vec<f64>;
    let rows: [(&str, Figure); 4] = [
        ("CNI ADD, containerd's set_up_pod metric", |s| &s.add),
        ("CNI DEL, containerd's tear_down_pod metric (first StopPodSandbox)", |s| &s.del),
        ("RunPodSandbox (wall, CRI client)", |s| &s.run),
        ("StopPodSandbox (wall, CRI client)", |s| &s.stop),
    ];
    for (name, pick) in rows {
        println!(
            "| {name} | {} | {} | {} |",
            cell(&reference, pick(&reference)),
            cell(&ours, pick(&ours)),
            ratio(&reference, &ours, pick)
        );
    }
}
