//! Kubernetes' e2e test images as `cluster.sh` builds them (scripts/lib/cluster/images.sh, each as its
//! Dockerfile in the release tree says), on a one-node cluster, running what the network and common suites run
//! in them: agnhost with no args staying up (`Cmd ["pause"]`), its netexec answering `curl` (the Granular
//! Checks' `/dial` over UDP too), OpenBSD `nc -u` and `nc -z` from `sh -c`, `ss`, `ip`, `dig` over UDP and TCP,
//! `iperf` 2, bash, porter serving TLS with the certificate and key where the Dockerfile puts them, the users and
//! group the Dockerfile adds; the DNS specs' pod (test-webserver, and the same probe loop in agnhost and in
//! jessie-dnsutils: `dig +search` A/PTR/CNAME by UDP and TCP, `getent hosts`) read through the API server's pod
//! proxy; nginx serving its welcome page and logging to stdout; busybox running the framework's default pod
//! command and `wget`. The DNS server is the nodes' resolver on the wan (`cluster.sh`'s dnsmasq: `outside.cni-rs.test`,
//! its PTR and its alias `www.cni-rs.test`); the cluster DNS itself is judged by k8s_conformance.

use std::time::Duration;

use netns_tests::cluster::{self, Cluster, ClusterConfig, AGNHOST};
use netns_tests::eventually;
use netns_tests::workloads::{POD_TIMEOUT, REACH_TIMEOUT};

const JESSIE_DNSUTILS: &str = "registry.k8s.io/e2e-test-images/jessie-dnsutils:1.7";
const BUSYBOX: &str = "registry.k8s.io/e2e-test-images/busybox:1.29-4";
const NGINX: &str = "registry.k8s.io/e2e-test-images/nginx:1.14-4";
/// The wan's address (every node's way out), where the nodes' resolver listens.
const WAN: &str = "172.31.0.1";
/// What the wan's resolver answers: an A record (the wan's address), its PTR, and a CNAME to it, under the
/// search domain `cni-rs.test`.
const PROBE_A: &str = "172.31.0.1";

/// The agnhost pods: `client` with no args (the image's Cmd, pause), `server` (netexec on TCP 8080 and UDP 8081,
/// and iperf's server beside it), `porter` (TLS on 443 with its default certificate and key).
fn agnhost_pods() -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: client, labels: {{images: agnhost}}}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - {{name: c, image: {AGNHOST}}}
---
apiVersion: v1
kind: Pod
metadata: {{name: server, labels: {{images: agnhost}}}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - {{name: netexec, image: {AGNHOST}, args: ["netexec", "--http-port=8080", "--udp-port=8081"]}}
  - {{name: iperf, image: {AGNHOST}, command: ["iperf", "-s", "-p", "6001"]}}
---
apiVersion: v1
kind: Pod
metadata: {{name: porter, labels: {{images: agnhost}}}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: porter
    image: {AGNHOST}
    args: ["porter"]
    env: [{{name: SERVE_TLS_PORT_443, value: "tls ok"}}, {{name: SERVE_PORT_80, value: "plain ok"}}]
"#
    )
}

/// The DNS specs' pod (createDNSPod of test/e2e/network/dns_common.go): test-webserver serving /results, and
/// the probe loop in agnhost ("wheezy") and in jessie-dnsutils ("jessie"), resolving through the wan's resolver.
fn dns_pod() -> String {
    let (wheezy, jessie) = (probe_command("wheezy"), probe_command("jessie"));
    format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: dns-test, labels: {{images: dns}}}}
spec:
  terminationGracePeriodSeconds: 1
  hostname: dns-querier
  dnsPolicy: None
  dnsConfig: {{nameservers: ["{WAN}"], searches: [cni-rs.test]}}
  volumes: [{{name: results, emptyDir: {{}}}}]
  containers:
  - {{name: webserver, image: {AGNHOST}, args: [test-webserver], volumeMounts: [{{name: results, mountPath: /results}}]}}
  - name: querier
    image: {AGNHOST}
    command: [sh, -c]
    args: ['{wheezy}']
    volumeMounts: [{{name: results, mountPath: /results}}]
  - name: jessie-querier
    image: {JESSIE_DNSUTILS}
    command: [sh, -c, '{jessie}']
    volumeMounts: [{{name: results, mountPath: /results}}]
"#
    )
}

/// createProbeCommand's loop (A by UDP and TCP with `+search`, the pod's own name with `getent hosts`, the PTR
/// of the A record) and createTargetedProbeCommand's CNAME, as the DNS specs write them (`$$` for `$`).
fn probe_command(prefix: &str) -> String {
    let mut cmd = "for i in `seq 1 600`; do ".to_string();
    for (flag, proto) in [("notcp", "udp"), ("tcp", "tcp")] {
        let file = format!("{prefix}_{proto}@outside");
        cmd += &format!(
            r#"check="$$(dig +{flag} +noall +answer +search outside A)" && test -n "$$check" && echo OK > /results/{file};"#
        );
        let file = format!("{prefix}_{proto}@PTR");
        cmd += &format!(
            r#"check="$$(dig +{flag} +noall +answer +search 1.0.31.172.in-addr.arpa. PTR)" && test -n "$$check" && echo OK > /results/{file};"#
        );
    }
    cmd += &format!(r#"test -n "$$(getent hosts dns-querier)" && echo OK > /results/{prefix}_hosts@dns-querier;"#);
    cmd += &format!("dig +short www.cni-rs.test CNAME > /results/{prefix}_cname;");
    cmd + "sleep 1; done"
}

/// The files each querier writes, and what they hold.
fn probe_results() -> Vec<(String, &'static str)> {
    let mut files = Vec::new();
    for prefix in ["wheezy", "jessie"] {
        for name in ["udp@outside", "tcp@outside", "udp@PTR", "tcp@PTR", "hosts@dns-querier"] {
            files.push((format!("{prefix}_{name}"), "OK"));
        }
        files.push((format!("{prefix}_cname"), "outside.cni-rs.test."));
    }
    files
}

fn other_pods() -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: nginx, labels: {{images: other}}}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - {{name: nginx, image: {NGINX}, ports: [{{containerPort: 80}}]}}
---
apiVersion: v1
kind: Pod
metadata: {{name: busybox, labels: {{images: other}}}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - {{name: busybox, image: {BUSYBOX}, command: ["/bin/sh", "-c", "trap exit TERM; while true; do sleep 1; done"]}}
"#
    )
}

/// `kubectl exec POD -c CONTAINER -- sh -c SCRIPT`: its stdout, or the whole output if it failed.
fn sh(cluster: &Cluster, pod: &str, container: &str, script: &str) -> Result<String, String> {
    let out = cluster.kubectl(&["exec", pod, "-c", container, "--", "sh", "-c", script]);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    if out.status.success() {
        Ok(stdout.into_owned())
    } else {
        Err(format!("`{script}` in {pod}/{container}: {}\n{stdout}{stderr}", out.status))
    }
}

/// [`sh`] until it succeeds with output containing `want` (servers take a moment to listen).
fn sh_until(cluster: &Cluster, pod: &str, container: &str, script: &str, want: &str) -> String {
    eventually(REACH_TIMEOUT, || match sh(cluster, pod, container, script) {
        Ok(out) if out.contains(want) => Ok(out),
        Ok(out) => Err(format!("`{script}` in {pod}/{container} printed {out:?}, not {want:?}")),
        Err(e) => Err(e),
    })
    .unwrap_or_else(|e| panic!("{e}"))
}

fn agnhost_tools(cluster: &Cluster, server: &str, porter: &str) {
    // The shell is dash, and what it runs is the image's programs on PATH: OpenBSD's nc, not busybox's.
    let shell = sh_until(
        cluster,
        "client",
        "c",
        "readlink /bin/sh; nc -h 2>&1 | head -1; bash -c 'echo bash $BASH_VERSION'",
        "bash",
    );
    assert!(shell.starts_with("dash\nOpenBSD netcat") && shell.contains("bash 5."), "sh and nc in agnhost: {shell}");
    let curl = format!("curl -g -q -s --max-time 15 --connect-timeout 1 http://{server}:8080/hostName");
    sh_until(cluster, "client", "c", &curl, "server");
    let dial = format!(
        "curl -g -q -s 'http://{server}:8080/dial?request=hostname&protocol=udp&host={server}&port=8081&tries=1'"
    );
    sh_until(cluster, "client", "c", &dial, r#"{"responses":["server"]}"#);
    sh_until(cluster, "client", "c", &format!("echo hostName | nc -v -u -w 2 {server} 8081"), "server");
    sh_until(cluster, "client", "c", &format!("nc -z -w 2 {server} 8080 && echo open"), "open");
    let closed = sh(cluster, "client", "c", &format!("nc -z -w 2 {server} 8089"));
    assert!(closed.is_err(), "nc -z to a closed port: {closed:?}");
    let listening = sh_until(cluster, "server", "netexec", "ss -ltn; ss -lun", ":8081");
    assert!(listening.contains(":8080") && listening.contains(":6001"), "ss in the server pod: {listening}");
    sh_until(cluster, "client", "c", "ip -o addr show eth0", "inet ");
    let dig = format!("dig @{WAN} +short outside.cni-rs.test A; dig @{WAN} +tcp +short outside.cni-rs.test A");
    assert_eq!(sh_until(cluster, "client", "c", &dig, PROBE_A), format!("{PROBE_A}\n{PROBE_A}\n"), "dig over UDP, TCP");
    let iperf = sh_until(cluster, "client", "c", &format!("iperf -c {server} -p 6001 -t 1 -y C"), ",");
    assert!(iperf.lines().any(|l| l.split(',').count() >= 9), "iperf's CSV report: {iperf}");
    sh_until(cluster, "client", "c", &format!("curl -k -s https://{porter}:443/"), "tls ok");
    sh_until(cluster, "client", "c", &format!("curl -s http://{porter}:80/"), "plain ok");
    let users = sh(cluster, "client", "c", "id user-defined-in-image; ls -d /uploads /localhost.crt /localhost.key");
    let users = users.unwrap_or_else(|e| panic!("{e}"));
    assert!(
        users.contains("uid=1000(user-defined-in-image)") && users.contains("50000(group-defined-in-image)"),
        "the Dockerfile's user and group: {users}"
    );
}

/// The DNS pod's results, read as the DNS specs read them: through the API server's pod proxy to test-webserver.
fn dns_results(cluster: &Cluster) {
    for (file, want) in probe_results() {
        let path = format!("/api/v1/namespaces/default/pods/dns-test/proxy/results/{file}");
        eventually(REACH_TIMEOUT * 2, || match cluster.kubectl(&["get", "--raw", &path]) {
            out if out.status.success() && String::from_utf8_lossy(&out.stdout).trim() == want => Ok(()),
            out => Err(format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))),
        })
        .unwrap_or_else(|e| panic!("/results/{file} of the DNS pod, want {want:?}: {e}"));
    }
}

fn nginx_and_busybox(cluster: &Cluster, nginx: &str, server: &str) {
    sh_until(
        cluster,
        "client",
        "c",
        &format!("curl -q -s --connect-timeout 2 http://{nginx}:80/"),
        "Welcome to nginx!",
    );
    let logs = cluster.kubectl_ok(&["logs", "nginx"]);
    assert!(logs.contains("\"GET / HTTP/1.1\" 200"), "nginx's access log on its stdout: {logs}");
    let wget = format!("wget -q -O - http://{server}:8080/hostName; echo; hostname; id -un");
    assert_eq!(sh_until(cluster, "busybox", "busybox", &wget, "server"), "server\nbusybox\nroot\n", "busybox");
}

/// Still the first run of each container, none restarted (agnhost with no args keeps running its Cmd).
fn none_restarted(cluster: &Cluster) {
    for pod in cluster.get_json(&["pods"])["items"].as_array().expect("pods") {
        for status in pod["status"]["containerStatuses"].as_array().expect("container statuses") {
            let name = format!("{}/{}", pod["metadata"]["name"], status["name"]);
            assert_eq!(status["restartCount"], 0, "{name} restarted: {status}");
            assert!(status["state"]["running"].is_object(), "{name} is not running: {status}");
        }
    }
}

#[test]
fn e2e_images_run_what_the_suites_run_in_them() {
    if !cluster::available() {
        return;
    }
    let cluster = Cluster::up(ClusterConfig { nodes: 1, ..ClusterConfig::default() });
    cluster.apply(&agnhost_pods());
    cluster.apply(&dns_pod());
    cluster.apply(&other_pods());
    let ip = |pods: &[cluster::Pod], name: &str| -> String {
        pods.iter().find(|p| p.name == name).map(|p| p.ips[0].to_string()).expect(name)
    };
    let agnhost = cluster.running_pods("images=agnhost", 3, POD_TIMEOUT);
    let others = cluster.running_pods("images=other", 2, POD_TIMEOUT);
    cluster.running_pods("images=dns", 1, POD_TIMEOUT);
    agnhost_tools(&cluster, &ip(&agnhost, "server"), &ip(&agnhost, "porter"));
    nginx_and_busybox(&cluster, &ip(&others, "nginx"), &ip(&agnhost, "server"));
    dns_results(&cluster);
    std::thread::sleep(Duration::from_secs(2));
    none_restarted(&cluster);
}
