# The binaries cni-rs ships, derived from the workspace itself (cargo metadata), so that a new crate under
# plugins/ or ipam/ joins scripts/install.sh, scripts/package.sh and the installer image with no edit here.
# Source this file; it defines functions only.

# The CNI plugins: the bin targets of the workspace crates under plugins/ and ipam/, one per line.
cni_plugin_binaries() {
  local root
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
  cargo metadata --no-deps --format-version 1 --offline --manifest-path "$root/Cargo.toml" |
    jq -r --arg root "$root/" '.packages[]
      | select(.manifest_path | ltrimstr($root) | test("^(plugins|ipam)/"))
      | .targets[] | select(.kind | index("bin")) | .name' | sort
}

# The cargo packages (-p NAME) that build those binaries, one per line.
cni_plugin_packages() {
  local root
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
  cargo metadata --no-deps --format-version 1 --offline --manifest-path "$root/Cargo.toml" |
    jq -r --arg root "$root/" '.packages[]
      | select(.manifest_path | ltrimstr($root) | test("^(plugins|ipam)/"))
      | select(any(.targets[]; .kind | index("bin"))) | .name' | sort
}

# The tools beside the plugins: the runner, the node agent and the installer image's entrypoint.
CNI_TOOL_BINARIES=(cnitool fabricd cni-installer)
CNI_TOOL_PACKAGES=(cnitool fabricd installer)
