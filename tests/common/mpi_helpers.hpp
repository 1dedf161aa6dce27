// Helpers shared by the MPI tests: the world's rank and size, catching an error's text, and
// whether a value is the same on every rank.
#pragma once

#include <pactrain/digest.hpp>
#include <pactrain/error.hpp>

#include <mpi.h>

#include <cstdint>
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

/// Collective: true when `digest` is the same on every rank of the world (MIN == MAX).
inline bool same_on_every_rank(std::uint64_t digest) {
  unsigned long long v[2] = {digest, ~digest};
  MPI_Allreduce(MPI_IN_PLACE, v, 2, MPI_UNSIGNED_LONG_LONG, MPI_MAX, MPI_COMM_WORLD);
  return v[0] == ~v[1];
}

/// Collective: true when `text` is the same on every rank.
inline bool same_on_every_rank(const std::string& text) {
  return same_on_every_rank(digest_builder().add(text).value());
}

}  // namespace pactrain::test
