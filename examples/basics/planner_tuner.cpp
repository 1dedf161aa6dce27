// The planner and the tuner: a calibrated cost model chooses each bucket's strategy (the kept
// entries, or the whole bucket), then a tuner times the candidate choices on real steps and
// keeps the fastest.
//
//   mpiexec -n 2 build/examples/pactrain_basics_planner_tuner
//
// What is chosen depends on this machine's timings, but not the result: every strategy
// delivers the same exact means (small integers), checked entry by entry on every step.
#include <pactrain/mpi.hpp>
#include <pactrain/pactrain.hpp>

#include <mpi.h>

#include <cstdio>
#include <vector>

#include "../common/run_main.hpp"

int run() {
  pactrain::param_layout layout(1 << 16);  // bucket capacity: each tensor in its own bucket
  layout.add("fc.weight", 256, 256).add("fc.bias", 256);
  pactrain::sync sync{pactrain::mpi_communicator{MPI_COMM_WORLD}, layout};
  sync.set_masks({pactrain::bitmap_mask::from_predicate(1 << 16, [](auto i) { return i % 8 == 0; }),
                  pactrain::bitmap_mask::full(256)});  // collective
  auto& comm = sync.get_communicator();

  // [snippet:planner_tuner]
  // Collective: timed collectives and local passes, the maximum over ranks (small sizes here).
  const auto model =
      pactrain::calibrate(comm, {.large_bytes = 1 << 18, .compact_entries = 1 << 16});
  const auto shapes = pactrain::bucket_shapes(sync);
  const auto choice = pactrain::choose_strategies(model, comm.size(), shapes);
  sync.set_strategies(choice.strategies);  // collective: the same choice on every rank

  // Or time them: each candidate runs `trials` real steps, then the fastest stays in force.
  const auto candidates = pactrain::candidate_strategies(model, comm.size(), shapes);
  pactrain::strategy_tuner tuner{candidates, /*trials=*/2};
  // ... then in the training loop: tuner.allreduce(sync, grads) instead of sync.allreduce
  // [/snippet:planner_tuner]

  const int rank = comm.rank(), ranks = comm.size();
  std::vector<float> grads(layout.total_size());
  std::size_t wrong = 0, steps = 0;
  const auto step = [&] {
    for (std::size_t i = 0; i < grads.size(); ++i) grads[i] = float(rank + 1) * float(i % 8);
    tuner.allreduce(sync, grads);  // collective
    for (std::size_t i = 0; i < grads.size(); ++i) {
      const bool kept = i >= (1 << 16) || i % 8 == 0;
      if (grads[i] != (kept ? float(ranks + 1) / 2.0f * float(i % 8) : 0.0f)) ++wrong;
    }
    ++steps;
  };
  while (tuner.tuning()) step();
  step();  // with the fastest candidate in force
  if (rank == 0) {
    for (std::size_t b = 0; b < shapes.size(); ++b) {
      std::printf(
          "bucket %zu (%zu entries, %zu kept): planner chose %s (%.1f us predicted, dense "
          "%.1f us), tuner kept %s\n",
          b, shapes[b].entries, shapes[b].kept, pactrain::to_string(choice.strategies[b]),
          1e6 * pactrain::cost_of(choice.costs[b], shapes[b], choice.strategies[b]),
          1e6 * choice.costs[b].dense_plain, pactrain::to_string(tuner.best()[b]));
    }
    std::printf("%d ranks: %zu candidates, %zu steps; %zu entries wrong\n", ranks,
                candidates.size(), steps, wrong);
  }
  return wrong == 0 && sync.strategies() == tuner.best() ? 0 : 1;
}

int main(int argc, char** argv) { return examples::run_main(argc, argv, "planner_tuner", run); }
