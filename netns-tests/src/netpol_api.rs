//! A bare API server for the NetworkPolicy agent's watch test: etcd and kube-apiserver in an infra
//! namespace, state in the test's directory, a serving certificate from a CA of the test's (openssl), one
//! admin token, authorization AlwaysAllow, no ServiceAccount admission. Objects are written with curl from the infra namespace; everything is killed by PID on drop.
//! (fabricd's Kubernetes tests bring a fuller one, `kubeapi.rs`; this one is what the agent needs alone.)

use std::fs;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::clean_command;
use crate::daemon::Daemon;
use crate::fabric::{require_tool, Etcd};
use crate::{wait_for, TestNetns, Value};

pub const PORT: u16 = 6443;
const TOKEN: &str = "netpol-admin-token";

/// Where the Kubernetes binaries are built, unless `KUBE_BIN_DIR` says.
pub fn kube_bin(name: &str) -> PathBuf {
    let dir = std::env::var_os("KUBE_BIN_DIR").map(PathBuf::from).unwrap_or_else(|| "/var/tmp/cni-rs-k8s/bin".into());
    dir.join(name)
}

/// True when kube-apiserver, etcd, curl and openssl are there; under CI=true their absence fails the test.
pub fn available() -> bool {
    crate::require(
        "kube-apiserver",
        kube_bin("kube-apiserver").is_file() && ["etcd", "curl", "openssl"].iter().all(|t| crate::on_path(t)),
        "build kube-apiserver into /var/tmp/cni-rs-k8s/bin; apt-get install etcd-server curl openssl",
    )
}

pub struct ApiServer {
    _etcd: Etcd,
    apiserver: Daemon,
    pub ip: Ipv4Addr,
    pub dir: PathBuf,
    args: Vec<String>,
}

impl ApiServer {
    /// etcd and kube-apiserver in `infra` at `ip`, state under `dir`; waits until the API is ready.
    pub fn start(infra: &TestNetns, ip: Ipv4Addr, dir: &Path) -> ApiServer {
        require_tool("openssl");
        let dir = dir.join("apiserver");
        fs::create_dir_all(&dir).unwrap();
        let etcd = Etcd::start(infra, ip, &dir, None);
        let openssl = |args: &[&str]| {
            let out = Command::new("openssl").args(args).current_dir(&dir).output().expect("openssl");
            assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        };
        // A CA and a serving certificate it signs (rustls refuses a CA certificate as the server's own).
        fs::write(
            dir.join("server.ext"),
            format!("subjectAltName=IP:{ip}\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n"),
        )
        .unwrap();
        openssl(&[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=netpol-test-ca",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
        ]);
        openssl(&[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/CN=kube-apiserver",
            "-keyout",
            "apiserver.key",
            "-out",
            "apiserver.csr",
        ]);
        openssl(&[
            "x509",
            "-req",
            "-in",
            "apiserver.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            "server.ext",
            "-out",
            "apiserver.crt",
        ]);
        openssl(&["genrsa", "-out", "sa.key", "2048"]);
        fs::write(dir.join("tokens.csv"), format!("{TOKEN},admin,1,system:masters\n")).unwrap();
        let p = |name: &str| dir.join(name).display().to_string();
        let args = vec![
            format!("--etcd-servers=http://{ip}:2379"),
            format!("--bind-address={ip}"),
            format!("--advertise-address={ip}"),
            format!("--secure-port={PORT}"),
            format!("--tls-cert-file={}", p("apiserver.crt")),
            format!("--tls-private-key-file={}", p("apiserver.key")),
            format!("--cert-dir={}", p("certs")),
            format!("--token-auth-file={}", p("tokens.csv")),
            "--authorization-mode=AlwaysAllow".into(),
            format!("--service-account-key-file={}", p("sa.key")),
            format!("--service-account-signing-key-file={}", p("sa.key")),
            "--service-account-issuer=https://kubernetes.default.svc".into(),
            "--service-cluster-ip-range=10.96.0.0/16".into(),
            "--enable-priority-and-fairness=false".into(),
            // No controller manager makes the namespaces' default service accounts.
            "--disable-admission-plugins=ServiceAccount".into(),
        ];
        let mut api = ApiServer { _etcd: etcd, apiserver: Daemon { child: None }, ip, dir, args };
        api.spawn(infra);
        api
    }

    fn spawn(&mut self, infra: &TestNetns) {
        let log = fs::OpenOptions::new().create(true).append(true).open(self.dir.join("apiserver.log")).unwrap();
        let mut command = clean_command(infra, kube_bin("kube-apiserver"));
        command.args(&self.args).stdout(Stdio::null()).stderr(log);
        self.apiserver = Daemon::spawn(&mut command);
        let ready = wait_for(Duration::from_secs(120), || self.request(infra, "GET", "/readyz", None).0 == 200);
        assert!(
            ready.is_some(),
            "kube-apiserver not ready:\n{}",
            fs::read_to_string(self.dir.join("apiserver.log")).unwrap_or_default()
        );
    }

    /// Kills kube-apiserver (SIGKILL).
    pub fn kill(&mut self) {
        self.apiserver.stop(nix::sys::signal::Signal::SIGKILL);
    }

    /// Starts it again on the same etcd; waits until ready.
    pub fn restart(&mut self, infra: &TestNetns) {
        self.kill();
        self.spawn(infra);
    }

    /// A kubeconfig with the admin token and the test's CA.
    pub fn kubeconfig(&self) -> PathBuf {
        let path = self.dir.join("admin.kubeconfig");
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: https://{}:{PORT}\n    certificate-authority: {}\n\
             users:\n- name: admin\n  user:\n    token: {TOKEN}\ncontexts:\n- name: test\n  context:\n    cluster: test\n    user: admin\n\
             current-context: test\n",
            self.ip,
            self.dir.join("ca.crt").display()
        );
        fs::write(&path, text).unwrap();
        path
    }

    /// One request from `ns`: the HTTP status and the body.
    pub fn request(&self, ns: &TestNetns, method: &str, path: &str, body: Option<(&str, &Value)>) -> (u16, String) {
        let url = format!("https://{}:{PORT}{path}", self.ip);
        let cacert = self.dir.join("ca.crt").display().to_string();
        let auth = format!("Authorization: Bearer {TOKEN}");
        let mut args = vec![
            "-sS",
            "--max-time",
            "10",
            "-o",
            "-",
            "-w",
            "\n%{http_code}",
            "-X",
            method,
            "--cacert",
            &cacert,
            "-H",
            &auth,
        ];
        let (content_type, data) = match body {
            Some((content_type, value)) => (format!("Content-Type: {content_type}"), value.to_string()),
            None => (String::new(), String::new()),
        };
        if body.is_some() {
            args.extend(["-H", &content_type, "--data-binary", "@-"]);
        }
        args.push(&url);
        let out = ns.exec("curl", &args, &[], data.as_bytes());
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
        (code.trim().parse().unwrap_or(0), body.to_string())
    }

    /// Creates an object (POST to its collection); panics unless created.
    pub fn create(&self, ns: &TestNetns, collection: &str, object: &Value) {
        let (status, body) = self.request(ns, "POST", collection, Some(("application/json", object)));
        assert_eq!(status, 201, "POST {collection}: {body}");
    }

    /// A JSON merge patch of an object (or of its status, with a path ending in `/status`).
    pub fn patch(&self, ns: &TestNetns, path: &str, patch: &Value) {
        let (status, body) = self.request(ns, "PATCH", path, Some(("application/merge-patch+json", patch)));
        assert_eq!(status, 200, "PATCH {path}: {body}");
    }

    pub fn delete(&self, ns: &TestNetns, path: &str) {
        let (status, body) = self.request(ns, "DELETE", path, None);
        assert_eq!(status, 200, "DELETE {path}: {body}");
    }

    /// The items of a list.
    pub fn list(&self, ns: &TestNetns, path: &str) -> Vec<Value> {
        let (status, body) = self.request(ns, "GET", path, None);
        assert_eq!(status, 200, "GET {path}: {body}");
        let list: Value = serde_json::from_str(&body).unwrap();
        list["items"].as_array().cloned().unwrap_or_default()
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        self.kill();
    }
}
