# The local cluster's vocabulary: names, paths, addresses, and the processes it starts (every one in a cgroup of
# the cluster's, so that `down` finds and ends them all, whatever started them: containerd's shims and the pods'
# processes included). Sourced by scripts/cluster.sh; defines variables and functions only.

# The cluster's addresses. The underlay is one L2 (a bridge in the `net` namespace) shared by the control plane,
# the nodes and the wan; the wan is every namespace's default gateway, the one place outside the cluster.
KC_UNDERLAY4_PREFIX=172.31.0
KC_UNDERLAY6_PREFIX=fd00:172:31:
KC_CLUSTER_CIDR4=10.244.0.0/16
KC_CLUSTER_CIDR6=fd00:10:244::/56
KC_SERVICE_CIDR4=10.96.0.0/16
KC_SERVICE_CIDR6=fd00:10:96::/112
KC_MAX_NODES=20
# The images Kubernetes v1.28 names, built from the release tree and loaded into every node.
KC_PAUSE_IMAGE=registry.k8s.io/pause:3.9
KC_AGNHOST_IMAGE=registry.k8s.io/e2e-test-images/agnhost:2.45
# Where the Kubernetes binaries and images are built once and kept (like the VM lane's kernels).
KC_CACHE=${CNI_K8S_CACHE:-/var/tmp/cni-rs-k8s}
KC_BIN=$KC_CACHE/bin
KC_K8S_TARGETS=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl pause agnhost kube-dns
  e2e.test)
# Each cluster's state (certificates, configs, logs, each node's private directories) lives here.
KC_ROOT=${CNI_CLUSTER_ROOT:-/var/tmp/cni-rs-cluster}

kc_die() {
  echo "cluster: $*" >&2
  exit 1
}
kc_say() { echo "cluster: $*" >&2; }

# kc_set_name NAME: the cluster's name and everything named after it. Names become namespace names, cgroup paths
# and directories, so they are short and plain.
kc_set_name() {
  [[ $1 =~ ^[a-z][a-z0-9]{0,15}$ ]] || kc_die "cluster name '$1': 1 to 16 of a-z and 0-9, starting with a letter"
  KC_NAME=$1
  KC_DIR=$KC_ROOT/$KC_NAME
  KC_NETNS_PREFIX=kc-$KC_NAME-
  KC_CGROUP=cni-rs-cluster/$KC_NAME
  KC_PIDS_CGROUP=/sys/fs/cgroup/pids/$KC_CGROUP
}

kc_netns() { echo "$KC_NETNS_PREFIX$1"; }          # kc_netns cp|net|wan|nodeN
kc_node_dir() { echo "$KC_DIR/nodes/$1"; }
kc_mntns() { echo "$KC_DIR/ns/$1.mnt"; }             # a node's mount namespace, bound to a file
kc_utsns() { echo "$KC_DIR/ns/$1.uts"; }             # a node's UTS namespace: its hostname is the node's name
kc_node_index() { echo "${1#node}"; }
kc_ip4() { echo "$KC_UNDERLAY4_PREFIX.$1"; }          # kc_ip4 SUFFIX
kc_ip6() { echo "$KC_UNDERLAY6_PREFIX:$1"; }
kc_node_ip4() { kc_ip4 $((10 + $(kc_node_index "$1"))); }
kc_node_ip6() { kc_ip6 $((10 + $(kc_node_index "$1"))); }
KC_CP_SUFFIX=2
KC_WAN_SUFFIX=1

# The nodes of the cluster as `up` recorded them, one per line.
kc_nodes() { [[ -f $KC_DIR/nodes.list ]] && cat "$KC_DIR/nodes.list"; return 0; }
kc_setting() { [[ -f $KC_DIR/settings/$1 ]] && cat "$KC_DIR/settings/$1"; return 0; }

# The cgroup hierarchies of this machine (cgroup v1 controllers, and the v2 unified one), as mount points.
kc_cgroup_mounts() { awk '$3 == "cgroup" || $3 == "cgroup2" { print $2 }' /proc/self/mounts; }

# kc_cgroup_make PATH: PATH (relative to each hierarchy's root) in every hierarchy; cpuset's cpus and mems are
# copied down, which cgroup v1 does not do for a new child.
kc_cgroup_make() {
  local m rel="" part
  for m in $(kc_cgroup_mounts); do
    rel=""
    for part in ${1//\// }; do
      rel+=/$part
      [[ -d $m$rel ]] && continue
      # Another cluster coming up at the same time may make a shared parent first.
      if ! mkdir "$m$rel" 2>/dev/null; then
        [[ -d $m$rel ]] && continue
        return 1
      fi
      if [[ -f $m$rel/cpuset.cpus ]]; then
        cat "$(dirname "$m$rel")/cpuset.cpus" >"$m$rel/cpuset.cpus"
        cat "$(dirname "$m$rel")/cpuset.mems" >"$m$rel/cpuset.mems"
      fi
    done
  done
}

# kc_spawn CGROUP LOG CMD...: starts CMD in the background as a daemon (its own session, stdin closed, output
# to LOG) inside cgroup CGROUP of the cluster (pids hierarchy: the one `down` reads), and prints its PID.
kc_spawn() {
  local cgroup=$KC_PIDS_CGROUP/$1 log=$2
  shift 2
  mkdir -p "$cgroup"
  setsid bash -c 'echo $$ >"$0/cgroup.procs" && exec "$@"' "$cgroup" "$@" </dev/null >>"$log" 2>&1 &
  echo $!
}

# kc_in NODE CMD...: runs CMD in a node (nodeN: network and mount namespaces) or in cp, net or wan (network
# namespace only).
kc_in() {
  local where=$1
  shift
  if [[ $where == node* ]]; then
    nsenter "--net=/run/netns/$(kc_netns "$where")" "--mount=$(kc_mntns "$where")" "--uts=$(kc_utsns "$where")" -- "$@"
  else
    nsenter "--net=/run/netns/$(kc_netns "$where")" -- "$@"
  fi
}

# Every PID in the cluster's cgroups.
kc_pids() {
  [[ -d $KC_PIDS_CGROUP ]] || return 0
  find "$KC_PIDS_CGROUP" -name cgroup.procs -exec cat {} + 2>/dev/null
}

# Ends every process of the cluster: TERM, a grace period, then KILL until none is left.
kc_kill_all() {
  local pids tries=0
  mapfile -t pids < <(kc_pids)
  ((${#pids[@]})) || return 0
  kill -TERM "${pids[@]}" 2>/dev/null
  while ((tries < 50)); do
    mapfile -t pids < <(kc_pids)
    ((${#pids[@]})) || return 0
    ((tries >= 20)) && kill -KILL "${pids[@]}" 2>/dev/null
    sleep 0.2
    tries=$((tries + 1))
  done
  mapfile -t pids < <(kc_pids)
  ((${#pids[@]} == 0)) || kc_die "processes of cluster $KC_NAME would not end: ${pids[*]}"
}

# Removes the cluster's cgroups, deepest first, in every hierarchy.
kc_cgroups_remove() {
  local m
  for m in $(kc_cgroup_mounts); do
    [[ -d $m/$KC_CGROUP ]] || continue
    find "$m/$KC_CGROUP" -depth -type d -exec rmdir {} + 2>/dev/null || true
    # The parent goes with the last cluster.
    rmdir "$m/cni-rs-cluster" 2>/dev/null || true
  done
  return 0
}

# kc_wait SECONDS CMD...: polls CMD every 0.5 s until it succeeds; fails after SECONDS (the caller says what).
kc_wait() {
  local deadline=$((SECONDS + $1))
  shift
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || return 1
    sleep 0.5
  done
}

kc_kubectl() { "$KC_BIN/kubectl" --kubeconfig "$KC_DIR/admin.kubeconfig" "$@"; }
