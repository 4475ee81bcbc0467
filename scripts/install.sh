#!/usr/bin/env bash
# Installs the plugins on a node: release binaries (static; scripts/lib/binaries.sh) into PREFIX (default /opt/cni/bin) and, with --conf, the
# kubenet conflist into /etc/cni/net.d (never overwriting an existing file unless --force).
#   scripts/install.sh [--prefix DIR] [--conf] [--force]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/binaries.sh
prefix=/opt/cni/bin conf=0 force=0
while (($#)); do
  case $1 in
    --prefix) prefix=${2:?--prefix needs a directory}; shift ;;
    --conf) conf=1 ;;
    --force) force=1 ;;
    *) echo "usage: $0 [--prefix DIR] [--conf] [--force]" >&2; exit 2 ;;
  esac
  shift
done
mapfile -t plugins < <(cni_plugin_binaries)
cni_build_release plugins
install -d -m 0755 "$prefix"
# The plugins (every bin of the crates under plugins/ and ipam/; flannel is flannel's meta-plugin) and the
# runner. fabricd, the node agent, is a daemon: see fabricd/README.md and conf/fabricd.service.
for b in "${plugins[@]}" cnitool; do
  # Install through a temporary name and rename, so a running kubelet never executes a half-written binary.
  install -m 0755 "$CNI_STAGE_DIR/$b" "$prefix/.$b.new"
  mv -f "$prefix/.$b.new" "$prefix/$b"
  echo "installed $prefix/$b"
done
if ((conf)); then
  install -d -m 0755 /etc/cni/net.d
  dest=/etc/cni/net.d/10-kubenet.conflist
  if [[ -e $dest && $force == 0 ]]; then
    echo "$dest exists; not overwritten (use --force)" >&2
  else
    install -m 0644 conf/10-kubenet.conflist "$dest"
    echo "installed $dest (edit the pod subnet to the node's podCIDR)"
  fi
fi
