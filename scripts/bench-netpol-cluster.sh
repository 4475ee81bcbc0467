#!/usr/bin/env bash
# NetworkPolicy enforcement time on the local cluster, as Kubernetes' perf-tests measure it
# (NetworkPolicyEnforcement): a two-node `cluster.sh up --network-policy` cluster with --pods pods and --policies
# policies in force, then
#   policy: from the API call creating a policy that isolates a server pod to the first connection from a client
#           pod (on the other node) that it drops, and from the call deleting it to the first that gets through;
#   pod:    from the call creating a pod that a policy admits to the first connection that reaches it (its start
#           included, as upstream counts it).
# The calls are made with curl and the admin certificate, as perf-tests' client makes them from Go: kubectl's own
# start (discovery, half a second on 2 busy cores) would be most of what is measured.
# Probes are TCP connects from the client pod's network namespace (a 50 ms timeout: new connections, no reuse),
# started before the change; a change's time is the start of the first probe that sees it. Prints p50/p90/p99 in
# ms per measurement, the API calls' own time (to the API server's answer), the agents' CPU and peak
# memory over the run, and their own histograms (API event to kernel, transaction). docs/benchmarks.md has results.
#
#   scripts/bench-netpol-cluster.sh [--pods N] [--policies M] [--rounds R] [--name NAME]
#
# Run as root on a machine where `scripts/cluster.sh up` works; the cluster is taken down at the end.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
pods=100 policies=500 rounds=30 name=npbench
while (($#)); do
  case $1 in
    --pods) pods=$2; shift ;;
    --policies) policies=$2; shift ;;
    --rounds) rounds=$2; shift ;;
    --name) name=$2; shift ;;
    *) sed -n 's/^#   //p' "$0" >&2; exit 2 ;;
  esac
  shift
done
[[ $pods =~ ^[0-9]+$ && $pods -ge 2 && $policies =~ ^[0-9]+$ && $policies -ge 1 && $rounds =~ ^[0-9]+$ ]] ||
  { echo "bench-netpol-cluster: --pods (2 or more), --policies (1 or more) and --rounds are numbers" >&2; exit 2; }
cluster() { "$repo/scripts/cluster.sh" --name "$name" "$@"; }
kc() { cluster kubectl "$@"; }
now() { date +%s%N; }
say() { echo "bench-netpol-cluster: $*" >&2; }
work=$(mktemp -d)
trap 'cluster down >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
AGNHOST=registry.k8s.io/e2e-test-images/agnhost:2.45
PAUSE=registry.k8s.io/pause:3.9

say "cluster: 2 nodes, cni-netpol on each"
cluster up --nodes 2 --network-policy --dns none >&2
dir=$(cluster paths | sed -n 's/^dir=//p')
api_port=$(<"$dir/settings/api-port")
api() { # METHOD PATH [YAML-FILE]: one call to the API server as the cluster's admin
  curl -sSf --cacert "$dir/pki/ca.crt" --cert "$dir/pki/admin.crt" --key "$dir/pki/admin.key" -X "$1" \
    -H 'Content-Type: application/yaml' ${3:+--data-binary "@$3"} "https://127.0.0.1:$api_port$2"
}
NETPOLS=/apis/networking.k8s.io/v1/namespaces/default/networkpolicies PODS=/api/v1/namespaces/default/pods

pod() { # NAME NODE LABEL IMAGE ARGS-JSON
  printf 'apiVersion: v1\nkind: Pod\nmetadata: {name: %s, labels: {app: %s}}\nspec:\n  nodeName: %s\n  terminationGracePeriodSeconds: 0\n  containers: [{name: c, image: "%s", args: %s}]\n---\n' "$1" "$3" "$2" "$4" "$5"
}

# The filler: pods-2 pause pods over both nodes in ten groups, and policies-1 policies isolating them (each admits
# one role on one port), so the agents compile and hold a table of that size while the probes run.
say "$((pods - 2)) pods and $((policies - 1)) policies in force"
{
  for ((i = 0; i < pods - 2; i++)); do
    printf 'apiVersion: v1\nkind: Pod\nmetadata: {name: filler-%d, labels: {app: filler, group: g%d}}\nspec:\n  nodeName: node%d\n  terminationGracePeriodSeconds: 0\n  containers: [{name: c, image: "%s"}]\n---\n' \
      "$i" $((i % 10)) $((i % 2 + 1)) "$PAUSE"
  done
  for ((k = 0; k < policies - 1; k++)); do
    printf 'apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: filler-%d}\nspec:\n  podSelector: {matchLabels: {group: g%d}}\n  ingress: [{from: [{podSelector: {matchLabels: {role: r%d}}}], ports: [{port: %d, protocol: TCP}]}]\n---\n' \
      "$k" $((k % 10)) "$k" $((1000 + k))
  done
  pod server node2 server "$AGNHOST" '["netexec", "--http-port=8080"]'
  pod client node1 client "$AGNHOST" '["pause"]'
} >"$work/filler.yaml"
kc apply -f "$work/filler.yaml" >/dev/null
kc wait --for=condition=Ready pod --all --timeout=600s >/dev/null
server_ip=$(kc get pod server -o jsonpath='{.status.podIP}')
client_ip=$(kc get pod client -o jsonpath='{.status.podIP}')
# The client pod's network namespace on node1: the one holding its address.
client_ns=$(cluster exec node1 bash -c 'for n in $(ip netns list | cut -d" " -f1); do
  if ip -n "$n" -4 -o addr show | grep -q " '"$client_ip"'/"; then echo "$n"; fi; done' | head -n 1)
[[ -n $client_ns ]] || { say "no netns holds the client's $client_ip on node1"; exit 1; }

# The prober: TCP connects from the client pod until one sees WANT (open or closed); prints that probe's start.
cat >"$work/probe.sh" <<'PROBE'
ip=$1 port=$2 want=$3 deadline=$((SECONDS + 30))
while ((SECONDS < deadline)); do
  start=$(date +%s%N)
  if timeout 0.05 bash -c "exec 3<>/dev/tcp/$ip/$port" 2>/dev/null; then seen=open; else seen=closed; fi
  [[ $seen == "$want" ]] && { echo "$start"; exit 0; }
done
exit 1
PROBE
probe() { # IP PORT WANT
  cluster exec node1 nsenter "--net=/var/run/netns/$client_ns" bash -s "$@" <"$work/probe.sh"
}
# A change's time: the prober started (and still seeing the old state), then CHANGE; the first probe seeing WANT.
timed() { # OUT WANT IP PORT CHANGE...
  local out=$1 want=$2 ip=$3 port=$4 t0 t1 k0 seen
  shift 4
  probe "$ip" "$port" "$want" >"$work/seen" &
  sleep 0.3
  t0=$(now)
  "$@" >/dev/null
  k0=$(now)
  wait $! || { say "never $want: $*"; return 1; }
  seen=$(<"$work/seen")
  echo $(((seen - t0) / 1000000)) >>"$work/$out"
  echo $(((k0 - t0) / 1000000)) >>"$work/api-call"
}
agents_cpu() {
  local node pid total=0
  for node in node1 node2; do
    pid=$(<"$dir/nodes/$node/cni-netpol.pid")
    total=$((total + $(awk '{ print $14 + $15 }' "/proc/$pid/stat")))
  done
  echo "$total"
}

probe "$server_ip" 8080 open >/dev/null || { say "the client never reached the server"; exit 1; }
deny='apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny-server}
spec: {podSelector: {matchLabels: {app: server}}, policyTypes: [Ingress]}'
echo "$deny" >"$work/deny.yaml"
cpu0=$(agents_cpu) start=$(now)
say "policy rounds: $rounds"
for ((r = 0; r < rounds; r++)); do
  timed policy-create closed "$server_ip" 8080 api POST "$NETPOLS" "$work/deny.yaml"
  timed policy-delete open "$server_ip" 8080 api DELETE "$NETPOLS/deny-server"
done
# Pods a policy admits: the client on 8080, nothing else.
kc apply -f - >/dev/null <<'YAML'
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: admit-fresh}
spec:
  podSelector: {matchLabels: {app: fresh}}
  ingress: [{from: [{podSelector: {matchLabels: {app: client}}}], ports: [{port: 8080, protocol: TCP}]}]
YAML
pod_rounds=$(((rounds + 2) / 3))
say "pod rounds: $pod_rounds"
for ((r = 0; r < pod_rounds; r++)); do
  pod "fresh-$r" node2 fresh "$AGNHOST" '["netexec", "--http-port=8080"]' | sed '/^---$/d' >"$work/fresh.yaml"
  # The pod's address is known only once its sandbox is up: created, then the address, then the probes.
  t0=$(now)
  api POST "$PODS" "$work/fresh.yaml" >/dev/null
  ip=""
  while [[ -z $ip ]]; do ip=$(api GET "$PODS/fresh-$r" | jq -r '.status.podIP // empty'); [[ -n $ip ]] || sleep 0.02; done
  seen=$(probe "$ip" 8080 open) || { say "fresh-$r never reachable"; exit 1; }
  echo $(((seen - t0) / 1000000)) >>"$work/pod-create"
  kc delete pod "fresh-$r" --wait=false >/dev/null
done
cpu1=$(agents_cpu) end=$(now)

percentiles() { # FILE
  sort -n "$1" | awk '{ v[NR] = $1 } END {
    p = "p50 p90 p99"; split("50 90 99", q, " "); split(p, n, " ")
    for (i = 1; i <= 3; i++) { k = int((q[i] * NR + 99) / 100); if (k < 1) k = 1; printf "%s %d ms  ", n[i], v[k] }
    printf "(n=%d, max %d ms)\n", NR, v[NR] }'
}
echo "NetworkPolicy enforcement on the local cluster: $pods pods, $policies policies, 2 nodes"
printf '%-58s %s\n' "policy created -> first connection dropped:" "$(percentiles "$work/policy-create")"
printf '%-58s %s\n' "policy deleted -> first connection through:" "$(percentiles "$work/policy-delete")"
printf '%-58s %s\n' "admitted pod created -> first connection reaches it:" "$(percentiles "$work/pod-create")"
printf '%-58s %s\n' "the API call creating or deleting the policy, returning:" "$(percentiles "$work/api-call")"
ticks=$(getconf CLK_TCK)
echo "agents: $(((cpu1 - cpu0) * 1000 / ticks)) ms of CPU over $(((end - start) / 1000000000)) s (both nodes);" \
  "peak RSS $(awk '/VmHWM/ { print $2 " kB" }' "/proc/$(<"$dir/nodes/node1/cni-netpol.pid")/status") (node1)"
for node in node1 node2; do
  cluster exec "$node" curl -s http://127.0.0.1:9798/metrics | awk -v node="$node" '
    /^cni_netpol_event_to_kernel_seconds_(sum|count)/ { e[$1 ~ /sum/ ? "s" : "c"] = $2 }
    /^cni_netpol_transaction_duration_seconds_(sum|count)/ { t[$1 ~ /sum/ ? "s" : "c"] = $2 }
    /^cni_netpol_rules / { rules = $2 }
    END { if (e["c"] > 0 && t["c"] > 0) printf "%s: API event to kernel %.1f ms mean (%d), transaction %.1f ms mean (%d), %d rules\n",
      node, 1000 * e["s"] / e["c"], e["c"], 1000 * t["s"] / t["c"], t["c"], rules }'
done
