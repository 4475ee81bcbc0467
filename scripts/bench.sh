#!/usr/bin/env bash
# Side-by-side benchmark: our plugins against the reference plugins (Debian's containernetworking-plugins in
# /usr/lib/cni), run alternately under the same conditions: the same runner (upstream cnitool when built, else
# ours), the same conflist (conf/10-kubenet.conflist with a port mapping and bandwidth limits), the same netns
# layout (a node netns with an uplink to a wan netns, pods in their own netns). Medians of RUNS runs (default 20).
# Prints a table and writes it to docs/benchmarks.md (OUT=path to write elsewhere, OUT= to skip).
#   scripts/bench.sh            RUNS=30 scripts/bench.sh
# The containerd path (netns-tests/examples/cri-bench.rs): pods through containerd's CRI API, ours against the
# reference, CNI ADD/DEL as containerd measures them and RunPodSandbox/StopPodSandbox wall time (skipped with a
# note when containerd is not installed; CRI_BENCH=0 skips it).
# Nothing touches the root network namespace. The result cache of upstream cnitool (which always uses
# /var/lib/cni) is kept in a temporary directory mounted over /var/lib/cni in a private mount namespace.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/bench-scratch.sh
root=$PWD
RUNS=${RUNS:-20}
OUT=${OUT-docs/benchmarks.md}

if [[ -z ${CNI_BENCH_INNER:-} ]]; then
  bench_prepare bench
  if [[ ${CRI_BENCH:-1} != 0 ]]; then
    # The CRI client's own speed is not measured (containerd's metrics and ~100 ms calls are): a dev build.
    cargo build --quiet -p netns-tests --example cri-bench
  fi
  mkdir -p /var/lib/cni # a mount point only: the private mount namespace puts a temp dir over it
  exec unshare --mount --propagation private env CNI_BENCH_INNER=1 "$0" "$@"
fi

ours=$root/$CNI_STAGE_DIR
ref=/usr/lib/cni
cnitool=${UPSTREAM_CNITOOL:-/var/tmp/cnitool-bin/cnitool}
runner="upstream cnitool (libcni 1.1.2)"
[[ -x $cnitool ]] || { cnitool=$ours/cnitool; runner="our cnitool (upstream cnitool not built)"; }

bench_scratch bench
id=$$

median() { sort -n | awk '{a[NR]=$1} END {if (NR == 0) print 0; else if (NR % 2) print a[(NR+1)/2]; else print int((a[NR/2]+a[NR/2+1])/2)}'; }
ms() { awk -v us="$1" 'BEGIN {printf "%.1f ms", us / 1000}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {if (b > 0) printf "%.1fx", a / b; else print "-"}'; }

# Other work on the machine skews every figure: recorded with them.
load_start=$(cut -d' ' -f1-3 /proc/loadavg)
node=cbn$id wan=cbw$id
make_node "$node" "$wan"
mkdir -p "$tmp/net.d"
sed "s|\"type\": \"host-local\",|\"type\": \"host-local\", \"dataDir\": \"$tmp/ipam\",|" conf/10-kubenet.conflist >"$tmp/net.d/10-kubenet.conflist"
caps='{"portMappings":[{"hostPort":8080,"containerPort":80,"protocol":"tcp"}],"bandwidth":{"ingressRate":10000000,"ingressBurst":1000000,"egressRate":10000000,"egressBurst":1000000}}'

# cni PATH VERB POD: the runner, inside the node netns, on the kubenet conflist.
cni() {
  NETCONFPATH=$tmp/net.d CNI_PATH=$1 CAP_ARGS=$caps nsenter --net=/run/netns/$node "$cnitool" "$2" kubenet "/run/netns/$3"
}

declare -A add del cycle
pod=cbp$id
bench_netns "$pod"
echo "bench: chain ADD/DEL, $RUNS runs each side, alternating" >&2
for side in ref ours; do add[$side]=""; del[$side]=""; cycle[$side]=""; done
harness=""
for ((i = 0; i < RUNS; i++)); do
  for side in ref ours; do
    path=${!side}
    a=$(elapsed cni "$path" add "$pod")
    d=$(elapsed cni "$path" del "$pod")
    add[$side]+="$a "; del[$side]+="$d "; cycle[$side]+="$((a + d)) "
  done
  # The harness alone: nsenter + the runner loading the conflist, with no plugin run (an unknown network).
  s=$EPOCHREALTIME
  NETCONFPATH=$tmp/net.d CNI_PATH=$ours nsenter --net=/run/netns/$node "$cnitool" del no-such-net "/run/netns/$pod" >/dev/null 2>&1 || true
  e=$EPOCHREALTIME
  harness+="$((10#${e/./} - 10#${s/./})) "
done
med() { tr ' ' '\n' <<<"$1" | grep . | median; }
H=$(med "$harness")
declare -A A D C
for side in ref ours; do A[$side]=$(med "${add[$side]}"); D[$side]=$(med "${del[$side]}"); C[$side]=$(med "${cycle[$side]}"); done
net() { local v=$(($1 - $2)); ((v > 0)) || v=1; echo $v; }

# VERSION: one exec per plugin, medians of 50.
declare -A V
for p in bridge host-local portmap bandwidth loopback; do
  for side in ref ours; do
    path=${!side}
    runs=""
    for ((i = 0; i < 50; i++)); do runs+="$(CNI_COMMAND=VERSION elapsed "$path/$p" </dev/null) "; done
    V[$side-$p]=$(med "$runs")
  done
done

# Peak RSS of each plugin during one chain ADD: wrappers that run the real binary under /usr/bin/time.
declare -A RSS
for side in ref ours; do
  path=${!side}
  wrap=$tmp/wrap-$side
  mkdir -p "$wrap"
  for p in bridge host-local portmap bandwidth; do
    printf '#!/bin/sh\nexec /usr/bin/time -a -o %s -f "%s %%M" %s "$@"\n' "$tmp/rss-$side" "$p" "$path/$p" >"$wrap/$p"
    chmod +x "$wrap/$p"
  done
  : >"$tmp/rss-$side"
  cni "$wrap" add "$pod" >/dev/null
  RSS[$side]=$(awk '{if ($2 > m) {m = $2; n = $1}} END {printf "%.1f MB (%s)", m / 1024, n}' "$tmp/rss-$side")
  cni "$path" del "$pod" >/dev/null
done

# 64 pods added concurrently, then deleted concurrently: wall time, and every address distinct.
declare -A PAR_ADD PAR_DEL
pods=()
for ((i = 0; i < 64; i++)); do bench_netns "cbq$id-$i"; pods+=("cbq$id-$i"); done
for side in ref ours; do
  path=${!side}
  s=$EPOCHREALTIME
  for p in "${pods[@]}"; do cni "$path" add "$p" >"$tmp/par-$p.json" 2>>"$tmp/errors" & done
  wait
  e=$EPOCHREALTIME
  PAR_ADD[$side]=$((10#${e/./} - 10#${s/./}))
  addrs=$(cat "$tmp"/par-*.json | grep -o '"address": *"[^"]*"' | sort)
  total=$(grep -c . <<<"$addrs" || true)
  distinct=$(sort -u <<<"$addrs" | grep -c . || true)
  [[ $total == 64 && $distinct == 64 ]] || echo "bench: $side: $total addresses, $distinct distinct (expected 64)" >&2
  s=$EPOCHREALTIME
  for p in "${pods[@]}"; do cni "$path" del "$p" >/dev/null 2>>"$tmp/errors" & done
  wait
  e=$EPOCHREALTIME
  PAR_DEL[$side]=$((10#${e/./} - 10#${s/./}))
  rm -f "$tmp"/par-*.json
done

# portmap ADD/DEL of one more container with 1,000 other containers' mappings installed (iptables: the only
# backend the reference has). The 1,000 are installed by our portmap: the chain layout is the reference's.
pm_node=cbm$id
bench_netns "$pm_node"
pm_conf() { # CONTAINER HOSTPORT
  printf '{"cniVersion":"1.0.0","name":"kubenet","type":"portmap","snat":true,"capabilities":{"portMappings":true},"runtimeConfig":{"portMappings":[{"hostPort":%s,"containerPort":80,"protocol":"tcp"}]},"prevResult":{"cniVersion":"1.0.0","interfaces":[{"name":"eth0","sandbox":"/run/netns/x"}],"ips":[{"address":"10.244.%s.%s/16","interface":0}]}}' "$2" $(($2 % 250)) $(($2 / 250 % 250 + 1))
}
pm() { # PATH VERB CONTAINER HOSTPORT
  pm_conf "$3" "$4" | CNI_COMMAND=$2 CNI_CONTAINERID=$3 CNI_NETNS=/run/netns/$pod CNI_IFNAME=eth0 CNI_PATH=$1 nsenter --net=/run/netns/$pm_node "$1/portmap"
}
for ((i = 0; i < 1000; i++)); do pm "$ours" ADD "bench-fill-$i" $((20000 + i)) >/dev/null; done
declare -A PM_ADD PM_DEL
for side in ref ours; do PM_ADD[$side]=""; PM_DEL[$side]=""; done
for ((i = 0; i < RUNS; i++)); do
  for side in ref ours; do
    path=${!side}
    PM_ADD[$side]+="$(elapsed pm "$path" ADD bench-pm-$side 18080) "
    PM_DEL[$side]+="$(elapsed pm "$path" DEL bench-pm-$side 18080) "
  done
done

# host-local ADD/DEL with 60,000 leases in a /16 (lease files written directly, in the reference layout).
hl_dir=$tmp/hl
mkdir -p "$hl_dir/bench"
for ((i = 0; i < 60000; i++)); do
  printf 'fill-%d\r\neth0' "$i" >"$hl_dir/bench/10.250.$((i / 250 + 1)).$((i % 250 + 2))"
done
hl_conf='{"cniVersion":"1.0.0","name":"bench","ipam":{"type":"host-local","dataDir":"'$hl_dir'","ranges":[[{"subnet":"10.250.0.0/16"}]]}}'
hl() { CNI_COMMAND=$2 CNI_CONTAINERID=$3 CNI_NETNS=/run/netns/$pod CNI_IFNAME=eth0 CNI_PATH=$1 "$1/host-local" <<<"$hl_conf"; }
declare -A HL_ADD HL_DEL
for side in ref ours; do HL_ADD[$side]=""; HL_DEL[$side]=""; done
# In blocks, not alternating: any change by the reference invalidates our lease index (by design, so that
# leases it writes are never missed), and the first call of ours after it rescans the directory once.
for side in ref ours; do
  path=${!side}
  hl "$path" ADD bench-hl-warm >/dev/null && hl "$path" DEL bench-hl-warm >/dev/null
  for ((i = 0; i < RUNS; i++)); do
    HL_ADD[$side]+="$(elapsed hl "$path" ADD bench-hl-$side) "
    HL_DEL[$side]+="$(elapsed hl "$path" DEL bench-hl-$side) "
  done
done

# The link plugins (ptp, macvlan, ipvlan, vlan, dummy), each exec'd on its own with host-local: their own script.
echo "bench: link plugins, $RUNS runs each side" >&2
links_table=$(RUNS=$RUNS OURS_DIR=$ours "$root/scripts/bench-links.sh") || { echo "bench: bench-links.sh failed" >&2; exit 1; }
# dhcp IPAM, each side through its own daemon, against dnsmasq (scripts/bench-dhcp.sh; skipped without dnsmasq).
DHCP_MED=""
if command -v dnsmasq >/dev/null; then
  echo "bench: dhcp ADD/DEL against dnsmasq" >&2
  DHCP_MED=$(BENCH_RUNS=$RUNS OURS_DIR=$ours scripts/bench-dhcp.sh --medians 2>>"$tmp/errors") || DHCP_MED=""
fi

# Through containerd: two daemons (ours, reference) in node netns of their own, pods alternating.
cri_table=""
if [[ ${CRI_BENCH:-1} != 0 ]]; then
  echo "bench: through containerd's CRI, $RUNS pods each side" >&2
  if ! command -v containerd >/dev/null; then
    cri_table="(skipped: containerd not installed; scripts/setup.sh installs it)"
  elif ! cri_table=$("$root/target/debug/examples/cri-bench" "$RUNS" "$ours" "$ref" 2>>"$tmp/errors"); then
    echo "bench: cri-bench failed:" >&2; tail -n 20 "$tmp/errors" >&2; exit 1
  fi
fi

size() { stat -c %s "$1" | awk '{printf "%.2f MB", $1 / 1048576}'; }
row() { printf '| %s | %s | %s | %s |\n' "$1" "$2" "$3" "$4"; }
{
  echo "Measured $(date -u +%Y-%m-%d) on $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), kernel $(uname -r)),"
  echo "with \`scripts/bench.sh\` (RUNS=$RUNS; load average at the start $load_start). Runner: $runner inside a node netns via nsenter."
  echo "Reference: Debian containernetworking-plugins $(dpkg-query -W -f '${Version}' containernetworking-plugins 2>/dev/null) in /usr/lib/cni."
  echo
  row "figure (median)" "reference" "ours" "speed-up"
  row "---" "---" "---" "---"
  row "harness overhead (nsenter + runner, no plugin)" "$(ms "$H")" "$(ms "$H")" ""
  row "chain ADD + DEL" "$(ms "${C[ref]}")" "$(ms "${C[ours]}")" "$(ratio "${C[ref]}" "${C[ours]}")"
  row "chain ADD + DEL, net of harness (2 runner calls)" "$(ms "$(net "${C[ref]}" $((2 * H)))")" "$(ms "$(net "${C[ours]}" $((2 * H)))")" "$(ratio "$(net "${C[ref]}" $((2 * H)))" "$(net "${C[ours]}" $((2 * H)))")"
  row "chain ADD" "$(ms "${A[ref]}")" "$(ms "${A[ours]}")" "$(ratio "${A[ref]}" "${A[ours]}")"
  row "chain DEL" "$(ms "${D[ref]}")" "$(ms "${D[ours]}")" "$(ratio "${D[ref]}" "${D[ours]}")"
  row "64 pods ADD concurrently (wall)" "$(ms "${PAR_ADD[ref]}")" "$(ms "${PAR_ADD[ours]}")" "$(ratio "${PAR_ADD[ref]}" "${PAR_ADD[ours]}")"
  row "64 pods DEL concurrently (wall)" "$(ms "${PAR_DEL[ref]}")" "$(ms "${PAR_DEL[ours]}")" "$(ratio "${PAR_DEL[ref]}" "${PAR_DEL[ours]}")"
  row "portmap ADD, 1,000 mappings installed (iptables)" "$(ms "$(med "${PM_ADD[ref]}")")" "$(ms "$(med "${PM_ADD[ours]}")")" "$(ratio "$(med "${PM_ADD[ref]}")" "$(med "${PM_ADD[ours]}")")"
  row "portmap DEL, 1,000 mappings installed (iptables)" "$(ms "$(med "${PM_DEL[ref]}")")" "$(ms "$(med "${PM_DEL[ours]}")")" "$(ratio "$(med "${PM_DEL[ref]}")" "$(med "${PM_DEL[ours]}")")"
  row "host-local ADD, 60,000 leases" "$(ms "$(med "${HL_ADD[ref]}")")" "$(ms "$(med "${HL_ADD[ours]}")")" "$(ratio "$(med "${HL_ADD[ref]}")" "$(med "${HL_ADD[ours]}")")"
  row "host-local DEL, 60,000 leases" "$(ms "$(med "${HL_DEL[ref]}")")" "$(ms "$(med "${HL_DEL[ours]}")")" "$(ratio "$(med "${HL_DEL[ref]}")" "$(med "${HL_DEL[ours]}")")"
  if [[ -n $DHCP_MED ]]; then
    read -r doa dod dra drd _ <<<"$DHCP_MED"
    row "dhcp ADD (its daemon, dnsmasq)" "$(ms "$dra")" "$(ms "$doa")" "$(ratio "$dra" "$doa")"
    row "dhcp DEL (its daemon, dnsmasq)" "$(ms "$drd")" "$(ms "$dod")" "$(ratio "$drd" "$dod")"
  fi
  row "peak RSS of a plugin during chain ADD" "${RSS[ref]}" "${RSS[ours]}" ""
  for p in bridge host-local portmap bandwidth loopback; do
    row "VERSION exec, $p" "$(ms "${V[ref-$p]}")" "$(ms "${V[ours-$p]}")" "$(ratio "${V[ref-$p]}" "${V[ours-$p]}")"
  done
  for p in bridge host-local portmap bandwidth loopback; do
    row "binary size, $p" "$(size "$ref/$p")" "$(size "$ours/$p")" ""
  done
  row "binary size, cnitool" "$(size "$cnitool")" "$(size "$ours/cnitool")" ""
  # static, host-device, sbr, vrf and tap: each plugin's ADD and DEL alone (scripts/bench-misc.sh).
  OURS_DIR=$ours BENCH_RUNS=$RUNS "$root/scripts/bench-misc.sh"
} >"$tmp/table.md"
cat "$tmp/table.md"
{ echo; echo "## Link plugins (one plugin exec each, with host-local; scripts/bench-links.sh)"; echo; echo "$links_table"; } | tee -a "$tmp/table.md"
if [[ -n $cri_table ]]; then
  { echo; echo "## Through containerd (CRI)"; echo; echo "$cri_table"; } | tee -a "$tmp/table.md"
fi
if [[ -n $OUT ]]; then
  # This script writes the head of the file; the rest, from the first section another script keeps
  # (scripts/bench-floor.sh's and scripts/bench-fabric.sh's, between markers) to the end, with the notes
  # written beside them, is carried over as it is.
  rest=$(sed -n '/^<!-- \(floor\|fabric\):begin -->/,$p' "$root/$OUT" 2>/dev/null || true)
  {
    echo "# Benchmarks"
    echo
    echo "Produced by \`scripts/bench.sh\` (one command: it builds in release mode, then runs ours and the reference"
    echo "alternately in the same conditions). Figures are medians; each invocation is a fresh process, as the kubelet runs it."
    echo
    cat "$tmp/table.md"
    cat <<'NOTES'

Through containerd, the figures are those of `netns-tests/examples/cri-bench.rs`: containerd 1.6's CRI plugin runs
its own loopback attachment besides the conflist; its `set_up_pod`/`tear_down_pod` metrics
time both (go-cni's Setup/Remove), and RunPodSandbox/StopPodSandbox add the sandbox container's start and stop.
A failed side shows containerd's error instead of a figure.

## Where the time goes

DEL is bounded by the kernel, not by the plugins. Deleting a network device makes the deleting process wait
for an RCU grace period (`netdev_run_todo` → `rcu_barrier`), and so does an nf_tables transaction that deletes
rules or chains. Measured on this machine with `ip` and `iptables-restore` alone (medians of 15):

| kernel operation | time |
|---|---|
| delete a veth pair (`ip link del`) | 16–19 ms |
| delete an ifb device | 18–21 ms |
| `iptables-restore` deleting one chain (nf_tables; the wait is at the close of its netlink socket) | 10–13 ms |
| `ip netns exec NS true` (process start, for scale) | 2–3 ms |

A chain DEL must do all three, in sequence across plugins (bandwidth's ifb, portmap's rules, bridge's veth; the
bridge deletes its veth and its masquerade rules in parallel), so about 45 ms of any chain DEL is the kernel's.
Within that floor no plugin can be much faster on DEL without returning before the pod's devices are gone,
which would break "DEL leaves nothing behind". ADD waits for no grace period; its remaining costs are process
start-up (0.2 ms per plugin: static executables, README "Dependencies"), netlink round trips and one firewall
transaction per plugin. The floor of one pod, the same kernel operations done by one process, and where every
millisecond above it goes per plugin: the floor section below (`scripts/bench-floor.sh`).

Per-plugin benchmarks, each a script of its own: `scripts/bench-host-local.sh` (ADD/DEL at 0, 1,000 and
60,000 leases), `scripts/bench-portmap.sh` (0, 100 and 1,000 installed mappings, both backends),
`scripts/bench-bandwidth.sh` (ADD/DEL and the achieved rate), `scripts/bench-bridge.sh` (bridge + host-local),
`scripts/bench-version.sh` (VERSION exec); their last figures are in `docs/plugin-benchmarks.md`.
NOTES
    if [[ -n $rest ]]; then
      echo
      echo "$rest"
    fi
  } >"$root/$OUT.new"
  mv "$root/$OUT.new" "$root/$OUT"
  echo "bench: written to $OUT" >&2
fi
