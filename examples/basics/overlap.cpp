// Overlapping the sync with backward: each bucket's allreduce starts as soon as backward has
// produced its gradients, and runs while the layers before it are still computed.
//
//   mpiexec -n 2 build/examples/pactrain_basics_overlap
//
// Three layers, one bucket each. Backward yields the last layer first, so the buckets are
// submitted as 2, 1, 0 (every rank alike); finish_step waits for all of them and writes the
// means back. The gradients are small integers, so the means are exact: every entry of two
// steps is checked against the mean expected.
#include <pactrain/mpi.hpp>
#include <pactrain/pactrain.hpp>

#include <mpi.h>

#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "../common/run_main.hpp"

int run() {
  const auto [rank, ranks] = examples::world();
  pactrain::param_layout layout(32 * 32 + 32);  // bucket capacity: one layer per bucket
  for (const std::string layer : {"layer0", "layer1", "layer2"}) {
    layout.add(layer + ".weight", 32, 32).add(layer + ".bias", 32);
  }
  pactrain::sync sync{pactrain::mpi_communicator{MPI_COMM_WORLD}, layout};
  std::vector<pactrain::bitmap_mask> masks;  // every other weight, every bias
  for (const auto& t : layout.tensors()) {
    masks.push_back(t.rows == 0 ? pactrain::bitmap_mask::full(t.size)
                                : pactrain::bitmap_mask::from_predicate(
                                      t.size, [](auto i) { return i % 2 == 0; }));
  }
  sync.set_masks(std::move(masks));  // collective, checked across ranks

  std::vector<float> grads(layout.total_size());
  const auto gradient = [](std::size_t i, int step) { return float((i + step) % 8); };
  std::size_t wrong = 0;
  for (int step = 0; step < 2; ++step) {
    // [snippet:overlap]
    sync.begin_step(grads);  // local: grads must stay alive until finish_step returns
    for (std::size_t b = layout.buckets().size(); b-- > 0;) {  // backward: last layer first
      const auto& bucket = layout.buckets()[b];
      for (std::size_t i = bucket.offset; i < bucket.offset + bucket.size; ++i) {
        grads[i] = float(rank + 1) * gradient(i, step);  // this layer's backward
      }
      sync.submit_bucket(b);  // collective: its allreduce runs while the next layer computes
    }
    sync.finish_step();  // collective: waits for every bucket, writes the means back
    // [/snippet:overlap]

    // Expected: mean of (r + 1) * gradient over ranks r where kept; +0 where pruned.
    for (const auto& t : layout.tensors()) {
      for (std::size_t j = 0; j < t.size; ++j) {
        const bool kept = t.rows == 0 || j % 2 == 0;
        const float want = kept ? float(ranks + 1) / 2.0f * gradient(t.offset + j, step) : 0.0f;
        if (grads[t.offset + j] != want) ++wrong;
      }
    }
  }
  const std::size_t want_collectives = layout.buckets().size();  // one per bucket and step
  if (rank == 0) {
    std::printf(
        "%d ranks: 2 steps of %zu buckets submitted last first, %zu collectives a step (want "
        "%zu); %zu entries wrong\n",
        ranks, layout.buckets().size(), sync.stats().collectives, want_collectives, wrong);
  }
  return wrong == 0 && sync.stats().collectives == want_collectives && !sync.step_open() ? 0 : 1;
}

int main(int argc, char** argv) { return examples::run_main(argc, argv, "overlap", run); }
