#!/usr/bin/env bash
# Benchmark of static, host-device, sbr, tap and vrf, ours against the reference (Debian's containernetworking-plugins
# 1.1.1 in /usr/lib/cni; it has no tap), with scripts/lib/adddel-times.sh: ADD and DEL medians, each call one exec
# inside a "node" namespace, ours and the reference alternating. host-device moves a veth end of the node into the pod
# and back (no IPAM, so that only the plugin is timed); sbr adds its rule for the pod's eth0 (a veth to the node); vrf needs a kernel with VRF support and is reported as skipped without it.
# Prints markdown table rows ("| <plugin> ADD | ref | ours | speed-up |"); scripts/bench.sh appends them to its table.
#
# Needs root and jq. Touches only the namespaces it makes and a temporary directory (removed on exit).
#   BENCH_RUNS=N      ADD/DEL pairs per implementation (default 50)
#   OURS_DIR=dir      our binaries (default target/stage, built if missing)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/bench.sh

RUNS=${BENCH_RUNS:-50}
OURS_DIR=$(realpath "${OURS_DIR:-target/stage}")
REF=/usr/lib/cni

bench_start bench-misc
command -v jq >/dev/null || die "needs jq"
for p in static host-device tap sbr vrf; do
    [[ -x $OURS_DIR/$p ]] || cni_build_release plugins
done


row() { printf '| %s | %s | %s | %s |\n' "$1" "$2" "$3" "$4"; }

# bench PLUGIN CONF NODE POD [REFERENCE]: the two rows of one plugin.
bench() {
    local plugin=$1 conf=$2 node=$3 pod=$4 reference=${5:-$REF/$1}
    local times=$WORK/times-$plugin ours_add ours_del ref_add ref_del
    ip netns exec "$node" env CNI_NETNS="/run/netns/$pod" CNI_IFNAME=eth0 CNI_PATH="$OURS_DIR" \
        scripts/lib/adddel-times.sh "$RUNS" 2 "ours:$OURS_DIR/$plugin:$conf" "reference:$reference:$conf" >"$times" ||
        die "$plugin: ADD/DEL loop failed"
    ours_add=$(median_us ours 2 <"$times") ours_del=$(median_us ours 3 <"$times")
    ref_add=$(median_us reference 2 <"$times") ref_del=$(median_us reference 3 <"$times")
    # Each figure includes its exec (ours, static, start faster than the harness's /bin/true: a ratio net of
    # the harness would divide by almost nothing).
    row "$plugin ADD" "$(ms "$ref_add")" "$(ms "$ours_add")" "$(ratio "$ref_add" "$ours_add")"
    row "$plugin DEL" "$(ms "$ref_del")" "$(ms "$ours_del")" "$(ratio "$ref_del" "$ours_del")"
}

node=bmn$$ pod=bmp$$
bench_netns "$node" "$pod"

# static: IPAM alone.
jq -n '{cniVersion: "1.0.0", name: "bench", type: "bridge", ipam: {type: "static",
    addresses: [{address: "10.60.0.5/24", gateway: "10.60.0.1"}], routes: [{dst: "0.0.0.0/0"}],
    dns: {nameservers: ["10.60.0.53"]}}}' >"$WORK/static.json"
bench static "$WORK/static.json" "$node" "$pod"

# host-device: a veth end of the node, moved in as eth0 and back.
ip -n "$node" link add bmd$$ type veth peer name bmw$$
jq -n --arg dev "bmd$$" --arg dir "$WORK/hd" '{cniVersion: "1.0.0", name: "bench", type: "host-device", device: $dev,
    dataDir: $dir}' >"$WORK/hd.json"
bench host-device "$WORK/hd.json" "$node" "$pod"
ip -n "$node" link del bmd$$

# sbr: the pod's eth0, a veth to the node. The result has no gateway: a default route left in the table by a DEL
# (theirs and ours leave the table's routes to go with the link) makes the reference's next ADD fail with EEXIST.
# The first ADD moves the subnet route to table 100; later ones find none to move: the rule is the steady work.
bench_veth "$node" bms$$ 10.61.0.1/24 "$pod" eth0 10.61.0.5/24
jq -n --arg pod "/run/netns/$pod" '{cniVersion: "1.0.0", name: "bench", type: "sbr",
    prevResult: {cniVersion: "1.0.0", interfaces: [{name: "eth0", sandbox: $pod}],
        ips: [{address: "10.61.0.5/24", interface: 0}]}}' >"$WORK/sbr.json"
bench sbr "$WORK/sbr.json" "$node" "$pod"

# vrf: only where the kernel makes VRFs.
if ip -n "$pod" link add bmvrf type vrf table 77 2>/dev/null; then
    ip -n "$pod" link del bmvrf
    jq '.type = "vrf" | .vrfname = "blue"' "$WORK/sbr.json" >"$WORK/vrf.json"
    bench vrf "$WORK/vrf.json" "$node" "$pod"
else
    row "vrf ADD/DEL" "(skipped: kernel $(uname -r) has no VRF support)" "" ""
fi
ip -n "$node" link del bms$$

# tap: no reference in 1.1.1; ours against itself, to show its own cost.
jq -n '{cniVersion: "1.0.0", name: "bench", type: "tap", multiQueue: true}' >"$WORK/tap.json"
bench tap "$WORK/tap.json" "$node" "$pod" "$OURS_DIR/tap" |
    sed -E 's/^\| tap (ADD|DEL) \| [^|]* \| ([^|]*) \| [^|]* \|$/| tap \1 (no reference in 1.1.1) | - | \2 | - |/'
