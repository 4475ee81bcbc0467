#!/usr/bin/env bash
# Benchmark of the tuning plugin, ours against the reference (/usr/lib/cni/tuning, Debian's
# containernetworking-plugins v1.1.1): ADD and DEL medians of a config that changes the pod interface's MAC, MTU,
# promiscuous and all-multicast mode and two sysctls. Each call is one exec of the plugin inside a "node"
# namespace, config on stdin, timed by bash around the exec, ours and the reference alternating in the same
# loop; the harness's own cost (exec of /bin/true the same way) is measured and shown.
#
# Needs root and jq. Touches only the namespaces it makes and a temporary dataDir (removed on exit).
#   BENCH_RUNS=N      ADD/DEL pairs per implementation (default 100)
#   OURS_DIR=dir      our binaries (default target/stage, built if missing)
#   REFERENCE=path    the reference plugin (default /usr/lib/cni/tuning)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/bench.sh

RUNS=${BENCH_RUNS:-100}

bench_start bench-tuning
command -v jq >/dev/null || die "needs jq"
bench_plugin tuning

NODE=tunbench-node-$$ POD=tunbench-pod-$$

bench_netns "$NODE" "$POD"
ip -n "$NODE" link add tbh$$ type veth peer name eth0 netns "$POD"
before=$(ip -n "$POD" -d link show eth0)

jq -n --arg pod "/run/netns/$POD" --arg dir "$WORK/data" '{
    cniVersion: "1.0.0", name: "tunbench", type: "tuning", dataDir: $dir,
    mac: "c2:11:22:33:44:55", mtu: 1400, promisc: true, allmulti: true,
    sysctl: {"net.core.somaxconn": "512", "net.ipv4.conf.IFNAME.arp_filter": "1"},
    prevResult: {cniVersion: "1.0.0", interfaces: [{name: "eth0", sandbox: $pod}],
        ips: [{address: "10.1.0.2/24", interface: 0}]}}' >"$WORK/conf.json"

ip netns exec "$NODE" env CNI_NETNS="/run/netns/$POD" CNI_IFNAME=eth0 CNI_PATH=/usr/lib/cni CNI_CONTAINERID=bench \
    scripts/lib/adddel-times.sh "$RUNS" 2 "ours:$OURS:$WORK/conf.json" "reference:$REFERENCE:$WORK/conf.json" \
    >"$WORK/times" || die "ADD/DEL loop failed"

# Every DEL must have put the interface back (the sysctls too, but the reference's DEL, which runs last,
# leaves them as ADD set them).
after=$(ip -n "$POD" -d link show eth0)
[[ $before == "$after" ]] || die "the pod differs after the DELs:"$'\n'"$(diff <(echo "$before") <(echo "$after"))"
[[ -z $(ls -A "$WORK/data" 2>/dev/null) ]] || die "saved settings left in $WORK/data"

echo "tuning ADD/DEL (MAC, MTU, promisc, allmulti, 2 sysctls), $RUNS pairs each, medians"
adddel_table "$WORK/times" "ours ($OURS_DIR/tuning)" "reference ($REFERENCE)" harness
