# The VM lane's pieces (sourced by scripts/vm-lane.sh and scripts/setup.sh): Debian's stock kernels fetched and
# unpacked into a cache, an initramfs that mounts the host's root read-only over virtio-9p, and one boot of QEMU
# under TCG that runs a plan of commands against the guest's kernel.
#
# Why this shape (measured 2026-11-26 on this machine kind): /dev/kvm here runs only PVM-aware guests, so a stock
# kernel runs under TCG; through the PVH entry of the uncompressed vmlinux, 6.1 boots to a shell in about 3 s.
# Sharing the host's / read-only lets the guest run the host's own binaries (iproute2, nft, etcd, the reference
# plugins, the cargo-built tests) without an image to build or keep in step.

# Where kernels are kept between runs (setup.sh fills it; never /boot).
CNI_VM_CACHE=${CNI_VM_CACHE:-/var/tmp/cni-rs-vm}
# The kernels of the matrix: a short name and the Debian package (an extended regex) whose newest is fetched:
# bookworm's default 6.1 and the 6.12 built for bookworm (trixie's series), generic flavour.
declare -gA CNI_VM_KERNELS=(
  [6.1]='linux-image-6\.1\.0-[0-9]+-amd64'
  [6.12]='linux-image-6\.12\.[0-9]+\+deb12-amd64'
)
# Modules the guest needs before it can read the host's root (the rest are loaded from the cache afterwards).
CNI_VM_BOOT_MODULES=(virtio_pci 9pnet_virtio 9p)

# The guest's own scratch: tmpfs mounted over these directories of the host's root (scripts/vm/init, guest.sh).
# What the host keeps below them is hidden in the guest unless shared on its own (vm_share).
CNI_VM_SCRATCH=(/tmp /run /var/lib/cni /dev/shm)
# Host directories the guest mounts at their own paths over its scratch, read-only (vm_share fills it).
VM_SHARES=()
# The variables passed to the guest's tests (vm_forward_env writes it).
VM_ENV=

vm_log() { echo "vm-lane: $*" >&2; }

# Makes the host's PATH visible in the guest at its real path, or says before booting why it cannot be, naming
# LABEL (what the path is), the path and what to do. The host's root shows most paths as they are; one below the
# guest's scratch gets a share of its own (a file: its directory).
vm_share() { # LABEL PATH
  local label=$1 path scratch top
  path=$(realpath -m -- "$2")
  top=${path#/} && top=/${top%%/*}
  case $path/ in
    *$'\n'* | *$'\t'*) vm_log "$label ($2): a newline or tab in the path cannot be shared with the guest"; return 1 ;;
    /dev/shm/*) ;;
    /proc/* | /sys/* | /dev/*) vm_log "$label ($path) is in $top, which the guest mounts its own kernel" \
      "filesystem over: put it elsewhere (outside /proc, /sys and /dev; /dev/shm works)"; return 1 ;;
    /run/vm/*) vm_log "$label ($path) is below /run/vm, the guest's result folder: put it elsewhere"; return 1 ;;
  esac
  [[ -f $path ]] && path=$(dirname "$path")
  for scratch in "${CNI_VM_SCRATCH[@]}"; do
    if [[ $path == "$scratch" ]]; then
      vm_log "$label ($2) would need $scratch itself shared, which the guest mounts its own empty tmpfs over" \
        "(its tests write there): use a directory below it (e.g. $scratch/cni-rs/) or elsewhere"
      return 1
    fi
    [[ $path == "$scratch"/* ]] && VM_SHARES+=("$path")
  done
  return 0
}

# The shares to mount, one per tree (a path below another share is seen through it), outermost first.
vm_share_roots() {
  local path root roots=()
  while IFS= read -r path; do
    for root in "${roots[@]}"; do [[ $path == "$root"/* ]] && continue 2; done
    roots+=("$path")
    echo "$path"
  done < <(((${#VM_SHARES[@]})) && printf '%s\n' "${VM_SHARES[@]}" | sort -u | awk '{print length($0), $0}' |
    sort -s -n -k1,1 | cut -d' ' -f2-)
}

# Writes the variables the guest's tests get from the host (CI, RUST_*, CNI_* but the lane's own) into a file in
# DIR. A value that is an existing absolute path is given as its real path (a symlink below the guest's scratch
# would not resolve there) and shared (vm_share): refused before booting where the guest cannot show it.
vm_forward_env() { # DIR
  local name value
  VM_ENV=$1/guest-env
  : >"$VM_ENV"
  while IFS= read -r name; do
    value=${!name}
    if [[ $value == /* && -e $value ]]; then
      value=$(realpath -- "$value")
      vm_share "$name" "$value" || return 1
    fi
    printf '%s=%q\n' "$name" "$value" >>"$VM_ENV"
  done < <(compgen -e | grep -E '^(CI|RUST_BACKTRACE|RUST_LOG|CNI_[A-Z_]+)$' | grep -v '^CNI_VM_')
}

# The newest package matching a kernel's glob in apt's lists.
vm_package_for() { # SHORT
  local pattern=${CNI_VM_KERNELS[$1]:?unknown kernel $1 (known: ${!CNI_VM_KERNELS[*]})}
  apt-cache search --names-only "^$pattern\$" 2>/dev/null | awk '{print $1}' | grep -E "^$pattern\$" | sort -V | tail -n 1
}

# The cached tree of a kernel series: the newest release unpacked there (empty when none is).
vm_cached_release() { # SHORT
  local short=$1 d
  for d in "$CNI_VM_CACHE"/*/ready; do
    [[ -e $d ]] || continue
    d=$(dirname "$d")
    [[ $(cat "$d/short") == "$short" ]] && basename "$d"
  done | sort -V | tail -n 1
}

# Fetches and prepares one kernel series unless a prepared one is cached: the package unpacked (apt-get download
# + dpkg-deb -x), modules.dep made (the package's postinst would), the vmlinux extracted from the bzImage, and
# the initramfs built. Prints the release.
vm_fetch() { # SHORT
  local short=$1 have pkg release dir
  have=$(vm_cached_release "$short")
  if [[ -n $have ]]; then echo "$have"; return 0; fi
  pkg=$(vm_package_for "$short")
  if [[ -z $pkg ]]; then
    apt-get update -qq >/dev/null
    pkg=$(vm_package_for "$short")
  fi
  [[ -n $pkg ]] || { vm_log "no package matches ${CNI_VM_KERNELS[$short]} in apt's lists"; return 1; }
  release=${pkg#linux-image-}
  dir=$CNI_VM_CACHE/$release
  vm_log "fetching $pkg into $dir"
  rm -rf "$dir" && mkdir -p "$dir/dl" "$dir/root"
  (cd "$dir/dl" && apt-get download -q "$pkg" >/dev/null 2>&1) || { vm_log "apt-get download $pkg failed"; return 1; }
  dpkg-deb -x "$dir"/dl/*.deb "$dir/root" && rm -rf "$dir/dl"
  depmod -b "$dir/root" "$release"
  vm_extract_vmlinux "$dir/root/boot/vmlinuz-$release" "$dir/vmlinux"
  vm_build_initramfs "$dir" "$release"
  echo "$short" >"$dir/short"
  touch "$dir/ready"
  echo "$release"
}

# The uncompressed ELF inside a bzImage (what the kernel's scripts/extract-vmlinux does): the payload starts at
# its compressor's magic; QEMU boots the ELF through its PVH note, which skips the real-mode setup and the
# decompression (4.5 s against 8 s to poweroff under TCG).
vm_extract_vmlinux() { # BZIMAGE OUT
  local image=$1 out=$2 magic tool offset
  for magic in 'xz:\xfd7zXZ\x00' 'zstd:\x28\xb5\x2f\xfd' 'gzip:\x1f\x8b\x08'; do
    tool=${magic%%:*}
    for offset in $(LC_ALL=C grep -obUaP "${magic#*:}" "$image" | cut -d: -f1); do
      tail -c +$((offset + 1)) "$image" | "$tool" -dc 2>/dev/null >"$out.tmp" || true
      if [[ $(head -c 4 "$out.tmp" | od -An -tx1 | tr -d ' ') == 7f454c46 ]]; then
        mv "$out.tmp" "$out"
        return 0
      fi
    done
  done
  rm -f "$out.tmp"
  vm_log "no ELF kernel found in $image"
  return 1
}

# An uncompressed initramfs: busybox-static, the modules that reach the host's root (decompressed: busybox's
# insmod takes plain .ko files) in dependency order, and scripts/vm/init.
vm_build_initramfs() { # DIR RELEASE
  local dir=$1 release=$2 stage m line ko n=0
  stage=$(mktemp -d)
  mkdir -p "$stage"/{bin,dev,proc,sys,newroot,modules}
  cp /bin/busybox "$stage/bin/busybox"
  cp "$(dirname "${BASH_SOURCE[0]}")/../vm/init" "$stage/init"
  chmod 0755 "$stage/init"
  for m in "${CNI_VM_BOOT_MODULES[@]}"; do
    while read -r line; do
      [[ $line == insmod\ * ]] || continue
      ko=$(awk '{print $2}' <<<"$line")
      grep -qxF "$(basename "$ko")" "$stage/modules/order" 2>/dev/null && continue
      case $ko in
        *.xz) xz -dc "$ko" >"$stage/modules/$(basename "${ko%.xz}")" ;;
        *.zst) zstd -qdc "$ko" >"$stage/modules/$(basename "${ko%.zst}")" ;;
        *) cp "$ko" "$stage/modules/" ;;
      esac
      basename "$ko" >>"$stage/modules/order"
      n=$((n + 1))
    done < <(modprobe -d "$dir/root" -S "$release" --show-depends "$m")
  done
  sed -i -e 's/\.xz$//' -e 's/\.zst$//' "$stage/modules/order"
  (cd "$stage" && find . | busybox cpio -o -H newc 2>/dev/null) >"$dir/initramfs.cpio"
  rm -rf "$stage"
}

# Boots RELEASE once and runs PLAN (a bash script run in the guest with the host's root as /, the guest's own
# /proc, /sys, /dev, tmpfs on /tmp, /run, /var/lib/cni and /dev/shm, and over them the VM_SHARES at their host
# paths) with the guest's output on this terminal. The guest's exit status becomes ours; a guest that runs past
# TIMEOUT seconds is killed and that is an error (124); a guest that stops without a result (its kernel died: its
# log is on the terminal) is 125.
vm_run() { # RELEASE PLAN TIMEOUT
  local release=$1 plan=$2 timeout=$3 dir=$CNI_VM_CACHE/$1 out rc=0 smp mem path n=0 shares=()
  out=$(mktemp -d /tmp/cni-vm.XXXXXX)
  cp "$(dirname "${BASH_SOURCE[0]}")/../vm/guest.sh" "$out/guest"
  cp "$plan" "$out/plan"
  echo "$release" >"$out/release"
  realpath "$CNI_VM_CACHE" >"$out/cache"
  if [[ -n $VM_ENV ]]; then cp "$VM_ENV" "$out/env"; else : >"$out/env"; fi
  # Each share read-only under its own tag (QEMU's option syntax doubles a comma); the guest mounts them in
  # this order (outermost first), listed as TAG<TAB>PATH.
  : >"$out/shares"
  while IFS= read -r path; do
    n=$((n + 1))
    shares+=(-fsdev "local,id=share$n,path=${path//,/,,},security_model=none,readonly=on,multidevs=remap"
      -device "virtio-9p-pci,fsdev=share$n,mount_tag=share$n")
    printf 'share%s\t%s\n' "$n" "$path" >>"$out/shares"
  done < <(vm_share_roots)
  smp=${CNI_VM_CPUS:-$(nproc)}
  mem=${CNI_VM_MEMORY:-4096}
  # -no-reboot: a guest panic (panic=-1 reboots) ends QEMU instead of looping; the result file is then missing.
  # VM_TCG_THREAD=single: one host thread runs every vCPU in turn (slower; no cross-vCPU code-patching race).
  timeout -k 10 "$timeout" qemu-system-x86_64 -machine pc -accel "tcg,thread=${VM_TCG_THREAD:-multi}" -cpu max \
    -smp "$smp" -m "$mem" \
    -nodefaults -no-user-config -display none -no-reboot \
    -chardev stdio,id=console,signal=off -serial chardev:console -monitor none \
    -kernel "$dir/vmlinux" -initrd "$dir/initramfs.cpio" \
    -append "console=ttyS0 panic=-1 quiet loglevel=3 rdinit=/init" \
    -fsdev local,id=hostroot,path=/,security_model=none,readonly=on,multidevs=remap \
    -device virtio-9p-pci,fsdev=hostroot,mount_tag=hostroot \
    -fsdev local,id=out,path="$out",security_model=none \
    -device virtio-9p-pci,fsdev=out,mount_tag=out "${shares[@]}" </dev/null || rc=$?
  if [[ $rc == 124 || $rc == 137 ]]; then
    vm_log "the guest ($release) ran past ${timeout}s and was killed"
    rm -rf "$out"
    return 124
  fi
  if [[ ! -s $out/status ]]; then
    vm_log "the guest ($release) stopped without a result (qemu exit $rc; a kernel panic or a crash of its init)"
    rm -rf "$out"
    return 125
  fi
  rc=$(cat "$out/status")
  rm -rf "$out"
  return "$rc"
}
