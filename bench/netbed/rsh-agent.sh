#!/bin/sh
# Stand-in for ssh that mpirun uses (--mca plm_rsh_agent) to start its daemons on the
# testbed's hosts: skips ssh-style options, maps the host's address (10.78.0.K) to its
# namespace and runs the command there with that host's own TMPDIR (all namespaces share one
# hostname and /tmp, and Open MPI's session directories must not collide).
here=$(cd "$(dirname "$0")" && pwd)
. "$here/common.sh"
while [ $# -gt 0 ]; do
  case "$1" in
    -[bcDEeFIiJLlmOopQRSWw]) shift 2 ;;  # ssh options that take a value
    -*) shift ;;
    *) break ;;
  esac
done
[ $# -ge 1 ] || { echo "rsh-agent: no host given" >&2; exit 2; }
host=$1
shift
case "$host" in
  "$PACTRAIN_NETBED_NET".*) k=${host##*.} ;;
  *) echo "rsh-agent: $host is not a testbed host ($PACTRAIN_NETBED_CIDR)" >&2; exit 2 ;;
esac
ns=$(netbed_ns "$k")
exec ip netns exec "$ns" env TMPDIR="$PACTRAIN_NETBED_STATE/tmp-$k" /bin/sh -c "$*"
