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

# The two images flannel's own manifest (../shared/kubernetes/kube-flannel.yml) runs, made of ours, for
# `--network flannel`: its names swapped for these, nothing else of it changed.
KC_FABRICD_IMAGE=localhost/cni-rs/fabricd:dev
KC_FLANNEL_CNI_IMAGE=localhost/cni-rs/flannel-cni-plugin:dev

# kc_image_add_libs ROOT EXE...: the shared libraries the executables load, at their paths under ROOT.
kc_image_add_libs() {
  local root=$1 lib
  shift
  while read -r lib; do
    install -D -m 0644 "$lib" "$root$lib"
  done < <(ldd "$@" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// && $1 !~ /:$/ {print $1}' | sort -u)
  chmod 0755 "$root"/lib64/ld-linux-* 2>/dev/null || true
}

# kc_flannel_images DIR BINDIR: DIR/fabricd.tar (fabricd as /opt/bin/flanneld, /opt/bin/install-conf, nft and
# iptables for its masquerade, busybox) and DIR/flannel-cni-plugin.tar (our flannel plugin as /flannel, and cp),
# from the release binaries in BINDIR.
kc_flannel_images() {
  local dir=$1 bin=$2 root a
  mkdir -p "$dir"
  root=$(mktemp -d)
  install -D -m 0755 "$bin/fabricd" "$root/opt/bin/flanneld"
  install -D -m 0755 /bin/busybox "$root/bin/busybox"
  for a in sh cp mv cat ls mkdir rm; do ln -s busybox "$root/bin/$a"; done
  # flannel's install-conf: the CNI config copied into place, whole or not at all.
  printf '#!/bin/sh\nset -e\ncp -f "$1" "$2.tmp"\nmv -f "$2.tmp" "$2"\n' >"$root/opt/bin/install-conf"
  chmod 0755 "$root/opt/bin/install-conf"
  install -D -m 0755 "$(command -v nft)" "$root/usr/sbin/nft"
  install -D -m 0755 /usr/sbin/xtables-nft-multi "$root/usr/sbin/xtables-nft-multi"
  for a in iptables iptables-save iptables-restore ip6tables ip6tables-save ip6tables-restore; do
    ln -s xtables-nft-multi "$root/usr/sbin/$a"
  done
  # iptables loads its matches and targets (comment, mark, MASQUERADE, ...) from its extension directory at run
  # time: without them it cannot read back the rules kube-proxy writes, and fabricd's masquerade never goes in.
  local xtables
  xtables=$(dirname "$(find /usr/lib /usr/lib64 -name libxt_standard.so -path '*/xtables/*' 2>/dev/null | head -1)")
  [[ -f $xtables/libxt_comment.so ]] || kc_die "no iptables extension directory (libxt_comment.so) on this machine"
  mkdir -p "$root$xtables"
  cp -a "$xtables"/. "$root$xtables/"
  kc_image_add_libs "$root" "$root/opt/bin/flanneld" "$root/usr/sbin/nft" "$root/usr/sbin/xtables-nft-multi" \
    "$xtables"/*.so
  mkdir -p "$root/tmp" "$root/run" "$root/etc"
  chmod 1777 "$root/tmp"
  kc_image_archive "$dir/fabricd.tar" "$KC_FABRICD_IMAGE" "$root" '["/opt/bin/flanneld"]'
  rm -rf "$root"
  root=$(mktemp -d)
  install -D -m 0755 "$bin/flannel" "$root/flannel"
  install -D -m 0755 /bin/busybox "$root/bin/busybox"
  ln -s busybox "$root/bin/cp"
  ln -s busybox "$root/bin/sh"
  kc_image_archive "$dir/flannel-cni-plugin.tar" "$KC_FLANNEL_CNI_IMAGE" "$root" '["/flannel"]'
  rm -rf "$root"
}
