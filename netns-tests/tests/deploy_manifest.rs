//! deploy/cni-rs.yaml and deploy/cni-netpol.yaml against Kubernetes' schemas, offline: PyPI's
//! kubernetes-validate (installed by scripts/setup.sh) in strict mode (an unknown field is an error), and a copy
//! with a misspelt field to show that the check bites.

use std::path::Path;
use std::process::Command;

const INSTALL: &str = "scripts/setup.sh installs it (python3 -m pip install kubernetes-validate)";

fn validate(path: &Path) -> std::process::Output {
    Command::new("kubernetes-validate").arg("--strict").arg(path).output().expect("kubernetes-validate")
}

#[test]
fn the_daemonset_manifest_is_valid_kubernetes() {
    if !netns_tests::require_programs(&["kubernetes-validate"], INSTALL) {
        return;
    }
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/cni-rs.yaml");
    let out = validate(&manifest);
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{text}");
    for resource in ["serviceaccount/cni-rs", "daemonset/cni-rs"] {
        assert!(text.contains(&format!("passed for resource {resource}")), "{text}");
    }
    let broken = std::env::temp_dir().join(format!("cni-rs-manifest-{}.yaml", std::process::id()));
    let yaml = std::fs::read_to_string(&manifest).unwrap().replace("readinessProbe:", "readinesProbe:");
    std::fs::write(&broken, yaml).unwrap();
    let out = validate(&broken);
    let _ = std::fs::remove_file(&broken);
    assert!(!out.status.success(), "a misspelt field passed: {}", String::from_utf8_lossy(&out.stdout));
}

#[test]
fn the_netpol_manifest_is_valid_kubernetes() {
    if !netns_tests::require_programs(&["kubernetes-validate"], INSTALL) {
        return;
    }
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/cni-netpol.yaml");
    let out = validate(&manifest);
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{text}");
    for resource in
        ["serviceaccount/cni-netpol", "clusterrole/cni-netpol", "clusterrolebinding/cni-netpol", "daemonset/cni-netpol"]
    {
        assert!(text.contains(&format!("passed for resource {resource}")), "{text}");
    }
}
