# The images every node has, under the names Kubernetes v1.28 uses, so no node ever pulls: pause (the pod sandbox)
# and the test images the e2e suites run (test/utils/image/manifest.go of the release tree), each made as its
# Dockerfile (test/images/NAME/Dockerfile) says: agnhost and pause built from the release tree's sources, and in
# place of Alpine's or Debian jessie's packages the same programs from Debian's binaries with their libraries.
# Archives are docker-archive tars (what `docker save` writes), cached under a name carrying a hash of their
# recipe, so a changed recipe (or a rebuilt agnhost) builds them again. Sourced by scripts/cluster.sh.

KC_E2E_REGISTRY=registry.k8s.io/e2e-test-images
KC_JESSIE_DNSUTILS_IMAGE=$KC_E2E_REGISTRY/jessie-dnsutils:1.7
KC_BUSYBOX_IMAGE=$KC_E2E_REGISTRY/busybox:1.29-4
KC_NGINX_IMAGE=$KC_E2E_REGISTRY/nginx:1.14-4
KC_IMAGE_PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
# Debian packages the images take programs from that scripts/setup.sh does not install: fetched once with their
# dependencies that are not installed (`apt-get download`) and unpacked into a cache, never installed.
KC_IMAGE_DEBS=(bind9-dnsutils bind9-host iperf nginx nginx-common)
KC_DEB_ROOT=$KC_CACHE/debs/root
KC_K8S_SRC_TAR=${CNI_K8S_SRC_TAR:-$(dirname "${CNI_K8S_BUILD:-${repo:-.}/../shared/kubernetes/build.sh}")/kubernetes-1.28.7-src.tar.xz}

# kc_image_archive OUT NAME ROOTFS ENTRYPOINT-JSON [CONFIG-JSON]: OUT, a docker-archive tar of ROOTFS as one
# layer; CONFIG-JSON, more fields of the image config ("Cmd":[...],"ExposedPorts":{...}).
kc_image_archive() {
  local work
  work=$(mktemp -d)
  kc_image_add "$work" "$2" "$3" "$4" "${5:-}"
  kc_image_pack "$work" "$1"
}

# kc_image_add DIR NAME ROOTFS ENTRYPOINT-JSON CONFIG-JSON [LOWER...]: the image NAME into DIR, a docker-archive
# being made: the layers of the LOWER roots (kc_image_layer's, lowest first, each stored once however many images
# have it) and ROOTFS on top, its config, and its entry of manifest.json (in DIR/manifest.d until kc_image_pack).
kc_image_add() {
  local dir=$1 name=$2 rootfs=$3 entrypoint=$4 more=${5:+,$5} layer digest config cdigest ids="" paths=""
  shift $(($# < 5 ? $# : 5))
  kc_image_layer "$rootfs"
  for layer in "$@" "$rootfs"; do
    digest=$(<"$layer.digest")
    if [[ ! -d $dir/$digest ]]; then
      mkdir "$dir/$digest"
      cp "$layer.tar" "$dir/$digest/layer.tar"
    fi
    ids+="${ids:+,}\"sha256:$digest\""
    paths+="${paths:+,}\"$digest/layer.tar\""
  done
  rm -f "$rootfs.tar" "$rootfs.digest"
  config=$(printf '{"architecture":"amd64","os":"linux","config":{"Entrypoint":%s,"Env":["PATH=%s"]%s},"rootfs":{"type":"layers","diff_ids":[%s]}}' "$entrypoint" "$KC_IMAGE_PATH" "$more" "$ids")
  cdigest=$(printf '%s' "$config" | sha256sum | cut -d' ' -f1)
  printf '%s' "$config" >"$dir/$cdigest.json"
  mkdir -p "$dir/manifest.d"
  printf '{"Config":"%s.json","RepoTags":["%s"],"Layers":[%s]}\n' "$cdigest" "$name" "$paths" \
    >"$dir/manifest.d/$(printf '%s' "$name" | tr '/:' '__')"
}

# kc_image_pack DIR OUT: the docker-archive DIR as the tar OUT (DIR removed).
kc_image_pack() {
  local dir=$1 out=$2
  { printf "["; cat "$dir"/manifest.d/* | paste -sd, | tr -d "\n"; printf "]"; } >"$dir/manifest.json"
  rm -rf "$dir/manifest.d"
  # the configs and the layers: files and directories named by their sha256
  (cd "$dir" && tar -cf "$out.partial" manifest.json [0-9a-f]*)
  mv "$out.partial" "$out"
  rm -rf "$dir"
}

# kc_image_layer ROOT: ROOT.tar, ROOT as a layer, and ROOT.digest, its sha256 (images sharing a layer share it
# on the node too: containerd stores and unpacks it once).
kc_image_layer() {
  chmod 0755 "$1" # mktemp's 0700 would be the container's /, closed to its other users
  tar -C "$1" --numeric-owner -cf "$1.tar" .
  sha256sum "$1.tar" | cut -d' ' -f1 >"$1.digest"
}

# kc_debs_unpack: KC_IMAGE_DEBS and their dependencies that this machine has not installed, into KC_DEB_ROOT.
kc_debs_unpack() {
  local dir=$KC_CACHE/debs stamp=$KC_DEB_ROOT/.packages p deb
  local -a fetch=()
  [[ -f $stamp && $(<"$stamp") == "${KC_IMAGE_DEBS[*]}" ]] && return 0
  while read -r p; do
    [[ $(dpkg-query -W -f='${db:Status-Abbrev}' "$p" 2>/dev/null) == ii* ]] || fetch+=("$p")
  done < <(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks --no-replaces \
    --no-enhances "${KC_IMAGE_DEBS[@]}" | grep -v '^[ <]' | sort -u)
  mkdir -p "$dir"
  (cd "$dir" && apt-get -q -o APT::Sandbox::User=root download "${fetch[@]}" >/dev/null) ||
    kc_die "fetching ${fetch[*]} from Debian's mirror failed (once, for the e2e test images)"
  rm -rf "$KC_DEB_ROOT"
  mkdir -p "$KC_DEB_ROOT"
  for p in "${fetch[@]}"; do
    for deb in "$dir/${p}"_*.deb; do dpkg-deb -x "$deb" "$KC_DEB_ROOT"; done
  done
  echo "${KC_IMAGE_DEBS[*]}" >"$stamp"
}

# kc_image_add_libs ROOT EXE...: the shared libraries the executables load, at their paths under ROOT (those of
# unpacked packages at the path the package installs them to).
kc_image_add_libs() {
  local root=$1 lib
  shift
  while read -r lib; do
    [[ $lib != MISSING* ]] || kc_die "image: a library is missing: ${lib#MISSING }"
    install -D -m 0644 "$lib" "$root${lib#"$KC_DEB_ROOT"}"
  done < <(LD_LIBRARY_PATH=$KC_DEB_ROOT/usr/lib/x86_64-linux-gnu ldd "$@" 2>/dev/null |
    awk '/not found/ {print "MISSING " $1; next}
      $2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// && $1 !~ /:$/ {print $1}' | sort -u)
  chmod 0755 "$root"/lib64/ld-linux-* 2>/dev/null || true
}

# kc_image_bins ROOT PATH...: programs at their Debian paths, from an unpacked package or else this machine.
kc_image_bins() {
  local root=$1 path src
  shift
  for path in "$@"; do
    src=$path
    [[ -e $KC_DEB_ROOT$path ]] && src=$KC_DEB_ROOT$path
    [[ -e $src ]] || kc_die "image: $path is neither installed nor in $KC_DEB_ROOT"
    install -D -m 0755 "$src" "$root$path"
  done
}

# kc_image_skeleton ROOT: the directories of a Debian root (merged /usr), in every layer of one alike.
kc_image_skeleton() {
  local root=$1 d
  mkdir -p "$root"/usr/{bin,sbin,lib,lib64,local/bin} "$root"/{etc,root,run,tmp,var/tmp,var/lib,var/log,home}
  for d in bin sbin lib lib64; do ln -s "usr/$d" "$root/$d"; done
  ln -s ../run "$root/var/run"
  chmod 1777 "$root/tmp" "$root/var/tmp"
  chmod 0700 "$root/root"
}

# kc_image_userland ROOT: Debian's shell and base tools as debian:jessie has them (dash as /bin/sh, bash,
# coreutils, grep, sed, mawk, findutils, hostname, getent, tar, gzip), the lowest layer of agnhost,
# jessie-dnsutils and nginx.
kc_image_userland() {
  local root=$1
  kc_image_skeleton "$root"
  # shellcheck disable=SC2046 # one path a line
  kc_image_bins "$root" /usr/bin/dash /usr/bin/bash /usr/bin/getent $(dpkg -L coreutils grep sed mawk findutils \
    hostname tar gzip | sed -n 's#^\(/usr\)\{0,1\}/\(s\{0,1\}bin\)/\([^/]*\)$#/usr/\2/\3#p' | sort -u)
  ln -s dash "$root/usr/bin/sh"
  ln -s mawk "$root/usr/bin/awk"
  printf 'passwd: files\ngroup: files\nshadow: files\nhosts: files dns\nnetworks: files\nprotocols: files\nservices: files\n' \
    >"$root/etc/nsswitch.conf"
  kc_image_own_libs "$root"
}

# kc_image_dnsutils ROOT LOWER: BIND's dig, nslookup, nsupdate and host (Debian's dnsutils, Alpine's
# bind-tools), the layer agnhost and jessie-dnsutils share above the userland.
kc_image_dnsutils() {
  kc_image_skeleton "$1"
  kc_image_bins "$1" /usr/bin/dig /usr/bin/nslookup /usr/bin/nsupdate /usr/bin/host
  kc_image_own_libs "$1" "$2"
}

# kc_image_applets ROOT LOWER...: busybox, and a link to it for each of its applets that no layer has a program
# of (as Alpine's busybox gives them); never a shell, so /bin/sh is dash and runs the programs on PATH.
kc_image_applets() {
  local root=$1 a r
  shift
  install -D -m 0755 /bin/busybox "$root/usr/bin/busybox"
  for a in $(/bin/busybox --list); do
    case $a in sh | ash | hush | busybox) continue ;; esac
    for r in "$root" "$@"; do
      [[ -e $r/usr/bin/$a || -e $r/usr/sbin/$a || -L $r/usr/bin/$a ]] && continue 2
    done
    ln -s busybox "$root/usr/bin/$a"
  done
}

# kc_image_own_libs ROOT LOWER...: the libraries of ROOT's programs that no LOWER root has, into ROOT.
kc_image_own_libs() {
  local root=$1 lib lower
  local -a programs
  shift
  mapfile -t programs < <(find "$root/usr/bin" "$root/usr/sbin" "$root/usr/local/bin" -type f -perm -u+x 2>/dev/null)
  ((${#programs[@]})) || return 0
  kc_image_add_libs "$root" "${programs[@]}"
  while read -r lib; do
    for lower in "$@"; do
      [[ -e $lower/${lib#"$root"/} ]] && rm -f "$lib" && break
    done
  done < <(find "$root/usr/lib" "$root/usr/lib64" -type f)
}

# kc_image_finish DIR NAME ROOT ENTRYPOINT-JSON CONFIG-JSON LOWER...: ROOT with its libraries over the LOWER
# layers, added to the archive being made in DIR.
kc_image_finish() {
  local dir=$1 name=$2 root=$3 entrypoint=$4 more=$5
  shift 5
  kc_image_own_libs "$root" "$@"
  kc_image_add "$dir" "$name" "$root" "$entrypoint" "$more" "$@"
  rm -rf "$root"
}

# agnhost 2.45 (test/images/agnhost/Dockerfile): `apk add bind-tools curl netcat-openbsd iproute2 iperf bash` on
# Alpine, porter's certificate and key, /uploads, its users, Entrypoint /agnhost and Cmd pause. Not its /coredns
# (a download from GitHub, used by the DNS config-map specs only).
kc_image_agnhost() {
  local dir=$1 root
  root=$(mktemp -d)
  kc_image_skeleton "$root"
  kc_image_bins "$root" /usr/bin/curl /usr/bin/nc.openbsd /usr/bin/ip /usr/bin/ss /usr/bin/iperf
  ln -s nc.openbsd "$root/usr/bin/nc"
  ln -s /usr/bin/iperf "$root/usr/local/bin/iperf"
  [[ -f /etc/ssl/certs/ca-certificates.crt ]] && install -D -m 0644 /etc/ssl/certs/ca-certificates.crt \
    "$root/etc/ssl/certs/ca-certificates.crt"
  kc_image_applets "$root" "$KC_IMAGE_LAYERS/userland" "$KC_IMAGE_LAYERS/dnsutils"
  install -m 0755 "$KC_BIN/agnhost" "$root/agnhost"
  ln -s agnhost "$root/agnhost-2"
  mkdir "$root/uploads"
  tar -xJf "$KC_K8S_SRC_TAR" -C "$root" --strip-components=5 kubernetes-1.28.7/test/images/agnhost/porter/localhost.crt \
    kubernetes-1.28.7/test/images/agnhost/porter/localhost.key || kc_die "porter's key and certificate from $KC_K8S_SRC_TAR"
  # Alpine's base users, and `adduser -u 1000 -D user-defined-in-image`, `addgroup -g 50000 group-defined-in-image`,
  # `addgroup user-defined-in-image group-defined-in-image`.
  printf '%s\n' 'root:x:0:0:root:/root:/bin/ash' 'bin:x:1:1:bin:/bin:/sbin/nologin' \
    'daemon:x:2:2:daemon:/sbin:/sbin/nologin' 'nobody:x:65534:65534:nobody:/:/sbin/nologin' \
    'user-defined-in-image:x:1000:1000:Linux User,,,:/home/user-defined-in-image:/bin/ash' >"$root/etc/passwd"
  printf '%s\n' 'root:x:0:root' 'bin:x:1:root,bin,daemon' 'daemon:x:2:root,bin,daemon' 'nobody:x:65534:' \
    'user-defined-in-image:x:1000:' 'group-defined-in-image:x:50000:user-defined-in-image' >"$root/etc/group"
  ln -s dash "$root/usr/bin/ash" # Alpine's login shell; dash is an Almquist shell too
  mkdir -p "$root/home/user-defined-in-image"
  chown 1000:1000 "$root/home/user-defined-in-image"
  kc_image_finish "$dir" "$KC_AGNHOST_IMAGE" "$root" '["/agnhost"]' \
    '"Cmd":["pause"],"ExposedPorts":{"80/tcp":{},"8080/tcp":{},"8081/tcp":{},"9376/tcp":{},"5000/tcp":{}}' \
    "$KC_IMAGE_LAYERS/userland" "$KC_IMAGE_LAYERS/dnsutils"
}

# jessie-dnsutils 1.7 (test/images/jessie-dnsutils/Dockerfile): debian with `apt-get install dnsutils`, Debian's
# users, debian's Cmd bash. Not its /coredns (a download from GitHub, used by no selected spec).
kc_image_jessie_dnsutils() {
  local dir=$1 root
  root=$(mktemp -d)
  mkdir "$root/etc"
  install -m 0644 /usr/share/base-passwd/passwd.master "$root/etc/passwd"
  install -m 0644 /usr/share/base-passwd/group.master "$root/etc/group"
  kc_image_finish "$dir" "$KC_JESSIE_DNSUTILS_IMAGE" "$root" null '"Cmd":["bash"]' "$KC_IMAGE_LAYERS/userland" \
    "$KC_IMAGE_LAYERS/dnsutils"
}

# busybox 1.29-4 (test/images/busybox/Dockerfile: busybox:1.29 as it is): busybox with every applet in /bin, its
# users, Cmd sh.
kc_image_busybox() {
  local dir=$1 root a
  root=$(mktemp -d)
  mkdir -p "$root"/{bin,etc,root,tmp,home,var/spool/mail,var/www}
  chmod 1777 "$root/tmp"
  install -m 0755 /bin/busybox "$root/bin/busybox"
  for a in $(/bin/busybox --list); do [[ $a == busybox ]] || ln -s busybox "$root/bin/$a"; done
  printf '%s\n' 'root:x:0:0:root:/root:/bin/sh' 'daemon:x:1:1:daemon:/usr/sbin:/bin/false' \
    'bin:x:2:2:bin:/bin:/bin/false' 'sys:x:3:3:sys:/dev:/bin/false' 'sync:x:4:100:sync:/bin:/bin/sync' \
    'mail:x:8:8:mail:/var/spool/mail:/bin/false' 'www-data:x:33:33:www-data:/var/www:/bin/false' \
    'operator:x:37:37:Operator:/var:/bin/false' 'nobody:x:65534:65534:nobody:/home:/bin/false' >"$root/etc/passwd"
  printf '%s\n' 'root:x:0:' 'daemon:x:1:' 'bin:x:2:' 'sys:x:3:' 'adm:x:4:' 'tty:x:5:' 'disk:x:6:' 'mail:x:8:' \
    'wheel:x:10:root' 'www-data:x:33:' 'operator:x:37:' 'staff:x:50:' 'users:x:100:' 'nogroup:x:65534:' \
    >"$root/etc/group"
  kc_image_add "$dir" "$KC_BUSYBOX_IMAGE" "$root" null '"Cmd":["sh"]'
  rm -rf "$root"
}

# nginx 1.14-4 (test/images/nginx/Dockerfile: nginx:1.14-alpine as it is): Debian's nginx in that image's layout
# (its nginx.conf and conf.d/default.conf, user nginx, the logs to the container's stdout and stderr, the welcome
# page), Alpine's tools as in agnhost's image, Cmd `nginx -g 'daemon off;'`, stop signal SIGTERM.
kc_image_nginx() {
  local dir=$1 root
  root=$(mktemp -d)
  kc_image_skeleton "$root"
  kc_image_bins "$root" /usr/sbin/nginx
  kc_image_applets "$root" "$KC_IMAGE_LAYERS/userland"
  install -D -m 0644 "$KC_DEB_ROOT/etc/nginx/mime.types" "$root/etc/nginx/mime.types"
  mkdir -p "$root"/{etc/nginx/conf.d,var/log/nginx,var/lib/nginx,var/cache/nginx,usr/share/nginx/html}
  ln -s /dev/stdout "$root/var/log/nginx/access.log"
  ln -s /dev/stderr "$root/var/log/nginx/error.log"
  cat >"$root/etc/nginx/nginx.conf" <<'CONF'
user  nginx;
worker_processes  1;
error_log  /var/log/nginx/error.log warn;
pid        /var/run/nginx.pid;
events {
    worker_connections  1024;
}
http {
    include       /etc/nginx/mime.types;
    default_type  application/octet-stream;
    log_format  main  '$remote_addr - $remote_user [$time_local] "$request" '
                      '$status $body_bytes_sent "$http_referer" '
                      '"$http_user_agent" "$http_x_forwarded_for"';
    access_log  /var/log/nginx/access.log  main;
    sendfile        on;
    keepalive_timeout  65;
    include /etc/nginx/conf.d/*.conf;
}
CONF
  cat >"$root/etc/nginx/conf.d/default.conf" <<'CONF'
server {
    listen       80;
    server_name  localhost;
    location / {
        root   /usr/share/nginx/html;
        index  index.html index.htm;
    }
    error_page   500 502 503 504  /50x.html;
    location = /50x.html {
        root   /usr/share/nginx/html;
    }
}
CONF
  printf '<!DOCTYPE html>\n<html>\n<head>\n<title>Welcome to nginx!</title>\n</head>\n<body>\n<h1>Welcome to nginx!</h1>\n</body>\n</html>\n' \
    >"$root/usr/share/nginx/html/index.html"
  printf '<!DOCTYPE html>\n<html>\n<head>\n<title>Error</title>\n</head>\n<body>\n<h1>An error occurred.</h1>\n</body>\n</html>\n' \
    >"$root/usr/share/nginx/html/50x.html"
  printf '%s\n' 'root:x:0:0:root:/root:/bin/ash' 'nobody:x:65534:65534:nobody:/:/sbin/nologin' \
    'nginx:x:101:101:nginx:/var/cache/nginx:/sbin/nologin' >"$root/etc/passwd"
  printf '%s\n' 'root:x:0:root' 'nobody:x:65534:' 'nginx:x:101:nginx' >"$root/etc/group"
  kc_image_finish "$dir" "$KC_NGINX_IMAGE" "$root" null \
    '"Cmd":["nginx","-g","daemon off;"],"ExposedPorts":{"80/tcp":{}},"StopSignal":"SIGTERM"' "$KC_IMAGE_LAYERS/userland"
}

# The images every node gets, by their builders (each adds its image to the archive being made in DIR).
KC_IMAGE_BUILDERS=(kc_image_pause kc_image_agnhost kc_image_jessie_dnsutils kc_image_busybox kc_image_nginx)

# pause 3.9 (build/pause of the release tree): the sandbox's one process.
kc_image_pause() {
  local dir=$1 root
  root=$(mktemp -d)
  install -D -m 0755 "$KC_BIN/pause" "$root/pause"
  kc_image_add "$dir" "$KC_PAUSE_IMAGE" "$root" '["/pause"]' ""
  rm -rf "$root"
}

# kc_images_recipe: a hash of how the images are made and of the binaries they take from the release build.
kc_images_recipe() {
  {
    declare -f kc_image_add kc_image_pack kc_image_layer kc_debs_unpack kc_image_add_libs kc_image_bins kc_image_skeleton \
      kc_image_userland kc_image_dnsutils kc_image_applets kc_image_own_libs kc_image_finish kc_image_pause \
      kc_image_agnhost kc_image_jessie_dnsutils kc_image_busybox kc_image_nginx kc_image_lower_layers
    echo "${KC_IMAGE_DEBS[*]} ${KC_IMAGE_BUILDERS[*]} $KC_PAUSE_IMAGE $KC_AGNHOST_IMAGE"
    stat -c '%s %Y' "$KC_BIN/pause" "$KC_BIN/agnhost" /bin/busybox
  } | sha256sum | cut -c1-12
}

# kc_images_tar: the cached archive of every node's images, one docker-archive (a layer that several images
# share is read once by each node's import).
kc_images_tar() { echo "$KC_CACHE/images/node-images-$(kc_images_recipe).tar"; }

# kc_image_lower_layers DIR: the layers images share, in DIR (KC_IMAGE_LAYERS): userland, and dnsutils over it.
kc_image_lower_layers() {
  KC_IMAGE_LAYERS=$1
  kc_debs_unpack
  mkdir "$1/userland" "$1/dnsutils"
  kc_image_userland "$1/userland"
  kc_image_layer "$1/userland"
  kc_image_dnsutils "$1/dnsutils" "$1/userland"
  kc_image_layer "$1/dnsutils"
}

# Builds the archive into the cache once per recipe. One `up` at a time
# builds (tests bring clusters up side by side); the others wait for its archive.
kc_images_build() {
  local dir=$KC_CACHE/images lock tar work builder
  mkdir -p "$dir"
  exec {lock}>"$dir/.lock"
  flock "$lock"
  tar=$(kc_images_tar)
  if [[ ! -f $tar ]]; then
    kc_say "building the node images (once; about half a minute)"
    work=$(mktemp -d)
    mkdir "$work/archive" "$work/layers"
    kc_image_lower_layers "$work/layers"
    for builder in "${KC_IMAGE_BUILDERS[@]}"; do "$builder" "$work/archive"; done
    kc_image_pack "$work/archive" "$tar"
    rm -rf "$work"
  fi
  # Another recipe's archive, once a day old (a checkout of another version may be about to import it).
  find "$dir" -maxdepth 1 -name 'node-images-*.tar' -mmin +1440 ! -path "$tar" -delete
  exec {lock}>&-
}

# kc_import_image NODE TAR: the archive into the node's containerd (namespace k8s.io, where the kubelet looks).
kc_import_image() {
  kc_ctr "$1" images import --all-platforms "$2" \
    >/dev/null || kc_die "$1: importing $2 failed"
}

# kc_load_images NODE: every node image into the node's containerd, not unpacked: the CRI plugin unpacks an
# image when a container first needs it, so a node pays only for the images its pods run.
kc_load_images() {
  kc_ctr "$1" images import --all-platforms \
    --no-unpack "$(kc_images_tar)" >/dev/null || kc_die "$1: importing $(kc_images_tar) failed"
}

# The two images flannel's own manifest (../shared/kubernetes/kube-flannel.yml) runs, made of ours, for
# `--network flannel`: its names swapped for these, nothing else of it changed.
KC_FABRICD_IMAGE=localhost/cni-rs/fabricd:dev
KC_FLANNEL_CNI_IMAGE=localhost/cni-rs/flannel-cni-plugin:dev

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
