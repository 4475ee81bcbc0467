//! Where the kernel refuses what a plugin asks, the plugin answers a CNI error that names what was refused
//! (the link, its master, the kernel's errno and, where the kernel gives one, its reason) and leaves node and
//! pod as they were, no lease left; a runtime's DEL of the failed attachment succeeds. The refusals come from
//! the real kernel (the VM lane's: this machine's kernel lacks these link kinds): a master cannot carry ipvlan
//! and macvlan links at once, nor either while it is a bridge port (EBUSY); a VLAN id is taken once per master
//! (EEXIST); loopback carries no VLANs (EOPNOTSUPP, which is not a missing 8021q); a passthru macvlan wants its
//! master alone (EINVAL); two running macvlans of one master cannot share a MAC (EADDRINUSE when the second comes up); with
//! `net.vrf.strict_mode` a routing table belongs to one VRF (EBUSY). And one the kernel does not refuse: 6.1
//! makes an ipvlan with an MTU above its master's, which then loses the packets above the master's MTU; the
//! plugin refuses it first, as macvlan and vlan do. Nor does it refuse an ipvlan of another mode on a master
//! whose ipvlan links have one: it switches them all; the plugin refuses it first.

use netns_tests::linkrig::{link_details, pod_link_mode, skip_without_kind, with_fields, Impl, LinkRig, UPLINK};
use netns_tests::snapshot::{assert_unchanged, NodeSnapshot};
use netns_tests::{bin, json, run_for_pod, unique_name, Value};

fn conf(rig: &LinkRig, plugin: &str, extra: Value) -> Value {
    let conf = json!({"cniVersion": "1.0.0", "name": rig.network, "type": plugin, "master": UPLINK,
        "ipam": rig.ipam("10.30.0.0/24")});
    with_fields(conf, &extra)
}

/// `plugin`'s rig with a link of `kind` already on the uplink (made by hand, as another tool would).
fn rig_with_uplink_link(plugin: &str, kind: &str) -> LinkRig {
    let rig = LinkRig::new(plugin);
    rig.node.ip(&["link", "add", "link", UPLINK, "name", "other0", "type", kind]);
    rig
}

#[test]
fn ipvlan_on_a_master_that_carries_macvlan_links() {
    if skip_without_kind("ipvlan", "CONFIG_IPVLAN") {
        return;
    }
    let rig = rig_with_uplink_link("ipvlan", "macvlan");
    rig.assert_refused(&conf(&rig, "ipvlan", json!({})), &["ipvlan", "\"uplink0\"", "EBUSY", "macvlan or ipvlan"]);
}

#[test]
fn macvlan_on_a_master_that_carries_ipvlan_links() {
    if skip_without_kind("ipvlan", "CONFIG_IPVLAN") {
        return;
    }
    let rig = rig_with_uplink_link("macvlan", "ipvlan");
    rig.assert_refused(&conf(&rig, "macvlan", json!({})), &["macvlan", "\"uplink0\"", "EBUSY", "macvlan or ipvlan"]);
}

#[test]
fn ipvlan_and_macvlan_on_a_bridge_port() {
    if skip_without_kind("ipvlan", "CONFIG_IPVLAN") {
        return;
    }
    for plugin in ["ipvlan", "macvlan"] {
        let rig = LinkRig::new(plugin);
        rig.node.ip(&["link", "add", "br0", "type", "bridge"]);
        rig.node.ip(&["link", "set", UPLINK, "master", "br0"]);
        rig.assert_refused(&conf(&rig, plugin, json!({})), &[plugin, "\"uplink0\"", "EBUSY"]);
    }
}

#[test]
fn a_passthru_macvlan_on_a_master_that_has_macvlans() {
    let rig = rig_with_uplink_link("macvlan", "macvlan");
    rig.assert_refused(&conf(&rig, "macvlan", json!({"mode": "passthru"})), &["macvlan", "\"uplink0\"", "EINVAL"]);
}

#[test]
fn a_macvlan_mac_another_macvlan_of_the_master_has() {
    let rig = LinkRig::new("macvlan");
    let mac = "02:00:00:00:00:09";
    rig.node.ip(&["link", "add", "link", UPLINK, "name", "other0", "address", mac, "type", "macvlan"]);
    // The kernel checks the MAC when the link comes up (the running macvlans of a master are looked up by it).
    rig.node.ip(&["link", "set", "other0", "up"]);
    let needles = ["failed to set \"eth0\" up", "EADDRINUSE"];
    rig.assert_refused(&conf(&rig, "macvlan", json!({"mac": mac})), &needles);
}

#[test]
fn a_vlan_id_already_on_the_master() {
    if skip_without_kind("vlan", "CONFIG_VLAN_8021Q") {
        return;
    }
    let rig = LinkRig::new("vlan");
    rig.node.ip(&["link", "add", "link", UPLINK, "name", "uplink0.100", "type", "vlan", "id", "100"]);
    let msg = rig.assert_refused(
        &conf(&rig, "vlan", json!({"vlanId": 100})),
        &["\"uplink0\"", "EEXIST", "VLAN device already exists", "VLAN 100"],
    );
    assert!(!msg.contains("already exists in netns"), "not the pod's interface: {msg}");
}

#[test]
fn a_vlan_on_loopback_is_no_missing_8021q() {
    if skip_without_kind("vlan", "CONFIG_VLAN_8021Q") {
        return;
    }
    let rig = LinkRig::new("vlan");
    let msg = rig.assert_refused(
        &conf(&rig, "vlan", json!({"master": "lo", "vlanId": 100})),
        &["\"lo\"", "EOPNOTSUPP", "VLANs not supported on device"],
    );
    assert!(!msg.contains("no vlan support"), "8021q is there: {msg}");
}

#[test]
fn an_ipvlan_mtu_above_the_masters() {
    if skip_without_kind("ipvlan", "CONFIG_IPVLAN") {
        return;
    }
    let rig = LinkRig::new("ipvlan");
    rig.assert_refused(&conf(&rig, "ipvlan", json!({"mtu": 9000})), &["invalid MTU 9000", "master MTU(1500)"]);
}

#[test]
fn a_vrf_table_that_another_vrf_holds_in_strict_mode() {
    if skip_without_kind("vrf", "CONFIG_NET_VRF") {
        return;
    }
    let node = netns_tests::Node::new();
    let pod = node.pod_with_eth0(&unique_name("vr"), "10.47.0.1/24", "10.47.0.5/24");
    pod.ip(&["link", "add", "red", "type", "vrf", "table", "7"]);
    pod.run(|| cnicore::sysctl::write("net/vrf/strict_mode", "1")).expect("net.vrf.strict_mode");
    let before = NodeSnapshot::settled(&pod, &[], std::time::Duration::from_secs(5));
    let conf = json!({"cniVersion": "1.0.0", "name": "vrf-net", "type": "vrf", "vrfname": "blue", "table": 7,
        "prevResult": {"cniVersion": "1.0.0", "interfaces": [{"name": "eth0", "sandbox": pod.path.display().to_string()}],
            "ips": [{"address": "10.47.0.5/24", "interface": 0}]}});
    let run = |verb: &str| run_for_pod(&node, &pod, &bin("vrf"), verb, ("vrf1", "eth0"), None, &conf);
    let out = run("ADD");
    let msg = out.expect_err()["msg"].as_str().unwrap_or_default().to_string();
    for needle in ["VRF blue", "table 7", "EBUSY"] {
        assert!(msg.contains(needle), "{needle:?} not in the error: {}", out.stdout_text);
    }
    run("DEL").expect_ok();
    assert_unchanged(&before, &NodeSnapshot::take(&pod, &[]));
}

/// The kernel keeps one ipvlan mode per master and a new link of another mode switches all the master's links to
/// it (6.1 and 6.12 do, without an error): the plugin refuses another mode, naming the link that has one, and
/// that link keeps its mode. The same mode is made.
#[test]
fn an_ipvlan_of_another_mode_on_a_master_whose_ipvlan_has_one() {
    if skip_without_kind("ipvlan", "CONFIG_IPVLAN") {
        return;
    }
    let rig = LinkRig::new("ipvlan");
    rig.node.ip(&["link", "add", "link", UPLINK, "name", "other0", "type", "ipvlan", "mode", "l2"]);
    let needles = ["ipvlan mode l3 refused on \"uplink0\"", "in mode l2 (\"other0\" in the master's namespace)"];
    rig.assert_refused(&conf(&rig, "ipvlan", json!({"mode": "l3"})), &needles);
    let other = link_details(&rig.node, "other0").expect("other0");
    assert_eq!(other["linkinfo"]["info_data"]["mode"], "l2", "{other}");
    let pod = rig.node.pod_netns();
    rig.add(Impl::Ours, &pod, "same", &conf(&rig, "ipvlan", json!({"mode": "l2"})));
    assert_eq!(pod_link_mode(&pod, "ipvlan"), "l2");
}

/// The master's ipvlan links are in pods: found in their namespaces, and another mode is refused naming the
/// pod's; the pod keeps its mode (what the reference plugin's second ADD takes from it: shown below).
#[test]
fn an_ipvlan_of_another_mode_beside_pods_on_the_master() {
    if skip_without_kind("ipvlan", "CONFIG_IPVLAN") {
        return;
    }
    let rig = LinkRig::new("ipvlan");
    let first = rig.node.pod_netns();
    // Another network (its lease is not the refused ADD's to leave behind).
    rig.add(Impl::Ours, &first, "first", &conf(&rig, "ipvlan", json!({"mode": "l3s", "name": "first-net"})));
    let place = format!("(\"eth0\" in netns {})", first.path.display());
    let needles = ["ipvlan mode l2 refused on \"uplink0\"", "in mode l3s", &place];
    rig.assert_refused(&conf(&rig, "ipvlan", json!({"mode": "l2"})), &needles);
    assert_eq!(pod_link_mode(&first, "ipvlan"), "l3s");

    let reference = rig.node.pod_netns();
    rig.add(Impl::Reference, &reference, "ref", &conf(&rig, "ipvlan", json!({"mode": "l2", "name": "first-net"})));
    assert_eq!(pod_link_mode(&first, "ipvlan"), "l2", "the kernel keeps one mode per master");
}
