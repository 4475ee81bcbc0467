#!/usr/bin/env bash
# host-local ADD and DEL latency with 0, 1,000 and 60,000 leases in the network: ours (release build)
# against the reference binary, run alternately in the same conditions, medians. Prints a table.
#
#   scripts/bench-host-local.sh                    # RUNS=20 by default
#   RUNS=50 BENCH_DIR=/var/lib/cni/bench scripts/bench-host-local.sh
#
# Leases are pre-filled by writing the files directly (as the reference would have: `<id>\r\n<ifname>`,
# last_reserved_ip.0 after the last one), each implementation on its own copy of the network. Every run is
# an ADD of a new container followed by its DEL, so the lease count stays constant. The harness overhead
# (fork + exec + wait of /bin/true, measured the same way) is shown and included in every figure.
set -euo pipefail
export LC_ALL=C

cd "$(dirname "$0")/.."
source scripts/lib/binaries.sh
RUNS=${RUNS:-20}
REFERENCE=${REFERENCE:-/usr/lib/cni/host-local}
COUNTS=${COUNTS:-"0 1000 60000"}
OURS=$PWD/target/stage/host-local

[ -x "$REFERENCE" ] || { echo "reference $REFERENCE missing: apt-get install containernetworking-plugins" >&2; exit 1; }
cni_build_release plugins

# On disk (not tmpfs), like /var/lib/cni/networks.
WORK=$(mktemp -d "${BENCH_DIR:-/var/tmp}/hl-bench.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

NET=bench

median() { sort -n | awk '{ v[NR] = $1 } END { if (NR == 0) { print "nan"; exit } m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2; printf "%.2f", m / 1000 }'; }

# prefill <dataDir> <count>: leases 10.128.0.2 ... in 10.128.0.0/16.
prefill() {
    local dir=$1/$NET count=$2 n idx ip=""
    mkdir -p "$dir"
    for ((n = 0; n < count; n++)); do
        idx=$((n + 2))
        ip="10.128.$((idx >> 8)).$((idx & 255))"
        printf 'prefill-%06d\r\neth0' "$n" >"$dir/$ip"
    done
    [ -n "$ip" ] && printf '%s' "$ip" >"$dir/last_reserved_ip.0"
    return 0
}

write_conf() {
    printf '{"cniVersion":"1.0.0","name":"%s","type":"bridge","ipam":{"type":"host-local","dataDir":"%s","ranges":[[{"subnet":"10.128.0.0/16"}]]}}' \
        "$NET" "$1" >"$2"
}

# plugin <binary> <verb> <conf> <container id>
plugin() {
    CNI_COMMAND=$2 CNI_CONTAINERID=$4 CNI_NETNS=/var/run/netns/bench CNI_IFNAME=eth0 CNI_PATH=/nonexistent \
        "$1" <"$3" >"$WORK/out" || { echo "$1 $2 failed: $(cat "$WORK/out")" >&2; exit 1; }
}

# The harness overhead: the same fork/exec/wait with a binary doing nothing.
for ((i = 0; i < RUNS; i++)); do
    t0=${EPOCHREALTIME/./}; /bin/true <"$WORK" 2>/dev/null || true; t1=${EPOCHREALTIME/./}; echo $((t1 - t0))
done | median >"$WORK/overhead"

declare -A RESULT
for count in $COUNTS; do
    for impl in ours ref; do
        rm -rf "${WORK:?}/$impl"
        prefill "$WORK/$impl" "$count"
        write_conf "$WORK/$impl" "$WORK/$impl.json"
    done
    # First call after the pre-fill: ours rebuilds its index from a scan of the lease files (once).
    t0=${EPOCHREALTIME/./}; plugin "$OURS" ADD "$WORK/ours.json" warmup; t1=${EPOCHREALTIME/./}
    RESULT[first,$count]=$(echo $((t1 - t0)) | median)
    plugin "$OURS" DEL "$WORK/ours.json" warmup
    plugin "$REFERENCE" ADD "$WORK/ref.json" warmup
    plugin "$REFERENCE" DEL "$WORK/ref.json" warmup
    # Each run a new container (bench-<run>), ours and the reference alternating.
    env CNI_NETNS=/var/run/netns/bench CNI_IFNAME=eth0 CNI_PATH=/nonexistent scripts/lib/adddel-times.sh "$RUNS" 0 \
        "ours:$OURS:$WORK/ours.json" "ref:$REFERENCE:$WORK/ref.json" >"$WORK/times"
    for impl in ours ref; do
        RESULT[$impl.add,$count]=$(awk -v n="$impl" '$1 == n { print $2 }' "$WORK/times" | median)
        RESULT[$impl.del,$count]=$(awk -v n="$impl" '$1 == n { print $3 }' "$WORK/times" | median)
    done
    leases=$(find "$WORK/ours/$NET" -maxdepth 1 -name '10.*' | wc -l)
    [ "$leases" -eq "$count" ] || { echo "expected $count leases after the runs, found $leases" >&2; exit 1; }
done

echo "host-local: median of $RUNS ADD and $RUNS DEL per cell, in ms; $(uname -r), $(nproc) CPUs, $(date -u +%Y-%m-%d)"
echo "harness overhead (fork+exec+wait of /bin/true, included below): $(cat "$WORK/overhead") ms"
echo
printf '| %-7s | %-8s | %-8s | %-8s | %-8s | %-25s |\n' leases "ADD ours" "ADD ref" "DEL ours" "DEL ref" "ours, first ADD (rebuild)"
printf '|%s|%s|%s|%s|%s|%s|\n' --------- ---------- ---------- ---------- ---------- ---------------------------
for count in $COUNTS; do
    printf '| %7s | %8s | %8s | %8s | %8s | %25s |\n' "$count" "${RESULT[ours.add,$count]}" "${RESULT[ref.add,$count]}" \
        "${RESULT[ours.del,$count]}" "${RESULT[ref.del,$count]}" "${RESULT[first,$count]}"
done
last=${COUNTS##* }
echo
awk -v v="${RESULT[ours.add,$last]}" -v n="$last" 'BEGIN { printf "goal: ours ADD at %s leases < 3 ms: %s (%.2f ms)\n", n, (v < 3 ? "met" : "MISSED"), v }'
