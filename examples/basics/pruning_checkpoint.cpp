// The pruner and a checkpoint: a gradual schedule prunes the weights by magnitude, the pruner
// commits the engine's masks, and a run resumed from a checkpoint continues bit for bit.
//
//   mpiexec -n 2 build/examples/pactrain_basics_pruning_checkpoint
//
// Masks are updated at steps 0, 2, 4 and 6, towards 75% sparsity. After step 3 the run saves
// its checkpoint and goes on; a fresh engine and pruner load the checkpoint and run steps 4
// and 5 too. Both must hold the same masks and deliver the same exact means (small integers).
#include <pactrain/mpi.hpp>
#include <pactrain/pactrain.hpp>

#include <mpi.h>

#include <cstdint>
#include <cstdio>
#include <span>
#include <vector>

#include "../common/run_main.hpp"

using sync_t = pactrain::sync<pactrain::mpi_communicator>;
using pruner_t = pactrain::pruner<pactrain::magnitude_pruning, pactrain::gradual_schedule>;

int run() {
  const auto [rank, ranks] = examples::world();
  pactrain::param_layout layout;
  layout.add("fc.weight", 16, 64).add("fc.bias", 16);
  std::vector<float> weights(layout.total_size());  // distinct magnitudes: |w| is 0 to 1023
  for (std::size_t i = 0; i < weights.size(); ++i) weights[i] = float(i * 37 % 1024);

  // One training step: the sync, then (after the optimizer) the pruner. Returns the means.
  const auto train_step = [&](sync_t& sync, pruner_t& pruner, std::uint64_t t) {
    std::vector<float> grads(layout.total_size());
    for (std::size_t i = 0; i < grads.size(); ++i) grads[i] = float(rank + 1) * float((i + t) % 8);
    sync.allreduce(grads);                               // collective
    pruner.step(sync, std::span<const float>(weights));  // collective on update steps
    return grads;
  };

  // [snippet:pruning_checkpoint]
  const pactrain::gradual_schedule schedule{.final_sparsity = 0.75, .interval = 2, .updates = 3};
  sync_t sync{pactrain::mpi_communicator{MPI_COMM_WORLD}, layout};
  pruner_t pruner{{}, schedule, pactrain::matrix_tensors(layout)};  // prunes fc.weight only
  for (std::uint64_t t = 0; t < 4; ++t) train_step(sync, pruner, t);
  const auto masks_saved = pruner.save(sync);  // local: masks and the schedule's position
  const auto state_saved = sync.save_state();  // local: the engine's step counter

  sync_t resumed{pactrain::mpi_communicator{MPI_COMM_WORLD}, layout};
  pruner_t resumed_pruner{{}, schedule, pactrain::matrix_tensors(layout)};
  resumed_pruner.load(resumed, masks_saved);  // collective: commits the saved masks
  resumed.load_state(state_saved);            // collective: after the masks, which reset it
  // [/snippet:pruning_checkpoint]

  std::size_t wrong = 0;
  std::size_t differ = resumed.masks() != sync.masks() || resumed.step() != sync.step() ||
                       resumed_pruner.current_step() != pruner.current_step();
  for (std::uint64_t t = 4; t < 6; ++t) {
    // Kept: fc.weight entries with |w| >= the pruned count of the sparsity in force; biases.
    const std::size_t pruned = pactrain::pruned_count(1024, pruner.current_sparsity());
    const auto want = train_step(sync, pruner, t);
    const auto got = train_step(resumed, resumed_pruner, t);
    differ += got != want || resumed.masks() != sync.masks();
    for (std::size_t i = 0; i < got.size(); ++i) {
      const bool kept = i >= 1024 || weights[i] >= float(pruned);
      if (got[i] != (kept ? float(ranks + 1) / 2.0f * float((i + t) % 8) : 0.0f)) ++wrong;
    }
  }
  if (rank == 0) {
    std::printf(
        "%d ranks: resumed at step 4 of the schedule, %zu of 1024 weights kept after step 5 at "
        "sparsity %.4f; %zu steps or masks differ, %zu entries wrong\n",
        ranks, resumed.masks()[0].count(), resumed_pruner.current_sparsity(), differ, wrong);
  }
  return wrong == 0 && differ == 0 && resumed_pruner.current_step() == 6 ? 0 : 1;
}

int main(int argc, char** argv) {
  return examples::run_main(argc, argv, "pruning_checkpoint", run);
}
