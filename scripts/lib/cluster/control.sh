# The underlay and the control plane: the `net` namespace's bridge joining every other namespace, the wan, and
# etcd, kube-apiserver, kube-controller-manager and kube-scheduler in the `cp` namespace; the API server reached
# from the machine through a forwarder on a loopback port of the root namespace (the one thing the cluster puts
# there: a listening socket; no link, address, route or rule). Sourced by scripts/cluster.sh.

# kc_attach NAME SUFFIX: makes namespace NAME with an eth0 on the underlay bridge at SUFFIX of both prefixes, and a
# default route via the wan (the wan itself has none).
kc_attach() {
  local name=$1 suffix=$2 ns
  ns=$(kc_netns "$name")
  ip netns add "$ns"
  ip -n "$ns" link set lo up
  ip -n "$(kc_netns net)" link add "$name" type veth peer name eth0 netns "$ns"
  ip -n "$(kc_netns net)" link set "$name" master br0 up
  ip -n "$ns" addr add "$(kc_ip4 "$suffix")/24" dev eth0
  if [[ $(kc_setting dual-stack) == 1 ]]; then
    ip netns exec "$ns" sysctl -qw net.ipv6.conf.eth0.accept_dad=0
    ip -n "$ns" addr add "$(kc_ip6 "$suffix")/64" dev eth0 nodad
  fi
  ip -n "$ns" link set eth0 up
  if [[ $name != wan ]]; then
    ip -n "$ns" route add default via "$(kc_ip4 $KC_WAN_SUFFIX)"
    [[ $(kc_setting dual-stack) == 1 ]] && ip -n "$ns" -6 route add default via "$(kc_ip6 $KC_WAN_SUFFIX)"
  fi
  return 0
}

kc_underlay_up() {
  local net
  net=$(kc_netns net)
  ip netns add "$net"
  ip -n "$net" link set lo up
  ip -n "$net" link add br0 type bridge
  ip -n "$net" link set br0 up
  kc_attach wan $KC_WAN_SUFFIX
  kc_attach cp $KC_CP_SUFFIX
}

kc_cluster_cidrs() {
  if [[ $(kc_setting dual-stack) == 1 ]]; then echo "$KC_CLUSTER_CIDR4,$KC_CLUSTER_CIDR6"; else echo "$KC_CLUSTER_CIDR4"; fi
}
kc_service_cidrs() {
  if [[ $(kc_setting dual-stack) == 1 ]]; then echo "$KC_SERVICE_CIDR4,$KC_SERVICE_CIDR6"; else echo "$KC_SERVICE_CIDR4"; fi
}

# kc_cp_spawn NAME CMD...: a control-plane daemon in the cp namespace, logging to logs/NAME.log.
kc_cp_spawn() {
  local name=$1
  shift
  kc_spawn "cp/$name" "$KC_DIR/logs/$name.log" nsenter "--net=/run/netns/$(kc_netns cp)" -- "$@" >"$KC_DIR/run/$name.pid"
}

kc_control_plane_up() {
  local pki=$KC_DIR/pki cp_ip
  cp_ip=$(kc_ip4 $KC_CP_SUFFIX)
  mkdir -p "$KC_DIR/etcd" "$KC_DIR/logs" "$KC_DIR/run"
  chmod 0700 "$KC_DIR/etcd"
  kc_cp_spawn etcd etcd --name cp --data-dir "$KC_DIR/etcd" \
    --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
    --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
    --initial-cluster cp=http://127.0.0.1:2380
  kc_wait 30 kc_in cp curl -fsS http://127.0.0.1:2379/health ||
    kc_die "etcd did not start: $(tail -5 "$KC_DIR/logs/etcd.log")"
  kc_cp_spawn kube-apiserver "$KC_BIN/kube-apiserver" \
    --etcd-servers=http://127.0.0.1:2379 --advertise-address="$cp_ip" --bind-address=0.0.0.0 --secure-port=6443 \
    --service-cluster-ip-range="$(kc_service_cidrs)" --allow-privileged=true \
    --tls-cert-file="$pki/apiserver.crt" --tls-private-key-file="$pki/apiserver.key" --client-ca-file="$pki/ca.crt" \
    --service-account-key-file="$pki/sa.pub" --service-account-signing-key-file="$pki/sa.key" \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction \
    --kubelet-client-certificate="$pki/apiserver-kubelet-client.crt" \
    --kubelet-client-key="$pki/apiserver-kubelet-client.key" --kubelet-certificate-authority="$pki/ca.crt" \
    --kubelet-preferred-address-types=InternalIP --profiling=false --v=1
  kc_forwarder_up "$(kc_setting asked-api-port)"
  # The admin's kubeconfig, for the machine: through the forwarder.
  kc_kubeconfig "$KC_DIR/admin.kubeconfig" "https://127.0.0.1:$(kc_setting api-port)" admin
  kc_wait 120 kc_kubectl get --raw /readyz ||
    kc_die "kube-apiserver is not ready: $(tail -5 "$KC_DIR/logs/kube-apiserver.log")"
  local cm=(--kubeconfig="$KC_DIR/controller-manager.kubeconfig" --bind-address=127.0.0.1 --leader-elect=false
    --authentication-kubeconfig="$KC_DIR/controller-manager.kubeconfig"
    --authorization-kubeconfig="$KC_DIR/controller-manager.kubeconfig"
    --use-service-account-credentials --service-account-private-key-file="$pki/sa.key" --root-ca-file="$pki/ca.crt"
    --cluster-signing-cert-file="$pki/ca.crt" --cluster-signing-key-file="$pki/ca.key"
    --service-cluster-ip-range="$(kc_service_cidrs)" --cluster-cidr="$(kc_cluster_cidrs)"
    --allocate-node-cidrs=true --configure-cloud-routes=false --node-cidr-mask-size-ipv4=24 --profiling=false --v=1)
  # The IPv6 mask size is refused on a single-stack cluster.
  [[ $(kc_setting dual-stack) == 1 ]] && cm+=(--node-cidr-mask-size-ipv6=64)
  kc_cp_spawn kube-controller-manager "$KC_BIN/kube-controller-manager" "${cm[@]}"
  kc_cp_spawn kube-scheduler "$KC_BIN/kube-scheduler" --kubeconfig="$KC_DIR/scheduler.kubeconfig" \
    --authentication-kubeconfig="$KC_DIR/scheduler.kubeconfig" --authorization-kubeconfig="$KC_DIR/scheduler.kubeconfig" \
    --bind-address=127.0.0.1 --leader-elect=false --profiling=false --v=1
}

# The API server on the root namespace's loopback: socat listens there and, per connection, a socat entered into
# the cp namespace connects to the API server (a socket keeps the namespace it was made in). The port is the one
# asked for, or the first from 6443 up that this socat could bind (two clusters coming up at once each get one).
kc_forwarder_up() {
  local asked=${1:-} port connect=$KC_DIR/run/connect-api.sh pid last
  printf '#!/bin/sh\nexec nsenter --net=/run/netns/%s -- socat STDIO TCP:%s:6443\n' \
    "$(kc_netns cp)" "$(kc_ip4 $KC_CP_SUFFIX)" >"$connect"
  chmod 0755 "$connect"
  port=${asked:-6443}
  last=${asked:-6542}
  for (( ; port <= last; port++)); do
    port_listening "$port" && continue
    pid=$(kc_spawn forwarder "$KC_DIR/logs/forwarder.log" socat "TCP-LISTEN:$port,bind=127.0.0.1,reuseaddr,fork" "EXEC:$connect")
    if kc_wait 5 port_listening_by "$port" "$pid"; then
      echo "$pid" >"$KC_DIR/run/forwarder.pid"
      echo "$port" >"$KC_DIR/settings/api-port"
      return 0
    fi
    kill "$pid" 2>/dev/null || true
  done
  [[ -n $asked ]] && kc_die "port $asked on the root namespace's loopback is taken: pick another with --api-port"
  kc_die "no free port in 6443-6542 on the root namespace's loopback: name one with --api-port"
}

port_listening() { ss -Htln "sport = :$1" | grep -q .; }
port_listening_by() { ss -Htlnp "sport = :$1" | grep -q "pid=$2,"; }

# Checks an --api-port argument.
kc_check_port() {
  [[ -z $1 ]] && return 0
  [[ $1 =~ ^[0-9]+$ ]] && (($1 > 0 && $1 < 65536)) || kc_die "--api-port $1: not a port number"
  # The port of a cluster of the same name is freed by the `down` that `up` runs first.
  [[ $(kc_setting api-port) == "$1" ]] && return 0
  port_listening "$1" && kc_die "port $1 on the root namespace's loopback is taken: pick another with --api-port"
  return 0
}

# What the NetworkPolicy agent may read is what ships: deploy/cni-netpol.yaml's ServiceAccount, ClusterRole and
# ClusterRoleBinding (every document of it but the DaemonSet) applied as they are, and the nodes' agents use that
# ServiceAccount's token (a TokenRequest, as the kubelet asks one for a pod), so the tests judge the shipped RBAC.
kc_netpol_rbac() {
  local manifest=$repo/deploy/cni-netpol.yaml token
  [[ -f $manifest ]] || kc_die "the shipped manifest is missing: $manifest"
  awk '/^---$/ { if (doc !~ /\nkind: DaemonSet/) printf "%s\n---\n", doc; doc = ""; next } { doc = doc "\n" $0 }
    END { if (doc !~ /\nkind: DaemonSet/) printf "%s\n", doc }' "$manifest" | kc_kubectl apply -f - >/dev/null ||
    kc_die "applying the RBAC of $manifest failed"
  token=$(kc_kubectl -n kube-system create token cni-netpol --duration=87600h) ||
    kc_die "no token for the ServiceAccount kube-system/cni-netpol"
  kc_kubeconfig_token "$KC_DIR/cni-netpol.kubeconfig" "https://$(kc_ip4 $KC_CP_SUFFIX):6443" cni-netpol "$token"
}
