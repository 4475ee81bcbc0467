#!/usr/bin/env bash
# The benchmarks' one timing loop: ADD and DEL of each implementation, alternating in the same loop, each call one
# exec with its config on stdin, timed by bash's $EPOCHREALTIME around the exec. Run it inside the node namespace
# (`ip netns exec NODE scripts/lib/adddel-times.sh ...`), with CNI_NETNS, CNI_IFNAME and CNI_PATH in the
# environment; CNI_CONTAINERID too, else each round's calls are container `bench-<round>`.
#   adddel-times.sh RUNS WARMUP NAME:BINARY:CONF...
# Prints "<name> <ADD µs> <DEL µs>" per counted round and implementation, and "harness <µs> 0" per counted round:
# an exec of /bin/true the same way, the harness's own cost. The first WARMUP rounds (page cache, first bridge)
# are not printed. A failed call stops the loop with the plugin's output on stderr. Medians: scripts/lib/bench.sh.
set -euo pipefail
runs=$1 warmup=$2
shift 2
out=$(mktemp)
trap 'rm -f "$out"' EXIT
fixed_id=${CNI_CONTAINERID:-}
us() { echo $(( ${2/./} - ${1/./} )); }
for ((round = 0; round < runs + warmup; round++)); do
    export CNI_CONTAINERID=${fixed_id:-bench-$round}
    for spec in "$@"; do
        IFS=: read -r name bin conf <<<"$spec"
        t0=$EPOCHREALTIME
        CNI_COMMAND=ADD "$bin" <"$conf" >"$out" || { echo "ADD by $name failed: $(cat "$out")" >&2; exit 1; }
        t1=$EPOCHREALTIME
        CNI_COMMAND=DEL "$bin" <"$conf" >"$out" || { echo "DEL by $name failed: $(cat "$out")" >&2; exit 1; }
        t2=$EPOCHREALTIME
        ((round < warmup)) || echo "$name $(us "$t0" "$t1") $(us "$t1" "$t2")"
    done
    t0=$EPOCHREALTIME
    /bin/true <"$conf" >/dev/null
    t1=$EPOCHREALTIME
    ((round < warmup)) || echo "harness $(us "$t0" "$t1") 0"
done
