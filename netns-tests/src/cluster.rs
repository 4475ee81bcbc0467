//! A local Kubernetes cluster for a test: `scripts/cluster.sh up` under a name of the test's own, taken down
//! (every process, namespace, mount, cgroup and file) when the guard is dropped, also when the test panics.
//! What a test asks of it goes through the programs users run: kubectl against the real API server, commands in a
//! node's namespaces (`cluster.sh exec`), and the pods' own tools (`kubectl exec` into agnhost's image).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::{eventually, Value};

/// Kubernetes' test workload, built from the release tree and loaded into every node by `cluster.sh up`.
pub const AGNHOST: &str = "registry.k8s.io/e2e-test-images/agnhost:2.45";

/// How to bring a cluster up (`cluster.sh up` flags).
#[derive(Clone, Debug)]
pub struct ClusterConfig {
    pub nodes: usize,
    /// `ours`, `reference` or a directory of plugin binaries.
    pub plugins: String,
    pub dual_stack: bool,
    /// `kubenet`, `flannel` or `none`.
    pub network: &'static str,
    /// The NetworkPolicy agent on every node (`--network-policy`), the workspace's build of it.
    pub network_policy: bool,
    /// With `network: "flannel"`: the backend in flannel's net-conf.json.
    pub flannel_backend: &'static str,
    /// The cluster DNS (kube-dns, `--dns kube-dns`); off by default in tests (`--dns none`), whose "nothing left on
    /// the nodes" checks would otherwise meet kube-dns's own pod.
    pub dns: bool,
    /// The nodes' containerd (`--containerd`): `system`, `1.6`, `1.7` or `2.1`; see [`containerd`].
    pub containerd: String,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            nodes: 2,
            plugins: ours(),
            dual_stack: false,
            network: "kubenet",
            network_policy: false,
            flannel_backend: "vxlan",
            dns: false,
            containerd: containerd("system"),
        }
    }
}

/// The containerd a test's cluster runs: `$CNI_CLUSTER_CONTAINERD` when set (every cluster test on one version:
/// `CNI_CLUSTER_CONTAINERD=2.1 cargo test -p netns-tests --test 'k8s*'`), else the one the test names. The test
/// command spreads the versions over its clusters (the machine's own, Debian's 1.7 and 2.1), so each meets a
/// real cluster in every run.
pub fn containerd(named: &str) -> String {
    std::env::var("CNI_CLUSTER_CONTAINERD").ok().filter(|v| !v.is_empty()).unwrap_or_else(|| named.to_string())
}

/// The plugins the tests call ours: the release build `scripts/test.sh` stages ($CNI_PACKAGE_PREBUILT), else the
/// workspace's built binaries.
pub fn ours() -> String {
    match std::env::var("CNI_PACKAGE_PREBUILT") {
        Ok(dir) if Path::new(&dir).join("bridge").is_file() => dir,
        _ => crate::bin_dir().display().to_string(),
    }
}

/// True when what `cluster.sh up` needs is there (else skipped, or failed under CI=true).
pub fn available() -> bool {
    crate::require_programs(&["containerd", "ctr", "runc", "etcd", "socat", "openssl"], "run scripts/setup.sh")
        && crate::require(
            "Kubernetes v1.28.7 (kubectl in cluster.sh's bin directory)",
            kubectl().is_file(),
            "scripts/cluster.sh build builds it once from ../shared/kubernetes",
        )
}

/// Where `cluster.sh` keeps a cluster, as the script answers it (`cluster.sh --name NAME paths`), so the rig never
/// keeps a second copy of the script's layout (`CNI_CLUSTER_ROOT` and `CNI_K8S_CACHE` included).
#[derive(Clone, Debug)]
pub struct Paths {
    /// Every cluster's state directory is below it.
    pub root: PathBuf,
    /// This cluster's state directory.
    pub dir: PathBuf,
    pub kubeconfig: PathBuf,
    /// Its network namespaces' names begin with it.
    pub netns_prefix: String,
    /// Its cgroup, below each hierarchy's mount point.
    pub cgroup: String,
    /// Kubernetes' binaries.
    pub bin: PathBuf,
}

impl Paths {
    /// The script's answer for the cluster `name` (which need not be up).
    pub fn of(name: &str) -> Paths {
        let answer = script_stdout(name, &["paths"]);
        let value = |key: &str| {
            answer
                .lines()
                .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
                .unwrap_or_else(|| panic!("cluster.sh paths says no {key}:\n{answer}"))
                .to_string()
        };
        Paths {
            root: value("root").into(),
            dir: value("dir").into(),
            kubeconfig: value("kubeconfig").into(),
            netns_prefix: value("netns-prefix"),
            cgroup: value("cgroup"),
            bin: value("bin").into(),
        }
    }
}

/// The paths every cluster shares (its root, Kubernetes' binaries), asked once.
fn shared_paths() -> &'static Paths {
    static PATHS: std::sync::OnceLock<Paths> = std::sync::OnceLock::new();
    PATHS.get_or_init(|| Paths::of(DEFAULT_NAME))
}

/// A cluster name of this test process's own: t<pid>x<n> (the sweep of a later run knows whose it was).
pub fn unique_cluster_name() -> String {
    format!("t{}x{}", std::process::id(), COUNTER.fetch_add(1, Ordering::Relaxed))
}

/// The command `cluster.sh --name NAME ARGS...`, to run or spawn.
pub fn script_command(name: &str, args: &[&str]) -> Command {
    let mut command = Command::new("bash");
    command.arg(script()).args(["--name", name]).args(args);
    command
}

/// The script's own default cluster name, for commands that concern no cluster of a test's (`paths` shared by
/// every cluster, `containerd VERSION`).
pub const DEFAULT_NAME: &str = "kc";

/// `cluster.sh --name NAME ARGS...` run to completion; panics with its stderr unless it succeeds. Returns stdout.
pub fn script_stdout(name: &str, args: &[&str]) -> String {
    let output =
        script_command(name, args).output().unwrap_or_else(|e| panic!("run cluster.sh {}: {e}", args.join(" ")));
    assert!(output.status.success(), "cluster.sh {}: {}", args.join(" "), text(&output.stderr));
    text(&output.stdout)
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/cluster.sh")
}

/// An HTTP GET with a deadline, in a pod (agnhost's image has busybox) or on a node. Debian's busybox-static
/// crashes on its own wget's `-T`: its `timeout` applet bounds the request instead.
const WGET: &[&str] = &["busybox", "timeout", "5", "busybox", "wget", "-qO-"];

/// A running cluster, taken down on drop.
pub struct Cluster {
    pub name: String,
    pub config: ClusterConfig,
    paths: Paths,
}

static COUNTER: AtomicUsize = AtomicUsize::new(0);

impl Cluster {
    /// `cluster.sh up` with a unique name; panics with the script's output if it fails.
    pub fn up(config: ClusterConfig) -> Cluster {
        sweep_stale_clusters();
        Cluster::up_as(unique_cluster_name(), config)
    }

    /// `cluster.sh up` under `name` (a half-made cluster of that name is taken down first by the script).
    pub fn up_as(name: String, config: ClusterConfig) -> Cluster {
        let mut args = vec!["up".to_string(), "--nodes".into(), config.nodes.to_string()];
        args.extend(["--plugins".into(), config.plugins.clone(), "--network".into(), config.network.into()]);
        if config.dual_stack {
            args.push("--dual-stack".into());
        }
        if config.network_policy {
            args.push("--network-policy".into());
        }
        args.extend(["--flannel-backend".into(), config.flannel_backend.into()]);
        args.extend(["--dns".into(), if config.dns { "kube-dns" } else { "none" }.into()]);
        args.extend(["--containerd".into(), config.containerd.clone()]);
        let paths = Paths::of(&name);
        let cluster = Cluster { name, config, paths };
        let output = script_command(&cluster.name, &args.iter().map(String::as_str).collect::<Vec<_>>())
            .env("CNI_NETPOL_BIN", crate::bin_dir().join("cni-netpol"))
            .output()
            .unwrap_or_else(|e| panic!("run cluster.sh: {e}"));
        assert!(output.status.success(), "cluster.sh up failed:\n{}", text(&output.stderr));
        cluster
    }

    /// Runs `cluster.sh --name NAME ARGS...`.
    pub fn script(&self, args: &[&str]) -> Output {
        script_command(&self.name, args).output().unwrap_or_else(|e| panic!("run cluster.sh: {e}"))
    }

    /// [`Cluster::script`] that must succeed; returns stdout.
    pub fn script_ok(&self, args: &[&str]) -> String {
        let output = self.script(args);
        assert!(
            output.status.success(),
            "cluster.sh {}: {}{}",
            args.join(" "),
            text(&output.stdout),
            text(&output.stderr)
        );
        text(&output.stdout)
    }

    /// The admin kubeconfig (the API server through the loopback forwarder).
    pub fn kubeconfig(&self) -> &Path {
        &self.paths.kubeconfig
    }

    /// Where the script keeps this cluster.
    pub fn paths(&self) -> &Paths {
        &self.paths
    }

    /// The node names, as the script made them (its `nodes.list`).
    pub fn nodes(&self) -> Vec<String> {
        let list = self.paths.dir.join("nodes.list");
        let text = std::fs::read_to_string(&list).unwrap_or_else(|e| panic!("{}: {e}", list.display()));
        text.split_whitespace().map(str::to_string).collect()
    }

    /// kubectl with the admin kubeconfig.
    pub fn kubectl(&self, args: &[&str]) -> Output {
        Command::new(kubectl())
            .arg("--kubeconfig")
            .arg(&self.paths.kubeconfig)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("run kubectl: {e}"))
    }

    /// kubectl that must succeed; returns stdout.
    pub fn kubectl_ok(&self, args: &[&str]) -> String {
        let output = self.kubectl(args);
        assert!(output.status.success(), "kubectl {}: {}", args.join(" "), text(&output.stderr));
        text(&output.stdout)
    }

    /// `kubectl apply` of a manifest given as text.
    pub fn apply(&self, manifest: &str) {
        let dir = std::env::temp_dir().join(format!(
            "cluster-{}-{}.yaml",
            self.name,
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::write(&dir, manifest).expect("write manifest");
        self.kubectl_ok(&["apply", "-f", &dir.display().to_string()]);
        let _ = std::fs::remove_file(dir);
    }

    /// `kubectl get ... -o json`.
    pub fn get_json(&self, args: &[&str]) -> Value {
        let mut all = vec!["get"];
        all.extend(args);
        all.extend(["-o", "json"]);
        serde_json::from_str(&self.kubectl_ok(&all)).expect("kubectl json")
    }

    /// The pods matching a label selector in `default`, once all are Running with their addresses.
    pub fn running_pods(&self, selector: &str, count: usize, timeout: Duration) -> Vec<Pod> {
        let found = eventually(timeout, || {
            let pods = self.pods(selector);
            let ready = pods.len() == count && pods.iter().all(|p| p.phase == "Running" && !p.ips.is_empty());
            if ready {
                Ok(pods)
            } else {
                Err(pods)
            }
        });
        found.unwrap_or_else(|pods| {
            let describe = self.kubectl(&["describe", "pods", "-l", selector]);
            panic!("pods {selector}: want {count} Running, have {pods:?}\n{}", text(&describe.stdout))
        })
    }

    /// The pods matching a label selector in `default`, as they are now.
    pub fn pods(&self, selector: &str) -> Vec<Pod> {
        let list = self.get_json(&["pods", "-l", selector]);
        list["items"].as_array().map(|items| items.iter().map(Pod::from_json).collect()).unwrap_or_default()
    }

    /// Runs a command in a pod's container (`kubectl exec`); returns the output.
    pub fn pod_exec(&self, pod: &str, command: &[&str]) -> Output {
        let mut args = vec!["exec", pod, "--"];
        args.extend(command);
        self.kubectl(&args)
    }

    /// Runs a command in a node's namespaces (or cp/wan's network namespace).
    pub fn node_exec(&self, node: &str, command: &[&str]) -> Output {
        let mut args = vec!["exec", node];
        args.extend(command);
        self.script(&args)
    }

    /// A node's (or the wan's) HTTP GET with busybox's wget, as a client outside the pods: the body, or the error.
    pub fn node_get(&self, node: &str, url: &str) -> Result<String, String> {
        body(self.node_exec(node, &wget(url)))
    }

    /// A pod's HTTP GET (busybox wget in agnhost's image): the body, or the error.
    pub fn pod_get(&self, pod: &str, url: &str) -> Result<String, String> {
        body(self.pod_exec(pod, &wget(url)))
    }

    /// The logs of every node's daemons and the control plane's, tail of each, for a failure message.
    pub fn logs(&self) -> String {
        let dir = &self.paths.dir;
        let mut out = String::new();
        for entry in walk(dir) {
            if entry.extension().is_some_and(|e| e == "log") {
                let body = std::fs::read_to_string(&entry).unwrap_or_default();
                let lines: Vec<&str> = body.lines().collect();
                out += &format!("== {}\n{}\n", entry.display(), lines[lines.len().saturating_sub(15)..].join("\n"));
            }
        }
        out
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // CNI_TEST_KEEP_CLUSTER=1 keeps a failed test's cluster to look at (cluster.sh --name NAME down after).
        if std::thread::panicking() && std::env::var("CNI_TEST_KEEP_CLUSTER").as_deref() == Ok("1") {
            eprintln!("kept the failed test's cluster {}: scripts/cluster.sh --name {} down", self.name, self.name);
            return;
        }
        let output = self.script(&["down"]);
        if !output.status.success() {
            eprintln!("cluster.sh down {}: {}", self.name, text(&output.stderr));
        }
    }
}

/// Clusters of test processes that are gone (killed before their guard ran) are taken down.
fn sweep_stale_clusters() {
    for entry in std::fs::read_dir(&shared_paths().root).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name.strip_prefix('t').and_then(|rest| rest.split_once('x')).map(|(pid, _)| pid.to_string())
        else {
            continue;
        };
        if pid.parse::<u32>().is_ok() && !Path::new("/proc").join(&pid).exists() {
            let _ = script_command(&name, &["down"]).output();
        }
    }
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() && !path.ends_with("root") {
            found.extend(walk(&path));
        } else {
            found.push(path);
        }
    }
    found
}

/// What a test reads of a pod.
#[derive(Clone, Debug)]
pub struct Pod {
    pub name: String,
    pub node: String,
    pub phase: String,
    pub ips: Vec<std::net::IpAddr>,
}

impl Pod {
    fn from_json(item: &Value) -> Pod {
        let ips = item["status"]["podIPs"]
            .as_array()
            .map(|ips| ips.iter().filter_map(|ip| ip["ip"].as_str()?.parse().ok()).collect())
            .unwrap_or_default();
        Pod {
            name: item["metadata"]["name"].as_str().unwrap_or_default().to_string(),
            node: item["spec"]["nodeName"].as_str().unwrap_or_default().to_string(),
            phase: item["status"]["phase"].as_str().unwrap_or_default().to_string(),
            ips,
        }
    }
}

/// The kubectl the cluster was built with.
pub fn kubectl() -> PathBuf {
    k8s_bin("kubectl")
}

/// A Kubernetes binary as `cluster.sh build` builds it (kubectl, e2e.test, kube-apiserver, ...).
pub fn k8s_bin(name: &str) -> PathBuf {
    shared_paths().bin.join(name)
}

/// The [`WGET`] command line for `url`.
fn wget(url: &str) -> Vec<&str> {
    WGET.iter().copied().chain([url]).collect()
}

/// A command's stdout if it succeeded, else its stderr.
fn body(output: Output) -> Result<String, String> {
    if output.status.success() {
        Ok(text(&output.stdout))
    } else {
        Err(text(&output.stderr))
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}
