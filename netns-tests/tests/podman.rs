//! Issue 12: podman (Debian's 4.3.1, CNI backend) runs a container with a hostPort on a CNI network, once
//! with our plugins and once with the reference plugins (Debian's, in /usr/lib/cni).
//!
//! podman runs in a test node netns with an uplink to a "wan" netns (see `netns_tests::podman`); its CNI
//! plugin directory is a recorder (`netns_tests::recorder`) in front of the plugins under test. What a user
//! sees is asserted: `podman run -d -p` succeeds, the container's IP from `podman inspect` is on its eth0
//! and serves HTTP (busybox httpd), the hostPort answers from wan; after `podman rm -f` nothing of it is
//! left (veth, iptables rules, lease, cache entry, netns), and no plugin call failed.
//!
//! Networks: a hand-written conflist of the plugin types in [`OUR_CHAIN`] (bridge with host-local, portmap,
//! firewall, tuning, as podman writes them; podman adds loopback itself), and the network `podman network
//! create` writes (the same chain, host-local's default dataDir), and podman's default network `podman`
//! (10.88.0.0/16, which podman writes itself for a container that names no network). [`created_network_ours`]
//! runs only when [`OUR_CHAIN`] has every plugin of podman's chain.

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use netns_tests::cnicore::netlink::Netlink;
use netns_tests::cnicore::netns::NetNs;
use netns_tests::daemon::http_get;
use netns_tests::images::INDEX_HTML;
use netns_tests::kubenet;
use netns_tests::podman::{self, Podman};
use netns_tests::recorder::Recorder;
use netns_tests::runtimes::{node_with_wan, pod_links, summaries, Plugins, NODE_IP};
use netns_tests::snapshot::NodeSnapshot;
use netns_tests::{eventually, json, net, Value};

/// The plugin types of the hand-written network (ours and the reference), in chain order, as podman writes
/// them; a plugin type our suite lacks is left out here (and the created network is not run with ours).
const OUR_CHAIN: &[&str] = &["bridge", "portmap", "firewall", "tuning"];
/// The chain `podman network create` writes (podman 4.3).
const PODMAN_CHAIN: &[&str] = &["bridge", "portmap", "firewall", "tuning"];
/// Every plugin the recorder stands in for.
const RECORDED: &[&str] = &["bridge", "host-local", "portmap", "firewall", "tuning", "loopback", "bandwidth"];

const HOST_PORT: u16 = 8081;
const NETWORK: &str = "cnirs";

/// The network a test runs its container on.
enum Network<'a> {
    /// A conflist of these plugin types, written by the test.
    Conflist(&'a [&'a str]),
    /// What `podman network create` writes.
    Created,
    /// podman's default network (`podman`, 10.88.0.0/16 on `cni-podman0`), which it writes itself when a
    /// container names no network.
    Default,
}

/// podman 4.3's default network.
const DEFAULT_NETWORK: &str = "podman";
const DEFAULT_SUBNET: &str = "10.88.0.0/16";

/// One entry of a hand-written conflist; the bridge and its subnet are those of the kubenet conflist, so
/// that `netns_tests::kubenet` tells pod state from shared state.
fn plugin_conf(kind: &str, data_dir: &Path) -> Value {
    match kind {
        "bridge" => json!({
            "type": "bridge", "bridge": kubenet::BRIDGE, "isGateway": true, "ipMasq": true, "hairpinMode": true,
            "ipam": {
                "type": "host-local", "dataDir": data_dir, "routes": [{"dst": "0.0.0.0/0"}],
                "ranges": [[{"subnet": kubenet::SUBNET_V4, "gateway": kubenet::GATEWAY_V4}]]
            }
        }),
        "portmap" => json!({"type": "portmap", "capabilities": {"portMappings": true}}),
        // As podman writes them.
        "firewall" => json!({"type": "firewall", "backend": ""}),
        "tuning" => json!({"type": "tuning"}),
        other => panic!("no conflist entry for plugin type {other}"),
    }
}

/// Shared firewall state the reference firewall plugin leaves on purpose (its chains and the jump to them),
/// unlike its per-container rules, which name the container's address.
fn firewall_scaffolding(line: &str, pod_ip: IpAddr) -> bool {
    (line.contains("CNI-FORWARD") || line.contains("CNI-ADMIN")) && !line.contains(&pod_ip.to_string())
}

fn hostport_container(plugins: Plugins, network: Network) {
    if !podman::available() {
        return;
    }
    let (node, wan) = node_with_wan();
    let recorder = Recorder::new(node.dir(), &plugins.dir(), RECORDED);
    let podman = Podman::new(&node, &recorder.dir);
    let data_dir = node.dir().join("ipam");

    let (net_name, bridge, subnet) = match network {
        Network::Conflist(kinds) => {
            let conf = json!({
                "cniVersion": "0.4.0",
                "name": NETWORK,
                "plugins": kinds.iter().map(|k| plugin_conf(k, &data_dir)).collect::<Vec<_>>(),
            });
            std::fs::write(podman.net_dir.join(format!("{NETWORK}.conflist")), conf.to_string()).expect("conflist");
            (NETWORK.to_string(), kubenet::BRIDGE.to_string(), kubenet::SUBNET_V4)
        }
        Network::Created => {
            let args = ["network", "create", "--subnet", kubenet::SUBNET_V4, "--gateway", kubenet::GATEWAY_V4, NETWORK];
            podman.ok(&args);
            let conf: Value = serde_json::from_slice(
                &std::fs::read(podman.net_dir.join(format!("{NETWORK}.conflist"))).expect("podman's conflist"),
            )
            .expect("json");
            let kinds: Vec<&str> =
                conf["plugins"].as_array().expect("plugins").iter().filter_map(|p| p["type"].as_str()).collect();
            assert_eq!(kinds, PODMAN_CHAIN, "the chain podman network create writes: {conf}");
            let bridge = conf["plugins"][0]["bridge"].as_str().expect("bridge name").to_string();
            (NETWORK.to_string(), bridge, kubenet::SUBNET_V4)
        }
        Network::Default => (DEFAULT_NETWORK.to_string(), "cni-podman0".to_string(), DEFAULT_SUBNET),
    };
    // podman checks every network's plugins (VERSION) and hides a network whose plugins fail it.
    let listed = podman.ok(&["network", "ls", "--format", "{{.Name}}"]);
    assert!(
        listed.lines().any(|l| l == net_name),
        "podman network ls lists {net_name}: {listed}\ncalls:\n  {}",
        summaries(&recorder.calls())
    );
    // host-local's dataDir: ours, or podman's default /var/lib/cni/networks.
    let default_data_dir = podman.var_lib_cni.join("networks");
    let state_dirs: [&Path; 3] = [&data_dir, &default_data_dir, &podman.var_lib_cni];
    let before = NodeSnapshot::settled(&node, &state_dirs, Duration::from_secs(3));
    recorder.clear();

    let publish = format!("{HOST_PORT}:80");
    let mut options = vec!["-p", &publish];
    if !matches!(network, Network::Default) {
        options.extend(["--network", &net_name]);
    }
    podman.run_httpd("web", &options, || format!("plugin calls:\n  {}", summaries(&recorder.calls())));
    let adds = recorder.calls();
    assert!(adds.iter().all(|c| c.exit == 0), "a plugin call failed:\n  {}", summaries(&adds));

    // The container's IP, as podman reports it, is on its eth0 in the netns podman made.
    let inspect = podman.inspect("web");
    let settings = &inspect["NetworkSettings"];
    let ip = settings["Networks"][&net_name]["IPAddress"].as_str().unwrap_or_else(|| panic!("no IP: {settings}"));
    let pod_ip: IpAddr = ip.parse().expect("IP");
    assert!(net(subnet).contains(&pod_ip), "{pod_ip} in {subnet}");
    let sandbox = settings["SandboxKey"].as_str().expect("SandboxKey");
    assert_eq!(podman.netns_names().len(), 1, "one container netns");
    let sandbox_netns = NetNs::open(podman.path_in_daemon(sandbox)).expect("open the container's netns");
    let addrs = Netlink::in_netns(&sandbox_netns).and_then(|mut n| n.addresses(None)).expect("addresses");
    assert!(addrs.iter().any(|a| a.addr.addr() == pod_ip), "{pod_ip} on the container: {addrs:?}");
    drop(sandbox_netns);

    // httpd answers on the container's IP from the node and on the hostPort from wan.
    let body =
        eventually(Duration::from_secs(10), || http_get(&node, SocketAddr::new(pod_ip, 80), "/")).expect("httpd");
    assert_eq!(body, INDEX_HTML);
    let via_host_port = SocketAddr::new(NODE_IP.parse().unwrap(), HOST_PORT);
    let body = http_get(&wan, via_host_port, "/").unwrap_or_else(|e| panic!("hostPort from wan: {e}"));
    assert_eq!(body, INDEX_HTML);

    recorder.clear();
    // -t 0: httpd as PID 1 ignores SIGTERM, and the default would wait 10 s for it.
    podman.ok(&["rm", "-f", "-t", "0", "web"]);
    let dels = recorder.calls();
    assert!(dels.iter().any(|c| c.command() == "DEL"), "podman rm ran DEL:\n  {}", summaries(&dels));
    assert!(dels.iter().all(|c| c.exit == 0), "a plugin call failed:\n  {}", summaries(&dels));

    assert_eq!(pod_links(&node), Vec::<String>::new(), "veth removed");
    assert_eq!(podman.netns_names(), Vec::<String>::new(), "container netns removed");
    let after = NodeSnapshot::settled(&node, &state_dirs, Duration::from_secs(3));
    let mut problems = kubenet::residue(&before, &after, &state_dirs);
    // podman's own bridge (cni-podmanN) stays, as cbr0 does; the firewall plugin's shared chains too.
    let shared_bridge = |p: &str| {
        p.contains(&format!(" {bridge} ")) || p.ends_with(&format!(" {bridge}")) || p.contains(&format!("/{bridge}/"))
    };
    problems.retain(|p| !shared_bridge(p));
    problems.retain(|p| !firewall_scaffolding(p, pod_ip));
    // Our firewall keeps attachment records (for GC) under /var/lib/cni/firewall/<network>/: the directory
    // may stay, a record in it may not.
    let records = podman.var_lib_cni.join("firewall").display().to_string();
    problems.retain(|p| !(p.starts_with(&format!("files: + {records}")) && p.contains(" dir ")));
    assert!(problems.is_empty(), "left on the node:\n  {}", problems.join("\n  "));
}

#[test]
fn hostport_container_ours() {
    hostport_container(Plugins::Ours, Network::Conflist(OUR_CHAIN));
}

#[test]
fn hostport_container_reference() {
    hostport_container(Plugins::Reference, Network::Conflist(OUR_CHAIN));
}

#[test]
fn created_network_reference() {
    hostport_container(Plugins::Reference, Network::Created);
}

/// The network `podman network create` writes, with ours (when our suite has each of its plugins).
#[test]
fn created_network_ours() {
    let missing: Vec<&&str> = PODMAN_CHAIN.iter().filter(|p| !OUR_CHAIN.contains(p)).collect();
    if !missing.is_empty() {
        eprintln!("skipped: OUR_CHAIN lacks {missing:?} of podman's chain");
        return;
    }
    hostport_container(Plugins::Ours, Network::Created);
}

/// podman's default network, on our plugins alone: podman writes its chain (bridge + host-local, portmap,
/// firewall, tuning) when a container names no network.
#[test]
fn default_network_ours() {
    hostport_container(Plugins::Ours, Network::Default);
}

#[test]
fn default_network_reference() {
    hostport_container(Plugins::Reference, Network::Default);
}
