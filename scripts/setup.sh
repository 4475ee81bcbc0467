#!/usr/bin/env bash
# Installs what the demo, the tests and the benchmarks need on a fresh Debian/Ubuntu machine (run as root):
# the firewall tools the plugins drive, iproute2 and ping for inspection, iperf3 for shaping tests, the reference
# plugins (Debian's containernetworking-plugins, in /usr/lib/cni) for interop tests, firewalld for the firewall
# plugin's tests (never started on the machine itself), and upstream cnitool when the
# team's ../shared/tools/build-cnitool.sh is present. Does nothing that is already done.
set -euo pipefail
cd "$(dirname "$0")/.."

# etcd-server (etcd 3.4) and openssl: the fabric tests; protobuf-compiler: etcd-client generates its gRPC code at build time;
# curl: fabricd's metrics in the tests and the fabric benchmark.
packages=(iptables nftables iproute2 iputils-ping iperf3 conntrack socat netcat-openbsd containernetworking-plugins hyperfine
  etcd-server etcd-client protobuf-compiler openssl curl)
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

# firewalld and dbus-daemon for the firewall plugin's firewalld tests, which run their own private bus and
# firewalld inside a test namespace. The package must never start or enable firewalld on this machine: service
# starts are refused during the install, and the boot-time units it enables are disabled again.
if ! dpkg -s firewalld >/dev/null 2>&1; then
  echo "setup: installing firewalld dbus-daemon (not started, not enabled)"
  export DEBIAN_FRONTEND=noninteractive
  policy=/usr/sbin/policy-rc.d own_policy=0
  if [[ ! -e $policy ]]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 0755 "$policy" && own_policy=1
  fi
  apt-get install -y -qq firewalld dbus-daemon >/dev/null || { ((own_policy)) && rm -f "$policy"; exit 1; }
  ((own_policy)) && rm -f "$policy"
  # What `systemctl disable firewalld` removes (systemctl may not work where systemd does not run).
  rm -f /etc/systemd/system/multi-user.target.wants/firewalld.service /etc/systemd/system/dbus-org.fedoraproject.FirewallD1.service
fi

command -v cargo >/dev/null || { echo "setup: cargo not found; install a Rust toolchain (rustup) first" >&2; exit 1; }

# Upstream cnitool (libcni 1.1.2) for the interop tests; built offline from Debian's packages.
cnitool=${UPSTREAM_CNITOOL:-/var/tmp/cnitool-bin/cnitool}
if [[ ! -x $cnitool && -x ../shared/tools/build-cnitool.sh ]]; then
  echo "setup: building upstream cnitool into $cnitool"
  ../shared/tools/build-cnitool.sh "$cnitool" >/dev/null
fi
