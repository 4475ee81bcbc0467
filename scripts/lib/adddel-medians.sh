#!/usr/bin/env bash
# ADD/DEL medians of one plugin config, ours against the reference, alternating in one loop; run inside the node
# namespace by the per-plugin benchmarks. Prints "<ours ADD> <ours DEL> <ref ADD> <ref DEL> <harness>" in
# microseconds; the harness is an exec of /bin/true the same way.
#   adddel-medians.sh OURS REFERENCE CONF RUNS POD_NETNS_NAME
set -euo pipefail
ours=$1 ref=$2 conf=$3 runs=$4 pod=$5
export CNI_NETNS=/run/netns/$pod CNI_IFNAME=eth0 CNI_PATH=/usr/lib/cni CNI_CONTAINERID=bench
ours_add=() ours_del=() ref_add=() ref_del=() harness=()
us() { echo $(( ${2/./} - ${1/./} )); }
for ((i = 0; i < runs + 2; i++)); do
    for impl in ours ref; do
        bin=${!impl}
        t0=$EPOCHREALTIME
        CNI_COMMAND=ADD "$bin" <"$conf" >"$conf.out" || { echo "$impl ADD failed: $(cat "$conf.out")" >&2; exit 1; }
        t1=$EPOCHREALTIME
        CNI_COMMAND=DEL "$bin" <"$conf" >"$conf.out" || { echo "$impl DEL failed: $(cat "$conf.out")" >&2; exit 1; }
        t2=$EPOCHREALTIME
        # The first two rounds warm the page cache and are not counted.
        if ((i >= 2)); then
            eval "${impl}_add+=($(us "$t0" "$t1"))"
            eval "${impl}_del+=($(us "$t1" "$t2"))"
        fi
    done
    t0=$EPOCHREALTIME
    /bin/true <"$conf" >/dev/null
    t1=$EPOCHREALTIME
    harness+=($(us "$t0" "$t1"))
done
median() { printf "%s\n" "$@" | sort -n | awk "{ v[NR] = \$1 } END { print v[int((NR + 1) / 2)] }"; }
echo "$(median "${ours_add[@]}") $(median "${ours_del[@]}") $(median "${ref_add[@]}") $(median "${ref_del[@]}") $(median "${harness[@]}")"
