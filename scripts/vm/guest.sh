#!/bin/bash
# The VM lane's guest side, run by scripts/vm/init with the host's root (read-only) as /: makes the rest of a
# machine the tests expect (devpts, /dev/shm, cgroups, tmpfs on /var/lib/cni, the host's directories hidden below
# the guest's tmpfs that the lane shares, the kernel's modules from the lane's cache for `modprobe` and the
# kernel's own module requests), runs the host's plan, writes its exit status to /run/vm/status (the host's result
# folder) and powers off.
set -uo pipefail
export PATH=/run/vm/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8
poweroff_now() { sync; echo o >/proc/sysrq-trigger; sleep 10; }
trap poweroff_now EXIT
release=$(cat /run/vm/release)
cache=$(cat /run/vm/cache)
mkdir -p /dev/pts /dev/shm /run/netns /run/lock
mount -t devpts -o newinstance,ptmxmode=0666 devpts /dev/pts
# What udev makes on a real machine (`nft -f -` opens /dev/stdin).
ln -sf /proc/self/fd /dev/fd
ln -sf /proc/self/fd/0 /dev/stdin
ln -sf /proc/self/fd/1 /dev/stdout
ln -sf /proc/self/fd/2 /dev/stderr
mount -t tmpfs shm /dev/shm
mount -t cgroup2 cgroup2 /sys/fs/cgroup 2>/dev/null || true
[[ -d /var/lib/cni ]] && mount -t tmpfs cni /var/lib/cni
# The host's directories hidden below that scratch which the lane needs (the checkout, the Cargo target
# directory, ...: scripts/lib/vm.sh, vm_share), mounted at their host paths, read-only. Without one no suite
# can run: the guest stops at once, saying which.
while IFS=$'\t' read -r tag path; do
  if ! mkdir -p "$path" || ! mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=loose,msize=512000 "$tag" "$path"
  then
    echo "vm-lane: the guest could not mount the host's $path"
    echo 1 >/run/vm/status
    exit
  fi
  echo "vm-lane: the host's $path mounted in the guest (hidden by its tmpfs otherwise)"
done </run/vm/shares
# modprobe against the cached kernel tree (the host's root has no /lib/modules of this kernel): on PATH for
# tools, and as the kernel's helper for module autoloading (iptables reads the same path).
mkdir -p /run/vm/bin
cat >/run/vm/bin/modprobe <<MODPROBE
#!/bin/sh
exec /usr/sbin/modprobe -d $cache/$release/root "\$@"
MODPROBE
chmod 0755 /run/vm/bin/modprobe
echo /run/vm/bin/modprobe >/proc/sys/kernel/modprobe
# nf_tables' set hashing needs crc32c; the kernel does not request it by itself. br_netfilter: a Kubernetes
# node loads it (kubeadm's prerequisites; this machine's kernel has it built in), so bridged pod traffic goes
# through iptables as kube-proxy and the bridge's hairpin tests expect.
modprobe -a crc32c_generic br_netfilter
ip link set lo up
set -a
# shellcheck disable=SC1091
source /run/vm/env
set +a
echo "vm-lane: guest $(uname -r) up after $(cut -d' ' -f1 /proc/uptime) s"
bash /run/vm/plan
echo $? >/run/vm/status
