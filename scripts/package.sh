#!/usr/bin/env bash
# Builds what operators install, into target/dist/ (or --out DIR):
#   cni-rs-plugins_<version>_<arch>.deb  the plugins in /usr/lib/cni; Provides, Conflicts and Replaces Debian's
#                                        containernetworking-plugins, so it swaps with it either way
#   cni-rs-fabric_<version>_<arch>.deb   the node agents: fabricd and cni-netpol (/usr/sbin), their systemd units
#                                        (not enabled), cnitool (/usr/bin)
#   cni-rs-installer_<version>.tar       the installer image (podman load / ctr images import): from scratch,
#                                        cni-installer as entrypoint, the plugins, fabricd, cni-netpol and nft with
#                                        exactly the shared libraries ldd lists
#   scripts/package.sh [--out DIR] [--prebuilt DIR] [--no-image]
# --prebuilt DIR packages the binaries already in DIR (e.g. target/debug: the tests) instead of building release
# binaries. The list of plugins comes from the workspace (scripts/lib/binaries.sh). Debian's own tools build the
# packages (dpkg-deb, dpkg-shlibdeps for Depends, lintian to check them), buildah the image; nothing is fetched.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/binaries.sh
out=target/dist prebuilt='' image=1
while (($#)); do
  case $1 in
    --out) out=${2:?--out needs a directory}; shift ;;
    --prebuilt) prebuilt=${2:?--prebuilt needs a directory}; shift ;;
    --no-image) image=0 ;;
    *) echo "usage: $0 [--out DIR] [--prebuilt DIR] [--no-image]" >&2; exit 2 ;;
  esac
  shift
done
for tool in jq dpkg-deb dpkg-shlibdeps strip readelf fakeroot; do
  command -v $tool >/dev/null || { echo "package: $tool not found: run scripts/setup.sh" >&2; exit 1; }
done
((image)) && { command -v buildah >/dev/null || { echo "package: buildah not found: run scripts/setup.sh" >&2; exit 1; }; }

mapfile -t plugins < <(cni_plugin_binaries)
version=$(cargo metadata --no-deps --format-version 1 --offline | jq -r '.packages[] | select(.name == "cnitool") | .version')
debversion=$version-1
arch=$(dpkg --print-architecture)
# Who builds the packages (Debian's variables); the default names no real mailbox (.invalid is reserved).
maintainer="${DEBFULLNAME:-cni-rs maintainers} <${DEBEMAIL:-cni-rs@packages.invalid}>"
if [[ -z $prebuilt ]]; then
  cni_build_release all
  prebuilt=$CNI_STAGE_DIR
fi
for b in "${plugins[@]}" "${CNI_TOOL_BINARIES[@]}"; do
  [[ -x $prebuilt/$b ]] || { echo "package: $prebuilt/$b missing" >&2; exit 1; }
done
mkdir -p "$out"
out=$(cd "$out" && pwd)
work=$(mktemp -d "$out/.work.XXXXXX")
trap 'rm -rf "$work"' EXIT

# One package tree: binaries stripped (release binaries already are), the docs Debian policy wants.
stage_binary() { # SRC DEST
  install -D -m 0755 "$1" "$2"
  strip --strip-unneeded --remove-section=.comment --remove-section=.note "$2"
}
stage_docs() { # TREE PACKAGE
  local doc=$1/usr/share/doc/$2
  install -D -m 0644 packaging/copyright "$doc/copyright"
  printf '%s (%s) unstable; urgency=medium\n\n  * Built from the cni-rs workspace by scripts/package.sh.\n\n -- %s  %s\n' \
    "$2" "$debversion" "$maintainer" "$(date -R -d @"${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || date +%s)}")" |
    gzip -9n >"$doc/changelog.Debian.gz"
  chmod 0644 "$doc/changelog.Debian.gz"
}
# A Depends line: dpkg-shlibdeps' dependencies for the ELF files of a tree (none when they are all static, as
# release plugins are), then the given ones.
depends() { # TREE DEPENDENCY...
  local elf=() shlibs
  mapfile -t elf < <(find "$1" -type f -perm -0100)
  shlibs=$( (cd "$work" && dpkg-shlibdeps -O "${elf[@]}" 2>/dev/null) | sed -n 's/^shlibs:Depends=//p')
  shift
  local line=$shlibs dependency
  for dependency in "$@"; do line=${line:+$line, }$dependency; done
  echo "Depends: $line"
}
# Release binaries other than fabricd are static-pie executables (scripts/lib/binaries.sh says why):
# position-independent with no interpreter, so lintian takes them for shared libraries lacking a libc
# dependency. An override names each one.
lintian_static_overrides() { # TREE PACKAGE
  local tree=$1 package=$2 file hints=()
  while read -r file; do
    [[ $(readelf -l "$file") == *'program interpreter'* ]] ||
      hints+=("$package: shared-library-lacks-prerequisites [${file#"$tree"/}]")
  done < <(find "$tree" -type f -perm -0100 | sort)
  ((${#hints[@]})) || return 0
  local overrides=$tree/usr/share/lintian/overrides/$package
  install -d -m 0755 "${overrides%/*}"
  { echo "# static-pie executables, not shared libraries"; printf '%s\n' "${hints[@]}"; } >"$overrides"
  chmod 0644 "$overrides"
}
build_deb() { # TREE PACKAGE CONTROL-LINES...
  local tree=$1 package=$2
  shift 2
  install -d -m 0755 "$tree/DEBIAN"
  {
    echo "Package: $package"
    echo "Version: $debversion"
    echo "Architecture: $arch"
    echo "Maintainer: $maintainer"
    echo "Installed-Size: $(du -sk --exclude=DEBIAN "$tree" | cut -f1)"
    printf '%s\n' "$@"
  } >"$tree/DEBIAN/control"
  (cd "$tree" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | sort -z | xargs -0 md5sum) >"$tree/DEBIAN/md5sums"
  chmod 0644 "$tree/DEBIAN/control" "$tree/DEBIAN/md5sums"
  [[ -e $tree/etc ]] && find "$tree/etc" -type f -printf '/etc/%P\n' >"$tree/DEBIAN/conffiles" && chmod 0644 "$tree/DEBIAN/conffiles"
  local deb=$out/${package}_${debversion}_$arch.deb
  fakeroot dpkg-deb --root-owner-group -Zxz --build "$tree" "$deb" >/dev/null
  echo "package: $deb"
}
mkdir -p "$work/debian"
printf 'Source: cni-rs\n\nPackage: cni-rs\nArchitecture: any\n' >"$work/debian/control"

# The plugins, where Debian's containernetworking-plugins puts them (Debian's containerd and podman look there).
tree=$work/debian/cni-rs-plugins
for b in "${plugins[@]}"; do stage_binary "$prebuilt/$b" "$tree/usr/lib/cni/$b"; done
# The dhcp daemon's units under the reference package's names and paths: not enabled by this package, and an
# enablement made under the reference's package stays in effect across the swap.
for unit in cni-dhcp.service cni-dhcp.socket; do
  install -D -m 0644 "packaging/$unit" "$tree/lib/systemd/system/$unit"
done
stage_docs "$tree" cni-rs-plugins
lintian_static_overrides "$tree" cni-rs-plugins
build_deb "$tree" cni-rs-plugins \
  "$(depends "$tree" iptables)" \
  "Suggests: nftables" \
  "Provides: containernetworking-plugins, container-network-stack (= 1)" \
  "Conflicts: containernetworking-plugins" \
  "Replaces: containernetworking-plugins" \
  "Section: net" "Priority: optional" \
  "Homepage: https://github.com/containernetworking/plugins" \
  "Description: CNI plugins in Rust, a drop-in for the reference plugins" \
  " The CNI plugins a Kubernetes node and podman use, with the reference plugins'" \
  " binary names, config fields, on-disk state and firewall layout, so a node moves" \
  " from the reference plugins to these and back with pods running." \
  "$(echo "Installed in /usr/lib/cni: ${plugins[*]}." | fold -s -w 76 | sed 's/^/ /')"

# The node agents and the runner. cni-netpol (the NetworkPolicy agent) is here rather than in a package of its
# own: like fabricd it is a node daemon whose unit is installed but not enabled, both need the plugins (the
# dependency below), and a kubenet node enables cni-netpol alone (fabricd stays an inert binary there).
tree=$work/debian/cni-rs-fabric
stage_binary "$prebuilt/fabricd" "$tree/usr/sbin/fabricd"
stage_binary "$prebuilt/cni-netpol" "$tree/usr/sbin/cni-netpol"
stage_binary "$prebuilt/cnitool" "$tree/usr/bin/cnitool"
for agent in fabricd cni-netpol; do
  install -D -m 0644 "packaging/$agent.service" "$tree/lib/systemd/system/$agent.service"
  install -D -m 0644 "packaging/$agent.default" "$tree/etc/default/$agent"
done
stage_docs "$tree" cni-rs-fabric
install -m 0644 fabricd/README.md "$tree/usr/share/doc/cni-rs-fabric/README.md"
install -m 0644 netpol/README.md "$tree/usr/share/doc/cni-rs-fabric/cni-netpol.md"
lintian_static_overrides "$tree" cni-rs-fabric
build_deb "$tree" cni-rs-fabric \
  "$(depends "$tree" "cni-rs-plugins (= $debversion) | containernetworking-plugins")" \
  "Recommends: nftables | iptables" \
  "Section: net" "Priority: optional" \
  "Homepage: https://github.com/flannel-io/flannel" \
  "Description: node agents: flannel-compatible fabricd, NetworkPolicy agent, cnitool" \
  " fabricd gives the nodes of a cluster one flat pod network on etcd v3, in" \
  " flannel's layout and with flanneld's flags: host-gw, vxlan, masquerade, the" \
  " node's conflist and subnet.env. cni-netpol enforces Kubernetes" \
  " NetworkPolicy in nftables on kubenet and fabric nodes alike. Their systemd" \
  " units are installed but neither enabled nor started (flags in" \
  " /etc/default/fabricd and /etc/default/cni-netpol). cnitool runs CNI" \
  " conflists as libcni does."

if command -v lintian >/dev/null; then
  # TMPDIR: lintian leaves its mldbm-* files behind.
  TMPDIR=$work lintian --fail-on error "$out"/cni-rs-{plugins,fabric}_"${debversion}"_"$arch".deb
fi

((image)) || exit 0
# The installer image, from scratch: no shell, no package manager.
root=$work/image
install -D -m 0755 "$prebuilt/cni-installer" "$root/usr/bin/cni-installer"
stage_binary "$prebuilt/fabricd" "$root/usr/sbin/fabricd"
stage_binary "$prebuilt/cni-netpol" "$root/usr/sbin/cni-netpol"
for b in "${plugins[@]}"; do stage_binary "$prebuilt/$b" "$root/opt/cni-rs/bin/$b"; done
strip --strip-unneeded "$root/usr/bin/cni-installer"
install -D -m 0644 conf/10-flannel.conflist "$root/etc/cni-rs/10-flannel.conflist"
# fabricd's masquerade runs nft (the DaemonSet passes --firewall-backend=nftables).
install -D -m 0755 "$(command -v nft)" "$root/usr/sbin/nft"
# Exactly the shared libraries the image's own executables load (the plugins run on the node, with its libc).
while read -r lib; do
  install -D -m 0644 "$lib" "$root$lib"
done < <(ldd "$root/usr/bin/cni-installer" "$root/usr/sbin/fabricd" "$root/usr/sbin/cni-netpol" "$root/usr/sbin/nft" |
  awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// && $1 !~ /:$/ {print $1}' | sort -u)
chmod 0755 "$root"/lib64/ld-linux-* 2>/dev/null || true
install -d -m 1777 "$root/tmp"

name=localhost/cni-rs/installer:$version
archive=$out/cni-rs-installer_$version.tar
b() { buildah --root "$work/storage" --runroot "$work/run" --storage-driver vfs "$@"; }
ctr=$(b from --quiet scratch)
b copy --quiet "$ctr" "$root" / >/dev/null
b config --entrypoint '["/usr/bin/cni-installer"]' --cmd '' --env PATH=/usr/sbin:/usr/bin \
  --label org.opencontainers.image.title=cni-rs-installer --label "org.opencontainers.image.version=$version" "$ctr"
b commit --quiet --rm "$ctr" "$name" >/dev/null
rm -f "$archive"
b push --quiet "$name" "docker-archive:$archive:$name" >/dev/null
b rmi --all --force >/dev/null 2>&1 || true
echo "package: $archive ($name)"
