#!/usr/bin/env bash
# Long churn: the workload of netns-tests/tests/churn.rs (8 workers adding and deleting pods with the full
# kubenet chain, port mappings and bandwidth, through our cnitool) for CYCLES cycles per conflist, then the check
# that the node holds nothing of any pod and that no address was ever given to two live pods.
#
#   scripts/churn.sh [CYCLES] [iptables|nftables|all]     default: 10000 cycles, all (each conflist on its own node)
#
# Environment: CHURN_WORKERS (default 8). Needs root (network namespaces); touches only namespaces it makes.
# At about 15 cycles/s per conflist on 2 cores, 10000 cycles of both take about 20 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."

cycles=${1:-10000}
which=${2:-all}
[[ $cycles =~ ^[0-9]+$ ]] || { echo "usage: $0 [CYCLES] [iptables|nftables|all]" >&2; exit 2; }
case "$which" in
    iptables | nftables) filter=(churn_"$which" --exact) ;;
    all) filter=(churn_) ;;
    *) echo "usage: $0 [CYCLES] [iptables|nftables|all]" >&2; exit 2 ;;
esac
[[ $(id -u) == 0 ]] || { echo "churn: needs root (network namespaces, iptables, tc)" >&2; exit 1; }

# The same features as scripts/test.sh, so that both share one build.
features=(--features cnicore/failpoints)
cargo build --workspace --bins --quiet "${features[@]}"
CHURN_CYCLES=$cycles cargo test -p netns-tests --test churn --quiet "${features[@]}" -- --nocapture "${filter[@]}"
