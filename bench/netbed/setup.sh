#!/usr/bin/env bash
# Sets up a testbed of N hosts on this machine: N network namespaces, each joined by a veth
# pair to one Linux bridge, each host's link shaped to RATE in both directions with tc tbf.
# Tears down whatever an earlier run left first, so it can be run again at any time.
#
#   bench/netbed/setup.sh N RATE      # RATE: 100mbit | 500mbit | 1gbit | 2gbit | none (unshaped)
#   bench/netbed/launch.sh ...        # run MPI ranks on the hosts
#   bench/netbed/teardown.sh
#
# Needs root and iproute2. Addresses: host K is 10.78.0.K/24 (see common.sh).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=common.sh
source "$here/common.sh"

usage() { echo "usage: setup.sh N RATE   (N in 1..64, RATE in 100mbit|500mbit|1gbit|2gbit|none)" >&2; exit 2; }
[[ $# -eq 2 ]] || usage
n=$1 rate=$2
if ! [[ "$n" =~ ^[0-9]+$ ]] || (( n < 1 || n > 64 )); then
  echo "setup.sh: bad host count '$n'" >&2
  usage
fi
case "$rate" in
  100mbit) bits=100000000 ;;
  500mbit) bits=500000000 ;;
  1gbit) bits=1000000000 ;;
  2gbit) bits=2000000000 ;;
  none) bits=0 ;;
  *) echo "setup.sh: bad rate '$rate'" >&2; usage ;;
esac
[[ $(id -u) -eq 0 ]] || { echo "setup.sh: must run as root" >&2; exit 1; }
if ! command -v ip >/dev/null || ! command -v tc >/dev/null; then
  echo "setup.sh: needs iproute2 (ip, tc)" >&2
  exit 1
fi

"$here/teardown.sh"

# tbf bucket: about 10 ms of bytes at the rate, at least 256 KiB.
burst=$(( bits / 8 / 100 ))
(( burst < 262144 )) && burst=262144

shape() {  # shape <netns or ""> <dev>
  local ns=$1 dev=$2
  [[ $bits -eq 0 ]] && return 0
  if [[ -n "$ns" ]]; then
    ip netns exec "$ns" tc qdisc replace dev "$dev" root tbf rate "$rate" burst "$burst" latency 50ms
  else
    tc qdisc replace dev "$dev" root tbf rate "$rate" burst "$burst" latency 50ms
  fi
}

ip link add "$PACTRAIN_NETBED_BRIDGE" type bridge
sysctl -qw "net.ipv6.conf.$PACTRAIN_NETBED_BRIDGE.disable_ipv6=1"
ip addr add "$(netbed_addr 254)/24" dev "$PACTRAIN_NETBED_BRIDGE"
ip link set "$PACTRAIN_NETBED_BRIDGE" up

mkdir -p "$PACTRAIN_NETBED_STATE"
: > "$PACTRAIN_NETBED_STATE/hostfile"
for k in $(seq 1 "$n"); do
  ns=$(netbed_ns "$k") host_if="${PACTRAIN_NETBED_PREFIX}h$k"
  ip netns add "$ns"
  ip link add "$host_if" type veth peer name eth0 netns "$ns"
  sysctl -qw "net.ipv6.conf.$host_if.disable_ipv6=1"
  ip link set "$host_if" master "$PACTRAIN_NETBED_BRIDGE" up
  ip netns exec "$ns" sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1
  ip netns exec "$ns" ip addr add "$(netbed_addr "$k")/24" dev eth0
  ip netns exec "$ns" ip link set lo up
  ip netns exec "$ns" ip link set eth0 up
  shape "$ns" eth0        # host -> bridge
  shape "" "$host_if"     # bridge -> host: full duplex
  mkdir -p "$PACTRAIN_NETBED_STATE/tmp-$k"
  echo "$(netbed_addr "$k") slots=1" >> "$PACTRAIN_NETBED_STATE/hostfile"
done
printf '%s %s\n' "$n" "$rate" > "$PACTRAIN_NETBED_STATE/config"
echo "netbed: $n hosts on $PACTRAIN_NETBED_CIDR, links $rate"
