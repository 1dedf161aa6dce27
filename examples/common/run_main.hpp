// The main shared by pactrain's MPI examples: pactrain::mpi_main (MPI_Init, the program's body,
// MPI_Finalize, and around the body the guard that tests/fault checks ends the job).
//
// The guard is a top-level catch that prints the message and calls MPI_Abort. pactrain's
// configuration calls throw on every rank alike, but a failure outside the library (a file
// that cannot be read, an allocation, a bug) or an allreduce argument rejected on one rank
// happens on that rank alone, and only MPI_Abort ends its peers too.
#pragma once

#include <pactrain/mpi.hpp>

#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <exception>

namespace examples {

/// This process's rank in MPI_COMM_WORLD and the number of ranks there.
struct world_place {
  int rank = 0;
  int ranks = 1;
};

/// Where this process is in MPI_COMM_WORLD (after MPI_Init): `auto [rank, ranks] = world();`.
inline world_place world() {
  world_place w;
  MPI_Comm_rank(MPI_COMM_WORLD, &w.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &w.ranks);
  return w;
}

/// Runs `body` (it returns the exit code: 0 when its checks pass) under pactrain::mpi_main,
/// whose guard ends the whole job when it throws.
template <class Body>
int run_main(int& argc, char**& argv, const char* name, Body&& body) {
  return pactrain::mpi_main(
      argc, argv, [&](const pactrain::mpi_world&) { return body(); }, name);
}

}  // namespace examples
