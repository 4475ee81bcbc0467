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
//!
//! One test binary (package.sh runs once per run), its tests by theme: [`debs`] (the packages, the swap, apt),
//! [`installed`] (runtimes on the installed package), [`image`] (the installer image), [`deploy`] (the
//! DaemonSet and fabricd from the image); the shared helpers here.

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

mod debs;
mod deploy;
mod image;
mod installed;
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
