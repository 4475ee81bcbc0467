//! fabricd in flannel's Kubernetes mode (`--kube-subnet-mgr`) against a real kube-apiserver (and its etcd) in
//! the test's infra namespace: each node's subnet from its Node's podCIDRs (set by the test through the API, as
//! kube-controller-manager would), flannel's annotations written byte for byte as flanneld writes them, routes
//! and FDB entries on the peers, pods' traffic across, a Node deleted -> its routes go, annotations nobody should
//! trust refused, the watch riding out an API server restart. Every agent authenticates as a user with exactly
//! flannel's ClusterRole (kube-flannel.yml).

use std::net::SocketAddr;
use std::time::Duration;

use netns_tests::daemon::http_get;
use netns_tests::fabric::*;
use netns_tests::kubeapi::*;
use netns_tests::{json, Value};

const PREFIX: &str = "flannel.alpha.coreos.com";

/// A cluster of `cidrs.len()` nodes in Kubernetes mode on `config`: Node `node-<i>` with podCIDRs `cidrs[i]`,
/// each agent with `--kube-subnet-mgr`, flannel's credentials and `NODE_NAME`. None when kube-apiserver is not
/// built (outside CI).
fn kube_cluster(underlay: Cluster, config: &Value, cidrs: &[&[&str]], extra: &[&str]) -> Option<(Cluster, KubeApi)> {
    if !require_apiserver() {
        return None;
    }
    let mut cluster = underlay;
    let api = KubeApi::start(&cluster.infra, segment_ip(0, 254), &cluster.dir);
    let net_conf = cluster.dir.join("net-conf.json");
    std::fs::write(&net_conf, config.to_string()).unwrap();
    let kubeconfig = api.kubeconfig("flannel", FLANNEL_TOKEN);
    for (i, node_cidrs) in cidrs.iter().enumerate() {
        let name = format!("node-{i}");
        api.create_node(&cluster.infra, &name, node_cidrs);
        let mut args = vec![
            "--kube-subnet-mgr".to_string(),
            format!("--kubeconfig-file={}", kubeconfig.display()),
            format!("--net-config-path={}", net_conf.display()),
        ];
        args.extend(extra.iter().map(|a| a.to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let index = cluster.add_node(0, &args);
        cluster.nodes[index].env.push(("NODE_NAME".into(), name));
    }
    Some((cluster, api))
}

fn annotation(node: &Value, key: &str) -> String {
    node["metadata"]["annotations"][format!("{PREFIX}/{key}")].as_str().unwrap_or_default().to_string()
}

/// Three nodes on vxlan with the manifest's flags (`--ip-masq --kube-subnet-mgr --healthz-port=8081`): subnets are
/// the podCIDRs, each node's annotations are flanneld's byte for byte (read
/// back through the API), NetworkUnavailable is False, routes, neighbours and FDB entries reach every peer, pods
/// talk with their own addresses, /healthz and /readyz answer on --healthz-port, and a deleted Node's routes go
/// on every other node.
#[test]
fn kube_vxlan_annotations_routes_pods_and_a_deleted_node() {
    let cidrs: &[&[&str]] = &[&["10.244.0.0/24"], &["10.244.1.0/24"], &["10.244.2.0/24"]];
    let Some((mut cluster, api)) = kube_cluster(
        Cluster::new(1),
        &config(json!({ "Type": "vxlan" })),
        cidrs,
        &["--ip-masq", "--healthz-port=8081"],
    ) else {
        return;
    };
    let subnets = start_all(&mut cluster);
    let wanted: Vec<ipnet::IpNet> = cidrs.iter().map(|c| c[0].parse().unwrap()).collect();
    assert_eq!(subnets, wanted, "each node's subnet is its podCIDR");
    wait_routes(&cluster, 2);
    for (i, node) in cluster.nodes.iter().enumerate() {
        let object = api.node(&cluster.infra, &format!("node-{i}"));
        assert_eq!(annotation(&object, "backend-type"), "vxlan");
        assert_eq!(
            annotation(&object, "backend-data"),
            format!(r#"{{"VNI":1,"VtepMAC":"{}"}}"#, vtep_mac(node.ip.into())),
            "flanneld's bytes"
        );
        assert_eq!(annotation(&object, "public-ip"), node.ip.to_string());
        assert_eq!(annotation(&object, "kube-subnet-manager"), "true");
        assert!(object["metadata"]["annotations"].get(format!("{PREFIX}/backend-v6-data")).is_none());
        let unavailable = object["status"]["conditions"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["type"] == "NetworkUnavailable").cloned());
        let ready = wait_for(Duration::from_secs(5), || {
            let object = api.node(&cluster.infra, &format!("node-{i}"));
            let conditions = object["status"]["conditions"].as_array().cloned().unwrap_or_default();
            conditions
                .iter()
                .any(|c| c["type"] == "NetworkUnavailable" && c["status"] == "False" && c["reason"] == "FlannelIsUp")
        });
        assert!(ready.is_some(), "NetworkUnavailable not cleared: {unavailable:?}\n{}", node.log());
        let health = SocketAddr::from(([127, 0, 0, 1], 8081));
        assert_eq!(http_get(&node.node, health, "/healthz").unwrap(), "flanneld is running");
        assert_eq!(http_get(&node.node, health, "/readyz").unwrap(), "flanneld is ready");
    }
    // Each peer: an onlink route over flannel.1, a permanent neighbour and an FDB entry to its node.
    let first = &cluster.nodes[0];
    let routes = first.fabric_routes().join("\n");
    assert!(routes.contains("10.244.1.0/24 via 10.244.1.0 dev flannel.1 onlink"), "{routes}");
    let fdb = first.node.exec("bridge", &["fdb", "show", "dev", "flannel.1"], &[], b"");
    let fdb = String::from_utf8_lossy(&fdb.stdout);
    assert!(fdb.contains(&format!("{} dst {}", vtep_mac(cluster.nodes[2].ip.into()), cluster.nodes[2].ip)), "{fdb}");
    let pods = pods(&mut cluster);
    mesh(&cluster, &pods);

    api.delete_node(&cluster.infra, "node-2");
    for node in &cluster.nodes[..2] {
        let gone = wait_for(CONVERGE, || node.fabric_routes().len() == 1);
        assert!(gone.is_some(), "{}: {:?}\n{}", node.node.name, node.fabric_routes(), node.log());
        assert!(!node.fabric_routes().join(" ").contains("10.244.2.0/24"));
    }
}

/// Dual stack on host-gw: each Node has an IPv4 and an IPv6 podCIDR; routes of both families via the peers'
/// addresses, the IPv6 annotations as flanneld writes them, pods across in both families. The second node
/// finds its Node from its pod (`POD_NAME`, `POD_NAMESPACE`) with flannel's RBAC (`get` pods); the config's
/// `EnableNFTables` puts the masquerade in nftables.
#[test]
fn kube_dual_stack_host_gw() {
    let cidrs: &[&[&str]] = &[&["10.244.0.0/24", "fd00:10:244::/64"], &["10.244.1.0/24", "fd00:10:244:1::/64"]];
    // flannel's EnableNFTables: the masquerade in nftables (flannel's tables), with --ip-masq.
    let mut config = dual_config(json!({ "Type": "host-gw" }));
    config["EnableNFTables"] = json!(true);
    let Some((mut cluster, api)) = kube_cluster(Cluster::dual(1), &config, cidrs, &["--ip-masq"]) else {
        return;
    };
    // node-1 finds its Node as flannel's DaemonSet pod does: its pod's spec.nodeName.
    api.create_pod(&cluster.infra, "kube-flannel", "kube-flannel-ds-x7k2p", "node-1");
    cluster.nodes[1].env =
        vec![("POD_NAME".into(), "kube-flannel-ds-x7k2p".into()), ("POD_NAMESPACE".into(), "kube-flannel".into())];
    start_all(&mut cluster);
    wait_routes(&cluster, 1);
    wait_routes6(&cluster, 1);
    let routes6 = cluster.nodes[0].fabric_routes6().join("\n");
    let peer6 = cluster.nodes[1].ip6.unwrap();
    assert!(routes6.contains(&format!("fd00:10:244:1::/64 via {peer6}")), "{routes6}");
    let object = api.node(&cluster.infra, "node-1");
    assert_eq!(annotation(&object, "backend-data"), "null");
    assert_eq!(annotation(&object, "backend-v6-data"), "null");
    assert_eq!(annotation(&object, "public-ipv6"), peer6.to_string());
    assert_eq!(cluster.nodes[1].subnet6(), Some("fd00:10:244:1::/64".parse().unwrap()));
    let ruleset = cluster.nodes[0].node.exec("nft", &["list", "ruleset"], &[], b"");
    let ruleset = String::from_utf8_lossy(&ruleset.stdout);
    assert!(
        ruleset.contains("table ip flannel-ipv4 {") && ruleset.contains("table ip6 flannel-ipv6 {"),
        "EnableNFTables: flannel's tables\n{ruleset}\n{}",
        cluster.nodes[0].log()
    );
    let pods = pods_all(&mut cluster);
    mesh_all(&cluster, &pods, 2);
}

/// Annotations anyone with nodes/patch can write are checked before anything is routed: a Node claiming
/// another node's address, one inside the cluster's network, another node's VTEP MAC, a 200 KiB annotation (the API server takes up to 256 KiB of them), a
/// podCIDR overlapping another node's: each refused and logged once, no route to any; a good late Node is used.
#[test]
fn kube_bad_annotations_are_refused() {
    let cidrs: &[&[&str]] = &[&["10.244.0.0/24"], &["10.244.1.0/24"]];
    let Some((mut cluster, api)) = kube_cluster(Cluster::new(1), &config(json!({ "Type": "vxlan" })), cidrs, &[])
    else {
        return;
    };
    start_all(&mut cluster);
    wait_routes(&cluster, 1);
    let (ip0, ip1) = (cluster.nodes[0].ip, cluster.nodes[1].ip);
    let rogue = |name: &str, cidr: &str, ip: String, mac: String| {
        api.create_node(&cluster.infra, name, &[cidr]);
        api.annotate(
            &cluster.infra,
            name,
            &json!({
                format!("{PREFIX}/kube-subnet-manager"): "true",
                format!("{PREFIX}/backend-type"): "vxlan",
                format!("{PREFIX}/public-ip"): ip,
                format!("{PREFIX}/backend-data"): format!(r#"{{"VNI":1,"VtepMAC":"{mac}"}}"#),
            }),
        );
    };
    rogue("steals-address", "10.244.10.0/24", ip0.to_string(), "0e:fa:0a:0a:0a:0a".into());
    rogue("inside-network", "10.244.11.0/24", "10.244.1.5".into(), "0e:fa:0a:0a:0a:0b".into());
    rogue("steals-mac", "10.244.12.0/24", "192.168.50.77".into(), vtep_mac(ip1.into()));
    rogue("overlaps", "10.244.1.0/24", "192.168.50.78".into(), "0e:fa:0a:0a:0a:0c".into());
    rogue("huge", "10.244.13.0/24", "192.168.50.79".into(), "0e:fa:0a:0a:0a:0d".into());
    api.annotate(&cluster.infra, "huge", &json!({ format!("{PREFIX}/backend-data"): "x".repeat(200 * 1024) }));
    rogue("good", "10.244.14.0/24", "192.168.50.80".into(), "0e:fa:0a:0a:0a:0e".into());
    for node in &cluster.nodes {
        let good = wait_for(CONVERGE, || node.fabric_routes().len() == 2);
        assert!(good.is_some(), "{}: {:?}\n{}", node.node.name, node.fabric_routes(), node.log());
        let routes = node.fabric_routes().join("\n");
        assert!(routes.contains("10.244.14.0/24"), "the good late Node is used: {routes}");
        for refused in ["10.244.10.0/24", "10.244.11.0/24", "10.244.12.0/24", "10.244.13.0/24"] {
            assert!(!routes.contains(refused), "{refused} routed: {routes}");
        }
    }
    // Each refusal logged once, however many passes and events followed.
    std::thread::sleep(Duration::from_secs(1));
    let log = cluster.nodes[0].log();
    for (what, needle) in [
        ("overlap", "refusing Node \"overlaps\": its podCIDR 10.244.1.0/24 overlaps node-1's"),
        ("size", "refusing Node \"huge\": annotation flannel.alpha.coreos.com/backend-data is 204800 bytes"),
        ("address", "refusing the lease of 10.244.10.0/24"),
        ("inside", "refusing the lease of 10.244.11.0/24"),
        ("mac", "refusing the lease of 10.244.12.0/24"),
    ] {
        assert_eq!(log.matches(needle).count(), 1, "{what}: {needle:?} in\n{log}");
    }
}

/// The watch rides out what API servers do: kube-apiserver killed and started again (the data plane kept
/// meanwhile), then a Node added after the restart is routed; killed again while etcd moves on, so that the
/// agents' resourceVersion is too old (410 Gone): they list again, and a Node deleted then loses its routes;
/// a Node registered again with another podCIDR moves its node and its peers' routes; a node's own
/// annotations changed by someone else are written back; `fabricd status` works in this mode.
#[test]
fn kube_watch_survives_an_apiserver_restart() {
    let cidrs: &[&[&str]] = &[&["10.244.0.0/24"], &["10.244.1.0/24"]];
    let Some((mut cluster, mut api)) = kube_cluster(Cluster::new(1), &config(json!({ "Type": "vxlan" })), cidrs, &[])
    else {
        return;
    };
    start_all(&mut cluster);
    wait_routes(&cluster, 1);
    // `fabricd status` reads the same Nodes (the agent's flags, NODE_NAME).
    let status = cluster.nodes[0].run_subcommand("status", &[]);
    assert!(
        status.status.success()
            && status.stdout_text.contains("subnet 10.244.0.0/24")
            && status.stdout_text.contains("peers: 1 (0 refused)"),
        "{}{}",
        status.stdout_text,
        status.stderr
    );
    api.restart(&cluster.infra);
    for node in &cluster.nodes {
        assert_eq!(node.fabric_routes().len(), 1, "kept while the API server was away\n{}", node.log());
    }
    api.create_node(&cluster.infra, "late", &["10.244.5.0/24"]);
    api.annotate(
        &cluster.infra,
        "late",
        &json!({
            format!("{PREFIX}/kube-subnet-manager"): "true",
            format!("{PREFIX}/backend-type"): "vxlan",
            format!("{PREFIX}/public-ip"): "192.168.50.90",
            format!("{PREFIX}/backend-data"): r#"{"VNI":1,"VtepMAC":"0e:fa:c0:a8:32:5a"}"#,
        }),
    );
    for node in &cluster.nodes {
        let seen = wait_for(Duration::from_secs(20), || node.fabric_routes().len() == 2);
        assert!(seen.is_some(), "{}: {:?}\n{}", node.node.name, node.fabric_routes(), node.log());
    }
    // Again, with etcd written meanwhile: the watch's resourceVersion is too old for the new server (410 Gone),
    // and the agents list again; a Node deleted meanwhile... cannot be (the API is down), so one is deleted
    // right after and its routes go.
    let infra = &cluster.infra;
    api.restart_with(infra, |etcd| {
        for i in 0..3 {
            assert!(etcd.ctl_in(infra, &["put", &format!("/unrelated/{i}"), "x"]).status.success());
        }
    });
    api.delete_node(&cluster.infra, "late");
    for node in &cluster.nodes {
        let gone = wait_for(Duration::from_secs(20), || node.fabric_routes().len() == 1);
        assert!(gone.is_some(), "{}: {:?}\n{}", node.node.name, node.fabric_routes(), node.log());
        let restarts = metric(&node.metrics(), "fabricd_watch_restarts_total");
        assert_eq!(restarts, Some(2.0), "the first list, and the list after 410 Gone\n{}", node.log());
        assert!(node.log().contains("listing every Node again"), "{}", node.log());
    }
    // A Node's podCIDR cannot be edited; a Node deleted and registered again can get another one: its agent
    // moves to it (subnet.env, annotations written again) and its peers route the new subnet.
    api.delete_node(&cluster.infra, "node-1");
    api.create_node(&cluster.infra, "node-1", &["10.244.7.0/24"]);
    let moved = wait_for(Duration::from_secs(10), || {
        cluster.nodes[1].subnet() == Some("10.244.7.0/24".parse().unwrap())
            && cluster.nodes[0].fabric_routes().iter().any(|r| r.starts_with("10.244.7.0/24 "))
            && cluster.nodes[0].fabric_routes().len() == 1
    });
    assert!(
        moved.is_some(),
        "{:?}\n{}\n{}",
        cluster.nodes[0].fabric_routes(),
        cluster.nodes[0].log(),
        cluster.nodes[1].log()
    );
    api.annotate(&cluster.infra, "node-1", &json!({ format!("{PREFIX}/public-ip"): "192.168.50.66" }));
    let back = wait_for(CONVERGE, || {
        annotation(&api.node(&cluster.infra, "node-1"), "public-ip") == cluster.nodes[1].ip.to_string()
    });
    assert!(back.is_some(), "own annotation not written back\n{}", cluster.nodes[1].log());
}

/// In-cluster credentials, as a DaemonSet pod has them: no --kubeconfig-file, the service account's token and
/// CA (and namespace) at /var/run/secrets/kubernetes.io/serviceaccount (a tmpfs over /run in the agent's own mount namespace,
/// nothing of the host's changed) and KUBERNETES_SERVICE_HOST/PORT; plus FLANNELD_ variables for flags, and
/// a node's `node-public-ip` annotation taken as its --public-ip.
#[test]
fn kube_in_cluster_credentials_and_flanneld_variables() {
    let cidrs: &[&[&str]] = &[&["10.244.0.0/24"], &["10.244.1.0/24"]];
    let Some((mut cluster, api)) = kube_cluster(Cluster::new(1), &config(json!({ "Type": "host-gw" })), cidrs, &[])
    else {
        return;
    };
    // node-0's address for other nodes from its node-public-ip annotation, as flanneld reads it at start.
    cluster.nodes[0].node.ip(&["addr", "add", "192.168.50.110/24", "dev", "eth0"]);
    api.annotate(&cluster.infra, "node-0", &json!({ format!("{PREFIX}/node-public-ip"): "192.168.50.110" }));
    cluster.nodes[0].start();
    let node = &mut cluster.nodes[1];
    let secrets = node.node.dir().join("serviceaccount");
    std::fs::create_dir_all(&secrets).unwrap();
    std::fs::write(secrets.join("token"), FLANNEL_TOKEN).unwrap();
    std::fs::write(secrets.join("namespace"), "kube-flannel").unwrap();
    std::fs::copy(api.dir.join("ca.crt"), secrets.join("ca.crt")).unwrap();
    let net_conf = node.args.iter().find(|a| a.starts_with("--net-config-path=")).unwrap().clone();
    let script = "mount -t tmpfs tmpfs /run && mkdir -p /run/secrets/kubernetes.io/serviceaccount && \
                  cp \"$SECRETS\"/* /run/secrets/kubernetes.io/serviceaccount/ && exec \"$@\"";
    let log = std::fs::OpenOptions::new().create(true).append(true).open(node.log_path()).unwrap();
    let mut command = netns_tests::upstream::clean_command(&node.node, "unshare");
    command
        .args(["--mount", "--propagation", "private", "sh", "-c", script, "sh"])
        .arg(netns_tests::bin("fabricd"))
        .arg(format!("--subnet-file={}", node.subnet_file().display()))
        .arg(format!("--cni-conf-dir={}", node.conf_dir().display()))
        .arg(&net_conf)
        .env("SECRETS", &secrets)
        .env("NODE_NAME", "node-1")
        .env("KUBERNETES_SERVICE_HOST", segment_ip(0, 254).to_string())
        .env("KUBERNETES_SERVICE_PORT", PORT.to_string())
        .env("FLANNELD_KUBE_SUBNET_MGR", "true")
        .env("FLANNELD_HEALTHZ_PORT", "8082")
        .env("EVENT_QUEUE_DEPTH", "10000")
        .env("CONT_WHEN_CACHE_NOT_READY", "true")
        .stdout(std::process::Stdio::null())
        .stderr(log);
    node.agent = Some(netns_tests::Daemon::spawn(&mut command));
    for node in &cluster.nodes {
        node.wait_ready(READY);
    }
    wait_routes(&cluster, 1);
    let object = api.node(&cluster.infra, "node-1");
    assert_eq!(annotation(&object, "backend-type"), "host-gw", "annotated with the service account's token");
    assert_eq!(annotation(&api.node(&cluster.infra, "node-0"), "public-ip"), "192.168.50.110");
    let routes = cluster.nodes[1].fabric_routes().join("\n");
    assert!(routes.contains("10.244.0.0/24 via 192.168.50.110"), "{routes}");
    let health = SocketAddr::from(([127, 0, 0, 1], 8082));
    assert_eq!(http_get(&cluster.nodes[1].node, health, "/readyz").unwrap(), "flanneld is ready");
    let log = cluster.nodes[1].log();
    assert!(log.contains("EVENT_QUEUE_DEPTH=10000: fabricd keeps no queue"), "{log}");
    assert!(log.contains("CONT_WHEN_CACHE_NOT_READY=true: fabricd never exits"), "{log}");
}

/// flannel's `alloc` backend: each node gets its podCIDR as subnet.env and conflist (the underlay's MTU: no
/// tunnel) and its annotations; no device, no route: someone else routes the pod network.
#[test]
fn kube_alloc_allocates_and_routes_nothing() {
    let cidrs: &[&[&str]] = &[&["10.244.0.0/24"], &["10.244.1.0/24"]];
    let Some((mut cluster, api)) = kube_cluster(Cluster::new(1), &config(json!({ "Type": "alloc" })), cidrs, &[])
    else {
        return;
    };
    let subnets = start_all(&mut cluster);
    assert_eq!(subnets, ["10.244.0.0/24".parse().unwrap(), "10.244.1.0/24".parse::<ipnet::IpNet>().unwrap()]);
    for (index, node) in cluster.nodes.iter().enumerate() {
        let env = std::fs::read_to_string(node.subnet_file()).unwrap();
        assert!(
            env.contains(&format!("FLANNEL_SUBNET=10.244.{index}.1/24\n")) && env.contains("FLANNEL_MTU=1500\n"),
            "{env}"
        );
        assert!(node.fabric_routes().is_empty(), "no route: {:?}", node.fabric_routes());
        let links = node.node.ip(&["-o", "link", "show"]);
        assert!(!links.contains("flannel"), "no device: {links}");
        let object = api.node(&cluster.infra, &format!("node-{index}"));
        assert_eq!(annotation(&object, "backend-type"), "alloc");
    }
    let status = cluster.nodes[0].run(&["status"]);
    assert!(status.stdout_text.contains("not routed by fabricd (backend alloc)"), "{}", status.stdout_text);
}
