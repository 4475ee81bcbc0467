//! The bad-input cases of dhcp (the IPAM plugin alone, as an interface plugin delegates to it). No daemon
//! listens on the configured socket: every case must be refused before the daemon would be asked, and the
//! valid base config fails only for want of a daemon (code 11).

use super::*;

pub(crate) fn dhcp_base(rig: &Rig) -> Value {
    json!({
        "cniVersion": "1.0.0",
        "name": NETWORK,
        "type": "macvlan",
        "ipam": {"type": "dhcp", "daemonSocketPath": rig.state.join("no-daemon.sock")}
    })
}

pub(crate) fn dhcp_cases(rig: &Rig) -> Vec<Case> {
    let base = dhcp_base(rig);
    let ipam = |key: &str, value: Value| with(&base, &format!("ipam/{key}"), value);
    let add = |name: &str, conf: Value, needle: &str| Case::conf(name, "ADD", &conf, INVALID_CONFIG).needle(needle);
    let provide = |option: Value, value: Value| ipam("provide", json!([{"option": option, "value": value}]));
    let mut cases = common_cases(&base, true);
    cases.extend([
        add("ipam a string", with(&base, "ipam", json!("dhcp")), "ipam"),
        add("daemonSocketPath a number", ipam("daemonSocketPath", json!(5)), "daemonSocketPath"),
        add("daemonSocketPath with NUL", ipam("daemonSocketPath", json!("/run/a\u{0}b")), "daemonSocketPath"),
        add(
            "daemonSocketPath of 200 bytes",
            ipam("daemonSocketPath", json!(format!("/{}", "s".repeat(199)))),
            "daemonSocketPath",
        ),
        add("provide not a list", ipam("provide", json!({"option": "host-name"})), "provide"),
        add("provide an unknown option name", provide(json!("hostname"), json!("a")), "hostname"),
        add("provide option 256", provide(json!("256"), json!("a")), "256"),
        add("provide option -1", provide(json!("-1"), json!("a")), "-1"),
        add("provide option 0x0c", provide(json!("0x0c"), json!("a")), "0x0c"),
        add("provide option empty", provide(json!(""), json!("a")), "option"),
        add("provide option a number", provide(json!(12), json!("a")), "option"),
        add("provide the message type", provide(json!("53"), json!("a")), "53"),
        add("provide the server identifier", provide(json!("54"), json!("a")), "54"),
        add("provide the end option", provide(json!("255"), json!("a")), "255"),
        add("provide a 256-byte value", provide(json!("host-name"), json!("h".repeat(256))), "too long"),
        add("provide value a number", provide(json!("host-name"), json!(5)), "value"),
        add("request an unknown option", ipam("request", json!([{"option": "routerz"}])), "routerz"),
        add("request option 300", ipam("request", json!([{"option": "300"}])), "300"),
        add("request skipDefault a string", ipam("request", json!([{"skipDefault": "yes"}])), "skipDefault"),
        add("request not a list", ipam("request", json!("routers")), "request"),
        add("priority negative", ipam("priority", json!(-1)), "priority"),
        add("priority a string", ipam("priority", json!("1")), "priority"),
        add("priority past 32 bits", ipam("priority", json!(1u64 << 33)), "priority"),
        Case::conf(
            "provide fromArg over 255 bytes",
            "ADD",
            &ipam("provide", json!([{"option": "host-name", "fromArg": "K8S_POD_NAME"}])),
            INVALID_CONFIG,
        )
        .env("CNI_ARGS", Some(&format!("K8S_POD_NAME={}", "p".repeat(300))))
        .needle("too long"),
        Case::conf("CHECK with a bad option", "CHECK", &provide(json!("x"), json!("a")), INVALID_CONFIG).needle("x"),
    ]);
    cases
}

#[test]
fn dhcp() {
    let rig = Rig::new();
    run_group("dhcp", "eth0", &rig, dhcp_cases(&rig));
    // The base config is valid: without a daemon, ADD asks to try again later and DEL succeeds.
    let add = rig.run_plugin("dhcp", "eth0", &Case::conf("valid", "ADD", &dhcp_base(&rig), 0));
    check_plugin_error(&add, 11, Some("DHCP daemon")).unwrap();
    rig.run_plugin("dhcp", "eth0", &Case::conf("valid", "DEL", &dhcp_base(&rig), 0)).expect_ok();
}
