#!/usr/bin/env bash
# A local Kubernetes v1.28.7 cluster of namespace nodes, on cni-rs's plugins (or the reference ones), as kind makes
# one of containers: the control plane (etcd, kube-apiserver, kube-controller-manager allocating podCIDRs,
# kube-scheduler) in one network namespace, and N nodes, each a network namespace, a mount namespace and a cgroup
# subtree with its own containerd, kubelet and kube-proxy (iptables mode), all on one underlay with a `wan`
# namespace outside the cluster. The root namespace gets one listening socket on its loopback (the API server's
# forwarder); nothing else of the machine's changes. Run as root.
#
#   scripts/cluster.sh up [--nodes N] [--plugins ours|reference|DIR] [--dual-stack] [--network kubenet|none]
#                         [--flannel-backend vxlan|host-gw|...] [--network-policy] [--dns kube-dns|none]
#                         [--containerd system|1.6|1.7|2.1] [--name NAME] [--api-port PORT]
#   scripts/cluster.sh kubeconfig            # the admin kubeconfig's path (kubectl --kubeconfig "$(...)")
#   scripts/cluster.sh kubectl ARGS...       # kubectl with that kubeconfig
#   scripts/cluster.sh exec NODE|cp|wan CMD...   # a command in a node's namespaces (cp and wan: network only)
#   scripts/cluster.sh load-image NODE|all TAR   # a docker-archive or OCI tar into nodes' containerd
#   scripts/cluster.sh plugins NODE|all ours|reference|DIR   # swap a node's CNI plugins, pods running
#   scripts/cluster.sh restart NODE containerd|kubelet|kube-proxy|cni-netpol
#   scripts/cluster.sh containerd VERSION    # the directory of that containerd's binaries (fetched once)
#   scripts/cluster.sh containerd-config VERSION [KEY=VALUE...]   # the nodes' containerd config, paths changed
#   scripts/cluster.sh paths                 # where the cluster of that name lives, as KEY=VALUE lines
#   scripts/cluster.sh status | down | build
# --name (default `kc`, or $CNI_CLUSTER_NAME) lets clusters live side by side. State: /var/tmp/cni-rs-cluster/NAME;
# Kubernetes' binaries and images are built once into /var/tmp/cni-rs-k8s (../shared/kubernetes/build.sh).
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
lib=$repo/scripts/lib/cluster
for f in common pki control node containerd images dns; do source "$lib/$f.sh"; done

usage() {
  sed -n '/^#   scripts/,/^# --name/p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

# Builds (once) what the cluster runs: Kubernetes' binaries from ../shared/kubernetes and the two images.
kc_build() {
  local t missing=() build=${CNI_K8S_BUILD:-$repo/../shared/kubernetes/build.sh}
  for t in "${KC_K8S_TARGETS[@]}"; do [[ -x $KC_BIN/$t ]] || missing+=("$t"); done
  if ((${#missing[@]})); then
    [[ -x $build ]] || kc_die "Kubernetes is not built in $KC_BIN and $build is missing (the team's ../shared/kubernetes)"
    kc_say "building ${missing[*]} into $KC_BIN (once; about 20 minutes on 2 cores)"
    "$build" "$KC_BIN" "${missing[@]}" >&2
  fi
  command -v busybox >/dev/null || [[ -x /bin/busybox ]] || kc_die "busybox-static is missing: run scripts/setup.sh"
  kc_images_build
  kc_dns_image_build
}

# The plugin directory for --plugins: ours (the release build, scripts/lib/binaries.sh), Debian's reference
# plugins, or a directory of binaries.
kc_plugin_dir() {
  case $1 in
    ours)
      if [[ -n ${CNI_PACKAGE_PREBUILT:-} && -x $CNI_PACKAGE_PREBUILT/bridge ]]; then
        echo "$CNI_PACKAGE_PREBUILT"
      else
        source "$repo/scripts/lib/binaries.sh"
        (cd "$repo" && cni_build_release plugins) >&2
        echo "$repo/$CNI_STAGE_DIR"
      fi
      ;;
    reference)
      [[ -x /usr/lib/cni/bridge ]] || kc_die "the reference plugins are missing: run scripts/setup.sh"
      echo /usr/lib/cni
      ;;
    *)
      [[ -x $1/bridge && -x $1/host-local ]] || kc_die "--plugins $1: no bridge and host-local binaries there"
      (cd "$1" && pwd)
      ;;
  esac
}

# `up` as kind's create.Cluster does it: the flags parsed, then everything checked and built before anything of a
# cluster is made or taken down (a bad flag, a busy port or a missing tool changes nothing), then made in steps.
# The flags land in UP_* variables.
cmd_up() {
  kc_up_parse "$@"
  kc_up_check
  kc_up_prepare
  kc_up_make
}

kc_up_parse() {
  UP_NODES=2 UP_PLUGINS=ours UP_DUAL=0 UP_NETWORK=kubenet UP_PORT="" UP_POLICY=0 UP_BACKEND=vxlan UP_DNS=kube-dns
  UP_CONTAINERD=system
  while (($#)); do
    case $1 in
      --nodes) UP_NODES=${2:?--nodes N}; shift ;;
      --plugins) UP_PLUGINS=${2:?--plugins ours|reference|DIR}; shift ;;
      --dual-stack) UP_DUAL=1 ;;
      --network-policy) UP_POLICY=1 ;;
      --dns) UP_DNS=${2:?--dns kube-dns|none}; shift ;;
      --containerd) UP_CONTAINERD=${2:?--containerd system|1.6|1.7|2.1}; shift ;;
      --flannel-backend) UP_BACKEND=${2:?--flannel-backend TYPE}; shift ;;
      --network) UP_NETWORK=${2:?--network kubenet|flannel|none}; shift ;;
      --name) kc_set_name "${2:?--name NAME}"; shift ;;
      --api-port) UP_PORT=${2:?--api-port PORT}; shift ;;
      *) usage ;;
    esac
    shift
  done
}

# Every flag and what the machine must have, before anything is built or changed.
kc_up_check() {
  [[ $UP_NODES =~ ^[0-9]+$ ]] && ((UP_NODES >= 1 && UP_NODES <= KC_MAX_NODES)) ||
    kc_die "--nodes $UP_NODES: 1 to $KC_MAX_NODES"
  case $UP_NETWORK in
    kubenet | none | flannel) ;;
    *) kc_die "--network $UP_NETWORK: kubenet, flannel or none" ;;
  esac
  [[ $UP_DNS == kube-dns || $UP_DNS == none ]] || kc_die "--dns $UP_DNS: kube-dns or none"
  kc_containerd_known "$UP_CONTAINERD" || kc_die "--containerd $UP_CONTAINERD: system, 1.6, 1.7 or 2.1"
  [[ $UP_BACKEND =~ ^[a-z-]+$ ]] || kc_die "--flannel-backend $UP_BACKEND: a backend type (vxlan, host-gw, ...)"
  case $UP_PLUGINS in
    ours | reference) ;;
    *) [[ -x $UP_PLUGINS/bridge && -x $UP_PLUGINS/host-local ]] ||
      kc_die "--plugins $UP_PLUGINS: no bridge and host-local binaries there" ;;
  esac
  kc_preflight
  kc_check_port "$UP_PORT"
}

# What the cluster runs, built (once) and found: Kubernetes, the images, the plugins, fabricd, cni-netpol.
kc_up_prepare() {
  kc_build
  UP_PLUGIN_DIR=$(kc_plugin_dir "$UP_PLUGINS")
  UP_CONTAINERD_DIR=$(kc_containerd_fetch "$UP_CONTAINERD")
  kc_say "containerd: $("$UP_CONTAINERD_DIR/containerd" --version | awk '{ print $3 }') ($UP_CONTAINERD_DIR)"
  # flannel's manifest runs our fabricd and flannel plugin from images, whatever the nodes' --plugins are.
  UP_RELEASE=""
  [[ $UP_NETWORK == flannel ]] && UP_RELEASE=$(kc_release_dir)
  UP_NETPOL=""
  ((UP_POLICY)) && UP_NETPOL=$(kc_netpol_bin)
  return 0
}

# The cluster's settings, read by every later command (and by the route controller).
kc_up_settings() {
  mkdir -p "$KC_DIR/settings" "$KC_DIR/logs" "$KC_DIR/run"
  echo "$UP_PORT" >"$KC_DIR/settings/asked-api-port"
  echo "$UP_DUAL" >"$KC_DIR/settings/dual-stack"
  echo "$UP_NETWORK" >"$KC_DIR/settings/network"
  echo "$UP_DNS" >"$KC_DIR/settings/dns"
  echo "$UP_BACKEND" >"$KC_DIR/settings/flannel-backend"
  [[ -n $UP_NETPOL ]] && echo "$UP_NETPOL" >"$KC_DIR/settings/netpol-bin"
  echo "$UP_PLUGIN_DIR" >"$KC_DIR/settings/plugin-dir"
  # Who masquerades pods' traffic leaving the cluster on kubenet nodes: our bridge, or the node (kc_kubenet_template).
  if [[ $UP_NETWORK == kubenet && $UP_PLUGINS == reference ]]; then echo node; else echo bridge; fi >"$KC_DIR/settings/masquerade"
  echo "$UP_CONTAINERD_DIR" >"$KC_DIR/settings/containerd-dir"
  local i
  for ((i = 1; i <= UP_NODES; i++)); do echo "node$i"; done >"$KC_DIR/nodes.list"
}

kc_up_make() {
  if [[ -e $KC_DIR ]]; then
    kc_say "a cluster named $KC_NAME exists (or was half made): taking it down first"
    cmd_down
  fi
  kc_up_settings
  # From here on a failure leaves a half-made cluster: take it down, so nothing is left behind.
  [[ ${CNI_CLUSTER_KEEP_FAILED:-0} == 1 ]] ||
    trap 'kc_say "up failed: taking the half-made cluster down"; cmd_down >/dev/null 2>&1 || true' EXIT
  [[ -n $UP_RELEASE ]] && kc_flannel_images "$KC_DIR/images" "$UP_RELEASE"
  kc_cgroup_make "$KC_CGROUP" || kc_die "cannot make the cgroup $KC_CGROUP"
  # Node mount namespaces are bound to files in a directory that must not propagate mounts (as /run/netns).
  mkdir -p "$KC_DIR/ns"
  mount --bind "$KC_DIR/ns" "$KC_DIR/ns"
  mount --make-private "$KC_DIR/ns"
  kc_underlay_up
  kc_wan_resolver_up
  kc_pki_control_plane
  kc_say "control plane: etcd, kube-apiserver, kube-controller-manager, kube-scheduler"
  kc_control_plane_up
  [[ -n $UP_NETPOL ]] && kc_netpol_rbac
  kc_up_nodes
  trap - EXIT
  kc_say "up: $UP_NODES node(s); export KUBECONFIG=$KC_DIR/admin.kubeconfig"
}

# The nodes, their routes and pod network, and what runs on the pod network (the cluster DNS).
kc_up_nodes() {
  local node
  for node in $(kc_nodes); do
    kc_say "$node: namespaces, containerd, kubelet, kube-proxy"
    kc_node_up "$node"
  done
  # The routes a cloud's route table gives: on kubenet every node and the control plane to each node's podCIDRs;
  # on flannel the nodes route among themselves, and the control plane (not a node here) gets the routes alone, so
  # the API server reaches pods (pods/proxy, services/proxy, webhooks) as it does in a real cluster.
  [[ $UP_NETWORK == none ]] ||
    kc_spawn routes "$KC_DIR/logs/routes.log" "$lib/routes.sh" "$KC_DIR" >"$KC_DIR/run/routes.pid"
  kc_wait_nodes_registered
  [[ $UP_NETWORK == flannel ]] && kc_flannel_apply
  [[ $UP_NETWORK == none ]] && return 0
  kc_say "waiting for every node to be Ready"
  kc_kubectl wait --for=condition=Ready node --all --timeout=180s >/dev/null ||
    kc_die "nodes not Ready after 180 s (CNI_CLUSTER_KEEP_FAILED=1 keeps a failed cluster to look at; logs in $KC_DIR)"
  kc_dns_apply
}

# The NetworkPolicy agent (netpol/): $CNI_NETPOL_BIN, the staged release build, or built here.
kc_netpol_bin() {
  if [[ -n ${CNI_NETPOL_BIN:-} ]]; then
    [[ -x $CNI_NETPOL_BIN ]] || kc_die "CNI_NETPOL_BIN=$CNI_NETPOL_BIN is not an executable"
    echo "$CNI_NETPOL_BIN"
  elif [[ -n ${CNI_PACKAGE_PREBUILT:-} && -x $CNI_PACKAGE_PREBUILT/cni-netpol ]]; then
    echo "$CNI_PACKAGE_PREBUILT/cni-netpol"
  else
    (cd "$repo" && cargo build --release --quiet -p netpol) >&2
    echo "$repo/target/release/cni-netpol"
  fi
}

# The release build's directory with fabricd and the flannel plugin (CNI_PACKAGE_PREBUILT when the tests staged
# one), built when missing.
kc_release_dir() {
  if [[ -n ${CNI_PACKAGE_PREBUILT:-} && -x $CNI_PACKAGE_PREBUILT/fabricd && -x $CNI_PACKAGE_PREBUILT/flannel ]]; then
    echo "$CNI_PACKAGE_PREBUILT"
    return
  fi
  source "$repo/scripts/lib/binaries.sh"
  (cd "$repo" && cni_build_release all) >&2
  echo "$repo/$CNI_STAGE_DIR"
}

# flannel's own manifest, with only its two image names swapped for ours (loaded into every node first); its
# net-conf.json gets the IPv6 network of a dual-stack cluster and the backend of --flannel-backend, as an
# operator edits that ConfigMap.
kc_flannel_apply() {
  local manifest=${CNI_FLANNEL_MANIFEST:-$repo/../shared/kubernetes/kube-flannel.yml} node
  [[ -f $manifest ]] || kc_die "flannel's manifest is missing: $manifest"
  for node in $(kc_nodes); do
    kc_import_image "$node" "$KC_DIR/images/fabricd.tar"
    kc_import_image "$node" "$KC_DIR/images/flannel-cni-plugin.tar"
  done
  kc_say "applying flannel's manifest ($manifest) with fabricd's images"
  local ipv6=""
  [[ $(kc_setting dual-stack) == 1 ]] && ipv6=" \"EnableIPv6\": true, \"IPv6Network\": \"$KC_CLUSTER_CIDR6\","
  sed -e "s#ghcr.io/flannel-io/flannel:v[0-9.]*#$KC_FABRICD_IMAGE#" \
    -e "s#ghcr.io/flannel-io/flannel-cni-plugin:v[0-9a-z.-]*#$KC_FLANNEL_CNI_IMAGE#" \
    -e "s#\"Network\": \"10.244.0.0/16\",#\"Network\": \"$KC_CLUSTER_CIDR4\",$ipv6#" \
    -e "s#\"Type\": \"vxlan\"#\"Type\": \"$(kc_setting flannel-backend)\"#" "$manifest" | kc_kubectl apply -f - >&2
}

kc_wait_nodes_registered() {
  local want
  want=$(kc_nodes | wc -l)
  kc_wait 120 bash -c "[[ \$('$KC_BIN/kubectl' --kubeconfig '$KC_DIR/admin.kubeconfig' get nodes -o name | wc -l) -ge $want ]]" ||
    kc_die "not every node registered within 120 s: see $KC_DIR/nodes/*/kubelet.log"
}

kc_preflight() {
  [[ $(id -u) == 0 ]] || kc_die "run as root (namespaces, mounts, cgroups)"
  local t
  for t in ip nsenter unshare socat openssl etcd containerd ctr runc curl ss dnsmasq; do
    command -v "$t" >/dev/null || kc_die "$t is missing: run scripts/setup.sh"
  done
  kc_cgroup_preflight
  case $KC_ROOT in /run/* | /tmp/*) kc_die "CNI_CLUSTER_ROOT=$KC_ROOT: a node mounts its own /run and the kubelet its own /tmp view; choose a path elsewhere" ;; esac
}

cmd_down() {
  [[ -n ${KC_NAME:-} ]] || kc_set_name "${CNI_CLUSTER_NAME:-kc}"
  local ns m left=""
  kc_kill_all
  for ns in $(ip netns list | awk '{print $1}' | grep "^$KC_NETNS_PREFIX" || true); do
    ip netns del "$ns" 2>/dev/null || true
  done
  # The node mount namespaces' files, then their directory's own bind mount.
  for m in $(awk -v d="$KC_DIR/" 'index($2, d) == 1 { print $2 }' /proc/self/mounts | sort -r); do
    umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
  done
  kc_cgroups_remove
  rm -rf "$KC_DIR"
  # Mount points made for the nodes, once no cluster is left to use them.
  if [[ -f $KC_ROOT/created-mountpoints ]] && [[ -z $(ls -A "$KC_ROOT" | grep -v '^created-mountpoints$') ]]; then
    sort -ru "$KC_ROOT/created-mountpoints" | while read -r m; do rmdir "$m" 2>/dev/null || true; done
    rm -f "$KC_ROOT/created-mountpoints"
  fi
  rmdir "$KC_ROOT" 2>/dev/null || true
  # What could not be removed is said, and down fails.
  ip netns list | grep -q "^$KC_NETNS_PREFIX" && left+=" network namespaces ($KC_NETNS_PREFIX*);"
  grep -q " $KC_DIR" /proc/self/mounts && left+=" mounts under $KC_DIR;"
  [[ -e $KC_DIR ]] && left+=" $KC_DIR;"
  [[ -n $(kc_cgroups_left) ]] && left+=" cgroups $(kc_cgroups_left | tr '\n' ' ');"
  [[ -z $left ]] || kc_die "down: left behind:$left"
  kc_say "down: cluster $KC_NAME removed"
}

cmd_status() {
  [[ -d $KC_DIR ]] || { echo "no cluster named $KC_NAME"; return 1; }
  echo "cluster $KC_NAME: $(kc_nodes | wc -l) node(s), network $(kc_setting network), plugins $(kc_setting plugin-dir), dual-stack $(kc_setting dual-stack)"
  echo "kubeconfig: $KC_DIR/admin.kubeconfig (API server on 127.0.0.1:$(kc_setting api-port))"
  echo "processes: $(kc_pids | wc -l)"
  kc_kubectl get nodes -o wide 2>&1 || true
}

cmd_exec() {
  local where=${1:?exec NODE|cp|wan CMD...}
  shift
  (($#)) || set -- bash
  [[ $where == cp || $where == wan || $where == net ]] || grep -qx "$where" <(kc_nodes) || kc_die "no node $where in cluster $KC_NAME"
  exec env KUBECONFIG="$KC_DIR/admin-underlay.kubeconfig" PATH="$KC_BIN:$PATH" \
    "$(command -v nsenter)" "--net=/run/netns/$(kc_netns "$where")" \
    $([[ $where == node* ]] && echo "--mount=$(kc_mntns "$where") --uts=$(kc_utsns "$where")") -- "$@"
}

cmd_load_image() {
  local target=${1:?load-image NODE|all TAR} tar=${2:?load-image NODE|all TAR} node
  [[ -f $tar ]] || kc_die "$tar: no such file"
  tar=$(realpath "$tar")
  if [[ $target == all ]]; then
    for node in $(kc_nodes); do kc_import_image "$node" "$tar"; done
  else
    grep -qx "$target" <(kc_nodes) || kc_die "no node $target in cluster $KC_NAME"
    kc_import_image "$target" "$tar"
  fi
}

# Swaps the plugins in nodes' /opt/cni/bin (each binary by rename) while pods run: the takeover path.
cmd_plugins() {
  local target=${1:?plugins NODE|all ours|reference|DIR} which=${2:?plugins NODE|all ours|reference|DIR} dir node
  dir=$(kc_plugin_dir "$which")
  echo "$dir" >"$KC_DIR/settings/plugin-dir"
  for node in $(kc_nodes); do
    [[ $target == all || $target == "$node" ]] && KC_PLUGIN_DIR=$dir kc_node_plugins "$node"
  done
  return 0
}

# Restarts one daemon of a node (TERM, then started again as `up` started it); its pods keep running.
cmd_restart() {
  local node=${1:?restart NODE DAEMON} daemon=${2:?restart NODE containerd|kubelet|kube-proxy} pid
  grep -qx "$node" <(kc_nodes) || kc_die "no node $node in cluster $KC_NAME"
  case $daemon in containerd | kubelet | kube-proxy | cni-netpol) ;; *) kc_die "restart: containerd, kubelet, kube-proxy or cni-netpol" ;; esac
  pid=$(cat "$(kc_node_dir "$node")/$daemon.pid")
  kill -TERM "$pid" 2>/dev/null || true
  kc_wait 30 bash -c "! kill -0 $pid" || kill -KILL "$pid" 2>/dev/null || true
  "kc_node_${daemon//-/_}" "$node"
}

# The cluster's places, for programs that drive it (netns-tests' cluster.rs reads them rather than knowing them):
# its state directory and their root, its admin kubeconfig, the prefix of its network namespaces, its cgroup (below
# each hierarchy's mount point), Kubernetes' binaries. The cluster need not be up.
cmd_paths() {
  cat <<PATHS
root=$KC_ROOT
dir=$KC_DIR
kubeconfig=$KC_DIR/admin.kubeconfig
netns-prefix=$KC_NETNS_PREFIX
cgroup=$KC_CGROUP
bin=$KC_BIN
PATHS
}

main() {
  kc_set_name "${CNI_CLUSTER_NAME:-kc}"
  # --name may come before the command too.
  if [[ ${1:-} == --name ]]; then kc_set_name "${2:?--name NAME}"; shift 2; fi
  local command=${1:-}
  (($#)) && shift
  case $command in
    up) cmd_up "$@" ;;
    down) cmd_down ;;
    status) cmd_status ;;
    kubeconfig) [[ -f $KC_DIR/admin.kubeconfig ]] || kc_die "no cluster named $KC_NAME"; echo "$KC_DIR/admin.kubeconfig" ;;
    kubectl) kc_kubectl "$@" ;;
    exec) cmd_exec "$@" ;;
    load-image) cmd_load_image "$@" ;;
    plugins) cmd_plugins "$@" ;;
    restart) cmd_restart "$@" ;;
    build) kc_build ;;
    paths) cmd_paths ;;
    containerd)
      kc_containerd_known "${1:-}" || kc_die "containerd VERSION: system, 1.6, 1.7 or 2.1"
      kc_containerd_fetch "$1"
      ;;
    containerd-config)
      kc_containerd_known "${1:-}" || kc_die "containerd-config VERSION: system, 1.6, 1.7 or 2.1"
      local dir
      dir=$(kc_containerd_fetch "$1")
      shift
      kc_containerd_toml "$(kc_containerd_major "$dir")" "$@"
      ;;
    *) usage ;;
  esac
}

main "$@"
