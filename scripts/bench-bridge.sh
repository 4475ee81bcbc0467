#!/usr/bin/env bash
# Benchmark: bridge + host-local ADD and DEL, ours against the reference binaries (/usr/lib/cni), on the same
# config (the bridge of conf/10-kubenet.conflist: cbr0, isGateway, ipMasq, hairpinMode, host-local), driven
# the same way: each call is one exec of the bridge binary inside a "node" namespace made for the run, with the
# config on stdin, timed by bash around the exec. Prints the medians as a table.
#
# Needs root. Touches only the namespaces it makes (removed on exit, also on failure).
#   BENCH_RUNS=N        ADD/DEL pairs per implementation (default 50)
#   BENCH_CONFLIST=f    conflist to take the bridge config from (default conf/10-kubenet.conflist)
#   OURS_DIR=dir        our binaries (default target/stage, built if missing)
#   REFERENCE_DIR=dir   reference binaries (default /usr/lib/cni)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/bench.sh

RUNS=${BENCH_RUNS:-50}
CONFLIST=${BENCH_CONFLIST:-conf/10-kubenet.conflist}
OURS_DIR=${OURS_DIR:-target/stage}
REFERENCE_DIR=${REFERENCE_DIR:-/usr/lib/cni}

bench_start bench-bridge
command -v jq >/dev/null || die "needs jq"
[[ -x $REFERENCE_DIR/bridge && -x $REFERENCE_DIR/host-local ]] || die "no reference bridge/host-local in $REFERENCE_DIR"
if [[ ! -x $OURS_DIR/bridge || ! -x $OURS_DIR/host-local ]]; then
    cni_build_release plugins
fi
OURS_DIR=$(realpath "$OURS_DIR")

NODE=brbench-node-$$
POD=brbench-pod-$$

# The bridge config of the conflist, as a runtime passes it (name and cniVersion injected), with the IPAM
# state in our temporary directory.
make_conf() { # <name> <dataDir>
    jq --arg name "$1" --arg data "$2" \
        '.cniVersion as $v | (.plugins[] | select(.type == "bridge")) + {cniVersion: $v, name: $name} | .ipam.dataDir = $data' \
        "$CONFLIST"
}

# Times RUNS ADD/DEL pairs of the bridge in $1 (a CNI_PATH directory), inside a node namespace of its own,
# each pair a new container; the first two pairs warm caches (page cache, first bridge creation) and are not
# counted. Prints adddel-times.sh's lines, named <label>.
bench() { # <cni dir> <label>
    local dir=$1 label=$2
    bench_netns "$NODE" "$POD"
    make_conf "bench-$label" "$WORK/ipam-$label" >"$WORK/conf-$label.json"
    ip netns exec "$NODE" env CNI_NETNS="/run/netns/$POD" CNI_IFNAME=eth0 CNI_PATH="$dir" \
        scripts/lib/adddel-times.sh "$RUNS" 2 "$label:$dir/bridge:$WORK/conf-$label.json"
    ip netns delete "$POD"
    ip netns delete "$NODE"
}

ours_dir=$WORK/cni-ours
ref_dir=$WORK/cni-reference
mkdir -p "$ours_dir" "$ref_dir"
ln -s "$OURS_DIR/bridge" "$OURS_DIR/host-local" "$ours_dir/"
ln -s "$REFERENCE_DIR/bridge" "$REFERENCE_DIR/host-local" "$ref_dir/"

bench "$ours_dir" ours >"$WORK/times"
bench "$ref_dir" reference >>"$WORK/times"

echo
echo "bridge + host-local, $RUNS ADD/DEL pairs each, medians ($(basename "$CONFLIST"), bridge config)"
adddel_table "$WORK/times" "ours ($OURS_DIR)" "reference ($REFERENCE_DIR)"
