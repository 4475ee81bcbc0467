#!/usr/bin/env bash
# The VM lane: the kernel-sensitive test suites run inside QEMU (TCG) on Debian's stock kernels, against the
# guest's kernel, with the host's binaries (read-only over virtio-9p). scripts/test.sh runs the matrix below;
# run it alone as root:
#
#   scripts/vm-lane.sh                          # the whole matrix (every kernel, its suites)
#   scripts/vm-lane.sh --kernel 6.1             # one kernel's suites
#   scripts/vm-lane.sh --kernel 6.12 vlan ipvlan:l3s   # chosen files of netns-tests (FILE[:A,B] or FILE:!A,B)
#   scripts/vm-lane.sh --fetch                  # only fetch and prepare the kernels (scripts/setup.sh does)
#   scripts/vm-lane.sh --shell --kernel 6.1     # a guest running `bash -i` on this terminal, to look around
#
# Each kernel boots once and runs its suites one after another; the lane fails if a suite fails, a guest stops
# without a result, or a guest runs past its time (--timeout SECONDS per boot, default 2400: then it is killed and
# says so). Nothing is mounted or left running on the host: QEMU is the only process, its shares are a read-only
# view of /, a temporary result folder and, read-only at their own paths, the checkout, the Cargo target directory
# and the kernel cache where the guest's tmpfs would hide them (below /tmp, /run, /var/lib/cni or /dev/shm). A
# location the guest cannot show (/tmp itself, /proc, /sys, /dev, /run/vm) is refused before booting. In the guest
# CNI_TEST_KERNEL_LANE=1 turns a test's "skipped: this kernel has no <kind>" into a failure: every kind the lane's
# kernels have must run. The summary counts a suite that never ran (its guest died or stopped first) as failed.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/vm.sh

# The matrix: the test files of netns-tests each kernel runs (FILE or FILE:FILTER).
# 6.1 (Debian 12): the link kinds this machine's kernel lacks, then the kernel-sensitive suites.
# 6.12 (Debian 13's series): the link kinds, the kernel's refusals, the tunnels (ipip, wireguard), SCTP and the
# local cluster's cgroups on v2 (the guests mount only cgroup2). The veth plugins (ptp, bridge), tuning, bandwidth,
# portmap and the nftables paths run on 6.1 and natively on this machine's newer kernel; on 6.12 as well they cost
# about 8 minutes of emulation (measured 2026-11-28) in a test command that must stay under its time.
# The fabric's data-plane tests (host-gw, vxlan, dual stack, IPv6 only) run in the lane; its store tests (etcd
# transactions, compaction, TLS, hostile leases) do not depend on the kernel and stay on the host.
# firewall's firewalld test stays on the host: firewalld (Python) under emulation misses D-Bus's 25 s reply
# timeout, and what it exercises is firewalld's D-Bus API, not the kernel.
declare -A MATRIX=(
  [6.1]='ipvlan vlan vrf dummy bridge_vlan kernel_refusals ptp macvlan bridge tuning bandwidth portmap nfnl firewall:!firewalld
    fabric:host_gw_on_one_l2,vxlan_across_routed_segments fabric_dual:!turning_ipv6_on fabric_ipip fabric_wireguard netpol_sctp'
  [6.12]='ipvlan vlan vrf dummy bridge_vlan kernel_refusals macvlan cluster_cgroups fabric_ipip fabric_wireguard netpol_sctp'
)
ORDER=(6.1 6.12)

kernels=() suites=() fetch_only=0 shell=0 timeout=${CNI_VM_TIMEOUT:-2400}
while (($#)); do
  case $1 in
    --kernel) kernels+=("$2"); shift 2 ;;
    --kernel=*) kernels+=("${1#*=}"); shift ;;
    --timeout) timeout=$2; shift 2 ;;
    --fetch) fetch_only=1; shift ;;
    --shell) shell=1; shift ;;
    -h | --help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "vm-lane: unknown option $1" >&2; exit 2 ;;
    *) suites+=("$1"); shift ;;
  esac
done
((${#kernels[@]})) || kernels=("${ORDER[@]}")
[[ $(id -u) == 0 ]] || { echo "vm-lane: run as root (the guest's tests need it, and so does the fetch)" >&2; exit 1; }
for tool in qemu-system-x86_64 depmod modprobe busybox jq; do
  command -v "$tool" >/dev/null || { echo "vm-lane: $tool is missing: run scripts/setup.sh" >&2; exit 1; }
done

work=$(mktemp -d /tmp/cni-vm-lane.XXXXXX)
trap 'rm -rf "$work"' EXIT
# What the guest must see at the host's paths, checked before anything is fetched, built or booted: the checkout
# (the tests run in netns-tests/), the target directory (the test executables and the binaries they run), the
# kernel cache (modules) and paths passed in CNI_* variables.
if ((!fetch_only)); then
  checkout=$(pwd -P)
  target=$(cargo metadata --no-deps --format-version 1 | jq -r .target_directory)
  vm_share "the checkout" "$checkout" && vm_share "the Cargo target directory" "$target" &&
    vm_share "the kernel cache (CNI_VM_CACHE)" "$CNI_VM_CACHE" && vm_forward_env "$work" || exit 1
fi

declare -A release
for k in "${kernels[@]}"; do
  [[ -n ${MATRIX[$k]:-} ]] || { echo "vm-lane: unknown kernel $k (known: ${ORDER[*]})" >&2; exit 2; }
  release[$k]=$(vm_fetch "$k")
done
((fetch_only)) && exit 0

plan=$work/plan log=$work/log
: >"$log"

if ((shell)); then
  echo 'exec bash -i </dev/console >/dev/console 2>&1' >"$plan"
  vm_run "${release[${kernels[0]}]}" "$plan" 86400
  exit $?
fi

# The test executables, built once for every kernel (the plugins they run are the workspace's debug binaries).
features=(--features cnicore/failpoints)
all=()
for k in "${kernels[@]}"; do
  # shellcheck disable=SC2206
  ((${#suites[@]})) && all+=("${suites[@]}") || all+=(${MATRIX[$k]})
done
declare -A files=()
for s in "${all[@]}"; do files[${s%%:*}]=1; done
test_args=()
for f in "${!files[@]}"; do test_args+=(--test "$f"); done
cargo build --workspace --bins --quiet "${features[@]}"
declare -A exe=()
# At their real paths: the guest resolves no symlink hidden below its scratch.
while IFS=$'\t' read -r name path; do exe[$name]=$(realpath "$path"); done < <(
  cargo test -p netns-tests --no-run --quiet --message-format=json "${features[@]}" "${test_args[@]}" |
    jq -r 'select(.reason == "compiler-artifact" and .executable != null and .profile.test) |
      [.target.name, .executable] | @tsv'
)

# The guest's script for suites "$@": each suite's result as one line the host counts.
write_plan() {
  {
    echo 'export CNI_TEST_KERNEL_LANE=1'
    # The rig's waits (netns_tests::scaled) stretched: etcd and fabricd answer several times slower emulated.
    echo 'export CNI_TEST_TIME_SCALE=4'
    echo 'failed=()'
    # The Kubernetes suites' nodes write below /etc, /opt, /var/lib, /var/log and /var/tmp: writable overlays first.
    if printf '%s\n' "$@" | grep -q '^k8s'; then
      printf 'bash %q || exit 1\n' "$checkout/scripts/vm/writable.sh"
    fi
    local s file filter names n path
    for s in "$@"; do
      file=${s%%:*} filter=()
      # FILE:A,B runs the tests whose name contains A or B; FILE:!A,B all but those.
      if [[ $s == *:!* ]]; then
        IFS=, read -ra names <<<"${s#*:!}"
        for n in "${names[@]}"; do filter+=(--skip "$n"); done
      elif [[ $s == *:* ]]; then
        IFS=, read -ra filter <<<"${s#*:}"
      fi
      path=${exe[$file]:?no test executable for $file}
      printf 'echo "vm-lane: == %s on $(uname -r)"\n' "$s"
      printf 'if cd %q && %q --test-threads=2 --color=never' "$checkout/netns-tests" "$path"
      ((${#filter[@]})) && printf ' %q' "${filter[@]}"
      # The suite's result, one line the host counts (a suite without one never ran).
      printf '; then echo %q; else echo %q; failed+=(%q); fi\n' \
        "vm-lane: suite $s: passed" "vm-lane: suite $s: failed" "$s"
    done
    echo '((${#failed[@]})) && { echo "vm-lane: failed on $(uname -r): ${failed[*]}"; exit 1; }'
    echo 'exit 0'
  } >"$plan"
}

# The suites of "$@" that have no result line in $results (the console ends its lines with CR: removed).
without_result() {
  local s
  for s in "$@"; do
    grep -qxF "vm-lane: suite $s: passed" <<<"$results" || grep -qxF "vm-lane: suite $s: failed" <<<"$results" ||
      echo "$s"
  done
}

failed=() suites_passed=0 suites_failed=0 suites_missing=0
for k in "${kernels[@]}"; do
  # shellcheck disable=SC2206
  ((${#suites[@]})) && run=("${suites[@]}") || run=(${MATRIX[$k]})
  started=$SECONDS results='' todo=("${run[@]}")
  for attempt in 1 2 3; do
    write_plan "${todo[@]}"
    echo "vm-lane: booting ${release[$k]} for: ${todo[*]}"
    guest_log=$work/guest-log
    set +e
    # Boots after a crash run single-threaded TCG, which has no such race (cluster_cgroups' cpuset delegation
    # on 6.12 crashed three boots in a row under multi-threaded TCG on 2026-11-28).
    tcg=multi
    ((attempt == 1)) || tcg=single
    VM_TCG_THREAD=$tcg vm_run "${release[$k]}" "$plan" "$timeout" | tee "$guest_log"
    rc=${PIPESTATUS[0]}
    set -e
    cat "$guest_log" >>"$log"
    results+=$(tr -d '\r' <"$guest_log")$'\n'
    rm -f "$guest_log"
    # A guest kernel that dies (an Oops under emulation, int3 at a static branch being patched while the other
    # vCPU ran it, a known hazard of multi-threaded TCG: on 6.12 about once in 20 boots until 2026-11-27, then 2 of
    # 3 boots on 2026-11-28, once at boot and once in netif_rx_internal) is booted again, up to twice, for the
    # suites that have no result yet (the one it died in among them), never for those done; its log above says
    # what happened. Test failures and timeouts are never retried.
    if ((rc == 125 && attempt < 3)); then
      mapfile -t todo < <(without_result "${run[@]}")
      echo "vm-lane: ${release[$k]} died without a result (an emulation crash, see above): booting it again" \
        "(single-threaded TCG) for ${todo[*]}"
      continue
    fi
    break
  done
  # The suites by their result lines over every boot; the rest never ran.
  missing=()
  for s in "${run[@]}"; do
    if grep -qxF "vm-lane: suite $s: passed" <<<"$results"; then
      suites_passed=$((suites_passed + 1))
    elif grep -qxF "vm-lane: suite $s: failed" <<<"$results"; then
      suites_failed=$((suites_failed + 1))
      ((rc)) || rc=1
    else
      missing+=("$s")
    fi
  done
  suites_missing=$((suites_missing + ${#missing[@]}))
  ((${#missing[@]} == 0)) || { echo "vm-lane: ${release[$k]}: never ran: ${missing[*]}"; ((rc)) || rc=1; }
  if ((rc == 0)); then
    echo "vm-lane: ${release[$k]}: all passed in $((SECONDS - started)) s"
  else
    echo "vm-lane: ${release[$k]}: FAILED after $((SECONDS - started)) s"
    failed+=("$k")
  fi
done
# The guests' test counts, summed from libtest's closing lines; a suite that never ran counts as a failed suite.
read -r passed failed_tests < <(sed -n 's/^test result: [A-Za-z]*\. \([0-9]*\) passed; \([0-9]*\) failed.*/\1 \2/p' "$log" |
  awk '{p += $1; f += $2} END {print p + 0, f + 0}')
echo "vm-lane: suites: ${suites_passed} passed, $((suites_failed + suites_missing)) failed" \
  "(${suites_missing} never ran); tests: ${passed} passed, ${failed_tests} failed"
((${#failed[@]} == 0)) || { echo "vm-lane: failed on ${failed[*]}" >&2; exit 1; }
