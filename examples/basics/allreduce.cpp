// The plain pruned allreduce: one engine, one mask per tensor, one call per step.
//
//   mpiexec -n 2 build/examples/pactrain_basics_allreduce
//
// Every rank holds the same masks (they come from a shared rule), so the engine sends only
// the kept entries. The gradients are small integers, whose sums are exact, so each rank
// can check the result against the mean it expects, entry by entry.
#include <pactrain/mpi.hpp>
#include <pactrain/pactrain.hpp>

#include <mpi.h>

#include <cstdio>
#include <vector>

#include "../common/run_main.hpp"

int run() {
  // [snippet:allreduce]
  pactrain::param_layout layout;
  layout.add("fc.weight", 300, 100).add("fc.bias", 300);  // sizes need not be multiples of 64

  pactrain::sync sync{pactrain::mpi_communicator{MPI_COMM_WORLD}, layout};  // collective

  // Keep one weight in four and every bias: the same rule, so the same masks, on every rank.
  sync.set_masks({pactrain::bitmap_mask::from_predicate(30'000, [](auto i) { return i % 4 == 0; }),
                  pactrain::bitmap_mask::full(300)});  // collective, checked across ranks

  int rank = 0, ranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  std::vector<float> grads(layout.total_size());
  for (std::size_t i = 0; i < grads.size(); ++i) grads[i] = float(rank + 1) * float(i % 8);
  sync.allreduce(grads);  // collective: the mean over ranks of the kept entries, +0 elsewhere
  // [/snippet:allreduce]

  // Expected: mean of (r + 1) * (i % 8) over ranks r, where kept; +0 where pruned.
  const float mean_factor = float(ranks + 1) / 2.0f;
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < grads.size(); ++i) {
    const bool kept = i >= 30'000 || i % 4 == 0;
    const float want = kept ? mean_factor * float(i % 8) : 0.0f;
    if (grads[i] != want) ++wrong;
  }
  // Only the kept entries go to the allreduce: 7,500 weights and 300 biases.
  const std::size_t want_bytes = 7'800 * sizeof(float);
  if (rank == 0) {
    std::printf("%d ranks: %zu of %zu entries sent, %zu bytes (want %zu); %zu entries wrong\n",
                ranks, sync.payload_size(0), layout.total_size(), sync.stats().bytes_sent,
                want_bytes, wrong);
  }
  return wrong == 0 && sync.stats().bytes_sent == want_bytes ? 0 : 1;
}

int main(int argc, char** argv) { return examples::run_main(argc, argv, "allreduce", run); }
