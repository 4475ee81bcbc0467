#!/usr/bin/env bash
# Benchmark of the link plugins, ours against the reference (Debian's containernetworking-plugins in /usr/lib/cni):
# ADD and DEL medians of ptp (ipMasq, iptables), macvlan, ipvlan, vlan and dummy, each with host-local (ours with
# ours, the reference's with the reference's). Each call is one exec of the plugin inside a "node" namespace
# whose uplink (a veth to a "lan" namespace) is the master, config on stdin, timed by bash around the exec, ours
# and the reference alternating in one loop. A plugin whose link kind this kernel lacks (ipvlan, vlan, dummy on
# some kernels) or that the reference lacks (dummy in 1.1.1) gets a row saying so instead of figures.
# Prints markdown table rows (scripts/bench.sh puts them in docs/benchmarks.md) after a header line.
#
# Needs root. Touches only the namespaces it makes and a temporary dataDir (removed on exit).
#   RUNS=N            ADD/DEL pairs per implementation (default 20)
#   OURS_DIR=dir      our binaries (default target/stage, built if missing)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/bench.sh

RUNS=${RUNS:-20}
OURS_DIR=${OURS_DIR:-target/stage}
REF_DIR=/usr/lib/cni
PLUGINS=(ptp macvlan ipvlan vlan dummy)

bench_start bench-links
missing=()
for p in "${PLUGINS[@]}" host-local; do [[ -x $OURS_DIR/$p ]] || missing+=(-p "$p"); done
((${#missing[@]} == 0)) || cni_build_release plugins
OURS_DIR=$(realpath "$OURS_DIR")

NODE=lkbench-node-$$ LAN=lkbench-lan-$$ POD=lkbench-pod-$$
bench_netns "$NODE" "$LAN" "$POD"
bench_veth "$NODE" up0 10.69.0.1/24 "$LAN" eth0

# The config of each plugin; host-local keeps its leases in the work directory.
conf() {
    local ipam='{"type":"host-local","dataDir":"'$WORK'/ipam","ranges":[[{"subnet":"'$2'"}]]}'
    case $1 in
        ptp) echo '{"cniVersion":"1.0.0","name":"lkb-ptp","type":"ptp","ipMasq":true,"ipam":'"$ipam"'}' ;;
        macvlan) echo '{"cniVersion":"1.0.0","name":"lkb-mv","type":"macvlan","master":"up0","ipam":'"$ipam"'}' ;;
        ipvlan) echo '{"cniVersion":"1.0.0","name":"lkb-iv","type":"ipvlan","master":"up0","ipam":'"$ipam"'}' ;;
        vlan) echo '{"cniVersion":"1.0.0","name":"lkb-vl","type":"vlan","master":"up0","vlanId":100,"ipam":'"$ipam"'}' ;;
        dummy) echo '{"cniVersion":"1.0.0","name":"lkb-dm","type":"dummy","ipam":'"$ipam"'}' ;;
    esac
}

# True when the kernel can make links of this kind (probed in the node namespace, removed again).
kernel_has() {
    case $1 in
        ptp | macvlan) return 0 ;;
        dummy) ip -n "$NODE" link add probe0 type dummy 2>/dev/null ;;
        vlan) ip -n "$NODE" link add link up0 name probe0 type vlan id 2 2>/dev/null ;;
        ipvlan) ip -n "$NODE" link add link up0 name probe0 type ipvlan 2>/dev/null ;;
    esac || return 1
    ip -n "$NODE" link del probe0
}

us() { echo $((${2/./} - ${1/./})); }
median() { printf "%s\n" "$@" | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
ms() { awk -v us="$1" 'BEGIN { printf "%.1f ms", us / 1000 }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.1fx", a / b; else print "-" }'; }
row() { printf '| %s | %s | %s | %s |\n' "$1" "$2" "$3" "$4"; }

# call SIDE_DIR PLUGIN VERB: one exec in the node namespace.
call() {
    CNI_COMMAND=$3 CNI_CONTAINERID=lkbench CNI_NETNS=/run/netns/$POD CNI_IFNAME=eth0 CNI_PATH=$1 \
        nsenter --net=/run/netns/$NODE "$1/$2" <"$WORK/conf.json" >"$WORK/out" ||
        die "$1/$2 $3 failed: $(cat "$WORK/out")"
}

echo "| figure (median, $RUNS runs) | reference | ours | speed-up |"
echo "|---|---|---|---|"
subnet=10.70.0.0/24
for p in "${PLUGINS[@]}"; do
    [[ $p == vlan || $p == ipvlan ]] && subnet=10.69.0.0/24
    conf "$p" "$subnet" >"$WORK/conf.json"
    if ! kernel_has "$p"; then
        row "$p ADD / DEL (+ host-local)" "not measured: kernel $(uname -r) has no $p links" "" ""
        continue
    fi
    sides=(ours ref)
    [[ -x $REF_DIR/$p ]] || sides=(ours)
    declare -A add=() del=()
    for ((i = 0; i < RUNS + 2; i++)); do
        for side in "${sides[@]}"; do
            dir=$OURS_DIR
            [[ $side == ref ]] && dir=$REF_DIR
            t0=$EPOCHREALTIME
            call "$dir" "$p" ADD
            t1=$EPOCHREALTIME
            call "$dir" "$p" DEL
            t2=$EPOCHREALTIME
            # The first two rounds warm the page cache and are not counted.
            if ((i >= 2)); then
                add[$side]+="$(us "$t0" "$t1") "
                del[$side]+="$(us "$t1" "$t2") "
            fi
        done
    done
    oa=$(median ${add[ours]}) od=$(median ${del[ours]})
    if [[ -n ${add[ref]:-} ]]; then
        ra=$(median ${add[ref]}) rd=$(median ${del[ref]})
        row "$p ADD (+ host-local)" "$(ms "$ra")" "$(ms "$oa")" "$(ratio "$ra" "$oa")"
        row "$p DEL (+ host-local)" "$(ms "$rd")" "$(ms "$od")" "$(ratio "$rd" "$od")"
    else
        row "$p ADD (+ host-local)" "(not in the reference $(dpkg-query -W -f '${Version}' containernetworking-plugins 2>/dev/null))" "$(ms "$oa")" ""
        row "$p DEL (+ host-local)" "" "$(ms "$od")" ""
    fi
    unset add del
done
