#!/usr/bin/env bash
# Benchmark of the bandwidth plugin, ours against the reference (/usr/lib/cni/bandwidth, Debian's
# containernetworking-plugins v1.1.1):
#  1. ADD and DEL medians: each call is one exec of the plugin inside a "node" namespace, config on stdin,
#     timed by bash around the exec, ours and the reference alternating in the same loop; the harness's own
#     cost (exec of /bin/true the same way) is measured and shown.
#  2. Accuracy: TCP goodput (iperf3, the first second omitted) between a pod and a "wan" namespace beyond the
#     node, into the pod (ingress shaping) and out of it (egress shaping), as a percentage of the requested
#     rate. TCP goodput is at most ~95.6% of an Ethernet rate (1448 payload bytes per 1514-byte frame).
#
# Needs root, jq and iperf3. Touches only the namespaces it makes (removed on exit, also on failure).
#   BENCH_RUNS=N      ADD/DEL pairs per implementation (default 50)
#   BENCH_RATES="…"   rates in Mbit/s for the accuracy part (default "1 10 50")
#   BENCH_SECONDS=N   iperf3 duration per measurement (default 4, of which the first is omitted)
#   OURS_DIR=dir      our binaries (default target/stage, built if missing)
#   REFERENCE=path    the reference plugin (default /usr/lib/cni/bandwidth)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/bench.sh

RUNS=${BENCH_RUNS:-50}
RATES=${BENCH_RATES:-"1 10 50"}
SECONDS_PER_RUN=${BENCH_SECONDS:-4}

bench_start bench-bandwidth
command -v jq >/dev/null || die "needs jq"
command -v iperf3 >/dev/null || die "needs iperf3"
bench_plugin bandwidth

NODE=bwbench-node-$$ POD=bwbench-pod-$$ WAN=bwbench-wan-$$
HOST_VETH=bwbh$$ UPLINK=bwbu$$

# pod (eth0 10.1.0.2) ⇄ node (host veth 10.1.0.1, uplink 10.2.0.1) ⇄ wan (eth0 10.2.0.2)
bench_netns "$NODE" "$POD" "$WAN"
ip -n "$NODE" link add "$HOST_VETH" type veth peer name eth0 netns "$POD"
ip -n "$NODE" link add "$UPLINK" type veth peer name eth0 netns "$WAN"
ip -n "$NODE" addr add 10.1.0.1/24 dev "$HOST_VETH"
ip -n "$NODE" addr add 10.2.0.1/24 dev "$UPLINK"
ip -n "$POD" addr add 10.1.0.2/24 dev eth0
ip -n "$WAN" addr add 10.2.0.2/24 dev eth0
for link in "$NODE:$HOST_VETH" "$NODE:$UPLINK" "$POD:eth0" "$WAN:eth0"; do ip -n "${link%%:*}" link set "${link#*:}" up; done
ip -n "$POD" route add default via 10.1.0.1
ip -n "$WAN" route add 10.1.0.0/24 via 10.2.0.1
ip netns exec "$NODE" sysctl -qw net.ipv4.ip_forward=1

# The config a runtime passes after the main plugin: limits in bits/s and bits (burst = 25 ms of the rate,
# at least 4 frames), prevResult with the host veth and the pod interface.
make_conf() { # <rate bit/s>
    local rate=$1 burst=$(( $1 / 40 > 48448 ? $1 / 40 : 48448 ))
    jq -n --arg veth "$HOST_VETH" --arg pod "/run/netns/$POD" --argjson rate "$rate" --argjson burst "$burst" '{
        cniVersion: "1.0.0", name: "bwbench", type: "bandwidth",
        runtimeConfig: {bandwidth: {ingressRate: $rate, ingressBurst: $burst, egressRate: $rate, egressBurst: $burst}},
        prevResult: {cniVersion: "1.0.0",
            interfaces: [{name: $veth}, {name: "eth0", sandbox: $pod}],
            ips: [{address: "10.1.0.2/24", interface: 1}]}}'
}

# --- 1. ADD / DEL medians --------------------------------------------------------------------------------
make_conf 10000000 >"$WORK/conf.json"
ip netns exec "$NODE" env CNI_NETNS="/run/netns/$POD" CNI_IFNAME=eth0 CNI_PATH=/usr/lib/cni CNI_CONTAINERID=bench \
    scripts/lib/adddel-times.sh "$RUNS" 2 "ours:$OURS:$WORK/conf.json" "reference:$REFERENCE:$WORK/conf.json" \
    >"$WORK/times" || die "ADD/DEL loop failed"

# Nothing may be left after the DELs.
left=$(ip -n "$NODE" -o link show type ifb | wc -l)
[[ $left == 0 ]] || die "ifb devices left after DEL: $left"

echo
echo "bandwidth ADD/DEL (both directions shaped at 10 Mbit/s), $RUNS pairs each, medians"
adddel_table "$WORK/times" "ours ($OURS_DIR/bandwidth)" "reference ($REFERENCE)" harness

# --- 2. Accuracy ---------------------------------------------------------------------------------------------
# Goodput in bit/s from namespace $1 to the iperf3 server at $3 in namespace $2.
# Everything is bounded in time: a shaping mistake that drops packets must fail the run, not hang it.
measure() { # <sender ns> <receiver ns> <receiver address>
    timeout $((SECONDS_PER_RUN + 20)) ip netns exec "$2" iperf3 -s -1 -B "$3" -p 5201 >/dev/null 2>&1 &
    local server=$! tries=0
    sleep 0.2
    until timeout $((SECONDS_PER_RUN + 10)) ip netns exec "$1" \
        iperf3 -c "$3" -p 5201 -t "$SECONDS_PER_RUN" -O 1 -J --connect-timeout 2000 >"$WORK/iperf.json" 2>/dev/null; do
        if (( ++tries >= 20 )); then
            kill "$server" 2>/dev/null || true
            return 1
        fi
        sleep 0.1
    done
    wait "$server" || true
    jq '.end.sum_received.bits_per_second // 0' "$WORK/iperf.json"
}

# Goodput in bit/s from namespace $1 to an iperf3 server at $3 in namespace $2; a run whose results were
# lost (iperf3 reports 0) is repeated, up to 3 times.
goodput() { # <sender ns> <receiver ns> <receiver address>
    local result attempt
    for attempt in 1 2 3; do
        result=$(measure "$@") || { echo "iperf3 from $1 to $3 failed" >&2; return 1; }
        if awk -v r="$result" 'BEGIN { exit !(r > 0) }'; then echo "$result"; return 0; fi
        echo "iperf3 from $1 to $3 reported no data (attempt $attempt): $(jq -c '.error // .end' "$WORK/iperf.json")" >&2
    done
    echo 0
}

percent() { awk -v got="$1" -v want="$2" 'BEGIN { printf "%.1f%%", 100 * got / want }'; }

echo
echo "achieved TCP goodput as % of the requested rate (iperf3, ${SECONDS_PER_RUN}s, first second omitted)"
printf "%-12s %-10s %16s %16s\n" "rate" "plugin" "ingress (→pod)" "egress (pod→)"
for mbit in $RATES; do
    rate=$((mbit * 1000000))
    make_conf "$rate" >"$WORK/conf-$mbit.json"
    for impl in ours reference; do
        bin=$OURS; [[ $impl == reference ]] && bin=$REFERENCE
        env_args=(CNI_NETNS="/run/netns/$POD" CNI_IFNAME=eth0 CNI_PATH=/usr/lib/cni CNI_CONTAINERID=bench)
        ip netns exec "$NODE" env "${env_args[@]}" CNI_COMMAND=ADD "$bin" <"$WORK/conf-$mbit.json" >/dev/null \
            || die "$impl ADD at $mbit Mbit/s failed"
        ingress=$(goodput "$WAN" "$POD" 10.1.0.2) || die "no ingress measurement"
        egress=$(goodput "$POD" "$WAN" 10.2.0.2) || die "no egress measurement"
        ip netns exec "$NODE" env "${env_args[@]}" CNI_COMMAND=DEL "$bin" <"$WORK/conf-$mbit.json" >/dev/null \
            || die "$impl DEL at $mbit Mbit/s failed"
        printf "%-12s %-10s %16s %16s\n" "$mbit Mbit/s" "$impl" "$(percent "$ingress" "$rate")" "$(percent "$egress" "$rate")"
    done
done
