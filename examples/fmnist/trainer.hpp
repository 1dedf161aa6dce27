// Data-parallel training of the Fashion-MNIST MLP over MPI, with pactrain's sync engine
// averaging the gradients and, in a sparse run, a gradual magnitude pruner shrinking them.
//
// The run's configuration and helpers; the training loop is in trainer.cpp, compiled once into
// the pactrain_fmnist_trainer library for pactrain_fmnist, pactrain_e2e and the tests. Build
// and run (from the repository root):
//   cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
//   cmake --build build --target pactrain_fmnist
//   export OMPI_MCA_mpi_yield_when_idle=1
//   mpiexec --allow-run-as-root --oversubscribe -n 4 build/examples/pactrain_fmnist
//
// Every rank starts from the same seeded initialisation and trains on its shard (rank r takes
// samples r, r + P, ...), shuffled each epoch with the same seed-determined permutation of
// shard positions. One step: forward and backward on the local mini-batch, sync.allreduce of
// the flat gradient (the mean over ranks; pruned entries come back as +0), SGD with momentum,
// then pruner.step (which commits new masks on update steps) and, after an update, apply_masks
// on weights and momentum, so pruned weights are exactly 0 and stay so. The weights therefore stay
// bit-identical on every rank, and each rank computes the same masks locally.
#pragma once

#include "common/exchange.hpp"
#include "common/lr_schedule.hpp"
#include "common/run_report.hpp"
#include "fmnist/idx.hpp"

#include <pactrain/pactrain.hpp>
#include <pactrain/pruning/pruner.hpp>

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace pactrain::fmnist {

/// Which optimiser steps the weights.
enum class optimizer_kind {
  // fmnist::sgd_momentum (mlp.hpp): a plain multiply and add per entry; the demo's figures.
  example,
  // pactrain::sgd after the sync (as torch::optim::SGD on a CPU with FMA).
  sgd,
  // pactrain::sgd fused into the sync (sync::finish_step(update)): the engine hands each
  // bucket's average to the optimiser, a sparse bucket's as its kept entries, and the dense
  // gradient is never written back. The same bits as `sgd`.
  fused,
};

/// "example", "sgd" or "fused".
inline const char* to_string(optimizer_kind k) noexcept {
  constexpr const char* names[] = {"example", "sgd", "fused"};
  return names[static_cast<int>(k)];
}

/// The optimizer_kind named `name` (as --optimizer gives it); throws pactrain::error for
/// another name.
inline optimizer_kind optimizer_from_string(const std::string& name) {
  for (auto k : {optimizer_kind::example, optimizer_kind::sgd, optimizer_kind::fused})
    if (name == to_string(k)) return k;
  throw pactrain::error("--optimizer: expected example, sgd or fused, got '" + name + "'");
}

/// What one run does. sparsity == 0 is the dense baseline: no pruner, and the sync engine
/// allreduces whole buckets (bucket_strategy::dense), as a trainer without pactrain would.
struct train_config {
  std::vector<std::size_t> hidden = {1024, 64};
  int epochs = 17;
  std::size_t batch = 128;  // per rank
  float lr = 0.1f;          // peak learning rate
  // Fraction of the steps over which the rate rises linearly from 0 to lr: at the full rate
  // from the first step, the He-initialised MLP's loss jumps and takes epochs to recover.
  double lr_warmup = 0.05;
  double lr_hold = 0.0;  // fraction of the steps at the peak, then cosine decay to 0
  // Pruned runs only: after the last mask update the rate goes back up to lr_rewind x lr and
  // decays by cosine to 0 again, a second cycle for the final sparse network, which the
  // nearly spent first cycle leaves underfitted (0: the dense run's schedule throughout).
  double lr_rewind = 1.0;
  float momentum = 0.9f;
  float weight_decay = 1e-4f;
  std::uint64_t seed = 1;
  double sparsity = 0.0;  // final fraction of prunable weights pruned
  // Gradual pruning window, as fractions of all training steps: dense before prune_start,
  // final sparsity from prune_end on, `prune_updates` mask updates in between.
  double prune_start = 0.2;
  double prune_end = 0.7;
  std::uint64_t prune_updates = 20;
  pruning_scope scope = pruning_scope::global;
  // How kept entries travel: as float, or as ternary lanes (pactrain::ternary_codec, scale
  // from a MAX allreduce, stochastic rounding seeded from `seed`) with error feedback.
  bool ternary = false;
  // Ternary only: split each weight matrix into blocks of this many rows, each its own tensor
  // and bucket of the sync engine's layout, so that each block gets its own scale (0: a bucket
  // per tensor). Fine scales matter, since a scale is its block's largest |g| and over a whole
  // 1024 x 784 matrix nearly every entry would be sent as 0, but ternary_block gives them
  // without a collective per block: 64 rows made 21 buckets and 42 collectives a step.
  std::size_t ternary_rows = 0;
  // Ternary only: one scale per block of this many kept entries of a bucket
  // (ternary_options::scale_block; 0: one per bucket).
  std::size_t ternary_block = 1024;
  // Ternary only: where the scale comes from (current_max: a small MAX allreduce before
  // encoding; previous_max: the last step's, reduced beside the data, one collective less).
  // These three defaults are the layout bench/e2e measures (bench/results/e2e.md); 64-row
  // buckets with current_max took about twice as long a step at 100 Mbit/s
  // (bench/results/measurements.md).
  scale_source ternary_scale = scale_source::previous_max;
  // Hand each bucket to the sync engine as soon as backward has produced it (begin_step,
  // submit_bucket, finish_step), so its allreduce overlaps the earlier layers' backward;
  // false: one sync.allreduce after backward. Both give the same bits.
  bool overlap = true;
  // Pruned runs: once the masks are final, calibrate the cost model on this run's link and
  // buckets and let pactrain::strategy_tuner time the planner's candidate strategies on the
  // next training steps, keeping the fastest (with ternary: plain and coded buckets compete).
  bool tune = false;
  optimizer_kind optimizer = optimizer_kind::example;
  // Evaluations of the test accuracy per epoch, at evenly spread steps, the last at the
  // epoch's end; outside the timed steps.
  std::size_t evals_per_epoch = 1;
};

/// The interface of the gradient exchanges train() takes instead of a sync engine.
using gradient_exchange = ::examples::gradient_exchange;

/// The records of an epoch and of a run, shared with the LibTorch example.
using epoch_record = ::examples::epoch_record;
using train_result = ::examples::train_result;

/// Normalised features of the selected samples: (pixel / 255 - mean) / std, one row each.
inline std::vector<float> features(const dataset& d, const std::vector<std::size_t>& samples) {
  constexpr float mean = 0.2860f;  // of the Fashion-MNIST training pixels
  constexpr float inv_std = 1.0f / 0.3530f;
  const std::size_t f = d.features();
  std::vector<float> x(samples.size() * f);
  for (std::size_t r = 0; r < samples.size(); ++r) {
    const std::uint8_t* p = d.pixels.data() + samples[r] * f;
    for (std::size_t j = 0; j < f; ++j) {
      x[r * f + j] = (static_cast<float>(p[j]) * (1.0f / 255.0f) - mean) * inv_std;
    }
  }
  return x;
}

/// Samples rank, rank + ranks, ... of n.
inline std::vector<std::size_t> shard(std::size_t n, int rank, int ranks) {
  std::vector<std::size_t> s;
  for (std::size_t i = static_cast<std::size_t>(rank); i < n; i += static_cast<std::size_t>(ranks))
    s.push_back(i);
  return s;
}

/// The gradual schedule of a run of `total_steps` steps (cfg.prune_* are fractions of it).
inline gradual_schedule make_schedule(const train_config& cfg, std::uint64_t total_steps) {
  return gradual_schedule::over_run(total_steps, cfg.prune_start, cfg.prune_end, cfg.sparsity,
                                    cfg.prune_updates);
}

/// The step of a run of `total_steps` steps after which the masks no longer change: the
/// schedule's last update in a pruned run, total_steps in a dense one.
inline std::uint64_t last_mask_update(const train_config& cfg, std::uint64_t total_steps) {
  if (cfg.sparsity <= 0.0) return total_steps;
  return ::examples::last_mask_update(make_schedule(cfg, total_steps), total_steps);
}

/// The learning rate of step t of n: a linear rise to cfg.lr over the first cfg.lr_warmup of
/// the steps, cfg.lr for the next cfg.lr_hold, then a cosine decay to 0 at the end. In a pruned run
/// with cfg.lr_rewind > 0, the steps after the last mask update (`last_update`) instead follow a
/// second cosine from lr_rewind x lr to 0.
inline float learning_rate(const train_config& cfg, std::uint64_t t, std::uint64_t n,
                           std::uint64_t last_update) {
  const ::examples::lr_shape shape{
      .warmup = cfg.lr_warmup, .hold = cfg.lr_hold, .rewind = cfg.lr_rewind};
  return cfg.lr * static_cast<float>(::examples::lr_factor(shape, t, n, last_update));
}

/// Trains one run on `comm` (collective: every rank calls it with the same config and data).
/// `on_epoch` runs on every rank after each epoch's evaluation. With `exchange`, the gradients
/// go through it instead of a sync engine (a dense run: cfg.sparsity must be 0).
train_result train(const train_config& cfg, const dataset& train_set, const dataset& test_set,
                   MPI_Comm comm, const std::function<void(const epoch_record&)>& on_epoch = {},
                   gradient_exchange* exchange = nullptr);

}  // namespace pactrain::fmnist
