#!/bin/bash
# The VM lane's guest, made writable where a Kubernetes node writes (run by the plan before the k8s* suites):
# the host's root is shared read-only, and cluster.sh makes mount points and state below /etc, /opt, /var/lib,
# /var/log and /var/tmp. Each becomes an overlay of the host's directory (read-only, below) and a tmpfs of the
# guest's (above), so the host's files stay visible (the Kubernetes binaries in /var/tmp/cni-rs-k8s) and nothing
# reaches the host. The clusters' own root (/var/tmp/cni-rs-cluster) is a fresh tmpfs: the host's clusters are
# not the guest's. /var/lib/cni gets its scratch tmpfs back on top.
set -euo pipefail
rw=/run/vm-rw
for dir in /etc /opt /var/lib /var/log /var/tmp; do
  [[ -d $dir ]] || continue
  up=$rw/${dir//\//_}
  mkdir -p "$up/upper" "$up/work"
  mount -t overlay overlay -o "lowerdir=$dir,upperdir=$up/upper,workdir=$up/work" "$dir"
done
mkdir -p /var/lib/cni && mount -t tmpfs cni /var/lib/cni
mkdir -p /var/tmp/cni-rs-cluster
mount -t tmpfs -o mode=0755 clusters /var/tmp/cni-rs-cluster
echo "vm-lane: /etc, /opt, /var/lib, /var/log and /var/tmp writable in the guest (overlays on tmpfs)"
