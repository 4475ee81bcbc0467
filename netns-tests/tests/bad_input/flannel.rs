//! The bad-input cases of flannel's meta-plugin.

use super::*;

fn flannel_subnet_files(rig: &Rig) -> PathBuf {
    let dir = rig.node.dir().join("flannel-env");
    fs::create_dir_all(dir.join("a-directory")).expect("flannel env dir");
    let valid = "FLANNEL_NETWORK=10.66.0.0/16\nFLANNEL_SUBNET=10.66.5.1/24\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n";
    let files: &[(&str, &[u8])] = &[
        ("subnet.env", valid.as_bytes()),
        ("empty.env", b""),
        ("no-subnet.env", b"FLANNEL_NETWORK=10.66.0.0/16\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n"),
        ("no-network.env", b"FLANNEL_SUBNET=10.66.5.1/24\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n"),
        ("no-mtu.env", b"FLANNEL_NETWORK=10.66.0.0/16\nFLANNEL_SUBNET=10.66.5.1/24\nFLANNEL_IPMASQ=true\n"),
        ("subnet-octet.env", b"FLANNEL_NETWORK=10.66.0.0/16\nFLANNEL_SUBNET=10.66.5.300/24\nFLANNEL_MTU=1450\n"),
        ("subnet-no-length.env", b"FLANNEL_NETWORK=10.66.0.0/16\nFLANNEL_SUBNET=10.66.5.1\nFLANNEL_MTU=1450\n"),
        ("subnet-length-33.env", b"FLANNEL_NETWORK=10.66.0.0/16\nFLANNEL_SUBNET=10.66.5.1/33\nFLANNEL_MTU=1450\n"),
        ("subnet-words.env", b"FLANNEL_NETWORK=10.66.0.0/16\nFLANNEL_SUBNET=$(reboot)\nFLANNEL_MTU=1450\n"),
        ("network-bad.env", b"FLANNEL_NETWORK=10.66.0.0/16,nope\nFLANNEL_SUBNET=10.66.5.1/24\nFLANNEL_MTU=1450\n"),
        ("ipv6-subnet-bad.env", b"FLANNEL_IPV6_NETWORK=fd66::/56\nFLANNEL_IPV6_SUBNET=fd66::g/64\nFLANNEL_MTU=1450\n"),
        ("ipv6-subnet-outside.env", b"FLANNEL_IPV6_NETWORK=fd66::/56\nFLANNEL_IPV6_SUBNET=fd67::1/64\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n"),
        ("ipv6-subnet-wider.env", b"FLANNEL_IPV6_NETWORK=fd66::/56\nFLANNEL_IPV6_SUBNET=fd66::1/48\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n"),
        ("ipv6-subnet-v4.env", b"FLANNEL_IPV6_NETWORK=fd66::/56\nFLANNEL_IPV6_SUBNET=10.66.5.1/24\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n"),
        ("ipv6-subnet-no-length.env", b"FLANNEL_IPV6_NETWORK=fd66::/56\nFLANNEL_IPV6_SUBNET=fd66::1\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n"),
        ("ipv6-subnet-length-129.env", b"FLANNEL_IPV6_NETWORK=fd66::/56\nFLANNEL_IPV6_SUBNET=fd66::1/129\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n"),
        ("ipv6-network-bad.env", b"FLANNEL_IPV6_NETWORK=fd66::/56,nope\nFLANNEL_IPV6_SUBNET=fd66::1/64\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n"),
        ("ipv6-network-v4.env", b"FLANNEL_IPV6_NETWORK=10.66.0.0/16\nFLANNEL_IPV6_SUBNET=fd66::1/64\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n"),
        ("ipv6-subnet-alone.env", b"FLANNEL_NETWORK=10.66.0.0/16\nFLANNEL_SUBNET=10.66.5.1/24\nFLANNEL_IPV6_SUBNET=fd66::1/64\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n"),
        ("ipv6-network-alone.env", b"FLANNEL_NETWORK=10.66.0.0/16\nFLANNEL_SUBNET=10.66.5.1/24\nFLANNEL_IPV6_NETWORK=fd66::/56\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n"),
        ("subnet-outside.env", b"FLANNEL_NETWORK=10.66.0.0/16\nFLANNEL_SUBNET=10.67.5.1/24\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n"),
        ("subnet-v6.env", b"FLANNEL_NETWORK=10.66.0.0/16\nFLANNEL_SUBNET=fd66::1/64\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n"),
        ("mtu-words.env", b"FLANNEL_NETWORK=10.66.0.0/16\nFLANNEL_SUBNET=10.66.5.1/24\nFLANNEL_MTU=big\n"),
        ("mtu-negative.env", b"FLANNEL_NETWORK=10.66.0.0/16\nFLANNEL_SUBNET=10.66.5.1/24\nFLANNEL_MTU=-1\n"),
        ("mtu-beyond-u32.env", b"FLANNEL_NETWORK=10.66.0.0/16\nFLANNEL_SUBNET=10.66.5.1/24\nFLANNEL_MTU=4294967296\n"),
        ("binary.env", b"\xff\xfe\x00\x01FLANNEL_SUBNET=\xff\n\x00\x00"),
    ];
    for (name, bytes) in files {
        fs::write(dir.join(name), bytes).expect("write subnet.env");
    }
    fs::write(dir.join("huge.env"), valid.repeat(100_000)).expect("write huge subnet.env");
    let fifo = dir.join("fifo.env");
    if !fifo.exists() {
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).expect("mkfifo");
    }
    dir
}

pub(crate) fn flannel_base(rig: &Rig) -> Value {
    json!({
        "cniVersion": "1.0.0",
        "name": NETWORK,
        "type": "flannel",
        "subnetFile": flannel_subnet_files(rig).join("subnet.env"),
        "dataDir": rig.state.join("flannel"),
        "ipam": {"dataDir": rig.data_dir()},
        "delegate": {"bridge": "flbad0"}
    })
}

pub(crate) fn flannel_cases(rig: &Rig) -> Vec<Case> {
    let base = flannel_base(rig);
    let env_dir = flannel_subnet_files(rig);
    let data_dir = rig.state.join("flannel");
    let add = |name: &str, key: &str, value: Value, needle: &str| {
        Case::conf(name, "ADD", &with(&base, key, value), INVALID_CONFIG).needle(needle)
    };
    let subnet_file = |name: &str, file: &str, code: u64, needle: &str| {
        Case::conf(name, "ADD", &with(&base, "subnetFile", json!(env_dir.join(file))), code).needle(needle)
    };
    let mut cases = common_cases(&base, true);
    cases.extend(prev_result_cases(&base));
    cases.extend([
        // subnet.env: where the node agent tells the node's subnet.
        subnet_file("subnetFile missing", "no-such.env", IO, "no-such.env"),
        subnet_file("subnetFile a directory", "a-directory", IO, "a-directory"),
        subnet_file("subnetFile a FIFO nobody writes", "fifo.env", IO, "fifo.env"),
        subnet_file("subnetFile of 8 MB", "huge.env", IO, "huge.env"),
        add("subnetFile /dev/zero", "subnetFile", json!("/dev/zero"), "/dev/zero").with_code(IO),
        add("subnetFile relative", "subnetFile", json!("run/flannel/subnet.env"), "subnetFile"),
        add(
            "subnetFile with ..",
            "subnetFile",
            json!(format!("{}/../flannel-env/subnet.env", env_dir.display())),
            "subnetFile",
        ),
        add("subnetFile a number", "subnetFile", json!(5), "subnetFile"),
        subnet_file("subnet.env empty", "empty.env", INVALID_CONFIG, "missing FLANNEL_NETWORK"),
        subnet_file("subnet.env without FLANNEL_SUBNET", "no-subnet.env", INVALID_CONFIG, "missing FLANNEL_SUBNET"),
        subnet_file("subnet.env without FLANNEL_NETWORK", "no-network.env", INVALID_CONFIG, "missing FLANNEL_NETWORK"),
        subnet_file("subnet.env without FLANNEL_MTU", "no-mtu.env", INVALID_CONFIG, "missing FLANNEL_MTU"),
        subnet_file("FLANNEL_SUBNET octet 300", "subnet-octet.env", INVALID_CONFIG, "FLANNEL_SUBNET"),
        subnet_file("FLANNEL_SUBNET without length", "subnet-no-length.env", INVALID_CONFIG, "FLANNEL_SUBNET"),
        subnet_file("FLANNEL_SUBNET length 33", "subnet-length-33.env", INVALID_CONFIG, "FLANNEL_SUBNET"),
        subnet_file("FLANNEL_SUBNET a command", "subnet-words.env", INVALID_CONFIG, "FLANNEL_SUBNET"),
        subnet_file("FLANNEL_NETWORK with garbage", "network-bad.env", INVALID_CONFIG, "FLANNEL_NETWORK"),
        subnet_file("FLANNEL_IPV6_SUBNET malformed", "ipv6-subnet-bad.env", INVALID_CONFIG, "FLANNEL_IPV6_SUBNET"),
        subnet_file(
            "FLANNEL_IPV6_SUBNET outside FLANNEL_IPV6_NETWORK",
            "ipv6-subnet-outside.env",
            INVALID_CONFIG,
            "FLANNEL_IPV6_SUBNET=fd67::1/64 is not inside FLANNEL_IPV6_NETWORK=fd66::/56",
        ),
        subnet_file(
            "FLANNEL_IPV6_SUBNET wider than FLANNEL_IPV6_NETWORK",
            "ipv6-subnet-wider.env",
            INVALID_CONFIG,
            "is not inside FLANNEL_IPV6_NETWORK",
        ),
        subnet_file("FLANNEL_IPV6_SUBNET an IPv4 prefix", "ipv6-subnet-v4.env", INVALID_CONFIG, "not an IPv6 prefix"),
        subnet_file(
            "FLANNEL_IPV6_SUBNET without length",
            "ipv6-subnet-no-length.env",
            INVALID_CONFIG,
            "FLANNEL_IPV6_SUBNET",
        ),
        subnet_file(
            "FLANNEL_IPV6_SUBNET length 129",
            "ipv6-subnet-length-129.env",
            INVALID_CONFIG,
            "FLANNEL_IPV6_SUBNET",
        ),
        subnet_file(
            "FLANNEL_IPV6_NETWORK with garbage",
            "ipv6-network-bad.env",
            INVALID_CONFIG,
            "FLANNEL_IPV6_NETWORK",
        ),
        subnet_file("FLANNEL_IPV6_NETWORK an IPv4 prefix", "ipv6-network-v4.env", INVALID_CONFIG, "not an IPv6 prefix"),
        subnet_file(
            "FLANNEL_IPV6_SUBNET without FLANNEL_IPV6_NETWORK",
            "ipv6-subnet-alone.env",
            INVALID_CONFIG,
            "without FLANNEL_IPV6_NETWORK",
        ),
        subnet_file(
            "FLANNEL_IPV6_NETWORK without FLANNEL_IPV6_SUBNET",
            "ipv6-network-alone.env",
            INVALID_CONFIG,
            "without FLANNEL_IPV6_SUBNET",
        ),
        subnet_file(
            "FLANNEL_SUBNET outside FLANNEL_NETWORK",
            "subnet-outside.env",
            INVALID_CONFIG,
            "is not inside FLANNEL_NETWORK",
        ),
        subnet_file("FLANNEL_SUBNET an IPv6 prefix", "subnet-v6.env", INVALID_CONFIG, "not an IPv4 prefix"),
        subnet_file("FLANNEL_MTU a word", "mtu-words.env", INVALID_CONFIG, "FLANNEL_MTU"),
        subnet_file("FLANNEL_MTU negative", "mtu-negative.env", INVALID_CONFIG, "FLANNEL_MTU"),
        subnet_file("FLANNEL_MTU beyond u32", "mtu-beyond-u32.env", INVALID_CONFIG, "FLANNEL_MTU"),
        subnet_file("subnet.env binary", "binary.env", INVALID_CONFIG, "FLANNEL_SUBNET"),
        // GC: the delegate's GC needs the config ADD would build; a broken one fails and changes nothing.
        Case::conf(
            "GC with subnetFile missing",
            "GC",
            &with_top(
                &with(&with(&base, "cniVersion", json!("1.1.0")), "subnetFile", json!(env_dir.join("no-such.env"))),
                "cni.dev/valid-attachments",
                json!([]),
            ),
            IO,
        )
        .needle("no-such.env"),
        Case::conf(
            "GC with FLANNEL_IPV6_SUBNET outside its network",
            "GC",
            &with_top(
                &with(
                    &with(&base, "cniVersion", json!("1.1.0")),
                    "subnetFile",
                    json!(env_dir.join("ipv6-subnet-outside.env")),
                ),
                "cni.dev/valid-attachments",
                json!([]),
            ),
            INVALID_CONFIG,
        )
        .needle("is not inside"),
        gc_attachments_not_a_list(&base),
        // dataDir: where the delegate's config is saved for DEL, one file per container.
        add("dataDir relative", "dataDir", json!("var/lib/cni/flannel"), "dataDir"),
        add("dataDir with ..", "dataDir", json!(format!("{}/../escaped", data_dir.display())), "dataDir"),
        add("dataDir with NUL", "dataDir", json!(format!("{}\u{0}x", data_dir.display())), "dataDir"),
        add("dataDir a list", "dataDir", json!(["/var/lib/cni"]), "dataDir"),
        add("dataDir a regular file", "dataDir", json!(rig.state.join("not-a-directory")), "not-a-directory")
            .with_code(IO),
        Case::conf("DEL with a relative dataDir", "DEL", &with(&base, "dataDir", json!("flannel")), INVALID_CONFIG)
            .needle("dataDir"),
        Case::conf(
            "DEL with a dataDir with ..",
            "DEL",
            &with(&base, "dataDir", json!(format!("{}/../escaped", data_dir.display()))),
            INVALID_CONFIG,
        )
        .needle("dataDir"),
        Case::conf("DEL of a saved config with a hostile type", "DEL", &base, INVALID_CONFIG)
            .env("CNI_CONTAINERID", Some("saved-hostile-type"))
            .needle("plugin type"),
        Case::conf("DEL of a saved config of an unknown plugin", "DEL", &base, INVALID_CONFIG)
            .env("CNI_CONTAINERID", Some("saved-unknown-type"))
            .needle("no-such-plugin"),
        // The delegate: the plugin flannel runs with the completed config.
        add("delegate a string", "delegate", json!("bridge"), "delegate"),
        add("delegate a list", "delegate", json!([{"type": "bridge"}]), "delegate"),
        add("delegate a number", "delegate", json!(1), "delegate"),
        add("delegate type a number", "delegate", json!({"type": 7}), "type"),
        add("delegate type ../x", "delegate", json!({"type": "../x"}), "plugin type"),
        add("delegate type an absolute path", "delegate", json!({"type": "/bin/sh"}), "plugin type"),
        add("delegate type ..", "delegate", json!({"type": ".."}), "plugin type"),
        add("delegate type empty", "delegate", json!({"type": ""}), "plugin type"),
        add("delegate type with newline", "delegate", json!({"type": "bridge\n"}), "plugin type"),
        add("delegate type unknown", "delegate", json!({"type": "no-such-plugin"}), "no-such-plugin"),
        add("delegate with a name", "delegate", json!({"name": "other"}), "name"),
        add("delegate with an ipam", "delegate", json!({"ipam": {"type": "host-local"}}), "ipam"),
        Case::conf("no delegate in CNI_PATH", "ADD", &base, INVALID_CONFIG)
            .env("CNI_PATH", Some("/nonexistent/cni/bin"))
            .needle("bridge"),
        // ipam and runtimeConfig: merged into the delegate's config.
        add("ipam a string", "ipam", json!("host-local"), "ipam"),
        add("ipam routes an object", "ipam/routes", json!({"dst": "0.0.0.0/0"}), "routes"),
        add("ipam routes with a bad destination", "ipam/routes", json!([{"dst": "nowhere"}]), "ipam.routes"),
        add(
            "ipam routes with a numeric gateway",
            "ipam/routes",
            json!([{"dst": "10.0.0.0/8", "gw": 7}]),
            "ipam.routes",
        ),
        add("runtimeConfig a string", "runtimeConfig", json!("portMappings"), "runtimeConfig"),
        add("runtimeConfig a list", "runtimeConfig", json!([1]), "runtimeConfig"),
    ]);
    cases
}

#[test]
fn flannel() {
    let rig = Rig::new();
    // The data directory is bookkeeping that stays once made; the cases judge the files in it. Two saved configs
    // DEL must refuse to run.
    let data_dir = rig.state.join("flannel");
    fs::create_dir_all(&data_dir).expect("flannel dataDir");
    fs::write(data_dir.join("saved-hostile-type"), r#"{"cniVersion":"1.0.0","name":"bad-net","type":"../../bin/sh"}"#)
        .expect("saved config");
    fs::write(
        data_dir.join("saved-unknown-type"),
        r#"{"cniVersion":"1.0.0","name":"bad-net","type":"no-such-plugin"}"#,
    )
    .expect("saved config");
    fs::write(rig.state.join("not-a-directory"), "").expect("a file");
    let cases = flannel_cases(&rig);
    run_group("flannel", "eth2", &rig, cases);
    // The base config is valid: flannel completes it, bridge and host-local attach eth2, DEL removes it.
    let base = flannel_base(&rig);
    let result = rig.run_plugin("flannel", "eth2", &Case::conf("valid", "ADD", &base, 0)).expect_ok().clone();
    assert_eq!(result["ips"][0]["address"], "10.66.5.2/24", "{result}");
    assert!(data_dir.join(CONTAINER_ID).exists(), "the delegate's config is saved for DEL");
    rig.run_plugin("flannel", "eth2", &Case::conf("valid", "DEL", &base, 0)).expect_ok();
    assert!(!data_dir.join(CONTAINER_ID).exists(), "DEL removes the saved config");
}
