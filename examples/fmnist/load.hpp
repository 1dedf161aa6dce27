// Fashion-MNIST's two splits read on every rank of an MPI job, which agree on the outcome
// before any other collective.
//
// Header-only; used by examples/fmnist and examples/torch_cnn. Build and run (from the
// repository root):
//   cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
//   cmake --build build --target pactrain_fmnist
//   mpiexec --allow-run-as-root --oversubscribe -n 4 build/examples/pactrain_fmnist
#pragma once

#include "fmnist/idx.hpp"

#include <mpi.h>

#include <cstddef>
#include <cstdio>
#include <exception>
#include <string>

namespace pactrain::fmnist {

/// Collective: reads "train" and "t10k" from `dir` (the first `train_limit` / `test_limit`
/// samples; 0: all). Returns false on every rank if any rank failed; the failure is printed
/// once on stderr.
inline bool load_splits(const std::string& dir, std::size_t train_limit, std::size_t test_limit,
                        dataset& train_set, dataset& test_set, MPI_Comm comm) {
  int rank = 0;
  int ranks = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &ranks);
  std::string load_error;
  try {
    train_set = load_split(dir, "train", train_limit);
    test_set = load_split(dir, "t10k", test_limit);
  } catch (const std::exception& e) {
    load_error = e.what();
  }
  int failed = load_error.empty() ? 0 : 1;
  MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MAX, comm);
  if (failed == 0) return true;
  if (!load_error.empty() && (rank == 0 || ranks == 1))
    std::fprintf(stderr, "%s\n", load_error.c_str());
  if (rank == 0 && load_error.empty())
    std::fprintf(stderr, "loading the data failed on another rank\n");
  return false;
}

}  // namespace pactrain::fmnist
