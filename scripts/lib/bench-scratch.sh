# The scratch of the chain benchmarks (scripts/bench.sh, scripts/bench-floor.sh), which run in a private mount
# namespace: a temporary directory, upstream cnitool's result cache (it always uses /var/lib/cni) mounted over
# from it, and the network namespaces they make; all removed on exit: the single-plugin benchmarks' scratch
# (scripts/lib/bench.sh) with the cache mounted. Source this file; it defines functions.

source "$(dirname "${BASH_SOURCE[0]}")/bench.sh"

# bench_prepare NAME: what the outer run does first: refuses to run unless root, installs what the benchmarks
# need (scripts/setup.sh) and builds the release plugins and cnitool (not the test crates: the CRI client's
# tonic would add minutes of release build).
bench_prepare() {
  bench_name=$1
  [[ $(id -u) == 0 ]] || die "run as root (network namespaces)"
  scripts/setup.sh
  echo "$1: building release binaries" >&2
  cni_build_release plugins
}

# bench_scratch NAME: bench_start's scratch with $tmp (/tmp/cni-NAME.XXXXXX, the same as $WORK) and the cache
# mounted; everything is removed, and the cache unmounted, on exit. NAME also prefixes the messages of `elapsed`.
bench_scratch() {
  bench_start "cni-$1"
  bench_name=$1
  tmp=$WORK
  mkdir -p "$tmp/cache"
  mount --bind "$tmp/cache" /var/lib/cni
  bench_mounts+=(/var/lib/cni)
}

# make_node NODE WAN [N]: a node netns with an uplink veth (eth0) to WAN (whose end is ethN) on 192.0.(2+N).0/24
# and a default route through it; WAN is made with the first node (N 0).
make_node() {
  local node=$1 wan=$2 n=${3:-0}
  local net=192.0.$((2 + n))
  bench_netns "$node"
  ((n > 0)) || bench_netns "$wan"
  ip -n "$node" link add eth0 type veth peer name "eth$n" netns "$wan"
  ip -n "$node" addr add "$net.1/24" dev eth0; ip -n "$node" link set eth0 up
  ip -n "$wan" addr add "$net.2/24" dev "eth$n"; ip -n "$wan" link set "eth$n" up
  ip -n "$node" route add default via "$net.2"
}

# elapsed COMMAND...: the microseconds it took (bash's clock: no extra process per measurement); its stderr
# goes to $tmp/errors, and a failure stops the benchmark.
elapsed() {
  local s=$EPOCHREALTIME
  "$@" >/dev/null 2>>"$tmp/errors" || { echo "$bench_name: failed: $*" >&2; tail -n 3 "$tmp/errors" >&2; exit 1; }
  local e=$EPOCHREALTIME
  echo $((10#${e/./} - 10#${s/./}))
}
