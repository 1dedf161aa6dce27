#!/usr/bin/env bash
# Runs an MPI program with one rank per testbed host (made by setup.sh), over TCP between
# the hosts' shaped links.
#
#   bench/netbed/launch.sh [-n N] [--] PROGRAM [ARGS...]
#
# -n N     ranks (default: every host of the testbed), placed one per host.
# Dense allreduce is forced to Open MPI's ring algorithm (the fair, bandwidth-optimal
# baseline; on 2 ranks recursive doubling, which moves the same bytes and ran at the link's
# rate where the ring did not); PACTRAIN_NETBED_ALLREDUCE=default keeps Open MPI's own choice.
# Nonblocking allreduce (MPI_Iallreduce, used by pactrain::sync) is forced to ring too.
# Extra mpirun arguments go in PACTRAIN_NETBED_MPIRUN_ARGS.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=common.sh
source "$here/common.sh"

[[ -f "$PACTRAIN_NETBED_STATE/config" ]] || { echo "launch.sh: no testbed; run setup.sh N RATE first" >&2; exit 1; }
read -r hosts _rate < "$PACTRAIN_NETBED_STATE/config"
np=$hosts
if [[ "${1:-}" == "-n" ]]; then
  np=${2:?launch.sh: -n needs a count}
  shift 2
fi
[[ "${1:-}" == "--" ]] && shift
[[ $# -ge 1 ]] || { echo "usage: launch.sh [-n N] [--] PROGRAM [ARGS...]" >&2; exit 2; }
if ! [[ "$np" =~ ^[0-9]+$ ]] || (( np < 1 || np > hosts )); then
  echo "launch.sh: -n $np: the testbed has $hosts hosts" >&2
  exit 2
fi

# Tunables go through the environment: an MCA parameter may appear only once on the command
# line. Yielding ranks: 4 ranks on 2 cores busy-polling make small collectives ~200x slower.
export OMPI_MCA_mpi_yield_when_idle=1
if [[ "${PACTRAIN_NETBED_ALLREDUCE:-ring}" == ring ]]; then
  export OMPI_MCA_coll_tuned_use_dynamic_rules=1
  # On 2 ranks coll/tuned's ring (4) ran a 3.5 MB MPI_Allreduce at 100 Mbit/s in 441 ms
  # (median of 7; 299 ms at best) where recursive doubling (3), which sends the same bytes per
  # link at 2 ranks, took 308 ms and libnbc's ring 309 ms: the fast one is the fair baseline.
  if (( np == 2 )); then
    export OMPI_MCA_coll_tuned_allreduce_algorithm=3
  else
    export OMPI_MCA_coll_tuned_allreduce_algorithm=4
  fi
  export OMPI_MCA_coll_libnbc_iallreduce_algorithm=1
fi

# shellcheck disable=SC2086
exec mpirun --allow-run-as-root --hostfile "$PACTRAIN_NETBED_STATE/hostfile" --map-by node -np "$np" \
  --mca plm_rsh_agent "$here/rsh-agent.sh" --mca plm_rsh_no_tree_spawn 1 \
  --mca oob_tcp_if_include "$PACTRAIN_NETBED_CIDR" \
  --mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include "$PACTRAIN_NETBED_CIDR" \
  ${PACTRAIN_NETBED_MPIRUN_ARGS:-} "$@"
