#!/usr/bin/env bash
# Pod start-up on a real kubelet, ours against the reference plugins on the same one-node cluster
# (scripts/cluster.sh): ROUNDS times each, alternating, a Deployment of PODS agnhost pods on node1 is created and
# timed until every pod is Running, then deleted and timed until every pod is gone. Reported with the kubelet's
# own start-up histogram (kubelet_pod_start_sli_duration_seconds) and containerd's time in the plugins
# (network_plugin_operations_duration_seconds, set_up_pod / tear_down_pod), read before and after each round.
#   scripts/bench-k8s.sh [PODS [ROUNDS]]      (defaults 100 and 3; as root)
set -euo pipefail
cd "$(dirname "$0")/.."
pods=${1:-100} rounds=${2:-3}
name=bench
c() { scripts/cluster.sh --name "$name" "$@"; }
trap 'c down >/dev/null 2>&1 || true' EXIT
c up --nodes 1 --plugins ours >&2
k() { c kubectl "$@"; }
source scripts/lib/binaries.sh
ours=$(cat "/var/tmp/cni-rs-cluster/$name/settings/plugin-dir")

# containerd_metric OPERATION: containerd's time in the plugins for it (containerd 1.6 names the histogram
# containerd_cri_network_plugin_operations_duration_seconds_seconds), "sum count".
containerd_metric() {
  c exec node1 curl -fsS http://127.0.0.1:1338/v1/metrics |
    awk -v op="$1" '$0 ~ "network_plugin_operations_duration_seconds[a-z_]*_(sum|count)[{]" && $0 ~ "operation_type=\"" op "\"" { v[$0 ~ /_sum[{]/ ? "s" : "c"] = $2 } END { printf "%s %s\n", v["s"], v["c"] }'
}
kubelet_metric() {
  k get --raw /api/v1/nodes/node1/proxy/metrics |
    awk '/^kubelet_pod_start_sli_duration_seconds_sum/ { s = $2 } /^kubelet_pod_start_sli_duration_seconds_count/ { n = $2 } END { printf "%s %s\n", s, n }'
}
delta_mean_ms() { # "sum count" before, after
  awk -v a="$1" -v b="$2" 'BEGIN { split(a, x, " "); split(b, y, " "); n = y[2] - x[2]; if (n > 0) printf "%.1f", 1000 * (y[1] - x[1]) / n; else printf "-" }'
}

manifest() {
  cat <<YAML
apiVersion: apps/v1
kind: Deployment
metadata: {name: load}
spec:
  replicas: $pods
  selector: {matchLabels: {app: load}}
  template:
    metadata: {labels: {app: load}}
    spec:
      terminationGracePeriodSeconds: 0
      containers: [{name: pause, image: registry.k8s.io/pause:3.9}]
YAML
}

round() { # PLUGINS
  local label=$1 t0 t1 t2 up down ku0 ku1 cs0 cs1 cd0 cd1
  ku0=$(kubelet_metric); cs0=$(containerd_metric set_up_pod); cd0=$(containerd_metric tear_down_pod)
  t0=$(date +%s.%N)
  manifest | k apply -f - >/dev/null
  until [[ $(k get pods -l app=load --field-selector=status.phase=Running -o name | wc -l) -ge $pods ]]; do sleep 0.5; done
  t1=$(date +%s.%N)
  ku1=$(kubelet_metric); cs1=$(containerd_metric set_up_pod)
  k delete deployment load --wait=false >/dev/null
  until [[ $(k get pods -l app=load -o name | wc -l) -eq 0 ]]; do sleep 0.5; done
  t2=$(date +%s.%N)
  sleep 2
  cd1=$(containerd_metric tear_down_pod)
  up=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
  down=$(awk -v a="$t1" -v b="$t2" 'BEGIN { printf "%.1f", b - a }')
  printf '%-9s %4d pods  all Running %6s s  all gone %6s s  kubelet start SLI mean %7s ms  CNI set_up_pod mean %6s ms  tear_down_pod mean %6s ms\n' \
    "$label" "$pods" "$up" "$down" "$(delta_mean_ms "$ku0" "$ku1")" "$(delta_mean_ms "$cs0" "$cs1")" "$(delta_mean_ms "$cd0" "$cd1")"
}

for ((r = 1; r <= rounds; r++)); do
  c plugins all "$ours" >/dev/null
  round ours
  c plugins all reference >/dev/null
  round reference
done
