//! A dual-stack local cluster (`scripts/cluster.sh up --dual-stack`): podCIDRs of both families from
//! kube-controller-manager, one address of each per pod from the kubenet conflist containerd renders, pod to pod
//! across nodes in both families with the source kept, dual-stack Services (a ClusterIP of each family from
//! pods, a pod through its own Service, NodePort from the wan on both node addresses), traffic to outside the
//! cluster masqueraded to the node's address of each family, nothing left after.

use netns_tests::cluster::{self, Cluster, ClusterConfig};
use netns_tests::workloads::*;

const DUAL: &str = "ipFamilyPolicy: RequireDualStack\n  ipFamilies: [IPv4, IPv6]";

#[test]
fn dual_stack_cluster_on_our_plugins() {
    if !cluster::available() {
        return;
    }
    let cluster = Cluster::up(ClusterConfig {
        dual_stack: true,
        containerd: cluster::containerd("1.7"),
        ..ClusterConfig::default()
    });
    for node in cluster.nodes() {
        let cidrs = pod_cidrs(&cluster, &node);
        assert!(cidrs.len() == 2 && cidrs[0].addr().is_ipv4() && cidrs[1].addr().is_ipv6(), "{node}: {cidrs:?}");
    }
    let pods = deployment_spreads_and_connects(&cluster);
    for pod in &pods {
        assert_eq!(pod.ips.len(), 2, "{} has an address of each family: {:?}", pod.name, pod.ips);
    }
    assert_outside_sees_the_node(&cluster, &pods[0]);
    services_from_pods(&cluster, &pods, DUAL);
    node_port_from_wan(&cluster, DUAL);
    delete_everything(&cluster);
}
