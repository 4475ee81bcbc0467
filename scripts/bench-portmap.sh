#!/usr/bin/env bash
# Benchmark of the portmap plugin: ADD and DEL medians of one container (a TCP and a UDP mapping) with 0, 100
# and 1,000 other containers' mappings installed, for our iptables backend, our nftables backend and the
# reference (/usr/lib/cni/portmap, Debian's containernetworking-plugins v1.1.1, iptables only).
#
# Each call is one exec of the plugin by a bash loop running inside a "node" namespace (so no `ip netns exec`
# per call), timed with $EPOCHREALTIME around the exec; ours and the reference alternate in the same loop on
# the same rule set. The harness's own cost (exec of /bin/true the same way) is measured and shown; the
# figures are not corrected for it. The other containers are installed by our plugin (for iptables the rules
# are byte-for-byte the reference's).
#
# Needs root, iptables and nft. Touches only the namespaces it makes (removed on exit, also on failure).
#   BENCH_RUNS=N      ADD/DEL pairs per implementation and level (default 21)
#   BENCH_LEVELS="…"  numbers of other containers (default "0 100 1000")
#   OURS_DIR=dir      our binaries (default target/stage, built if missing)
#   REFERENCE=path    the reference plugin (default /usr/lib/cni/portmap)
set -euo pipefail

# ---- inner modes, run inside the node namespace by the outer script ----

# __populate <binary> <backend> <from> <to>: ADD containers from..to-1, one TCP mapping each.
if [[ ${1:-} == __populate ]]; then
    bin=$2 backend=$3 from=$4 to=$5
    export CNI_COMMAND=ADD CNI_IFNAME=eth0 CNI_PATH=/nonexistent CNI_NETNS=$BENCH_POD_NETNS
    for ((i = from; i < to; i++)); do
        ip="10.100.$((i / 250)).$((i % 250 + 2))"
        conf=$(printf '{"cniVersion":"1.0.0","name":"bench","type":"portmap","backend":"%s","runtimeConfig":{"portMappings":[{"hostPort":%d,"containerPort":80,"protocol":"tcp"}]},"prevResult":{"cniVersion":"1.0.0","interfaces":[{"name":"eth0","sandbox":"%s"}],"ips":[{"address":"%s/16","interface":0}]}}' \
            "$backend" $((20000 + i)) "$BENCH_POD_NETNS" "$ip")
        CNI_CONTAINERID="other-$i" "$bin" <<<"$conf" >/dev/null || { echo "populate: ADD other-$i failed" >&2; exit 1; }
    done
    exit 0
fi

# ---- outer script ----

cd "$(dirname "$0")/.."
SELF=$(realpath "$0")
source scripts/lib/bench.sh
RUNS=${BENCH_RUNS:-21}
LEVELS=${BENCH_LEVELS:-"0 100 1000"}

bench_start bench-portmap
command -v iptables-restore >/dev/null || die "needs iptables"
command -v nft >/dev/null || die "needs nft"
bench_plugin portmap


POD=pmbench-pod-$$
bench_netns "$POD"
export BENCH_POD_NETNS=/run/netns/$POD

# A node namespace with a link towards the pods (route_localnet is set on it, as on a bridge).
make_node() { # <name>
    bench_netns "$1"
    ip -n "$1" link add pods type veth peer name pods-peer
    ip -n "$1" addr add 10.96.0.1/12 dev pods
    ip -n "$1" link set pods up
}

conf_for() { # <backend> → file
    local file=$WORK/conf-$1.json
    printf '{"cniVersion":"1.0.0","name":"bench","type":"portmap","backend":"%s","runtimeConfig":{"portMappings":[{"hostPort":8080,"containerPort":80,"protocol":"tcp"},{"hostPort":8053,"containerPort":53,"protocol":"udp"}]},"prevResult":{"cniVersion":"1.0.0","interfaces":[{"name":"eth0","sandbox":"%s"}],"ips":[{"address":"10.99.0.5/16","interface":0}]}}' \
        "$1" "$BENCH_POD_NETNS" >"$file"
    echo "$file"
}

median() { sort -n | awk '{v[NR]=$1} END {if (NR == 0) print "-"; else printf "%.1f", v[int((NR + 1) / 2)] / 1000}'; }
ms_1() { awk '{ printf "%.1f", $1 / 1000 }'; } # µs on stdin as ms with one decimal

# Rows: "<backend> <impl> <level> <add ms> <del ms>".
ROWS=$WORK/rows
HARNESS=$WORK/harness
: >"$ROWS"; : >"$HARNESS"

bench_backend() { # <backend> <impl>... (ours, reference)
    local backend=$1 node=pmbench-$1-$$ installed=0 level conf out specs=() impls=("${@:2}")
    make_node "$node"
    conf=$(conf_for "$backend")
    for impl in "${impls[@]}"; do
        if [[ $impl == ours ]]; then specs+=("ours:$OURS:$conf"); else specs+=("reference:$REFERENCE:$conf"); fi
    done
    for level in $LEVELS; do
        if ((level > installed)); then
            echo "  $backend: installing containers $installed..$((level - 1))" >&2
            ip netns exec "$node" bash "$SELF" __populate "$OURS" "$backend" "$installed" "$level"
            installed=$level
        fi
        echo "  $backend: measuring with $level installed" >&2
        out=$WORK/measure-$backend-$level
        ip netns exec "$node" env CNI_IFNAME=eth0 CNI_PATH=/nonexistent CNI_NETNS="$BENCH_POD_NETNS" \
            CNI_CONTAINERID=bench-pod scripts/lib/adddel-times.sh "$RUNS" 0 "${specs[@]}" >"$out"
        grep '^harness' "$out" | awk '{print $2}' >>"$HARNESS"
        local impl
        for impl in "${impls[@]}"; do
            echo "$backend $impl $level $(median_us "$impl" 2 <"$out" | ms_1) $(median_us "$impl" 3 <"$out" | ms_1)" >>"$ROWS"
        done
    done
}

echo "portmap benchmark: $RUNS runs per cell, levels: $LEVELS" >&2
bench_backend iptables ours reference
bench_backend nftables ours

echo
echo "portmap ADD / DEL medians in ms (one exec each; $RUNS runs; other containers' mappings installed)"
echo "machine: $(nproc) CPUs, $(uname -r), $(iptables --version), $(nft --version | head -1)"
echo "harness overhead (exec of /bin/true the same way): median $(median <"$HARNESS") ms"
echo
printf '%-9s %-10s %10s %9s %9s %14s %14s\n' backend impl installed "ADD ms" "DEL ms" "ADD vs ours" "DEL vs ours"
while read -r backend impl level add del; do
    ours_add=$(awk -v b="$backend" -v l="$level" '$1 == b && $2 == "ours" && $3 == l {print $4}' "$ROWS")
    ours_del=$(awk -v b="$backend" -v l="$level" '$1 == b && $2 == "ours" && $3 == l {print $5}' "$ROWS")
    ratio_add=$(awk -v a="$add" -v o="$ours_add" 'BEGIN {printf "%.1fx", a / o}')
    ratio_del=$(awk -v a="$del" -v o="$ours_del" 'BEGIN {printf "%.1fx", a / o}')
    printf '%-9s %-10s %10s %9s %9s %14s %14s\n' "$backend" "$impl" "$level" "$add" "$del" "$ratio_add" "$ratio_del"
done <"$ROWS"
echo
for backend in iptables nftables; do
    first=$(awk -v b="$backend" '$1 == b && $2 == "ours" {print $4; exit}' "$ROWS")
    last=$(awk -v b="$backend" '$1 == b && $2 == "ours" {v = $4} END {print v}' "$ROWS")
    awk -v b="$backend" -v f="$first" -v l="$last" 'BEGIN {printf "ours %s: ADD at the largest level / ADD at the smallest = %.2f\n", b, l / f}'
done
