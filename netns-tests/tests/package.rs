//! Issue 21: installing as operators install. `scripts/package.sh` (run once per test run, on
//! `$CNI_PACKAGE_PREBUILT`: `scripts/test.sh` sets it to the static release binaries as shipped, else the test
//! build's `target/debug`) writes the two Debian packages and the installer image; the tests here:
//!
//! - the packages: file lists, owners and modes, the relations to Debian's `containernetworking-plugins`, and
//!   lintian without an error;
//! - apt's resolver, simulating `apt install ./<deb>` on this machine (`apt-get -s`: nothing changes): the
//!   reference removed, nothing else;
//! - the swap both ways in a scratch root (`dpkg --root`, never the machine's own `/usr/lib/cni`): a dpkg
//!   database holding the packages our packages and the reference depend on (copied from the machine's), the
//!   reference installed from Debian's own .deb (`apt-get download`; its maintainer scripts run chrooted, under
//!   busybox's sh), then ours replacing it (`Conflicts` + `Replaces`), the reference refused while ours is there,
//!   ours removed and the reference installed again;
//! - podman and containerd (its CRI) running pods with the scratch root's `/usr/lib/cni` as their plugin
//!   directory; that tree is left in `target/debug/package-test/installed` for `scripts/test.sh`, which runs the
//!   whole `_ours` podman and containerd suites on it (`CNI_PLUGIN_DIR`);
//! - the image: run under podman with a host directory bind-mounted (installed, then unchanged on a second run,
//!   a binary in use replaced by rename), and as a pod through containerd's CRI with a hostPath to the plugin
//!   directory containerd itself uses, while another pod is being added through the old (reference) binaries:
//!   that pod's ADD and its DEL succeed;
//! - fabricd from the image with the DaemonSet's flags (static mode for etcd), capabilities and mount paths;
//! - `deploy/`: the DaemonSet's image is the image package.sh writes, its paths are its volumes' mounts, its
//!   flags are flags the binaries accept.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::net::{IpAddr, SocketAddr};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use cri_client::v1::{ContainerState, LinuxSandboxSecurityContext, Mount, NamespaceMode, NamespaceOption};
use cri_client::{container_config, pod_config, pod_ips, Cri, HostPort};
use netns_tests::containerd::{self, Containerd, ContainerdConfig};
use netns_tests::daemon::{self, http_get};
use netns_tests::images::{BUSYBOX, BUSYBOX_IMAGE, HTTPD_COMMAND, INDEX_HTML};
use netns_tests::podman::{self, Podman, RUN_LIMITS};
use netns_tests::runtimes::{self, eventually, node_with_wan, pod_links, NODE_IP};
use netns_tests::upstream::REFERENCE_DIR;
use netns_tests::{bin_dir, json, kubenet, Value};

/// The image's name, as package.sh tags it and the DaemonSet names it.
const IMAGE: &str = "localhost/cni-rs/installer:0.1.0";
const REFERENCE_PACKAGE: &str = "containernetworking-plugins";
const PLUGINS_PACKAGE: &str = "cni-rs-plugins";
const FABRIC_PACKAGE: &str = "cni-rs-fabric";

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").canonicalize().expect("workspace root")
}

/// What package.sh wrote, and the reference package.
struct Dist {
    plugins_deb: PathBuf,
    fabric_deb: PathBuf,
    image: PathBuf,
    reference_deb: PathBuf,
    /// The plugin binaries the workspace has (cargo metadata: bin targets of the crates under plugins/, ipam/).
    plugins: BTreeSet<String>,
    /// Where the tests of this run keep their scratch roots.
    dir: PathBuf,
}

/// The binaries packaged: `$CNI_PACKAGE_PREBUILT` (`scripts/test.sh`: the release build as shipped,
/// `target/stage`), else this test build's.
fn prebuilt() -> PathBuf {
    std::env::var_os("CNI_PACKAGE_PREBUILT").map(PathBuf::from).unwrap_or_else(bin_dir)
}

/// True if `path` is an ELF executable with a program interpreter (dynamically linked): a PT_INTERP program header.
fn dynamically_linked(path: &Path) -> bool {
    let elf = fs::read(path).expect("read ELF");
    let u16_at = |at: usize| u16::from_le_bytes([elf[at], elf[at + 1]]) as usize;
    let phoff = u64::from_le_bytes(elf[0x20..0x28].try_into().expect("e_phoff")) as usize;
    let (entry_size, count) = (u16_at(0x36), u16_at(0x38));
    const PT_INTERP: u32 = 3;
    (0..count).any(|i| {
        let at = phoff + i * entry_size;
        u32::from_le_bytes(elf[at..at + 4].try_into().expect("p_type")) == PT_INTERP
    })
}

/// True if the packaging tools are installed (else skipped, or failed under CI=true).
fn tools_available() -> bool {
    let tools = ["dpkg-deb", "dpkg-shlibdeps", "fakeroot", "jq", "strip", "lintian", "buildah", "apt-get"];
    daemon::require(
        "dpkg-dev/fakeroot/jq/binutils/lintian/buildah",
        tools.iter().all(|t| daemon::on_path(t)) && Path::new(BUSYBOX).is_file(),
        "run scripts/setup.sh",
    )
}

/// Builds the packages and the image once per test run (about 40 s on the dev binaries).
fn dist() -> Option<&'static Dist> {
    static DIST: OnceLock<Option<Dist>> = OnceLock::new();
    DIST.get_or_init(|| {
        if !tools_available() {
            return None;
        }
        let dir = bin_dir().join("package-test");
        let out = dir.join("dist");
        let _ = fs::remove_dir_all(&out);
        let started = Instant::now();
        let output = Command::new(workspace().join("scripts/package.sh"))
            .arg("--prebuilt")
            .arg(prebuilt())
            .arg("--out")
            .arg(&out)
            .output()
            .expect("run scripts/package.sh");
        assert!(
            output.status.success(),
            "scripts/package.sh failed: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        eprintln!("scripts/package.sh took {:.1} s", started.elapsed().as_secs_f64());
        let find = |prefix: &str, suffix: &str| {
            let names: Vec<PathBuf> = fs::read_dir(&out)
                .expect("dist dir")
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| {
                    let name = p.file_name().unwrap().to_string_lossy();
                    name.starts_with(prefix) && name.ends_with(suffix)
                })
                .collect();
            assert_eq!(names.len(), 1, "one {prefix}*{suffix} in {}: {names:?}", out.display());
            names[0].clone()
        };
        Some(Dist {
            plugins_deb: find("cni-rs-plugins_", ".deb"),
            fabric_deb: find("cni-rs-fabric_", ".deb"),
            image: find("cni-rs-installer_", ".tar"),
            reference_deb: reference_deb(&dir)?,
            plugins: workspace_plugins(),
            dir,
        })
    })
    .as_ref()
}

/// Debian's containernetworking-plugins .deb (downloaded once, kept in the test's build directory).
fn reference_deb(dir: &Path) -> Option<PathBuf> {
    let cache = dir.join("reference");
    fs::create_dir_all(&cache).expect("reference cache dir");
    let cached = |cache: &Path| {
        fs::read_dir(cache).ok()?.filter_map(|e| e.ok().map(|e| e.path())).find(|p| {
            let name = p.file_name().unwrap().to_string_lossy();
            name.starts_with(&format!("{REFERENCE_PACKAGE}_")) && name.ends_with(".deb")
        })
    };
    if let Some(deb) = cached(&cache) {
        return Some(deb);
    }
    let output = Command::new("apt-get")
        .args(["download", "-q", REFERENCE_PACKAGE])
        .current_dir(&cache)
        .output()
        .expect("apt-get");
    let found = cached(&cache);
    let why = format!("apt-get download {REFERENCE_PACKAGE}: {}", String::from_utf8_lossy(&output.stderr));
    if daemon::require("Debian's containernetworking-plugins .deb", found.is_some(), &why) {
        found
    } else {
        None
    }
}

/// The bin targets of the workspace crates under plugins/ and ipam/, read from cargo metadata here (not from
/// scripts/lib/binaries.sh, which this checks).
fn workspace_plugins() -> BTreeSet<String> {
    let output = Command::new("cargo")
        .args(["metadata", "--no-deps", "--format-version", "1", "--offline", "--manifest-path"])
        .arg(workspace().join("Cargo.toml"))
        .output()
        .expect("cargo metadata");
    assert!(output.status.success(), "cargo metadata: {}", String::from_utf8_lossy(&output.stderr));
    let meta: Value = serde_json::from_slice(&output.stdout).expect("metadata json");
    let root = workspace();
    let mut plugins = BTreeSet::new();
    for package in meta["packages"].as_array().expect("packages") {
        let manifest = PathBuf::from(package["manifest_path"].as_str().expect("manifest_path"));
        let relative = manifest.strip_prefix(&root).expect("a workspace member");
        if !(relative.starts_with("plugins") || relative.starts_with("ipam")) {
            continue;
        }
        for target in package["targets"].as_array().expect("targets") {
            if target["kind"].as_array().expect("kind").iter().any(|k| k == "bin") {
                plugins.insert(target["name"].as_str().expect("name").to_string());
            }
        }
    }
    assert!(plugins.contains("bridge") && plugins.contains("host-local"), "{plugins:?}");
    plugins
}

fn run(command: &mut Command) -> Output {
    command.output().unwrap_or_else(|e| panic!("run {command:?}: {e}"))
}

fn ok(command: &mut Command) -> String {
    let output = run(command);
    assert!(
        output.status.success(),
        "{command:?} failed: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn deb_field(deb: &Path, field: &str) -> String {
    ok(Command::new("dpkg-deb").arg("-f").arg(deb).arg(field)).trim().to_string()
}

/// `dpkg-deb -c`: path -> (mode string, owner/group).
fn deb_files(deb: &Path) -> BTreeMap<String, (String, String)> {
    ok(Command::new("dpkg-deb").arg("-c").arg(deb))
        .lines()
        .map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let path = fields[5].trim_start_matches('.').to_string();
            (path, (fields[0].to_string(), fields[1].to_string()))
        })
        .collect()
}

/// The package names in a Depends-like field (alternatives included, versions dropped).
fn relation_names(field: &str) -> Vec<String> {
    field
        .split([',', '|'])
        .filter_map(|part| part.split_whitespace().next())
        .map(|name| name.split(':').next().unwrap_or(name).to_string())
        .filter(|name| !name.is_empty())
        .collect()
}

/// A directory that dpkg treats as a system's root (`dpkg --root`): its own dpkg database, holding the
/// packages installed on this machine that the packages under test depend on (stanzas copied from the
/// machine's database, no files), busybox as `/bin/sh` for the reference's maintainer scripts. Removed on drop.
struct ScratchRoot {
    dir: PathBuf,
}

impl ScratchRoot {
    fn new(dir: PathBuf, debs: &[&Path]) -> ScratchRoot {
        let _ = fs::remove_dir_all(&dir);
        let admin = dir.join("var/lib/dpkg");
        for d in ["info", "updates", "triggers"] {
            fs::create_dir_all(admin.join(d)).expect("dpkg admin dir");
        }
        for d in ["var/log", "bin", "dev", "tmp"] {
            fs::create_dir_all(dir.join(d)).expect("scratch dir");
        }
        fs::copy(BUSYBOX, dir.join("bin/busybox")).expect("copy busybox");
        std::os::unix::fs::symlink("busybox", dir.join("bin/sh")).expect("sh");
        ok(Command::new("mknod").args(["-m", "666"]).arg(dir.join("dev/null")).args(["c", "1", "3"]));

        // The dependency closure, from the machine's own database.
        let ours = [REFERENCE_PACKAGE, PLUGINS_PACKAGE, FABRIC_PACKAGE];
        let mut todo: Vec<String> = debs
            .iter()
            .flat_map(|deb| [deb_field(deb, "Depends"), deb_field(deb, "Pre-Depends")])
            .flat_map(|field| relation_names(&field))
            .collect();
        let mut seen = BTreeSet::new();
        let mut stanzas = Vec::new();
        while let Some(name) = todo.pop() {
            if ours.contains(&name.as_str()) || !seen.insert(name.clone()) {
                continue;
            }
            let output = run(Command::new("dpkg-query").args(["-s", &name]));
            if !output.status.success() {
                continue; // virtual, or not installed here: an alternative some other name satisfies
            }
            let stanza = String::from_utf8_lossy(&output.stdout).trim_end().to_string();
            for line in stanza.lines() {
                if let Some(field) = line.strip_prefix("Depends:").or_else(|| line.strip_prefix("Pre-Depends:")) {
                    todo.extend(relation_names(field));
                }
            }
            let list = ok(Command::new("dpkg-query").args(["-W", "-f", "${binary:Package}", &name]));
            fs::write(admin.join(format!("info/{list}.list")), "").expect("empty file list");
            stanzas.push(stanza);
        }
        fs::write(admin.join("status"), stanzas.join("\n\n") + "\n").expect("status");
        fs::write(admin.join("available"), "").expect("available");
        ScratchRoot { dir }
    }

    fn dpkg(&self, args: &[&str]) -> Output {
        run(Command::new("dpkg").arg(format!("--root={}", self.dir.display())).args(args))
    }

    fn dpkg_ok(&self, args: &[&str]) -> String {
        let output = self.dpkg(args);
        assert!(
            output.status.success(),
            "dpkg {}: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// The package's dpkg status ("install ok installed"), or "" when the database does not know it.
    fn status(&self, package: &str) -> String {
        let output = run(Command::new("dpkg-query")
            .arg(format!("--admindir={}", self.dir.join("var/lib/dpkg").display()))
            .args(["-W", "-f", "${Status}", package]));
        String::from_utf8_lossy(&output.stdout).trim().to_string()
    }

    fn installed(&self, package: &str) -> bool {
        self.status(package) == "install ok installed"
    }

    fn cni_dir(&self) -> PathBuf {
        self.dir.join("usr/lib/cni")
    }

    /// The names in `/usr/lib/cni`.
    fn cni_files(&self) -> BTreeSet<String> {
        match fs::read_dir(self.cni_dir()) {
            Ok(entries) => entries.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into()).collect(),
            Err(_) => BTreeSet::new(),
        }
    }
}

impl Drop for ScratchRoot {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// The spec versions a plugin binary supports (its VERSION answer).
fn supported_versions(binary: &Path) -> Vec<String> {
    let output = run(Command::new(binary).env_clear().env("CNI_COMMAND", "VERSION").env("PATH", "/usr/sbin:/usr/bin"));
    assert!(output.status.success(), "{} VERSION: {}", binary.display(), String::from_utf8_lossy(&output.stderr));
    let answer: Value = serde_json::from_slice(&output.stdout).expect("VERSION json");
    answer["supportedVersions"].as_array().expect("supportedVersions").iter().map(|v| v.to_string()).collect()
}

/// Ours speak 1.1.0; Debian's reference 1.1.1 stops at 1.0.0.
fn is_ours(binary: &Path) -> bool {
    supported_versions(binary).iter().any(|v| v == "\"1.1.0\"")
}

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
        let executable =
            path.starts_with("/usr/lib/cni/") || path.ends_with("bin/fabricd") || path == "/usr/bin/cnitool";
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
        "/usr/bin/cnitool",
        "/lib/systemd/system/fabricd.service",
        "/etc/default/fabricd",
        "/usr/share/doc/cni-rs-fabric/copyright",
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
    for path in ["usr/sbin/fabricd", "usr/bin/cnitool", "lib/systemd/system/fabricd.service", "etc/default/fabricd"] {
        assert!(root.dir.join(path).is_file(), "{path} installed");
    }
    let help = ok(Command::new(root.dir.join("usr/sbin/fabricd")).arg("--help"));
    assert!(help.contains("--etcd-endpoints"), "{help}");

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
    assert!(!root.dir.join("usr/sbin/fabricd").exists());
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

/// A scratch root where ours replaced the reference, shared by the runtime tests of this run.
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

/// The kubenet conflist of `conf/`, host-local's `dataDir` in the test's directory.
fn kubenet_conflist(ipam_dir: &Path) -> Value {
    let path = workspace().join("conf/10-kubenet.conflist");
    let mut conf: Value = serde_json::from_slice(&fs::read(path).expect("read conflist")).expect("json");
    conf["plugins"][0]["ipam"]["dataDir"] = json!(ipam_dir);
    conf
}

fn wait_network_ready(cri: &mut Cri, containerd: &Containerd) {
    let ready = eventually(Duration::from_secs(10), || {
        let status = cri.status().map_err(|e| e.message().to_string())?;
        let conditions = status.status.map(|s| s.conditions).unwrap_or_default();
        match conditions.iter().find(|c| c.r#type == "NetworkReady") {
            Some(c) if c.status => Ok(()),
            other => Err(format!("{other:?}")),
        }
    });
    if let Err(e) = ready {
        panic!("NetworkReady: {e}\n{}", containerd.log_problems(10));
    }
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

/// The image archive's config and the paths of its layers (docker-archive: manifest.json, config, layers).
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
    for path in ["/usr/sbin/fabricd", "/usr/sbin/nft", "/etc/cni-rs/10-flannel.conflist"] {
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
    for (entrypoint, arg, expect) in
        [("/usr/sbin/fabricd", "--help", "--etcd-endpoints"), ("/usr/sbin/nft", "--version", "nftables")]
    {
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

/// The documents of a YAML file, as JSON values.
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
    let security = &main["securityContext"];
    assert_eq!(security["privileged"], false);
    assert_eq!(security["capabilities"]["drop"], json!(["ALL"]));
    assert_eq!(security["capabilities"]["add"], json!(["NET_ADMIN"]));
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
    let caps: Vec<&str> = main["securityContext"]["capabilities"]["add"]
        .as_array()
        .expect("capabilities")
        .iter()
        .map(|c| c.as_str().unwrap())
        .collect();
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
    assert!(ruleset.contains("table inet fabricd"), "the masquerade, through the image's nft: {ruleset}\n{logs}");
    podman.ok(&["rm", "-f", "fabricd"]);
}
