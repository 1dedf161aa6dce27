#!/usr/bin/env bash
# Tears down the testbed made by setup.sh: kills every process left in its namespaces (by
# pid), deletes the namespaces, the bridge and the state directory. Safe to run any time.
#
#   bench/netbed/teardown.sh
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=common.sh
source "$here/common.sh"

[[ $(id -u) -eq 0 ]] || { echo "teardown.sh: must run as root" >&2; exit 1; }

for ns in $(netbed_namespaces); do
  pids=$(ip netns pids "$ns" 2>/dev/null || true)
  if [[ -n "$pids" ]]; then
    # shellcheck disable=SC2086
    kill -TERM $pids 2>/dev/null || true
    for _ in 1 2 3 4 5 6 7 8 9 10; do
      pids=$(ip netns pids "$ns" 2>/dev/null || true)
      [[ -z "$pids" ]] && break
      sleep 0.1
    done
    # shellcheck disable=SC2086
    [[ -n "$pids" ]] && kill -KILL $pids 2>/dev/null || true
  fi
  ip netns delete "$ns" 2>/dev/null || true
done
# Host-side veth ends vanish with their namespaces' peers; remove strays and the bridge.
for link in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1 |
              grep -E "^${PACTRAIN_NETBED_PREFIX}h[0-9]+$" || true); do
  ip link delete "$link" 2>/dev/null || true
done
ip link delete "$PACTRAIN_NETBED_BRIDGE" 2>/dev/null || true
rm -rf "$PACTRAIN_NETBED_STATE"
