//! The packages: file lists, owners and modes, relations, lintian; the swap with the reference both ways in
//! a scratch root; apt's resolver.

use super::*;

#[test]
fn packages_have_the_files_modes_and_relations_operators_expect() {
    let Some(dist) = dist() else { return };
    let plugin_files = deb_files(&dist.plugins_deb);
    let bins: BTreeSet<String> = plugin_files
        .keys()
        .filter_map(|p| p.strip_prefix("/usr/lib/cni/"))
        .filter(|name| !name.is_empty())
        .map(String::from)
        .collect();
    assert_eq!(bins, dist.plugins, "/usr/lib/cni holds every plugin of the workspace, and nothing else");
    for (path, (mode, owner)) in plugin_files.iter().chain(deb_files(&dist.fabric_deb).iter()) {
        assert_eq!(owner, "root/root", "{path} owned by root");
        let executable = path.starts_with("/usr/lib/cni/")
            || ["/usr/sbin/fabricd", "/usr/sbin/cni-netpol", "/usr/bin/cnitool"].contains(&path.as_str());
        let expected = match () {
            _ if mode.starts_with('d') => "drwxr-xr-x",
            _ if executable => "-rwxr-xr-x",
            _ => "-rw-r--r--",
        };
        assert_eq!(mode, expected, "mode of {path}");
    }
    let fabric_files = deb_files(&dist.fabric_deb);
    for path in [
        "/usr/sbin/fabricd",
        "/usr/sbin/cni-netpol",
        "/usr/bin/cnitool",
        "/lib/systemd/system/fabricd.service",
        "/lib/systemd/system/cni-netpol.service",
        "/etc/default/fabricd",
        "/etc/default/cni-netpol",
        "/usr/share/doc/cni-rs-fabric/copyright",
        "/usr/share/doc/cni-rs-fabric/cni-netpol.md",
    ] {
        assert!(fabric_files.contains_key(path), "{FABRIC_PACKAGE} has {path}: {:?}", fabric_files.keys());
    }
    assert!(plugin_files.contains_key("/usr/share/doc/cni-rs-plugins/copyright"));
    // The dhcp daemon's units, where the reference package has them (a swap keeps dhcp networks working).
    for unit in ["/lib/systemd/system/cni-dhcp.service", "/lib/systemd/system/cni-dhcp.socket"] {
        assert_eq!(plugin_files.get(unit).map(|(mode, _)| mode.as_str()), Some("-rw-r--r--"), "{unit}");
    }

    // The relations that make the swap work, on the plugins package only.
    for field in ["Provides", "Conflicts", "Replaces"] {
        let value = deb_field(&dist.plugins_deb, field);
        assert!(relation_names(&value).iter().any(|n| n == REFERENCE_PACKAGE), "{field}: {value}");
        assert!(!relation_names(&deb_field(&dist.fabric_deb, field)).contains(&REFERENCE_PACKAGE.to_string()));
    }
    // Depends from dpkg-shlibdeps: libc for dynamically linked plugins, nothing for static ones.
    let depends = deb_field(&dist.plugins_deb, "Depends");
    let dynamic = dynamically_linked(&prebuilt().join("bridge"));
    assert_eq!(depends.contains("libc6 (>="), dynamic, "Depends of plugins linked dynamically: {dynamic}: {depends}");
    assert!(depends.contains("iptables"), "{depends}");
    let fabric_depends = deb_field(&dist.fabric_deb, "Depends");
    assert!(fabric_depends.contains(&format!("{PLUGINS_PACKAGE} (=")), "{fabric_depends}");
    assert_eq!(deb_field(&dist.fabric_deb, "Architecture"), deb_field(&dist.plugins_deb, "Architecture"));

    // lintian: no error (warnings are printed by package.sh). Its own TMPDIR: it leaves mldbm-* files there.
    let tmp = dist.dir.join(format!("lintian-{}", std::process::id()));
    fs::create_dir_all(&tmp).expect("lintian TMPDIR");
    let output = run(Command::new("lintian")
        .env("TMPDIR", &tmp)
        .args(["--fail-on", "error"])
        .arg(&dist.plugins_deb)
        .arg(&dist.fabric_deb));
    let _ = fs::remove_dir_all(&tmp);
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success() && !text.lines().any(|l| l.starts_with("E:")), "lintian: {text}");
}

#[test]
fn package_swaps_with_the_reference_both_ways() {
    let Some(dist) = dist() else { return };
    let root = ScratchRoot::new(
        dist.dir.join(format!("swap-{}", std::process::id())),
        &[&dist.reference_deb, &dist.plugins_deb, &dist.fabric_deb],
    );
    let reference_bridge = fs::read(Path::new(REFERENCE_DIR).join("bridge")).expect("the machine's reference bridge");

    // The reference, as Debian installs it.
    root.dpkg_ok(&["-i", dist.reference_deb.to_str().unwrap()]);
    assert!(root.installed(REFERENCE_PACKAGE), "{}", root.status(REFERENCE_PACKAGE));
    assert_eq!(fs::read(root.cni_dir().join("bridge")).unwrap(), reference_bridge, "the reference's bridge");
    let reference_files = root.cni_files();

    // Ours over it: dpkg removes the reference (Conflicts + Replaces) and installs ours.
    let text = root.dpkg_ok(&["-i", dist.plugins_deb.to_str().unwrap(), dist.fabric_deb.to_str().unwrap()]);
    assert!(!root.installed(REFERENCE_PACKAGE), "the reference removed: {text}");
    assert!(root.installed(PLUGINS_PACKAGE) && root.installed(FABRIC_PACKAGE), "{text}");
    assert_eq!(root.cni_files(), dist.plugins, "only our plugins left in /usr/lib/cni");
    for plugin in &dist.plugins {
        assert!(is_ours(&root.cni_dir().join(plugin)), "{plugin} in /usr/lib/cni is ours");
    }
    for path in [
        "usr/sbin/fabricd",
        "usr/sbin/cni-netpol",
        "usr/bin/cnitool",
        "lib/systemd/system/fabricd.service",
        "lib/systemd/system/cni-netpol.service",
        "etc/default/fabricd",
        "etc/default/cni-netpol",
    ] {
        assert!(root.dir.join(path).is_file(), "{path} installed");
    }
    let help = ok(Command::new(root.dir.join("usr/sbin/fabricd")).arg("--help"));
    assert!(help.contains("--etcd-endpoints"), "{help}");
    let help = ok(Command::new(root.dir.join("usr/sbin/cni-netpol")).args(["watch", "--help"]));
    assert!(help.contains("--node-name"), "{help}");

    // The reference cannot come back while ours is installed: dpkg refuses, nothing changes.
    let refused = root.dpkg(&["-i", dist.reference_deb.to_str().unwrap()]);
    assert!(!refused.status.success(), "installing the reference over ours is refused");
    let why = String::from_utf8_lossy(&refused.stderr);
    assert!(why.contains("conflicts"), "refused for the conflict: {why}");
    assert!(root.installed(PLUGINS_PACKAGE) && !root.installed(REFERENCE_PACKAGE));
    assert_eq!(root.cni_files(), dist.plugins);

    // Ours removed: the reference installs again, as it was.
    root.dpkg_ok(&["-r", FABRIC_PACKAGE, PLUGINS_PACKAGE]);
    assert_eq!(root.cni_files(), BTreeSet::new(), "nothing of ours left in /usr/lib/cni");
    assert!(!root.dir.join("usr/sbin/fabricd").exists() && !root.dir.join("usr/sbin/cni-netpol").exists());
    root.dpkg_ok(&["-i", dist.reference_deb.to_str().unwrap()]);
    assert!(root.installed(REFERENCE_PACKAGE));
    assert_eq!(root.cni_files(), reference_files);
    assert_eq!(fs::read(root.cni_dir().join("bridge")).unwrap(), reference_bridge);
}

/// apt's resolver on this machine's own state (the reference installed by scripts/setup.sh), in simulation only
/// (`apt-get -s` changes nothing): `apt install ./<deb>` removes the reference, nothing else, and installs ours.
#[test]
fn apt_would_swap_the_reference_for_ours() {
    let Some(dist) = dist() else { return };
    let installed = run(Command::new("dpkg-query").args(["-W", "-f", "${Status}", REFERENCE_PACKAGE]));
    if String::from_utf8_lossy(&installed.stdout) != "install ok installed" {
        daemon::require(REFERENCE_PACKAGE, false, "run scripts/setup.sh (installs Debian's reference plugins)");
        return;
    }
    let text = ok(Command::new("apt-get").args(["-s", "-q", "install"]).arg(&dist.plugins_deb).arg(&dist.fabric_deb));
    let removed: Vec<&str> = text.lines().filter(|l| l.starts_with("Remv ")).collect();
    assert_eq!(removed.len(), 1, "only the reference removed: {text}");
    assert!(removed[0].starts_with(&format!("Remv {REFERENCE_PACKAGE} ")), "{text}");
    for package in [PLUGINS_PACKAGE, FABRIC_PACKAGE] {
        assert!(text.lines().any(|l| l.starts_with(&format!("Inst {package} "))), "{package} installed: {text}");
    }
}
