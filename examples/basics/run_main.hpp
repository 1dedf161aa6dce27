// The main shared by the examples in examples/basics: MPI_Init, the example's body,
// MPI_Finalize. An exception ends the body with its message on stderr and exit code 1, so
// the example's test fails with the reason. pactrain's configuration calls throw on every
// rank alike, so every rank still reaches MPI_Finalize.
#pragma once

#include <mpi.h>

#include <cstdio>
#include <exception>

namespace basics {

/// Runs `body` (it returns the exit code: 0 when its checks pass) between MPI_Init and
/// MPI_Finalize. An exception from it (pactrain::error or any other) prints
/// "<name>: <what>" on stderr and returns 1.
template <class Body>
int run_main(int argc, char** argv, const char* name, Body&& body) {
  MPI_Init(&argc, &argv);
  int rc = 1;
  try {
    rc = body();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", name, e.what());
  } catch (...) {
    std::fprintf(stderr, "%s: unknown exception\n", name);
  }
  MPI_Finalize();
  return rc;
}

}  // namespace basics
