//! The path an operator walks with fabricd: the flags after the subcommand, one conflist by the name the node
//! uses (flannel's, on a node that had it), `/metrics` (parsed as Prometheus does), `/healthz` and `/readyz`, a
//! metrics address in use refused at start, etcd lost and found again in the log,
//! `cleanup` (the bridge's gateway address removed, ip_forward put back, the empty nat table the masquerade made removed) and a rejoin whose first pod works.

use std::net::SocketAddr;

use netns_tests::daemon::{http_get, sample, scrape};
use netns_tests::fabric::*;
use netns_tests::json;
use nix::sys::signal::Signal;

#[test]
fn the_operators_path_from_join_to_cleanup_and_rejoin() {
    let mut cluster = Cluster::new(1);
    cluster.start_etcd(&config(json!({ "Type": "vxlan" })), None);
    cluster.add_node(0, &["--ip-masq"]);
    cluster.add_node(0, &[]);
    // Node 1 ran flannel's plugin: its conflist is replaced by fabricd's under that name, not joined by a second.
    let flannel = cluster.nodes[1].conf_dir().join("10-flannel.conflist");
    std::fs::create_dir_all(flannel.parent().unwrap()).unwrap();
    let flannels = json!({ "name": "cbr0", "cniVersion": "0.3.1",
        "plugins": [{ "type": "flannel", "delegate": { "hairpinMode": true, "isDefaultGateway": true } }] });
    std::fs::write(&flannel, flannels.to_string()).unwrap();
    let forwarding = |node: &FabricNode| node.node.run(|| cnicore::sysctl::read("net/ipv4/ip_forward")).unwrap();
    assert_eq!(forwarding(&cluster.nodes[0]), "0", "a new namespace forwards nothing");
    cluster.nodes[0].start();
    cluster.nodes[1].start();
    let subnet0 = cluster.nodes[0].wait_ready(READY);
    let node1 = &cluster.nodes[1];
    let written = wait_for(READY, || std::fs::read_to_string(&flannel).is_ok_and(|t| t.contains("host-local")));
    assert!(written.is_some(), "{}", node1.log());
    let names: Vec<String> = std::fs::read_dir(node1.conf_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, vec!["10-flannel.conflist".to_string()], "one conflist");
    wait_routes(&cluster, 1);
    let mut pods = pods(&mut cluster);
    mesh(&cluster, &pods);

    // The masquerade (iptables-nft) made node 0's `table ip nat`.
    let tables = |node: &FabricNode| {
        String::from_utf8_lossy(&node.node.exec("nft", &["list", "tables"], &[], b"").stdout).into_owned()
    };
    let iptables_nft =
        String::from_utf8_lossy(&std::process::Command::new("iptables").arg("-V").output().unwrap().stdout)
            .contains("nf_tables");
    if iptables_nft {
        let made = wait_for(CONVERGE, || tables(&cluster.nodes[0]).contains("table ip nat"));
        assert!(made.is_some(), "{}", tables(&cluster.nodes[0]));
    }

    // The flags after the subcommand.
    let node0 = &cluster.nodes[0];
    let status = node0.run_subcommand("status", &[]);
    assert!(status.success(), "{} {}", status.stdout_text, status.stderr);
    assert!(status.stdout_text.contains(&format!("subnet {subnet0}")), "{}", status.stdout_text);

    // /metrics and /healthz answer 200, any other path 404.
    let address: SocketAddr = netns_tests::fabric::METRICS_ADDR.parse().unwrap();
    assert!(http_get(&node0.node, address, "/metrics").unwrap().contains("fabricd_ready 1"));
    assert_eq!(http_get(&node0.node, address, "/healthz").unwrap(), "ok\n");
    let other = http_get(&node0.node, address, "/").unwrap_err();
    assert!(other.contains("404"), "{other}");
    assert_eq!(http_get(&node0.node, address, "/readyz").unwrap(), "flanneld is ready");
    // /metrics in the Prometheus text format: passes made and timed, the peer by backend and its route.
    let scrape = scrape(&node0.node, address);
    let value = |name: &str, labels: &[(&str, &str)]| sample(&scrape, name, labels).unwrap_or(-1.0);
    let passes = value("fabricd_reconciles_total", &[]);
    assert!(passes >= 1.0 && value("fabricd_reconcile_duration_seconds_count", &[]) == passes, "{scrape:?}");
    assert_eq!(value("fabricd_backend_peers", &[("backend", "vxlan"), ("family", "ipv4")]), 1.0);
    assert_eq!(value("fabricd_routes", &[("backend", "vxlan"), ("family", "ipv4"), ("path", "overlay")]), 1.0);
    assert_eq!(value("fabricd_peers", &[]), 1.0);
    // An address in use: a second agent stops at start and says why (nothing read, nothing changed).
    let second = node0.run(&["--static-config=/nonexistent", "--metrics-addr=127.0.0.1:9799"]);
    assert!(!second.success(), "{}", second.stderr);
    let said = "--metrics-addr 127.0.0.1:9799: cannot listen: Address already in use";
    assert!(second.stderr.contains(said), "{}", second.stderr);

    // etcd lost and found again: both logged.
    cluster.etcd.as_mut().unwrap().kill();
    std::thread::sleep(std::time::Duration::from_secs(2));
    let Cluster { etcd, infra, .. } = &mut cluster;
    etcd.as_mut().unwrap().restart(infra);
    let node0 = &cluster.nodes[0];
    let found = wait_for(std::time::Duration::from_secs(10), || node0.log().contains("is reachable again"));
    assert!(found.is_some(), "{}", node0.log());

    // Node 0 leaves with cleanup (flags after the subcommand), its pod gone; it rejoins, maybe on another
    // subnet, and its first pod works.
    drop(pods.remove(0));
    let node0 = &mut cluster.nodes[0];
    node0.stop(Signal::SIGTERM);
    let gateway = |node: &FabricNode| -> Vec<ipnet::IpNet> {
        let text = node.node.ip(&["-4", "-o", "address", "show", "dev", "cbr0"]);
        let words: Vec<&str> = text.split_whitespace().collect();
        words.windows(2).filter(|w| w[0] == "inet").filter_map(|w| w[1].parse().ok()).collect()
    };
    assert!(gateway(node0).iter().any(|a| subnet0.contains(&a.addr())), "{:?}", gateway(node0));
    let cleanup = node0.run_subcommand("cleanup", &[]);
    assert!(cleanup.success(), "{}", cleanup.stderr);
    assert!(!gateway(node0).iter().any(|a| subnet0.contains(&a.addr())), "left: {:?}", gateway(node0));
    assert_eq!(forwarding(node0), "0", "ip_forward not put back:\n{}", cleanup.stderr);
    assert!(
        !tables(node0).contains("table ip nat"),
        "the empty nat table left:\n{}\n{}",
        tables(node0),
        cleanup.stderr
    );
    node0.start();
    let rejoined = node0.wait_ready(READY);
    let (pod, ip) = node0.add_pod();
    assert!(rejoined.contains(&ip), "{ip} not of {rejoined}");
    pods.insert(0, (0, pod, ip));
    wait_routes(&cluster, 1);
    mesh(&cluster, &pods);
}
