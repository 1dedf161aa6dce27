// The Fashion-MNIST trainer (examples/fmnist/trainer.hpp) on a slice of the real data: a
// short data-parallel run pruned to 90% learns, keeps exactly the target number of weights,
// holds pruned weights at exactly 0 and ends with the same weights on every rank; and the
// learning-rate schedule (a warm-up, and in pruned runs a second cycle after the last mask
// update).
//
//   cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
//   cmake --build build --target pactrain_mpi_fmnist_training_test
//   ctest --test-dir build -R fmnist_training
#include <doctest/doctest.h>

#include "fmnist/trainer.hpp"

#include <pactrain/pruning/pruner.hpp>

#include <mpi.h>

#include <bit>
#include <cstddef>
#include <cstdint>
#include <string>

#ifndef PACTRAIN_FMNIST_DATA_DIR
#define PACTRAIN_FMNIST_DATA_DIR "/usr/share/datasets/fashion-mnist"
#endif

namespace fm = pactrain::fmnist;

namespace {

// 6000 training and 1000 test samples; an empty message when they loaded.
struct data_slice {
  fm::dataset train_set;
  fm::dataset test_set;
  std::string load_error;
};

data_slice load_slice() {
  data_slice d;
  try {
    d.train_set = fm::load_split(PACTRAIN_FMNIST_DATA_DIR, "train", 6000);
    d.test_set = fm::load_split(PACTRAIN_FMNIST_DATA_DIR, "t10k", 1000);
  } catch (const std::exception& e) {
    d.load_error = e.what();
  }
  return d;
}

// Weights whose bits differ between two runs of the same model.
std::size_t differing_weights(const fm::train_result& a, const fm::train_result& b) {
  REQUIRE(a.params.size() == b.params.size());
  std::size_t differ = 0;
  for (std::size_t i = 0; i < a.params.size(); ++i) {
    differ +=
        std::bit_cast<std::uint32_t>(a.params[i]) != std::bit_cast<std::uint32_t>(b.params[i]);
  }
  return differ;
}

// The short run both cases train: 2 epochs pruned gradually to 90%.
fm::train_config slice_config() {
  fm::train_config cfg;
  cfg.hidden = {256, 128};
  cfg.epochs = 2;
  cfg.batch = 32;
  cfg.lr = 0.05f;
  cfg.seed = 7;
  cfg.sparsity = 0.9;
  cfg.prune_start = 0.1;
  cfg.prune_end = 0.6;
  cfg.prune_updates = 8;
  cfg.scope = pactrain::pruning_scope::global;
  return cfg;
}

}  // namespace

TEST_CASE("a short sparse run on a slice of Fashion-MNIST learns and keeps its masks") {
  // Small: a 784-256-128-10 MLP (235k parameters), 6000 training and 1000 test samples, 2 epochs.
  const data_slice d = load_slice();
  // Every rank reads the same files, so every rank fails here alike and none is left waiting.
  CHECK_MESSAGE(d.load_error.empty(), d.load_error);
  if (!d.load_error.empty()) return;

  int ranks = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);

  const fm::train_config cfg = slice_config();
  const fm::train_result r = fm::train(cfg, d.train_set, d.test_set, MPI_COMM_WORLD);

  MESSAGE("ranks " << ranks << ": test accuracy " << r.test_accuracy << ", sparsity " << r.sparsity
                   << ", " << r.steps << " steps, " << r.mask_updates << " mask updates, "
                   << r.bytes_per_step << " bytes per step");
  CHECK(r.steps == 2 * (6000 / static_cast<std::size_t>(ranks) / 32));
  CHECK(r.test_accuracy > 0.6);  // chance is 0.1
  CHECK(r.history.size() == 2);
  CHECK(r.history.back().train_loss < r.history.front().train_loss);
  CHECK(r.mask_updates == cfg.prune_updates + 1);

  // The final masks keep exactly the target count: global magnitude pruning prunes
  // pruned_count(prunable entries, 0.9) of the weights; biases stay dense.
  const auto& layout = r.layout;
  REQUIRE(r.masks.size() == layout.tensor_count());
  std::size_t prunable = 0;
  std::size_t kept = 0;
  std::size_t kept_all = 0;
  for (std::size_t i = 0; i < layout.tensor_count(); ++i) {
    const auto& t = layout.tensor(i);
    kept_all += r.masks[i].count();
    if (t.rows > 0) {
      prunable += t.size;
      kept += r.masks[i].count();
    } else {
      CHECK_MESSAGE(r.masks[i].count() == t.size, t.name << " is not dense");
    }
  }
  CHECK(prunable == r.prunable_weights);
  CHECK(kept == prunable - pactrain::pruned_count(prunable, 0.9));
  CHECK(kept == r.kept_weights);
  CHECK(r.sparsity == doctest::Approx(0.9).epsilon(1e-4));
  // Only kept entries go on the wire.
  CHECK(r.bytes_per_step == kept_all * sizeof(float));
  CHECK(r.dense_bytes_per_step == layout.total_size() * sizeof(float));

  // Pruned weights are exactly 0, and so are no kept ones in bulk (the run trained them).
  std::size_t nonzero_pruned = 0;
  std::size_t zero_kept = 0;
  for (std::size_t i = 0; i < layout.tensor_count(); ++i) {
    const auto& t = layout.tensor(i);
    for (std::size_t j = 0; j < t.size; ++j) {
      const float w = r.params[t.offset + j];
      if (!r.masks[i].test(j)) {
        nonzero_pruned += w != 0.0f;
      } else if (t.rows > 0) {
        zero_kept += w == 0.0f;
      }
    }
  }
  CHECK(nonzero_pruned == 0);
  CHECK(zero_kept < kept / 100);

  // Same seed, same averaged gradients: the weights are bit-identical on every rank.
  CHECK(r.weights_agree);
}

TEST_CASE("the same run with ternary lanes and error feedback learns on a fraction of the bytes") {
  const data_slice d = load_slice();
  CHECK_MESSAGE(d.load_error.empty(), d.load_error);
  if (!d.load_error.empty()) return;

  fm::train_config cfg = slice_config();
  cfg.ternary = true;
  const fm::train_result r = fm::train(cfg, d.train_set, d.test_set, MPI_COMM_WORLD);
  MESSAGE("ternary: test accuracy " << r.test_accuracy << ", " << r.bytes_per_step
                                    << " bytes per step");
  CHECK(r.test_accuracy > 0.5);  // chance is 0.1
  CHECK(r.history.back().train_loss < r.history.front().train_loss);
  CHECK(r.sparsity == doctest::Approx(0.9).epsilon(1e-4));
  std::size_t kept_all = 0;
  for (const auto& m : r.masks) kept_all += m.count();
  // At most 4 bits per kept entry on up to 4 ranks (8 lanes per 32-bit word), plus per bucket
  // a partly filled word, and a scale word per block of ternary_block kept entries.
  CHECK(r.bytes_per_step > 0);
  CHECK(r.bytes_per_step <= kept_all / 2 + r.layout.tensor_count() * 16 +
                                (kept_all / cfg.ternary_block + r.layout.tensor_count()) * 8);
  // The defaults are bench/e2e's layout: a bucket per tensor (3 weights, 3 biases), with a
  // scale per 1024 kept entries from the previous step, reduced beside the data.
  CHECK(cfg.ternary_rows == 0);
  CHECK(cfg.ternary_block == 1024);
  CHECK(cfg.ternary_scale == pactrain::scale_source::previous_max);
  CHECK(r.layout.tensor_count() == 3 + 3);
  CHECK(r.layout.buckets().size() == r.layout.tensor_count());
  CHECK(r.layout.total_size() == 784 * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10);
  CHECK(r.weights_agree);
  for (std::size_t i = 0; i < r.layout.tensor_count(); ++i) {
    const auto& t = r.layout.tensor(i);
    std::size_t nonzero_pruned = 0;
    for (std::size_t j = 0; j < t.size; ++j)
      nonzero_pruned += !r.masks[i].test(j) && r.params[t.offset + j] != 0.0f;
    CHECK_MESSAGE(nonzero_pruned == 0, t.name);
  }
}

TEST_CASE("handing buckets over during backward gives the bits of one allreduce per step") {
  const data_slice d = load_slice();
  CHECK_MESSAGE(d.load_error.empty(), d.load_error);
  if (!d.load_error.empty()) return;

  // Ternary lanes with a scale round per bucket: the path with the most state per bucket (the
  // default, previous_max, reduces the scales beside the data; the other cases run it).
  fm::train_config cfg = slice_config();
  cfg.epochs = 1;
  cfg.ternary = true;
  cfg.ternary_scale = pactrain::scale_source::current_max;
  cfg.overlap = true;
  const fm::train_result a = fm::train(cfg, d.train_set, d.test_set, MPI_COMM_WORLD);
  cfg.overlap = false;
  const fm::train_result b = fm::train(cfg, d.train_set, d.test_set, MPI_COMM_WORLD);
  CHECK(differing_weights(a, b) == 0);
  CHECK(a.test_accuracy == b.test_accuracy);
}

TEST_CASE("the fused optimizer step gives the bits of the sync followed by pactrain::sgd") {
  const data_slice d = load_slice();
  CHECK_MESSAGE(d.load_error.empty(), d.load_error);
  if (!d.load_error.empty()) return;

  // Plain kept entries and ternary lanes (a scale per payload), with the masks changing
  // during the run: the fused update must skip pruned weights exactly as sgd::step leaves them.
  for (const bool ternary : {false, true}) {
    CAPTURE(ternary);
    fm::train_config cfg = slice_config();
    cfg.epochs = 1;
    cfg.batch = 64;  // half the steps of the other cases; still 8 mask updates
    cfg.ternary = ternary;
    cfg.optimizer = fm::optimizer_kind::sgd;
    const fm::train_result a = fm::train(cfg, d.train_set, d.test_set, MPI_COMM_WORLD);
    cfg.optimizer = fm::optimizer_kind::fused;
    const fm::train_result b = fm::train(cfg, d.train_set, d.test_set, MPI_COMM_WORLD);
    CHECK(differing_weights(a, b) == 0);
    CHECK(a.mask_updates > 0);
    CHECK(a.test_accuracy > 0.5);
    CHECK(b.weights_agree);
  }
}

TEST_CASE(
    "the learning rate warms up; pruned runs start a second cycle after the last mask update") {
  fm::train_config cfg = slice_config();
  cfg.lr = 0.1f;
  CHECK(cfg.lr_rewind == 1.0);  // the default: back to the peak rate
  const std::uint64_t n = 1000;
  // Updates at 100, 100 + 62, ..., 100 + 8 * 62 (the window 0.1-0.6 holds 8 intervals of 62).
  const std::uint64_t last = fm::last_mask_update(cfg, n);
  CHECK(last == 100 + 8 * 62);
  fm::train_config dense = cfg;
  dense.sparsity = 0.0;
  CHECK(fm::last_mask_update(dense, n) == n);

  // Up to and including the last update, both follow the same schedule.
  for (std::uint64_t t : {std::uint64_t{0}, std::uint64_t{300}, last}) {
    CHECK(fm::learning_rate(cfg, t, n, last) == fm::learning_rate(dense, t, n, n));
  }
  // The warm-up: 50 steps rising to the peak, where the cosine decay begins.
  CHECK(cfg.lr_warmup == 0.05);
  CHECK(fm::learning_rate(cfg, 0, n, last) == doctest::Approx(0.002));
  for (std::uint64_t t = 0; t < 49; ++t) {
    CHECK(fm::learning_rate(cfg, t + 1, n, last) > fm::learning_rate(cfg, t, n, last));
  }
  CHECK(fm::learning_rate(cfg, 49, n, last) == doctest::Approx(0.1));
  CHECK(fm::learning_rate(cfg, 50, n, last) == 0.1f);
  // After it, the pruned run's rate is back near lr_rewind x lr and falls to 0 at the end.
  CHECK(fm::learning_rate(dense, last + 1, n, n) < 0.045f);
  CHECK(fm::learning_rate(cfg, last + 1, n, last) == doctest::Approx(0.1).epsilon(1e-3));
  cfg.lr_rewind = 0.5;
  CHECK(fm::learning_rate(cfg, last + 1, n, last) == doctest::Approx(0.05).epsilon(1e-3));
  CHECK(fm::learning_rate(cfg, n - 1, n, last) < 1e-5f);
  for (std::uint64_t t = last + 1; t + 1 < n; ++t) {
    CHECK(fm::learning_rate(cfg, t + 1, n, last) <= fm::learning_rate(cfg, t, n, last));
  }
  // lr_rewind 0: the pruned run keeps the dense schedule.
  cfg.lr_rewind = 0.0;
  CHECK(fm::learning_rate(cfg, last + 1, n, last) == fm::learning_rate(dense, last + 1, n, n));
}
