//! The bad-input cases of static IPAM (module `static_ipam`: `static` is a Rust keyword).

use super::*;

pub(crate) fn static_base() -> Value {
    json!({"cniVersion": "1.0.0", "name": NETWORK, "type": "bridge",
        "ipam": {"type": "static", "addresses": [{"address": "10.78.0.5/24", "gateway": "10.78.0.1"}],
            "routes": [{"dst": "0.0.0.0/0"}], "dns": {"nameservers": ["10.78.0.53"]}}})
}

pub(crate) fn static_cases() -> Vec<Case> {
    let base = static_base();
    let add = |name: &str, key: &str, value: Value, needle: &str| {
        Case::conf(name, "ADD", &with(&base, key, value), INVALID_CONFIG).needle(needle)
    };
    let env = |name: &str, args: &str, needle: &str| {
        Case::conf(name, "ADD", &base, INVALID_ENV).env("CNI_ARGS", Some(args)).needle(needle)
    };
    let mut cases = common_cases(&base, false);
    cases.extend([
        add("no ipam section", "ipam", Value::Null, "ipam"),
        add("address without a prefix", "ipam/addresses", json!([{"address": "10.78.0.5"}]), "CIDR"),
        add("address missing", "ipam/addresses", json!([{"gateway": "10.78.0.1"}]), "CIDR"),
        add("address prefix 33", "ipam/addresses", json!([{"address": "10.78.0.5/33"}]), "CIDR"),
        add("address a number", "ipam/addresses", json!([{"address": 5}]), "address"),
        add("address with a zone", "ipam/addresses", json!([{"address": "fe80::1%eth0/64"}]), "CIDR"),
        add("addresses a string", "ipam/addresses", json!("10.78.0.5/24"), "addresses"),
        add(
            "gateway not an address",
            "ipam/addresses",
            json!([{"address": "10.78.0.5/24", "gateway": "gw"}]),
            "gateway",
        ),
        add(
            "gateway of the other family",
            "ipam/addresses",
            json!([{"address": "10.78.0.5/24", "gateway": "fd00::1"}]),
            "family",
        ),
        add("route dst without a prefix", "ipam/routes", json!([{"dst": "10.0.0.0"}]), "dst"),
        add("route gw not an address", "ipam/routes", json!([{"dst": "0.0.0.0/0", "gw": "x"}]), "gw"),
        add("routes an object", "ipam/routes", json!({"dst": "0.0.0.0/0"}), "routes"),
        add("dns nameservers a string", "ipam/dns", json!({"nameservers": "8.8.8.8"}), "nameservers"),
        add("args.cni.ips not CIDR", "args", json!({"cni": {"ips": ["10.78.0.9"]}}), "CIDR"),
        add("args.cni.ips a string", "args", json!({"cni": {"ips": "10.78.0.9/24"}}), "ips"),
        add("runtimeConfig.ips not CIDR", "runtimeConfig", json!({"ips": ["nope"]}), "CIDR"),
        env("CNI_ARGS IP not CIDR", "IP=10.78.0.9", "CIDR"),
        env("CNI_ARGS IP list with a bad entry", "IP=10.78.0.9/24,x", "CIDR"),
        env("CNI_ARGS GATEWAY not an address", "GATEWAY=10.78.0", "gateway"),
        env("CNI_ARGS unknown key", "FOO=1", "FOO"),
        Case::conf(
            "two IPv4 addresses at 0.2.0",
            "ADD",
            &with(&base, "cniVersion", json!("0.2.0")),
            INCOMPATIBLE_VERSION,
        )
        .env("CNI_ARGS", Some("IP=10.78.1.5/24"))
        .needle("more than 1 address"),
        Case::conf("CHECK without prevResult", "CHECK", &base, INVALID_CONFIG).needle("prevResult"),
        Case::conf(
            "CHECK with a gateway that differs",
            "CHECK",
            &with(
                &base,
                "prevResult",
                json!({"cniVersion": "1.0.0", "ips": [{"address": "10.78.0.5/24", "gateway": "10.78.0.9"}]}),
            ),
            INTERNAL,
        )
        .needle("Failed to match"),
    ]);
    cases
}

#[test]
fn static_ipam() {
    let rig = Rig::new();
    run_group("static", "eth0", &rig, static_cases());
    let valid = Case::conf("valid", "ADD", &static_base(), 0);
    rig.run_plugin("static", "eth0", &valid).expect_ok();
}
