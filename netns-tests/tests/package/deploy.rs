//! `deploy/`: the DaemonSet against the image and the binaries' flags; fabricd from the image with the
//! DaemonSet's capabilities.

use super::*;

fn yaml_documents(path: &Path) -> Vec<Value> {
    use serde::Deserialize;
    let text = fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_yaml::Deserializer::from_str(&text)
        .map(|doc| {
            let yaml = serde_yaml::Value::deserialize(doc).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            serde_json::to_value(yaml).expect("YAML as JSON")
        })
        .collect()
}

/// The `--flag` names a binary's `--help` lists.
fn help_flags(binary: &Path) -> BTreeSet<String> {
    let help = ok(Command::new(binary).arg("--help"));
    help.split(|c: char| c.is_whitespace() || c == ',' || c == '=' || c == '<' || c == '[')
        .filter(|w| w.starts_with("--") && w.len() > 2)
        .map(String::from)
        .collect()
}

/// Checks each `--flag[=value]` of `args` is a flag of `binary`; returns flag -> value.
fn check_args(binary: &str, args: &Value) -> BTreeMap<String, String> {
    let flags = help_flags(&netns_tests::bin(binary));
    let mut parsed = BTreeMap::new();
    for arg in args.as_array().unwrap_or(&Vec::new()) {
        let arg = arg.as_str().expect("args are strings");
        let (flag, value) = arg.split_once('=').unwrap_or((arg, ""));
        assert!(flags.contains(flag), "{binary} accepts {flag} (its --help: {flags:?})");
        parsed.insert(flag.to_string(), value.to_string());
    }
    parsed
}

/// The capabilities a manifest's container adds (what `podman run --cap-add` is given).
fn added_capabilities(container: &Value) -> Vec<&str> {
    let add = container["securityContext"]["capabilities"]["add"].as_array().expect("capabilities added");
    add.iter().map(|c| c.as_str().expect("a capability name")).collect()
}

/// Not privileged, every capability dropped but NET_ADMIN: what both agents need and no more.
fn assert_net_admin_only(container: &Value) {
    let security = &container["securityContext"];
    assert_eq!(security["privileged"], false, "{}", container["name"]);
    assert_eq!(security["capabilities"]["drop"], json!(["ALL"]), "{}", container["name"]);
    assert_eq!(added_capabilities(container), ["NET_ADMIN"], "{}", container["name"]);
}

#[test]
fn daemonset_matches_the_image_and_the_binaries() {
    let docs = yaml_documents(&workspace().join("deploy/cni-rs.yaml"));
    let ds = docs.iter().find(|d| d["kind"] == "DaemonSet").expect("a DaemonSet");
    let spec = &ds["spec"]["template"]["spec"];
    assert_eq!(spec["hostNetwork"], true);
    let account = spec["serviceAccountName"].as_str().expect("a service account");
    assert!(docs.iter().any(|d| d["kind"] == "ServiceAccount" && d["metadata"]["name"] == account));

    // Volumes by name, and the host path or secret each is.
    let volumes: BTreeMap<&str, &Value> =
        spec["volumes"].as_array().expect("volumes").iter().map(|v| (v["name"].as_str().unwrap(), v)).collect();
    let mount_of = |container: &Value, volume_path: &str| -> String {
        let mounts = container["volumeMounts"].as_array().expect("volumeMounts");
        let mount = mounts
            .iter()
            .find(|m| volumes[m["name"].as_str().unwrap()]["hostPath"]["path"] == volume_path)
            .unwrap_or_else(|| panic!("{} mounts the hostPath {volume_path}", container["name"]));
        mount["mountPath"].as_str().unwrap().to_string()
    };

    let init = &spec["initContainers"].as_array().expect("an init container")[0];
    assert_eq!(init["image"], IMAGE, "the image package.sh builds");
    assert!(init["command"].is_null(), "the image's entrypoint, cni-installer, runs");
    let installer = check_args("cni-installer", &init["args"]);
    let bin_dir = installer.get("--bin-dir").cloned().unwrap_or_else(|| "/host/opt/cni/bin".into());
    assert_eq!(bin_dir, mount_of(init, "/opt/cni/bin"), "--bin-dir is the node's /opt/cni/bin");
    if !installer.contains_key("--skip-conflist") {
        let conf_dir = installer.get("--conf-dir").cloned().unwrap_or_else(|| "/host/etc/cni/net.d".into());
        assert_eq!(conf_dir, mount_of(init, "/etc/cni/net.d"));
    }

    let main = &spec["containers"].as_array().expect("containers")[0];
    assert_eq!(main["image"], IMAGE);
    assert_eq!(main["command"], json!(["/usr/sbin/fabricd"]), "fabricd, where the image has it");
    let fabricd = check_args("fabricd", &main["args"]);
    assert_eq!(fabricd["--cni-conf-dir"], mount_of(main, "/etc/cni/net.d"));
    let subnet_file = Path::new(&fabricd["--subnet-file"]);
    assert_eq!(subnet_file.parent().unwrap(), Path::new(&mount_of(main, "/run/flannel")));
    // The etcd TLS files come from the Secret's mount.
    let secret_mount = main["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| volumes[m["name"].as_str().unwrap()]["secret"]["secretName"].is_string())
        .expect("a Secret mounted");
    for flag in ["--etcd-cafile", "--etcd-certfile", "--etcd-keyfile"] {
        let file = Path::new(&fabricd[flag]);
        assert_eq!(file.parent().unwrap(), Path::new(secret_mount["mountPath"].as_str().unwrap()), "{flag}");
    }
    assert_eq!(fabricd["--firewall-backend"], "nftables", "the image has nft, not iptables");
    // The metrics port is the container's port named metrics.
    let port: u64 = fabricd["--metrics-addr"].rsplit(':').next().unwrap().parse().expect("a port number");
    let ports = main["ports"].as_array().expect("ports");
    assert!(
        ports.iter().any(|p| p["name"] == "metrics" && p["containerPort"] == port),
        "metrics port {port} declared: {ports:?}"
    );
    // The capabilities it needs and no more.
    assert_net_admin_only(main);
}

#[test]
fn binaries_helper_lists_the_workspace_plugins() {
    let output = ok(Command::new("bash")
        .arg("-c")
        .arg("source scripts/lib/binaries.sh && cni_plugin_binaries")
        .current_dir(workspace()));
    let listed: BTreeSet<String> = output.lines().map(String::from).collect();
    assert_eq!(listed, workspace_plugins());
}

/// fabricd from the image as the DaemonSet runs it: the manifest's flags (static mode instead of etcd: no etcd
/// here), its capabilities and nothing more (`--cap-drop=all`, the manifest's `add`), the node's network, the
/// manifest's mount paths on the test's directories. It programs the node (its vxlan device and the route to a
/// peer through it, its nftables masquerade) and writes subnet.env and the conflist, with `/proc/sys` read-only as in a pod: the node's
/// ip_forward is set beforehand, as the manifest says.
#[test]
fn fabricd_runs_from_the_image_with_the_daemonsets_capabilities() {
    if !podman::available() {
        return;
    }
    let Some(dist) = dist() else { return };
    let docs = yaml_documents(&workspace().join("deploy/cni-rs.yaml"));
    let ds = docs.iter().find(|d| d["kind"] == "DaemonSet").expect("a DaemonSet");
    let main = &ds["spec"]["template"]["spec"]["containers"][0];
    let caps = added_capabilities(main);
    let mounts: BTreeMap<&str, &str> = main["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["name"].as_str().unwrap(), m["mountPath"].as_str().unwrap()))
        .collect();

    let (node, _wan) = node_with_wan();
    node.ip(&["link", "set", "lo", "up"]);
    let forwarding = node.exec("sysctl", &["-qw", "net.ipv4.ip_forward=1"], &[], b"");
    assert!(forwarding.status.success(), "ip_forward in the node netns");
    let podman = Podman::new(&node, &bin_dir());
    podman.ok(&["load", "--quiet", "--input", dist.image.to_str().unwrap()]);
    let (run_flannel, cni_conf) = (node.dir().join("run-flannel"), node.dir().join("net.d"));
    fs::create_dir_all(&run_flannel).unwrap();
    fs::create_dir_all(&cni_conf).unwrap();
    let static_config = node.dir().join("static.json");
    let config = json!({"Network": "10.244.0.0/16", "Backend": {"Type": "vxlan"}, "Subnet": "10.244.1.0/24",
                        "Peers": [{"Subnet": "10.244.2.0/24", "PublicIP": runtimes::WAN_IP}]});
    fs::write(&static_config, config.to_string()).unwrap();

    let volumes = [
        format!("{}:{}", run_flannel.display(), mounts["run-flannel"]),
        format!("{}:{}", cni_conf.display(), mounts["cni-conf"]),
        format!("{}:/etc/fabricd/static.json:ro", static_config.display()),
    ];
    let cap_add = caps.join(",");
    let mut args: Vec<String> = ["run", "-d", "--name", "fabricd", "--network", "host", "--cap-drop=all"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    args.push(format!("--cap-add={cap_add}"));
    for volume in &volumes {
        args.extend(["-v".to_string(), volume.clone()]);
    }
    args.extend(RUN_LIMITS.iter().map(|s| s.to_string()));
    args.extend(["--entrypoint".to_string(), main["command"][0].as_str().unwrap().to_string(), IMAGE.to_string()]);
    for arg in main["args"].as_array().unwrap() {
        let arg = arg.as_str().unwrap();
        if !arg.starts_with("--etcd-") && !arg.starts_with("--metrics-addr") {
            args.push(arg.to_string());
        }
    }
    args.extend(["--static-config=/etc/fabricd/static.json".to_string(), "--metrics-addr=".to_string()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    podman.ok(&args);

    let programmed = eventually(Duration::from_secs(20), || {
        let route = node.ip(&["route", "show", "10.244.2.0/24"]);
        let conflist = cni_conf.join("10-fabric.conflist");
        match (route.contains("dev flannel.1"), run_flannel.join("subnet.env").is_file(), conflist.is_file()) {
            (true, true, true) => Ok(()),
            state => Err(format!("route {route:?}, subnet.env and conflist present: {state:?}")),
        }
    });
    let logs = podman.run(&["logs", "fabricd"]);
    let logs = format!("{}{}", String::from_utf8_lossy(&logs.stdout), String::from_utf8_lossy(&logs.stderr));
    programmed.unwrap_or_else(|e| panic!("fabricd in the image did not program the node: {e}\nits log:\n{logs}"));
    let subnet_env = fs::read_to_string(run_flannel.join("subnet.env")).unwrap();
    assert!(subnet_env.contains("FLANNEL_SUBNET=10.244.1.1/24"), "{subnet_env}");
    assert!(node.links().iter().any(|l| l == "flannel.1"), "the vxlan device");
    let ruleset = node.exec("nft", &["list", "ruleset"], &[], b"");
    let ruleset = String::from_utf8_lossy(&ruleset.stdout).into_owned();
    assert!(
        ruleset.contains("table ip flannel-ipv4"),
        "the masquerade, in flanneld's nftables table: {ruleset}\n{logs}"
    );
    podman.ok(&["rm", "-f", "fabricd"]);
}

/// The `--flag` names of `cni-netpol SUBCOMMAND --help`.
fn netpol_flags(subcommand: &str) -> BTreeSet<String> {
    let help = ok(Command::new(netns_tests::bin("cni-netpol")).args([subcommand, "--help"]));
    help.split(|c: char| c.is_whitespace() || c == ',' || c == '=' || c == '<' || c == '[')
        .filter(|w| w.starts_with("--") && w.len() > 2)
        .map(String::from)
        .collect()
}

/// `deploy/cni-netpol.yaml`: the NetworkPolicy agent's DaemonSet runs the image's cni-netpol with flags its
/// `watch` accepts, on the node's network with NET_ADMIN only, under a service account whose role reads what
/// the agent reads and nothing more.
#[test]
fn netpol_daemonset_matches_the_image_and_the_binary() {
    let docs = yaml_documents(&workspace().join("deploy/cni-netpol.yaml"));
    let ds = docs.iter().find(|d| d["kind"] == "DaemonSet").expect("a DaemonSet");
    let spec = &ds["spec"]["template"]["spec"];
    assert_eq!(spec["hostNetwork"], true, "the node's forward hook is where pod traffic is judged");
    let account = spec["serviceAccountName"].as_str().expect("a service account");
    let namespace = ds["metadata"]["namespace"].as_str().expect("a namespace");
    assert!(docs.iter().any(|d| d["kind"] == "ServiceAccount"
        && d["metadata"]["name"] == account
        && d["metadata"]["namespace"] == namespace));
    let binding = docs.iter().find(|d| d["kind"] == "ClusterRoleBinding").expect("a ClusterRoleBinding");
    assert_eq!(binding["subjects"], json!([{"kind": "ServiceAccount", "name": account, "namespace": namespace}]));
    let role = docs
        .iter()
        .find(|d| d["kind"] == "ClusterRole" && d["metadata"]["name"] == binding["roleRef"]["name"])
        .expect("the bound ClusterRole");
    let mut granted = BTreeMap::new();
    for rule in role["rules"].as_array().expect("rules") {
        for group in rule["apiGroups"].as_array().unwrap() {
            for resource in rule["resources"].as_array().unwrap() {
                let verbs: BTreeSet<&str> =
                    rule["verbs"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
                granted.insert(format!("{}/{}", group.as_str().unwrap(), resource.as_str().unwrap()), verbs);
            }
        }
    }
    let read = BTreeSet::from(["get", "list", "watch"]);
    let want = BTreeMap::from([
        ("/pods".to_string(), read.clone()),
        ("/namespaces".to_string(), read.clone()),
        ("networking.k8s.io/networkpolicies".to_string(), read),
        ("/nodes".to_string(), BTreeSet::from(["get"])),
    ]);
    assert_eq!(granted, want, "the agent reads Pods, Namespaces, NetworkPolicies and its Node; it writes nothing");

    let main = &spec["containers"].as_array().expect("containers")[0];
    assert_eq!(main["image"], IMAGE, "the image package.sh builds");
    assert_eq!(main["command"], json!(["/usr/sbin/cni-netpol", "watch"]), "cni-netpol, where the image has it");
    let flags = netpol_flags("watch");
    let mut args = BTreeMap::new();
    for arg in main["args"].as_array().expect("args") {
        let (flag, value) = arg.as_str().unwrap().split_once('=').unwrap_or((arg.as_str().unwrap(), ""));
        assert!(flags.contains(flag), "cni-netpol watch accepts {flag} (its --help: {flags:?})");
        args.insert(flag.to_string(), value.to_string());
    }
    assert_eq!(args["--node-name"], "$(NODE_NAME)");
    assert!(!args.contains_key("--kubeconfig"), "in-cluster configuration: the service account's token");
    let env = main["env"].as_array().expect("env");
    assert!(env.iter().any(|e| e["name"] == "NODE_NAME" && e["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"));
    // Metrics on the node's address (hostNetwork: the pod's IP), the port named `metrics`, probed there.
    assert!(env.iter().any(|e| e["name"] == "POD_IP" && e["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"));
    let port = main["ports"].as_array().expect("ports").iter().find(|p| p["name"] == "metrics").expect("port metrics");
    assert_eq!(args["--metrics-addr"], format!("$(POD_IP):{}", port["containerPort"]));
    assert_eq!(main["readinessProbe"]["httpGet"], json!({"path": "/healthz", "port": "metrics"}));
    assert_net_admin_only(main);
    // The run directory (drop log, view in force) is the node's, where `cni-netpol drops` and `explain` read it.
    let run =
        main["volumeMounts"].as_array().expect("volumeMounts").iter().find(|m| m["mountPath"] == "/run/cni-netpol");
    let run = run.expect("the run directory /run/cni-netpol mounted");
    let volume =
        spec["volumes"].as_array().expect("volumes").iter().find(|v| v["name"] == run["name"]).expect("its volume");
    assert_eq!(volume["hostPath"]["path"], "/run/cni-netpol", "the node's /run/cni-netpol");
}

/// cni-netpol from the image as the DaemonSet runs it: the node's network, `--cap-drop=all` plus the
/// manifest's `add`, a read-only root, `/proc/sys` read-only as in a pod. With a cluster view from a file
/// (`run --static`: no API server here) it writes its table into the node; removed, the container leaves the
/// table in force; `cleanup` from the image removes it.
#[test]
fn netpol_runs_from_the_image_with_the_daemonsets_capabilities() {
    if !podman::available() {
        return;
    }
    let Some(dist) = dist() else { return };
    let docs = yaml_documents(&workspace().join("deploy/cni-netpol.yaml"));
    let ds = docs.iter().find(|d| d["kind"] == "DaemonSet").expect("a DaemonSet");
    let main = &ds["spec"]["template"]["spec"]["containers"][0];
    let caps = added_capabilities(main);
    let (node, _wan) = node_with_wan();
    let podman = Podman::new(&node, &bin_dir());
    podman.ok(&["load", "--quiet", "--input", dist.image.to_str().unwrap()]);
    let cluster = node.dir().join("cluster.json");
    let deny = json!({"metadata": {"namespace": "x", "name": "deny"}, "spec": {"podSelector": {}}});
    let view = json!({"namespaces": [{"metadata": {"name": "x"}}], "pods": [], "policies": [deny]});
    fs::write(&cluster, view.to_string()).unwrap();
    let in_image = |name: &str, extra: &[&str], command: &[&str]| {
        let mut args: Vec<String> =
            ["run", "--network", "host", "--cap-drop=all", "--read-only"].iter().map(|s| s.to_string()).collect();
        args.push(format!("--cap-add={}", caps.join(",")));
        args.extend(["--name".to_string(), name.to_string()]);
        args.extend(extra.iter().map(|s| s.to_string()));
        args.extend(RUN_LIMITS.iter().map(|s| s.to_string()));
        args.extend(["--entrypoint".to_string(), main["command"][0].as_str().unwrap().to_string(), IMAGE.to_string()]);
        args.extend(command.iter().map(|s| s.to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        podman.ok(&args)
    };
    let mount = format!("{}:/etc/cni-netpol/cluster.json:ro", cluster.display());
    in_image(
        "cni-netpol",
        &["-d", "-v", &mount],
        &["run", "--static", "/etc/cni-netpol/cluster.json", "--pod-cidr", "10.244.1.0/24"],
    );
    let table = || {
        let out = node.exec("nft", &["list", "table", "inet", "cni-netpol"], &[], b"");
        out.status.success().then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    };
    let written = eventually(Duration::from_secs(20), || table().ok_or(()));
    let logs = podman.run(&["logs", "cni-netpol"]);
    let logs = format!("{}{}", String::from_utf8_lossy(&logs.stdout), String::from_utf8_lossy(&logs.stderr));
    let ruleset = written.unwrap_or_else(|()| panic!("cni-netpol in the image wrote no table; its log:\n{logs}"));
    assert!(ruleset.contains("chain forward") && ruleset.contains("10.244.1.0/24"), "{ruleset}\n{logs}");
    podman.ok(&["rm", "-f", "cni-netpol"]);
    assert!(table().is_some(), "the agent stopped: its table stays in force");
    in_image("cni-netpol-cleanup", &["--rm"], &["cleanup"]);
    assert!(table().is_none(), "cleanup from the image removed the table");
}
