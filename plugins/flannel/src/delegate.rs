//! The delegate's config, completed from flannel's config and the node's `subnet.env` as flannel's plugin
//! completes it (`doCmdAdd`, `getDelegateIPAM`): one host-local range per family the file names (IPv4 first),
//! a route to every cluster network of both families, the MTU and the masquerade flannel does not do.

use cnicore::spec::gojson;
use cnicore::spec::{Error, Result, Route};
use cnicore::subnet_env::SubnetEnv;
use ipnet::IpNet;
use serde_json::{json, Map, Value};

use crate::conf::Conf;

/// The delegate's config: what flannel's config gives, completed from `env`.
pub fn delegate_conf(conf: &Conf, env: &SubnetEnv) -> Result<Map<String, Value>> {
    let mut delegate = conf.delegate.clone().unwrap_or_default();
    if delegate.get("type").is_some_and(|t| !t.is_string()) {
        return Err(Error::config("'delegate' dictionary, if present, must have (string) 'type' field"));
    }
    if delegate.contains_key("name") {
        return Err(Error::config("'delegate' dictionary must not have 'name' field, it'll be set by flannel"));
    }
    if delegate.contains_key("ipam") {
        return Err(Error::config("'delegate' dictionary must not have 'ipam' field, it'll be set by flannel"));
    }
    if let Some(runtime_config) = &conf.runtime_config {
        delegate.insert("runtimeConfig".into(), Value::Object(runtime_config.clone()));
    }
    delegate.insert("name".into(), json!(conf.name));
    delegate.entry("type").or_insert(json!("bridge"));
    // flannel masquerades itself when the node agent says so; otherwise the bridge does.
    delegate.entry("ipMasq").or_insert(json!(!env.ipmasq.unwrap_or(false)));
    delegate.entry("mtu").or_insert(json!(env.mtu));
    if delegate["type"] == "bridge" {
        delegate.entry("isGateway").or_insert(json!(true));
    }
    if !conf.cni_version.is_empty() {
        delegate.insert("cniVersion".into(), json!(conf.cni_version));
    }
    let ipam = delegate_ipam(conf, env).map_err(|e| e.within("failed to assemble Delegate IPAM"))?;
    delegate.insert("ipam".into(), Value::Object(ipam));
    Ok(delegate)
}

/// The config's `ipam` (host-local unless it names another type), with the node's subnets as its ranges and
/// the cluster networks appended to its routes.
fn delegate_ipam(conf: &Conf, env: &SubnetEnv) -> Result<Map<String, Value>> {
    let mut ipam = conf.ipam.clone().unwrap_or_default();
    ipam.entry("type").or_insert(json!("host-local"));
    ipam.insert("ranges".into(), json!(node_ranges(env)));
    let mut routes = configured_routes(&ipam).map_err(|e| e.within("failed to read IPAM routes"))?;
    routes.extend(cluster_networks(env).into_iter().map(|dst| Route::new(dst, None)));
    ipam.insert("routes".into(), json!(routes));
    Ok(ipam)
}

/// One range set per family, each the node's subnet as Go's `net.ParseCIDR` gives it: the network, not the
/// node's first address that `subnet.env` holds.
fn node_ranges(env: &SubnetEnv) -> Vec<Value> {
    let v4 = env.subnet.map(|s| IpNet::V4(s.trunc()));
    let v6 = env.ipv6_subnet.map(|s| IpNet::V6(s.trunc()));
    v4.into_iter().chain(v6).map(|subnet| json!([{ "subnet": subnet.to_string() }])).collect()
}

/// The cluster networks of both families, IPv4 first, each once (flannel skips a network it already has).
fn cluster_networks(env: &SubnetEnv) -> Vec<IpNet> {
    let v4 = env.networks.iter().map(|n| IpNet::V4(n.trunc()));
    let v6 = env.ipv6_networks.iter().map(|n| IpNet::V6(n.trunc()));
    let mut networks: Vec<IpNet> = Vec::new();
    for network in v4.chain(v6) {
        if !networks.contains(&network) {
            networks.push(network);
        }
    }
    networks
}

/// `ipam.routes` as flannel reads it: a list of routes (what a route may hold, as a runtime's routes), written
/// back as flannel writes them.
fn configured_routes(ipam: &Map<String, Value>) -> Result<Vec<Route>> {
    // `ipam` is a plain map to flannel: its key is matched exactly.
    match ipam.get("routes") {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(routes @ Value::Array(_)) => {
            gojson::from_value(routes).map_err(|e| Error::config(format!("failed to parse ipam.routes: {e}")))
        }
        Some(_) => Err(Error::config("ipam.routes must be a list")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conf(value: Value) -> Conf {
        serde_json::from_value(value).unwrap()
    }

    fn env(text: &str) -> SubnetEnv {
        let env = SubnetEnv::parse(text).unwrap();
        env.check_families().unwrap();
        env
    }

    // The subnet.env files of flannel's own tests (flannel_linux_test.go).
    const V4: &str =
        "FLANNEL_NETWORK=10.1.0.0/16\nFLANNEL_SUBNET=10.1.17.1/24\nFLANNEL_MTU=1472\nFLANNEL_IPMASQ=true\n";
    const V6: &str =
        "FLANNEL_IPV6_NETWORK=fc00::/48\nFLANNEL_IPV6_SUBNET=fc00::1/64\nFLANNEL_MTU=1472\nFLANNEL_IPMASQ=true\n";
    const DUAL: &str = "FLANNEL_NETWORK=10.1.0.0/16\nFLANNEL_SUBNET=10.1.17.1/24\nFLANNEL_IPV6_NETWORK=fc00::/48\nFLANNEL_IPV6_SUBNET=fc00::1/64\nFLANNEL_MTU=1472\nFLANNEL_IPMASQ=true\n";
    const V4_TWO_NETWORKS: &str =
        "FLANNEL_NETWORK=10.1.0.0/16,192.168.0.0/16\nFLANNEL_SUBNET=10.1.17.1/24\nFLANNEL_MTU=1472\nFLANNEL_IPMASQ=true\n";

    /// flannel's test input: `{"name": "cni-flannel", "type": "flannel", "subnetFile": ..., "dataDir": ...}`.
    fn flannel_test_conf() -> Conf {
        conf(json!({ "name": "cni-flannel", "type": "flannel", "subnetFile": "/x/subnet.env", "dataDir": "/x/data" }))
    }

    /// The saved config for each kind of subnet.env equals what flannel's tests expect its plugin to save
    /// (`MatchJSON` there), and its bytes are what Go's `json.Marshal` of flannel's map writes (keys sorted).
    #[test]
    fn saved_config_for_each_kind_of_subnet_env_is_flannels() {
        let expected = |routes: Value, ranges: Value| {
            json!({ "ipMasq": false, "isGateway": true, "mtu": 1472, "name": "cni-flannel", "type": "bridge",
                    "ipam": { "routes": routes, "ranges": ranges, "type": "host-local" } })
        };
        for (text, routes, ranges) in [
            (V4, json!([{ "dst": "10.1.0.0/16" }]), json!([[{ "subnet": "10.1.17.0/24" }]])),
            (
                V4_TWO_NETWORKS,
                json!([{ "dst": "10.1.0.0/16" }, { "dst": "192.168.0.0/16" }]),
                json!([[{ "subnet": "10.1.17.0/24" }]]),
            ),
            (V6, json!([{ "dst": "fc00::/48" }]), json!([[{ "subnet": "fc00::/64" }]])),
            (
                DUAL,
                json!([{ "dst": "10.1.0.0/16" }, { "dst": "fc00::/48" }]),
                json!([[{ "subnet": "10.1.17.0/24" }], [{ "subnet": "fc00::/64" }]]),
            ),
        ] {
            let delegate = delegate_conf(&flannel_test_conf(), &env(text)).unwrap();
            assert_eq!(Value::Object(delegate), expected(routes, ranges), "{text}");
        }
        let dual = delegate_conf(&flannel_test_conf(), &env(DUAL)).unwrap();
        assert_eq!(
            serde_json::to_string(&dual).unwrap(),
            r#"{"ipMasq":false,"ipam":{"ranges":[[{"subnet":"10.1.17.0/24"}],[{"subnet":"fc00::/64"}]],"routes":[{"dst":"10.1.0.0/16"},{"dst":"fc00::/48"}],"type":"host-local"},"isGateway":true,"mtu":1472,"name":"cni-flannel","type":"bridge"}"#
        );
    }

    /// flannel's getDelegateIPAM tests: a given ipam keeps its type and unknown keys, its routes come first.
    #[test]
    fn given_ipam_is_completed_as_flannel_completes_it() {
        let routes = json!([{ "dst": "10.96.0.0/12" }, { "dst": "192.168.244.0/24", "gw": "10.1.17.20" }]);
        let with_ipam = |ipam: Value| {
            conf(json!({ "name": "cni-flannel", "type": "flannel", "subnetFile": "/x/subnet.env", "ipam": ipam }))
        };
        let given = json!({ "type": "my-ipam", "unknown-param": "unknown-value", "routes": routes });
        for (text, networks, ranges) in [
            (V4, json!([{ "dst": "10.1.0.0/16" }]), json!([[{ "subnet": "10.1.17.0/24" }]])),
            (V6, json!([{ "dst": "fc00::/48" }]), json!([[{ "subnet": "fc00::/64" }]])),
            (
                DUAL,
                json!([{ "dst": "10.1.0.0/16" }, { "dst": "fc00::/48" }]),
                json!([[{ "subnet": "10.1.17.0/24" }], [{ "subnet": "fc00::/64" }]]),
            ),
        ] {
            let ipam = delegate_conf(&with_ipam(given.clone()), &env(text)).unwrap()["ipam"].clone();
            let mut all_routes = routes.as_array().unwrap().clone();
            all_routes.extend(networks.as_array().unwrap().iter().cloned());
            assert_eq!(
                ipam,
                json!({ "type": "my-ipam", "unknown-param": "unknown-value", "routes": all_routes, "ranges": ranges }),
                "{text}"
            );
        }
        let host_local = json!({ "type": "host-local", "unknown-param": "unknown-value", "routes": [] });
        let ipam = delegate_conf(&with_ipam(host_local), &env(V4_TWO_NETWORKS)).unwrap()["ipam"].clone();
        assert_eq!(ipam["routes"], json!([{ "dst": "10.1.0.0/16" }, { "dst": "192.168.0.0/16" }]));
    }

    #[test]
    fn completes_the_delegate_as_flannel_does() {
        let c = conf(json!({ "cniVersion": "0.3.1", "name": "cbr0", "type": "flannel",
                             "delegate": { "hairpinMode": true, "isDefaultGateway": true } }));
        let delegate = delegate_conf(&c, &env(V4)).unwrap();
        assert_eq!(
            Value::Object(delegate),
            json!({
                "cniVersion": "0.3.1", "name": "cbr0", "type": "bridge", "hairpinMode": true, "isDefaultGateway": true,
                "ipMasq": false, "mtu": 1472, "isGateway": true,
                "ipam": { "type": "host-local", "ranges": [[{ "subnet": "10.1.17.0/24" }]], "routes": [{ "dst": "10.1.0.0/16" }] }
            })
        );
    }

    /// As Go's net.ParseCIDR: networks as their prefix, each once.
    #[test]
    fn cluster_networks_are_prefixes_each_once() {
        let text = "FLANNEL_NETWORK=10.1.0.0/16,10.1.2.3/16,10.2.0.0/16\nFLANNEL_SUBNET=10.1.17.1/24\nFLANNEL_IPV6_NETWORK=fc00::5/48,fc00::/48\nFLANNEL_IPV6_SUBNET=fc00::1/64\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=false\n";
        let delegate = delegate_conf(&flannel_test_conf(), &env(text)).unwrap();
        assert_eq!(
            delegate["ipam"]["routes"],
            json!([{ "dst": "10.1.0.0/16" }, { "dst": "10.2.0.0/16" }, { "dst": "fc00::/48" }])
        );
        assert_eq!(delegate["ipMasq"], json!(true), "flannel does not masquerade: the bridge does");
    }

    #[test]
    fn explicit_values_win_and_bad_delegates_are_refused() {
        let c = conf(json!({ "name": "n", "delegate": { "type": "ipvlan", "mtu": 1300, "ipMasq": true },
                             "ipam": { "routes": [{ "dst": "0.0.0.0/0" }] }, "runtimeConfig": { "portMappings": [] } }));
        let delegate = delegate_conf(&c, &env(V4)).unwrap();
        assert_eq!((delegate["mtu"].clone(), delegate["ipMasq"].clone()), (json!(1300), json!(true)));
        assert!(!delegate.contains_key("isGateway") && !delegate.contains_key("cniVersion"));
        assert_eq!(delegate["ipam"]["routes"], json!([{ "dst": "0.0.0.0/0" }, { "dst": "10.1.0.0/16" }]));
        assert_eq!(delegate["runtimeConfig"], json!({ "portMappings": [] }));
        for (bad, says) in [
            (json!({ "delegate": { "name": "x" } }), "must not have 'name'"),
            (json!({ "delegate": { "ipam": {} } }), "must not have 'ipam'"),
            (json!({ "delegate": { "type": 3 } }), "(string) 'type'"),
            (
                json!({ "ipam": { "routes": { "dst": "0.0.0.0/0" } } }),
                "failed to assemble Delegate IPAM: failed to read IPAM routes: ipam.routes must be a list",
            ),
            (
                json!({ "ipam": { "routes": [{ "dst": "nowhere" }] } }),
                "failed to assemble Delegate IPAM: failed to read IPAM routes: failed to parse ipam.routes",
            ),
            (json!({ "ipam": { "routes": [{ "dst": "10.0.0.0/8", "gw": 5 }] } }), "failed to parse ipam.routes"),
        ] {
            let mut value = bad.clone();
            value["name"] = json!("n");
            let e = delegate_conf(&conf(value), &env(V4)).unwrap_err();
            assert_eq!(e.code, cnicore::spec::codes::INVALID_CONFIG, "{bad}");
            assert!(e.msg.contains(says), "{bad}: {}", e.msg);
        }
    }
}
