# Names in the cluster, as a user's cluster has them: kube-dns (kubernetes/dns 1.25.0, the Kubernetes project's own
# cluster DNS server, built from ../shared/kubernetes) in kube-system behind the Service `kube-dns` on the Service
# range's 10th address (both families on a dual-stack cluster), named by every kubelet's clusterDNS, as kind ships
# CoreDNS; and the nodes' own resolver: a DNS server on the wan (dnsmasq, the stand-in for a cloud network's
# resolver) that the nodes' resolv.conf names, to which kube-dns forwards every name outside the cluster.
# `up --dns none` leaves kube-dns out (pods then get the nodes' resolver). Sourced by scripts/cluster.sh.

KC_DNS_IMAGE=registry.k8s.io/dns/k8s-dns-kube-dns:1.25.0
KC_DNS_DOMAIN=cluster.local
# The Service range's 10th address, as kubeadm and kind give the cluster DNS.
KC_DNS_IP4=${KC_SERVICE_CIDR4%.0.0/16}.0.10
KC_DNS_IP6=${KC_SERVICE_CIDR6%/112}a
# A name outside the cluster that the wan's resolver answers (with the wan's addresses, and their PTR records),
# and an alias of it (a CNAME): what a pod resolving the internet's names gets, through kube-dns's forwarding.
KC_OUTSIDE_NAME=outside.cni-rs.test
KC_OUTSIDE_ALIAS=www.cni-rs.test

# The cluster DNS's addresses the kubelets hand to pods (nothing with --dns none).
kc_dns_ips() {
  [[ $(kc_setting dns) == none ]] && return 0
  echo "$KC_DNS_IP4"
  [[ $(kc_setting dual-stack) == 1 ]] && echo "$KC_DNS_IP6"
  return 0
}

# kube-dns's image: the static binary and the files a Go program's resolver and user lookups read.
kc_dns_image_build() {
  local out=$KC_CACHE/images/kube-dns.tar root
  [[ -f $out ]] && return 0
  root=$(mktemp -d)
  install -D -m 0755 "$KC_BIN/kube-dns" "$root/kube-dns"
  mkdir -p "$root/etc" "$root/tmp"
  chmod 1777 "$root/tmp"
  printf 'root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/:/sbin/nologin\n' >"$root/etc/passwd"
  printf 'root:x:0:\nnogroup:x:65534:\n' >"$root/etc/group"
  kc_image_archive "$out" "$KC_DNS_IMAGE" "$root" '["/kube-dns"]'
  rm -rf "$root"
}

kc_dns_load() {
  [[ $(kc_setting dns) == none ]] || kc_import_image "$1" "$KC_CACHE/images/kube-dns.tar"
}

# The nodes' resolver on the wan: one dnsmasq in the wan namespace, listening on the wan's underlay addresses only,
# answering KC_OUTSIDE_NAME and its alias, and NXDOMAIN for every other name, as the internet answers a name nobody has (nothing
# here reaches the internet).
kc_wan_resolver_up() {
  local args=(--keep-in-foreground --no-resolv --no-hosts --bind-interfaces --user=root --group=root
    --pid-file="$KC_DIR/run/wan-dns.dnsmasq.pid" --log-facility=- --log-queries
    "--listen-address=$(kc_ip4 $KC_WAN_SUFFIX)" "--host-record=$KC_OUTSIDE_NAME,$(kc_ip4 $KC_WAN_SUFFIX)"
    "--cname=$KC_OUTSIDE_ALIAS,$KC_OUTSIDE_NAME" --address=/#/)
  if [[ $(kc_setting dual-stack) == 1 ]]; then
    args+=("--listen-address=$(kc_ip6 $KC_WAN_SUFFIX)" "--host-record=$KC_OUTSIDE_NAME,$(kc_ip6 $KC_WAN_SUFFIX)")
  fi
  kc_spawn wan-dns "$KC_DIR/logs/wan-dns.log" nsenter "--net=/run/netns/$(kc_netns wan)" -- dnsmasq "${args[@]}" \
    >"$KC_DIR/run/wan-dns.pid"
  kc_wait 10 kc_in wan ss -Hlun "sport = :53" || kc_die "the wan's resolver did not start: $(tail -5 "$KC_DIR/logs/wan-dns.log")"
}

# The resolv.conf the kubelet gives pods of dnsPolicy Default and uses to build ClusterFirst pods' (its search
# path and its nameservers after the cluster's).
kc_node_resolv_conf() {
  echo "nameserver $(kc_ip4 $KC_WAN_SUFFIX)"
  [[ $(kc_setting dual-stack) == 1 ]] && echo "nameserver $(kc_ip6 $KC_WAN_SUFFIX)"
  return 0
}

# kube-dns as the kube-dns addon deploys it (its ServiceAccount is what the API server's bootstrap ClusterRoleBinding
# system:kube-dns names): one replica, the Service on the fixed address, an optional ConfigMap `kube-dns` for
# stubDomains and upstreamNameservers as the addon reads them.
kc_dns_manifest() {
  local families="clusterIP: $KC_DNS_IP4"
  [[ $(kc_setting dual-stack) == 1 ]] &&
    families="ipFamilyPolicy: RequireDualStack
  clusterIP: $KC_DNS_IP4
  clusterIPs: [$KC_DNS_IP4, \"$KC_DNS_IP6\"]"
  cat <<YAML
apiVersion: v1
kind: ServiceAccount
metadata: {name: kube-dns, namespace: kube-system, labels: {k8s-app: kube-dns}}
---
apiVersion: v1
kind: Service
metadata:
  name: kube-dns
  namespace: kube-system
  labels: {k8s-app: kube-dns, kubernetes.io/name: KubeDNS, kubernetes.io/cluster-service: "true"}
spec:
  selector: {k8s-app: kube-dns}
  $families
  ports:
  - {name: dns, port: 53, protocol: UDP}
  - {name: dns-tcp, port: 53, protocol: TCP}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: kube-dns, namespace: kube-system, labels: {k8s-app: kube-dns}}
spec:
  replicas: 1
  selector: {matchLabels: {k8s-app: kube-dns}}
  template:
    metadata: {labels: {k8s-app: kube-dns}}
    spec:
      priorityClassName: system-cluster-critical
      serviceAccountName: kube-dns
      dnsPolicy: Default
      tolerations: [{key: CriticalAddonsOnly, operator: Exists}]
      volumes: [{name: kube-dns-config, configMap: {name: kube-dns, optional: true}}]
      containers:
      - name: kubedns
        image: $KC_DNS_IMAGE
        args: [--domain=$KC_DNS_DOMAIN., --dns-port=53, --config-dir=/kube-dns-config, --v=2]
        env: [{name: PROMETHEUS_PORT, value: "10055"}]
        ports:
        - {containerPort: 53, name: dns, protocol: UDP}
        - {containerPort: 53, name: dns-tcp, protocol: TCP}
        - {containerPort: 10055, name: metrics, protocol: TCP}
        readinessProbe: {httpGet: {path: /readiness, port: 8081}, initialDelaySeconds: 1, periodSeconds: 2}
        resources: {requests: {cpu: 10m, memory: 30Mi}, limits: {memory: 170Mi}}
        volumeMounts: [{name: kube-dns-config, mountPath: /kube-dns-config}]
YAML
}

# Deploys kube-dns and waits for it to answer (the first pod needs a node whose pod network is up).
kc_dns_apply() {
  [[ $(kc_setting dns) == none ]] && return 0
  kc_say "cluster DNS: kube-dns on $(kc_dns_ips | paste -sd' ')"
  kc_dns_manifest | kc_kubectl apply -f - >/dev/null || kc_die "applying kube-dns failed"
  kc_kubectl -n kube-system rollout status deployment/kube-dns --timeout=180s >/dev/null ||
    kc_die "kube-dns not ready after 180 s: $(kc_kubectl -n kube-system get pods -l k8s-app=kube-dns -o wide 2>&1)"
}
