//! The bad-input cases of host-local (through bridge).

use super::*;

pub(crate) fn host_local_base(rig: &Rig) -> Value {
    json!({
        "cniVersion": "1.0.0",
        "name": NETWORK,
        "type": "bridge",
        "ipam": {
            "type": "host-local",
            "dataDir": rig.data_dir(),
            "ranges": [[{"subnet": "10.88.0.0/24"}], [{"subnet": "fd88::/64"}]],
            "routes": [{"dst": "0.0.0.0/0"}]
        }
    })
}

pub(crate) fn host_local_cases(rig: &Rig) -> Vec<Case> {
    let base = host_local_base(rig);
    let ipam = |key: &str, value: Value| with(&base, &format!("ipam/{key}"), value);
    let ranges = |sets: Value| ipam("ranges", sets);
    let add = |name: &str, conf: Value, needle: &str| Case::conf(name, "ADD", &conf, INVALID_CONFIG).needle(needle);
    let mut cases = common_cases(&base, false);
    cases.extend([
        add("no ipam section", with(&base, "ipam", Value::Null), "ipam"),
        add("ipam a string", with(&base, "ipam", json!("host-local")), "ipam"),
        add("no ranges nor subnet", ipam("ranges", Value::Null), "range"),
        add("empty range set", ranges(json!([[]])), "range"),
        add("ranges a string", ranges(json!("10.0.0.0/24")), "ranges"),
        add("subnet not a CIDR", ranges(json!([[{"subnet": "banana"}]])), "banana"),
        add("subnet /33", ranges(json!([[{"subnet": "10.0.0.0/33"}]])), "10.0.0.0/33"),
        add("subnet with host bits", ranges(json!([[{"subnet": "10.0.0.1/24"}]])), "host bits"),
        add("subnet /31 too small", ranges(json!([[{"subnet": "10.0.0.0/31"}]])), "too small"),
        add("subnet /127 too small", ranges(json!([[{"subnet": "fd00::/127"}]])), "too small"),
        add("subnet a number", ranges(json!([[{"subnet": 10}]])), "subnet"),
        add(
            "rangeStart outside subnet",
            ranges(json!([[{"subnet": "10.0.0.0/24", "rangeStart": "10.0.1.5"}]])),
            "rangeStart",
        ),
        add(
            "rangeEnd outside subnet",
            ranges(json!([[{"subnet": "10.0.0.0/24", "rangeEnd": "10.1.0.5"}]])),
            "rangeEnd",
        ),
        add(
            "rangeStart after rangeEnd",
            ranges(json!([[{"subnet": "10.0.0.0/24", "rangeStart": "10.0.0.50", "rangeEnd": "10.0.0.20"}]])),
            "after",
        ),
        add("rangeStart not an address", ranges(json!([[{"subnet": "10.0.0.0/24", "rangeStart": "ten"}]])), "ten"),
        add(
            "gateway outside subnet",
            ranges(json!([[{"subnet": "10.0.0.0/24", "gateway": "192.168.0.1"}]])),
            "gateway",
        ),
        add(
            "gateway of the other family",
            ranges(json!([[{"subnet": "10.0.0.0/24", "gateway": "fd00::1"}]])),
            "gateway",
        ),
        add("mixed families in a set", ranges(json!([[{"subnet": "10.0.0.0/24"}, {"subnet": "fd00::/64"}]])), "famil"),
        add(
            "overlapping range sets",
            ranges(json!([[{"subnet": "10.0.0.0/16"}], [{"subnet": "10.0.3.0/24"}]])),
            "overlap",
        ),
        add(
            "overlapping ranges in a set",
            ranges(json!([[{"subnet": "10.0.0.0/24"}, {"subnet": "10.0.0.0/25"}]])),
            "overlap",
        ),
        add("relative dataDir", ipam("dataDir", json!("var/lib/cni")), "dataDir"),
        add("dataDir with NUL", ipam("dataDir", json!("/tmp/x\u{0}y")), "dataDir"),
        add("dataDir a number", ipam("dataDir", json!(5)), "dataDir"),
        add("route dst not a CIDR", ipam("routes", json!([{"dst": "default"}])), "dst"),
        add("route gw of the other family", ipam("routes", json!([{"dst": "0.0.0.0/0", "gw": "fd00::1"}])), "gw"),
        add("route without dst", ipam("routes", json!([{"gw": "10.88.0.1"}])), "dst"),
        add("runtimeConfig.ips not an IP", with(&base, "runtimeConfig", json!({"ips": ["banana"]})), "banana"),
        add("runtimeConfig.ips a string", with(&base, "runtimeConfig", json!({"ips": "10.88.0.5"})), "ips"),
        add("args.cni.ips not an IP", with(&base, "args", json!({"cni": {"ips": ["10.88.0.300"]}})), "10.88.0.300"),
        add(
            "requested IP outside every range",
            with(&base, "runtimeConfig", json!({"ips": ["192.168.9.9"]})),
            "192.168.9.9",
        ),
        add("requested IP is the gateway", with(&base, "runtimeConfig", json!({"ips": ["10.88.0.1"]})), "gateway"),
        add(
            "two requested IPs in one range set",
            with(&base, "runtimeConfig", json!({"ips": ["10.88.0.5", "10.88.0.6"]})),
            "range set",
        ),
        add(
            "runtimeConfig.ipRanges bad subnet",
            with(&base, "runtimeConfig", json!({"ipRanges": [[{"subnet": "10.0.0.0/99"}]]})),
            "10.0.0.0/99",
        ),
        Case::conf("CNI_ARGS IP not an IP", "ADD", &base, INVALID_ENV)
            .env("CNI_ARGS", Some("IP=10.88.0.999"))
            .needle("10.88.0.999"),
        Case::conf("CNI_ARGS unknown key", "ADD", &base, INVALID_ENV).env("CNI_ARGS", Some("FOO=bar")).needle("FOO"),
        Case::conf("resolvConf missing", "ADD", &ipam("resolvConf", json!("/nonexistent/resolv.conf")), IO)
            .needle("resolv"),
        Case::conf("DEL with bad ranges", "DEL", &ranges(json!([[{"subnet": "banana"}]])), INVALID_CONFIG),
        Case::conf("CHECK with bad ranges", "CHECK", &ranges(json!([[{"subnet": "banana"}]])), INVALID_CONFIG),
        Case::conf(
            "GC with bad ranges",
            "GC",
            &with(&ranges(json!([[{"subnet": "banana"}]])), "cniVersion", json!("1.1.0")),
            INVALID_CONFIG,
        ),
        gc_attachments_not_a_list(&base),
        Case::conf(
            "STATUS with a relative dataDir",
            "STATUS",
            &with(&ipam("dataDir", json!("relative")), "cniVersion", json!("1.1.0")),
            INVALID_CONFIG,
        ),
        Case::conf(
            "two v4 sets at 0.2.0",
            "ADD",
            &with(
                &ranges(json!([[{"subnet": "10.0.0.0/24"}], [{"subnet": "10.1.0.0/24"}]])),
                "cniVersion",
                json!("0.2.0"),
            ),
            INCOMPATIBLE_VERSION,
        ),
    ]);
    // Bad ranges and routes with the reference's messages, for each verb that reads them.
    let r = |ranges: Value| json!({"ranges": ranges});
    let range_cases: Vec<(&str, Value, &str)> = vec![
        ("ipam without ranges", json!({}), "no IP ranges"),
        ("ranges empty", r(json!([])), "no IP ranges"),
        ("range set empty", r(json!([[]])), "empty range set"),
        ("range without subnet", r(json!([[{}]])), "missing subnet"),
        ("subnet without length", r(json!([[{"subnet": "10.0.0.0"}]])), "not a CIDR"),
        ("subnet of length 33", r(json!([[{"subnet": "10.0.0.0/33"}]])), "not a CIDR"),
        ("subnet a word", r(json!([[{"subnet": "banana"}]])), "not a CIDR"),
        ("subnet 10.0.0.5/24", r(json!([[{"subnet": "10.0.0.5/24"}]])), "host bits"),
        ("subnet 10.0.0.0/31", r(json!([[{"subnet": "10.0.0.0/31"}]])), "too small"),
        ("subnet fd00::/127", r(json!([[{"subnet": "fd00::/127"}]])), "too small"),
        (
            "rangeStart 10.0.1.5",
            r(json!([[{"subnet": "10.0.0.0/24", "rangeStart": "10.0.1.5"}]])),
            "rangeStart 10.0.1.5 is not in subnet",
        ),
        (
            "rangeEnd 10.0.1.5",
            r(json!([[{"subnet": "10.0.0.0/24", "rangeEnd": "10.0.1.5"}]])),
            "rangeEnd 10.0.1.5 is not in subnet",
        ),
        (
            "rangeStart .9 after rangeEnd .3",
            r(json!([[{"subnet": "10.0.0.0/24", "rangeStart": "10.0.0.9", "rangeEnd": "10.0.0.3"}]])),
            "after rangeEnd",
        ),
        ("rangeStart x", r(json!([[{"subnet": "10.0.0.0/24", "rangeStart": "x"}]])), "not an IP address"),
        (
            "gateway 10.9.0.1",
            r(json!([[{"subnet": "10.0.0.0/24", "gateway": "10.9.0.1"}]])),
            "gateway 10.9.0.1 is not in subnet",
        ),
        (
            "gateway fd00::1 in a v4 range",
            r(json!([[{"subnet": "10.0.0.0/24", "gateway": "fd00::1"}]])),
            "not in subnet",
        ),
        (
            "v4 and v6 in one set",
            r(json!([[{"subnet": "10.0.0.0/24"}, {"subnet": "fd00::/64"}]])),
            "mixed address families",
        ),
        (
            "a /25 inside a /24 of one set",
            r(json!([[{"subnet": "10.0.0.0/24"}, {"subnet": "10.0.0.0/25"}]])),
            "overlap",
        ),
        (
            "a /25 inside a /24 of another set",
            r(json!([[{"subnet": "10.0.0.0/24"}], [{"subnet": "10.0.0.128/25"}]])),
            "range set 0 overlaps with range set 1",
        ),
        ("ranges a CIDR string", r(json!("10.0.0.0/24")), "invalid network config"),
        ("route dst nope", json!({"ranges": [[{"subnet": "10.0.0.0/24"}]], "routes": [{"dst": "nope"}]}), "dst"),
        (
            "route gw of the other family",
            json!({"ranges": [[{"subnet": "10.0.0.0/24"}]], "routes": [{"dst": "0.0.0.0/0", "gw": "fd00::1"}]}),
            "family",
        ),
    ];
    for (name, mut ipam, needle) in range_cases {
        ipam["type"] = json!("host-local");
        ipam["dataDir"] = json!(rig.data_dir());
        let conf = with(&base, "ipam", ipam);
        for verb in ["ADD", "DEL", "CHECK"] {
            cases.push(Case::conf(format!("{name}, {verb}"), verb, &conf, INVALID_CONFIG).needle(needle));
        }
    }
    cases.push(add("dataDir relative/dir", ipam("dataDir", json!("relative/dir")), "absolute"));
    cases
}

#[test]
fn host_local() {
    let rig = Rig::new();
    let cases = host_local_cases(&rig);
    run_group_then_valid("host-local", "eth0", &rig, cases, &host_local_base(&rig));
}
