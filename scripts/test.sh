#!/usr/bin/env bash
# The whole test suite: unit tests and the network-namespace tests that run the real binaries (as root).
# Every netns test makes its own namespaces and state directory and removes them, even on failure.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
[[ $(id -u) == 0 ]] || { echo "test: the netns tests need root (network namespaces, iptables, tc)" >&2; exit 1; }
# Test builds carry named fail points (CNI_FAILPOINT) for the crash-consistency tests; release builds do not.
features=(--features cnicore/failpoints)
cargo build --workspace --bins --quiet "${features[@]}"
cargo test --workspace --quiet "${features[@]}" "$@"
