//! Container images built offline from Debian's `busybox-static`, as docker-archive tars (what `docker save`
//! writes: `manifest.json`, the image config, one layer tar), for `ctr images import` and `podman load`.
//! No registry is ever asked: the image name's domain is `registry.invalid`, which cannot resolve.
//!
//! One image serves as the pod sandbox ("pause": `sleep`) and as the workload (`httpd` serving
//! [`INDEX_HTML`] from `/www`).

use std::fs;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

/// The name the image is imported under (the runtimes' sandbox image too).
pub const BUSYBOX_IMAGE: &str = "registry.invalid/cni-rs/busybox:1";
/// The statically linked busybox of Debian's `busybox-static`.
pub const BUSYBOX: &str = "/bin/busybox";
/// What `httpd -h /www` serves at `/`.
pub const INDEX_HTML: &str = "hello from a pod of cni-rs\n";
/// The image's default command: a pause-like process (busybox's sleep takes no "infinity").
pub const PAUSE_COMMAND: &[&str] = &["/bin/sleep", "2147483647"];
/// A command that serves [`INDEX_HTML`] on port 80 in the foreground.
pub const HTTPD_COMMAND: &[&str] = &["/bin/httpd", "-f", "-p", "80", "-h", "/www"];

/// The applets the image links to busybox.
const APPLETS: &[&str] = &["sh", "sleep", "httpd", "cat", "ls", "ip", "wget", "ifconfig", "hostname"];

/// True when busybox-static is installed.
pub fn have_busybox() -> bool {
    Path::new(BUSYBOX).is_file()
}

/// Writes the busybox image as a docker-archive tar into `dir` (created if needed) and returns its path.
pub fn busybox_archive(dir: &Path) -> PathBuf {
    let work = dir.join("image-build");
    let rootfs = work.join("rootfs");
    let archive = work.join("archive");
    for d in [rootfs.join("bin"), rootfs.join("www"), rootfs.join("tmp"), archive.clone()] {
        fs::create_dir_all(&d).unwrap_or_else(|e| panic!("create {}: {e}", d.display()));
    }
    fs::copy(BUSYBOX, rootfs.join("bin/busybox"))
        .unwrap_or_else(|e| panic!("copy {BUSYBOX} (install busybox-static): {e}"));
    for applet in APPLETS {
        symlink("busybox", rootfs.join("bin").join(applet)).expect("applet symlink");
    }
    fs::write(rootfs.join("www/index.html"), INDEX_HTML).expect("index.html");
    fs::set_permissions(rootfs.join("tmp"), fs::Permissions::from_mode(0o1777)).expect("chmod tmp");

    let layer_tar = work.join("layer.tar");
    tar(&rootfs, &layer_tar, &["."]);
    let layer_digest = sha256_file(&layer_tar);
    let layer_dir = archive.join(&layer_digest);
    fs::create_dir_all(&layer_dir).expect("layer dir");
    fs::rename(&layer_tar, layer_dir.join("layer.tar")).expect("move layer");

    let config = serde_json::json!({
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "Env": ["PATH=/bin"],
            "Cmd": PAUSE_COMMAND,
            "WorkingDir": "/",
        },
        "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{layer_digest}")]},
        "history": [{"created_by": "cni-rs netns-tests: busybox-static"}],
    });
    let config = serde_json::to_vec(&config).expect("config json");
    let config_name = format!("{}.json", hex(&Sha256::digest(&config)));
    fs::write(archive.join(&config_name), &config).expect("write config");
    let manifest = serde_json::json!([{
        "Config": config_name,
        "RepoTags": [BUSYBOX_IMAGE],
        "Layers": [format!("{layer_digest}/layer.tar")],
    }]);
    fs::write(archive.join("manifest.json"), manifest.to_string()).expect("write manifest");

    let out = dir.join("busybox.tar");
    tar(&archive, &out, &["manifest.json", &config_name, &layer_digest]);
    fs::remove_dir_all(&work).expect("remove image build dir");
    out
}

/// `tar` of `members` of `dir`, reproducible (sorted, owned by root, mtime 0).
fn tar(dir: &Path, out: &Path, members: &[&str]) {
    let output = Command::new("tar")
        .args(["--sort=name", "--mtime=@0", "--owner=0", "--group=0", "--numeric-owner", "-C"])
        .arg(dir)
        .arg("-cf")
        .arg(out)
        .args(members)
        .output()
        .unwrap_or_else(|e| panic!("run tar: {e}"));
    assert!(output.status.success(), "tar: {}", String::from_utf8_lossy(&output.stderr));
}

fn sha256_file(path: &Path) -> String {
    let bytes = fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    hex(&Sha256::digest(&bytes))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
