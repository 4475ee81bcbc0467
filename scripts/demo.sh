#!/usr/bin/env bash
# The demo: a simulated Kubernetes node (its own network namespace, with an uplink to a "wan" namespace), two pods
# attached with the default kubenet conflist (conf/10-kubenet.conflist: bridge cbr0 + host-local, portmap,
# bandwidth) and loopback, driven by our cnitool exactly as a runtime drives the plugins. It shows the pods'
# addresses, pod-to-pod, pod-to-gateway and pod-to-wan (masqueraded) traffic, a hostPort reached from the wan and
# from the node itself, the shaping qdiscs, and then deletes everything and shows that nothing is left.
# Nothing touches the root network namespace; all state lives in a temporary directory.
#
# scripts/demo.sh --fabric: fabricd instead. etcd and three node namespaces on one underlay with IPv4 and IPv6,
# fabricd on each (vxlan, dual stack), a dual-stack pod on each node attached with the conflist fabricd wrote,
# pod-to-pod traffic in both families (the receiver sees the sender pod's own address), a node leaving with
# `fabricd cleanup`, then everything removed. DEMO_BIN=<dir> uses binaries already built there.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
[[ $(id -u) == 0 ]] || { echo "demo: run as root (it creates network namespaces)" >&2; exit 1; }
scripts/setup.sh
fabric=false
[[ ${1:-} == --fabric ]] && fabric=true
if [[ -n ${DEMO_BIN:-} ]]; then
  bin=$DEMO_BIN
else
  echo "== building (release)"
  source scripts/lib/binaries.sh
  if $fabric; then cni_build_release all; else cni_build_release plugins; fi
  bin=$root/$CNI_STAGE_DIR
fi
if $fabric; then
  exec bash scripts/demo-fabric.sh "$bin"
fi

id=$$
node=cnidemo-node-$id wan=cnidemo-wan-$id pod1=cnidemo-pod1-$id pod2=cnidemo-pod2-$id
tmp=$(mktemp -d /tmp/cni-demo.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for ns in $pod1 $pod2 $wan $node; do ip netns delete "$ns" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT

nsrun() { local ns=$1; shift; ip netns exec "$ns" "$@"; }
step() { printf '\n== %s\n' "$*"; }

step "a node netns with an uplink to a wan netns (192.0.2.0/24), and two pod netns"
for ns in $node $wan $pod1 $pod2; do ip netns add "$ns"; nsrun "$ns" ip link set lo up; done
ip -n "$node" link add eth0 type veth peer name eth0 netns "$wan"
ip -n "$node" addr add 192.0.2.1/24 dev eth0 && ip -n "$node" link set eth0 up
ip -n "$wan" addr add 192.0.2.2/24 dev eth0 && ip -n "$wan" link set eth0 up
ip -n "$node" route add default via 192.0.2.2
echo "node $node, wan $wan, pods $pod1 $pod2"

mkdir -p "$tmp/net.d" "$tmp/cache"
# The default conflist, with its IPAM state kept in the demo's temporary directory.
sed "s|\"type\": \"host-local\",|\"type\": \"host-local\", \"dataDir\": \"$tmp/ipam\",|" conf/10-kubenet.conflist >"$tmp/net.d/10-kubenet.conflist"
cp conf/99-loopback.conf "$tmp/net.d/"
cnitool() {
  nsrun "$node" env NETCONFPATH="$tmp/net.d" CNI_PATH="$bin" CNI_CACHE_DIR="$tmp/cache" "$@"
}

step "ADD pod1 (hostPort 8080 -> 80, 10 Mbit/s each way) and pod2, with loopback"
caps='{"portMappings":[{"hostPort":8080,"containerPort":80,"protocol":"tcp"}],"bandwidth":{"ingressRate":10000000,"ingressBurst":1000000,"egressRate":10000000,"egressBurst":1000000}}'
start=$(date +%s%N)
cnitool CAP_ARGS="$caps" "$bin/cnitool" add kubenet "/run/netns/$pod1" >"$tmp/pod1.json"
end=$(date +%s%N)
cnitool "$bin/cnitool" add kubenet "/run/netns/$pod2" >"$tmp/pod2.json"
for p in $pod1 $pod2; do cnitool CNI_IFNAME=lo "$bin/cnitool" add cni-loopback "/run/netns/$p" >/dev/null; done
echo "ADD of the kubenet chain for pod1 took $(((end - start) / 1000000)) ms"
cat "$tmp/pod1.json"
ip1=$(nsrun "$pod1" ip -4 -o addr show eth0 | awk '{print $4}' | cut -d/ -f1)
ip2=$(nsrun "$pod2" ip -4 -o addr show eth0 | awk '{print $4}' | cut -d/ -f1)
echo "pod1 eth0: $ip1   pod2 eth0: $ip2"
nsrun "$pod1" ip route

step "CHECK pod1"
cnitool CAP_ARGS="$caps" "$bin/cnitool" check kubenet "/run/netns/$pod1" && echo "check: ok"

step "connectivity"
nsrun "$pod1" ping -c1 -W2 "$ip2" >/dev/null && echo "pod1 -> pod2 ($ip2): ok"
nsrun "$pod1" ping -c1 -W2 10.244.1.1 >/dev/null && echo "pod1 -> gateway (10.244.1.1): ok"
nsrun "$pod1" ping -c1 -W2 192.0.2.2 >/dev/null && echo "pod1 -> wan (192.0.2.2), masqueraded: ok"

step "hostPort 8080 on the node -> pod1:80"
# Started directly (not through the nsrun function, whose `&` would make $! a subshell that cleanup kills while
# socat lives on).
ip netns exec "$pod1" socat TCP-LISTEN:80,fork,reuseaddr SYSTEM:'echo hello from pod1' &
pids+=($!)
sleep 0.3
echo "from the wan:            $(nsrun "$wan" socat -T2 - TCP:192.0.2.1:8080 </dev/null)"
echo "from the node localhost: $(nsrun "$node" socat -T2 - TCP:127.0.0.1:8080 </dev/null)"

step "traffic shaping on pod1's host veth"
nsrun "$node" tc qdisc show | grep -E 'tbf|ingress' || true

step "DEL everything"
for p in $pod1 $pod2; do cnitool CNI_IFNAME=lo "$bin/cnitool" del cni-loopback "/run/netns/$p"; done
cnitool CAP_ARGS="$caps" "$bin/cnitool" del kubenet "/run/netns/$pod1"
cnitool "$bin/cnitool" del kubenet "/run/netns/$pod2"
echo "links left on the node:"; nsrun "$node" ip -br link
rules=$( (nsrun "$node" iptables-save 2>/dev/null; nsrun "$node" nft list ruleset 2>/dev/null) || true)
echo "firewall rules naming a pod (its address, container ID or per-pod chain) left: $(grep -c -E "$ip1|$ip2|cnitool-|CNI-DN-|CNI-[0-9a-f]{24}" <<<"$rules" || true)"
echo "(the shared CNI-HOSTPORT-* chains stay, empty of pods, as the reference plugins leave them)"
echo "leases left: $(find "$tmp/ipam" -type f -name '10.*' | wc -l), cache entries left: $(find "$tmp/cache" -type f | wc -l)"
step "done: namespaces and temporary state are removed on exit"
