#!/usr/bin/env bash
# Startup cost of a plugin: the median time of `CNI_COMMAND=VERSION loopback`, ours (release build) against the
# reference (/usr/lib/cni/loopback, Debian's containernetworking-plugins), measured side by side in the same
# conditions, plus binary sizes. `true` is measured the same way: the cost of exec itself, i.e. the harness floor.
#
# Usage: scripts/bench-version.sh [RUNS]      (default 500 runs per binary; hyperfine if installed, else or with
#        BENCH_LOOP=1 a timed bash loop)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/binaries.sh

runs=${1:-500}
reference=${REFERENCE_LOOPBACK:-/usr/lib/cni/loopback}
floor=$(type -P true)
[[ -x $reference ]] || { echo "bench-version: $reference missing: run scripts/setup.sh" >&2; exit 1; }

cni_build_release plugins
ours=target/stage/loopback

export CNI_COMMAND=VERSION
# Both must answer before they are timed.
for bin in "$ours" "$reference"; do
  answer=$("$bin" </dev/null) && [[ $answer == *supportedVersions* ]] || { echo "bench-version: $bin gives no VERSION answer" >&2; exit 1; }
done

names=(ours reference "exec floor (true)")
bins=("$ours" "$reference" "$floor")
declare -A median mean

if [[ -z ${BENCH_LOOP:-} ]] && command -v hyperfine >/dev/null; then
  # Rounds, so that a slow spell of the shared machine hits all three alike; the figure is the median of the
  # rounds' medians (and the mean of their means).
  rounds=5
  csv=$(mktemp); log=$(mktemp); trap 'rm -f "$csv" "$log"' EXIT
  declare -A medians means
  for ((r = 0; r < rounds; r++)); do
    # -N: no shell in between. Its outlier warnings (a shared machine) go to a log, shown only if it fails.
    hyperfine -N --style none --warmup 20 --runs $((runs / rounds)) --export-csv "$csv" \
      -n "${names[0]}" "${bins[0]}" -n "${names[1]}" "${bins[1]}" -n "${names[2]}" "${bins[2]}" >"$log" 2>&1 ||
      { cat "$log" >&2; exit 1; }
    # command,mean,stddev,median,user,system,min,max (seconds)
    while IFS=, read -r name m _ med _; do
      [[ $name == command ]] && continue
      medians[$name]+="$med "; means[$name]+="$m "
    done <"$csv"
  done
  for n in "${names[@]}"; do
    median[$n]=$(printf '%s\n' ${medians[$n]} | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }')
    mean[$n]=$(printf '%s\n' ${means[$n]} | awk '{ t += $1 } END { printf "%.9f", t / NR }')
  done
  method="hyperfine -N, $rounds rounds of $((runs / rounds)) runs each (after 20 warm-up runs), median of round medians"
else
  # Fallback: time each exec with bash's microsecond clock, runs of the binaries interleaved.
  declare -A samples
  for ((i = 0; i < runs; i++)); do
    for j in 0 1 2; do
      t0=$EPOCHREALTIME; "${bins[j]}" </dev/null >/dev/null; t1=$EPOCHREALTIME
      samples[$j]+="$(( ${t1/./} - ${t0/./} )) "
    done
  done
  for j in 0 1 2; do
    read -r -a s <<<"${samples[$j]}"
    sorted=($(printf '%s\n' "${s[@]}" | sort -n))
    median[${names[j]}]=$(awk -v us="${sorted[$((runs / 2))]}" 'BEGIN { printf "%.9f", us / 1e6 }')
    mean[${names[j]}]=$(printf '%s\n' "${s[@]}" | awk '{ t += $1 } END { printf "%.9f", t / NR / 1e6 }')
  done
  method="bash loop, $runs interleaved runs each (includes fork/exec from bash)"
fi

size() { stat -L -c %s "$1"; }
ms() { awk -v s="$1" 'BEGIN { printf "%.3f", s * 1000 }'; }

echo "CNI_COMMAND=VERSION loopback — $(date -u +%Y-%m-%d), $(uname -m), $(nproc) CPUs; $method"
printf '%-20s %-26s %12s %14s %12s\n' "binary" "path" "size (KiB)" "median (ms)" "mean (ms)"
for j in 0 1 2; do
  n=${names[j]}
  printf '%-20s %-26s %12s %14s %12s\n' "$n" "${bins[j]}" "$(( $(size "${bins[j]}") / 1024 ))" "$(ms "${median[$n]}")" "$(ms "${mean[$n]}")"
done
awk -v o="${median[ours]}" -v r="${median[reference]}" -v f="${median[exec floor (true)]}" -v so="$(size "$ours")" -v sr="$(size "$reference")" 'BEGIN {
  printf "reference / ours: %.1fx slower (median), %.1fx larger; net of the exec floor: %.1fx\n", r / o, sr / so, (r - f) / ((o - f) > 0 ? (o - f) : 1e-9)
}'
