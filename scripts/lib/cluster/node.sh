# A node: a network namespace on the underlay, a mount namespace of its own (bound to a file, as `ip netns` binds
# network namespaces) in which the node's directories are the node's, and a cgroup subtree (the kubelet's
# cgroupRoot, with the node's daemons beside its pods). containerd, the kubelet and kube-proxy run in it.
# Sourced by scripts/cluster.sh.

# The directories a node has of its own: a pod's hostPath, a plugin's state file, containerd's store and the
# kubelet's pods are node1's on node1, as on a real node.
KC_NODE_DIRS=(etc/cni/net.d opt/cni/bin var/lib/cni var/lib/kubelet var/lib/containerd var/log/pods var/log/containers)
# Host-wide kernel tunables the kubelet writes at start (they belong to no namespace): in a node they are files of
# the node's, bound over the /proc/sys entries, so the machine keeps its values.
KC_KUBELET_SYSCTLS=(vm/overcommit_memory vm/panic_on_oom kernel/panic kernel/panic_on_oops kernel/keys/root_maxkeys
  kernel/keys/root_maxbytes)

# The mount namespace's set-up, run inside it (and inside the node's network namespace, so the new sysfs shows the
# node's links). Arguments: the node's directory, then the cgroup mounts as "type options mountpoint" lines.
kc_node_mounts_script() {
  cat <<'SCRIPT'
set -eu
node=$1 cgroups=$2
# The node's own hostname, as a kind node has it: hostNetwork pods (which share the node's UTS namespace) and the
# node's daemons see the node's name, not the machine's.
hostname "$3"
mount --make-rprivate /
# The copies of the machine's namespace files (other clusters' nodes, other tests' namespaces) would keep those
# namespaces alive as long as this node lives: not this node's to hold.
awk '$3 == "nsfs" { print $2 }' /proc/self/mounts | sort -r | while read -r m; do umount -l "$m"; done
# sysfs of the node's network namespace, and the machine's cgroup hierarchies mounted again beneath it.
mount -t sysfs sysfs /sys
mount -t tmpfs -o mode=0755 cgroup /sys/fs/cgroup
while read -r type opts point; do
  mkdir -p "$point"
  mount -t "$type" -o "$opts" "$type" "$point"
done <"$cgroups"
mount -t tmpfs -o mode=0755 run /run
while read -r d; do
  mkdir -p "$node/root/$d"
  # A mount point the machine lacks is made (empty) and recorded: `down` of the last cluster removes it.
  [ -d "/$d" ] || { mkdir -p "/$d" && echo "/$d" >>"$node/../../../created-mountpoints"; }
  mount --bind "$node/root/$d" "/$d"
done <"$node/dirs"
while read -r f; do
  mkdir -p "$node/sysctl/$(dirname "$f")"
  cat "/proc/sys/$f" >"$node/sysctl/$f"
  mount --bind "$node/sysctl/$f" "/proc/sys/$f"
done <"$node/sysctls"
SCRIPT
}

# kc_node_namespaces NODE: the network namespace on the underlay and the mount namespace.
kc_node_namespaces() {
  local node=$1 dir
  dir=$(kc_node_dir "$node")
  mkdir -p "$dir/root" "$dir/sysctl" "$KC_DIR/ns"
  kc_attach "$node" $((10 + $(kc_node_index "$node")))
  ip netns exec "$(kc_netns "$node")" sysctl -qw net.ipv4.ip_forward=1
  [[ $(kc_setting dual-stack) == 1 ]] && ip netns exec "$(kc_netns "$node")" sysctl -qw net.ipv6.conf.all.forwarding=1
  printf '%s\n' "${KC_NODE_DIRS[@]}" >"$dir/dirs"
  printf '%s\n' "${KC_KUBELET_SYSCTLS[@]}" >"$dir/sysctls"
  awk '$3 == "cgroup" || $3 == "cgroup2" { print $3, $4, $2 }' /proc/self/mounts >"$dir/cgroups"
  kc_node_mounts_script >"$dir/mounts.sh"
  touch "$(kc_mntns "$node")" "$(kc_utsns "$node")"
  nsenter "--net=/run/netns/$(kc_netns "$node")" -- unshare "--mount=$(kc_mntns "$node")" "--uts=$(kc_utsns "$node")" \
    --propagation private -- sh "$dir/mounts.sh" "$dir" "$dir/cgroups" "$node" ||
    kc_die "$node: its mount and UTS namespaces could not be made"
  kc_cgroup_make "$KC_CGROUP/$node" || kc_die "$node: cannot make its cgroup $KC_CGROUP/$node"
}

# kc_node_plugins NODE: the CNI plugins into the node's /opt/cni/bin.
kc_node_plugins() {
  local dir src
  dir=$(kc_node_dir "$1")/root/opt/cni/bin
  src=${KC_PLUGIN_DIR:-$(kc_setting plugin-dir)}
  # Executable files only (a build directory holds more than binaries); each lands by rename, as an install
  # over running plugins must.
  find "$src/" -maxdepth 1 -type f -perm -u+x -printf '%f\n' | while read -r b; do
    cp -f "$src/$b" "$dir/.$b.new" && mv -f "$dir/.$b.new" "$dir/$b"
  done
}

# The kubenet-style conflist containerd renders from the podCIDRs the kubelet gives it (UpdateRuntimeConfig):
# bridge cbr0 with host-local of the node's podCIDRs (one range per family), masquerade of what leaves the
# cluster's networks, hairpin; portmap for hostPorts, bandwidth for the annotations. containerd adds loopback.
# The masquerade is the bridge's (`ipMasq` with `nonMasqueradeCIDRs`) on our plugins; the reference bridge has no
# `nonMasqueradeCIDRs`, and its `ipMasq` would masquerade pod-to-pod traffic to other nodes (a NAT the network
# model forbids, and the destination's NetworkPolicy would see the node's address), so on the reference plugins
# the template is the kubelet's kubenet one (`ipMasq` false) and the node masquerades (kc_node_masquerade).
kc_kubenet_template() {
  local cidrs masq=true
  cidrs=$(kc_cluster_cidrs)
  [[ $(kc_setting masquerade) == node ]] && masq=false
  cat <<TEMPLATE
{
  "cniVersion": "1.0.0",
  "name": "kubenet",
  "plugins": [
    {
      "type": "bridge", "bridge": "cbr0", "isGateway": true, "ipMasq": $masq, "hairpinMode": true,
      "nonMasqueradeCIDRs": ["${cidrs//,/\", \"}"],
      "ipam": {
        "type": "host-local",
        "ranges": [{{range \$i, \$r := .PodCIDRRanges}}{{if \$i}}, {{end}}[{"subnet": "{{\$r}}"}]{{end}}],
        "routes": [{{range \$i, \$r := .Routes}}{{if \$i}}, {{end}}{"dst": "{{\$r}}"}{{end}}]
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}, "snat": true},
    {"type": "bandwidth", "capabilities": {"bandwidth": true}}
  ]
}
TEMPLATE
}

# cgroupDriver cgroupfs on v1 and v2 alike: the kubelet writes the node's subtree (made and delegated by
# kc_cgroup_make) directly, as runc does for containerd (SystemdCgroup off: the two must agree). The systemd
# driver would need the node's daemons to be systemd units and a systemd on the machine, which the VM lane's guests
# and many containers do not run.
kc_kubelet_config() {
  local node=$1 pki=$KC_DIR/pki
  cat <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
cgroupRoot: /$KC_CGROUP/$node
failSwapOn: false
protectKernelDefaults: false
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
address: $(kc_node_ip4 "$node")
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
tlsCertFile: $pki/kubelet-serving-$node.crt
tlsPrivateKeyFile: $pki/kubelet-serving-$node.key
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $pki/ca.crt}
authorization: {mode: Webhook}
maxPods: 110
serializeImagePulls: false
imageGCHighThresholdPercent: 100
evictionHard: {memory.available: "50Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
clusterDomain: $KC_DNS_DOMAIN
clusterDNS: [$(kc_dns_ips | paste -sd, | sed 's/,/, /g')]
resolvConf: $(kc_node_dir "$node")/resolv.conf
YAML
}

kc_kube_proxy_config() {
  local node=$1
  cat <<YAML
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $KC_DIR/kube-proxy.kubeconfig}
mode: iptables
clusterCIDR: $(kc_cluster_cidrs)
hostnameOverride: $node
metricsBindAddress: 127.0.0.1:10249
healthzBindAddress: 0.0.0.0:10256
# conntrack's table size is the machine's (only the root namespace may set it): kube-proxy leaves it alone.
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
YAML
}

# kc_node_spawn NODE NAME CMD...: a node daemon in the node's namespaces and in its cgroup, logging to the node's
# logs/NAME.log.
kc_node_spawn() {
  local node=$1 name=$2 dir
  shift 2
  dir=$(kc_node_dir "$node")
  kc_spawn "$node/daemons" "$dir/$name.log" nsenter "--net=/run/netns/$(kc_netns "$node")" \
    "--mount=$(kc_mntns "$node")" "--uts=$(kc_utsns "$node")" -- "$@" >"$dir/$name.pid"
}

kc_node_kubelet() {
  local node=$1 dir ips
  dir=$(kc_node_dir "$node")
  ips=$(kc_node_ip4 "$node")
  [[ $(kc_setting dual-stack) == 1 ]] && ips+=,$(kc_node_ip6 "$node")
  kc_node_spawn "$node" kubelet "$KC_BIN/kubelet" --config="$dir/kubelet.yaml" \
    --kubeconfig="$dir/kubelet.kubeconfig" --hostname-override="$node" --node-ip="$ips" --v=1
}

kc_node_kube_proxy() {
  local node=$1
  kc_node_spawn "$node" kube-proxy "$KC_BIN/kube-proxy" --config="$(kc_node_dir "$node")/kube-proxy.yaml" --v=1
}

# kc_node_masquerade NODE: pods' traffic leaving the cluster's pod networks masqueraded by the node, as
# ip-masq-agent writes it (its chain, the cluster's networks as its nonMasqueradeCIDRs), in each family the
# cluster has: what a kubenet node on the reference plugins needs (kc_kubenet_template).
kc_node_masquerade() {
  local node=$1 cidr restore
  for cidr in $(kc_cluster_cidrs | tr , ' '); do
    restore=iptables-restore
    [[ $cidr == *:* ]] && restore=ip6tables-restore
    printf '%s\n' '*nat' ':IP-MASQ-AGENT - [0:0]' \
      "-A POSTROUTING -s $cidr -m addrtype ! --dst-type LOCAL -j IP-MASQ-AGENT" \
      "-A IP-MASQ-AGENT -d $cidr -j RETURN" '-A IP-MASQ-AGENT -j MASQUERADE' COMMIT |
      nsenter "--net=/run/netns/$(kc_netns "$node")" "$restore" --noflush ||
      kc_die "$node: $restore refused the node's masquerade rules"
  done
}

# kc_node_up NODE: everything of one node, up to its daemons running (its readiness is the kubelet's to report).
kc_node_up() {
  local node=$1 dir
  dir=$(kc_node_dir "$node")
  kc_node_namespaces "$node"
  kc_pki_node "$node"
  kc_node_plugins "$node"
  [[ $(kc_setting masquerade) == node ]] && kc_node_masquerade "$node"
  kc_kubenet_template >"$dir/cni-conf-template"
  kc_containerd_config "$node" >"$dir/containerd.toml"
  kc_node_resolv_conf >"$dir/resolv.conf"
  kc_kubelet_config "$node" >"$dir/kubelet.yaml"
  kc_kube_proxy_config "$node" >"$dir/kube-proxy.yaml"
  kc_node_containerd "$node"
  kc_load_images "$node"
  kc_dns_load "$node"
  kc_node_kubelet "$node"
  kc_node_kube_proxy "$node"
  [[ -n $(kc_setting netpol-bin) ]] && kc_node_cni_netpol "$node"
  return 0
}

# The NetworkPolicy agent, a node daemon beside kube-proxy: its table, its Node's podCIDRs; /metrics, /healthz
# and /readyz on the node's port 9798 (its own namespace: every node has its own).
kc_node_cni_netpol() {
  local node=$1
  kc_node_spawn "$node" cni-netpol "$(kc_setting netpol-bin)" watch --kubeconfig "$KC_DIR/cni-netpol.kubeconfig" \
    --node-name "$node" --metrics-addr 0.0.0.0:9798
}
