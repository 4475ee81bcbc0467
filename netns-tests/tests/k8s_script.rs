//! `scripts/cluster.sh` as an operator meets it when things are not right: a busy API port and a user who is not
//! root get a clear message and leave nothing behind; an `up` killed half way leaves a cluster that the next `up`
//! of that name takes down first, and that one works; a running cluster changes nothing of the machine's own
//! network namespace or host-wide tunables (the kubelet writes several at start), and `down` removes all of it.

use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use netns_tests::cluster::{self, script_command, unique_cluster_name, Cluster, ClusterConfig, Paths};
use netns_tests::wait_for;

/// The cluster's traces on the machine: its namespaces, its state directory, its cgroups.
fn traces(name: &str) -> Vec<String> {
    let mut found = Vec::new();
    let netns = Command::new("ip").args(["netns", "list"]).output().expect("ip netns");
    let paths = Paths::of(name);
    let prefix = &paths.netns_prefix;
    found.extend(
        String::from_utf8_lossy(&netns.stdout).lines().filter(|l| l.starts_with(prefix.as_str())).map(str::to_string),
    );
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    // Its cgroup in every hierarchy the machine has: cgroup v1's (one per controller), v2's unified one, or both.
    let cgroups = mounts
        .lines()
        .filter_map(|l| {
            let fields: Vec<&str> = l.split_whitespace().collect();
            (fields.len() > 2 && matches!(fields[2], "cgroup" | "cgroup2"))
                .then(|| format!("{}/{}", fields[1], paths.cgroup))
        })
        .collect::<Vec<_>>();
    let dir = paths.dir.display().to_string();
    for path in std::iter::once(dir.clone()).chain(cgroups) {
        if Path::new(&path).exists() {
            found.push(path);
        }
    }
    found.extend(mounts.lines().filter(|l| l.contains(&format!("{dir}/"))).map(str::to_string));
    found
}

/// What of the root namespace and the host-wide tunables a cluster must not change.
fn machine_state() -> String {
    let mut state = String::new();
    for args in [
        &["-o", "link", "show"][..],
        &["route", "show", "table", "all"],
        &["-6", "route", "show", "table", "all"],
        &["rule"],
    ] {
        let out = Command::new("ip").args(args).output().expect("ip");
        state += &String::from_utf8_lossy(&out.stdout);
    }
    for key in
        ["vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops", "kernel/keys/root_maxkeys"]
    {
        state += &format!("{key}={}", std::fs::read_to_string(format!("/proc/sys/{key}")).unwrap_or_default());
    }
    for key in ["net/ipv4/ip_forward", "net/ipv6/conf/all/forwarding", "net/bridge/bridge-nf-call-iptables"] {
        state += &format!("{key}={}", std::fs::read_to_string(format!("/proc/sys/{key}")).unwrap_or_default());
    }
    state
}

#[test]
fn a_busy_port_or_no_root_is_refused_with_nothing_left() {
    if !cluster::available() {
        return;
    }
    let busy = TcpListener::bind("127.0.0.1:0").expect("a loopback port");
    let port = busy.local_addr().expect("addr").port().to_string();
    let name = unique_cluster_name();
    let out = script_command(&name, &["up", "--nodes", "1", "--api-port", &port]).output().expect("cluster.sh");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "up on a busy port failed");
    assert!(stderr.contains(&format!("port {port}")) && stderr.contains("--api-port"), "says which port: {stderr}");
    assert_eq!(traces(&name), Vec::<String>::new(), "nothing left after the refusal");

    let name = unique_cluster_name();
    let mut command = script_command(&name, &["up", "--nodes", "1"]);
    command.uid(65534).gid(65534);
    let out = command.output().expect("cluster.sh as nobody");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("run as root"), "a user is told to run it as root: {stderr}");
    assert_eq!(traces(&name), Vec::<String>::new(), "nothing left after the refusal");
}

#[test]
fn a_half_made_cluster_is_taken_down_by_the_next_up_and_the_machine_is_untouched() {
    if !cluster::available() {
        return;
    }
    let before = machine_state();
    let name = unique_cluster_name();
    // An `up` killed (SIGKILL: no trap runs) once its first node's namespaces exist.
    let mut child = script_command(&name, &["up", "--nodes", "1", "--plugins", "reference"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .expect("spawn cluster.sh up");
    let node_netns = format!("/run/netns/{}node1", Paths::of(&name).netns_prefix);
    let started = wait_for(Duration::from_secs(120), || Path::new(&node_netns).exists());
    nix::sys::signal::killpg(nix::unistd::Pid::from_raw(child.id() as i32), nix::sys::signal::Signal::SIGKILL)
        .expect("kill the up");
    let _ = child.wait();
    assert!(started.is_some(), "cluster.sh up did not get to node1");
    assert!(!traces(&name).is_empty(), "the killed up left a half-made cluster");

    let cluster = Cluster::up_as(name.clone(), ClusterConfig { nodes: 1, ..ClusterConfig::default() });
    cluster.kubectl_ok(&["wait", "--for=condition=Ready", "node/node1", "--timeout=30s"]);
    assert_eq!(machine_state(), before, "a running cluster changed the root namespace or host-wide tunables");
    drop(cluster);
    assert_eq!(traces(&name), Vec::<String>::new(), "down left traces");
    assert_eq!(machine_state(), before, "the machine after down");
}
