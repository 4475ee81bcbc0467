#!/usr/bin/env bash
# The whole test suite: unit tests and the network-namespace tests that run the real binaries (as root).
# Every netns test makes its own namespaces and state directory and removes them, even on failure.
set -euo pipefail
cd "$(dirname "$0")/.."
# Code-health gates first (a second, no build): stringly errors, long files, import circles, crate docs, tool
# processes and printing to stdout in product code (scripts/lib/gates.sh). Each failure says what to do.
scripts/lib/gates.sh
scripts/setup.sh
# Kubernetes v1.28.7 for the local-cluster tests (tests/k8s*.rs): its binaries, kube-dns and e2e.test (Kubernetes'
# own suite, tests/k8s_conformance.rs) built once from ../shared/kubernetes into /var/tmp/cni-rs-k8s, reused after
# (scripts/cluster.sh build; about 23 minutes on a new 2-core machine shared with other builds).
scripts/cluster.sh build
[[ $(id -u) == 0 ]] || { echo "test: the netns tests need root (network namespaces, iptables, tc)" >&2; exit 1; }
# Test builds carry named fail points (CNI_FAILPOINT) for the crash-consistency tests; release builds do not.
features=(--features cnicore/failpoints)
# Gates: the tree is formatted (rustfmt.toml) and clippy finds nothing, in every target.
command -v rustfmt >/dev/null && cargo clippy --version >/dev/null 2>&1 || rustup component add rustfmt clippy
cargo fmt --all --check || { echo "test: the tree is not formatted: run cargo fmt --all" >&2; exit 1; }
cargo clippy --workspace --all-targets --quiet "${features[@]}" -- -D warnings
cargo build --workspace --bins --quiet "${features[@]}"
# The release build as shipped (static plugins; scripts/lib/binaries.sh): tests/package.rs packages it, so the
# runtime suites below run on exactly what an operator installs.
source scripts/lib/binaries.sh
cni_build_release all
export CNI_PACKAGE_PREBUILT=$PWD/$CNI_STAGE_DIR
# A short fuzzing run (10 s per target; about 5 minutes on a fresh machine, most of it installing cargo-fuzz and
# building the targets). CNI_TEST_FUZZ=0 skips it; scripts/fuzz.sh SECONDS runs longer campaigns.
if [[ ${CNI_TEST_FUZZ:-1} != 0 ]]; then
  scripts/fuzz.sh --short
fi
cargo test --workspace --quiet "${features[@]}" "$@"
# The runtime suites once more with "ours" = the Debian package as tests/package.rs installed it over the reference
# in a scratch root (dpkg --root): podman and containerd run pods with that /usr/lib/cni as their plugin directory.
installed=target/debug/package-test/installed/usr/lib/cni
if [[ -d $installed ]]; then
  CNI_PLUGIN_DIR=$PWD/$installed cargo test -p netns-tests --quiet "${features[@]}" --test podman --test containerd -- _ours
fi
# The kernel as a test axis: the kernel-sensitive suites again inside QEMU on Debian's stock kernels (6.1, 6.12),
# where the link kinds this machine's kernel lacks (ipvlan, vlan, vrf, dummy, wireguard, ipip, bridge VLAN
# filtering) exist: scripts/vm-lane.sh and its matrix. CNI_TEST_VM=0 leaves it out (refused under CI=true).
# First the lane from a checkout and a target directory below /tmp (one short boot: scripts/vm/from-tmp.sh).
if [[ ${CNI_TEST_VM:-1} != 0 ]]; then
  scripts/vm/from-tmp.sh
  scripts/vm-lane.sh
elif [[ ${CI:-} == true ]]; then
  echo "test: CNI_TEST_VM=0 under CI=true: the VM lane is part of the suite" >&2
  exit 1
fi
