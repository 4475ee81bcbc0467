//! The netns, netlink and sysctl layer of cnicore against the real kernel, in namespaces made per test.

use std::net::IpAddr;
use std::os::unix::fs::MetadataExt;
use std::time::{Duration, Instant};

use cnicore::netlink::{is_exists, is_not_found, AddressOptions, IpFamily, Netlink, Route, Scope, RT_TABLE_MAIN};
use cnicore::netns::NetNs;
use cnicore::sysctl;
use ipnet::IpNet;
use netns_tests::{assert_ping, links_in, unique_name, veth_between, Node, TestNetns, Value};

fn net(text: &str) -> IpNet {
    text.parse().expect("test address")
}

fn ip(text: &str) -> IpAddr {
    text.parse().expect("test address")
}

/// Inode of the calling thread's network namespace.
fn current_netns_inode() -> u64 {
    std::fs::metadata("/proc/thread-self/ns/net").expect("own netns").ino()
}

#[test]
fn unique_names_differ_and_stay_short() {
    let a = unique_name("br");
    let b = unique_name("br");
    assert_ne!(a, b);
    assert!(a.len() <= 15, "{a} too long for an interface name");
}

#[test]
fn test_netns_is_deleted_on_drop_and_has_lo_up() {
    let path;
    {
        let ns = TestNetns::new("drop");
        path = ns.path.clone();
        assert!(path.exists());
        assert_eq!(links_in(&ns), vec!["lo".to_string()]);
        let lo = ns.netlink().require_link("lo").expect("lo");
        assert!(lo.up && lo.loopback && lo.oper_up);
        // Commands run inside the namespace.
        let links = ns.ip_json(&["link", "show"]);
        assert_eq!(links.as_array().map(Vec::len), Some(1));
    }
    assert!(!path.exists(), "{} left behind", path.display());
}

#[test]
fn run_returns_to_the_original_namespace_even_on_error_or_panic() {
    let ns = TestNetns::new("run");
    let netns = NetNs::open(&ns.path).expect("open");
    assert!(NetNs::open("/proc/self/status").is_err(), "a non-namespace file must be refused");
    let original = current_netns_inode();

    let inside = netns.run(current_netns_inode).expect("enter");
    assert_ne!(inside, original);
    assert_eq!(current_netns_inode(), original);

    let result: Result<(), String> = netns.run(|| Err("failed inside".to_string())).expect("enter");
    assert!(result.is_err());
    assert_eq!(current_netns_inode(), original);

    let panicked = std::panic::catch_unwind(|| netns.run(|| panic!("inside")));
    assert!(panicked.is_err());
    assert_eq!(current_netns_inode(), original);

    // A socket made in the namespace stays there after the thread is back.
    let mut netlink = Netlink::in_netns(&netns).expect("netlink");
    let names: Vec<String> = netlink.links().expect("links").into_iter().map(|l| l.name).collect();
    assert_eq!(names, vec!["lo".to_string()]);
}

#[test]
fn bridge_veth_addresses_routes_and_cleanup() {
    let node = Node::new();
    let pod = node.pod_netns();
    let mut host = node.netlink();
    let mut inpod = pod.netlink();

    let bridge = host.create_bridge("cni0", Some(1400)).expect("bridge");
    assert_eq!(bridge.kind.as_deref(), Some("bridge"));
    assert_eq!(bridge.mtu, 1400);
    let again = host.create_bridge("cni0", None).expect_err("second bridge");
    assert!(is_exists(&again), "{again}");

    let pod_mac = [0x0a, 0x58, 0x0a, 0x16, 0x00, 0x02];
    let veth = host.create_veth("veth1", "eth0", &pod.netns(), Some(1400), Some(pod_mac)).expect("veth");
    assert_eq!(veth.kind.as_deref(), Some("veth"));
    assert!(!host.links().expect("links").iter().any(|l| l.name == "eth0"), "peer must not be in the node");
    let eth0 = inpod.require_link("eth0").expect("peer in pod");
    assert_eq!(eth0.mac, Some(pod_mac));
    assert_eq!(eth0.mtu, 1400);
    assert_eq!(veth.peer_index, Some(eth0.index));

    host.set_master(veth.index, bridge.index).expect("master");
    host.set_hairpin(veth.index, true).expect("hairpin");
    host.set_up(bridge.index).expect("bridge up");
    host.set_up(veth.index).expect("veth up");
    inpod.set_up(eth0.index).expect("eth0 up");
    host.wait_oper_up(veth.index, Duration::from_secs(5)).expect("veth oper up");

    let veth = host.link_by_index(veth.index).expect("get").expect("veth exists");
    assert_eq!(veth.master, Some(bridge.index));
    assert!(veth.up && veth.oper_up);
    assert_eq!(veth.bridge_port.map(|p| p.hairpin), Some(true));
    let details = node.ip_json(&["-d", "link", "show", "veth1"]);
    assert_eq!(details[0]["master"], "cni0");
    assert_eq!(details[0]["linkinfo"]["info_slave_data"]["hairpin"], true);

    host.set_port_isolated(veth.index, true).expect("isolated");
    let details = node.ip_json(&["-d", "link", "show", "veth1"]);
    assert_eq!(details[0]["linkinfo"]["info_slave_data"]["isolated"], true);

    host.set_promisc(bridge.index, true).expect("promisc");
    assert!(host.link_by_name("cni0").expect("get").is_some_and(|l| l.promisc));
    host.set_promisc(bridge.index, false).expect("promisc off");
    let bridge_mac = [0x0a, 0x58, 0x0a, 0x16, 0x00, 0x01];
    host.set_mac(bridge.index, bridge_mac).expect("mac");
    host.set_mtu(bridge.index, 1300).expect("mtu");
    let bridge = host.link_by_index(bridge.index).expect("get").expect("bridge exists");
    assert_eq!((bridge.mac, bridge.mtu, bridge.promisc), (Some(bridge_mac), 1300, false));

    // Addresses, with their prefix lengths; duplicates are EEXIST.
    host.add_address(bridge.index, net("10.22.0.1/24")).expect("bridge address");
    inpod.add_address(eth0.index, net("10.22.0.2/24")).expect("pod address");
    let v6 = AddressOptions { nodad: true, ..AddressOptions::default() };
    inpod.add_address_with(eth0.index, net("fd00:22::2/64"), v6).expect("pod v6 address");
    let duplicate = inpod.add_address(eth0.index, net("10.22.0.2/24")).expect_err("duplicate");
    assert!(is_exists(&duplicate), "{duplicate}");
    let addresses = inpod.addresses(Some(eth0.index)).expect("addresses");
    let global: Vec<IpNet> = addresses.iter().filter(|a| a.scope == Scope::Universe).map(|a| a.addr).collect();
    assert!(global.contains(&net("10.22.0.2/24")) && global.contains(&net("fd00:22::2/64")), "{addresses:?}");
    let nodad = addresses.iter().find(|a| a.addr == net("fd00:22::2/64")).expect("v6 address");
    assert!(!nodad.is_tentative() && !nodad.is_dad_failed(), "nodad address tentative: {nodad:?}");
    let shown = pod.ip_json(&["addr", "show", "eth0"]);
    let shown: Vec<String> = shown[0]["addr_info"]
        .as_array()
        .expect("addr_info")
        .iter()
        .map(|a| format!("{}/{}", a["local"].as_str().unwrap_or(""), a["prefixlen"]))
        .collect();
    assert!(shown.contains(&"10.22.0.2/24".to_string()), "{shown:?}");
    assert_eq!(host.addresses(None).expect("all").iter().filter(|a| a.addr == net("10.22.0.1/24")).count(), 1);

    // Routes: a default via the bridge, one with metrics and a metric, and a link-scope one.
    let default = Route { dst: net("0.0.0.0/0"), gateway: Some(ip("10.22.0.1")), ..Route::default() };
    inpod.add_route(&default).expect("default route");
    let with_metrics = Route {
        dst: net("10.99.0.0/16"),
        gateway: Some(ip("10.22.0.1")),
        oif: Some(eth0.index),
        priority: Some(100),
        mtu: Some(1280),
        advmss: Some(1200),
        src: Some(ip("10.22.0.2")),
        ..Route::default()
    };
    inpod.add_route(&with_metrics).expect("route with metrics");
    let direct = Route { dst: net("10.98.0.0/24"), oif: Some(eth0.index), scope: Scope::Link, ..Route::default() };
    inpod.add_route(&direct).expect("link route");
    let duplicate = inpod.add_route(&direct).expect_err("duplicate route");
    assert!(is_exists(&duplicate), "{duplicate}");
    inpod.replace_route(&Route { priority: Some(5), ..direct.clone() }).expect("replace (adds with a new metric)");

    let routes = inpod.routes(IpFamily::V4, RT_TABLE_MAIN).expect("routes");
    let find = |dst: &str, routes: &[Route]| routes.iter().find(|r| r.dst == net(dst)).cloned();
    let got = find("0.0.0.0/0", &routes).expect("default back");
    assert_eq!((got.gateway, got.oif, got.table), (Some(ip("10.22.0.1")), Some(eth0.index), Some(RT_TABLE_MAIN)));
    let got = find("10.99.0.0/16", &routes).expect("metrics route back");
    assert_eq!(
        (got.priority, got.mtu, got.advmss, got.src),
        (Some(100), Some(1280), Some(1200), Some(ip("10.22.0.2")))
    );
    let got = find("10.98.0.0/24", &routes).expect("link route back");
    assert_eq!((got.scope, got.gateway), (Scope::Link, None));
    let shown = pod.ip_json(&["route", "show", "10.99.0.0/16"]);
    assert_eq!(shown[0]["gateway"], "10.22.0.1");
    assert_eq!(shown[0]["metric"], 100);
    let shown = pod.ip_json(&["-6", "route", "show", "fd00:22::/64"]);
    assert_eq!(shown[0]["dev"], "eth0", "prefix route of the v6 address: {shown}");
    assert!(inpod.routes(IpFamily::V6, RT_TABLE_MAIN).expect("v6").iter().any(|r| r.dst == net("fd00:22::/64")));

    assert_ping(&pod, ip("10.22.0.1"));

    inpod.del_route(&with_metrics).expect("delete route");
    let missing = inpod.del_route(&with_metrics).expect_err("already deleted");
    assert!(is_not_found(&missing), "{missing}");
    assert!(find("10.99.0.0/16", &inpod.routes(IpFamily::V4, RT_TABLE_MAIN).expect("routes")).is_none());
    inpod.del_address(eth0.index, net("10.22.0.2/24")).expect("delete address");
    let missing = inpod.del_address(eth0.index, net("10.22.0.2/24")).expect_err("already deleted");
    assert!(is_not_found(&missing), "{missing}");

    // Deleting the node end removes the pod end too.
    assert!(host.delete_link_by_name("veth1").expect("delete veth"));
    assert!(!host.delete_link_by_name("veth1").expect("delete again"));
    assert!(inpod.link_by_name("eth0").expect("get").is_none());
    host.delete_link(bridge.index).expect("delete bridge");
    assert!(host.link_by_index(bridge.index).expect("get").is_none());
    let missing = host.delete_link(bridge.index).expect_err("already deleted");
    assert!(is_not_found(&missing), "{missing}");
    assert_eq!(links_in(&node), vec!["lo".to_string()]);
}

#[test]
fn ifb_and_bridge_options() {
    let node = Node::new();
    let mut host = node.netlink();
    let ifb = host.create_ifb("ifb0", Some(1500)).expect("ifb");
    assert_eq!(ifb.kind.as_deref(), Some("ifb"));
    let filtering = vec![cnicore::netlink::link::InfoBridge::VlanFiltering(true)];
    match host.create_bridge_with("br1", None, filtering) {
        Ok(bridge) => {
            let details = node.ip_json(&["-d", "link", "show", "br1"]);
            assert_eq!(details[0]["linkinfo"]["info_data"]["vlan_filtering"], 1, "{bridge:?}");
        }
        // Kernels without CONFIG_BRIDGE_VLAN_FILTERING refuse the option.
        Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EOPNOTSUPP), "{e}"),
    }
}

#[test]
fn wait_oper_up_times_out_then_wakes_on_the_event() {
    let node = Node::new();
    let pod = node.pod_netns();
    let (host_index, pod_index) = veth_between(&node, &pod, "veth2", "eth0", &[], &[]);
    let mut host = node.netlink();
    let mut inpod = pod.netlink();
    inpod.set_down(pod_index).expect("peer down");

    let start = Instant::now();
    let timeout = host.wait_oper_up(host_index, Duration::from_millis(200)).expect_err("peer is down");
    assert_eq!(timeout.kind(), std::io::ErrorKind::TimedOut);
    assert!(start.elapsed() >= Duration::from_millis(200));

    let pod_path = pod.path.clone();
    let raise = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        let netns = NetNs::open(pod_path).expect("open pod");
        Netlink::in_netns(&netns).and_then(|mut netlink| netlink.set_up(pod_index))
    });
    let start = Instant::now();
    host.wait_oper_up(host_index, Duration::from_secs(5)).expect("woken when the peer comes up");
    assert!(start.elapsed() < Duration::from_secs(4));
    raise.join().expect("thread").expect("peer up");

    let gone = host.wait_oper_up(999_999, Duration::from_millis(50)).expect_err("no such link");
    assert_eq!(gone.kind(), std::io::ErrorKind::NotFound);
}

#[test]
fn veth_between_namespaces_pings() {
    let node = Node::new();
    let wan = TestNetns::new("wan");
    veth_between(
        &node,
        &wan,
        "wan0",
        "eth0",
        &[net("192.0.2.1/24"), net("2001:db8::1/64")],
        &[net("192.0.2.2/24"), net("2001:db8::2/64")],
    );
    assert_ping(&node, ip("192.0.2.2"));
    assert_ping(&wan, ip("2001:db8::1"));
    let out = node.exec("ip", &["-j", "-4", "addr", "show", "wan0"], &[], b"");
    let shown: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(shown[0]["addr_info"][0]["local"], "192.0.2.1");
}

#[test]
fn sysctl_applies_to_the_namespace_it_runs_in() {
    let node = Node::new();
    let root_value = sysctl::read("net/ipv4/ip_forward").expect("root value");
    let wanted = if root_value == "1" { "0" } else { "1" };
    let netns = node.netns();
    let root_inode = current_netns_inode();
    // Never write in the root namespace, even if entering were broken.
    let guard = || assert_ne!(current_netns_inode(), root_inode, "not inside the test namespace");
    let written = netns
        .run(|| {
            guard();
            sysctl::write_if_different("net/ipv4/ip_forward", wanted)
        })
        .expect("enter");
    assert!(written.expect("write"));
    let again = netns
        .run(|| {
            guard();
            sysctl::write_if_different("net/ipv4/ip_forward", wanted)
        })
        .expect("enter");
    assert!(!again.expect("second write"));
    assert_eq!(node.sysctl("net/ipv4/ip_forward"), wanted);
    assert_eq!(sysctl::read("net/ipv4/ip_forward").expect("root value"), root_value, "root namespace changed");

    // Per-interface settings of a link that only exists in the namespace.
    let mut host = node.netlink();
    host.create_bridge("br0", None).expect("bridge");
    netns
        .run(|| {
            guard();
            sysctl::write("net/ipv4/conf/br0/route_localnet", "1")
        })
        .expect("enter")
        .expect("write route_localnet");
    assert_eq!(node.sysctl("net/ipv4/conf/br0/route_localnet"), "1");
    assert!(sysctl::read("net/ipv4/conf/../../../../etc/passwd").is_err());
}
