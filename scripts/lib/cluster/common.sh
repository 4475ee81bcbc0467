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
  kc_cgroup_detect
  # The one hierarchy whose cgroup.procs files hold every process of the cluster (what `down` reads).
  if [[ $KC_CGROUP_MODE == v2 ]]; then
    KC_PROCS_CGROUP=/sys/fs/cgroup/$KC_CGROUP
  else
    KC_PROCS_CGROUP=/sys/fs/cgroup/pids/$KC_CGROUP
  fi
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

# The machine's cgroup mode, found once: v2 (the unified hierarchy alone at /sys/fs/cgroup), v1 (a hierarchy per
# controller), or hybrid (v1's, plus a v2 hierarchy at /sys/fs/cgroup/unified, as systemd's hybrid mode mounts it:
# its controllers are v1's, so the cluster drives v1 there).
kc_cgroup_detect() {
  [[ -n ${KC_CGROUP_MODE:-} ]] && return 0
  if [[ $(stat -fc %T /sys/fs/cgroup 2>/dev/null) == cgroup2fs ]]; then
    KC_CGROUP_MODE=v2
  elif [[ $(stat -fc %T /sys/fs/cgroup/unified 2>/dev/null) == cgroup2fs ]]; then
    KC_CGROUP_MODE=hybrid
  else
    KC_CGROUP_MODE=v1
  fi
}

# cgroup v2: the controllers a node's subtree is given. The kubelet asks its cgroupRoot for each of cpu, cpuset,
# memory, hugetlb and pids that the machine's root has (it reports the root missing otherwise); io is delegated
# where present for the pods' block I/O weights. cpu, memory and pids are required.
KC_CGROUP2_REQUIRED=(cpu memory pids)
KC_CGROUP2_WANTED=(cpu cpuset memory pids io hugetlb)
kc_cgroup2_controllers() {
  local c
  for c in "${KC_CGROUP2_WANTED[@]}"; do
    grep -qw "$c" /sys/fs/cgroup/cgroup.controllers && echo "$c"
  done
  return 0
}

# Says which cgroup mode the cluster drives, and names what the machine lacks before anything is made: v1 needs
# the pids hierarchy (where `down` finds the processes); v2 needs cpu, memory and pids in the root's
# cgroup.controllers and every delegated controller enabled in its cgroup.subtree_control (enabled here if not
# yet, as systemd does at boot; a root with processes of its own, as a container's cgroup namespace, refuses).
kc_cgroup_preflight() {
  local c missing=() refused=() enabled=()
  case $KC_CGROUP_MODE in
    v1 | hybrid)
      [[ -f /sys/fs/cgroup/pids/cgroup.procs ]] || kc_die "cgroup $KC_CGROUP_MODE without a pids hierarchy at" \
        "/sys/fs/cgroup/pids (where down finds the cluster's processes)"
      if [[ $KC_CGROUP_MODE == v1 ]]; then
        kc_say "cgroup v1 (a hierarchy per controller)"
      else
        kc_say "cgroup hybrid (v1 controllers, and v2 at /sys/fs/cgroup/unified): using v1"
      fi
      ;;
    v2)
      for c in "${KC_CGROUP2_REQUIRED[@]}"; do
        grep -qw "$c" /sys/fs/cgroup/cgroup.controllers || missing+=("$c")
      done
      ((${#missing[@]} == 0)) || kc_die "cgroup v2: /sys/fs/cgroup/cgroup.controllers lacks ${missing[*]}" \
        "(the kubelet needs ${KC_CGROUP2_REQUIRED[*]}; a container must be given them)"
      for c in $(kc_cgroup2_controllers); do
        grep -qw "$c" /sys/fs/cgroup/cgroup.subtree_control && continue
        if echo "+$c" >/sys/fs/cgroup/cgroup.subtree_control; then enabled+=("$c"); else refused+=("$c"); fi
      done 2>/dev/null
      # A refusal leaves the root as it was (a threaded controller, cpu or pids, may pass where memory does not).
      ((${#refused[@]} == 0)) || for c in "${enabled[@]}"; do echo "-$c" >/sys/fs/cgroup/cgroup.subtree_control; done
      ((${#refused[@]} == 0)) || kc_die "cgroup v2: the controller(s) ${refused[*]} cannot be delegated below" \
        "/sys/fs/cgroup (writing +NAME to its cgroup.subtree_control failed: processes in a non-root cgroup, as a" \
        "container's, forbid it; move them into a child cgroup first)"
      kc_say "cgroup v2 (unified), delegating $(kc_cgroup2_controllers | tr '\n' ' ')to each node" ;;
  esac
}

# kc_cgroup_make PATH: PATH (relative to each hierarchy's root) in every hierarchy; cpuset's cpus and mems are
# copied down, which cgroup v1 does not do for a new child. On v2 PATH is a parent (a node's subtree, the
# cluster's): its controllers are enabled for its children, and it holds no process of its own (v2's rule).
kc_cgroup_make() {
  local m rel="" part
  if [[ $KC_CGROUP_MODE == v2 ]]; then
    kc_cgroup2_make "$1" parent
    return
  fi
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

# kc_cgroup2_make PATH parent|leaf: PATH below /sys/fs/cgroup, every cgroup on the way given the delegated
# controllers for its children (cgroup.subtree_control), PATH itself too unless it is a leaf: processes live
# only in leaves on v2.
kc_cgroup2_make() {
  local dir=/sys/fs/cgroup enable parts i
  enable=$(kc_cgroup2_controllers | sed 's/^/+/' | tr '\n' ' ')
  read -ra parts <<<"${1//\// }"
  for ((i = 0; i < ${#parts[@]}; i++)); do
    dir+=/${parts[i]}
    # Another cluster coming up at the same time may make a shared parent first.
    mkdir "$dir" 2>/dev/null || [[ -d $dir ]] || return 1
    ((i == ${#parts[@]} - 1)) && [[ $2 == leaf ]] && break
    echo "$enable" >"$dir/cgroup.subtree_control" || return 1
  done
}

# kc_spawn CGROUP LOG CMD...: starts CMD in the background as a daemon (its own session, stdin closed, output
# to LOG) inside cgroup CGROUP of the cluster (v1: the pids hierarchy, the one `down` reads; v2: a leaf), and
# prints its PID.
kc_spawn() {
  local cgroup=$KC_PROCS_CGROUP/$1 log=$2
  if [[ $KC_CGROUP_MODE == v2 ]]; then
    kc_cgroup2_make "$KC_CGROUP/$1" leaf || kc_die "cannot make the cgroup $KC_CGROUP/$1"
  else
    mkdir -p "$cgroup"
  fi
  shift 2
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
  [[ -d $KC_PROCS_CGROUP ]] || return 0
  find "$KC_PROCS_CGROUP" -name cgroup.procs -exec cat {} + 2>/dev/null
}

# KILL to every process of the cluster: on v2 through cgroup.kill where the kernel has it (5.14+: the whole
# subtree at once, a process forking meanwhile included), else by PID.
kc_kill_hard() {
  if [[ -f $KC_PROCS_CGROUP/cgroup.kill ]]; then
    echo 1 >"$KC_PROCS_CGROUP/cgroup.kill" 2>/dev/null && return 0
  fi
  kill -KILL "$@" 2>/dev/null
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
    ((tries >= 20)) && kc_kill_hard "${pids[@]}"
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

# The cluster's cgroups that are left, in any hierarchy (down names them).
kc_cgroups_left() {
  local m
  for m in $(kc_cgroup_mounts); do
    [[ -d $m/$KC_CGROUP ]] && echo "$m/$KC_CGROUP"
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
