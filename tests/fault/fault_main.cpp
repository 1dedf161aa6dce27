// The program of the fault tests: a pactrain engine on several ranks, inside the examples'
// guard (examples/common/run_main.hpp), where one rank fails in the middle of a step.
//
//   cmake --build build --target pactrain_fault_main
//   mpiexec -n 4 build/tests/fault/fault_main control|sigkill|throw
//
// Every rank runs 4 steps of 8 buckets through begin_step, submit_bucket and finish_step and
// checks every entry of the exact means. In step 2 the last rank (the victim) submits half
// the buckets and waits until every other rank has submitted all of them, so that its peers
// wait in collectives the victim has not joined. Then the victim
//   control  goes on: the job must exit 0;
//   sigkill  sends itself SIGKILL, as a crash would;
//   throw    throws std::runtime_error (not a pactrain error) before its next submit_bucket,
//            which the guard turns into MPI_Abort.
// The failing modes must end the job with a nonzero status instead of leaving the peers
// waiting; tests/fault/run_fault.cmake runs each mode and times it.
#include <pactrain/mpi.hpp>
#include <pactrain/pactrain.hpp>

#include <mpi.h>

#include <csignal>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "../../examples/common/run_main.hpp"

namespace {

enum class fault_mode { control, sigkill, throw_ };

fault_mode parse(int argc, char** argv) {
  const std::string mode = argc == 2 ? argv[1] : "";
  if (mode == "control") return fault_mode::control;
  if (mode == "sigkill") return fault_mode::sigkill;
  if (mode == "throw") return fault_mode::throw_;
  throw std::invalid_argument("usage: fault_main control|sigkill|throw");
}

int run(int argc, char** argv) {
  const fault_mode mode = parse(argc, argv);
  const auto [rank, ranks] = examples::world();
  const int victim = ranks - 1;
  constexpr int steps = 4;
  constexpr int fault_step = 2;

  pactrain::param_layout layout(64 * 64);  // bucket capacity: one tensor per bucket
  for (int t = 0; t < 8; ++t) layout.add("layer" + std::to_string(t) + ".weight", 64, 64);
  const std::size_t buckets = layout.buckets().size();
  const std::size_t fault_bucket = buckets / 2;  // the victim fails before submitting it

  using sync_t = pactrain::sync<pactrain::mpi_communicator>;
  sync_t sync{pactrain::mpi_communicator{MPI_COMM_WORLD}, layout};
  std::vector<pactrain::bitmap_mask> masks;  // every other entry
  for (const auto& t : layout.tensors()) {
    masks.push_back(
        pactrain::bitmap_mask::from_predicate(t.size, [](auto i) { return i % 2 == 0; }));
  }
  sync.set_masks(std::move(masks));

  // Small integers: the means over ranks are exact.
  const auto gradient = [](std::size_t i, int step) { return float((i + step) % 8); };
  std::vector<float> grads(layout.total_size());
  std::size_t wrong = 0;
  for (int step = 0; step < steps; ++step) {
    sync.begin_step(grads);
    for (std::size_t b = 0; b < buckets; ++b) {
      if (step == fault_step && b == fault_bucket && rank == victim) {
        // The others submit every bucket, then meet the victim here: from now on they can only
        // wait, in finish_step, for collectives it has not joined. (The barrier is on
        // MPI_COMM_WORLD, not on the engine's duplicate, so it does not meddle with them.)
        MPI_Barrier(MPI_COMM_WORLD);
        if (mode == fault_mode::sigkill) {
          std::fprintf(stderr,
                       "fault_main: rank %d sends itself SIGKILL before bucket %zu of %zu\n", rank,
                       b, buckets);
          std::raise(SIGKILL);
        }
        if (mode == fault_mode::throw_) {
          throw std::runtime_error("rank " + std::to_string(rank) +
                                   " failed outside pactrain before bucket " + std::to_string(b) +
                                   " of " + std::to_string(buckets));
        }
      }
      const auto& bucket = layout.buckets()[b];
      for (std::size_t i = bucket.offset; i < bucket.offset + bucket.size; ++i) {
        grads[i] = float(rank + 1) * gradient(i, step);
      }
      sync.submit_bucket(b);
    }
    if (step == fault_step && rank != victim) MPI_Barrier(MPI_COMM_WORLD);
    sync.finish_step();

    // Expected: mean of (r + 1) * gradient over ranks r where kept; +0 where pruned.
    for (std::size_t i = 0; i < grads.size(); ++i) {
      const float want = i % 2 == 0 ? float(ranks + 1) / 2.0f * gradient(i, step) : 0.0f;
      if (grads[i] != want) ++wrong;
    }
  }
  if (rank == 0) {
    std::printf("fault_main: %d ranks, %d steps of %zu buckets, %zu entries wrong\n", ranks, steps,
                buckets, wrong);
  }
  return wrong == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  return examples::run_main(argc, argv, "fault_main", [&] { return run(argc, argv); });
}
