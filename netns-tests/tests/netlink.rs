//! The netns, netlink and sysctl layer of cnicore against the real kernel, in namespaces made per test.

use std::os::unix::fs::MetadataExt;
use std::time::{Duration, Instant};

use cnicore::netlink::{
    is_exists, is_not_found, AddressOptions, Event, Events, FdbEntry, IpFamily, Neighbour, Netlink, Request, Route,
    Scope, Vxlan, RT_TABLE_MAIN,
};
use cnicore::netns::NetNs;
use cnicore::sysctl;
use ipnet::IpNet;
use netns_tests::{assert_ping, ip, json, links_in, net, unique_name, veth_between, Node, TestNetns, Value};

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
fn links_move_between_namespaces_renamed_and_back() {
    let node = TestNetns::new("mvnode");
    let pod = TestNetns::new("mvpod");
    let mut node_nl = node.netlink();
    let veth = node_nl.create_veth("mv0", "mv1", &node.netns(), None, None).expect("veth");
    let peer = node_nl.require_link("mv1").expect("peer");
    node_nl.move_to_netns(peer.index, &pod.netns(), Some("eth7")).expect("move renamed");
    assert!(node_nl.link_by_name("mv1").expect("list").is_none(), "moved link still in the node");
    let mut pod_nl = pod.netlink();
    let moved = pod_nl.require_link("eth7").expect("renamed in the pod");
    // A new name taken in the target: the kernel moves the link, then fails the rename (EEXIST), leaving it in
    // the target under its old name (see `move_to_netns`).
    let other = node_nl.require_link("mv0").expect("local end");
    let err = pod_nl.move_to_netns(moved.index, &node.netns(), Some("mv0")).expect_err("name clash");
    assert!(is_exists(&err), "{err}");
    assert_eq!(links_in(&pod), vec!["lo".to_string()]);
    let stranded = node_nl.require_link("eth7").expect("moved under its old name");
    node_nl.move_to_netns(stranded.index, &pod.netns(), None).expect("move to the pod again");
    let moved = pod_nl.require_link("eth7").expect("in the pod again");
    // Back under its own name, renamed in place first (a rename needs the link down, which it is).
    pod_nl.rename(moved.index, "mv1").expect("rename");
    pod_nl.move_to_netns(moved.index, &node.netns(), None).expect("move back");
    assert_eq!(links_in(&pod), vec!["lo".to_string()]);
    assert_eq!(node_nl.require_link("mv1").expect("back").peer_index, Some(other.index));
    assert_eq!(veth.index, other.index);
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

// ---------------------------------------------------------------------------------------------------------
// What fabricd's vxlan backend uses: a vxlan device, permanent neighbours and FDB entries, onlink routes of its
// own protocol, all sent in `Netlink::batch` requests as its data plane builds them.
// ---------------------------------------------------------------------------------------------------------

/// fabricd's protocol number (`ROUTE_PROTOCOL` in fabricd/src/dataplane.rs).
const FABRIC_PROTOCOL: u8 = 75;
const VXLAN_DEVICE: &str = "flannel.7";

fn mac(text: &str) -> [u8; 6] {
    let bytes: Vec<u8> = text.split(':').map(|b| u8::from_str_radix(b, 16).expect("hex")).collect();
    bytes.try_into().expect("six bytes")
}

/// The vxlan settings fabricd uses over `underlay` (learning off: the FDB is programmed).
fn fabric_vxlan(local: &str, underlay: u32) -> Vxlan {
    Vxlan {
        vni: 7,
        local: Some(local.parse().expect("an address")),
        link: Some(underlay),
        port: 4789,
        learning: false,
        gbp: false,
    }
}

/// The three entries fabricd programs for a peer reached through the overlay: a route to its subnet via the
/// subnet's first address onlink on the vxlan device, that address's permanent neighbour (the peer's VTEP MAC),
/// and the MAC's FDB entry (the peer's node address).
fn overlay_entries(index: u32, subnet: &str, vtep_mac: [u8; 6], endpoint: &str) -> (Route, Neighbour, FdbEntry) {
    let dst = net(subnet);
    let tunnel = dst.network();
    let route = Route {
        dst,
        gateway: Some(tunnel),
        oif: Some(index),
        onlink: true,
        protocol: Some(FABRIC_PROTOCOL),
        table: Some(RT_TABLE_MAIN),
        ..Route::default()
    };
    (route, Neighbour::permanent(index, tunnel, vtep_mac), FdbEntry::vxlan(index, vtep_mac, ip(endpoint)))
}

fn replaces(route: &Route, neighbour: &Neighbour, fdb: &FdbEntry) -> Vec<(Request, u16)> {
    vec![
        (fdb.replace_request(), FdbEntry::REPLACE),
        (neighbour.replace_request(), Neighbour::REPLACE),
        (route.replace_request(), Route::REPLACE),
    ]
}

fn deletes(route: &Route, neighbour: &Neighbour, fdb: &FdbEntry) -> Vec<(Request, u16)> {
    vec![(route.delete_request(), 0), (neighbour.delete_request(), 0), (fdb.delete_request(), 0)]
}

fn all_ok(outcomes: Vec<std::io::Result<()>>) {
    for (i, outcome) in outcomes.into_iter().enumerate() {
        outcome.unwrap_or_else(|e| panic!("request {i} of the batch: {e}"));
    }
}

/// The entries of the vxlan device `index` as the dump functions read them.
fn overlay_state(nl: &mut Netlink, index: u32) -> (Vec<Route>, Vec<Neighbour>, Vec<FdbEntry>) {
    let routes = nl.routes(IpFamily::V4, RT_TABLE_MAIN).expect("routes").into_iter().filter(|r| r.oif == Some(index));
    let neighbours = nl.neighbours(IpFamily::V4, Some(index)).expect("neighbours");
    // Entries with a remote only, as fabricd's reconcile reads them.
    let fdb = nl.fdb(index).expect("fdb").into_iter().filter(|e| e.dst.is_some()).collect();
    (routes.collect(), neighbours, fdb)
}

#[test]
fn vxlan_device_with_fabricds_options_reads_back_as_created() {
    let node = Node::new();
    let other = TestNetns::new("peer");
    let (underlay, _) = veth_between(&node, &other, "under0", "eth0", &[net("192.0.2.1/24")], &[net("192.0.2.2/24")]);
    let mut nl = node.netlink();

    let wanted = fabric_vxlan("192.0.2.1", underlay);
    let link = nl.create_vxlan(VXLAN_DEVICE, Some(1450), &wanted).expect("create vxlan");
    assert_eq!((link.kind.as_deref(), link.mtu, link.up), (Some("vxlan"), 1450, false));
    let (read, settings) = nl.vxlan_by_name(VXLAN_DEVICE).expect("read").expect("the device exists");
    assert_eq!(read.index, link.index);
    assert_eq!(settings, Some(wanted.clone()), "settings read back");
    let again = nl.create_vxlan(VXLAN_DEVICE, Some(1450), &wanted).expect_err("the name is taken");
    assert!(is_exists(&again), "{again}");

    // What the kernel (and `ip -d link`) says the device is.
    let shown = node.ip_json(&["-d", "link", "show", VXLAN_DEVICE]);
    let data = &shown[0]["linkinfo"]["info_data"];
    assert_eq!(shown[0]["linkinfo"]["info_kind"], "vxlan", "{shown}");
    assert_eq!((data["id"].as_u64(), data["port"].as_u64()), (Some(7), Some(4789)), "{data}");
    assert_eq!((data["local"].as_str(), data["link"].as_str()), (Some("192.0.2.1"), Some("under0")), "{data}");
    assert_eq!(data["learning"], false, "{data}");
    assert_eq!(shown[0]["mtu"], 1450);

    // A device made by `ip` with other settings reads back with them: a drifted device is told apart.
    node.ip(&[
        "link",
        "add",
        "vx8",
        "type",
        "vxlan",
        "id",
        "8",
        "local",
        "192.0.2.1",
        "dev",
        "under0",
        "dstport",
        "8472",
    ]);
    let (_, drifted) = nl.vxlan_by_name("vx8").expect("read").expect("exists");
    let expected = Vxlan { vni: 8, port: 8472, learning: true, ..wanted.clone() };
    assert_eq!(drifted, Some(expected));
    assert_ne!(drifted, Some(wanted.clone()));
    // Not a vxlan device, and no device at all.
    let (_, none) = nl.vxlan_by_name("under0").expect("read").expect("exists");
    assert_eq!(none, None);
    assert!(nl.vxlan_by_name("flannel.99").expect("read").is_none());

    // Group Based Policy (a flag attribute) and learning, as flannel's GBP and Learning set them.
    let gbp = Vxlan { vni: 9, learning: true, gbp: true, ..wanted.clone() };
    let gbp_link = nl.create_vxlan("vx9", Some(1400), &gbp).expect("create vxlan with gbp");
    let (_, read) = nl.vxlan_by_name("vx9").expect("read").expect("exists");
    assert_eq!(read, Some(gbp), "gbp and learning read back");
    let shown = node.ip_json(&["-d", "link", "show", "vx9"]);
    let data = &shown[0]["linkinfo"]["info_data"];
    assert!(data.get("gbp").is_some(), "ip -d link shows gbp: {data}");
    assert_eq!(data["learning"], true, "{data}");
    let (_, plain) = nl.vxlan_by_name(VXLAN_DEVICE).expect("read").expect("exists");
    assert_eq!(plain.map(|v| v.gbp), Some(false), "no gbp attribute: off");
    nl.delete_link(gbp_link.index).expect("delete");
    nl.delete_link(link.index).expect("delete");
    assert!(nl.vxlan_by_name(VXLAN_DEVICE).expect("read").is_none());
}

#[test]
fn neighbours_fdb_entries_and_onlink_routes_through_batches() {
    let node = Node::new();
    let other = TestNetns::new("peer");
    let (underlay, _) = veth_between(&node, &other, "under0", "eth0", &[net("192.0.2.1/24")], &[net("192.0.2.2/24")]);
    let mut nl = node.netlink();
    let device = nl.create_vxlan(VXLAN_DEVICE, Some(1450), &fabric_vxlan("192.0.2.1", underlay)).expect("vxlan");
    let index = device.index;
    nl.set_up(index).expect("up");
    nl.add_address(index, net("10.244.1.0/32")).expect("the node's tunnel address");
    let events = nl.events(&[libc::RTNLGRP_NEIGH, libc::RTNLGRP_IPV4_ROUTE]).expect("subscribe");

    // One batch of three requests, as fabricd's reconcile sends them.
    let peer_mac = mac("0e:00:00:00:00:03");
    let (route, neighbour, fdb) = overlay_entries(index, "10.244.3.0/24", peer_mac, "192.0.2.3");
    all_ok(nl.batch(replaces(&route, &neighbour, &fdb)).expect("batch"));

    let (routes, neighbours, fdb_entries) = overlay_state(&mut nl, index);
    assert_eq!(routes.len(), 1, "{routes:?}");
    let got = &routes[0];
    assert_eq!((got.dst, got.gateway, got.oif), (net("10.244.3.0/24"), Some(ip("10.244.3.0")), Some(index)));
    assert!(got.onlink, "{got:?}");
    assert_eq!(got.protocol, Some(FABRIC_PROTOCOL));
    assert_eq!(neighbours, vec![Neighbour::permanent(index, ip("10.244.3.0"), peer_mac)]);
    assert_eq!(fdb_entries.len(), 1, "{fdb_entries:?}");
    let entry = &fdb_entries[0];
    assert_eq!((entry.mac, entry.dst, entry.index), (peer_mac, Some(ip("192.0.2.3")), index));
    assert!(entry.state & cnicore::netlink::neigh::NUD_PERMANENT != 0, "{entry:?}");
    assert!(entry.flags & cnicore::netlink::neigh::NTF_SELF != 0, "{entry:?}");

    // The kernel's tools see the same.
    let shown = node.ip_json(&["route", "show", "10.244.3.0/24"]);
    assert_eq!((shown[0]["gateway"].as_str(), shown[0]["dev"].as_str()), (Some("10.244.3.0"), Some(VXLAN_DEVICE)));
    assert_eq!(shown[0]["protocol"].to_string().trim_matches('"'), "75", "{shown}");
    assert_eq!(shown[0]["flags"], json!(["onlink"]), "{shown}");
    let shown = node.ip_json(&["neigh", "show", "dev", VXLAN_DEVICE]);
    assert_eq!(shown, json!([{"dst": "10.244.3.0", "lladdr": "0e:00:00:00:00:03", "state": ["PERMANENT"]}]));
    let shown = bridge_json(&node, &["fdb", "show", "dev", VXLAN_DEVICE]);
    let shown: Vec<&Value> = shown.as_array().expect("list").iter().filter(|e| e["dst"].is_string()).collect();
    assert_eq!(shown.len(), 1, "{shown:?}");
    assert_eq!((shown[0]["mac"].as_str(), shown[0]["dst"].as_str()), (Some("0e:00:00:00:00:03"), Some("192.0.2.3")));
    assert_eq!((shown[0]["flags"].clone(), shown[0]["state"].as_str()), (json!(["self"]), Some("permanent")));

    // The route the node takes to a pod of that subnet, and to the underlay next door.
    let via = nl.route_get(ip("10.244.3.7")).expect("route get").expect("a route");
    assert_eq!((via.gateway, via.oif), (Some(ip("10.244.3.0")), Some(index)));
    assert_eq!(nl.route_get_oif(ip("10.244.3.7")).expect("route get"), Some(index));
    let next_door = nl.route_get(ip("192.0.2.2")).expect("route get").expect("a route");
    assert_eq!((next_door.gateway, next_door.oif), (None, Some(underlay)), "on the link: no gateway");
    assert_eq!(nl.route_get(ip("10.244.1.0")).expect("route get"), None, "local: no unicast route");

    // Idempotent: the same batch again changes nothing and makes no second entry.
    all_ok(nl.batch(replaces(&route, &neighbour, &fdb)).expect("batch"));
    assert_eq!(overlay_state(&mut nl, index), (routes.clone(), neighbours.clone(), fdb_entries.clone()));

    // A peer that moved (new node address, new VTEP MAC): replaced in place, still one of each.
    let moved_mac = mac("0e:00:00:00:00:04");
    let (route2, neighbour2, fdb2) = overlay_entries(index, "10.244.3.0/24", moved_mac, "192.0.2.4");
    let moved_fdb = FdbEntry::vxlan(index, peer_mac, ip("192.0.2.4"));
    all_ok(
        nl.batch(vec![
            (moved_fdb.replace_request(), FdbEntry::REPLACE),
            (neighbour2.replace_request(), Neighbour::REPLACE),
            (route2.replace_request(), Route::REPLACE),
        ])
        .expect("batch"),
    );
    let (routes, neighbours, fdb_entries) = overlay_state(&mut nl, index);
    assert_eq!(routes.len(), 1, "{routes:?}");
    assert_eq!(neighbours, vec![Neighbour::permanent(index, ip("10.244.3.0"), moved_mac)]);
    assert_eq!(fdb_entries.iter().map(|e| (e.mac, e.dst)).collect::<Vec<_>>(), vec![(peer_mac, Some(ip("192.0.2.4")))]);
    assert_eq!(node.ip_json(&["neigh", "show", "dev", VXLAN_DEVICE])[0]["lladdr"], "0e:00:00:00:00:04");
    all_ok(
        nl.batch(vec![(moved_fdb.delete_request(), 0), (fdb2.replace_request(), FdbEntry::REPLACE)]).expect("batch"),
    );

    // Deleted in one batch; deleting again gives each the error `is_not_found` recognises, in order.
    drain(&events);
    all_ok(nl.batch(deletes(&route2, &neighbour2, &fdb2)).expect("batch"));
    assert_eq!(overlay_state(&mut nl, index), (vec![], vec![], vec![]));
    assert_eq!(
        bridge_json(&node, &["fdb", "show", "dev", VXLAN_DEVICE])
            .as_array()
            .map(|a| a.iter().filter(|e| e["dst"].is_string()).count()),
        Some(0)
    );
    let seen = event_types(&events, 4);
    assert!(
        seen.contains(&libc::RTM_DELROUTE) && seen.iter().filter(|t| **t == libc::RTM_DELNEIGH).count() >= 2,
        "{seen:?}"
    );
    let outcomes = nl.batch(deletes(&route2, &neighbour2, &fdb2)).expect("batch");
    assert_eq!(outcomes.len(), 3);
    for (what, outcome) in ["route", "neighbour", "fdb entry"].iter().zip(outcomes) {
        let e = outcome.expect_err(what);
        assert!(is_not_found(&e), "deleting a {what} that is gone: {e} ({:?})", e.raw_os_error());
    }

    // A batch whose middle request fails: the others are applied and each outcome is in its place.
    let (route5, neighbour5, _) = overlay_entries(index, "10.244.5.0/24", mac("0e:00:00:00:00:05"), "192.0.2.5");
    let outcomes = nl
        .batch(vec![
            (neighbour5.replace_request(), Neighbour::REPLACE),
            (neighbour2.delete_request(), 0),
            (route5.replace_request(), Route::REPLACE),
        ])
        .expect("batch");
    assert!(outcomes[0].is_ok() && outcomes[2].is_ok(), "{outcomes:?}");
    assert!(outcomes[1].as_ref().is_err_and(is_not_found), "{outcomes:?}");
    let (routes, neighbours, _) = overlay_state(&mut nl, index);
    assert_eq!((routes.len(), neighbours.len()), (1, 1));

    // Deleting the device takes its neighbours, FDB entries and routes with it.
    nl.delete_link(index).expect("delete vxlan");
    assert!(nl.neighbours(IpFamily::V4, Some(index)).expect("neighbours").is_empty());
    assert!(nl.routes(IpFamily::V4, RT_TABLE_MAIN).expect("routes").iter().all(|r| r.oif != Some(index)));
}

/// More requests than one datagram holds (256): every outcome comes back, in order, and the kernel has them all.
#[test]
fn batches_larger_than_a_datagram() {
    let node = Node::new();
    let other = TestNetns::new("peer");
    let (underlay, _) = veth_between(&node, &other, "under0", "eth0", &[net("192.0.2.1/24")], &[net("192.0.2.2/24")]);
    let mut nl = node.netlink();
    let index = nl.create_vxlan(VXLAN_DEVICE, Some(1450), &fabric_vxlan("192.0.2.1", underlay)).expect("vxlan").index;
    nl.set_up(index).expect("up");
    const PEERS: u32 = 700;
    let peers: Vec<(Route, Neighbour, FdbEntry)> = (0..PEERS)
        .map(|i| {
            let subnet = format!("10.{}.{}.0/24", 100 + i / 256, i % 256);
            let vtep = mac(&format!("0e:00:00:00:{:02x}:{:02x}", i / 256, i % 256));
            overlay_entries(index, &subnet, vtep, &format!("198.51.{}.{}", i / 256, 1 + i % 250))
        })
        .collect();
    let requests: Vec<(Request, u16)> = peers.iter().flat_map(|(r, n, f)| replaces(r, n, f)).collect();
    let outcomes = nl.batch(requests).expect("batch");
    assert_eq!(outcomes.len(), 3 * PEERS as usize);
    all_ok(outcomes);
    let (routes, neighbours, fdb) = overlay_state(&mut nl, index);
    assert_eq!((routes.len(), neighbours.len(), fdb.len()), (PEERS as usize, PEERS as usize, PEERS as usize));
    let shown = node.ip_json(&["route", "show", "proto", "75"]);
    assert_eq!(shown.as_array().map(Vec::len), Some(PEERS as usize));

    // Every other peer removed, the rest replaced again: one batch, one outcome each.
    let mut requests = Vec::new();
    for (i, (route, neighbour, fdb)) in peers.iter().enumerate() {
        requests.extend(if i % 2 == 0 { deletes(route, neighbour, fdb) } else { replaces(route, neighbour, fdb) });
    }
    all_ok(nl.batch(requests).expect("batch"));
    let (routes, neighbours, fdb) = overlay_state(&mut nl, index);
    let half = PEERS as usize / 2;
    assert_eq!((routes.len(), neighbours.len(), fdb.len()), (half, half, half));
    assert!(
        routes.iter().all(|r| r.dst != net("10.100.0.0/24")) && routes.iter().any(|r| r.dst == net("10.100.1.0/24"))
    );
}

/// Two nodes programmed with these entries (and nothing else) reach each other's tunnel address through the
/// overlay: the kernel uses them as fabricd means it to.
#[test]
fn programmed_overlay_carries_packets() {
    let a = Node::new();
    let b = TestNetns::new("nodeb");
    let (under_a, under_b) = veth_between(&a, &b, "under0", "under0", &[net("192.0.2.1/24")], &[net("192.0.2.2/24")]);
    let (mac_a, mac_b) = (mac("0e:00:00:00:0a:01"), mac("0e:00:00:00:0b:01"));
    let sides = [
        (a.netlink(), under_a, "192.0.2.1", mac_a, "10.244.1.0"),
        (b.netlink(), under_b, "192.0.2.2", mac_b, "10.244.2.0"),
    ];
    let mut indexes = Vec::new();
    for (mut nl, underlay, local, vtep, tunnel) in sides {
        let index = nl.create_vxlan(VXLAN_DEVICE, Some(1450), &fabric_vxlan(local, underlay)).expect("vxlan").index;
        nl.set_mac(index, vtep).expect("mac");
        nl.add_address(index, net(&format!("{tunnel}/32"))).expect("address");
        nl.set_up(index).expect("up");
        nl.wait_oper_up(index, Duration::from_secs(5)).expect("vxlan operational");
        indexes.push((nl, index));
    }
    let (peer_of_a, peer_of_b) = (("10.244.2.0/24", mac_b, "192.0.2.2"), ("10.244.1.0/24", mac_a, "192.0.2.1"));
    for ((nl, index), (subnet, vtep, endpoint)) in indexes.iter_mut().zip([peer_of_a, peer_of_b]) {
        let (route, neighbour, fdb) = overlay_entries(*index, subnet, vtep, endpoint);
        all_ok(nl.batch(replaces(&route, &neighbour, &fdb)).expect("batch"));
    }
    assert_ping(&a, ip("10.244.2.0"));
    assert_ping(&b, ip("10.244.1.0"));
    // It went through the tunnel: the device counted the packets.
    let stats = a.ip_json(&["-s", "link", "show", VXLAN_DEVICE]);
    assert!(stats[0]["stats64"]["tx"]["packets"].as_u64() >= Some(1), "{stats}");
    assert!(stats[0]["stats64"]["rx"]["packets"].as_u64() >= Some(1), "{stats}");
}

/// `bridge -j <args>` inside the namespace, parsed.
fn bridge_json(ns: &TestNetns, args: &[&str]) -> Value {
    let mut all = vec!["-j"];
    all.extend_from_slice(args);
    let out = ns.exec("bridge", &all, &[], b"");
    assert!(out.status.success(), "bridge {}: {}", all.join(" "), String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    let text = if text.trim().is_empty() { "[]" } else { text.trim() };
    serde_json::from_str(text).unwrap_or_else(|e| panic!("bridge {} output {text:?}: {e}", all.join(" ")))
}

/// Throws away the notifications received so far.
fn drain(events: &Events) {
    while !events.recv_timeout(Duration::from_millis(50)).expect("events").is_empty() {}
}

/// The types of the notifications that arrive within a second, until `want` have come.
fn event_types(events: &Events, want: usize) -> Vec<u16> {
    let deadline = Instant::now() + Duration::from_secs(1);
    let mut seen = Vec::new();
    while seen.len() < want && Instant::now() < deadline {
        for event in events.recv_timeout(Duration::from_millis(100)).expect("events") {
            match event {
                Event::Message(message) => seen.push(message.message_type),
                Event::Lost => panic!("notifications lost"),
            }
        }
    }
    seen
}
