// A codec with error feedback: kept entries travel as fp16, and what rounding drops is
// carried to the next step, so nothing is lost over time.
//
//   mpiexec -n 2 build/examples/pactrain_basics_codec_feedback
//
// Every gradient entry is 1 + 2^-12, which fp16 cannot hold (its next value after 1 is
// 1 + 2^-10). Without feedback every step would deliver 1 and the 2^-12 would be lost for
// good; with it, four steps deliver 1, 1, 1 + 2^-10, 1, whose sum is exactly 4 * (1 + 2^-12).
#include <pactrain/mpi.hpp>
#include <pactrain/pactrain.hpp>

#include <mpi.h>

#include <cstdio>
#include <vector>

#include "../common/run_main.hpp"

int run() {
  // [snippet:codec_feedback]
  pactrain::param_layout layout;
  layout.add("fc.weight", 10, 100);

  pactrain::sync sync{pactrain::mpi_communicator{MPI_COMM_WORLD}, layout,
                      pactrain::error_feedback{pactrain::fp16_codec{}}};
  sync.set_masks({pactrain::bitmap_mask::from_predicate(1000, [](auto i) { return i % 2 == 0; })});

  const float g = 1.0f + 0x1p-12f;
  std::vector<float> grads(layout.total_size());
  std::vector<float> delivered(layout.total_size(), 0.0f);  // sum over steps of the means
  for (int step = 0; step < 4; ++step) {
    grads.assign(grads.size(), g);
    sync.allreduce(grads);  // collective: fp16 on the wire, the rounding error kept locally
    for (std::size_t i = 0; i < grads.size(); ++i) delivered[i] += grads[i];
  }
  // [/snippet:codec_feedback]

  const auto [rank, ranks] = examples::world();
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < delivered.size(); ++i) {
    const float want = i % 2 == 0 ? 4.0f * g : 0.0f;  // pruned entries stay +0
    if (delivered[i] != want) ++wrong;
  }
  // 500 kept entries of 2 bytes each go to the allreduce per step.
  const std::size_t want_bytes = 500 * 2;
  if (rank == 0) {
    std::printf(
        "%d ranks: 4 steps delivered %.9g per kept entry (want %.9g), %zu bytes a step "
        "(want %zu); %zu entries wrong\n",
        ranks, static_cast<double>(delivered[0]), static_cast<double>(4.0f * g),
        sync.stats().bytes_sent, want_bytes, wrong);
  }
  return wrong == 0 && sync.stats().bytes_sent == want_bytes ? 0 : 1;
}

int main(int argc, char** argv) { return examples::run_main(argc, argv, "codec_feedback", run); }
