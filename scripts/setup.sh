#!/usr/bin/env bash
# Installs what the demo, the tests and the benchmarks need on a fresh Debian/Ubuntu machine (run as root):
# the firewall tools the plugins drive, iproute2 and ping for inspection, iperf3 for shaping tests, the reference
# plugins (Debian's containernetworking-plugins, in /usr/lib/cni) for interop tests, firewalld for the firewall
# plugin's tests (never started on the machine itself), upstream cnitool when the team's
# ../shared/tools/build-cnitool.sh is present; the runtimes the runtime tests drive (containerd, podman, runc,
# and busybox-static for their offline images) and protoc (the CRI client's bindings are generated from the
# CRI's .proto at build time). Does nothing that is already done.
set -euo pipefail
cd "$(dirname "$0")/.."

# etcd-client and openssl: the fabric tests (etcd-server below); protobuf-compiler: etcd-client generates its gRPC code at build time;
# curl: fabricd's metrics in the tests and the fabric benchmark. jq: scripts/lib/binaries.sh reads cargo metadata;
# lintian, fakeroot, binutils (strip): scripts/package.sh and its tests (netns-tests/tests/package.rs); buildah
# (below) builds the installer image.
packages=(iptables nftables iproute2 iputils-ping iperf3 conntrack socat netcat-openbsd containernetworking-plugins hyperfine
  etcd-client protobuf-compiler openssl curl jq lintian fakeroot binutils dpkg-dev)
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

# Packages with services that must never run on this machine itself: the tests start their own instances in
# test namespaces (firewalld on a private D-Bus bus; containerd and podman with private state). Service starts are
# refused during the install (policy-rc.d), and the boot-time units the packages enable are disabled again (what
# `systemctl disable` removes; systemctl may not work where systemd does not run).
install_without_starting() { # WHAT PACKAGE...
  local what=$1 missing=() p
  shift
  for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  ((${#missing[@]})) || return 0
  echo "setup: installing ${missing[*]} for $what (not started, not enabled)"
  export DEBIAN_FRONTEND=noninteractive
  local policy=/usr/sbin/policy-rc.d own_policy=0
  if [[ ! -e $policy ]]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 0755 "$policy" && own_policy=1
  fi
  apt-get update -qq
  apt-get install -y -qq "${missing[@]}" >/dev/null || { ((own_policy)) && rm -f "$policy"; exit 1; }
  ((own_policy)) && rm -f "$policy"
  rm -f /etc/systemd/system/multi-user.target.wants/firewalld.service \
    /etc/systemd/system/dbus-org.fedoraproject.FirewallD1.service \
    /etc/systemd/system/multi-user.target.wants/containerd.service \
    /etc/systemd/system/sockets.target.wants/podman.socket \
    /etc/systemd/system/default.target.wants/podman-auto-update.service \
    /etc/systemd/system/multi-user.target.wants/etcd.service
}
install_without_starting "the firewall plugin's firewalld tests" firewalld dbus-daemon
# The runtime tests: containerd and podman (with runc) run pods in test namespaces, busybox-static makes their
# images offline, protoc builds the CRI client's bindings.
install_without_starting "the runtime tests" containerd runc podman busybox-static protobuf-compiler buildah
# The dhcp tests: dnsmasq as the DHCP server, started by each test in a namespace of its own (dnsmasq-base has
# no service to start).
install_without_starting "the dhcp tests" dnsmasq-base
# The fabric tests: etcd 3.4, started by each test in its own namespace on a temporary data dir.
install_without_starting "the fabric tests" etcd-server

command -v cargo >/dev/null || { echo "setup: cargo not found; install a Rust toolchain (rustup) first" >&2; exit 1; }

# The static (musl) target the release plugins are built for (scripts/lib/binaries.sh: cni_build_release).
source scripts/lib/binaries.sh
if ! cni_static_target_installed; then
  command -v rustup >/dev/null || { echo "setup: the $CNI_STATIC_TARGET target is missing and rustup is not installed" >&2; exit 1; }
  echo "setup: adding the Rust target $CNI_STATIC_TARGET"
  rustup target add "$CNI_STATIC_TARGET" >/dev/null
fi

# Upstream cnitool (libcni 1.1.2) for the interop tests; built offline from Debian's packages.
cnitool=${UPSTREAM_CNITOOL:-/var/tmp/cnitool-bin/cnitool}
if [[ ! -x $cnitool && -x ../shared/tools/build-cnitool.sh ]]; then
  echo "setup: building upstream cnitool into $cnitool"
  ../shared/tools/build-cnitool.sh "$cnitool" >/dev/null
fi

# The VM lane (scripts/vm-lane.sh): QEMU boots Debian's stock kernels under TCG; kmod's depmod and modprobe read
# the unpacked kernels' modules, busybox-static is the initramfs, xz and zstd unpack the kernels (6.1's image is
# xz, 6.12's zstd; 6.12's modules are xz). Without recommends: QEMU's would bring a desktop's worth of GUI.
vm_packages=(qemu-system-x86 kmod busybox-static xz-utils zstd)
vm_missing=()
for p in "${vm_packages[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || vm_missing+=("$p"); done
if ((${#vm_missing[@]})); then
  echo "setup: installing ${vm_missing[*]} for the VM lane"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${vm_missing[@]}" >/dev/null
fi
# The VM lane's kernels (Debian 12's 6.1 and the 6.12 built for it), unpacked into a cache outside the tree
# (/var/tmp/cni-rs-vm; never /boot, nothing installed): fetched once, reused by every run.
scripts/vm-lane.sh --fetch
