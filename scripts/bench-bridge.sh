#!/usr/bin/env bash
# Benchmark: bridge + host-local ADD and DEL, ours against the reference binaries (/usr/lib/cni), on the same
# config (the bridge of conf/10-kubenet.conflist: cbr0, isGateway, ipMasq, hairpinMode, host-local), driven
# the same way: each call is one exec of the bridge binary inside a "node" namespace made for the run, with the
# config on stdin, timed by bash around the exec. Prints the medians as a table.
#
# Needs root. Touches only the namespaces it makes (removed on exit, also on failure).
#   BENCH_RUNS=N        ADD/DEL pairs per implementation (default 50)
#   BENCH_CONFLIST=f    conflist to take the bridge config from (default conf/10-kubenet.conflist)
#   OURS_DIR=dir        our binaries (default target/release, built if missing)
#   REFERENCE_DIR=dir   reference binaries (default /usr/lib/cni)
set -euo pipefail
cd "$(dirname "$0")/.."

RUNS=${BENCH_RUNS:-50}
CONFLIST=${BENCH_CONFLIST:-conf/10-kubenet.conflist}
OURS_DIR=${OURS_DIR:-target/release}
REFERENCE_DIR=${REFERENCE_DIR:-/usr/lib/cni}

[[ $(id -u) == 0 ]] || { echo "bench-bridge: needs root (network namespaces)" >&2; exit 1; }
command -v jq >/dev/null || { echo "bench-bridge: needs jq" >&2; exit 1; }
[[ -x $REFERENCE_DIR/bridge && -x $REFERENCE_DIR/host-local ]] || {
    echo "bench-bridge: no reference bridge/host-local in $REFERENCE_DIR" >&2; exit 1; }
if [[ ! -x $OURS_DIR/bridge || ! -x $OURS_DIR/host-local ]]; then
    cargo build --release --quiet -p bridge -p host-local
fi
OURS_DIR=$(realpath "$OURS_DIR")

NODE=brbench-node-$$
POD=brbench-pod-$$
WORK=$(mktemp -d /tmp/bench-bridge.XXXXXX)
cleanup() {
    ip netns delete "$POD" 2>/dev/null || true
    ip netns delete "$NODE" 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT

# The bridge config of the conflist, as a runtime passes it (name and cniVersion injected), with the IPAM
# state in our temporary directory.
make_conf() { # <name> <dataDir>
    jq --arg name "$1" --arg data "$2" \
        '.cniVersion as $v | (.plugins[] | select(.type == "bridge")) + {cniVersion: $v, name: $name} | .ipam.dataDir = $data' \
        "$CONFLIST"
}

# Times RUNS ADD/DEL pairs of the bridge in $1 (a CNI_PATH directory), inside the node namespace.
# Prints "<add medians µs> <del median µs>".
bench() { # <cni dir> <label>
    local dir=$1 label=$2
    ip netns add "$NODE"
    ip netns add "$POD"
    ip -n "$NODE" link set lo up
    ip -n "$POD" link set lo up
    make_conf "bench-$label" "$WORK/ipam-$label" >"$WORK/conf-$label.json"
    ip netns exec "$NODE" bash -c '
        set -euo pipefail
        dir=$1 conf=$2 runs=$3 pod=$4
        export CNI_NETNS=/run/netns/$pod CNI_IFNAME=eth0 CNI_PATH=$dir
        add=() del=()
        for ((i = 0; i < runs + 2; i++)); do
            id=bench-$i
            t0=$EPOCHREALTIME
            CNI_COMMAND=ADD CNI_CONTAINERID=$id "$dir/bridge" <"$conf" >/dev/null || { echo "ADD failed" >&2; exit 1; }
            t1=$EPOCHREALTIME
            CNI_COMMAND=DEL CNI_CONTAINERID=$id "$dir/bridge" <"$conf" >/dev/null || { echo "DEL failed" >&2; exit 1; }
            t2=$EPOCHREALTIME
            # The first two pairs warm caches (page cache, first bridge creation) and are not counted.
            if ((i >= 2)); then
                add+=($(( (${t1/./} - ${t0/./}) )))
                del+=($(( (${t2/./} - ${t1/./}) )))
            fi
        done
        median() { printf "%s\n" "$@" | sort -n | awk "{ v[NR] = \$1 } END { print v[int((NR + 1) / 2)] }"; }
        echo "$(median "${add[@]}") $(median "${del[@]}")"
    ' bench "$dir" "$WORK/conf-$label.json" "$RUNS" "$POD"
    ip netns delete "$POD"
    ip netns delete "$NODE"
}

ours_dir=$WORK/cni-ours
ref_dir=$WORK/cni-reference
mkdir -p "$ours_dir" "$ref_dir"
ln -s "$OURS_DIR/bridge" "$OURS_DIR/host-local" "$ours_dir/"
ln -s "$REFERENCE_DIR/bridge" "$REFERENCE_DIR/host-local" "$ref_dir/"

ours=$(bench "$ours_dir" ours)
reference=$(bench "$ref_dir" reference)
read -r ours_add ours_del <<<"$ours"
read -r ref_add ref_del <<<"$reference"

ms() { awk -v us="$1" 'BEGIN { printf "%.2f ms", us / 1000 }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.1fx", a / b; else print "-" }'; }

echo
echo "bridge + host-local, $RUNS ADD/DEL pairs each, medians ($(basename "$CONFLIST"), bridge config)"
printf "%-28s %12s %12s %12s\n" "" "ADD" "DEL" "ADD+DEL"
printf "%-28s %12s %12s %12s\n" "ours ($OURS_DIR)" "$(ms "$ours_add")" "$(ms "$ours_del")" "$(ms $((ours_add + ours_del)))"
printf "%-28s %12s %12s %12s\n" "reference ($REFERENCE_DIR)" "$(ms "$ref_add")" "$(ms "$ref_del")" "$(ms $((ref_add + ref_del)))"
printf "%-28s %12s %12s %12s\n" "speed-up" "$(ratio "$ref_add" "$ours_add")" "$(ratio "$ref_del" "$ours_del")" \
    "$(ratio $((ref_add + ref_del)) $((ours_add + ours_del)))"
