# Shared by the benchmark scripts of single plugins (sourced): their scratch (a work directory, namespaces,
# background daemons, all gone on exit), medians of what scripts/lib/adddel-times.sh printed, and the
# ours-against-the-reference table.

source "$(dirname "${BASH_SOURCE[0]}")/binaries.sh"

# bench_start NAME: names the benchmark for `die`, refuses to run unless root, and makes $WORK
# (/tmp/NAME.XXXXXX). On exit, also on failure, the processes given to bench_background end, the namespaces
# made by bench_netns go, the mount points in bench_mounts are unmounted and $WORK is removed.
bench_start() {
    bench_name=$1
    [[ $(id -u) == 0 ]] || die "needs root (network namespaces)"
    WORK=$(mktemp -d "/tmp/$1.XXXXXX")
    bench_namespaces=() bench_pids=() bench_mounts=()
    trap bench_cleanup EXIT
}

bench_cleanup() {
    local pid ns mount
    for pid in "${bench_pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${bench_pids[@]}"; do wait "$pid" 2>/dev/null || true; done
    for ns in "${bench_namespaces[@]}"; do ip netns delete "$ns" 2>/dev/null || true; done
    for mount in "${bench_mounts[@]}"; do umount "$mount" 2>/dev/null || true; done
    rm -rf "$WORK"
}

# die MESSAGE: says it, named, and stops the benchmark.
die() { echo "${bench_name:-bench}: $*" >&2; exit 1; }

# bench_netns NAME...: network namespaces with their loopback up, deleted on exit.
bench_netns() {
    local ns
    for ns; do ip netns add "$ns"; bench_namespaces+=("$ns"); ip -n "$ns" link set lo up; done
}

# bench_plugin PLUGIN: $OURS, our PLUGIN from $OURS_DIR (default target/stage; built if missing), and
# $REFERENCE, the reference's (default /usr/lib/cni/PLUGIN), which must be there.
bench_plugin() {
    OURS_DIR=${OURS_DIR:-target/stage}
    REFERENCE=${REFERENCE:-/usr/lib/cni/$1}
    [[ -x $REFERENCE ]] || die "no reference plugin at $REFERENCE"
    [[ -x $OURS_DIR/$1 ]] || cni_build_release plugins
    OURS=$(realpath "$OURS_DIR/$1")
}

# bench_veth NS NAME ADDRESS PEER_NS PEER_NAME [PEER_ADDRESS]: a veth pair between two namespaces, both ends
# up, with the addresses given ("" for none).
bench_veth() {
    local ns=$1 name=$2 address=$3 peer_ns=$4 peer=$5 peer_address=${6:-}
    ip -n "$ns" link add "$name" type veth peer name "$peer" netns "$peer_ns"
    [[ -z $address ]] || ip -n "$ns" addr add "$address" dev "$name"
    [[ -z $peer_address ]] || ip -n "$peer_ns" addr add "$peer_address" dev "$peer"
    ip -n "$ns" link set "$name" up
    ip -n "$peer_ns" link set "$peer" up
}

# bench_background: the last process started in the background ($!) is ended on exit.
bench_background() { bench_pids+=("$!"); }

# median_us NAME COLUMN <TIMES: the median (µs) of column COLUMN (2 = ADD, 3 = DEL) of NAME's lines.
median_us() {
    awk -v n="$1" -v c="$2" '$1 == n { print $c }' | sort -n | awk '{ v[NR] = $1 } END { print (NR ? v[int((NR + 1) / 2)] : 0) }'
}

# µs as "1.23 ms".
ms() { awk -v us="$1" 'BEGIN { printf "%.2f ms", us / 1000 }'; }

# a / b as "2.5x" ("-" when b is 0).
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.1fx", a / b; else print "-" }'; }

# adddel_table TIMES OURS_LABEL REF_LABEL [harness]: ADD, DEL and ADD+DEL medians of "ours" and "reference" in
# TIMES and the speed-up; with "harness", also the harness's cost and the speed-up net of it.
adddel_table() {
    local times=$1 ours_label=$2 ref_label=$3 with_harness=${4:-}
    local ours_add ours_del ref_add ref_del harness=0 width=34
    ours_add=$(median_us ours 2 <"$times") ours_del=$(median_us ours 3 <"$times")
    ref_add=$(median_us reference 2 <"$times") ref_del=$(median_us reference 3 <"$times")
    [[ -z $with_harness ]] || harness=$(median_us harness 2 <"$times")
    net() { echo $(( $1 > harness ? $1 - harness : 0 )); }
    printf "%-${width}s %12s %12s %12s\n" "" "ADD" "DEL" "ADD+DEL"
    printf "%-${width}s %12s %12s %12s\n" "$ours_label" "$(ms "$ours_add")" "$(ms "$ours_del")" "$(ms $((ours_add + ours_del)))"
    printf "%-${width}s %12s %12s %12s\n" "$ref_label" "$(ms "$ref_add")" "$(ms "$ref_del")" "$(ms $((ref_add + ref_del)))"
    if [[ -n $with_harness ]]; then
        printf "%-${width}s %12s\n" "harness (exec of /bin/true)" "$(ms "$harness")"
        printf "%-${width}s %12s %12s %12s\n" "speed-up, net of harness" "$(ratio "$(net "$ref_add")" "$(net "$ours_add")")" \
            "$(ratio "$(net "$ref_del")" "$(net "$ours_del")")" \
            "$(ratio "$(net $((ref_add + ref_del)))" "$(net $((ours_add + ours_del)))")"
    else
        printf "%-${width}s %12s %12s %12s\n" "speed-up" "$(ratio "$ref_add" "$ours_add")" "$(ratio "$ref_del" "$ours_del")" \
            "$(ratio $((ref_add + ref_del)) $((ours_add + ours_del)))"
    fi
}
