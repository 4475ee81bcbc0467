#!/usr/bin/env bash
# Benchmark of cni-netpol (issue 37) at 1,000 pods and 500 policies: the release agent in a namespace of its own,
# fed views written by netns-tests/tests/netpol_bench.rs (write_views): the first table, then 5 rounds of one pod
# more, back, one policy more, back (a new view file each, a 20 ms poll). Prints the agent's own log (compile and
# transaction times), its RSS and CPU, and the size of the ruleset. docs/benchmarks.md has the results.
#
# Needs root and nft. Touches only the namespace it makes and its temp directory (removed on exit).
set -euo pipefail
cd "$(dirname "$0")/.."
nice -n 10 cargo build --release -p netpol >&2
dir=$(mktemp -d)
NETPOL_BENCH_DIR=$dir nice -n 10 cargo test -p netns-tests --features cnicore/failpoints --test netpol_bench \
  -- --ignored write_views >&2
agent=$PWD/target/release/cni-netpol
ns=cni-netpol-bench-$$
cidrs=(--pod-cidr 10.244.0.0/22 --pod-cidr fd00:10:244::/64)
pid=
ip netns add "$ns"
trap '[[ -n $pid ]] && kill "$pid" 2>/dev/null; ip netns del "$ns"; rm -rf "$dir"' EXIT
swap() { cp "$dir/$1.json" "$dir/view.tmp" && mv "$dir/view.tmp" "$dir/view.json"; sleep 1.5; }

echo "== run --once (the first table, exec to exit)"
ip netns exec "$ns" /usr/bin/time -f "wall %e s, user %U s, sys %S s, max RSS %M KiB" \
  "$agent" run --static "$dir/base.json" "${cidrs[@]}" --once
ip netns exec "$ns" "$agent" cleanup
cp "$dir/base.json" "$dir/view.json"
ip netns exec "$ns" "$agent" run --static "$dir/view.json" "${cidrs[@]}" --interval-ms 20 2>"$dir/agent.log" &
pid=$!
sleep 3
for _ in 1 2 3 4 5; do
  swap pod
  swap base
  swap policy
  swap base
done
echo "== the agent's log"
cat "$dir/agent.log"
echo "== the agent: $(grep -E 'VmRSS|VmHWM' "/proc/$pid/status" | tr -s ' \t' ' ' | tr '\n' ' ')"
awk '{ print "== the agent'"'"'s CPU: user " $14 / 100 " s, sys " $15 / 100 " s" }' "/proc/$pid/stat"
echo "== nft list ruleset: $(ip netns exec "$ns" nft list ruleset | wc -l) lines"
