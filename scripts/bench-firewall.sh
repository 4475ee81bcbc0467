#!/usr/bin/env bash
# Benchmark of the firewall plugin: ADD and DEL medians of one container (an IPv4 and an IPv6 address) for our
# iptables, nftables and firewalld backends and the reference (/usr/lib/cni/firewall, Debian's
# containernetworking-plugins v1.1.1) on iptables and firewalld.
#
# Each call is one exec of the plugin by a bash loop running inside a "node" namespace, timed with
# $EPOCHREALTIME around the exec; ours and the reference alternate in the same loop. firewalld runs inside the
# node namespace on a private D-Bus bus of the script's own (never the machine's bus or firewall), and only
# when firewalld and dbus-daemon are installed.
#
# Needs root, iptables and nft. Touches only the namespace it makes and its temp directory (removed on exit).
#   BENCH_RUNS=N   ADD/DEL pairs per implementation (default 21)
set -euo pipefail

cd "$(dirname "$0")/.."
source scripts/lib/bench.sh
RUNS=${BENCH_RUNS:-21}
bench_start bench-firewall
bench_plugin firewall

NODE=bench-fw-node-$$ POD=bench-fw-pod-$$
bench_netns "$NODE" "$POD"

conf() { # conf <file> <backend>
    printf '{"cniVersion":"0.4.0","name":"bench","type":"firewall","backend":"%s","dataDir":"%s/data","prevResult":{"cniVersion":"0.4.0","interfaces":[{"name":"cni0"},{"name":"eth0","sandbox":"/run/netns/%s"}],"ips":[{"version":"4","address":"10.88.0.2/16","interface":1},{"version":"6","address":"fd88::2/64","interface":1}]}}' \
        "$2" "$WORK" "$POD" >"$1"
}
conf "$WORK/iptables.json" iptables
conf "$WORK/nftables.json" nftables
conf "$WORK/firewalld.json" firewalld
specs=("ours-iptables:$OURS:$WORK/iptables.json" "reference-iptables:$REFERENCE:$WORK/iptables.json" "ours-nftables:$OURS:$WORK/nftables.json")

export DBUS_SYSTEM_BUS_ADDRESS="unix:path=$WORK/no-bus"
if command -v firewalld >/dev/null && command -v dbus-daemon >/dev/null; then
    mkdir -p "$WORK/etc"
    printf 'DefaultZone=public\nCleanupOnExit=yes\nFirewallBackend=nftables\n' >"$WORK/etc/firewalld.conf"
    cat >"$WORK/bus.conf" <<EOF
<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN" "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig><type>system</type><listen>unix:path=$WORK/bus.sock</listen><auth>EXTERNAL</auth>
<policy user="root"><allow own="*"/><allow send_destination="*"/><allow receive_sender="*"/></policy></busconfig>
EOF
    dbus-daemon --nofork --nopidfile --config-file="$WORK/bus.conf" >/dev/null 2>&1 &
    bench_background
    for _ in $(seq 100); do [[ -S $WORK/bus.sock ]] && break; sleep 0.1; done
    export DBUS_SYSTEM_BUS_ADDRESS="unix:path=$WORK/bus.sock"
    nsenter --net="/run/netns/$NODE" firewalld --nofork --nopid --log-target console --system-config "$WORK/etc" >"$WORK/firewalld.log" 2>&1 &
    bench_background
    for _ in $(seq 300); do
        dbus-send --bus="$DBUS_SYSTEM_BUS_ADDRESS" --print-reply --dest=org.freedesktop.DBus /org/freedesktop/DBus \
            org.freedesktop.DBus.NameHasOwner string:org.fedoraproject.FirewallD1 2>/dev/null | grep -q true && break
        sleep 0.1
    done
    specs+=("ours-firewalld:$OURS:$WORK/firewalld.json" "reference-firewalld:$REFERENCE:$WORK/firewalld.json")
fi

ip netns exec "$NODE" env CNI_IFNAME=eth0 CNI_PATH=/nonexistent CNI_NETNS="/run/netns/$POD" CNI_CONTAINERID=bench-pod \
    scripts/lib/adddel-times.sh "$RUNS" 0 "${specs[@]}" >"$WORK/times"
printf '%-20s %10s %10s\n' implementation "ADD ms" "DEL ms"
for spec in "${specs[@]}"; do
    name=${spec%%:*}
    add=$(median_us "$name" 2 <"$WORK/times")
    del=$(median_us "$name" 3 <"$WORK/times")
    printf '%-20s %10.1f %10.1f\n' "$name" "$(bc -l <<<"$add/1000")" "$(bc -l <<<"$del/1000")"
done
