//! podman (Debian's 4.3.1, CNI backend) `network create -d macvlan --subnet` (macvlan + host-local) on a
//! veth master in the test's node netns: a busybox httpd container runs on it with our plugins and with the
//! reference plugins (/usr/lib/cni); its IP is on its macvlan eth0 and answers from the lan; `podman rm -f`
//! leaves nothing and no plugin call failed. (Without `--subnet` podman writes a dhcp IPAM: that variant
//! belongs with the dhcp plugin's tests, on the same rig, `netns_tests::podman_macvlan`.)

use netns_tests::podman;
use netns_tests::podman_macvlan::{MacvlanPodman, LAN_SUBNET, MASTER};
use netns_tests::runtimes::{net, Plugins};

fn macvlan_with_subnet(plugins: Plugins) {
    if !podman::available() {
        return;
    }
    let mut rig = MacvlanPodman::new(&plugins.dir());
    let conf = rig.create_network("mvnet", &["--subnet", LAN_SUBNET, "--gateway", "10.91.0.1"]);
    assert_eq!(conf["plugins"][0]["type"], "macvlan", "{conf}");
    assert_eq!(conf["plugins"][0]["master"], MASTER, "{conf}");
    assert_eq!(conf["plugins"][0]["ipam"]["type"], "host-local", "{conf}");
    let ip = rig.run_container();
    assert!(net(LAN_SUBNET).contains(&ip), "{ip} in {LAN_SUBNET}");
    rig.remove_container();
}

#[test]
fn macvlan_network_with_subnet_ours() {
    macvlan_with_subnet(Plugins::Ours);
}

#[test]
fn macvlan_network_with_subnet_reference() {
    macvlan_with_subnet(Plugins::Reference);
}
