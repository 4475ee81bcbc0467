//! The bad-input cases of tuning.

use super::*;

pub(crate) fn tuning_base(rig: &Rig) -> Value {
    json!({
        "cniVersion": "1.0.0",
        "name": NETWORK,
        "type": "tuning",
        "dataDir": rig.state.join("tuning"),
        "mtu": 1400,
        "sysctl": {"net.ipv4.conf.IFNAME.arp_filter": "1"},
        "prevResult": rig.prev_result("1.0.0")
    })
}

pub(crate) fn tuning_cases(rig: &Rig) -> Vec<Case> {
    let base = tuning_base(rig);
    let add = |name: &str, key: &str, value: Value, needle: &str| {
        Case::conf(name, "ADD", &with(&base, key, value), INVALID_CONFIG).needle(needle)
    };
    let sysctl = |name: &str, key: &str| add(name, "sysctl", json!({"net.core.somaxconn": "999", key: "1"}), "net");
    let mut cases = common_cases(&base, true);
    cases.extend(prev_result_cases(&base));
    cases.extend([
        sysctl("sysctl outside net", "kernel.hostname"),
        sysctl("sysctl leaving net by ..", "net/../kernel/hostname"),
        sysctl("sysctl leaving net by .. in dotted form", "net.ipv4/../../kernel/hostname"),
        sysctl("sysctl a path to /etc", "../../etc/passwd"),
        sysctl("sysctl net alone", "net"),
        sysctl("sysctl vm", "vm.swappiness"),
        add("sysctl twice in two spellings", "sysctl", json!({"net.core.somaxconn": "1", "net/core/somaxconn": "2"}), "twice"),
        Case::raw(
            "sysctl key duplicated",
            "ADD",
            r#"{"cniVersion":"1.0.0","name":"bad-net","type":"tuning","sysctl":{"net.core.somaxconn":"1","net.core.somaxconn":"2"}}"#,
            INVALID_CONFIG,
        )
        .needle("duplicated"),
        add("sysctl a list", "sysctl", json!(["net.core.somaxconn"]), "sysctl"),
        add("sysctl value a number", "sysctl", json!({"net.core.somaxconn": 5}), "sysctl"),
        add("mtu negative", "mtu", json!(-1), "mtu"),
        add("mtu a string", "mtu", json!("1500"), "mtu"),
        add("mtu a float", "mtu", json!(1500.5), "mtu"),
        add("txQLen negative", "txQLen", json!(-1), "txQLen"),
        add("txQLen beyond u32", "txQLen", json!(1u64 << 33), "txQLen"),
        add("mac not a MAC", "mac", json!("nope"), "MAC"),
        add("mac multicast", "mac", json!("01:00:5e:00:00:01"), "multicast"),
        add("mac all zero", "mac", json!("00:00:00:00:00:00"), "zero"),
        add("promisc a string", "promisc", json!("yes"), "promisc"),
        add("allmulti a number", "allmulti", json!(1), "allmulti"),
        add("runtimeConfig.mac a number", "runtimeConfig", json!({"mac": 5}), "mac"),
        add("args.cni.mtu negative", "args", json!({"cni": {"mtu": -5}}), "mtu"),
        add("args.cni.sysctl hostile", "args", json!({"cni": {"sysctl": {"kernel.hostname": "x"}}}), "net"),
        Case::conf("CNI_ARGS MAC not a MAC", "ADD", &base, INVALID_CONFIG).env("CNI_ARGS", Some("IgnoreUnknown=1;MAC=zz")).needle("MAC"),
        Case::conf("CNI_ARGS unknown key", "ADD", &base, INVALID_ENV).env("CNI_ARGS", Some("FOO=1")).needle("FOO"),
        add("missing prevResult", "prevResult", Value::Null, "prevResult"),
        Case::conf("pod interface missing", "ADD", &base, INTERNAL).env("CNI_IFNAME", Some("eth7")).needle("eth7"),
        add("sysctl that does not exist", "sysctl", json!({"net.ipv4.conf.IFNAME.no_such_sysctl": "1"}), "no_such_sysctl")
            .with_code(INTERNAL),
        // Changed before the MTU: the sysctl is put back when the kernel refuses the MTU.
        add("MTU the kernel refuses", "mtu", json!(70000), "MTU").with_code(INTERNAL),
        Case::conf("CHECK with a hostile key", "CHECK", &with(&base, "sysctl", json!({"kernel.hostname": "x"})), INVALID_CONFIG)
            .needle("net"),
    ]);
    cases
}

#[test]
fn tuning() {
    let rig = Rig::new();
    // The data directory is bookkeeping that stays once made (as the reference's does); the cases judge files.
    fs::create_dir_all(rig.state.join("tuning")).expect("tuning dataDir");
    // kernel.hostname is the UTS namespace's, the test process's own: the snapshots do not see it.
    let hostname = fs::read_to_string("/proc/sys/kernel/hostname").expect("hostname");
    let cases = tuning_cases(&rig);
    run_group_then_valid("tuning", "eth0", &rig, cases, &tuning_base(&rig));
    assert_eq!(fs::read_to_string("/proc/sys/kernel/hostname").expect("hostname"), hostname);
}
