#!/usr/bin/env bash
# Runs every cargo-fuzz target of fuzz/ (see fuzz/README.md).
#
#   scripts/fuzz.sh [SECONDS]            each target for SECONDS (default 60)
#   scripts/fuzz.sh --short              each target for 10 s (the test suite's run, about a minute plus the build)
#   scripts/fuzz.sh --replay TARGET FILE run one input again (e.g. a crash from fuzz/artifacts/TARGET/)
#
# A crash, a hang (-timeout), or an allocation beyond the limits (-rss_limit_mb, -malloc_limit_mb) fails the
# run; the input is kept in fuzz/artifacts/<target>/. Exit status: 0 when every target ran clean.
#
# Toolchain: cargo-fuzz builds with nightly-only rustc flags (-Zsanitizer=address, SanitizerCoverage). Only stable
# Rust is installed here, so RUSTC_BOOTSTRAP=1 lets the stable compiler accept them. cargo-fuzz itself is
# installed from crates.io when missing (`cargo install cargo-fuzz --locked`, about 1.5 min on 2 cores).
set -euo pipefail

cd "$(dirname "$0")/.."
export RUSTC_BOOTSTRAP=1

TARGETS=(entry_point env cni_args result cache_file firewall)
seconds=60
replay=()
case "${1:-}" in
    --short) seconds=10 ;;
    --replay)
        [[ $# -eq 3 ]] || { echo "usage: $0 --replay TARGET FILE" >&2; exit 2; }
        replay=("$2" "$3")
        ;;
    -h | --help) sed -n '2,14p' "$0"; exit 0 ;;
    "") ;;
    *)
        [[ "$1" =~ ^[0-9]+$ && "$1" -gt 0 ]] || { echo "usage: $0 [SECONDS | --short | --replay TARGET FILE]" >&2; exit 2; }
        seconds=$1
        ;;
esac

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "== installing cargo-fuzz (cargo install cargo-fuzz --locked)"
    cargo install cargo-fuzz --locked
fi

# -a: debug assertions and overflow checks on, so an arithmetic overflow on hostile input is a crash.
BUILD_FLAGS=(-a)
# Per input: 10 s is a hang; 2 GiB of RSS (ASan's own overhead is ~0.5 GiB) or one allocation of 256 MiB is
# unbounded allocation (inputs are at most 64 KiB).
LIMITS=(-timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=256 -max_len=65536 -dict="$PWD/fuzz/cni.dict" -print_final_stats=1)

echo "== building the fuzz targets"
cargo fuzz build "${BUILD_FLAGS[@]}"
# The built binaries are run directly: `cargo fuzz run` would rebuild first whenever the tree changed meanwhile.
bin_dir=fuzz/target/$(rustc -vV | sed -n 's/^host: //p')/release

if [[ ${#replay[@]} -eq 2 ]]; then
    exec "$bin_dir/${replay[0]}" "${LIMITS[@]}" "${replay[1]}"
fi

failed=()
for target in "${TARGETS[@]}"; do
    corpus=$PWD/fuzz/corpus/$target
    artifacts=$PWD/fuzz/artifacts/$target
    mkdir -p "$corpus" "$artifacts"
    dirs=("$corpus")
    [[ -d fuzz/seeds/$target ]] && dirs+=("$PWD/fuzz/seeds/$target")
    echo "== $target: ${seconds}s"
    log=$(mktemp)
    # The outer timeout only guards against libFuzzer itself not stopping; -max_total_time ends the run.
    if timeout $((seconds + 120)) "$bin_dir/$target" -max_total_time="$seconds" "${LIMITS[@]}" \
        -artifact_prefix="$artifacts/" "${dirs[@]}" >"$log" 2>&1; then
        grep -E '^Done|stat::number_of_executed_units|stat::peak_rss_mb' "$log" | tr -s ' \n' ' '
        echo
    else
        failed+=("$target")
        tail -n 60 "$log"
        echo "!! $target FAILED: input kept in fuzz/artifacts/$target/ (replay: $0 --replay $target <file>)"
    fi
    rm -f "$log"
done

if [[ ${#failed[@]} -gt 0 ]]; then
    echo "fuzzing failed: ${failed[*]}"
    exit 1
fi
echo "fuzzing: ${#TARGETS[@]} targets clean (${seconds}s each)"
