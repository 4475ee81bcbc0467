# The nodes' containerd: the machine's own (`--containerd system`, the default), or Debian's 1.6, 1.7 or 2.1
# fetched from Debian's pool, checked against a pinned sha256 and unpacked into a cache (`dpkg-deb -x`, as the VM
# lane unpacks its kernels; never installed over the machine's package). Each needs only libc6 (>= 2.34) and runc.
# Its config is version 2 for 1.x and version 3 for 2.x, chosen from what the binary says it is, so a machine whose
# own containerd is 2.x gets the right one too. Sourced by scripts/cluster.sh.

KC_CONTAINERD_POOL=${CNI_CONTAINERD_POOL:-http://deb.debian.org/debian/pool/main/c/containerd}
# version → the package file (bookworm's, trixie's, sid's) and its sha256
declare -A KC_CONTAINERD_DEBS=(
  [1.6]="containerd_1.6.20~ds1-1+deb12u3_amd64.deb"
  [1.7]="containerd_1.7.24~ds1-6+deb13u1_amd64.deb"
  [2.1]="containerd_2.1.9+ds1-5_amd64.deb"
)
declare -A KC_CONTAINERD_SHA256=(
  [1.6]=8669d264eeb0fcdb4a0b1ba436ab88ec5dafde4a66e1278ec279d830db4c2216
  [1.7]=ed708deb96fe476a3bce4efa5c0538dfbcf717ab9a7c7944ba7260342c25899c
  [2.1]=2dda86ce7033fd612fc50e136679d8174ccad680eb29cd4611e0d2a1b84cf591
)

kc_containerd_known() { [[ $1 == system || -n ${KC_CONTAINERD_DEBS[$1]:-} ]]; }

# kc_containerd_fetch VERSION: the directory of that version's containerd, containerd-shim-runc-v2 and ctr
# (fetched and unpacked once); for `system`, the directory of the machine's containerd.
kc_containerd_fetch() {
  local version=$1 deb dir tmp
  if [[ $version == system ]]; then
    dirname "$(command -v containerd)"
    return 0
  fi
  deb=${KC_CONTAINERD_DEBS[$version]}
  dir=$KC_CACHE/containerd/${deb%.deb}
  if [[ ! -x $dir/usr/bin/containerd ]]; then
    kc_say "fetching containerd $version ($deb) from $KC_CONTAINERD_POOL"
    mkdir -p "$KC_CACHE/containerd"
    tmp=$(mktemp -d "$KC_CACHE/containerd/.fetch.XXXXXX")
    curl -fsS --retry 3 -o "$tmp/$deb" "$KC_CONTAINERD_POOL/$deb" ||
      { rm -rf "$tmp"; kc_die "--containerd $version: cannot fetch $KC_CONTAINERD_POOL/$deb (CNI_CONTAINERD_POOL names another mirror)"; }
    echo "${KC_CONTAINERD_SHA256[$version]}  $tmp/$deb" | sha256sum -c --quiet >/dev/null 2>&1 ||
      { rm -rf "$tmp"; kc_die "--containerd $version: $deb does not have the pinned sha256"; }
    # Unpacked beside the cache entry and moved in whole: clusters made side by side may fetch it at once.
    dpkg-deb -x "$tmp/$deb" "$tmp/root"
    mv -T "$tmp/root" "$dir" 2>/dev/null || [[ -x $dir/usr/bin/containerd ]] ||
      { rm -rf "$tmp"; kc_die "--containerd $version: cannot unpack into $dir"; }
    rm -rf "$tmp"
  fi
  echo "$dir/usr/bin"
}

# The cluster's containerd directory (set by `up`), where its containerd, shim and ctr are.
kc_containerd_dir() {
  local dir
  dir=$(kc_setting containerd-dir)
  echo "${dir:-$(dirname "$(command -v containerd)")}"
}

# kc_containerd_major DIR: the major version of DIR/containerd (1 or 2).
kc_containerd_major() {
  "$1/containerd" --version | awk '{ v = $3; sub(/^v/, "", v); split(v, p, "."); print p[1] }'
}

# kc_ctr NODE ARGS...: the cluster's ctr against the node's containerd.
kc_ctr() {
  local node=$1
  shift
  kc_in "$node" "$(kc_containerd_dir)/ctr" --address /run/containerd/containerd.sock --namespace k8s.io "$@"
}

# The node's config: the defaults of kc_containerd_toml, the kubenet template on kubenet clusters.
kc_containerd_config() {
  local node=$1 template=()
  [[ $(kc_setting network) == kubenet ]] && template=("template=$(kc_node_dir "$node")/cni-conf-template")
  kc_containerd_toml "$(kc_containerd_major "$(kc_containerd_dir)")" "${template[@]}"
}

# kc_toml_str TEXT: TEXT as a TOML basic string.
kc_toml_str() {
  local s=${1//\\/\\\\}
  s=${s//\"/\\\"}
  printf '"%s"' "$s"
}

# kc_containerd_toml MAJOR [KEY=VALUE...]: containerd's config for the CRI plugin with CNI, version 2 for MAJOR 1
# and version 3 for MAJOR 2: the one template of the nodes and of the test rig (netns-tests' containerd.rs reads
# it through `cluster.sh containerd-config`). Keys: root, state, socket, ttrpc, opt (the daemon's paths; ttrpc
# and opt left to containerd when empty), sandbox (the pause image), bin-dir, conf-dir, template (CNI's
# conf_template, none when empty).
kc_containerd_toml() {
  local major=$1 kv key
  shift
  local -A c=([root]=/var/lib/containerd [state]=/run/containerd [socket]=/run/containerd/containerd.sock
    [ttrpc]="" [opt]="" [sandbox]=$KC_PAUSE_IMAGE [bin-dir]=/opt/cni/bin [conf-dir]=/etc/cni/net.d [template]="")
  for kv in "$@"; do
    key=${kv%%=*}
    [[ $kv == *=* && -v "c[$key]" ]] ||
      kc_die "containerd-config: no setting $key (root, state, socket, ttrpc, opt, sandbox, bin-dir, conf-dir, template)"
    c[$key]=${kv#*=}
  done
  [[ $major == 1 || $major == 2 ]] || kc_die "containerd-config: containerd $major.x is not known (1.x, 2.x)"
  cat <<TOML
version = $((major + 1))
root = $(kc_toml_str "${c[root]}")
state = $(kc_toml_str "${c[state]}")
# Snapshotters the nodes cannot use, and tracing: fewer plugins, a faster start, a quieter log.
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]
[grpc]
  address = $(kc_toml_str "${c[socket]}")
[metrics]
  address = "127.0.0.1:1338"
TOML
  [[ -n ${c[ttrpc]} ]] && printf '[ttrpc]\n  address = %s\n' "$(kc_toml_str "${c[ttrpc]}")"
  [[ -n ${c[opt]} ]] && printf '[plugins."io.containerd.internal.v1.opt"]\n  path = %s\n' "$(kc_toml_str "${c[opt]}")"
  local template=""
  [[ -n ${c[template]} ]] && template="conf_template = $(kc_toml_str "${c[template]}")"
  if ((major == 1)); then
    cat <<TOML
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = $(kc_toml_str "${c[sandbox]}")
  # Pods may not lower their oom_score_adj below the node's.
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = $(kc_toml_str "${c[bin-dir]}")
    conf_dir = $(kc_toml_str "${c[conf-dir]}")
    $template
TOML
  else
    # Version 3 splits the CRI plugin in three (images, runtime, the gRPC server). bin_dirs is set: Debian's build
    # also looks in /usr/lib/cni, where the machine's reference plugins are.
    cat <<TOML
[plugins."io.containerd.cri.v1.images".pinned_images]
  sandbox = $(kc_toml_str "${c[sandbox]}")
[plugins."io.containerd.cri.v1.runtime"]
  # Pods may not lower their oom_score_adj below the node's.
  restrict_oom_score_adj = true
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = [$(kc_toml_str "${c[bin-dir]}")]
    conf_dir = $(kc_toml_str "${c[conf-dir]}")
    $template
[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
TOML
  fi
}

# The node's containerd, its directory first on PATH: containerd finds its shim there (and the shim runc).
kc_node_containerd() {
  local node=$1 dir bin
  dir=$(kc_node_dir "$node")
  bin=$(kc_containerd_dir)
  kc_node_spawn "$node" containerd env "PATH=$bin:$PATH" "$bin/containerd" --config "$dir/containerd.toml"
  kc_wait 30 kc_in "$node" test -S /run/containerd/containerd.sock ||
    kc_die "$node: containerd did not start: $(tail -5 "$dir/containerd.log")"
}
