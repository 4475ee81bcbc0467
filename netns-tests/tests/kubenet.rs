//! Kubenet across nodes (issue 17): pods reach pods on other nodes without NAT, and only traffic leaving the
//! cluster is masqueraded.
//!
//! The cluster of each test: an "infra" namespace holding the underlay (a bridge), two node namespaces on it
//! (node A 192.168.80.1 / fd00:80::1, node B .2 / ::2) with a static route to each other's pod subnet (what
//! a cloud's route table does for kubenet), and a "wan" namespace on the underlay (.100 / ::100) that knows
//! no route to any pod subnet. Each node has a conflist of `conf/` installed, run by our cnitool: node A as
//! shipped (pod subnet 10.244.1.0/24, fd00:10:244:1::/64), node B with the subnets 10.244.2.0/24 and
//! fd00:10:244:2::/64; both keep `nonMasqueradeCIDRs`, the cluster CIDR (10.244.0.0/16, fd00:10:244::/56).
//!
//! For each conflist (iptables and nftables, IPv4 and IPv6): a pod on node A reaches a pod on node B and B
//! sees A's own address; the same pod reaches the wan masqueraded to node A's address; pod B's hostPort
//! answers from the wan and from node A; CHECK passes, and fails when an exception is missing or the config
//! has other exceptions; after DEL nothing of either pod is left on either node (see `netns_tests::kubenet`).

use netns_tests::kubenet;

use std::net::{IpAddr, SocketAddr};

use kubenet::{cap_args, result_ips, second_node, Kubenet, SUBNET_V4, SUBNET_V4_B, SUBNET_V6, SUBNET_V6_B};
use netns_tests::traffic::{tcp_ask, TcpServer};
use netns_tests::{ip, json, veth_between, TestNetns, Value};

const KUBENET: &str = "10-kubenet.conflist";
const KUBENET_DUALSTACK: &str = "20-kubenet-dualstack.conflist";
const KUBENET_NFT: &str = "30-kubenet-nftables.conflist";
/// The underlay addresses of node A, node B and the wan.
const NODE_A: [&str; 2] = ["192.168.80.1", "fd00:80::1"];
const NODE_B: [&str; 2] = ["192.168.80.2", "fd00:80::2"];
const WAN: [&str; 2] = ["192.168.80.100", "fd00:80::100"];
/// The pods' TCP server port, pod B's host port, the wan's server port.
const POD_PORT: u16 = 80;
const HOST_PORT_B: u16 = 8080;
const WAN_PORT: u16 = 9000;

fn at(addr: IpAddr, port: u16) -> SocketAddr {
    SocketAddr::new(addr, port)
}

/// Two kubenet nodes and a wan on one underlay.
struct Cluster {
    a: Kubenet,
    b: Kubenet,
    wan: TestNetns,
    _infra: TestNetns,
}

impl Cluster {
    /// The cluster with `conf/<file>` (changed by `tweak` on both nodes) installed on both nodes.
    fn new(file: &str, tweak: impl Fn(&mut Value)) -> Cluster {
        let a = Kubenet::new(file, &tweak);
        let b = Kubenet::new(file, |conf| {
            tweak(conf);
            second_node(conf);
        });
        let (infra, wan) = (TestNetns::new("infra"), TestNetns::new("wan"));
        infra.ip(&["link", "add", "u0", "type", "bridge"]);
        infra.ip(&["link", "set", "u0", "up"]);
        for (ns, port, addrs) in [(&*a.node, "u-a", NODE_A), (&*b.node, "u-b", NODE_B), (&wan, "u-wan", WAN)] {
            let addrs = [format!("{}/24", addrs[0]).parse().unwrap(), format!("{}/64", addrs[1]).parse().unwrap()];
            veth_between(ns, &infra, "eth0", port, &addrs, &[]);
            infra.ip(&["link", "set", port, "master", "u0"]);
        }
        // The cloud's routes: each node's pod subnets via that node. The nodes route (as the bridge would make
        // them do anyway; switched on first so that its side effects, e.g. the uplink's IPv6 subnet-router
        // anycast routes, are part of the node before the first ADD).
        for (node, subnets, via) in [(&a, [SUBNET_V4_B, SUBNET_V6_B], NODE_B), (&b, [SUBNET_V4, SUBNET_V6], NODE_A)] {
            node.node.ip(&["route", "add", subnets[0], "via", via[0]]);
            node.node.ip(&["-6", "route", "add", subnets[1], "via", via[1]]);
            for sysctl in ["net/ipv4/ip_forward", "net/ipv6/conf/all/forwarding"] {
                node.node.run(|| cnicore::sysctl::write(sysctl, "1")).unwrap_or_else(|e| panic!("{sysctl}: {e}"));
            }
        }
        Cluster { a, b, wan, _infra: infra }
    }
}

/// The conflist as shipped sets `nonMasqueradeCIDRs` to the cluster CIDR of each of its families.
fn assert_ships_the_cluster_cidr(file: &str) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../conf").join(file);
    let conf: Value = serde_json::from_slice(&std::fs::read(&path).expect("read conflist")).expect("json");
    let cidrs = &conf["plugins"][0]["nonMasqueradeCIDRs"];
    let dual = file == KUBENET_DUALSTACK;
    let want = if dual { json!(["10.244.0.0/16", "fd00:10:244::/56"]) } else { json!(["10.244.0.0/16"]) };
    assert_eq!(cidrs, &want, "{file}");
}

/// Changes every conflist to the nftables backends (ipMasq and portmap).
fn nftables(conf: &mut Value) {
    conf["plugins"][0]["ipMasqBackend"] = json!("nftables");
    conf["plugins"][1]["backend"] = json!("nftables");
}

/// Removes the exception of pod `pod_ip` to the cluster CIDR behind CHECK's back: the iptables ACCEPT rule
/// in the pod's chain, or its entry in the nftables exception map.
fn remove_exception(k: &Kubenet, pod_ip: IpAddr, nft: bool) {
    if nft {
        let map = if pod_ip.is_ipv4() { "nomasq4" } else { "nomasq6" };
        let out =
            k.node.exec("nft", &["delete", "element", "inet", "cni_ipmasq", map, &format!("{{ {pod_ip} }}")], &[], b"");
        assert!(out.status.success(), "nft delete element: {}", String::from_utf8_lossy(&out.stderr));
        return;
    }
    let (save, tables) = if pod_ip.is_ipv4() { ("iptables-save", "iptables") } else { ("ip6tables-save", "ip6tables") };
    let cluster = if pod_ip.is_ipv4() { "-d 10.244.0.0/16 " } else { "-d fd00:10:244::/56 " };
    let saved = String::from_utf8_lossy(&k.node.exec(save, &["-t", "nat"], &[], b"").stdout).into_owned();
    let line = saved
        .lines()
        .find(|l| l.starts_with("-A CNI-") && l.contains(cluster) && l.ends_with("-j ACCEPT"))
        .unwrap_or_else(|| panic!("no exception rule for {pod_ip}:\n{saved}"));
    // The saved rule, as arguments of `iptables -t nat -D` (the comment is the only quoted part).
    let (before, rest) = line.strip_prefix("-A ").expect("rule").split_once("--comment \"").expect("comment");
    let (comment, after) = rest.rsplit_once('"').expect("comment end");
    let mut args: Vec<String> = vec!["-t".into(), "nat".into(), "-D".into()];
    args.extend(before.split_whitespace().map(String::from));
    args.extend(["--comment".to_string(), comment.replace("\\\"", "\"")]);
    args.extend(after.split_whitespace().map(String::from));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = k.node.exec(tables, &args, &[], b"");
    assert!(out.status.success(), "{tables} {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// The whole scenario of the module doc for one conflist.
fn across_nodes(file: &str, nft: bool) {
    assert_ships_the_cluster_cidr(file);
    let cluster = Cluster::new(file, |conf| {
        if nft && file != KUBENET_NFT {
            nftables(conf)
        }
    });
    let (a, b, wan) = (&cluster.a, &cluster.b, &cluster.wan);
    let (before_a, before_b) = (a.snapshot(), b.snapshot());
    let (pod_a, pod_b) = (a.node.pod_netns(), b.node.pod_netns());
    let ips_a = result_ips(&a.add(&pod_a, &cap_args(8081)));
    let ips_b = result_ips(&b.add(&pod_b, &cap_args(HOST_PORT_B)));
    let dual = file == KUBENET_DUALSTACK;
    assert_eq!(ips_a.len(), if dual { 2 } else { 1 }, "{ips_a:?}");
    let _pod_server = TcpServer::echo_source(&pod_b, POD_PORT);
    let _wan_server = TcpServer::echo_source(wan, WAN_PORT);

    for (family, (&pod_a_ip, &pod_b_ip)) in ips_a.iter().zip(&ips_b).enumerate() {
        let what = format!("{file} nft={nft} {pod_a_ip}");
        // Pod to pod across nodes: no NAT, B sees A's own address.
        let seen = tcp_ask(&pod_a, at(pod_b_ip, POD_PORT));
        assert_eq!(seen, Some(pod_a_ip.to_string()), "{what}: pod B saw pod A as");
        // Pod to the wan, outside the cluster: masqueraded to node A's underlay address.
        let seen = tcp_ask(&pod_a, at(ip(WAN[family]), WAN_PORT));
        assert_eq!(seen, Some(NODE_A[family].to_string()), "{what}: the wan saw pod A as");
        // Pod B's hostPort on node B, from the wan and from node A: DNAT only, the client's address kept.
        let seen = tcp_ask(wan, at(ip(NODE_B[family]), HOST_PORT_B));
        assert_eq!(seen, Some(WAN[family].to_string()), "{what}: hostPort from the wan");
        let seen = tcp_ask(&a.node, at(ip(NODE_B[family]), HOST_PORT_B));
        assert_eq!(seen, Some(NODE_A[family].to_string()), "{what}: hostPort from node A");
    }

    // CHECK passes as added; fails with other exceptions in the config, and with one removed from the node.
    let check = |k: &Kubenet, pod: &TestNetns, cap: u16| k.cnitool("check", pod, &cap_args(cap), None);
    let out = check(a, &pod_a, 8081);
    assert!(out.success(), "{file} nft={nft}: CHECK failed: {}{}", out.stdout_text, out.stderr);
    let installed = a.conflist();
    a.rewrite(|conf| conf["plugins"][0]["nonMasqueradeCIDRs"] = json!(["10.0.0.0/8"]));
    let out = check(a, &pod_a, 8081);
    assert!(!out.success(), "{file} nft={nft}: CHECK passed with other nonMasqueradeCIDRs");
    assert!(out.stderr.contains("ipMasq of container"), "{file} nft={nft}: {}{}", out.stdout_text, out.stderr);
    a.rewrite(|conf| *conf = installed);
    assert!(check(a, &pod_a, 8081).success(), "{file} nft={nft}: CHECK failed after the config came back");
    remove_exception(b, ips_b[0], nft);
    let out = check(b, &pod_b, HOST_PORT_B);
    assert!(!out.success(), "{file} nft={nft}: CHECK passed without the exception");
    assert!(out.stderr.contains("ipMasq of container"), "{file} nft={nft}: {}{}", out.stdout_text, out.stderr);

    // DEL (node B's after its exception was tampered with) leaves nothing of either pod.
    a.del(&pod_a, &cap_args(8081));
    b.del(&pod_b, &cap_args(HOST_PORT_B));
    a.assert_no_residue(&before_a, &a.snapshot(), &format!("{file} nft={nft} node A after DEL"));
    b.assert_no_residue(&before_b, &b.snapshot(), &format!("{file} nft={nft} node B after DEL"));
}

#[test]
fn across_nodes_iptables_v4() {
    across_nodes(KUBENET, false);
}

#[test]
fn across_nodes_iptables_dual_stack() {
    across_nodes(KUBENET_DUALSTACK, false);
}

#[test]
fn across_nodes_nftables_v4() {
    across_nodes(KUBENET_NFT, true);
}

#[test]
fn across_nodes_nftables_dual_stack() {
    across_nodes(KUBENET_DUALSTACK, true);
}

/// GC removes the masquerade of a pod that is no longer valid, exceptions included, in both backends.
#[test]
fn gc_removes_the_exceptions() {
    for nft in [false, true] {
        let k = Kubenet::new(KUBENET_DUALSTACK, |conf| {
            if nft {
                nftables(conf)
            }
        });
        let pod = k.node.pod_netns();
        let ips = result_ips(&k.add(&pod, &json!({})));
        let out = k.gc(&[]);
        assert!(out.success(), "nft={nft}: gc failed: {}{}", out.stdout_text, out.stderr);
        let firewall = k.snapshot();
        for section in ["iptables", "ip6tables", "nftables"] {
            let left: Vec<&String> = firewall
                .section(section)
                .iter()
                .filter(|l| {
                    l.contains("CNI-") || l.contains("elements") || ips.iter().any(|ip| l.contains(&ip.to_string()))
                })
                .collect();
            assert!(left.is_empty(), "nft={nft}: left in {section} after GC: {left:?}");
        }
    }
}
