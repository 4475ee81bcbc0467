#!/usr/bin/env bash
# The fabricd demo, run by `scripts/demo.sh --fabric` (which builds the binaries and passes their directory).
# etcd in an "infra" namespace holding the underlay bridge (192.168.50.0/24 and fd00:192:168:50::/64), three
# "node" namespaces each running fabricd (vxlan, dual stack), one dual-stack pod per node, traffic in both
# families, a node leaving, and everything removed on exit. Nothing touches the root network namespace.
set -euo pipefail
bin=${1:?usage: demo-fabric.sh <binary dir>}
id=$$
infra=fabdemo-infra-$id
nodes=(fabdemo-node1-$id fabdemo-node2-$id fabdemo-node3-$id)
pods=(fabdemo-pod1-$id fabdemo-pod2-$id fabdemo-pod3-$id)
tmp=$(mktemp -d /tmp/fabric-demo.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  for ns in "${pods[@]}" "${nodes[@]}" "$infra"; do ip netns delete "$ns" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT
nsrun() { local ns=$1; shift; ip netns exec "$ns" "$@"; }
step() { printf '\n== %s\n' "$*"; }
endpoint=http://192.168.50.254:2379
etcdctl() { nsrun "$infra" env ETCDCTL_API=3 etcdctl --endpoints=$endpoint "$@"; }

step "an underlay: one bridge in an infra namespace, IPv4 and IPv6; etcd on it"
ip netns add "$infra"
nsrun "$infra" ip link set lo up
nsrun "$infra" ip link add seg0 type bridge mcast_snooping 0
nsrun "$infra" ip addr add 192.168.50.254/24 dev seg0
nsrun "$infra" ip addr add fd00:192:168:50::fe/64 dev seg0 nodad
nsrun "$infra" ip link set seg0 up
ip netns exec "$infra" etcd --name infra --data-dir "$tmp/etcd" --listen-client-urls $endpoint --advertise-client-urls $endpoint \
  --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
  --initial-cluster infra=http://127.0.0.1:2380 >"$tmp/etcd.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do etcdctl endpoint health >/dev/null 2>&1 && break; sleep 0.1; done
config='{"EnableIPv6":true,"Network":"10.244.0.0/16","IPv6Network":"fd00:10:244::/56","Backend":{"Type":"vxlan"}}'
etcdctl put /coreos.com/network/config "$config" >/dev/null
echo "etcd at $endpoint; /coreos.com/network/config = $config"

step "three nodes, each running fabricd"
for i in 0 1 2; do
  n=${nodes[$i]} host=$((10 + i))
  ip netns add "$n"
  nsrun "$n" ip link set lo up
  ip -n "$n" link add eth0 type veth peer name "n$i" netns "$infra"
  ip -n "$infra" link set "n$i" master seg0 up
  ip -n "$n" addr add "192.168.50.$host/24" dev eth0
  ip -n "$n" addr add "fd00:192:168:50::$host/64" dev eth0 nodad
  ip -n "$n" link set eth0 up
  ip -n "$n" route add default via 192.168.50.254
  ip -n "$n" -6 route add default via fd00:192:168:50::fe
  mkdir -p "$tmp/$n"
  # Started by ip netns exec itself (not a shell function) so that $! is the agent's own PID.
  ip netns exec "$n" "$bin/fabricd" --etcd-endpoints=$endpoint --subnet-file="$tmp/$n/subnet.env" \
    --cni-conf-dir="$tmp/$n/net.d" --cni-ipam-data-dir="$tmp/$n/ipam" 2>"$tmp/$n/fabricd.log" &
  pids+=($!)
  agent[$i]=$!
done
for n in "${nodes[@]}"; do
  for _ in $(seq 100); do [[ -f $tmp/$n/net.d/10-fabric.conflist ]] && break; sleep 0.1; done
done
echo "leases in etcd (flannel's keys and values):"
etcdctl get --prefix /coreos.com/network/subnets/ | paste - - | sed 's/^/  /'
echo; echo "${nodes[0]}'s subnet.env:"; sed 's/^/  /' "$tmp/${nodes[0]}/subnet.env"
echo; echo "fabricd status on ${nodes[0]}:"; nsrun "${nodes[0]}" "$bin/fabricd" --etcd-endpoints=$endpoint \
  --subnet-file="$tmp/${nodes[0]}/subnet.env" status | sed 's/^/  /'
echo; echo "routes fabricd made on ${nodes[0]} (proto 75):"
nsrun "${nodes[0]}" ip route show proto 75 | sed 's/^/  /'
nsrun "${nodes[0]}" ip -6 route show proto 75 | sed 's/^/  /'

step "a dual-stack pod on each node, with the conflist fabricd wrote"
declare -a v4 v6
for i in 0 1 2; do
  n=${nodes[$i]} p=${pods[$i]}
  ip netns add "$p"
  nsrun "$n" env NETCONFPATH="$tmp/$n/net.d" CNI_PATH="$bin" CNI_CACHE_DIR="$tmp/$n/cache" CNI_IFNAME=eth0 \
    "$bin/cnitool" add kubenet "/run/netns/$p" >"$tmp/$p.json"
  v4[$i]=$(nsrun "$p" ip -4 -o addr show eth0 | awk '{print $4}' | cut -d/ -f1)
  v6[$i]=$(nsrun "$p" ip -6 -o addr show eth0 scope global | awk '{print $4}' | cut -d/ -f1)
  echo "$p on $n: ${v4[$i]} ${v6[$i]}"
done

step "pod to pod across nodes, both families, without NAT (the receiver prints the address it sees)"
for i in 0 1 2; do
  ip netns exec "${pods[$i]}" socat TCP4-LISTEN:80,fork,reuseaddr SYSTEM:'echo "$SOCAT_PEERADDR"' &
  pids+=($!)
  ip netns exec "${pods[$i]}" socat TCP6-LISTEN:80,fork,reuseaddr,ipv6only=1 SYSTEM:'echo "$SOCAT_PEERADDR"' &
  pids+=($!)
done
# socat prints an IPv6 peer in full ([fd00:0010:...]): shown in its short form.
short() { python3 -c 'import ipaddress, sys; print(ipaddress.ip_address(sys.argv[1].strip("[]")))' "$1"; }
sleep 0.5
for to in 1 2; do
  for ip in "${v4[$to]}" "[${v6[$to]}]"; do
    for _ in $(seq 20); do nsrun "${pods[0]}" ping -c1 -W1 "${ip//[\[\]]/}" >/dev/null 2>&1 && break; done
    seen=$(nsrun "${pods[0]}" socat -T2 - "TCP:$ip:80" </dev/null || true)
    [[ -n $seen ]] && seen=$(short "$seen") || seen="(no answer)"
    echo "${pods[0]} (${v4[0]}, ${v6[0]}) -> ${pods[$to]} at $ip: the receiver sees $seen"
  done
done

step "${nodes[2]} leaves the cluster: its agent stops, fabricd cleanup removes its data plane and its lease"
kill "${agent[2]}"
wait "${agent[2]}" 2>/dev/null || true
nsrun "${nodes[2]}" "$bin/fabricd" --etcd-endpoints=$endpoint --subnet-file="$tmp/${nodes[2]}/subnet.env" \
  --cni-conf-dir="$tmp/${nodes[2]}/net.d" cleanup 2>&1 | sed 's/^/  /'
sleep 0.5
echo "left on ${nodes[2]}: $(nsrun "${nodes[2]}" ip -br link | grep -c flannel || true) vxlan devices, $( (nsrun "${nodes[2]}" ip route show proto 75; nsrun "${nodes[2]}" ip -6 route show proto 75) | wc -l) routes of fabricd's"
echo "routes on ${nodes[0]} now (one peer left in each family):"
nsrun "${nodes[0]}" ip route show proto 75 | sed 's/^/  /'
nsrun "${nodes[0]}" ip -6 route show proto 75 | sed 's/^/  /'

step "done: agents, etcd, namespaces and temporary state are removed on exit"
