# The pieces of scripts/conformance.sh: which specs a suite is, which cluster a column is, one run of e2e.test on a
# fresh cluster, and the report. Sourced after scripts/lib/cluster/common.sh.

CF_WORK=${CNI_CONFORMANCE_WORK:-/var/tmp/cni-rs-conformance}

cf_suite_known() { [[ $1 == conformance || $1 == netpol || $1 == dualstack ]]; }
cf_column_known() { [[ $1 == ours || $1 == reference || $1 == flannel ]]; }

# cf_focus SUITE / cf_skip SUITE: ginkgo's regular expressions. SCTP specs are left out: the kernels this runs on
# here have no SCTP module (docs/conformance.md says so); [Disruptive] specs restart or break nodes.
cf_focus() {
  case $1 in
    conformance) echo '\[sig-network\].*\[Conformance\]' ;;
    netpol) echo '\[sig-network\] Netpol ' ;;
    dualstack) echo '\[Feature:IPv6DualStack\]' ;;
  esac
}
cf_skip() { echo '\[Disruptive\]|SCTP|\[Feature:SCTPConnectivity\]'; }

# cf_cluster_flags SUITE COLUMN: `cluster.sh up` flags.
cf_cluster_flags() {
  local flags=(--nodes 2)
  case $2 in
    ours) flags+=(--network kubenet --plugins ours) ;;
    reference) flags+=(--network kubenet --plugins reference) ;;
    flannel) flags+=(--network flannel --flannel-backend vxlan) ;;
  esac
  [[ $1 == netpol ]] && flags+=(--network-policy)
  [[ $1 == dualstack ]] && flags+=(--dual-stack)
  echo "${flags[@]}"
}

# cf_progress: e2e.test's verbose output in, one line per finished spec out ("passed 12 s  [sig-network] ...").
cf_progress() {
  awk '
    /^• \[[0-9.]+ seconds\]$/ || /^• \[(FAILED|PANICKED|TIMEDOUT)\] \[[0-9.]+ seconds\]$/ { pending = $0; next }
    /^S \[SKIPPED\]/ { pending = ""; next }
    pending != "" && /\[sig-|\[Feature:/ {
      secs = pending; sub(/.*\[/, "", secs); sub(/ seconds\].*/, "", secs)
      result = (pending ~ /FAILED|PANICKED|TIMEDOUT/) ? "FAILED" : "passed"
      n++; printf "conformance: %3d %-6s %5d s  %s\n", n, result, secs + 0.5, $0
      fflush(); pending = ""
    }' >&2
}

# cf_run SUITE COLUMN FOCUS TSV: a fresh cluster, the suite on it, the cluster down; the results into TSV.
cf_run() {
  local suite=$1 column=$2 focus=${3:-} tsv=$4 name work flags rc=0 started
  name=${CF_EXISTING_CLUSTER:-cf${suite:0:4}${column:0:4}}
  work=$CF_WORK/$name.$suite.$column
  rm -rf "$work"
  mkdir -p "$work/report"
  if [[ -z $CF_EXISTING_CLUSTER ]]; then
    read -ra flags <<<"$(cf_cluster_flags "$suite" "$column")"
    kc_say "conformance: $suite on $column: cluster.sh up ${flags[*]}"
    "$repo/scripts/cluster.sh" --name "$name" up "${flags[@]}" ||
      { kc_say "conformance: $suite on $column: the cluster did not come up"; return 1; }
  fi
  local kubeconfig
  kubeconfig=$("$repo/scripts/cluster.sh" --name "$name" kubeconfig)
  [[ -n $focus ]] || focus=$(cf_focus "$suite")
  started=$SECONDS
  kc_say "conformance: $suite on $column: e2e.test --ginkgo.focus '$focus' (log: $work/e2e.log)"
  # The suite's kubectl is the cluster's; e2e.test reaches the API server through the cluster's loopback forwarder.
  PATH=$KC_BIN:$PATH "$KC_BIN/e2e.test" --provider=local --kubeconfig="$kubeconfig" --kubectl-path="$KC_BIN/kubectl" \
    --ginkgo.focus="$focus" --ginkgo.skip="$(cf_skip)" --ginkgo.v --ginkgo.no-color --ginkgo.timeout=4h \
    --report-dir="$work/report" --dump-logs-on-failure=false --minStartupPods=-1 2>&1 |
    tee "$work/e2e.log" | cf_progress || rc=$?
  [[ $rc == 0 ]] || rc=${PIPESTATUS[0]}
  kc_say "conformance: $suite on $column: e2e.test exited $rc after $((SECONDS - started)) s"
  [[ -n $CF_EXISTING_CLUSTER ]] ||
    "$repo/scripts/cluster.sh" --name "$name" down >/dev/null || kc_say "conformance: cluster $name: down failed"
  cf_junit_tsv "$work/report" "$suite" "$column" >"$tsv.new" && mv "$tsv.new" "$tsv" ||
    { kc_say "conformance: $suite on $column: no JUnit report in $work/report"; return 1; }
  ! grep -q $'\tfailed\t' "$tsv"
}

# cf_junit_tsv DIR SUITE COLUMN: the JUnit report's specs that ran, as "spec<TAB>passed|failed<TAB>seconds<TAB>why".
cf_junit_tsv() {
  python3 - "$@" <<'PY'
import glob, sys, xml.etree.ElementTree as ET
files = sorted(glob.glob(sys.argv[1] + "/junit*.xml"))
if not files:
    sys.exit(1)
for f in files:
    for case in ET.parse(f).getroot().iter("testcase"):
        name = case.get("name", "")
        if not name.startswith("[It] "):
            continue  # [SynchronizedBeforeSuite] and the like
        if case.find("skipped") is not None:
            continue
        fail = case.find("failure")
        if fail is None:
            fail = case.find("error")
        why = ""
        if fail is not None:
            text = (fail.get("message") or fail.text or "").strip()
            why = " ".join(text.split())[:300]
        print("\t".join([name[5:].strip(), "failed" if fail is not None else "passed",
                         str(round(float(case.get("time", "0")))), why.replace("\t", " ")]))
PY
}

# cf_report DIR: docs/conformance.md from every SUITE.COLUMN.tsv in DIR.
cf_report() {
  python3 - "$1" <<'PY'
import collections, glob, os, sys
d = sys.argv[1]
cols = ["ours", "reference", "flannel"]
titles = {"conformance": "`[sig-network] ... [Conformance]` (DNS included, `[Serial]` included)",
          "netpol": "The NetworkPolicy suite (`[sig-network] Netpol`, clusters with `--network-policy`)",
          "dualstack": "`[Feature:IPv6DualStack]` (clusters with `--dual-stack`)"}
runs = collections.defaultdict(dict)
for f in sorted(glob.glob(d + "/*.tsv")):
    suite, col = os.path.basename(f)[:-4].split(".")
    rows = {}
    for line in open(f):
        spec, result, secs, why = (line.rstrip("\n").split("\t") + [""] * 4)[:4]
        rows[spec] = (result, int(secs), why)
    runs[suite][col] = rows
print("# Kubernetes' own e2e suite on the local cluster\n")
print("Written by `scripts/conformance.sh` from the results it keeps in `docs/conformance/` (one file per suite and")
print("column; columns run on different days add up). Each column is a fresh `scripts/cluster.sh up` cluster of two")
print("nodes running Kubernetes v1.28.7's `e2e.test` (its common and network suites) with the cluster to itself:")
print("**ours** = kubenet nodes on our release plugins, **reference** = the same nodes on Debian's")
print("`containernetworking-plugins` (with the kubelet's kubenet conflist, `ipMasq` false, and the node masquerading")
print("what leaves the cluster as ip-masq-agent does: the reference bridge has no `nonMasqueradeCIDRs`, and its")
print("`ipMasq` would masquerade pod-to-pod traffic between nodes), **flannel** = flannel's own manifest running")
print("fabricd and our flannel plugin. Every `netpol` column runs cni-netpol.")
print("SCTP specs are left out: this machine's kernel has no SCTP (`[Feature:SCTPConnectivity]`).\n")
for suite in ["conformance", "netpol", "dualstack"]:
    if suite not in runs:
        continue
    have = [c for c in cols if c in runs[suite]]
    specs = sorted(set().union(*[runs[suite][c].keys() for c in have]))
    print(f"## {titles[suite]}\n")
    totals = []
    for c in have:
        rows = runs[suite][c].values()
        passed = sum(1 for r in rows if r[0] == "passed")
        secs = sum(r[1] for r in rows)
        totals.append(f"{c}: {passed} of {len(rows)} passed in {secs} s")
    missing = [c for c in cols if c not in have]
    print("; ".join(totals) + (f"; not run yet: {', '.join(missing)}" if missing else "") + ".\n")
    print("| spec | " + " | ".join(have) + " |")
    print("|---|" + "---|" * len(have))
    whys = []
    for s in specs:
        cells = []
        for c in have:
            r = runs[suite][c].get(s)
            cells.append("–" if r is None else f"{r[0]} ({r[1]} s)")
        print(f"| {s.replace('|', '/')} | " + " | ".join(cells) + " |")
        results = {runs[suite][c][s][0] for c in have if s in runs[suite][c]}
        for c in have:
            r = runs[suite][c].get(s)
            if r and r[0] == "failed":
                whys.append(f"- {s} on **{c}**: {r[2]}")
    if whys:
        print("\nWhy each failure failed (the first line of e2e.test's message):\n")
        print("\n".join(whys))
    print()
PY
}
