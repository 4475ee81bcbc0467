//! The cgroups of `scripts/cluster.sh` (scripts/lib/cluster/common.sh) on the machine's own mode: cgroup v1,
//! hybrid (v1 driven, said in one line) or v2 (the VM lane's guests mount only cgroup2). A node's subtree is made
//! with the controllers the kubelet asks its cgroupRoot for, the daemons' and the pods' processes sit in leaves,
//! `down`'s functions find and end every process and remove every cgroup, and what the machine lacks is named
//! before anything is made. Needs no Kubernetes: the functions `up` and `down` call, run on their own.

use std::path::Path;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use netns_tests::wait_for;

static COUNTER: AtomicUsize = AtomicUsize::new(0);

fn common_sh() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/lib/cluster/common.sh").display().to_string()
}

/// True on a machine whose /sys/fs/cgroup is the unified hierarchy alone.
fn unified() -> bool {
    Path::new("/sys/fs/cgroup/cgroup.controllers").exists()
}

/// A cluster name of this test's own (a-z0-9, as cluster.sh takes them).
fn cluster_name() -> String {
    format!("cg{}x{}", std::process::id(), COUNTER.fetch_add(1, Ordering::Relaxed))
}

/// bash with common.sh sourced and the cluster's name set, running SCRIPT.
fn cluster_shell(name: &str, script: &str) -> Output {
    Command::new("bash")
        .args(["-c", &format!("set -euo pipefail; source {}; kc_set_name {name}; {script}", common_sh())])
        .output()
        .expect("bash")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The cluster's cgroup in each hierarchy mounted on this machine.
fn cgroup_dirs(name: &str) -> Vec<String> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").expect("mounts");
    mounts
        .lines()
        .filter_map(|l| {
            let fields: Vec<&str> = l.split_whitespace().collect();
            (fields.len() > 2 && matches!(fields[2], "cgroup" | "cgroup2"))
                .then(|| format!("{}/cni-rs-cluster/{name}", fields[1]))
        })
        .collect()
}

fn left(name: &str) -> Vec<String> {
    cgroup_dirs(name).into_iter().filter(|d| Path::new(d).exists()).collect()
}

/// A process that is gone (or a zombie no cgroup lists any more).
fn ended(pid: &str) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

/// `down`'s cgroup part for the cluster, also when the test fails half way.
struct Down(String);

impl Drop for Down {
    fn drop(&mut self) {
        let _ = cluster_shell(&self.0, "kc_kill_all; kc_cgroups_remove");
    }
}

#[test]
fn a_node_subtree_holds_processes_in_leaves_and_down_ends_and_removes_all() {
    let name = cluster_name();
    let _down = Down(name.clone());
    // What `up` does: the cluster's cgroup and a node's (the kubelet's cgroupRoot), the node's daemons in a leaf;
    // then what the kubelet and runc make for a pod's container (cgroupfs driver), a process with a child.
    let up = cluster_shell(
        &name,
        "kc_cgroup_preflight; kc_cgroup_make \"$KC_CGROUP\"; kc_cgroup_make \"$KC_CGROUP/node1\"
         kc_spawn node1/daemons /dev/null sleep 600
         kc_spawn node1/kubepods/besteffort/pod1/ctr /dev/null bash -c 'sleep 600 & sleep 600'",
    );
    let stderr = text(&up.stderr);
    assert!(up.status.success(), "up's cgroup steps: {stderr}");
    let pids: Vec<String> = text(&up.stdout).split_whitespace().map(str::to_string).collect();
    assert_eq!(pids.len(), 2, "two processes spawned: {pids:?}");
    // The mode, said in one line.
    let said: Vec<&str> = stderr.lines().filter(|l| l.starts_with("cluster: cgroup")).collect();
    assert_eq!(said.len(), 1, "one line says the mode: {stderr}");
    let hybrid = Path::new("/sys/fs/cgroup/unified/cgroup.controllers").exists();
    let expected = if unified() {
        "cgroup v2 (unified), delegating cpu"
    } else if hybrid {
        "using v1"
    } else {
        "cgroup v1"
    };
    assert!(said[0].contains(expected), "the mode said: {} (expected {expected})", said[0]);

    let (daemon, pod) = (&pids[0], &pids[1]);
    // kc_spawn's child joins its cgroup itself, after kc_spawn returns.
    let cgroup_of = |pid: &str, path: &str| {
        let line = |l: &str| l.ends_with(&format!(":/cni-rs-cluster/{name}/node1/{path}"));
        let read = || std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
        let joined = wait_for(Duration::from_secs(10), || read().lines().any(line));
        assert!(joined.is_some(), "{pid} in {path}: {}", read());
        read()
    };
    if unified() {
        let node = format!("/sys/fs/cgroup/cni-rs-cluster/{name}/node1");
        assert!(cgroup_of(daemon, "daemons").starts_with("0::/"), "v2 only");
        assert!(cgroup_of(pod, "kubepods/besteffort/pod1/ctr").starts_with("0::/"), "v2 only");
        // The kubelet's cgroupRoot has every controller it asks for that the root has, and passes them on.
        let root: Vec<String> = std::fs::read_to_string("/sys/fs/cgroup/cgroup.controllers")
            .expect("root controllers")
            .split_whitespace()
            .map(str::to_string)
            .collect();
        let has = std::fs::read_to_string(format!("{node}/cgroup.controllers")).expect("node controllers");
        let passes = std::fs::read_to_string(format!("{node}/cgroup.subtree_control")).expect("node subtree");
        for c in ["cpu", "cpuset", "memory", "pids", "io", "hugetlb"] {
            let wanted = root.iter().any(|r| r == c) || ["cpu", "memory", "pids"].contains(&c);
            let has_it = has.split_whitespace().any(|h| h == c);
            let passes_it = passes.split_whitespace().any(|h| h == c);
            assert_eq!(has_it && passes_it, wanted, "{c} in node1 ({has}) and its subtree_control ({passes})");
        }
        // v2's rule: no process in a cgroup that passes controllers on.
        assert_eq!(std::fs::read_to_string(format!("{node}/cgroup.procs")).expect("procs"), "");
    } else {
        assert!(cgroup_of(daemon, "daemons").contains(&format!(":pids:/cni-rs-cluster/{name}/node1/daemons\n")));
        let pod_line = format!(":pids:/cni-rs-cluster/{name}/node1/kubepods/besteffort/pod1/ctr\n");
        assert!(cgroup_of(pod, "kubepods/besteffort/pod1/ctr").contains(&pod_line));
    }
    let listed = cluster_shell(&name, "kc_pids");
    for pid in &pids {
        assert!(text(&listed.stdout).lines().any(|l| l == pid), "kc_pids lists {pid}: {}", text(&listed.stdout));
    }

    // What `down` does: every process ended, every cgroup removed, in every hierarchy; nothing said left.
    let down = cluster_shell(&name, "kc_kill_all; kc_cgroups_remove; kc_cgroups_left");
    assert!(down.status.success(), "down's cgroup steps: {}", text(&down.stderr));
    assert_eq!(text(&down.stdout), "", "kc_cgroups_left after down");
    for pid in &pids {
        assert!(ended(pid), "process {pid} still runs after down");
    }
    assert_eq!(left(&name), Vec::<String>::new(), "cgroups left after down");
}

#[test]
fn what_the_machine_lacks_is_named_before_anything_is_made() {
    let name = cluster_name();
    let _down = Down(name.clone());
    if unified() {
        // A cgroup namespace whose root has only pids (a container given less than the kubelet needs), then one
        // given cpu, memory and pids but holding a process itself (v2 lets it delegate nothing then).
        let test = format!("/sys/fs/cgroup/cni-rs-cgtest-{name}");
        std::fs::write("/sys/fs/cgroup/cgroup.subtree_control", "+cpu +memory +pids").expect("root's controllers");
        std::fs::create_dir_all(format!("{test}/inner")).expect("test cgroup");
        let cases = [
            ("+pids", "cgroup v2: /sys/fs/cgroup/cgroup.controllers lacks cpu memory"),
            // memory is a domain controller: refused with a process in the cgroup (cpu and pids are threaded).
            ("+cpu +memory +pids", "cgroup v2: the controller(s) memory cannot be delegated below /sys/fs/cgroup"),
        ];
        for (enabled, message) in cases {
            std::fs::write(format!("{test}/cgroup.subtree_control"), "-cpu -memory -pids")
                .and_then(|()| std::fs::write(format!("{test}/cgroup.subtree_control"), enabled))
                .expect("enable the test cgroup's controllers");
            let out = Command::new("bash")
                .args([
                    "-c",
                    "echo $$ >\"$1/inner/cgroup.procs\" && exec unshare --cgroup --mount bash -c \
                     'umount /sys/fs/cgroup && mount -t cgroup2 cgroup2 /sys/fs/cgroup && source \"$0\" && kc_set_name \"$1\" && \
                     kc_cgroup_preflight && kc_cgroup_make \"$KC_CGROUP\"' \"$0\" \"$2\"",
                    &common_sh(),
                    &test,
                    &name,
                ])
                .output()
                .expect("bash");
            let stderr = text(&out.stderr);
            assert!(!out.status.success() && stderr.contains(message), "{enabled}: says {message}: {stderr}");
            assert_eq!(stderr.lines().count(), 1, "one message: {stderr}");
            assert!(!Path::new(&format!("{test}/inner/cni-rs-cluster")).exists(), "nothing made after the refusal");
            let delegated = std::fs::read_to_string(format!("{test}/inner/cgroup.subtree_control")).expect("subtree");
            assert_eq!(delegated.trim(), "", "the refusal left the cgroup's controllers as they were");
        }
        std::fs::remove_dir(format!("{test}/inner")).and_then(|()| std::fs::remove_dir(&test)).expect("rmdir");
    } else {
        // A v1 machine without the pids hierarchy (a private mount namespace where it is unmounted).
        let out = Command::new("unshare")
            .args(["--mount", "bash", "-c"])
            .arg(format!(
                "umount /sys/fs/cgroup/pids && source {} && kc_set_name {name} && kc_cgroup_preflight && \
                 kc_cgroup_make \"$KC_CGROUP\"",
                common_sh()
            ))
            .output()
            .expect("unshare");
        let stderr = text(&out.stderr);
        assert!(
            !out.status.success() && stderr.contains("without a pids hierarchy at /sys/fs/cgroup/pids"),
            "{stderr}"
        );
        assert_eq!(stderr.lines().count(), 1, "one message: {stderr}");
    }
    assert_eq!(left(&name), Vec::<String>::new(), "nothing made after the refusal");
}
