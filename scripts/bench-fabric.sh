#!/usr/bin/env bash
# The figures of fabricd (issues 16 and 22): join convergence p50/p99 over 20 joins; one agent's cold start
# with 1,000 and with 5,000 peers' leases in etcd (IPv4 and dual stack), its CPU time and RSS, a join it sees,
# its idle CPU, etcd requests per node per minute, etcd's RSS. Runs the ignored test
# netns-tests/tests/fabric_bench.rs against the release binaries, in namespaces it makes and removes (etcd in
# an infra namespace, agents in node namespaces), and writes the table, with the load average at the start and
# end of the run, into docs/benchmarks.md between the fabric markers. About two minutes after the build.
# Needs root and scripts/setup.sh's packages.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/binaries.sh
scripts/setup.sh
cni_build_release all
out=$(mktemp)
trap 'rm -f "$out"' EXIT
load_start=$(cut -d' ' -f1 /proc/loadavg)
CNI_BIN_DIR=$PWD/target/stage FABRIC_BENCH_OUT=$out \
  cargo test --quiet -p netns-tests --test fabric_bench -- --ignored --nocapture --test-threads=1 >&2
{
  echo "<!-- fabric:begin -->"
  echo "## fabricd (scripts/bench-fabric.sh)"
  echo
  echo "Measured $(date -u +%Y-%m-%d) on $(nproc) cores (kernel $(uname -r)), release build, etcd $(etcd --version | head -1 | awk '{print $3}') in an infra namespace, agents in node namespaces on one bridge (vxlan backend)."
  echo
  cat "$out"
  echo
  echo "Load average (1 min) $load_start when the run started, $(cut -d' ' -f1 /proc/loadavg) when it ended."
  echo "<!-- fabric:end -->"
} > "$out.section"
if grep -q '<!-- fabric:begin -->' docs/benchmarks.md; then
  python3 - "$out.section" <<'PY'
import re, sys
section = open(sys.argv[1]).read().rstrip("\n")
text = open("docs/benchmarks.md").read()
text = re.sub(r"<!-- fabric:begin -->.*?<!-- fabric:end -->", lambda _: section, text, flags=re.S)
open("docs/benchmarks.md", "w").write(text)
PY
else
  { echo; cat "$out.section"; } >> docs/benchmarks.md
fi
rm -f "$out.section"
sed -n '/<!-- fabric:begin -->/,/<!-- fabric:end -->/p' docs/benchmarks.md
