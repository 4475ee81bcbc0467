#!/usr/bin/env bash
# The cloud's route controller: on a kubenet cluster every node (and the control plane) has a route to each other
# node's podCIDRs via that node's underlay address, as a cloud route table gives them; on a flannel cluster only
# the control plane, which is no node and runs no flannel. Polls the Node objects every
# second, adds what is missing, and removes routes of its own (protocol 199) that no Node wants any more.
#   routes.sh CLUSTER-DIR
# Run by scripts/cluster.sh as one of the cluster's processes; it changes only the cluster's namespaces.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
kc_set_name "$(basename "$1")"
KC_DIR=$1
PROTO=199

# "node podCIDR internalIP" lines: each podCIDR with the node's InternalIP of the same family.
wanted() {
  kc_kubectl get nodes -o jsonpath='{range .items[*]}{.metadata.name}{"|"}{.spec.podCIDRs}{"|"}{range .status.addresses[?(@.type=="InternalIP")]}{.address}{" "}{end}{"\n"}{end}' |
    while IFS='|' read -r name cidrs ips; do
      cidrs=${cidrs//[\[\]\"]/}
      for cidr in ${cidrs//,/ }; do
        for ip in $ips; do
          [[ ($cidr == *:* && $ip == *:*) || ($cidr != *:* && $ip != *:*) ]] && echo "$name $cidr $ip"
        done
      done
    done
}

sync_namespace() { # NETNS SELF WANTED-FILE
  local ns=$1 self=$2 name cidr ip family have
  declare -A keep=()
  while read -r name cidr ip; do
    [[ $name == "$self" ]] && continue
    keep[$cidr]=1
    # A refusal is logged (the controller's log, logs/routes.log) and tried again on the next pass.
    ip -n "$ns" route replace "$cidr" via "$ip" proto $PROTO 2>&1 | sed "s|^|$ns: route $cidr via $ip: |" >&2
  done <"$3"
  for family in -4 -6; do
    while read -r have _; do
      [[ -n $have && -z ${keep[$have]:-} ]] &&
        ip -n "$ns" "$family" route del "$have" proto $PROTO 2>&1 | sed "s|^|$ns: deleting $have: |" >&2
    done < <(ip -n "$ns" "$family" route show proto $PROTO 2>/dev/null)
  done
}

list=$KC_DIR/run/routes.wanted
while true; do
  if wanted >"$list.new" 2>/dev/null; then
    mv "$list.new" "$list"
    sync_namespace "$(kc_netns cp)" cp "$list"
    # flannel routes the nodes itself (its backend's routes or tunnels): the control plane's routes alone here.
    if [[ $(kc_setting network) == kubenet ]]; then
      for node in $(kc_nodes); do sync_namespace "$(kc_netns "$node")" "$node" "$list"; done
    fi
  fi
  sleep 1
done
