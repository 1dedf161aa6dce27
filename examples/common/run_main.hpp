// The main shared by pactrain's MPI examples: MPI_Init, the program's body, MPI_Finalize, and
// around the body the guard a program should copy (tests/fault checks that it ends the job).
//
// The guard is a top-level catch that prints the message and calls MPI_Abort. pactrain's
// configuration calls throw on every rank alike, but a failure outside the library (a file
// that cannot be read, an allocation, a bug) or an allreduce argument rejected on one rank
// happens on that rank alone, and only MPI_Abort ends its peers too.
#pragma once

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

// [snippet:guard]
/// Prints "<name>: <what>" on stderr and ends every rank of the job with exit code 1: a rank
/// that returned alone would leave its peers waiting forever in a collective it never joins.
[[noreturn]] inline void abort_job(const char* name, const char* what) noexcept {
  std::fprintf(stderr, "%s: %s\n", name, what);
  std::fflush(nullptr);  // MPI_Abort does not flush what the program wrote so far
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::abort();  // not reached: MPI_Abort does not return
}

/// Runs `body` (it returns the exit code: 0 when its checks pass) between MPI_Init and
/// MPI_Finalize. An exception from it (pactrain::error or any other) ends the whole job
/// through abort_job.
template <class Body>
int run_main(int& argc, char**& argv, const char* name, Body&& body) {
  MPI_Init(&argc, &argv);
  int rc = 1;
  try {
    rc = body();
  } catch (const std::exception& e) {
    abort_job(name, e.what());
  } catch (...) {
    abort_job(name, "unknown exception");
  }
  MPI_Finalize();
  return rc;
}
// [/snippet:guard]

}  // namespace examples
