# The images every node has: pause (the pod sandbox) and agnhost (Kubernetes' test workload), built from the
# release tree's sources as static binaries and packed as docker-archive tars (what `docker save` writes) under
# the names Kubernetes v1.28 uses, so no node ever pulls. agnhost's image also carries busybox (a shell, ip,
# ping, wget, nc) for `kubectl exec`. Sourced by scripts/cluster.sh.

# kc_image_archive OUT NAME ROOTFS ENTRYPOINT-JSON: OUT, a docker-archive tar of ROOTFS as one layer.
kc_image_archive() {
  local out=$1 name=$2 rootfs=$3 entrypoint=$4 work layer digest config cdigest
  work=$(mktemp -d)
  tar -C "$rootfs" --numeric-owner --owner=0 --group=0 -cf "$work/layer.tar" .
  digest=$(sha256sum "$work/layer.tar" | cut -d' ' -f1)
  mkdir "$work/$digest"
  mv "$work/layer.tar" "$work/$digest/layer.tar"
  config=$(printf '{"architecture":"amd64","os":"linux","config":{"Entrypoint":%s,"Env":["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' "$entrypoint" "$digest")
  cdigest=$(printf '%s' "$config" | sha256sum | cut -d' ' -f1)
  printf '%s' "$config" >"$work/$cdigest.json"
  printf '[{"Config":"%s.json","RepoTags":["%s"],"Layers":["%s/layer.tar"]}]' "$cdigest" "$name" "$digest" >"$work/manifest.json"
  tar -C "$work" -cf "$out.partial" manifest.json "$cdigest.json" "$digest"
  mv "$out.partial" "$out"
  rm -rf "$work"
}

# Builds the two archives into the cache once.
kc_images_build() {
  local dir=$KC_CACHE/images root a
  mkdir -p "$dir"
  if [[ ! -f $dir/pause.tar ]]; then
    root=$(mktemp -d)
    install -D -m 0755 "$KC_BIN/pause" "$root/pause"
    kc_image_archive "$dir/pause.tar" "$KC_PAUSE_IMAGE" "$root" '["/pause"]'
    rm -rf "$root"
  fi
  if [[ ! -f $dir/agnhost.tar ]]; then
    root=$(mktemp -d)
    install -D -m 0755 "$KC_BIN/agnhost" "$root/agnhost"
    install -D -m 0755 /bin/busybox "$root/bin/busybox"
    for a in sh ash ip ping ping6 wget nc cat ls ps sleep hostname ifconfig route netstat nslookup; do
      ln -s busybox "$root/bin/$a"
    done
    mkdir -p "$root/tmp" "$root/etc"
    chmod 1777 "$root/tmp"
    printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/sh\n' >"$root/etc/passwd"
    printf 'root:x:0:\nnogroup:x:65534:\n' >"$root/etc/group"
    kc_image_archive "$dir/agnhost.tar" "$KC_AGNHOST_IMAGE" "$root" '["/agnhost"]'
    rm -rf "$root"
  fi
}

# kc_import_image NODE TAR: the archive into the node's containerd (namespace k8s.io, where the kubelet looks).
kc_import_image() {
  kc_in "$1" ctr --address /run/containerd/containerd.sock --namespace k8s.io images import --all-platforms "$2" \
    >/dev/null || kc_die "$1: importing $2 failed"
}

kc_load_images() {
  kc_import_image "$1" "$KC_CACHE/images/pause.tar"
  kc_import_image "$1" "$KC_CACHE/images/agnhost.tar"
}
