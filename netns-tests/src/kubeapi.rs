//! A bare Kubernetes control plane for tests, shared by fabricd's Kubernetes mode and the NetworkPolicy
//! agent's watch: etcd and kube-apiserver in a test's infra namespace, state in the test's temp dir, a CA and
//! a serving certificate it signs made with openssl (rustls, in the `kube` client of fabricd and cni-netpol,
//! refuses a self-signed certificate that is its own CA), users from a static token file (`admin` in
//! system:masters, `flannel` bound to flannel's own ClusterRole from kube-flannel.yml), and the objects a
//! test makes through the API (Nodes with podCIDRs set as kube-controller-manager would, Namespaces with
//! their default ServiceAccount, any object by its path). Requests go through curl inside the namespace;
//! everything stops (by PID) when dropped.

use std::fs;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::fabric::{require_tool, Etcd, TlsFiles};
use crate::upstream::clean_command;
use crate::{wait_for, Daemon, TestNetns, Value};

/// A Kubernetes binary where `scripts/cluster.sh build` builds them ([`crate::cluster::k8s_bin`]).
pub fn kube_bin(name: &str) -> PathBuf {
    crate::cluster::k8s_bin(name)
}

/// True when kube-apiserver is built; under CI=true its absence fails the test ([`crate::require`]).
pub fn require_apiserver() -> bool {
    crate::require(
        "kube-apiserver",
        kube_bin("kube-apiserver").is_file() && ["etcd", "curl", "openssl"].iter().all(|tool| crate::on_path(tool)),
        "scripts/cluster.sh build; apt-get install etcd-server curl openssl",
    )
}

/// The port kube-apiserver serves on.
pub const PORT: u16 = 6443;
/// The token of the user in system:masters, and of the user with flannel's ClusterRole.
pub const ADMIN_TOKEN: &str = "admin-token-of-the-test";
pub const FLANNEL_TOKEN: &str = "flannel-token-of-the-test";

/// flannel's ClusterRole, as kube-flannel.yml (v0.28.9) has it, bound to the `flannel` user.
pub const FLANNEL_RBAC: &str = r#"[
 {"apiVersion":"rbac.authorization.k8s.io/v1","kind":"ClusterRole","metadata":{"name":"flannel"},
  "rules":[{"apiGroups":[""],"resources":["pods"],"verbs":["get"]},
           {"apiGroups":[""],"resources":["nodes"],"verbs":["get","list","watch"]},
           {"apiGroups":[""],"resources":["nodes/status"],"verbs":["patch"]}]},
 {"apiVersion":"rbac.authorization.k8s.io/v1","kind":"ClusterRoleBinding","metadata":{"name":"flannel"},
  "roleRef":{"apiGroup":"rbac.authorization.k8s.io","kind":"ClusterRole","name":"flannel"},
  "subjects":[{"apiGroup":"rbac.authorization.k8s.io","kind":"User","name":"flannel"}]}
]"#;

pub struct KubeApi {
    pub etcd: Etcd,
    apiserver: Daemon,
    pub ip: Ipv4Addr,
    pub dir: PathBuf,
    infra: PathBuf,
    args: Vec<String>,
}

impl KubeApi {
    /// etcd and kube-apiserver in `infra` at `ip` (etcd on 2379, the API on 6443), state under `dir`; waits
    /// until the API is ready and flannel's RBAC is in place.
    pub fn start(infra: &TestNetns, ip: Ipv4Addr, dir: &Path) -> KubeApi {
        require_tool("openssl");
        let dir = dir.join("kube");
        fs::create_dir_all(&dir).unwrap();
        let etcd = Etcd::start(infra, ip, &dir, None);
        let openssl = |args: &[&str]| {
            let out = Command::new("openssl").args(args).current_dir(&dir).output().expect("openssl");
            assert!(out.status.success(), "openssl {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
        };
        // A CA and a serving certificate for `ip` (rustls refuses a self-signed certificate used as its own CA).
        let tls = TlsFiles::make(&dir, ip);
        openssl(&["genrsa", "-out", "sa.key", "2048"]);
        openssl(&["rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub"]);
        fs::write(
            dir.join("tokens.csv"),
            format!("{ADMIN_TOKEN},admin,1,system:masters\n{FLANNEL_TOKEN},flannel,2,\n"),
        )
        .unwrap();
        let p = |name: &str| dir.join(name).display().to_string();
        let args = vec![
            format!("--etcd-servers=http://{ip}:2379"),
            format!("--bind-address={ip}"),
            format!("--advertise-address={ip}"),
            format!("--secure-port={PORT}"),
            format!("--tls-cert-file={}", tls.server_cert.display()),
            format!("--tls-private-key-file={}", tls.server_key.display()),
            format!("--cert-dir={}", p("certs")),
            format!("--token-auth-file={}", p("tokens.csv")),
            "--authorization-mode=RBAC".into(),
            format!("--service-account-key-file={}", p("sa.pub")),
            format!("--service-account-signing-key-file={}", p("sa.key")),
            "--service-account-issuer=https://kubernetes.default.svc".into(),
            "--service-cluster-ip-range=10.96.0.0/16".into(),
            "--enable-priority-and-fairness=false".into(),
            "--watch-cache=true".into(),
        ];
        let mut api =
            KubeApi { etcd, apiserver: Daemon { child: None }, ip, dir: dir.clone(), infra: infra.path.clone(), args };
        api.spawn(infra);
        let (status, body) =
            api.request(infra, "POST", "/api/v1/namespaces", Some(r#"{"metadata":{"name":"kube-flannel"}}"#));
        assert!(status == 201 || status == 409, "namespace: {status} {body}");
        for object in serde_json::from_str::<Value>(FLANNEL_RBAC).unwrap().as_array().unwrap() {
            let path = match object["kind"].as_str().unwrap() {
                "ClusterRole" => "/apis/rbac.authorization.k8s.io/v1/clusterroles",
                _ => "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
            };
            let (status, body) = api.request(infra, "POST", path, Some(&object.to_string()));
            assert!(status == 201 || status == 409, "{path}: {status} {body}");
        }
        api
    }

    fn spawn(&mut self, infra: &TestNetns) {
        let log = fs::OpenOptions::new().create(true).append(true).open(self.dir.join("apiserver.log")).unwrap();
        let mut command = clean_command(infra, kube_bin("kube-apiserver"));
        command.args(&self.args).stdout(Stdio::null()).stderr(log);
        self.apiserver = Daemon::spawn(&mut command);
        let ready = wait_for(Duration::from_secs(120), || self.request(infra, "GET", "/readyz", None).0 == 200);
        assert!(ready.is_some(), "kube-apiserver not ready within 120 s:\n{}", self.log_tail());
    }

    /// The last lines of kube-apiserver's log.
    pub fn log_tail(&self) -> String {
        let text = fs::read_to_string(self.dir.join("apiserver.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// Kills kube-apiserver (SIGKILL: a crash); etcd stays. [`KubeApi::restart`] brings it back.
    pub fn kill(&mut self) {
        self.apiserver.stop(nix::sys::signal::Signal::SIGKILL);
    }

    /// Kills kube-apiserver (if still running) and starts it again on the same etcd; waits until ready.
    pub fn restart(&mut self, infra: &TestNetns) {
        self.restart_with(infra, |_| {});
    }

    /// [`KubeApi::restart`], running `meanwhile` against etcd while kube-apiserver is down (a write there moves
    /// etcd's revision past every watcher's resourceVersion: the restarted server's watch cache answers their
    /// watches with 410 Gone).
    pub fn restart_with(&mut self, infra: &TestNetns, meanwhile: impl FnOnce(&Etcd)) {
        assert_eq!(infra.path, self.infra);
        self.kill();
        meanwhile(&self.etcd);
        self.spawn(infra);
    }

    /// kube-apiserver's PID (0 once stopped): for its RSS in the benchmark.
    pub fn apiserver_pid(&self) -> u32 {
        self.apiserver.id()
    }

    pub fn url(&self) -> String {
        format!("https://{}:{PORT}", self.ip)
    }

    /// A kubeconfig for the user with `token` (the test's CA, which signed the API server's certificate).
    pub fn kubeconfig(&self, name: &str, token: &str) -> PathBuf {
        let path = self.dir.join(format!("{name}.kubeconfig"));
        let ca = self.dir.join("ca.crt");
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: {}\n    certificate-authority: {}\n\
             users:\n- name: {name}\n  user:\n    token: {token}\ncontexts:\n- name: test\n  context:\n    cluster: test\n    user: {name}\n\
             current-context: test\n",
            self.url(),
            ca.display()
        );
        fs::write(&path, text).unwrap();
        path
    }

    /// One request as the admin user, from `ns`: the HTTP status and the body.
    pub fn request(&self, ns: &TestNetns, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
        self.request_as(ns, ADMIN_TOKEN, method, path, body, "application/json")
    }

    /// One request with `token` and the body's content type.
    pub fn request_as(
        &self,
        ns: &TestNetns,
        token: &str,
        method: &str,
        path: &str,
        body: Option<&str>,
        content_type: &str,
    ) -> (u16, String) {
        let mut command = clean_command(ns, "curl");
        command
            .args(["-sS", "--max-time", "10", "-o", "-", "-w", "\n%{http_code}", "-X", method])
            .arg("--cacert")
            .arg(self.dir.join("ca.crt"))
            .arg("-H")
            .arg(format!("Authorization: Bearer {token}"))
            .args(["-H", &format!("Content-Type: {content_type}")]);
        if body.is_some() {
            command.args(["--data-binary", "@-"]);
        }
        command.arg(format!("{}{path}", self.url()));
        let out = crate::run_with_stdin(&mut command, body.unwrap_or_default().as_bytes());
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
        (code.trim().parse().unwrap_or(0), body.to_string())
    }

    /// Creates `object` (a POST to its `collection`, as the admin user); panics unless created.
    pub fn create(&self, ns: &TestNetns, collection: &str, object: &Value) {
        let (status, body) = self.request(ns, "POST", collection, Some(&object.to_string()));
        assert_eq!(status, 201, "POST {collection}: {body}");
    }

    /// A JSON merge patch of the object at `path` (or of its status, with a path ending in `/status`; null
    /// removes a field).
    pub fn patch(&self, ns: &TestNetns, path: &str, patch: &Value) {
        let patch = patch.to_string();
        let (status, body) =
            self.request_as(ns, ADMIN_TOKEN, "PATCH", path, Some(&patch), "application/merge-patch+json");
        assert_eq!(status, 200, "PATCH {path}: {body}");
    }

    pub fn delete(&self, ns: &TestNetns, path: &str) {
        let (status, body) = self.request(ns, "DELETE", path, None);
        assert_eq!(status, 200, "DELETE {path}: {body}");
    }

    /// The object at `path`.
    pub fn get(&self, ns: &TestNetns, path: &str) -> Value {
        let (status, body) = self.request(ns, "GET", path, None);
        assert_eq!(status, 200, "GET {path}: {body}");
        serde_json::from_str(&body).unwrap()
    }

    /// The items of the list at `path`.
    pub fn list(&self, ns: &TestNetns, path: &str) -> Vec<Value> {
        self.get(ns, path)["items"].as_array().cloned().unwrap_or_default()
    }

    /// Creates the Namespace `object` and its `default` ServiceAccount (kube-controller-manager's job; the
    /// ServiceAccount admission plugin refuses pods in a namespace without it).
    pub fn create_namespace(&self, ns: &TestNetns, object: &Value) {
        self.create(ns, "/api/v1/namespaces", object);
        self.default_service_account(ns, object["metadata"]["name"].as_str().expect("the Namespace's name"));
    }

    /// Makes the `default` ServiceAccount of `namespace` unless it is there.
    fn default_service_account(&self, ns: &TestNetns, namespace: &str) {
        let account =
            serde_json::json!({ "apiVersion": "v1", "kind": "ServiceAccount", "metadata": { "name": "default" } });
        let path = format!("/api/v1/namespaces/{namespace}/serviceaccounts");
        let (status, body) = self.request(ns, "POST", &path, Some(&account.to_string()));
        assert!(status == 201 || status == 409, "ServiceAccount: {status} {body}");
    }

    /// Creates a Node named `name` with `pod_cidrs` (the first also as `spec.podCIDR`), as a kubelet registers
    /// and kube-controller-manager allocates.
    pub fn create_node(&self, ns: &TestNetns, name: &str, pod_cidrs: &[&str]) {
        let node = serde_json::json!({
            "apiVersion": "v1", "kind": "Node", "metadata": { "name": name },
            "spec": { "podCIDR": pod_cidrs.first(), "podCIDRs": pod_cidrs },
        });
        self.create(ns, "/api/v1/nodes", &node);
    }

    /// Creates the pod `namespace/name` bound to Node `node_name` (as the scheduler would; nothing runs it),
    /// with the namespace's `default` ServiceAccount made first.
    pub fn create_pod(&self, ns: &TestNetns, namespace: &str, name: &str, node_name: &str) {
        self.default_service_account(ns, namespace);
        let pod = serde_json::json!({
            "apiVersion": "v1", "kind": "Pod", "metadata": { "name": name },
            "spec": { "nodeName": node_name, "containers": [{ "name": "kube-flannel", "image": "localhost/cni-rs/fabricd:dev" }] },
        });
        self.create(ns, &format!("/api/v1/namespaces/{namespace}/pods"), &pod);
    }

    /// `kubectl <args>` as the admin user, from `ns`, with `stdin` (`create -f -` of a List: many objects from
    /// one process).
    pub fn kubectl(&self, ns: &TestNetns, args: &[&str], stdin: &[u8]) -> std::process::Output {
        let kubeconfig = self.kubeconfig("admin", ADMIN_TOKEN);
        let mut command = clean_command(ns, kube_bin("kubectl"));
        // Its cache in the test's dir (without HOME, kubectl would write .kube/ into the working directory).
        command
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg(format!("--cache-dir={}", self.dir.join("kubectl-cache").display()))
            .args(args);
        crate::run_with_stdin(&mut command, stdin)
    }

    pub fn delete_node(&self, ns: &TestNetns, name: &str) {
        self.delete(ns, &format!("/api/v1/nodes/{name}"));
    }

    pub fn node(&self, ns: &TestNetns, name: &str) -> Value {
        self.get(ns, &format!("/api/v1/nodes/{name}"))
    }

    /// Merges `annotations` into the Node's (a JSON merge patch; null removes one).
    pub fn annotate(&self, ns: &TestNetns, name: &str, annotations: &Value) {
        self.patch(
            ns,
            &format!("/api/v1/nodes/{name}"),
            &serde_json::json!({ "metadata": { "annotations": annotations } }),
        );
    }
}

impl Drop for KubeApi {
    fn drop(&mut self) {
        self.kill();
    }
}
