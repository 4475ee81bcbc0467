#!/usr/bin/env bash
# Installs what the demo, the tests and the benchmarks need on a fresh Debian/Ubuntu machine (run as root):
# the firewall tools the plugins drive, iproute2 and ping for inspection, iperf3 for shaping tests, the reference
# plugins (Debian's containernetworking-plugins, in /usr/lib/cni) for interop tests, and upstream cnitool when the
# team's ../shared/tools/build-cnitool.sh is present; the runtimes the runtime tests drive (containerd, podman,
# runc, and busybox-static for their offline images) and protoc (the CRI client's bindings are generated from
# the CRI's .proto at build time). Does nothing that is already done.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(iptables nftables iproute2 iputils-ping iperf3 conntrack socat netcat-openbsd containernetworking-plugins hyperfine
  containerd runc podman busybox-static protobuf-compiler)
missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${missing[@]}" >/dev/null
fi

command -v cargo >/dev/null || { echo "setup: cargo not found; install a Rust toolchain (rustup) first" >&2; exit 1; }

# Upstream cnitool (libcni 1.1.2) for the interop tests; built offline from Debian's packages.
cnitool=${UPSTREAM_CNITOOL:-/var/tmp/cnitool-bin/cnitool}
if [[ ! -x $cnitool && -x ../shared/tools/build-cnitool.sh ]]; then
  echo "setup: building upstream cnitool into $cnitool"
  ../shared/tools/build-cnitool.sh "$cnitool" >/dev/null
fi
