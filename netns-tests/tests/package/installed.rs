//! podman and containerd running pods with the scratch root's `/usr/lib/cni` (ours replacing the reference) as
//! their plugin directory.

use super::*;

fn installed_tree() -> Option<&'static Path> {
    static ROOT: OnceLock<Option<ScratchRoot>> = OnceLock::new();
    ROOT.get_or_init(|| {
        let dist = dist()?;
        let root = ScratchRoot::new(dist.dir.join("installed"), &[&dist.reference_deb, &dist.plugins_deb]);
        root.dpkg_ok(&["-i", dist.reference_deb.to_str().unwrap()]);
        root.dpkg_ok(&["-i", dist.plugins_deb.to_str().unwrap()]);
        assert!(root.installed(PLUGINS_PACKAGE) && !root.installed(REFERENCE_PACKAGE));
        Some(root)
    })
    .as_ref()
    .map(|root| {
        // Leaked on purpose (statics are not dropped); the next run of this file replaces it.
        let dir: &'static Path = Box::leak(root.cni_dir().into_boxed_path());
        dir
    })
}

#[test]
fn podman_runs_a_container_on_the_installed_package() {
    if !podman::available() {
        return;
    }
    let Some(plugin_dir) = installed_tree() else { return };
    let (node, wan) = node_with_wan();
    let podman = Podman::new(&node, plugin_dir);
    let data_dir = node.dir().join("ipam");
    let conf = json!({
        "cniVersion": "0.4.0",
        "name": "cnirs",
        "plugins": [
            {"type": "bridge", "bridge": kubenet::BRIDGE, "isGateway": true, "ipMasq": true, "hairpinMode": true,
             "ipam": {"type": "host-local", "dataDir": data_dir, "routes": [{"dst": "0.0.0.0/0"}],
                      "ranges": [[{"subnet": kubenet::SUBNET_V4, "gateway": kubenet::GATEWAY_V4}]]}},
            {"type": "portmap", "capabilities": {"portMappings": true}},
            {"type": "firewall", "backend": ""},
            {"type": "tuning"}
        ]
    });
    fs::write(podman.net_dir.join("cnirs.conflist"), conf.to_string()).expect("conflist");
    let listed = podman.ok(&["network", "ls", "--format", "{{.Name}}"]);
    assert!(listed.lines().any(|l| l == "cnirs"), "podman validated the network on the installed plugins: {listed}");

    let mut args = vec!["run", "-d", "--name", "web", "-p", "8082:80", "--network", "cnirs"];
    args.extend_from_slice(RUN_LIMITS);
    args.push(BUSYBOX_IMAGE);
    args.extend_from_slice(HTTPD_COMMAND);
    podman.ok(&args);
    let inspect = podman.inspect("web");
    let ip: IpAddr = inspect["NetworkSettings"]["Networks"]["cnirs"]["IPAddress"]
        .as_str()
        .unwrap_or_else(|| panic!("container IP: {inspect}"))
        .parse()
        .expect("IP");
    let via_host_port = SocketAddr::new(NODE_IP.parse().unwrap(), 8082);
    let body = eventually(Duration::from_secs(10), || http_get(&wan, via_host_port, "/")).expect("hostPort from wan");
    assert_eq!(body, INDEX_HTML, "container {ip} served through the hostPort");
    podman.ok(&["rm", "-f", "web"]);
    assert_eq!(pod_links(&node), Vec::<String>::new(), "veth removed");
    assert_eq!(podman.netns_names(), Vec::<String>::new(), "netns removed");
}

#[test]
fn containerd_runs_a_pod_on_the_installed_package() {
    if !containerd::available() {
        return;
    }
    let Some(plugin_dir) = installed_tree() else { return };
    let (node, wan) = node_with_wan();
    let ipam_dir = node.dir().join("ipam");
    let config = ContainerdConfig {
        cni_bin_dir: plugin_dir.to_path_buf(),
        conflist: Some(kubenet_conflist(&ipam_dir)),
        conf_template: None,
    };
    let containerd = Containerd::start(&node, config);
    let mut cri = Cri::connect(&containerd.socket, Duration::from_secs(20)).expect("CRI");
    wait_network_ready(&mut cri, &containerd);
    let log_dir = node.dir().join("pod-logs");
    fs::create_dir_all(&log_dir).expect("log dir");
    let ports = [HostPort { host_port: 8083, container_port: 80, udp: false }];
    let sandbox = pod_config("default", "web", "uid-web", &ports, &[], &log_dir);
    let fail = |what: &str, e: &dyn std::fmt::Display| -> ! {
        panic!("{what}: {e}\n{}", containerd.log_problems(10));
    };
    let id = cri.run_pod_sandbox(sandbox.clone()).unwrap_or_else(|e| fail("RunPodSandbox", &e.message()));
    let status = cri.pod_sandbox_status(&id, false).unwrap_or_else(|e| fail("PodSandboxStatus", &e.message()));
    let ip: IpAddr = pod_ips(&status).first().expect("a pod IP").parse().expect("IP");
    let cid = cri
        .create_container(&id, container_config("httpd", BUSYBOX_IMAGE, HTTPD_COMMAND), sandbox)
        .unwrap_or_else(|e| fail("CreateContainer", &e.message()));
    cri.start_container(&cid).unwrap_or_else(|e| fail("StartContainer", &e.message()));
    let via_host_port = SocketAddr::new(NODE_IP.parse().unwrap(), 8083);
    let body = eventually(Duration::from_secs(10), || http_get(&wan, via_host_port, "/")).expect("hostPort from wan");
    assert_eq!(body, INDEX_HTML, "pod {ip} served through the hostPort");
    cri.stop_pod_sandbox(&id).unwrap_or_else(|e| fail("StopPodSandbox", &e.message()));
    cri.remove_pod_sandbox(&id).unwrap_or_else(|e| fail("RemovePodSandbox", &e.message()));
    assert_eq!(pod_links(&node), Vec::<String>::new(), "veth and ifb removed");
    assert_eq!(containerd.netns_names(), Vec::<String>::new(), "pod netns removed");
}
