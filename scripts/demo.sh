#!/usr/bin/env bash
# Builds the gradient-synchronisation example and runs it on 4 MPI ranks (installs what is
# missing first). Extra arguments go to the example:
#
#   scripts/demo.sh [example args...]
#   PACTRAIN_DEMO_RANKS=2 scripts/demo.sh   # another rank count
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=lib/install_deps.sh
source scripts/lib/install_deps.sh

pactrain_install_deps

echo "== configure (build/)"
if [[ -f build/CMakeCache.txt ]]; then
  cmake -S . -B build --log-level=WARNING   # keep the existing configuration
else
  cmake -S . -B build --log-level=WARNING -DCMAKE_BUILD_TYPE=Release
fi

echo "== build pactrain_sync_demo"
cmake --build build --parallel "${PACTRAIN_JOBS:-2}" --target pactrain_sync_demo

ranks=${PACTRAIN_DEMO_RANKS:-4}
echo "== run on $ranks ranks"
# Yielding matters when there are more ranks than cores: busy-polling ranks starve each other.
export OMPI_MCA_mpi_yield_when_idle=1
exec mpiexec -n "$ranks" --allow-run-as-root --oversubscribe build/examples/pactrain_sync_demo "$@"
