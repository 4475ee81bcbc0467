//! The installer image: under podman with a host directory bind-mounted, and as a pod through containerd's CRI
//! while another pod is added by the old binaries.

use super::*;

fn image_contents(archive: &Path, scratch: &Path) -> (Value, BTreeSet<String>) {
    fs::create_dir_all(scratch).expect("scratch");
    ok(Command::new("tar").arg("-xf").arg(archive).arg("-C").arg(scratch));
    let manifest: Value = serde_json::from_slice(&fs::read(scratch.join("manifest.json")).expect("manifest")).unwrap();
    assert_eq!(manifest[0]["RepoTags"], json!([IMAGE]), "the image's name");
    let config: Value =
        serde_json::from_slice(&fs::read(scratch.join(manifest[0]["Config"].as_str().unwrap())).unwrap()).unwrap();
    let mut paths = BTreeSet::new();
    for layer in manifest[0]["Layers"].as_array().expect("layers") {
        let listing = ok(Command::new("tar").arg("-tf").arg(scratch.join(layer.as_str().unwrap())));
        paths.extend(listing.lines().map(|l| format!("/{}", l.trim_start_matches("./").trim_end_matches('/'))));
    }
    (config, paths)
}

#[test]
fn image_installs_the_plugins_under_podman() {
    if !podman::available() {
        return;
    }
    let Some(dist) = dist() else { return };
    let (node, _wan) = node_with_wan();
    let (config, paths) = image_contents(&dist.image, &node.dir().join("image"));
    assert_eq!(config["config"]["Entrypoint"], json!(["/usr/bin/cni-installer"]), "{config}");
    for plugin in &dist.plugins {
        assert!(paths.contains(&format!("/opt/cni-rs/bin/{plugin}")), "{plugin} in the image: {paths:?}");
    }
    for path in ["/usr/sbin/fabricd", "/usr/sbin/cni-netpol", "/usr/sbin/nft", "/etc/cni-rs/10-flannel.conflist"] {
        assert!(paths.contains(path), "{path} in the image");
    }
    assert!(!paths.iter().any(|p| p == "/bin/sh" || p == "/usr/bin/sh"), "no shell in the image");

    let podman = Podman::new(&node, &bin_dir());
    podman.ok(&["load", "--quiet", "--input", dist.image.to_str().unwrap()]);
    let host = node.dir().join("host");
    let bin = host.join("opt/cni/bin");
    fs::create_dir_all(&bin).expect("host bin dir");
    // The old plugins: the reference's, where it has one of ours. The old bridge is held open, as by a runtime
    // executing it: it must be replaced by rename, its content untouched.
    let old_plugins: Vec<String> =
        dist.plugins.iter().filter(|p| Path::new(REFERENCE_DIR).join(p).is_file()).cloned().collect();
    for plugin in &old_plugins {
        fs::copy(Path::new(REFERENCE_DIR).join(plugin), bin.join(plugin)).expect("copy a reference plugin");
    }
    let reference_bridge = fs::read(bin.join("bridge")).expect("old bridge");
    let old = fs::File::open(bin.join("bridge")).expect("open old bridge");
    let old_inode = old.metadata().unwrap().ino();
    let volume = format!("{}:/host", host.display());
    let installer = |podman: &Podman| {
        let mut args = vec!["run", "--rm", "--network", "none", "-v", &volume];
        args.extend_from_slice(RUN_LIMITS);
        args.push(IMAGE);
        podman.ok(&args)
    };
    // While the installer runs, every plugin is executed again and again, as runtimes would: each exec finds a
    // whole binary, old or new (never a missing, busy or half-written file).
    let done = Arc::new(AtomicBool::new(false));
    let execs = {
        let (bin, done, plugins) = (bin.clone(), done.clone(), old_plugins.clone());
        std::thread::spawn(move || {
            let (mut runs, mut failures) = (0, Vec::new());
            while !done.load(Ordering::SeqCst) {
                for plugin in &plugins {
                    let output = Command::new(bin.join(plugin)).env_clear().env("CNI_COMMAND", "VERSION").output();
                    runs += 1;
                    match output {
                        Ok(o) if o.status.success() => {}
                        Ok(o) => {
                            failures.push(format!("{plugin}: {} {}", o.status, String::from_utf8_lossy(&o.stderr)))
                        }
                        Err(e) => failures.push(format!("{plugin}: {e}")),
                    }
                }
            }
            (runs, failures)
        })
    };
    let first = installer(&podman);
    done.store(true, Ordering::SeqCst);
    let (runs, failures) = execs.join().expect("the exec thread");
    assert!(failures.is_empty(), "execs during the install failed: {failures:?}");
    eprintln!("{runs} plugin execs while the installer ran, none failed");
    assert!(first.contains(&format!("{} binaries installed, 0 unchanged", dist.plugins.len())), "{first}");
    let installed: BTreeSet<String> =
        fs::read_dir(&bin).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into()).collect();
    assert_eq!(installed, dist.plugins, "every plugin installed, no temporary file left");
    for plugin in &dist.plugins {
        let meta = fs::metadata(bin.join(plugin)).unwrap();
        assert_eq!(meta.mode() & 0o7777, 0o755, "{plugin} mode");
        assert!(is_ours(&bin.join(plugin)), "{plugin} runs on this node");
    }
    assert_ne!(fs::metadata(bin.join("bridge")).unwrap().ino(), old_inode, "bridge replaced by a new inode");
    let mut old_content = Vec::new();
    std::io::Read::read_to_end(&mut &old, &mut old_content).unwrap();
    assert!(old_content == reference_bridge, "the old bridge was never written into");
    let conflist = host.join("etc/cni/net.d/10-flannel.conflist");
    assert_eq!(fs::read(&conflist).unwrap(), fs::read(workspace().join("conf/10-flannel.conflist")).unwrap());
    assert_eq!(fs::metadata(&conflist).unwrap().mode() & 0o7777, 0o644);

    // The image's other executables start with the libraries the image has (no shell: each is the entrypoint).
    for (entrypoint, arg, expect) in [
        ("/usr/sbin/fabricd", "--help", "--etcd-endpoints"),
        ("/usr/sbin/cni-netpol", "--help", "watch"),
        ("/usr/sbin/nft", "--version", "nftables"),
    ] {
        let mut args = vec!["run", "--rm", "--network", "none", "--entrypoint", entrypoint];
        args.extend_from_slice(RUN_LIMITS);
        args.extend([IMAGE, arg]);
        let text = podman.ok(&args);
        assert!(text.contains(expect), "{entrypoint} {arg} in the image: {text}");
    }

    // Again: nothing to do, nothing touched.
    let inodes: Vec<u64> = dist.plugins.iter().map(|p| fs::metadata(bin.join(p)).unwrap().ino()).collect();
    let second = installer(&podman);
    assert!(second.contains(&format!("0 binaries installed, {} unchanged", dist.plugins.len())), "{second}");
    assert!(second.contains("unchanged"), "{second}");
    let after: Vec<u64> = dist.plugins.iter().map(|p| fs::metadata(bin.join(p)).unwrap().ino()).collect();
    assert_eq!(inodes, after, "unchanged binaries keep their inodes");
}

#[test]
fn image_installs_through_cri_while_a_pod_is_added_by_the_old_binaries() {
    if !containerd::available() {
        return;
    }
    let Some(dist) = dist() else { return };
    let (node, _wan) = node_with_wan();
    // The node's plugin directory, with the old (reference) binaries containerd runs pods with.
    let host_bin = node.dir().join("opt-cni-bin");
    fs::create_dir_all(&host_bin).expect("host bin dir");
    for entry in fs::read_dir(REFERENCE_DIR).expect("reference plugins") {
        let entry = entry.unwrap();
        fs::copy(entry.path(), host_bin.join(entry.file_name())).expect("copy a reference plugin");
    }
    let host_conf = node.dir().join("host-net.d");
    fs::create_dir_all(&host_conf).expect("host conf dir");
    let ipam_dir = node.dir().join("ipam");
    let config = ContainerdConfig {
        cni_bin_dir: host_bin.clone(),
        conflist: Some(kubenet_conflist(&ipam_dir)),
        conf_template: None,
    };
    let containerd = Containerd::start(&node, config);
    containerd.ctr(&["images", "import", dist.image.to_str().unwrap()]);
    let mut cri = Cri::connect(&containerd.socket, Duration::from_secs(20)).expect("CRI");
    wait_network_ready(&mut cri, &containerd);
    let log_dir = node.dir().join("pod-logs");
    fs::create_dir_all(&log_dir).expect("log dir");

    let fail = |what: &str, e: &dyn std::fmt::Display| -> ! {
        panic!("{what}: {e}\n{}", containerd.log_problems(10));
    };
    // A pod added through the old binaries before the install, deleted through the new ones after it.
    let web_config = pod_config("default", "web", "uid-web", &[], &[], &log_dir);
    let web = cri.run_pod_sandbox(web_config).unwrap_or_else(|e| fail("RunPodSandbox (old binaries)", &e.message()));

    // Pods added and deleted without pause on a CRI connection of their own, from before the installer starts
    // until after it exits: some ADD runs while binaries are being replaced.
    let done = Arc::new(AtomicBool::new(false));
    let churn = {
        let (socket, log_dir, done) = (containerd.socket.clone(), log_dir.clone(), done.clone());
        std::thread::spawn(move || {
            let mut cri = Cri::connect(&socket, Duration::from_secs(20)).expect("CRI");
            let mut cycles = Vec::new();
            let mut i = 0;
            while !done.load(Ordering::SeqCst) || cycles.is_empty() {
                i += 1;
                let name = format!("churn-{i}");
                let started = Instant::now();
                let result = cri
                    .run_pod_sandbox(pod_config("default", &name, &format!("uid-{name}"), &[], &[], &log_dir))
                    .and_then(|id| cri.stop_pod_sandbox(&id).and_then(|()| cri.remove_pod_sandbox(&id)))
                    .map_err(|e| format!("{name}: {}", e.message()));
                cycles.push((started, Instant::now(), result));
            }
            cycles
        })
    };
    std::thread::sleep(Duration::from_millis(200));

    // The installer as the DaemonSet runs it: host network, the node's directories as hostPaths.
    let mut sandbox = pod_config("kube-system", "cni-rs-install", "uid-install", &[], &[], &log_dir);
    // As the kubelet sends a hostNetwork pod: the node's hostname (none of its own), the node's netns.
    sandbox.hostname = String::new();
    sandbox.linux.get_or_insert_with(Default::default).security_context = Some(LinuxSandboxSecurityContext {
        namespace_options: Some(NamespaceOption { network: NamespaceMode::Node as i32, ..Default::default() }),
        ..Default::default()
    });
    let mut container = container_config("install-cni", IMAGE, &[]);
    container.mounts = vec![
        Mount {
            container_path: "/host/opt/cni/bin".into(),
            host_path: host_bin.display().to_string(),
            ..Default::default()
        },
        Mount {
            container_path: "/host/etc/cni/net.d".into(),
            host_path: host_conf.display().to_string(),
            ..Default::default()
        },
    ];
    let install_started = Instant::now();
    let pod = cri.run_pod_sandbox(sandbox.clone()).unwrap_or_else(|e| fail("RunPodSandbox (installer)", &e.message()));
    let cid = cri.create_container(&pod, container, sandbox).unwrap_or_else(|e| fail("CreateContainer", &e.message()));
    cri.start_container(&cid).unwrap_or_else(|e| fail("StartContainer", &e.message()));
    let exit = eventually(Duration::from_secs(30), || {
        let status = cri.container_status(&cid).map_err(|e| e.message().to_string())?;
        match status.state() {
            ContainerState::ContainerExited => Ok(status.exit_code),
            state => Err(format!("{state:?}")),
        }
    })
    .unwrap_or_else(|e| fail("the installer did not exit", &e));
    let installed_after = install_started.elapsed();
    let log = fs::read_to_string(log_dir.join("install-cni.log")).unwrap_or_default();
    assert_eq!(exit, 0, "the installer exits 0: {log}");

    let install_ended = Instant::now();
    done.store(true, Ordering::SeqCst);
    let cycles = churn.join().expect("the churn thread");
    let failed: Vec<&String> = cycles.iter().filter_map(|(_, _, r)| r.as_ref().err()).collect();
    assert!(failed.is_empty(), "pods added and deleted during the install: {failed:?}");
    let during = cycles.iter().filter(|(start, end, _)| *start < install_ended && *end > install_started).count();
    eprintln!(
        "{} pods added and deleted, {during} of them while the installer pod ran ({installed_after:?})",
        cycles.len()
    );
    assert!(during > 0, "a pod's ADD/DEL overlapped the install");
    let status = cri.pod_sandbox_status(&web, false).unwrap_or_else(|e| fail("PodSandboxStatus", &e.message()));
    let ip: IpAddr = pod_ips(&status).first().unwrap_or_else(|| panic!("a pod IP: {status:?}")).parse().unwrap();
    assert!(node.ping(ip), "the node reaches the pod added by the old binaries at {ip}");

    // The node's directory now holds ours (plugins the reference has and ours does not are left alone).
    for plugin in &dist.plugins {
        assert!(is_ours(&host_bin.join(plugin)), "{plugin} installed: {log}");
    }
    assert!(host_conf.join("10-flannel.conflist").is_file(), "the conflist written");

    // The first pod's DEL now runs through the new binaries, on the reference's state: it succeeds, and cleans up.
    cri.stop_pod_sandbox(&web).unwrap_or_else(|e| fail("StopPodSandbox of the other pod", &e.message()));
    cri.remove_pod_sandbox(&web).unwrap_or_else(|e| fail("RemovePodSandbox of the other pod", &e.message()));
    cri.stop_pod_sandbox(&pod).unwrap_or_else(|e| fail("StopPodSandbox (installer)", &e.message()));
    cri.remove_pod_sandbox(&pod).unwrap_or_else(|e| fail("RemovePodSandbox (installer)", &e.message()));
    assert_eq!(pod_links(&node), Vec::<String>::new(), "the other pod's veth removed");
    assert_eq!(containerd.netns_names(), Vec::<String>::new(), "pod netns removed");
}
