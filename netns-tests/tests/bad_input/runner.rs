//! The bad-input cases of the runner (cnitool).

use super::*;

fn runner_case(name: &str, args: &[&str], files: &[(&str, &[u8])], code: Option<u64>) -> Case {
    Case {
        name: name.to_string(),
        verb: "-",
        env: Vec::new(),
        stdin: Vec::new(),
        expect: Expect::Runner(code),
        needle: None,
        args: args.iter().map(|a| a.to_string()).collect(),
        files: files.iter().map(|(f, b)| (f.to_string(), b.to_vec())).collect(),
    }
}

pub(crate) fn runner_cases(rig: &Rig) -> Vec<Case> {
    let pod = rig.pod.path.display().to_string();
    let pod = pod.as_str();
    let list =
        |plugins: Value| json!({"cniVersion": "1.0.0", "name": NETWORK, "plugins": plugins}).to_string().into_bytes();
    let lo = list(json!([{"type": "loopback"}]));
    let file = |bytes: &[u8]| -> Vec<(&str, Vec<u8>)> { vec![("10-bad.conflist", bytes.to_vec())] };
    let case = |name: &str, args: &[&str], files: Vec<(&str, Vec<u8>)>, code: Option<u64>| {
        let refs: Vec<(&str, &[u8])> = files.iter().map(|(f, b)| (*f, b.as_slice())).collect();
        runner_case(name, args, &refs, code)
    };
    let add = |name: &str, bytes: &[u8], code: Option<u64>| case(name, &["add", NETWORK, pod], file(bytes), code);
    let with_list = |conf: Value| conf.to_string().into_bytes();
    let text = String::from_utf8(lo.clone()).expect("utf-8");
    let padded_plugin = json!({"type": "loopback", "pad": "x".repeat(MAX_STDIN + 10)});
    let bridge = |extra: (&str, Value)| {
        let mut b = super::bridge::bridge_base(rig);
        if let Some(o) = b.as_object_mut() {
            o.remove("cniVersion");
            o.remove("name");
        }
        b[extra.0] = extra.1;
        b
    };
    vec![
        add("conflist not JSON", b"{", None).needle("parsing"),
        add("conflist truncated", &lo[..lo.len() / 2], None).needle("parsing"),
        add("conflist a list", b"[]", None).needle("parsing"),
        add(
            "conflist without name",
            &with_list(json!({"cniVersion": "1.0.0", "plugins": [{"type": "loopback"}]})),
            None,
        ),
        add(
            "conflist name a number",
            &with_list(json!({"cniVersion": "1.0.0", "name": 5, "plugins": [{"type": "loopback"}]})),
            None,
        ),
        add(
            "conflist name ../",
            &with_list(json!({"cniVersion": "1.0.0", "name": "../x", "plugins": [{"type": "loopback"}]})),
            None,
        )
        .needle("network name"),
        add(
            "conflist name with NUL",
            &with_list(json!({"cniVersion": "1.0.0", "name": "bad\u{0}net", "plugins": [{"type": "loopback"}]})),
            None,
        )
        .needle("network name"),
        add(
            "conflist name with newline",
            &with_list(json!({"cniVersion": "1.0.0", "name": "bad\nnet", "plugins": [{"type": "loopback"}]})),
            None,
        )
        .needle("network name"),
        add("no plugins", &list(json!([])), None).needle("plugins"),
        add(
            "plugins not a list",
            &with_list(json!({"cniVersion": "1.0.0", "name": NETWORK, "plugins": {"type": "loopback"}})),
            None,
        ),
        add("plugin without type", &list(json!([{"name": "x"}])), None).needle("type"),
        add("plugin type ../", &list(json!([{"type": "../../../../bin/true"}])), None).needle("plugin type"),
        add("plugin type absolute", &list(json!([{"type": "/bin/true"}])), None).needle("plugin type"),
        add("plugin type not installed", &list(json!([{"type": "no-such-plugin"}])), None).needle("no-such-plugin"),
        add(
            "cniVersion 9.9.9",
            &with_list(json!({"cniVersion": "9.9.9", "name": NETWORK, "plugins": [{"type": "loopback"}]})),
            None,
        )
        .needle("incompatible"),
        add(
            "cniVersion a number",
            &with_list(json!({"cniVersion": 1, "name": NETWORK, "plugins": [{"type": "loopback"}]})),
            None,
        )
        .needle("cniVersion"),
        add("conflist over 1 MiB for the plugin", &list(json!([padded_plugin])), Some(DECODE)),
        add("conflist of 2 MiB of junk", &vec![b'['; 2 * MAX_STDIN], None),
        add("conflist a 100 KiB string", format!("\"{}\"", "x".repeat(100 * 1024)).as_bytes(), None),
        add("bridge refuses its mtu", &list(json!([bridge(("mtu", json!(1)))])), Some(INVALID_CONFIG)).needle("mtu"),
        add("bridge refuses its name", &list(json!([bridge(("bridge", json!("../../x")))])), Some(INVALID_CONFIG)),
        add(
            "portmap first without prevResult",
            &list(json!([{"type": "portmap", "capabilities": {"portMappings": true}}])),
            Some(INVALID_CONFIG),
        )
        .env("CAP_ARGS", Some(r#"{"portMappings":[{"hostPort":8080,"containerPort":80,"protocol":"tcp"}]}"#)),
        add(
            "bandwidth first without prevResult",
            &list(json!([{"type": "bandwidth", "ingressRate": 8000, "ingressBurst": 800}])),
            Some(INVALID_CONFIG),
        ),
        add("CAP_ARGS not JSON", &lo, None).env("CAP_ARGS", Some("{portMappings")).needle("CAP_ARGS"),
        add("CAP_ARGS a list", &lo, None).env("CAP_ARGS", Some("[1,2]")).needle("CAP_ARGS"),
        add("CNI_ARGS without =", &lo, None).env("CNI_ARGS", Some("IP")).needle("CNI_ARGS"),
        add("CNI_ARGS empty value", &lo, None).env("CNI_ARGS", Some("IP=")).needle("CNI_ARGS"),
        add("CNI_IFNAME of 16 bytes", &lo, None).env("CNI_IFNAME", Some("abcdefghijklmnop")).needle("interface name"),
        add("CNI_IFNAME ../", &lo, None).env("CNI_IFNAME", Some("../x")).needle("interface name"),
        add("CNI_IFNAME with newline", &lo, None).env("CNI_IFNAME", Some("eth\n0")).needle("interface name"),
        case(
            "pod netns that does not exist",
            &["add", NETWORK, "/run/netns/cnt-bad-input-no-such-netns"],
            file(&lo),
            Some(UNKNOWN_CONTAINER),
        ),
        case("pod netns relative and missing", &["add", NETWORK, "no/such/netns"], file(&lo), Some(UNKNOWN_CONTAINER)),
        case("network not found", &["add", "no-such-net", pod], file(&lo), None).needle("no-such-net"),
        case("network name ../ on the command line", &["add", "../10-bad", pod], file(&lo), None),
        case("conf dir missing", &["add", NETWORK, pod], vec![], None).env("NETCONFPATH", Some("/nonexistent/net.d")),
        case("CHECK at 0.3.1", &["check", NETWORK, pod], file(text.replace("1.0.0", "0.3.1").as_bytes()), None)
            .needle("CHECK"),
        case("GC --valid without ifname", &["gc", NETWORK, "--valid", "abc"], file(&lo), None).needle("valid"),
        case("GC with a hostile cache entry", &["gc", NETWORK], file(&lo), None).needle("containerID"),
        case("no verb", &[], file(&lo), None),
        case("unknown verb", &["frob", NETWORK, pod], file(&lo), None),
        case("add without netns", &["add", NETWORK], file(&lo), None),
    ]
}

/// A cache entry another runtime (or an attacker) left in the result cache, naming a container ID that would
/// escape the cache directory: GC must refuse it and delete nothing.
fn plant_hostile_cache_entry(rig: &Rig) {
    let entry = json!({
        "kind": "cniCacheV1", "containerId": "../../../etc", "ifName": "eth0", "networkName": NETWORK,
        "config": "", "netns": rig.pod.path, "result": {"cniVersion": "1.0.0"}
    });
    let results = rig.cache_dir().join("results");
    fs::create_dir_all(&results).expect("results dir");
    fs::write(results.join(format!("{NETWORK}-planted-eth0")), entry.to_string()).expect("plant cache entry");
}

#[test]
fn runner() {
    let rig = Rig::new();
    plant_hostile_cache_entry(&rig);
    let cases = runner_cases(&rig);
    run_group("cnitool", "eth0", &rig, cases);
}
