#!/usr/bin/env bash
# Benchmark of the nftables backends' usual ADD and DEL, two builds side by side: bridge (ipMasq, with
# host-local), portmap (a TCP and a UDP mapping, snat) and firewall (an IPv4 and an IPv6 address), each with
# `"backend": "nftables"`, for BEFORE's binaries and AFTER's, alternating in one loop (scripts/lib/adddel-times.sh)
# inside one "node" namespace. The tables are set up by one ADD of each before the loop, so every counted ADD
# and DEL is the usual one (elements only). Then one DEL of each, traced with `strace -f`, shows the `nft`
# processes it runs, and where a deleting nf_tables transaction's RCU grace period is waited for: the last close
# of a NETLINK_NETFILTER socket waits for it, whether an explicit close() or the process's exit. A second loop
# times portmap's and the firewall's DEL without prevResult (the elements found by their owner tag).
#
# Needs root, nft, strace. Touches only the namespaces it makes and its temp directory (removed on exit).
#   BEFORE=dir      binaries to compare against (e.g. a copy of target/stage built from main)
#   AFTER=dir       binaries under test (default target/stage, scripts/lib/binaries.sh)
#   BENCH_RUNS=N    ADD/DEL pairs per binary (default 31)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/bench.sh
RUNS=${BENCH_RUNS:-31}
AFTER=$(realpath "${AFTER:-target/stage}")
BEFORE=$(realpath "${BEFORE:?set BEFORE to the directory of the binaries to compare against}")
bench_start bench-nftables
command -v nft >/dev/null || die "needs nft"
for dir in "$BEFORE" "$AFTER"; do
    for plugin in bridge host-local portmap firewall; do [[ -x $dir/$plugin ]] || die "no $dir/$plugin"; done
done

NODE=bench-nft-node-$$ POD=bench-nft-pod-$$
bench_netns "$NODE" "$POD"

# The pod's address is host-local's first (the loop adds and deletes one pod at a time).
prev='{"cniVersion":"1.0.0","interfaces":[{"name":"cbr0"},{"name":"eth0","sandbox":"/run/netns/'$POD'"}],"ips":[{"address":"10.77.0.2/24","interface":1},{"address":"fd77::2/64","interface":1}]}'
# The bridge gets the pod's result as prevResult on ADD too (it ignores it there): its DEL needs the addresses
# for the usual DEL, and the timing loop sends one config to both verbs.
printf '{"cniVersion":"1.0.0","name":"bench","type":"bridge","bridge":"cbr0","isGateway":true,"ipMasq":true,"ipMasqBackend":"nftables","ipam":{"type":"host-local","ranges":[[{"subnet":"10.77.0.0/24"}],[{"subnet":"fd77::/64"}]],"dataDir":"%s/ipam"},"prevResult":%s}' \
    "$WORK" "$prev" >"$WORK/bridge.json"
printf '{"cniVersion":"1.0.0","name":"bench","type":"portmap","backend":"nftables","snat":true,"runtimeConfig":{"portMappings":[{"hostPort":8080,"containerPort":80,"protocol":"tcp"},{"hostPort":8053,"containerPort":53,"protocol":"udp"}]},"prevResult":%s}' \
    "$prev" >"$WORK/portmap.json"
printf '{"cniVersion":"1.0.0","name":"bench","type":"firewall","backend":"nftables","dataDir":"%s/firewall","prevResult":%s}' \
    "$WORK" "$prev" >"$WORK/firewall.json"

in_node() { ip netns exec "$NODE" env CNI_IFNAME=eth0 CNI_NETNS="/run/netns/$POD" CNI_CONTAINERID=bench-pod "$@"; }

# The tables, once, by AFTER's binaries (a pod added and deleted: the tables stay).
for plugin in bridge portmap firewall; do
    for verb in ADD DEL; do
        in_node env CNI_COMMAND=$verb CNI_PATH="$AFTER" "$AFTER/$plugin" <"$WORK/$plugin.json" >/dev/null
    done
done

specs=()
for plugin in bridge portmap firewall; do
    specs+=("before-$plugin:$BEFORE/$plugin:$WORK/$plugin.json" "after-$plugin:$AFTER/$plugin:$WORK/$plugin.json")
done
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
in_node env CNI_PATH="$AFTER" scripts/lib/adddel-times.sh "$RUNS" 2 "${specs[@]}" >"$WORK/times"
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

echo "nftables backends, usual ADD and DEL medians in ms ($RUNS runs each, interleaved; one exec each, harness included)"
echo "machine: $(nproc) CPUs, $(uname -r), $(nft --version | head -1); load average $load_before at the start, $load_after at the end"
echo "harness (exec of /bin/true the same way): $(median_us harness 2 <"$WORK/times" | awk '{printf "%.2f", $1/1000}') ms"
printf '| %-8s | %12s | %12s | %12s | %12s |\n' plugin "ADD before" "ADD after" "DEL before" "DEL after"
printf '|---|---|---|---|---|\n'
for plugin in bridge portmap firewall; do
    row=()
    for col in 2 3; do
        for side in before after; do
            row+=("$(median_us "$side-$plugin" "$col" <"$WORK/times" | awk '{printf "%.2f", $1/1000}')")
        done
    done
    printf '| %-8s | %12s | %12s | %12s | %12s |\n' "$plugin" "${row[@]}"
done

# DEL by tag (no prevResult, as containerd's second and third DEL; the firewall without its record): each round
# an ADD with prevResult (not timed), then the DEL without.
for plugin in portmap firewall; do
    sed -e 's/,"prevResult":.*}$/}/' -e 's#/firewall"#/firewall-none"#' "$WORK/$plugin.json" >"$WORK/$plugin-bare.json"
done
cat >"$WORK/by-tag.sh" <<'EOF2'
us() { echo $(( ${2/./} - ${1/./} )); }
for ((round = 0; round < RUNS; round++)); do
    for side in before after; do
        dir=$BEFORE
        [[ $side == after ]] && dir=$AFTER
        for plugin in portmap firewall; do
            CNI_COMMAND=ADD "$dir/$plugin" <"$WORK/$plugin.json" >/dev/null || exit 1
            t0=$EPOCHREALTIME
            CNI_COMMAND=DEL "$dir/$plugin" <"$WORK/$plugin-bare.json" >/dev/null || exit 1
            t1=$EPOCHREALTIME
            echo "$side-$plugin 0 $(us "$t0" "$t1")"
        done
    done
done
EOF2
in_node env RUNS="$RUNS" WORK="$WORK" BEFORE="$BEFORE" AFTER="$AFTER" CNI_PATH="$AFTER" bash "$WORK/by-tag.sh" >"$WORK/by-tag"
echo
echo "DEL without prevResult (found by tag), medians in ms ($RUNS runs each, interleaved); load average $(cut -d' ' -f1-3 /proc/loadavg)"
printf '| %-8s | %12s | %12s |\n' plugin "DEL before" "DEL after"
printf '|---|---|---|\n'
for plugin in portmap firewall; do
    printf '| %-8s | %12s | %12s |\n' "$plugin" \
        "$(median_us "before-$plugin" 3 <"$WORK/by-tag" | awk '{printf "%.2f", $1/1000}')" \
        "$(median_us "after-$plugin" 3 <"$WORK/by-tag" | awk '{printf "%.2f", $1/1000}')"
done

if command -v strace >/dev/null; then
    echo
    echo "One DEL (after an ADD) of each under strace -f: the nft processes it runs, its slowest close() and its"
    echo "slowest exit (exit_group to exited) of all its processes: where a deleting transaction's grace period is waited for"
    for side in before after; do
        dir=$BEFORE
        [[ $side == after ]] && dir=$AFTER
        for plugin in bridge portmap firewall; do
            in_node env CNI_COMMAND=ADD CNI_PATH="$dir" "$dir/$plugin" <"$WORK/$plugin.json" >/dev/null
            in_node env CNI_COMMAND=DEL CNI_PATH="$dir" strace -f -q -ttt -T -e trace=execve,close,exit_group -o "$WORK/trace" \
                "$dir/$plugin" <"$WORK/$plugin.json" >/dev/null
            execs=$(grep -c 'execve(".*/nft"' "$WORK/trace" || true)
            slowest_close=$(grep -o 'close([0-9]*) *= 0 <[0-9.]*>' "$WORK/trace" | sed 's/.*<\(.*\)>/\1/' | sort -g | tail -1)
            slowest_exit=$(awk '$3 ~ /^exit_group/ { start[$1] = $2 } $3 == "+++" && ($1 in start) { d = $2 - start[$1]; if (d > m) m = d } END { print m + 0 }' "$WORK/trace")
            printf '%-6s %-8s DEL: nft execs %s, slowest close %s ms, slowest exit %s ms\n' "$side" "$plugin" "$execs" \
                "$(awk -v s="${slowest_close:-0}" 'BEGIN { printf "%.2f", s * 1000 }')" \
                "$(awk -v s="$slowest_exit" 'BEGIN { printf "%.2f", s * 1000 }')"
        done
    done
fi
