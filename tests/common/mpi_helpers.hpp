// Helpers shared by the MPI tests: the world's rank and size, and catching an error's text.
#pragma once

#include <pactrain/error.hpp>

#include <mpi.h>

#include <string>

namespace pactrain::test {

inline int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

inline int world_size() {
  int s = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}

/// Runs f, expecting a pactrain::error; returns its message ("" if none was thrown).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const error& e) {
    return e.what();
  }
  return "";
}

}  // namespace pactrain::test
