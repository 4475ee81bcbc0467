#!/usr/bin/env bash
# The VM lane run from a checkout and a Cargo target directory below /tmp, which the guest mounts its own tmpfs
# over (issue 38): one boot of 6.1 running netns-tests' `dummy` suite (a link kind this machine's kernel lacks, so
# it runs only in the guest), which must pass with both directories mounted in the guest; and a target directory
# the guest cannot show (/tmp itself) refused before anything is built or booted. scripts/test.sh runs it before
# the lane's matrix: 30-50 s measured on this 2-core machine while busy (load 8). Run it as root:
#
#   scripts/vm/from-tmp.sh                  # the checkout and the target directory below /tmp
#   scripts/vm/from-tmp.sh /run /dev/shm    # the checkout below /run, the target directory below /dev/shm
#
# The checkout is a copy of this working tree (its tracked and untracked files, modification times kept) and the
# target directory is this checkout's, bind-mounted there in a private mount namespace that ends with the run
# (nothing is mounted on the host). So cargo finds every artifact up to date and builds nothing: a clone's
# fresh modification times would rebuild the workspace's crates into the shared target directory with the
# clone's paths compiled in (CARGO_MANIFEST_DIR), which this checkout's later builds would take as up to date.
set -euo pipefail
cd "$(dirname "$0")/../.."
[[ $(id -u) == 0 ]] || { echo "from-tmp: run as root (the VM lane needs it)" >&2; exit 1; }
suite=dummy kernel=6.1 checkout_base=${1:-/tmp}
target_base=${2:-$checkout_base}
features=(--features cnicore/failpoints)
# What the lane will ask cargo for, up to date here first (nothing to do after scripts/test.sh's builds).
cargo build --workspace --bins --quiet "${features[@]}"
cargo test -p netns-tests --no-run --quiet "${features[@]}" --test "$suite"
target=$(cargo metadata --no-deps --format-version 1 | jq -r .target_directory)

tmp=$(mktemp -d "$checkout_base/cni-rs-from-tmp.XXXXXX")
tmp_target=$(mktemp -d "$target_base/cni-rs-from-tmp-target.XXXXXX")
# rmdir: the target directory's mount point is empty here (the bind mount lives in the namespace below).
trap 'rm -rf "$tmp"; rmdir "$tmp_target"' EXIT
mkdir "$tmp/cni-rs"
git rev-parse --is-inside-work-tree >/dev/null || { echo "from-tmp: copies a git checkout: run it in one" >&2; exit 1; }
git ls-files -z --cached --others --exclude-standard |
  while IFS= read -r -d '' f; do [[ -e $f ]] && printf '%s\0' "$f"; done |
  tar --null -T - -cf - | tar -xf - -C "$tmp/cni-rs"

fail() { echo "from-tmp: $*" >&2; exit 1; }

# A target directory that is /tmp itself: refused before building or booting, naming the path and what to do.
out=$(cd "$tmp/cni-rs" && CARGO_TARGET_DIR=/tmp scripts/vm-lane.sh --kernel "$kernel" "$suite" 2>&1) &&
  fail "the lane accepted /tmp itself as target directory: $out"
echo "$out"
grep -q 'the Cargo target directory (/tmp) would need /tmp itself shared.*use a directory below it' <<<"$out" ||
  fail "no refusal naming the target directory /tmp and what to do"
! grep -q 'booting' <<<"$out" || fail "the lane booted before refusing /tmp"

# The checkout and the target directory below the guest's scratch: the guest mounts both and the suite passes.
started=$SECONDS
log=$tmp/lane.log
touch "$tmp/before-lane"
rc=0
unshare --mount --propagation private bash -c 'mount --bind "$1" "$2" && cd "$3/cni-rs" &&
  CARGO_TARGET_DIR=$2 scripts/vm-lane.sh --kernel "$4" "$5"' _ "$target" "$tmp_target" "$tmp" "$kernel" "$suite" |
  tee "$log" || rc=$?
# Had cargo rebuilt anything from the copy (a file changed meanwhile), this checkout would take those artifacts,
# with the copy's paths in them, as up to date: their fingerprints go, so its next build makes them again.
rebuilt=$(find "$target/debug/.fingerprint" -mindepth 2 -newer "$tmp/before-lane" -printf '%h\n' | sort -u)
if [[ -n $rebuilt ]]; then
  xargs -d '\n' rm -rf <<<"$rebuilt"
  fail "cargo rebuilt $(wc -l <<<"$rebuilt") units from the copy (did a file change during the run?): their" \
    "fingerprints are removed so this checkout rebuilds them; run again"
fi
((rc == 0)) || fail "the lane failed from $tmp/cni-rs with its target directory $tmp_target (output above)"
for dir in "$tmp/cni-rs" "$tmp_target"; do
  grep -qF "vm-lane: the host's $dir mounted in the guest" "$log" || fail "the guest did not mount $dir"
done
grep -qF "vm-lane: suite $suite: passed" "$log" || fail "no passed result for $suite"
echo "from-tmp: the lane from $tmp/cni-rs with its target directory $tmp_target passed in $((SECONDS - started)) s"
