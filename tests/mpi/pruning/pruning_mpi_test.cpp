// The mask lifecycle on several ranks: masks recomputed during training stay identical on
// every rank, rank-0 broadcast works, and disagreement or failure on one rank stops all.
#include <doctest/doctest.h>

#include <pactrain/mpi.hpp>
#include <pactrain/pactrain.hpp>
#include <pactrain/pruning/pruner.hpp>

#include "common/mpi_helpers.hpp"
#include "common/test_data.hpp"

#include <mpi.h>

#include <cmath>
#include <string>
#include <vector>

using namespace pactrain;

namespace {

using test::error_of;
using test::world_rank;
using test::world_size;

param_layout model() {
  param_layout l(2000);
  l.add("fc1.weight", 64, 49).add("fc1.bias", 64).add("fc2.weight", 10, 64).add("fc2.bias", 10);
  return l;
}

using mpi_sync = pactrain::sync<mpi_communicator>;

// Masks equal on every rank?
bool same_everywhere(const std::vector<bitmap_mask>& masks) {
  digest_builder d;
  for (const auto& m : masks) d.add(m.digest());
  return test::same_on_every_rank(d.value());
}

// A tiny "training" loop: SGD on synchronised exactly summable gradients, pruning on
// schedule, masks applied to weights. Weights stay equal on every rank because the averaged
// gradient is.
template <class Policy>
void train(mpi_sync& s, pruner<Policy, gradual_schedule>& pr, std::vector<float>& w, int steps) {
  const auto& l = s.layout();
  for (int t = 0; t < steps; ++t) {
    auto g = test::values<float>(l.total_size(), 100 + static_cast<std::uint64_t>(t), world_rank());
    s.allreduce(std::span<float>(g));
    for (std::size_t i = 0; i < w.size(); ++i) w[i] -= 0.0625f * g[i];
    pr.step(s, std::span<const float>(w));
    apply_masks(l, s.masks(), std::span<float>(w));
    CHECK(same_everywhere(s.masks()));
  }
}

}  // namespace

TEST_CASE("masks recomputed during training stay identical on every rank") {
  for (auto source : {mask_source::local, mask_source::root_broadcast}) {
    const auto l = model();
    mpi_sync s{mpi_communicator{MPI_COMM_WORLD}, l};
    pruner pr{magnitude_pruning{},
              gradual_schedule{.final_sparsity = 0.9, .start_step = 2, .interval = 3, .updates = 4},
              matrix_tensors(l), source};
    auto w = test::values<float>(l.total_size(), 1);  // same init everywhere
    train(s, pr, w, 20);
    CHECK(pr.current_sparsity() == 0.9);
    CHECK(s.masks()[0].count() == 3136 - pruned_count(3136, 0.9));
    CHECK(s.masks()[2].count() == 640 - pruned_count(640, 0.9));
    CHECK(s.stats().bytes_sent ==
          (s.masks()[0].count() + 64 + s.masks()[2].count() + 10) * sizeof(float));
  }
}

TEST_CASE("rank-0 broadcast gives every rank rank 0's masks even when weights differ") {
  const auto l = model();
  mpi_sync s{mpi_communicator{MPI_COMM_WORLD}, l};
  pruner pr{magnitude_pruning{}, one_shot_schedule{.step = 0, .sparsity = 0.5}, matrix_tensors(l),
            mask_source::root_broadcast};
  const auto w = test::values<float>(l.total_size(), 10 + static_cast<std::uint64_t>(world_rank()));
  CHECK(pr.step(s, std::span<const float>(w)));
  CHECK(same_everywhere(s.masks()));
  CHECK(s.masks()[0].count() == 3136 / 2);
  const auto w0 = test::values<float>(l.total_size(), 10);
  CHECK(s.masks() ==
        magnitude_pruning{}.compute(l, std::span<const float>(w0), 0.5, matrix_tensors(l)));
}

TEST_CASE("local masks from weights that differ on one rank are caught on every rank") {
  const auto l = model();
  mpi_sync s{mpi_communicator{MPI_COMM_WORLD}, l};
  pruner pr{magnitude_pruning{},
            gradual_schedule{.final_sparsity = 0.5, .start_step = 0, .interval = 1, .updates = 2},
            matrix_tensors(l)};
  auto w = test::values<float>(l.total_size(), 3);
  CHECK(pr.step(s, std::span<const float>(w)));  // s = 0: full masks, all agree
  const auto before = s.masks();
  if (world_rank() == world_size() - 1) w[l.tensor(2).offset + 5] = 1000.0f;  // a diverged weight
  const std::string msg = error_of([&] { pr.step(s, std::span<const float>(w)); });
  CHECK(test::same_on_every_rank(msg));
  if (world_size() > 1) {
    CHECK(msg ==
          "pactrain: set_masks: masks differ across ranks, first at tensor 2 'fc2.weight' (name as "
          "on rank 0)");
    CHECK(s.masks() == before);
    CHECK(pr.current_step() == 1);  // the failed update did not advance
  }
}

TEST_CASE("a policy failing on one rank fails every rank, in both modes") {
  for (auto source : {mask_source::local, mask_source::root_broadcast}) {
    const auto l = model();
    mpi_sync s{mpi_communicator{MPI_COMM_WORLD}, l};
    pruner pr{magnitude_pruning{},
              gradual_schedule{.final_sparsity = 0.5, .start_step = 0, .interval = 1, .updates = 1},
              matrix_tensors(l), source};
    auto w = test::values<float>(l.total_size(), 3);
    const int culprit = source == mask_source::local ? world_size() - 1 : 0;
    if (world_rank() == culprit) w[7] = std::nanf("");
    const std::string msg = error_of([&] { pr.step(s, std::span<const float>(w)); });
    CHECK(test::same_on_every_rank(msg));
    CHECK(msg.find("weight 7 of tensor 'fc1.weight' is not finite") != std::string::npos);
    CHECK(s.masks()[0].count() == 3136);
  }
}

TEST_CASE("a checkpoint saved on every rank resumes on every rank") {
  const auto l = model();
  const auto sched =
      gradual_schedule{.final_sparsity = 0.8, .start_step = 1, .interval = 2, .updates = 3};
  mpi_sync a{mpi_communicator{MPI_COMM_WORLD}, l};
  pruner pa{magnitude_pruning{}, sched, matrix_tensors(l)};
  auto w = test::values<float>(l.total_size(), 1);
  train(a, pa, w, 4);
  const auto ckpt = pa.save(a);
  mpi_sync b{mpi_communicator{MPI_COMM_WORLD}, l};
  pruner pb{magnitude_pruning{}, sched, matrix_tensors(l)};
  pb.load(b, ckpt);
  CHECK(b.masks() == a.masks());
  CHECK(pb.current_step() == 4);
  // A checkpoint corrupted on one rank is rejected on all.
  auto bad = ckpt;
  if (world_rank() == 0) bad[bad.size() / 2] ^= std::byte{4};
  const std::string msg = error_of([&] { pb.load(b, bad); });
  CHECK(test::same_on_every_rank(msg));
  CHECK(msg.find("checksum mismatch") != std::string::npos);
  CHECK(b.masks() == a.masks());
}

TEST_CASE("checkpoints of different steps fail on every rank and change nothing") {
  const auto l = model();
  const auto sched =
      gradual_schedule{.final_sparsity = 0.8, .start_step = 1, .interval = 2, .updates = 3};
  mpi_sync a{mpi_communicator{MPI_COMM_WORLD}, l};
  pruner pa{magnitude_pruning{}, sched, matrix_tensors(l)};
  auto w = test::values<float>(l.total_size(), 1);
  train(a, pa, w, 8);  // the last update is at step 7: the masks are final from here
  const auto at8 = pa.save(a);
  train(a, pa, w, 2);
  const auto at10 = pa.save(a);
  mpi_sync b{mpi_communicator{MPI_COMM_WORLD}, l};
  pruner pb{magnitude_pruning{}, sched, matrix_tensors(l)};
  const auto masks = b.masks();
  if (world_size() > 1) {
    // Same masks, other steps: before, the ranks went on to different update steps and hung.
    const std::string msg =
        error_of([&] { pb.load(b, world_rank() == world_size() - 1 ? at10 : at8); });
    CHECK(test::same_on_every_rank(msg));
    CHECK(msg ==
          "pactrain: pruner::load: pruner steps, schedules, mask sources or prunable flags "
          "differ across ranks");
    CHECK(b.masks() == masks);
    CHECK(pb.current_step() == 0);
  }
  pb.load(b, at10);
  CHECK(pb.current_step() == 10);
  CHECK(b.masks() == a.masks());
}

TEST_CASE("pruners with different schedules or mask sources fail at their first step") {
  const auto l = model();
  const bool last = world_rank() == world_size() - 1;
  const auto w = test::values<float>(l.total_size(), 1);
  {
    mpi_sync s{mpi_communicator{MPI_COMM_WORLD}, l};
    const auto sched = gradual_schedule{
        .final_sparsity = 0.8, .start_step = 1, .interval = last ? 3u : 2u, .updates = 3};
    pruner p{magnitude_pruning{}, sched, matrix_tensors(l)};
    const std::string msg = error_of([&] { p.step(s, std::span<const float>(w)); });
    CHECK(test::same_on_every_rank(msg));
    CHECK(msg == (world_size() > 1 ? "pactrain: pruner::step: pruner steps, schedules, mask "
                                     "sources or prunable flags differ across ranks"
                                   : ""));
    CHECK(p.current_step() == (world_size() > 1 ? 0u : 1u));
  }
  {
    mpi_sync s{mpi_communicator{MPI_COMM_WORLD}, l};
    pruner p{magnitude_pruning{}, one_shot_schedule{.step = 0, .sparsity = 0.5}, matrix_tensors(l),
             last ? mask_source::root_broadcast : mask_source::local};
    const auto masks = s.masks();
    const std::string msg = error_of([&] { p.step(s, std::span<const float>(w)); });
    CHECK(test::same_on_every_rank(msg));
    CHECK((msg.find("differ across ranks") != std::string::npos) == (world_size() > 1));
    if (world_size() > 1) CHECK(s.masks() == masks);
  }
}
