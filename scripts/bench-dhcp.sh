#!/usr/bin/env bash
# Benchmark of the dhcp IPAM plugin and its daemon, ours against the reference (/usr/lib/cni/dhcp, Debian's
# containernetworking-plugins v1.1.1): ADD and DEL medians of the plugin alone (as an interface plugin
# delegates to it), each side with its own daemon, against dnsmasq in a "server" namespace on a veth to the pod.
# An ADD is a whole DISCOVER/OFFER/REQUEST/ACK through the daemon; a DEL sends the RELEASE. Ours and the
# reference alternate in one loop; the harness's own cost (exec of /bin/true) is measured and shown.
#
# Needs root and dnsmasq (scripts/setup.sh installs dnsmasq-base). Touches only the namespaces it makes and a
# temporary directory (daemons' sockets and state, dnsmasq's lease file), all removed on exit with the daemons.
#   BENCH_RUNS=N      ADD/DEL pairs per implementation (default 30)
#   OURS_DIR=dir      our binaries (default target/stage, built if missing)
#   REFERENCE=path    the reference plugin (default /usr/lib/cni/dhcp)
#   --medians         print only "<ours ADD> <ours DEL> <ref ADD> <ref DEL> <harness>" in microseconds
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/bench.sh

RUNS=${BENCH_RUNS:-30}
medians_only=0
[[ ${1:-} == --medians ]] && medians_only=1

bench_start bench-dhcp
command -v dnsmasq >/dev/null || die "needs dnsmasq (scripts/setup.sh installs dnsmasq-base)"
bench_plugin dhcp

NODE=dhcpbench-node-$$ POD=dhcpbench-pod-$$ SRV=dhcpbench-srv-$$

bench_netns "$NODE" "$POD" "$SRV"
bench_veth "$SRV" s0 10.77.0.1/24 "$POD" eth0

ip netns exec "$SRV" dnsmasq --keep-in-foreground --conf-file=/dev/null --no-resolv --no-hosts --port=0 \
    --interface=s0 --bind-interfaces --user=root --group=root --dhcp-authoritative \
    --dhcp-range=10.77.0.10,10.77.0.250,255.255.255.0,10m --dhcp-option=option:router,10.77.0.1 \
    --dhcp-leasefile="$WORK/leases" --pid-file="$WORK/dnsmasq.pid" --log-facility="$WORK/dnsmasq.log" &
bench_background
ip netns exec "$NODE" "$OURS" daemon -socketpath "$WORK/ours.sock" -statedir "$WORK/state" 2>"$WORK/ours.log" &
bench_background
ip netns exec "$NODE" "$REFERENCE" daemon -socketpath "$WORK/ref.sock" 2>"$WORK/ref.log" &
bench_background
for f in ours.sock ref.sock dnsmasq.log; do
    for ((i = 0; i < 100; i++)); do [[ -e $WORK/$f ]] && break; sleep 0.05; done
    [[ -e $WORK/$f ]] || die "$f did not appear"
done

for impl in ours ref; do
    printf '{"cniVersion":"1.0.0","name":"dhcpbench","type":"macvlan","ipam":{"type":"dhcp","daemonSocketPath":"%s"}}' \
        "$WORK/$impl.sock" >"$WORK/$impl.json"
done
export CNI_NETNS=/run/netns/$POD CNI_IFNAME=eth0 CNI_PATH=/usr/lib/cni CNI_CONTAINERID=bench
ours_add=() ours_del=() ref_add=() ref_del=() harness=()
us() { echo $(( ${2/./} - ${1/./} )); }
for ((i = 0; i < RUNS + 2; i++)); do
    for impl in ours ref; do
        [[ $impl == ours ]] && bin=$OURS || bin=$REFERENCE
        conf=$WORK/$impl.json
        t0=$EPOCHREALTIME
        CNI_COMMAND=ADD ip netns exec "$NODE" "$bin" <"$conf" >"$WORK/out" || die "$impl ADD failed: $(cat "$WORK/out")"
        t1=$EPOCHREALTIME
        # The address on eth0, as the interface plugin puts it there (not timed).
        addr=$(grep -o '"address": *"[^"]*"' "$WORK/out" | cut -d'"' -f4)
        ip -n "$POD" addr add "$addr" dev eth0
        t1=$EPOCHREALTIME
        CNI_COMMAND=DEL ip netns exec "$NODE" "$bin" <"$conf" >"$WORK/out" || die "$impl DEL failed: $(cat "$WORK/out")"
        t2=$EPOCHREALTIME
        ip -n "$POD" addr flush dev eth0
        if ((i >= 2)); then
            eval "${impl}_add+=($(us "$t0" "$t1"))"
            eval "${impl}_del+=($(us "$t1" "$t2"))"
        fi
    done
    t0=$EPOCHREALTIME
    ip netns exec "$NODE" /bin/true </dev/null >/dev/null
    t1=$EPOCHREALTIME
    harness+=($(us "$t0" "$t1"))
done
# Every DEL released its lease: dnsmasq's table is empty.
sleep 0.2
[[ -z $(cat "$WORK/leases" 2>/dev/null) ]] || die "dnsmasq still holds leases: $(cat "$WORK/leases")"

median() { printf "%s\n" "$@" | sort -n | awk "{ v[NR] = \$1 } END { print v[int((NR + 1) / 2)] }"; }
read -r oa od ra rd h <<<"$(median "${ours_add[@]}") $(median "${ours_del[@]}") $(median "${ref_add[@]}") $(median "${ref_del[@]}") $(median "${harness[@]}")"
if ((medians_only)); then
    echo "$oa $od $ra $rd $h"
    exit 0
fi
ms() { awk -v us="$1" 'BEGIN { printf "%.2f ms", us / 1000 }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.1fx", a / b; else print "-" }'; }
echo "dhcp ADD/DEL against dnsmasq, $RUNS pairs each, medians (load average $(cut -d' ' -f1-3 /proc/loadavg))"
printf "%-34s %12s %12s %12s\n" "" "ADD" "DEL" "ADD+DEL"
printf "%-34s %12s %12s %12s\n" "ours ($OURS_DIR/dhcp)" "$(ms "$oa")" "$(ms "$od")" "$(ms $((oa + od)))"
printf "%-34s %12s %12s %12s\n" "reference ($REFERENCE)" "$(ms "$ra")" "$(ms "$rd")" "$(ms $((ra + rd)))"
printf "%-34s %12s\n" "harness (ip netns exec /bin/true)" "$(ms "$h")"
printf "%-34s %12s %12s %12s\n" "speed-up" "$(ratio "$ra" "$oa")" "$(ratio "$rd" "$od")" "$(ratio $((ra + rd)) $((oa + od)))"
