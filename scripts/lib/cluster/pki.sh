# The cluster's certificates (ECDSA P-256: made in milliseconds, where RSA keys took seconds) and kubeconfigs, made with openssl into $KC_DIR/pki: one CA signs the API server's
# serving certificate, every client's certificate (the name is the CN, groups are O), and each kubelet's serving
# certificate (so the API server verifies the kubelets it calls for exec, logs and port-forward).
# Sourced by scripts/cluster.sh.

# kc_openssl WHAT ARGS...: openssl, its chatter in logs/pki.log; a failure ends `up` with openssl's own words.
kc_openssl() {
  local what=$1 log=$KC_DIR/logs/pki.log
  shift
  mkdir -p "$KC_DIR/logs"
  openssl "$@" 2>>"$log" || kc_die "openssl could not make $what: $(tail -3 "$log")"
}

kc_pki_ca() {
  local d=$KC_DIR/pki
  mkdir -p "$d"
  kc_openssl "the CA" req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "$d/ca.key" \
    -out "$d/ca.crt" -days 3650 -subj "/CN=cni-rs-cluster-$KC_NAME-ca"
  # The service-account token signing pair (ES256).
  kc_openssl "the service-account key" ecparam -name prime256v1 -genkey -noout -out "$d/sa.key"
  kc_openssl "the service-account public key" ec -in "$d/sa.key" -pubout -out "$d/sa.pub"
}

# kc_pki_cert NAME SUBJECT [SAN]: NAME.crt and NAME.key signed by the CA; SAN (e.g. "IP:1.2.3.4,DNS:x") makes it a
# serving certificate too.
kc_pki_cert() {
  local d=$KC_DIR/pki name=$1 subject=$2 san=${3:-} ext
  ext=$(mktemp)
  {
    echo "basicConstraints=CA:FALSE"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    if [[ -n $san ]]; then
      echo "extendedKeyUsage=serverAuth,clientAuth"
      echo "subjectAltName=$san"
    else
      echo "extendedKeyUsage=clientAuth"
    fi
  } >"$ext"
  kc_openssl "$name's key" req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "$d/$name.key" \
    -out "$d/$name.csr" -subj "$subject"
  kc_openssl "$name's certificate ($subject${san:+, $san})" x509 -req -in "$d/$name.csr" -CA "$d/ca.crt" \
    -CAkey "$d/ca.key" -CAcreateserial -days 3650 -extfile "$ext" -out "$d/$name.crt"
  rm -f "$ext" "$d/$name.csr"
  chmod 0600 "$d/$name.key"
}

# kc_kubeconfig FILE SERVER CERTNAME: a kubeconfig for the client whose certificate is pki/CERTNAME.
kc_kubeconfig() {
  local d=$KC_DIR/pki
  kc_kubeconfig_write "$1" "$2" "$3" "
    client-certificate-data: $(base64 -w0 "$d/$3.crt")
    client-key-data: $(base64 -w0 "$d/$3.key")"
}

# kc_kubeconfig_token FILE SERVER USER TOKEN: a kubeconfig for a ServiceAccount's bearer token.
kc_kubeconfig_token() {
  kc_kubeconfig_write "$1" "$2" "$3" "
    token: $4"
}

# kc_kubeconfig_write FILE SERVER USER CREDENTIALS: the kubeconfig of the cluster's CA and server for USER, whose
# `user:` block is CREDENTIALS (YAML lines); 0600 from the start, as it holds a key or a token.
kc_kubeconfig_write() {
  local file=$1 server=$2 name=$3 credentials=$4
  (
    umask 077
    cat >"$file" <<KUBECONFIG
apiVersion: v1
kind: Config
clusters:
- name: $KC_NAME
  cluster:
    server: $server
    certificate-authority-data: $(base64 -w0 "$KC_DIR/pki/ca.crt")
users:
- name: $name
  user:$credentials
contexts:
- name: $KC_NAME
  context: {cluster: $KC_NAME, user: $name}
current-context: $KC_NAME
KUBECONFIG
  )
  chmod 0600 "$file"
}

# Every certificate and kubeconfig of the control plane; the nodes' are made by kc_pki_node.
kc_pki_control_plane() {
  local api=https://$(kc_ip4 $KC_CP_SUFFIX):6443 san
  kc_pki_ca
  san="IP:$(kc_ip4 $KC_CP_SUFFIX),IP:127.0.0.1,IP:${KC_SERVICE_CIDR4%.0.0/16}.0.1,DNS:localhost,DNS:kubernetes"
  san+=",DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
  [[ $(kc_setting dual-stack) == 1 ]] && san+=",IP:$(kc_ip6 $KC_CP_SUFFIX),IP:${KC_SERVICE_CIDR6%/112}1"
  kc_pki_cert apiserver "/CN=kube-apiserver" "$san"
  kc_pki_cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client"
  kc_pki_cert admin "/O=system:masters/CN=cluster-admin"
  kc_pki_cert controller-manager "/CN=system:kube-controller-manager"
  kc_pki_cert scheduler "/CN=system:kube-scheduler"
  kc_pki_cert kube-proxy "/CN=system:kube-proxy"
  kc_kubeconfig "$KC_DIR/controller-manager.kubeconfig" "$api" controller-manager
  kc_kubeconfig "$KC_DIR/scheduler.kubeconfig" "$api" scheduler
  kc_kubeconfig "$KC_DIR/kube-proxy.kubeconfig" "$api" kube-proxy
  # The same admin inside the cluster's namespaces (a node, the wan): the API server's underlay address.
  kc_kubeconfig "$KC_DIR/admin-underlay.kubeconfig" "$api" admin
}

# kc_pki_node NODE: the kubelet's client certificate (the Node authorizer's name and group) and its serving
# certificate for the node's underlay addresses, and its kubeconfig.
kc_pki_node() {
  local node=$1 san
  san="IP:$(kc_node_ip4 "$node"),DNS:$node"
  [[ $(kc_setting dual-stack) == 1 ]] && san+=",IP:$(kc_node_ip6 "$node")"
  kc_pki_cert "kubelet-$node" "/O=system:nodes/CN=system:node:$node"
  kc_pki_cert "kubelet-serving-$node" "/O=system:nodes/CN=system:node:$node" "$san"
  kc_kubeconfig "$(kc_node_dir "$node")/kubelet.kubeconfig" "https://$(kc_ip4 $KC_CP_SUFFIX):6443" "kubelet-$node"
}
