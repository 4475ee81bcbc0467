# The binaries cni-rs ships, derived from the workspace itself (cargo metadata), so that a new crate under
# plugins/ or ipam/ joins scripts/install.sh, scripts/package.sh and the installer image with no edit here.
# Source this file; it defines functions only.

# The workspace crates under plugins/ and ipam/ that have a bin target, as cargo metadata's package objects.
cni_plugin_crates() {
  local root
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
  cargo metadata --no-deps --format-version 1 --offline --manifest-path "$root/Cargo.toml" |
    jq -c --arg root "$root/" '.packages[]
      | select(.manifest_path | ltrimstr($root) | test("^(plugins|ipam)/"))
      | select(any(.targets[]; .kind | index("bin")))'
}

# The CNI plugins: the bin targets of those crates, one per line.
cni_plugin_binaries() {
  cni_plugin_crates | jq -r '.targets[] | select(.kind | index("bin")) | .name' | sort
}

# The cargo packages (-p NAME) that build those binaries, one per line.
cni_plugin_packages() {
  cni_plugin_crates | jq -r '.name' | sort
}

# The tools beside the plugins: the runner, the node agents (fabricd, the NetworkPolicy agent cni-netpol) and
# the installer image's entrypoint.
CNI_TOOL_BINARIES=(cnitool fabricd cni-netpol cni-installer)

# Release builds. A CNI plugin is a fresh process on every call, so its start-up is part of every ADD and DEL:
# the plugins, cnitool and the installer are static musl executables, which start in well under half the time
# of the same code linked dynamically against glibc (no loader, no shared libraries to map and relocate;
# docs/benchmarks.md, "Start-up"). fabricd and cni-netpol, the long-running agents, are built for the host
# (glibc's allocator, a start-up they pay once).
CNI_STATIC_TARGET=$(uname -m)-unknown-linux-musl
# Where cni_build_release puts everything it built, side by side (relative to the workspace root).
CNI_STAGE_DIR=target/stage

# True when the static target's standard library is installed (scripts/setup.sh adds it with rustup).
cni_static_target_installed() {
  local libdir
  libdir=$(rustc --print target-libdir --target "$CNI_STATIC_TARGET" 2>/dev/null) && [[ -d $libdir ]]
}

# Builds the shipped binaries in release mode and links them into $CNI_STAGE_DIR: the plugins and cnitool, and
# with `all` also the installer and the node agents (fabricd, cni-netpol). Without the static target (a
# machine that skipped setup.sh) the plugins are built for the host, with a warning; under CI=true that is an
# error.
#   cni_build_release plugins|all
cni_build_release() {
  local what=${1:?cni_build_release plugins|all} root packages=() static=() p b
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
  while read -r p; do packages+=(-p "$p"); done < <(cni_plugin_packages)
  packages+=(-p cnitool)
  [[ $what == all ]] && packages+=(-p installer)
  local static_dir=$root/target/$CNI_STATIC_TARGET/release
  if cni_static_target_installed; then
    static=(--target "$CNI_STATIC_TARGET")
  elif [[ ${CI:-} == true ]]; then
    echo "build: the $CNI_STATIC_TARGET target is not installed: run scripts/setup.sh" >&2
    return 1
  else
    echo "build: the $CNI_STATIC_TARGET target is not installed (scripts/setup.sh adds it): building the plugins for the host" >&2
    static_dir=$root/target/release
  fi
  (cd "$root" && cargo build --release --quiet "${static[@]}" "${packages[@]}")
  [[ $what == all ]] && (cd "$root" && cargo build --release --quiet -p fabricd -p netpol)
  mkdir -p "$root/$CNI_STAGE_DIR"
  local bins
  mapfile -t bins < <(cni_plugin_binaries)
  bins+=(cnitool)
  [[ $what == all ]] && bins+=(cni-installer)
  for b in "${bins[@]}"; do ln -f "$static_dir/$b" "$root/$CNI_STAGE_DIR/$b"; done
  if [[ $what == all ]]; then
    for b in fabricd cni-netpol; do ln -f "$root/target/release/$b" "$root/$CNI_STAGE_DIR/$b"; done
  fi
  return 0
}
