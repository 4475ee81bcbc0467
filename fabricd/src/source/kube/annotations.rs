//! flannel's node annotations, pure: the keys under `--kube-annotation-prefix`, a Node read as a lease, and the
//! annotations this node writes, each byte for byte as flanneld (`pkg/subnet/kube`), so that flanneld and fabricd
//! nodes share one cluster. Nothing here talks to the API server.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

use crate::backend::LeaseData;
use crate::error::{ConfigError, PodCidrsProblem, Result};
use crate::family::Family;
use crate::flannel::{LeaseAttrs, NetworkConfig, SubnetKey};
use crate::source::MAX_LEASE_VALUE;

/// flanneld's default `--kube-annotation-prefix`.
pub const DEFAULT_PREFIX: &str = "flannel.alpha.coreos.com";

/// The annotation keys, as flanneld derives them from its prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Annotations {
    pub kube_subnet_manager: String,
    pub backend_data: String,
    pub backend_v6_data: String,
    pub backend_type: String,
    pub public_ip: String,
    pub public_ipv6: String,
    pub public_ip_overwrite: String,
    pub public_ipv6_overwrite: String,
    /// Read by flanneld at start as its `--public-ip` (`node-public-ip`, `node-public-ipv6`).
    pub node_public_ip: String,
    pub node_public_ipv6: String,
    /// Every key above starts with it.
    pub prefix: String,
}

fn annotation_char(c: char) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-'
}

impl Annotations {
    /// flanneld's rules: at most one slash (none: one is appended; after it, a name part gets a `-`), and the
    /// prefix must end in `<fqdn>/` or `<fqdn>/<name>-` of lowercase letters, digits, `_` and `-`.
    pub fn new(prefix: &str) -> Result<Annotations> {
        let mut prefix = prefix.to_string();
        match prefix.matches('/').count() {
            0 => prefix.push('/'),
            1 => {}
            _ => return Err(ConfigError::AnnotationPrefixSlashes.into()),
        }
        if !prefix.ends_with('/') && !prefix.ends_with('-') {
            prefix.push('-');
        }
        let (domain, name) = prefix.rsplit_once('/').expect("one slash");
        let name_ok = name.is_empty() || (name.len() > 1 && name.ends_with('-') && name.chars().all(annotation_char));
        // flanneld's expression is not anchored at the start: the domain's tail must be two or more labels.
        let tail = domain.rsplit(|c: char| !(annotation_char(c) || c == '.')).next().unwrap_or("");
        let labels = tail.rsplit('.').take_while(|label| !label.is_empty()).count();
        if !name_ok || labels < 2 {
            return Err(ConfigError::AnnotationPrefixFormat { prefix }.into());
        }
        let key = |name: &str| format!("{prefix}{name}");
        Ok(Annotations {
            kube_subnet_manager: key("kube-subnet-manager"),
            backend_data: key("backend-data"),
            backend_v6_data: key("backend-v6-data"),
            backend_type: key("backend-type"),
            public_ip: key("public-ip"),
            public_ipv6: key("public-ipv6"),
            public_ip_overwrite: key("public-ip-overwrite"),
            public_ipv6_overwrite: key("public-ipv6-overwrite"),
            node_public_ip: key("node-public-ip"),
            node_public_ipv6: key("node-public-ipv6"),
            prefix,
        })
    }
}

/// What fabricd keeps of a Node: little, so that a watch of thousands of Nodes stays small.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeRecord {
    pub name: String,
    /// `metadata.creationTimestamp`, in seconds: of two Nodes claiming one subnet, address or tunnel
    /// identity, the older keeps it.
    pub created: i64,
    /// `spec.podCIDRs`, else `spec.podCIDR`, as written.
    pub pod_cidrs: Vec<String>,
    /// The annotations under the prefix (others are not kept).
    pub annotations: BTreeMap<String, String>,
}

impl NodeRecord {
    pub fn from_node(node: &k8s_openapi::api::core::v1::Node, keys: &Annotations) -> NodeRecord {
        let spec = node.spec.as_ref();
        let mut pod_cidrs = spec.and_then(|s| s.pod_cidrs.clone()).unwrap_or_default();
        if pod_cidrs.is_empty() {
            pod_cidrs.extend(spec.and_then(|s| s.pod_cidr.clone()).filter(|c| !c.is_empty()));
        }
        let annotations = node.metadata.annotations.iter().flatten();
        NodeRecord {
            name: node.metadata.name.clone().unwrap_or_default(),
            created: node.metadata.creation_timestamp.as_ref().map_or(0, |t| t.0.as_second()),
            pod_cidrs,
            annotations: annotations
                .filter(|(k, _)| k.starts_with(&keys.prefix))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        }
    }

    fn get(&self, key: &str) -> &str {
        self.annotations.get(key).map_or("", String::as_str)
    }

    /// The node's subnets, as flanneld reads them: one or two podCIDRs, the first of each family.
    pub fn subnets(&self) -> Result<SubnetKey, PodCidrsProblem> {
        if self.pod_cidrs.len() > 2 {
            return Err(PodCidrsProblem::TooMany(self.pod_cidrs.len()));
        }
        let mut key = SubnetKey::default();
        for text in &self.pod_cidrs {
            match text.parse::<IpNet>().map(|n| n.trunc()) {
                Ok(IpNet::V4(net)) => key.v4 = key.v4.or(Some(net)),
                Ok(IpNet::V6(net)) => key.v6 = key.v6.or(Some(net)),
                Err(_) => return Err(PodCidrsProblem::NotACidr(text.clone())),
            }
        }
        Ok(key)
    }
}

/// Why a Node is not used as a peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeRefusal {
    /// flanneld does not run there (no `kube-subnet-manager: "true"`): not a peer yet, not logged.
    NotManaged,
    /// No podCIDR yet (kube-controller-manager has not allocated one).
    NoPodCidr,
    /// Its podCIDRs are not one or two CIDRs.
    PodCidrs(PodCidrsProblem),
    /// An annotation larger than any lease.
    TooLarge {
        key: String,
        bytes: usize,
    },
    Annotation {
        key: String,
        why: String,
    },
    /// Its podCIDR is also this node's or an older Node's (every other overlap is the plan's to judge).
    Overlap {
        subnet: IpNet,
        holder: String,
    },
}

impl std::fmt::Display for NodeRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NodeRefusal::NotManaged => write!(f, "not managed by flannel"),
            NodeRefusal::NoPodCidr => write!(f, "no podCIDR of an enabled family"),
            NodeRefusal::PodCidrs(why) => write!(f, "podCIDRs: {why}"),
            NodeRefusal::TooLarge { key, bytes } => {
                write!(f, "annotation {key} is {bytes} bytes, larger than any lease ({MAX_LEASE_VALUE})")
            }
            NodeRefusal::Annotation { key, why } => write!(f, "annotation {key}: {why}"),
            NodeRefusal::Overlap { subnet, holder } => write!(f, "its podCIDR {subnet} overlaps {holder}'s"),
        }
    }
}

/// A Node as a peer's lease, read as flanneld reads it (`nodeToLease`), for the families `config` enables:
/// the public address and backend data of each, the backend type.
pub fn node_lease(
    node: &NodeRecord,
    keys: &Annotations,
    config: &NetworkConfig,
) -> Result<(SubnetKey, LeaseAttrs), NodeRefusal> {
    if node.get(&keys.kube_subnet_manager) != "true" {
        return Err(NodeRefusal::NotManaged);
    }
    if let Some((key, value)) = node.annotations.iter().find(|(_, v)| v.len() > MAX_LEASE_VALUE) {
        return Err(NodeRefusal::TooLarge { key: key.clone(), bytes: value.len() });
    }
    let all = node.subnets().map_err(NodeRefusal::PodCidrs)?;
    let subnets = SubnetKey { v4: all.v4.filter(|_| config.v4.is_some()), v6: all.v6.filter(|_| config.v6.is_some()) };
    if config.v4.is_some() && subnets.v4.is_none() || config.v6.is_some() && subnets.v6.is_none() {
        return Err(NodeRefusal::NoPodCidr);
    }
    let address = |key: &str| -> Result<IpAddr, NodeRefusal> {
        let text = node.get(key);
        text.parse()
            .map_err(|_| NodeRefusal::Annotation { key: key.into(), why: format!("{text:?} is not an address") })
    };
    let data = |key: &str| -> Result<Option<LeaseData>, NodeRefusal> {
        let text = node.get(key);
        if text.is_empty() {
            return Ok(None);
        }
        let value: serde_json::Value = serde_json::from_str(text)
            .map_err(|e| NodeRefusal::Annotation { key: key.into(), why: format!("not JSON: {e}") })?;
        Ok((!value.is_null()).then(|| LeaseData::from(value)))
    };
    let mut attrs = LeaseAttrs {
        public_ip: None,
        public_ipv6: None,
        backend_type: node.get(&keys.backend_type).to_string(),
        backend_data: None,
        backend_v6_data: None,
    };
    if config.v4.is_some() {
        attrs.public_ip = match address(&keys.public_ip)? {
            IpAddr::V4(ip) => Some(ip),
            IpAddr::V6(_) => return Err(wrong_family(&keys.public_ip, Family::V4)),
        };
        attrs.backend_data = data(&keys.backend_data)?;
    }
    if config.v6.is_some() {
        attrs.public_ipv6 = match address(&keys.public_ipv6)? {
            IpAddr::V6(ip) => Some(ip),
            IpAddr::V4(_) => return Err(wrong_family(&keys.public_ipv6, Family::V6)),
        };
        attrs.backend_v6_data = data(&keys.backend_v6_data)?;
    }
    Ok((subnets, attrs))
}

fn wrong_family(key: &str, family: Family) -> NodeRefusal {
    NodeRefusal::Annotation { key: key.into(), why: format!("not an {family} address") }
}

/// The annotations this node writes, when any differs from what the Node has (flanneld's `AcquireLease`):
/// the backend type and, per family the backend announces, its data and the public address (or the
/// `public-ip-overwrite` an operator set), and `kube-subnet-manager: "true"`. None when nothing differs.
pub fn own_annotations(node: &NodeRecord, keys: &Annotations, attrs: &LeaseAttrs) -> Option<BTreeMap<String, String>> {
    let text = |data: &Option<LeaseData>| data.as_ref().map_or("null", LeaseData::text).to_string();
    let (data, v6_data) = (text(&attrs.backend_data), text(&attrs.backend_v6_data));
    // Go prints a missing IPv4 address as 0.0.0.0 (an IPv6-only lease).
    let public_ip = attrs.public_ip.unwrap_or(Ipv4Addr::UNSPECIFIED).to_string();
    let public_ipv6 = attrs.public_ipv6.map(|ip: Ipv6Addr| ip.to_string());
    let kind = attrs.backend_type.as_str();
    let differs_v4 = node.get(&keys.backend_data) != data
        || node.get(&keys.backend_type) != kind
        || node.get(&keys.public_ip) != public_ip
        || node.get(&keys.kube_subnet_manager) != "true"
        || {
            let overwrite = node.get(&keys.public_ip_overwrite);
            !overwrite.is_empty() && overwrite != public_ip
        };
    let differs_v6 = public_ipv6.as_ref().is_some_and(|v6| {
        let overwrite = node.get(&keys.public_ipv6_overwrite);
        node.get(&keys.backend_v6_data) != v6_data
            || node.get(&keys.backend_type) != kind
            || node.get(&keys.public_ipv6) != v6.as_str()
            || node.get(&keys.kube_subnet_manager) != "true"
            || (!overwrite.is_empty() && overwrite != v6.as_str())
    });
    if !differs_v4 && !differs_v6 {
        return None;
    }
    let mut wanted = BTreeMap::new();
    wanted.insert(keys.backend_type.clone(), kind.to_string());
    let overwritten = |key: &str, detected: &str| match node.get(key) {
        "" => detected.to_string(),
        overwrite => overwrite.to_string(),
    };
    if !(kind == "vxlan" && data == "null") {
        wanted.insert(keys.backend_data.clone(), data);
        wanted.insert(keys.public_ip.clone(), overwritten(&keys.public_ip_overwrite, &public_ip));
    }
    let announces_v6 = match kind {
        "vxlan" => v6_data != "null",
        "wireguard" => v6_data != "null" && public_ipv6.is_some(),
        "host-gw" | "extension" => public_ipv6.is_some(),
        _ => false,
    };
    if announces_v6 {
        wanted.insert(keys.backend_v6_data.clone(), v6_data);
        let detected = public_ipv6.unwrap_or_default();
        wanted.insert(keys.public_ipv6.clone(), overwritten(&keys.public_ipv6_overwrite, &detected));
    }
    wanted.insert(keys.kube_subnet_manager.clone(), "true".into());
    wanted.retain(|key, value| node.annotations.get(key) != Some(value));
    Some(wanted).filter(|w| !w.is_empty())
}

/// The network config with each family's subnet length taken from this node's podCIDR: in Kubernetes mode
/// kube-controller-manager's `--node-cidr-mask-size` decides it, not `SubnetLen`; a peer's podCIDR of another
/// length is refused by the plan. Fails when a podCIDR is not inside its family's Network (flanneld too).
pub fn config_for(mut config: NetworkConfig, own: &SubnetKey) -> Result<NetworkConfig> {
    for family in Family::ALL {
        let subnet = own.get(family);
        let plan = match family {
            Family::V4 => config.v4.as_mut(),
            Family::V6 => config.v6.as_mut(),
        };
        match (plan, subnet) {
            (Some(plan), Some(subnet)) => {
                if !(plan.network.contains(&subnet) && subnet.prefix_len() >= plan.network.prefix_len()) {
                    return Err(ConfigError::PodCidrOutsideNetwork { subnet, network: plan.network }.into());
                }
                plan.subnet_len = subnet.prefix_len();
                plan.subnet_min = plan.network.network();
                plan.subnet_max = plan.network.broadcast();
            }
            (Some(plan), None) => return Err(ConfigError::NoPodCidrOf { family, network: plan.network }.into()),
            (None, _) => {}
        }
    }
    Ok(config)
}

/// The own subnets of the enabled families only.
pub fn enabled(subnets: SubnetKey, config: &NetworkConfig) -> SubnetKey {
    SubnetKey {
        v4: subnets.v4.filter(|_| config.v4.is_some()).map(|n: Ipv4Net| n.trunc()),
        v6: subnets.v6.filter(|_| config.v6.is_some()).map(|n: Ipv6Net| n.trunc()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::NodeIdentity;

    fn keys() -> Annotations {
        Annotations::new(DEFAULT_PREFIX).unwrap()
    }

    fn config(text: &str) -> NetworkConfig {
        NetworkConfig::parse(text.as_bytes()).unwrap()
    }

    fn record(cidrs: &[&str], annotations: &[(&str, &str)]) -> NodeRecord {
        NodeRecord {
            name: "n1".into(),
            created: 1,
            pod_cidrs: cidrs.iter().map(|c| c.to_string()).collect(),
            annotations: annotations
                .iter()
                .map(|(k, v)| (format!("flannel.alpha.coreos.com/{k}"), v.to_string()))
                .collect(),
        }
    }

    #[test]
    fn the_prefix_follows_flanneld() {
        assert_eq!(keys().backend_data, "flannel.alpha.coreos.com/backend-data");
        assert_eq!(keys().kube_subnet_manager, "flannel.alpha.coreos.com/kube-subnet-manager");
        assert_eq!(Annotations::new("example.com/net").unwrap().public_ip, "example.com/net-public-ip");
        assert_eq!(Annotations::new("example.com/net-").unwrap().public_ip, "example.com/net-public-ip");
        assert_eq!(Annotations::new("x.Example.io").unwrap().public_ip, "x.Example.io/public-ip", "unanchored");
        for bad in ["a/b/c", "localhost", "UPPER.COM", "example.com/Net", "example..com/x", "example.com/-"] {
            assert!(Annotations::new(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_vxlan_node_writes_flanneld_s_annotations_byte_for_byte() {
        let cfg = config(r#"{"Network":"10.244.0.0/16","Backend":{"Type":"vxlan"}}"#);
        let me = NodeIdentity { public_ip: Some("192.168.50.10".parse().unwrap()), public_ipv6: None };
        let attrs = me.attrs(&cfg).unwrap();
        let node = record(&["10.244.1.0/24"], &[]);
        let wanted = own_annotations(&node, &keys(), &attrs).unwrap();
        let text: Vec<String> = wanted.iter().map(|(k, v)| format!("{k}={v}")).collect();
        assert_eq!(
            text,
            [
                r#"flannel.alpha.coreos.com/backend-data={"VNI":1,"VtepMAC":"0e:fa:c0:a8:32:0a"}"#,
                "flannel.alpha.coreos.com/backend-type=vxlan",
                "flannel.alpha.coreos.com/kube-subnet-manager=true",
                "flannel.alpha.coreos.com/public-ip=192.168.50.10",
            ]
        );
        let mut written = node.clone();
        written.annotations.extend(wanted);
        assert_eq!(own_annotations(&written, &keys(), &attrs), None, "nothing to write again");
        let (subnets, read) = node_lease(&written, &keys(), &cfg).unwrap();
        assert_eq!(subnets.to_string(), "10.244.1.0/24");
        assert_eq!(read, attrs, "read back as written");
        // Someone changes one: only that one is written back.
        written.annotations.insert(keys().public_ip, "192.168.50.99".into());
        let again = own_annotations(&written, &keys(), &attrs).unwrap();
        assert_eq!(again.into_iter().collect::<Vec<_>>(), [(keys().public_ip, "192.168.50.10".to_string())]);
    }

    #[test]
    fn dual_stack_host_gw_and_the_overwrite_annotations() {
        let cfg = config(
            r#"{"EnableIPv6":true,"Network":"10.244.0.0/16","IPv6Network":"fd00:10:244::/56","Backend":{"Type":"host-gw"}}"#,
        );
        let me = NodeIdentity {
            public_ip: Some("192.168.50.10".parse().unwrap()),
            public_ipv6: Some("fd00:50::10".parse().unwrap()),
        };
        let attrs = me.attrs(&cfg).unwrap();
        let node = record(
            &["10.244.1.0/24", "fd00:10:244:1::/64"],
            &[("public-ip-overwrite", "203.0.113.7"), ("public-ipv6-overwrite", "2001:db8::7")],
        );
        let wanted = own_annotations(&node, &keys(), &attrs).unwrap();
        let get = |k: &str| wanted.get(&format!("flannel.alpha.coreos.com/{k}")).cloned().unwrap_or_default();
        assert_eq!(get("backend-data"), "null");
        assert_eq!(get("backend-v6-data"), "null");
        assert_eq!(get("backend-type"), "host-gw");
        assert_eq!(get("public-ip"), "203.0.113.7");
        assert_eq!(get("public-ipv6"), "2001:db8::7");
        let mut written = node.clone();
        written.annotations.extend(wanted);
        let (subnets, read) = node_lease(&written, &keys(), &cfg).unwrap();
        assert_eq!(subnets.to_string(), "10.244.1.0/24 + fd00:10:244:1::/64");
        assert_eq!(read.public_ipv6, Some("2001:db8::7".parse().unwrap()));
        // flanneld rewrites while an overwrite differs from the detected address: the patch is empty then.
        assert_eq!(own_annotations(&written, &keys(), &attrs), None);
    }

    #[test]
    fn nodes_are_read_with_distrust() {
        let cfg = config(r#"{"Network":"10.244.0.0/16","Backend":{"Type":"vxlan"}}"#);
        let good = [("kube-subnet-manager", "true"), ("public-ip", "192.168.50.11"), ("backend-type", "vxlan")];
        assert!(node_lease(&record(&["10.244.2.0/24"], &good), &keys(), &cfg).is_ok());
        assert_eq!(node_lease(&record(&["10.244.2.0/24"], &[]), &keys(), &cfg), Err(NodeRefusal::NotManaged));
        assert_eq!(node_lease(&record(&[], &good), &keys(), &cfg), Err(NodeRefusal::NoPodCidr));
        assert_eq!(node_lease(&record(&["fd00::/64"], &good), &keys(), &cfg), Err(NodeRefusal::NoPodCidr));
        let three = record(&["10.244.2.0/24", "10.244.3.0/24", "fd00::/64"], &good);
        assert!(matches!(node_lease(&three, &keys(), &cfg), Err(NodeRefusal::PodCidrs(_))));
        let mut huge = record(&["10.244.2.0/24"], &good);
        huge.annotations.insert(keys().backend_data, "x".repeat(1 << 20));
        let refusal = node_lease(&huge, &keys(), &cfg).unwrap_err();
        assert!(refusal.to_string().contains("1048576 bytes"), "{refusal}");
        let mut bad_ip = record(&["10.244.2.0/24"], &good);
        bad_ip.annotations.insert(keys().public_ip, "fd00::1".into());
        assert!(matches!(node_lease(&bad_ip, &keys(), &cfg), Err(NodeRefusal::Annotation { .. })));
        let mut bad_data = record(&["10.244.2.0/24"], &good);
        bad_data.annotations.insert(keys().backend_data, "{not json".into());
        assert!(matches!(node_lease(&bad_data, &keys(), &cfg), Err(NodeRefusal::Annotation { .. })));
    }

    #[test]
    fn the_subnet_length_is_the_pod_cidr_s() {
        let cfg = config(r#"{"Network":"10.244.0.0/16","Backend":{"Type":"vxlan"}}"#);
        let own = SubnetKey::v4("10.244.0.0/25".parse().unwrap());
        let adjusted = config_for(cfg.clone(), &own).unwrap();
        let v4 = adjusted.v4.as_ref().unwrap();
        assert_eq!(v4.subnet_len, 25);
        assert!(adjusted.allows(&own), "the first block of the Network is a podCIDR too");
        let outside = SubnetKey::v4("10.9.0.0/24".parse().unwrap());
        assert!(config_for(cfg, &outside).unwrap_err().to_string().contains("not inside the Network"));
    }
}
