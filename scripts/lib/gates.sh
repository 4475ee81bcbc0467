#!/usr/bin/env bash
# Code-health gates: fast checks over the source text (no build; about a second), run by scripts/test.sh before
# it builds anything and runnable alone: scripts/lib/gates.sh. Each failure says what to do. They keep what
# issue 30 fixed from coming back:
#   1. typed errors: no stringly errors in product code (scripts/lib/stringly.awk says what counts);
#   2. no source, test or script file over 1,000 lines;
#   3. no import circle between the modules of a crate (scripts/lib/circles.awk says what counts);
#   4. every public module of a library crate, and every module of a binary's main.rs, is named in its crate
#      doc (the map a newcomer reads first);
#   5. product code speaks netlink and runs no shell: no `ip`, `tc`, `nft`, `iptables` or `sh` processes
#      (cnicore::firewall::exec runs the iptables binaries the config names, by path, with no shell);
#   6. a plugin's stdout is the runtime's: only cnicore's entry point writes to it (the result or the error
#      object), so no print!/println!/stdout() in plugins/ and ipam/;
#   7. no product function over 70 lines (scripts/lib/fn-lengths.awk says how they are counted): the long ones
#      of fabricd, made named steps in issue 36, had grown back while nothing checked them; and no shell function
#      over 70 lines in scripts/ (scripts/lib/sh-fn-lengths.awk): cluster.sh's `up` had grown to 73.
# Product code is every crate's src/ except the test rig (netns-tests/, with its cri-client) and fuzz/, minus
# #[cfg(test)] items: tests may build strings, shell out and inspect with `ip`.
set -uo pipefail
cd "$(dirname "$0")/../.."
lib=scripts/lib
MAX_LINES=1000
MAX_FN_LINES=70
failed=0
fail() {
  echo "gates: $1" >&2
  sed 's/^/  /' >&2
  failed=1
}

# Every crate of the workspace (a directory with Cargo.toml and src/), and the product ones.
mapfile -t crates < <(find . -path ./target -prune -o -path '*/target' -prune -o -name Cargo.toml -print |
  sed 's|^\./||; s|/\?Cargo.toml$||; s|^$|.|' | while read -r c; do [[ -d $c/src ]] && echo "$c"; done | sort)
product_crates=()
for c in "${crates[@]}"; do
  [[ $c == netns-tests* || $c == fuzz* ]] || product_crates+=("$c")
done
rust_files() { find "$@" -name '*.rs' -type f | sort; }
product=$(mktemp)
trap 'rm -f "$product"' EXIT
mapfile -t product_files < <(for c in "${product_crates[@]}"; do rust_files "$c/src"; done)
awk -f $lib/product-lines.awk "${product_files[@]}" >"$product"

# 1. Stringly errors.
hits=$(awk -f $lib/stringly.awk "$product")
[[ -z $hits ]] || fail "stringly errors in product code: give the error a type (cnicore::Error or the crate's
  error enum, with the context as fields or in its message) and convert with From or a named map_err" <<<"$hits"

# 2. Long files.
long=$(find . \( -path ./target -o -path '*/target' -o -path ./.git \) -prune -o -type f \( -name '*.rs' -o -name '*.sh' \) \
  -print0 | xargs -0 wc -l | awk -v max=$MAX_LINES '$2 != "total" && $1 > max { print $2 ": " $1 " lines" }' | sort)
[[ -z $long ]] || fail "files over $MAX_LINES lines: split them by theme (tests: one file per theme with the shared
  helpers in the rig crate netns-tests/src; code: one module per idea)" <<<"$long"

# 3. Import circles, in every crate (the test rig's too).
roots=()
for c in "${crates[@]}"; do
  for r in "$c/src/lib.rs" "$c/src/main.rs" "$c"/src/bin/*.rs; do [[ -f $r ]] && roots+=("${r#./}"); done
done
circles=$(for c in "${crates[@]}"; do rust_files "$c/src"; done | sed 's|^\./||' | xargs awk -f $lib/product-lines.awk |
  awk -v roots="${roots[*]}" -f $lib/circles.awk)
[[ -z $circles ]] || fail "import circles between modules: move what both sides use into a module of its own below
  them (a parent that calls its children keeps nothing they import back from it)" <<<"$circles"

# 4. Library crates name every public module in their crate doc, binaries every module of main.rs.
undocumented=$(for c in "${crates[@]}"; do
  for root in "$c/src/lib.rs" "$c/src/main.rs"; do
    [[ -f $root ]] || continue
    doc=$(grep '^//!' "$root")
    modules='s/^pub mod \([a-z_0-9]*\);.*/\1/p'
    [[ $root == */main.rs ]] && modules='s/^\(pub \)\{0,1\}mod \([a-z_0-9]*\);.*/\2/p'
    sed -n "$modules" "$root" | while read -r m; do
      grep -qF "[\`$m\`]" <<<"$doc" || echo "${root#./}: $m"
    done
  done
done)
[[ -z $undocumented ]] || fail "modules missing from their crate doc: say in a line of the //! doc at the top of
  lib.rs (its public modules) or main.rs (all of its modules) what [\`module\`] is for" <<<"$undocumented"

# 5. No tool processes and no shell in product code.
processes=$(grep -E 'Command::new\("(ip|tc|nft|iptables|ip6tables|bridge|ethtool|sysctl|sh|bash)"' "$product")
[[ -z $processes ]] || fail "product code runs a tool or a shell: use cnicore's netlink layer (cnicore::netlink,
  cnicore::tc, cnicore::firewall::nfnl), cnicore::sysctl, and Command with arguments, never sh -c" <<<"$processes"

# 6. Plugins write nothing to stdout themselves.
printing=$(grep -E '^(plugins|ipam)/' "$product" | grep -E '(^|[^a-z_])(print!|println!|std::io::stdout\(\)|io::stdout\(\))')
[[ -z $printing ]] || fail "a plugin writes to stdout, which is the runtime's (the result or the error object): use
  cnicore::warn! or eprintln! for messages" <<<"$printing"

# 7. Long functions (test modules kept in their own files, `*tests.rs`, are tests).
long_fns=$(grep -v -E '^[^:]*tests\.rs:' "$product" | awk -f $lib/fn-lengths.awk |
  awk -v max=$MAX_FN_LINES '{ n = $(NF - 1) } n > max')
[[ -z $long_fns ]] || fail "functions over $MAX_FN_LINES lines: make them named steps (a function per step, named for
  what it does, as fabricd's acquire and cleanup are)" <<<"$long_fns"

long_sh=$(find scripts -name '*.sh' -type f -print0 | sort -z | xargs -0 awk -f $lib/sh-fn-lengths.awk |
  awk -v max=$MAX_FN_LINES '{ n = $(NF - 1) } n > max')
[[ -z $long_sh ]] || fail "shell functions over $MAX_FN_LINES lines: make them named steps (parse, check, make, as
  cluster.sh's up is)" <<<"$long_sh"

if [[ $failed == 0 ]]; then echo "gates: ok"; fi
exit $failed
