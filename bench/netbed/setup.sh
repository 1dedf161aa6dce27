#!/usr/bin/env bash
# Sets up a testbed of N hosts on this machine: N network namespaces, each joined by a veth
# pair to one Linux bridge, each host's link shaped to RATE in both directions with tc tbf.
# Tears down whatever an earlier run left first, so it can be run again at any time.
#
#   bench/netbed/setup.sh N RATE      # RATE: 100mbit | 500mbit | 1gbit | 2gbit | none (unshaped)
#   bench/netbed/launch.sh ...        # run MPI ranks on the hosts
#   bench/netbed/teardown.sh
#
# Every byte is shaped: segmentation and receive offloads (TSO, GSO, GRO) are off on both ends
# of every veth, so the kernel hands tbf wire-sized packets, and tbf's bucket holds about 1 ms
# of bytes at the rate, at least 16 KiB (16 KiB at 100 Mbit/s, 125 kB at 1 Gbit/s), so that a
# compute gap lets little through at veth speed. A smaller bucket at 1 Gbit/s starves tbf
# between its timer wake-ups: 16 KiB ran a 3.5 MB allreduce at a third of the rate (README).
# With the bucket this script gave before (10 ms of bytes, at least 256 KiB, needed while 64 KiB
# offload super-packets passed) a payload under ~256 KiB crossed unshaped after every gap.
# PACTRAIN_NETBED_BUCKET=legacy keeps that old setting (offloads on, the large bucket), for
# comparison only; PACTRAIN_NETBED_BUCKET=<bytes> sets the bucket (offloads off unless
# PACTRAIN_NETBED_OFFLOADS=on).
#
# Needs root, iproute2 and ethtool. Addresses: host K is 10.78.0.K/24 (see common.sh).
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
bucket=${PACTRAIN_NETBED_BUCKET:-$(( bits / 8 / 1000 > 16384 ? bits / 8 / 1000 : 16384 ))}
if [[ $bucket == legacy ]]; then
  offloads=on
  # About 10 ms of bytes at the rate, at least 256 KiB.
  burst=$(( bits / 8 / 100 ))
  (( burst < 262144 )) && burst=262144
elif [[ $bucket =~ ^[0-9]+$ ]] && (( bucket >= 2048 )); then
  offloads=${PACTRAIN_NETBED_OFFLOADS:-off}
  burst=$bucket
else
  echo "setup.sh: PACTRAIN_NETBED_BUCKET must be legacy or a byte count >= 2048, not '$bucket'" >&2
  exit 2
fi
if [[ $offloads == off && $bits -ne 0 ]] && ! command -v ethtool >/dev/null; then
  echo "setup.sh: needs ethtool (Debian package ethtool) to turn veth offloads off" >&2
  exit 1
fi

"$here/teardown.sh"

shape() {  # shape <netns or ""> <dev>
  local ns=$1 dev=$2
  [[ $bits -eq 0 ]] && return 0
  local in=()
  [[ -n "$ns" ]] && in=(ip netns exec "$ns")
  # Offloads off on this end: tbf then sees and times every wire-sized packet.
  [[ $offloads == on ]] || "${in[@]}" ethtool -K "$dev" tso off gso off gro off >/dev/null
  "${in[@]}" tc qdisc replace dev "$dev" root tbf rate "$rate" burst "$burst" latency 50ms
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
printf '%s %s %s\n' "$n" "$rate" "$burst" > "$PACTRAIN_NETBED_STATE/config"
if [[ $bits -eq 0 ]]; then
  echo "netbed: $n hosts on $PACTRAIN_NETBED_CIDR, links unshaped"
else
  echo "netbed: $n hosts on $PACTRAIN_NETBED_CIDR, links $rate, bucket $burst bytes, offloads $offloads"
fi
