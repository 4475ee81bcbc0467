//! State files are never written through a symlink planted among them: host-local's leases, round-robin
//! position and lock, and the runner's result cache. A planted link may make a call fail or pick another
//! address; it must never change the file it points to.

use netns_tests::upstream::{clean_command, output};
use netns_tests::{bin, bin_dir, json, Node, TestNetns};
use std::fs;
use std::os::unix::fs::symlink;
use std::path::Path;

const VICTIM_TEXT: &str = "precious\n";

/// A file outside the state directories that planted links point at.
fn victim(node: &Node) -> std::path::PathBuf {
    let path = node.dir().join("victim");
    fs::write(&path, VICTIM_TEXT).expect("write victim");
    path
}

/// host-local on network `net` (subnet 10.99.0.0/29) with its data in `data_dir`.
fn host_local(node: &Node, command: &str, id: &str, data_dir: &Path, net: &str) -> netns_tests::PluginOutput {
    let conf = json!({
        "cniVersion": "1.0.0", "name": net,
        "ipam": {"type": "host-local", "dataDir": data_dir, "ranges": [[{"subnet": "10.99.0.0/29"}]]}
    });
    let mut cmd = clean_command(node, bin("host-local"));
    cmd.env("CNI_COMMAND", command)
        .env("CNI_CONTAINERID", id)
        .env("CNI_NETNS", "/proc/self/ns/net")
        .env("CNI_IFNAME", "eth0")
        .env("CNI_PATH", bin_dir());
    output(&mut cmd, conf.to_string().as_bytes())
}

#[test]
fn host_local_does_not_write_through_planted_symlinks() {
    let node = Node::new();
    let victim = victim(&node);
    let data_dir = node.dir().join("ipam");
    let net = data_dir.join("sec");
    fs::create_dir_all(&net).expect("network dir");
    // The first address the allocator would pick, the next one, and the round-robin position.
    for name in ["10.99.0.2", "10.99.0.3", "last_reserved_ip.0"] {
        symlink(&victim, net.join(name)).expect("plant symlink");
    }

    let added = host_local(&node, "ADD", "sec-a", &data_dir, "sec");
    let _ = host_local(&node, "DEL", "sec-a", &data_dir, "sec");
    assert_eq!(fs::read_to_string(&victim).expect("victim"), VICTIM_TEXT, "a planted link was written through");
    // Either the planted names were skipped, or the call failed cleanly: never an address behind a link.
    if added.success() {
        let address = added.stdout["ips"][0]["address"].as_str().unwrap_or_default().to_string();
        assert!(!address.starts_with("10.99.0.2/") && !address.starts_with("10.99.0.3/"), "got {address}");
    } else {
        assert!(added.stdout["msg"].is_string(), "no CNI error: {}", added.stdout_text);
    }

    // A planted lock file is refused rather than followed.
    let other = data_dir.join("other");
    fs::create_dir_all(&other).expect("dir");
    symlink(&victim, other.join("lock")).expect("plant lock");
    let out = host_local(&node, "ADD", "sec-b", &data_dir, "other");
    assert!(!out.success(), "ADD took a planted lock: {}", out.stdout_text);
    assert_eq!(fs::read_to_string(&victim).expect("victim"), VICTIM_TEXT);
}

#[test]
fn runner_cache_replaces_a_planted_symlink_instead_of_following_it() {
    let node = Node::new();
    let victim = victim(&node);
    let pod = TestNetns::new("secp");
    let conf_dir = node.dir().join("net.d");
    let cache = node.dir().join("cache");
    fs::create_dir_all(&conf_dir).expect("conf dir");
    fs::create_dir_all(cache.join("results")).expect("cache dir");
    fs::write(conf_dir.join("lo.conflist"), r#"{"cniVersion":"1.0.0","name":"seclo","plugins":[{"type":"loopback"}]}"#)
        .expect("conflist");

    // The cache entry of exactly this attachment, planted as a link.
    let mut add = clean_command(&node, bin("cnitool"));
    add.args(["add", "seclo", pod.path.to_str().expect("utf-8")])
        .env("NETCONFPATH", &conf_dir)
        .env("CNI_PATH", bin_dir())
        .env("CNI_CACHE_DIR", &cache)
        .env("CNI_IFNAME", "lo");
    let digest = {
        use std::io::Write;
        let mut child = std::process::Command::new("sha512sum")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("sha512sum");
        child.stdin.take().expect("stdin").write_all(pod.path.to_str().expect("utf-8").as_bytes()).expect("write");
        String::from_utf8(child.wait_with_output().expect("sha512sum").stdout).expect("hex")[..20].to_string()
    };
    let entry = cache.join("results").join(format!("seclo-cnitool-{digest}-lo"));
    symlink(&victim, &entry).expect("plant cache link");

    let out = output(&mut add, b"");
    assert!(out.success(), "add failed: {}", out.stderr);
    assert_eq!(fs::read_to_string(&victim).expect("victim"), VICTIM_TEXT, "the cache was written through a link");
    let meta = fs::symlink_metadata(&entry).expect("cache entry");
    assert!(meta.file_type().is_file(), "the planted link should have been replaced by the cache file");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
}
