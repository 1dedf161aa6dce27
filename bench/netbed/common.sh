# shellcheck shell=bash
# Shared names of the testbed; sourced by setup.sh, teardown.sh and launch.sh.
#
# Host K (1..N) is network namespace ${PACTRAIN_NETBED_PREFIX}K with interface eth0 at
# ${PACTRAIN_NETBED_NET}.K/24; its peer veth ${PACTRAIN_NETBED_PREFIX}hK joins the bridge
# ${PACTRAIN_NETBED_PREFIX}br0, which holds .254 in the root namespace so that mpirun can
# reach the daemons it starts. The /24 is private to these namespaces: nothing is sent
# anywhere else.
# shellcheck disable=SC2034  # used by the scripts that source this file

PACTRAIN_NETBED_PREFIX=${PACTRAIN_NETBED_PREFIX:-ptnb}
PACTRAIN_NETBED_NET=${PACTRAIN_NETBED_NET:-10.78.0}
PACTRAIN_NETBED_CIDR="${PACTRAIN_NETBED_NET}.0/24"
PACTRAIN_NETBED_BRIDGE="${PACTRAIN_NETBED_PREFIX}br0"
PACTRAIN_NETBED_STATE=${PACTRAIN_NETBED_STATE:-/tmp/pactrain-netbed}

netbed_ns() { echo "${PACTRAIN_NETBED_PREFIX}$1"; }
netbed_addr() { echo "${PACTRAIN_NETBED_NET}.$1"; }
# The namespaces of the testbed that exist now, one per line.
netbed_namespaces() {
  ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${PACTRAIN_NETBED_PREFIX}[0-9]+$" || true
}
