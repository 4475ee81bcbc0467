#!/usr/bin/env bash
# Kubernetes' own judge on our plugins: the e2e suite of the v1.28.7 release tree (`e2e.test`, its common and
# network suites, built offline by `scripts/cluster.sh build`) run against a fresh local cluster per suite and
# column (`scripts/cluster.sh up`), the cluster the suite's alone ([Serial] specs included). Each run's results are
# kept as docs/conformance/SUITE.COLUMN.tsv (spec, result, seconds, first line of the failure) and
# docs/conformance.md is written from every result kept there, so columns run on different days add up.
#
#   scripts/conformance.sh [--suites conformance,netpol,dualstack] [--columns ours,reference,flannel]
#                          [--focus REGEX] [--out DIR] [--keep-going] [--cluster NAME]
#   scripts/conformance.sh report [--out DIR]      # docs/conformance.md again from the kept results
#
# Suites: conformance = every `[sig-network] ... [Conformance]` spec (DNS included); netpol = the NetworkPolicy
# suite (`Netpol`, cluster with --network-policy); dualstack = `[Feature:IPv6DualStack]` (cluster with
# --dual-stack). Columns: ours and reference = kubenet nodes on our release plugins or Debian's reference plugins;
# flannel = flannel's own manifest running fabricd and our flannel plugin. --focus narrows a suite (a regular
# expression of spec names, as ginkgo's). A progress line per spec goes to stderr; the run's full log and JUnit
# report are kept under /var/tmp/cni-rs-conformance/SUITE.COLUMN/. --cluster NAME runs on a cluster of that name
# that is up already (made as the suite and column want; left up), one suite and one column. Run as root, on a
# machine where `cluster.sh up` works (scripts/setup.sh).
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$repo/scripts/lib/cluster/common.sh"
source "$repo/scripts/lib/conformance.sh"

usage() {
  sed -n '/^#   scripts\/conformance.sh/,/^#   scripts\/conformance.sh report/p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

main() {
  local suites=conformance,netpol,dualstack columns=ours,reference,flannel focus="" out=$repo/docs keep_going=0
  local report_only=0 cluster=""
  export CF_EXISTING_CLUSTER=""

  [[ ${1:-} == report ]] && { report_only=1; shift; }
  while (($#)); do
    case $1 in
      --suites) suites=${2:?--suites LIST}; shift ;;
      --columns) columns=${2:?--columns LIST}; shift ;;
      --focus) focus=${2:?--focus REGEX}; shift ;;
      --out) out=${2:?--out DIR}; shift ;;
      --keep-going) keep_going=1 ;;
      --cluster) cluster=${2:?--cluster NAME}; shift ;;
      *) usage ;;
    esac
    shift
  done
  local suite column failed=0
  # Everything is checked before the first cluster is made.
  for suite in ${suites//,/ }; do cf_suite_known "$suite" || kc_die "--suites: no suite $suite (conformance, netpol, dualstack)"; done
  for column in ${columns//,/ }; do cf_column_known "$column" || kc_die "--columns: no column $column (ours, reference, flannel)"; done
  if [[ -n $cluster ]]; then
    [[ $suites != *,* && $columns != *,* ]] || kc_die "--cluster: one suite and one column"
    kc_set_name "$cluster"
    [[ -f $KC_DIR/admin.kubeconfig ]] || kc_die "--cluster $cluster: no such cluster is up"
    CF_EXISTING_CLUSTER=$cluster
  fi
  mkdir -p "$out/conformance"
  if ((!report_only)); then
    [[ $(id -u) == 0 ]] || kc_die "run as root (scripts/cluster.sh makes namespaces, mounts and cgroups)"
    "$repo/scripts/cluster.sh" build
    [[ -x $KC_BIN/e2e.test ]] || kc_die "$KC_BIN/e2e.test is missing after the build"
    for suite in ${suites//,/ }; do
      for column in ${columns//,/ }; do
        cf_run "$suite" "$column" "$focus" "$out/conformance/$suite.$column.tsv" || {
          failed=1
          ((keep_going)) || break 2
        }
      done
    done
  fi
  cf_report "$out/conformance" >"$out/conformance.md.new"
  mv "$out/conformance.md.new" "$out/conformance.md"
  kc_say "conformance: wrote $out/conformance.md"
  return $failed
}

main "$@"
