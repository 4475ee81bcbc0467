//! Issue 12: containerd (the machine's, Debian's 1.6.20 here, its CRI plugin) drives the plugins as on a Kubernetes
//! node, over the CRI v1 API as the kubelet does, once with our plugins and once with the reference plugins
//! (Debian's, in /usr/lib/cni), so a failure of ours alone is ours to fix. The pod's life runs again on Debian's
//! containerd 1.7.24 and 2.1.9 (issue 43, `scripts/cluster.sh containerd`), with the same checks of what each
//! sends and of what the plugins leave.
//!
//! A test node netns with an uplink to a "wan" netns runs containerd (see `netns_tests::containerd`); its CNI
//! plugin directory is a recorder (`netns_tests::recorder`) in front of the plugins under test, so every call
//! containerd makes is checked too. The conflist is `conf/10-kubenet.conflist` (bridge + host-local,
//! portmap, bandwidth); containerd adds its own loopback attachment.
//!
//! What a user sees is asserted: the pod's IP from PodSandboxStatus, a busybox httpd in the pod reached
//! through its hostPort from wan, the shaping of the `kubernetes.io/{ingress,egress}-bandwidth` annotations
//! (tbf on the host veth and on the ifb, at the requested rates), and after StopPodSandbox (twice) and
//! RemovePodSandbox nothing of the pod left: veth, ifb, iptables rules and chains, lease, cache entry, netns.
//! The second test renders containerd's `conf_template` with the pod CIDR of UpdateRuntimeConfig; the third
//! makes the last plugin's ADD fail (through the recorder) and checks containerd's rollback DEL cleans up.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use cri_client::{container_config, pod_config, pod_ips, Cri, HostPort, EGRESS_BANDWIDTH, INGRESS_BANDWIDTH};
use netns_tests::cnicore::netlink::Netlink;
use netns_tests::cnicore::netns::NetNs;
use netns_tests::cnicore::tc::QdiscKind;
use netns_tests::containerd::{self, Containerd, ContainerdConfig};
use netns_tests::daemon::http_get;
use netns_tests::images::{BUSYBOX_IMAGE, HTTPD_COMMAND, INDEX_HTML};
use netns_tests::kubenet;
use netns_tests::recorder::{Call, Recorder};
use netns_tests::runtimes::{calls_of, node_with_wan, pod_links, summaries, Plugins, NODE_IP};
use netns_tests::snapshot::NodeSnapshot;
use netns_tests::{eventually, json, net, Node, TestNetns, Value};

/// Every plugin a conflist here may name (the recorder wraps those present).
const PLUGINS: &[&str] = &["bridge", "host-local", "portmap", "bandwidth", "loopback"];

const HOST_PORT: u16 = 8080;
/// The pod's bandwidth annotations, and the tbf rates (bytes per second) they must become.
const INGRESS: &str = "10M";
const EGRESS: &str = "20M";
const INGRESS_BYTES: u64 = 10_000_000 / 8;
const EGRESS_BYTES: u64 = 20_000_000 / 8;

/// A node running containerd with the plugins under test behind a recorder, and a wan netns.
struct Lab {
    // Dropped first: containerd and its pods go before the namespaces and the directory.
    cri: Cri,
    containerd: Containerd,
    recorder: Recorder,
    /// host-local's dataDir.
    ipam_dir: PathBuf,
    wan: TestNetns,
    node: Node,
}

/// How containerd gets its network configuration.
enum Network {
    /// The kubenet conflist in its conf_dir from the start.
    Conflist,
    /// The kubenet chain as `conf_template`, rendered on UpdateRuntimeConfig.
    Template,
}

impl Lab {
    /// A lab on containerd `version` (`system`, `1.7`, `2.1`: see `netns_tests::containerd::binaries`).
    fn new(plugins: Plugins, network: Network, version: &str) -> Lab {
        let (node, wan) = node_with_wan();
        let ipam_dir = node.dir().join("ipam");
        let (conflist, conf_template) = match network {
            Network::Conflist => (Some(kubenet_conflist(&ipam_dir)), None),
            Network::Template => (None, Some(kubenet_template(&ipam_dir))),
        };
        let recorder = Recorder::new(node.dir(), &plugins.dir(), PLUGINS);
        let config = ContainerdConfig { cni_bin_dir: recorder.dir.clone(), conflist, conf_template };
        let containerd = Containerd::start_version(&node, config, version);
        let cri = Cri::connect(&containerd.socket, Duration::from_secs(20))
            .unwrap_or_else(|e| panic!("{e}\n{}", containerd.log_tail(30)));
        Lab { cri, containerd, recorder, ipam_dir, wan, node }
    }

    /// A lab with the kubenet conflist whose containerd reports the network ready, or None when containerd
    /// is missing (skipped).
    fn with_conflist(plugins: Plugins, version: &str) -> Option<Lab> {
        if !containerd::available() {
            return None;
        }
        let mut lab = Lab::new(plugins, Network::Conflist, version);
        wait_network_ready(&mut lab);
        Some(lab)
    }

    /// The sandbox config of pod `name`: with the hostPort and the bandwidth annotations when `shaped`.
    fn pod(&self, name: &str, shaped: bool) -> cri_client::v1::PodSandboxConfig {
        let log_dir = self.node.dir().join("pod-logs");
        std::fs::create_dir_all(&log_dir).expect("log dir");
        let ports = [HostPort { host_port: HOST_PORT, container_port: 80, udp: false }];
        let annotations = [(INGRESS_BANDWIDTH, INGRESS), (EGRESS_BANDWIDTH, EGRESS)];
        let (ports, annotations): (&[HostPort], &[(&str, &str)]) =
            if shaped { (&ports, &annotations) } else { (&[], &[]) };
        pod_config("default", name, &format!("uid-{name}"), ports, annotations, &log_dir)
    }

    /// Panics unless nothing of any pod is left: no veth or ifb, no pod netns, and nothing but shared state
    /// changed since `before` (see `netns_tests::kubenet`); no firewall line names `sandbox`, if given.
    fn assert_nothing_left(&self, before: &NodeSnapshot, sandbox: Option<&str>, when: &str) {
        assert_eq!(pod_links(&self.node), Vec::<String>::new(), "{when}: veth and ifb removed");
        assert_eq!(self.containerd.netns_names(), Vec::<String>::new(), "{when}: pod netns removed");
        let after = self.snapshot();
        let mut problems = kubenet::residue(before, &after, &self.state_dirs());
        if let Some(id) = sandbox {
            for section in ["iptables", "ip6tables", "nftables"] {
                problems.extend(
                    after.section(section).iter().filter(|l| l.contains(id)).map(|l| format!("{section}: {l}")),
                );
            }
        }
        assert!(problems.is_empty(), "{when}: left on the node:\n  {}", problems.join("\n  "));
    }

    /// What the recorder logged, then forgotten.
    fn take_calls(&self) -> Vec<Call> {
        let calls = self.recorder.calls();
        self.recorder.clear();
        calls
    }

    /// Panics with `what`, the CRI error, the plugin calls and containerd's log.
    fn fail(&self, what: &str, error: impl std::fmt::Display) -> ! {
        let calls: Vec<String> = self.recorder.calls().iter().map(Call::summary).collect();
        panic!(
            "{what}: {error}\nplugin calls:\n  {}\ncontainerd's errors and warnings:\n{}",
            calls.join("\n  "),
            self.containerd.log_problems(10)
        );
    }

    /// The node's state, for the before/after comparison; settled (IPv6 addresses of new links appear late).
    fn snapshot(&self) -> NodeSnapshot {
        NodeSnapshot::settled(&self.node, &self.state_dirs(), Duration::from_secs(3))
    }

    fn state_dirs(&self) -> [&Path; 2] {
        [&self.ipam_dir, &self.containerd.var_lib_cni]
    }
}

/// The kubenet conflist of `conf/`, its host-local `dataDir` set.
fn kubenet_conflist(ipam_dir: &Path) -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../conf/10-kubenet.conflist");
    let mut conf: Value = serde_json::from_slice(&std::fs::read(path).expect("read conflist")).expect("json");
    conf["plugins"][0]["ipam"]["dataDir"] = json!(ipam_dir);
    conf
}

/// The pod's network namespace path from a verbose PodSandboxStatus (containerd's runtime spec).
fn netns_path(status: &cri_client::v1::PodSandboxStatusResponse) -> String {
    let info: Value = serde_json::from_str(status.info.get("info").expect("verbose info")).expect("info json");
    let namespaces = info["runtimeSpec"]["linux"]["namespaces"].as_array().expect("namespaces in the spec");
    let network = namespaces.iter().find(|ns| ns["type"] == "network").expect("a network namespace");
    network["path"].as_str().expect("netns path").to_string()
}

/// A DEL round (StopPodSandbox or RemovePodSandbox): every plugin of the chain and loopback called with DEL,
/// with `netns` as CNI_NETNS, and all succeeded.
fn assert_del_round(calls: &[Call], netns: &str, when: &str) {
    for call in calls {
        assert_eq!(call.command(), "DEL", "{when}: only DELs expected:\n  {}", summaries(calls));
        assert_eq!(call.exit, 0, "{when}: a DEL failed:\n  {}", summaries(calls));
        assert_eq!(call.var("CNI_NETNS"), netns, "{when}: CNI_NETNS of {}", call.summary());
    }
    for plugin in ["loopback", "bridge", "host-local", "portmap", "bandwidth"] {
        assert_eq!(calls_of(calls, "DEL", plugin).len(), 1, "{when}: one DEL of {plugin}:\n  {}", summaries(calls));
    }
}

/// Runs one pod through its life as the kubelet would and checks every step.
fn pod_lifecycle(plugins: Plugins, version: &str) {
    let Some(mut lab) = Lab::with_conflist(plugins, version) else { return };
    let before = lab.snapshot();

    let config = lab.pod("web", true);
    let id = match lab.cri.run_pod_sandbox(config.clone()) {
        Ok(id) => id,
        Err(e) => lab.fail("RunPodSandbox", e.message()),
    };

    // What containerd sent: one ADD of each plugin, the kubelet's CNI_ARGS, Go-named capability args.
    let adds = lab.take_calls();
    for plugin in ["loopback", "bridge", "host-local", "portmap", "bandwidth"] {
        assert_eq!(calls_of(&adds, "ADD", plugin).len(), 1, "one ADD of {plugin}:\n  {}", summaries(&adds));
    }
    assert!(adds.iter().all(|c| c.command() == "ADD" && c.exit == 0), "ADD calls:\n  {}", summaries(&adds));
    let bridge_add = calls_of(&adds, "ADD", "bridge")[0];
    let cni_args = bridge_add.var("CNI_ARGS");
    for part in ["K8S_POD_NAMESPACE=default", "K8S_POD_NAME=web", "K8S_POD_UID=uid-web", "IgnoreUnknown=1"] {
        assert!(cni_args.split(';').any(|p| p == part), "CNI_ARGS {cni_args:?} lacks {part}");
    }
    assert_eq!(bridge_add.var("CNI_CONTAINERID"), id);
    let portmap_add = calls_of(&adds, "ADD", "portmap")[0];
    assert_eq!(
        portmap_add.stdin["runtimeConfig"]["portMappings"],
        json!([{"HostPort": HOST_PORT, "ContainerPort": 80, "Protocol": "tcp", "HostIP": ""}]),
        "containerd sends Go field names"
    );
    let bandwidth_add = calls_of(&adds, "ADD", "bandwidth")[0];
    let bw = &bandwidth_add.stdin["runtimeConfig"]["bandwidth"];
    assert_eq!((bw["IngressRate"].as_u64(), bw["EgressRate"].as_u64()), (Some(10_000_000), Some(20_000_000)), "{bw}");

    // The pod's IP, as the kubelet reads it, is on the pod's eth0.
    let status = lab.cri.pod_sandbox_status(&id, true).unwrap_or_else(|e| lab.fail("PodSandboxStatus", e.message()));
    let ips = pod_ips(&status);
    assert_eq!(ips.len(), 1, "one pod IP: {ips:?}");
    let pod_ip: IpAddr = ips[0].parse().expect("pod IP");
    assert!(net(kubenet::SUBNET_V4).contains(&pod_ip), "pod IP {pod_ip} in {}", kubenet::SUBNET_V4);
    let netns = netns_path(&status);
    let pod_netns = NetNs::open(lab.containerd.path_in_daemon(&netns)).expect("open the pod netns");
    let addrs = Netlink::in_netns(&pod_netns).and_then(|mut n| n.addresses(None)).expect("pod addresses");
    assert!(addrs.iter().any(|a| a.addr.addr() == pod_ip), "{pod_ip} on the pod: {addrs:?}");
    drop(pod_netns);

    // A web server in the pod, reached through the hostPort from wan and directly from the node.
    let container = container_config("httpd", BUSYBOX_IMAGE, HTTPD_COMMAND);
    let cid =
        lab.cri.create_container(&id, container, config).unwrap_or_else(|e| lab.fail("CreateContainer", e.message()));
    lab.cri.start_container(&cid).unwrap_or_else(|e| lab.fail("StartContainer", e.message()));
    let direct = SocketAddr::new(pod_ip, 80);
    let body = eventually(Duration::from_secs(10), || http_get(&lab.node, direct, "/")).expect("httpd in the pod");
    assert_eq!(body, INDEX_HTML);
    let via_host_port = SocketAddr::new(NODE_IP.parse().unwrap(), HOST_PORT);
    let body = http_get(&lab.wan, via_host_port, "/").unwrap_or_else(|e| panic!("hostPort from wan: {e}"));
    assert_eq!(body, INDEX_HTML);

    // Shaping at the requested rates: tbf on the host veth (ingress), tbf on the ifb (egress).
    let links = pod_links(&lab.node);
    let veth = links.iter().find(|l| l.starts_with("veth")).unwrap_or_else(|| panic!("a host veth: {links:?}"));
    let ifb = links.iter().find(|l| l.starts_with("bwp")).unwrap_or_else(|| panic!("an ifb: {links:?}"));
    assert_eq!(tbf_rate(&lab.node, veth), Some(INGRESS_BYTES), "ingress tbf on {veth}");
    assert_eq!(tbf_rate(&lab.node, ifb), Some(EGRESS_BYTES), "egress tbf on {ifb}");

    // Stop, stop again, remove: the kubelet's sequence; the later DELs come without a netns.
    lab.cri.stop_pod_sandbox(&id).unwrap_or_else(|e| lab.fail("StopPodSandbox", e.message()));
    assert_del_round(&lab.take_calls(), &netns, "first StopPodSandbox");
    lab.cri.stop_pod_sandbox(&id).unwrap_or_else(|e| lab.fail("second StopPodSandbox", e.message()));
    assert_del_round(&lab.take_calls(), "", "second StopPodSandbox");
    lab.cri.remove_pod_sandbox(&id).unwrap_or_else(|e| lab.fail("RemovePodSandbox", e.message()));
    assert_del_round(&lab.take_calls(), "", "RemovePodSandbox");
    assert!(lab.cri.list_pod_sandbox().expect("ListPodSandbox").is_empty(), "sandbox removed");

    lab.assert_nothing_left(&before, Some(&id), "after RemovePodSandbox");
}

/// The rate (bytes/s) of the tbf qdisc on `link` of the node.
fn tbf_rate(node: &Node, link: &str) -> Option<u64> {
    let mut netlink = node.netlink();
    let index = netlink.require_link(link).expect("link").index;
    netlink.qdiscs(Some(index)).expect("qdiscs").into_iter().find_map(|q| match q.kind {
        QdiscKind::Tbf(Some(tbf)) => Some(tbf.rate),
        _ => None,
    })
}

/// Waits until containerd's CRI reports the network ready (it has loaded a conflist).
fn wait_network_ready(lab: &mut Lab) {
    let ready = eventually(Duration::from_secs(10), || {
        let status = lab.cri.status().map_err(|e| e.message().to_string())?;
        let conditions = status.status.map(|s| s.conditions).unwrap_or_default();
        match conditions.iter().find(|c| c.r#type == "NetworkReady") {
            Some(c) if c.status => Ok(()),
            other => Err(format!("{other:?}")),
        }
    });
    if let Err(e) = ready {
        lab.fail("NetworkReady", e);
    }
}

#[test]
fn pod_lifecycle_ours() {
    pod_lifecycle(Plugins::Ours, "system");
}

#[test]
fn pod_lifecycle_reference() {
    pod_lifecycle(Plugins::Reference, "system");
}

#[test]
fn pod_lifecycle_ours_containerd_1_7() {
    pod_lifecycle(Plugins::Ours, "1.7");
}

#[test]
fn pod_lifecycle_reference_containerd_1_7() {
    pod_lifecycle(Plugins::Reference, "1.7");
}

#[test]
fn pod_lifecycle_ours_containerd_2_1() {
    pod_lifecycle(Plugins::Ours, "2.1");
}

#[test]
fn pod_lifecycle_reference_containerd_2_1() {
    pod_lifecycle(Plugins::Reference, "2.1");
}

/// containerd's `conf_template` for the kubenet chain, with the pod CIDR of UpdateRuntimeConfig.
fn kubenet_template(ipam_dir: &Path) -> String {
    let ipam_dir = serde_json::to_string(&ipam_dir.display().to_string()).expect("json string");
    format!(
        r#"{{
  "cniVersion": "1.0.0",
  "name": "kubenet",
  "plugins": [
    {{"type": "bridge", "bridge": "cbr0", "isGateway": true, "ipMasq": true, "hairpinMode": true,
      "ipam": {{"type": "host-local", "dataDir": {ipam_dir}, "ranges": [[{{"subnet": "{{{{.PodCIDR}}}}"}}]], "routes": [{{"dst": "0.0.0.0/0"}}]}}}},
    {{"type": "portmap", "capabilities": {{"portMappings": true}}, "snat": true}},
    {{"type": "bandwidth", "capabilities": {{"bandwidth": true}}}}
  ]
}}
"#
    )
}

/// UpdateRuntimeConfig renders the template; a pod gets an address of that CIDR; nothing is left after it.
fn conf_template(plugins: Plugins, version: &str) {
    if !containerd::available() {
        return;
    }
    const POD_CIDR: &str = "10.244.1.0/24";
    let mut lab = Lab::new(plugins, Network::Template, version);
    lab.cri.update_pod_cidr(POD_CIDR).unwrap_or_else(|e| lab.fail("UpdateRuntimeConfig", e.message()));
    let rendered = lab.containerd.conf_dir.join("10-containerd-net.conflist");
    let text = std::fs::read_to_string(&rendered).unwrap_or_else(|e| panic!("{}: {e}", rendered.display()));
    let conf: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("rendered conflist {text}: {e}"));
    assert_eq!(conf["plugins"][0]["ipam"]["ranges"][0][0]["subnet"], POD_CIDR, "{text}");
    wait_network_ready(&mut lab);
    let before = lab.snapshot();

    let config = lab.pod("templated", false);
    let id = lab.cri.run_pod_sandbox(config).unwrap_or_else(|e| lab.fail("RunPodSandbox", e.message()));
    let status = lab.cri.pod_sandbox_status(&id, false).unwrap_or_else(|e| lab.fail("PodSandboxStatus", e.message()));
    let ips = pod_ips(&status);
    let pod_ip: IpAddr = ips.first().unwrap_or_else(|| panic!("no pod IP: {status:?}")).parse().expect("IP");
    assert!(net(POD_CIDR).contains(&pod_ip), "pod IP {pod_ip} in {POD_CIDR}");
    assert!(lab.node.ping(pod_ip), "the node reaches the pod at {pod_ip}");

    lab.cri.stop_pod_sandbox(&id).unwrap_or_else(|e| lab.fail("StopPodSandbox", e.message()));
    lab.cri.remove_pod_sandbox(&id).unwrap_or_else(|e| lab.fail("RemovePodSandbox", e.message()));
    let calls = lab.take_calls();
    let failed: Vec<&Call> = calls.iter().filter(|c| c.exit != 0).collect();
    assert!(failed.is_empty(), "failed plugin calls:\n  {}", summaries(&calls));
    lab.assert_nothing_left(&before, Some(&id), "after RemovePodSandbox");
}

#[test]
fn conf_template_ours() {
    conf_template(Plugins::Ours, "system");
}

#[test]
fn conf_template_reference() {
    conf_template(Plugins::Reference, "system");
}

/// containerd 2.x's config version 3 has the template in its runtime plugin.
#[test]
fn conf_template_ours_containerd_2_1() {
    conf_template(Plugins::Ours, "2.1");
}

/// The last plugin's ADD fails (injected by the recorder): containerd rolls the chain back with DEL, which
/// must succeed (else the sandbox stays SANDBOX_UNKNOWN with its netns); nothing is left, and the next pod
/// runs.
fn failed_add_is_rolled_back(plugins: Plugins) {
    let Some(mut lab) = Lab::with_conflist(plugins, "system") else { return };
    let before = lab.snapshot();

    lab.recorder.inject_failure(Some(("bandwidth", "ADD")));
    let config = lab.pod("doomed", true);
    let error = match lab.cri.run_pod_sandbox(config) {
        Ok(id) => panic!("RunPodSandbox succeeded ({id}) although bandwidth's ADD failed"),
        Err(e) => e.message().to_string(),
    };
    assert!(error.contains("injected failure"), "RunPodSandbox's error names the plugin's: {error}");
    let calls = lab.take_calls();
    for plugin in ["bridge", "host-local", "portmap"] {
        assert!(calls_of(&calls, "ADD", plugin).iter().all(|c| c.exit == 0), "{plugin} ADD:\n  {}", summaries(&calls));
    }
    let dels: Vec<Call> = calls.iter().filter(|c| c.command() == "DEL").cloned().collect();
    for plugin in ["bandwidth", "portmap", "bridge", "host-local"] {
        assert!(!calls_of(&dels, "DEL", plugin).is_empty(), "rollback DEL of {plugin}:\n  {}", summaries(&calls));
    }
    assert!(dels.iter().all(|c| c.exit == 0), "a rollback DEL failed:\n  {}", summaries(&calls));
    let sandboxes = lab.cri.list_pod_sandbox().expect("ListPodSandbox");
    assert!(sandboxes.is_empty(), "no sandbox left (SANDBOX_UNKNOWN when the rollback fails): {sandboxes:?}");
    lab.assert_nothing_left(&before, None, "after the rollback");

    lab.recorder.inject_failure(None);
    let config = lab.pod("next", true);
    let id =
        lab.cri.run_pod_sandbox(config).unwrap_or_else(|e| lab.fail("RunPodSandbox after the rollback", e.message()));
    let status = lab.cri.pod_sandbox_status(&id, false).unwrap_or_else(|e| lab.fail("PodSandboxStatus", e.message()));
    let pod_ip: IpAddr = pod_ips(&status).first().expect("pod IP").parse().expect("IP");
    assert!(lab.node.ping(pod_ip), "the node reaches the next pod at {pod_ip}");
    lab.cri.stop_pod_sandbox(&id).unwrap_or_else(|e| lab.fail("StopPodSandbox", e.message()));
    lab.cri.remove_pod_sandbox(&id).unwrap_or_else(|e| lab.fail("RemovePodSandbox", e.message()));
}

#[test]
fn failed_add_is_rolled_back_ours() {
    failed_add_is_rolled_back(Plugins::Ours);
}

#[test]
fn failed_add_is_rolled_back_reference() {
    failed_add_is_rolled_back(Plugins::Reference);
}
