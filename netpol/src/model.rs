//! What the agent reads of the cluster: Namespaces, Pods and `networking.k8s.io/v1` NetworkPolicies, as the
//! subset of their JSON that decides who may reach whom.
//!
//! The field names are the API's (camelCase), so a static file can hold objects as `kubectl get -o json` prints
//! them, and the Kubernetes watch converts k8s-openapi's objects by serializing them (the same JSON). Unknown
//! fields are ignored. Nothing here is validated: the compiler ([`crate::plan`]) judges every value and fails
//! closed on what it cannot express.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Everything the compiler needs: one consistent view of the cluster.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Cluster {
    pub namespaces: Vec<Namespace>,
    pub pods: Vec<Pod>,
    pub policies: Vec<NetworkPolicy>,
}

/// `metadata` of any object: what we read of it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Meta {
    pub name: String,
    pub namespace: String,
    pub labels: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Namespace {
    pub metadata: Meta,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Pod {
    pub metadata: Meta,
    pub spec: PodSpec,
    pub status: PodStatus,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct PodSpec {
    pub containers: Vec<Container>,
    pub host_network: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Container {
    pub ports: Vec<ContainerPort>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ContainerPort {
    pub name: Option<String>,
    pub container_port: i64,
    /// `TCP` when absent, as the API defaults it.
    pub protocol: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct PodStatus {
    pub phase: Option<String>,
    #[serde(rename = "podIPs")]
    pub pod_ips: Vec<PodIp>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct PodIp {
    pub ip: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct NetworkPolicy {
    pub metadata: Meta,
    pub spec: PolicySpec,
}

impl NetworkPolicy {
    /// `namespace/name`, as logs and provenance name it.
    pub fn id(&self) -> String {
        format!("{}/{}", self.metadata.namespace, self.metadata.name)
    }

    /// The same policy allowing nothing: the pods it selects stay isolated in the directions of its
    /// `policyTypes`, made explicit first as the API defaults them (without its `egress` the default would
    /// lose the Egress isolation).
    pub fn allowing_nothing(&self) -> NetworkPolicy {
        let types = match &self.spec.policy_types {
            Some(types) => types.clone(),
            None if self.spec.egress.is_some() => vec!["Ingress".to_string(), "Egress".to_string()],
            None => vec!["Ingress".to_string()],
        };
        let spec = PolicySpec { policy_types: Some(types), ingress: None, egress: None, ..self.spec.clone() };
        NetworkPolicy { metadata: self.metadata.clone(), spec }
    }

    /// The stand-in for a policy the agent could not read, failing closed: a `policyTypes` the compiler does
    /// not know, so that every pod of its namespace is isolated in both directions and nothing allowed.
    pub fn unreadable(namespace: &str, name: &str) -> NetworkPolicy {
        let metadata = Meta { name: name.to_string(), namespace: namespace.to_string(), ..Meta::default() };
        let policy_types = Some(vec!["(unreadable by the agent)".to_string()]);
        NetworkPolicy { metadata, spec: PolicySpec { policy_types, ..PolicySpec::default() } }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct PolicySpec {
    pub pod_selector: LabelSelector,
    /// Absent: `Ingress`, plus `Egress` when `egress` is given (the API's default).
    pub policy_types: Option<Vec<String>>,
    pub ingress: Option<Vec<IngressRule>>,
    pub egress: Option<Vec<EgressRule>>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct IngressRule {
    pub from: Option<Vec<Peer>>,
    pub ports: Option<Vec<PolicyPort>>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct EgressRule {
    pub to: Option<Vec<Peer>>,
    pub ports: Option<Vec<PolicyPort>>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Peer {
    pub pod_selector: Option<LabelSelector>,
    pub namespace_selector: Option<LabelSelector>,
    pub ip_block: Option<IpBlock>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct IpBlock {
    pub cidr: String,
    pub except: Option<Vec<String>>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct PolicyPort {
    /// `TCP` when absent.
    pub protocol: Option<String>,
    /// A number or a named container port (IntOrString); absent: every port of the protocol.
    pub port: Option<Value>,
    pub end_port: Option<i64>,
}

/// A label selector: every `matchLabels` pair and every expression must hold; empty selects everything.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct LabelSelector {
    pub match_labels: BTreeMap<String, String>,
    pub match_expressions: Vec<Requirement>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Requirement {
    pub key: String,
    pub operator: String,
    pub values: Vec<String>,
}

/// A requirement the agent cannot evaluate (an operator the API does not define, or values it forbids).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadSelector(pub String);

impl LabelSelector {
    /// True when `labels` satisfy the selector. An operator other than `In`, `NotIn`, `Exists` and
    /// `DoesNotExist` (or `In`/`NotIn` without values, `Exists` with some) is an error: the caller fails closed.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> Result<bool, BadSelector> {
        let mut all = self.match_labels.iter().all(|(k, v)| labels.get(k) == Some(v));
        for requirement in &self.match_expressions {
            let value = labels.get(&requirement.key);
            let holds = match (requirement.operator.as_str(), requirement.values.is_empty()) {
                ("In", false) => value.is_some_and(|v| requirement.values.contains(v)),
                ("NotIn", false) => value.is_none_or(|v| !requirement.values.contains(v)),
                ("Exists", true) => value.is_some(),
                ("DoesNotExist", true) => value.is_none(),
                _ => {
                    return Err(BadSelector(format!(
                        "label requirement {:?} {} {:?}",
                        requirement.key, requirement.operator, requirement.values
                    )))
                }
            };
            all &= holds;
        }
        Ok(all)
    }

    /// A selector matching exactly these labels (tests and static files).
    pub fn labels(pairs: &[(&str, &str)]) -> LabelSelector {
        LabelSelector {
            match_labels: pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            match_expressions: Vec::new(),
        }
    }
}

impl Pod {
    /// True when the pod takes part in policy: it has addresses of its own (not the node's) and may run.
    pub fn is_policy_pod(&self) -> bool {
        let finished = matches!(self.status.phase.as_deref(), Some("Succeeded") | Some("Failed"));
        !self.spec.host_network && !finished && !self.status.pod_ips.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn selectors() {
        let pod = labels(&[("pod", "a"), ("tier", "web")]);
        assert!(LabelSelector::default().matches(&pod).unwrap());
        assert!(LabelSelector::labels(&[("pod", "a")]).matches(&pod).unwrap());
        assert!(!LabelSelector::labels(&[("pod", "b")]).matches(&pod).unwrap());
        let expr = |key: &str, op: &str, values: &[&str]| LabelSelector {
            match_labels: BTreeMap::new(),
            match_expressions: vec![Requirement {
                key: key.into(),
                operator: op.into(),
                values: values.iter().map(|v| v.to_string()).collect(),
            }],
        };
        assert!(expr("pod", "In", &["a", "b"]).matches(&pod).unwrap());
        assert!(!expr("pod", "NotIn", &["a", "b"]).matches(&pod).unwrap());
        assert!(expr("missing", "NotIn", &["a"]).matches(&pod).unwrap());
        assert!(expr("tier", "Exists", &[]).matches(&pod).unwrap());
        assert!(!expr("tier", "DoesNotExist", &[]).matches(&pod).unwrap());
        assert!(expr("tier", "Gt", &["1"]).matches(&pod).is_err());
        assert!(expr("tier", "In", &[]).matches(&pod).is_err());
    }

    #[test]
    fn a_policy_allowing_nothing_keeps_its_isolations() {
        let read = |spec: &str| -> NetworkPolicy {
            serde_json::from_str(&format!(r#"{{"metadata":{{"namespace":"x","name":"p"}},"spec":{spec}}}"#)).unwrap()
        };
        let types = |policy: &NetworkPolicy| policy.allowing_nothing().spec.policy_types.unwrap();
        // The API's default: Ingress, and Egress when egress rules are given; kept when the rules go.
        assert_eq!(types(&read(r#"{"ingress":[{}]}"#)), ["Ingress"]);
        assert_eq!(types(&read(r#"{"egress":[{}]}"#)), ["Ingress", "Egress"]);
        assert_eq!(types(&read(r#"{"policyTypes":["Egress"],"egress":[{}]}"#)), ["Egress"]);
        let closed =
            read(r#"{"podSelector":{"matchLabels":{"pod":"a"}},"ingress":[{}],"egress":[{}]}"#).allowing_nothing();
        assert_eq!((&closed.spec.ingress, &closed.spec.egress), (&None, &None));
        assert_eq!(closed.spec.pod_selector, LabelSelector::labels(&[("pod", "a")]));
        assert_eq!(closed.id(), "x/p");
    }

    #[test]
    fn reads_kubectl_json() {
        let pod: Pod = serde_json::from_str(
            r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"a","namespace":"x","labels":{"pod":"a"}},
               "spec":{"containers":[{"name":"c","ports":[{"name":"serve-80-tcp","containerPort":80}]}]},
               "status":{"phase":"Running","podIP":"10.244.1.2","podIPs":[{"ip":"10.244.1.2"},{"ip":"fd00::2"}]}}"#,
        )
        .unwrap();
        assert!(pod.is_policy_pod());
        assert_eq!(pod.status.pod_ips.len(), 2);
        assert_eq!(pod.spec.containers[0].ports[0].name.as_deref(), Some("serve-80-tcp"));
        let policy: NetworkPolicy = serde_json::from_str(
            r#"{"metadata":{"name":"p","namespace":"x"},"spec":{"podSelector":{},
               "ingress":[{"from":[{"ipBlock":{"cidr":"10.0.0.0/8","except":["10.1.0.0/16"]}}],
                           "ports":[{"port":"serve-80-tcp"},{"protocol":"UDP","port":80,"endPort":81}]}]}}"#,
        )
        .unwrap();
        assert_eq!(policy.spec.policy_types, None);
        assert_eq!(policy.spec.ingress.unwrap()[0].ports.as_ref().unwrap()[1].end_port, Some(81));
    }
}
