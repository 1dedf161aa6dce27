// The Fashion-MNIST trainer's training loop (declared in trainer.hpp). Compiled once, into the
// pactrain_fmnist_trainer library that pactrain_fmnist, pactrain_e2e and the training test
// link, since instantiating the sync engines and the MLP's Eigen kernels is most of their
// compile time.
#include "fmnist/trainer.hpp"

#include "common/exchange.hpp"
#include "fmnist/mlp.hpp"

#include <pactrain/mpi.hpp>
#include <pactrain/pactrain.hpp>
#include <pactrain/pruning/pruner.hpp>

#include <mpi.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

namespace pactrain::fmnist {

namespace detail {

using ::examples::seconds_since;

// Test accuracy: each rank scores its shard of the test set, the counts are summed.
inline double evaluate(mlp& model, const std::vector<float>& x, const std::vector<std::uint8_t>& y,
                       std::size_t test_count, MPI_Comm comm) {
  constexpr std::size_t chunk = 1000;
  unsigned long long correct = 0;
  for (std::size_t r = 0; r < y.size(); r += chunk) {
    const std::size_t n = std::min(chunk, y.size() - r);
    correct += model.count_correct(x.data() + r * model.inputs(), y.data() + r, n);
  }
  MPI_Allreduce(MPI_IN_PLACE, &correct, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, comm);
  return static_cast<double>(correct) / static_cast<double>(test_count);
}

}  // namespace detail

train_result train(const train_config& cfg, const dataset& train_set, const dataset& test_set,
                   MPI_Comm comm, const std::function<void(const epoch_record&)>& on_epoch,
                   gradient_exchange* exchange) {
  const auto run_start = std::chrono::steady_clock::now();
  int rank = 0;
  int ranks = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &ranks);
  PACTRAIN_EXPECTS(cfg.epochs > 0 && cfg.batch > 0, "train: epochs and batch must be positive");
  PACTRAIN_EXPECTS(cfg.sparsity >= 0.0 && cfg.sparsity < 1.0, "train: sparsity must be in [0, 1)");
  PACTRAIN_EXPECTS(
      cfg.prune_start >= 0.0 && cfg.prune_start < cfg.prune_end && cfg.prune_end <= 1.0,
      "train: need 0 <= prune_start < prune_end <= 1");
  PACTRAIN_EXPECTS(cfg.lr_warmup >= 0.0 && cfg.lr_hold >= 0.0 && cfg.lr_warmup + cfg.lr_hold < 1.0,
                   "train: need lr_warmup, lr_hold >= 0 and lr_warmup + lr_hold < 1");
  PACTRAIN_EXPECTS(cfg.lr_rewind >= 0.0, "train: lr_rewind must not be negative");
  PACTRAIN_EXPECTS(cfg.evals_per_epoch > 0, "train: evals_per_epoch must be positive");
  PACTRAIN_EXPECTS(train_set.features() == test_set.features(),
                   "train: train and test images differ in size");
  PACTRAIN_EXPECTS(exchange == nullptr || (cfg.sparsity == 0.0 && !cfg.ternary),
                   "train: a gradient_exchange trains dense (sparsity 0, no ternary codec)");
  PACTRAIN_EXPECTS(exchange == nullptr || cfg.optimizer != optimizer_kind::fused,
                   "train: the fused optimizer step needs the sync engine, not an exchange");

  enable_flush_to_zero();

  std::vector<std::size_t> sizes{train_set.features()};
  sizes.insert(sizes.end(), cfg.hidden.begin(), cfg.hidden.end());
  sizes.push_back(class_count);
  mlp model(sizes);
  model.init(cfg.seed);
  const param_layout& layout = model.layout();

  // Every rank takes the same number of steps: the smallest shard decides.
  const std::vector<std::size_t> my_train = shard(train_set.count, rank, ranks);
  const std::size_t min_shard = train_set.count / static_cast<std::size_t>(ranks);
  const std::size_t steps_per_epoch = min_shard / cfg.batch;
  PACTRAIN_EXPECTS(steps_per_epoch > 0, "train: " + std::to_string(train_set.count) +
                                            " training samples give less than "
                                            "one batch of " +
                                            std::to_string(cfg.batch) + " per rank on " +
                                            std::to_string(ranks) + " ranks");
  const std::vector<float> x_train = features(train_set, my_train);
  std::vector<std::uint8_t> y_train;
  for (auto i : my_train) y_train.push_back(train_set.labels[i]);
  const std::vector<std::size_t> my_test = shard(test_set.count, rank, ranks);
  const std::vector<float> x_test = features(test_set, my_test);
  std::vector<std::uint8_t> y_test;
  for (auto i : my_test) y_test.push_back(test_set.labels[i]);

  const bool sparse = cfg.sparsity > 0.0;
  const sync_options sync_opt{.strategy =
                                  sparse ? bucket_strategy::sparse : bucket_strategy::dense};
  // The loop below, over whichever sync engine the config asks for.
  auto run = [&](auto& sync) -> train_result {
    constexpr bool engine = !::examples::is_exchange_engine<decltype(sync)>;
    const std::uint64_t total_steps = static_cast<std::uint64_t>(cfg.epochs) * steps_per_epoch;
    const std::uint64_t last_update = last_mask_update(cfg, total_steps);
    // The engine's layout: the model's, or with ternary_rows its weights split by rows. The
    // same entries at the same offsets either way; masks and pruning follow the engine's.
    const param_layout& sync_layout = sync.layout();
    const std::vector<bool> prunable = matrix_tensors(sync_layout);
    using pruner_t = pruner<magnitude_pruning, gradual_schedule>;
    std::optional<pruner_t> pr;
    if (engine && sparse) {
      pr.emplace(magnitude_pruning{cfg.scope}, make_schedule(cfg, total_steps), prunable,
                 mask_source::local);
    }

    const bool plain_sgd = exchange != nullptr && exchange->applies_momentum();
    const float momentum = plain_sgd ? 0.0f : cfg.momentum;
    const float weight_decay = plain_sgd ? 0.0f : cfg.weight_decay;
    // optimizer_kind::example steps with opt, the others with psgd and its momentum buffer.
    sgd_momentum opt(layout.total_size(), momentum, weight_decay);
    sgd psgd({.lr = cfg.lr, .momentum = momentum, .weight_decay = weight_decay});
    std::vector<float> psgd_momentum;
    if (cfg.optimizer != optimizer_kind::example) psgd_momentum.assign(layout.total_size(), 0.0f);
    const std::span<float> velocity =
        cfg.optimizer == optimizer_kind::example ? opt.velocity() : std::span(psgd_momentum);
    const bool fused = engine && cfg.optimizer == optimizer_kind::fused;
    // finish_step, or finish_step fused with the optimizer step.
    auto finish = [&] {
      if constexpr (engine) {
        if (fused) {
          auto update = psgd.fused(sync_layout, sync.masks(), model.params(), velocity);
          sync.finish_step(update);
          return;
        }
      }
      sync.finish_step();
    };
    // cfg.tune: the strategy tuner, made at the last mask update and run until it has chosen.
    std::optional<strategy_tuner> tuner;
    const std::size_t f = model.inputs();
    std::vector<float> xb(cfg.batch * f);
    std::vector<std::uint8_t> yb(cfg.batch);
    std::vector<std::size_t> order(my_train.size());

    train_result res;
    res.steps_per_epoch = steps_per_epoch;
    std::uint64_t step = 0;
    double train_seconds = 0;
    double sync_seconds = 0;
    double prune_seconds = 0;
    double bytes_sent = 0;  // payload bytes this rank sent, over the run
    for (int epoch = 1; epoch <= cfg.epochs; ++epoch) {
      // The same permutation of shard positions on every rank.
      for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
      shuffle(order, cfg.seed * 0x9e3779b97f4a7c15ULL + static_cast<std::uint64_t>(epoch));

      double loss_sum = 0;
      double epoch_sync = 0;
      double epoch_prune = 0;
      double epoch_eval = 0;  // evaluation inside the epoch, not timed
      double accuracy = 0;    // the last evaluation's
      const auto epoch_start = std::chrono::steady_clock::now();
      for (std::size_t s = 0; s < steps_per_epoch; ++s, ++step) {
        for (std::size_t b = 0; b < cfg.batch; ++b) {
          const std::size_t i = order[s * cfg.batch + b];
          std::copy_n(x_train.data() + i * f, f, xb.data() + b * f);
          yb[b] = y_train[i];
        }
        const float lr = learning_rate(cfg, step, total_steps, last_update);
        psgd.set_lr(lr);
        bool tuned_step = false;
        if constexpr (engine) {
          if (cfg.tune && sparse && step >= last_update && !tuner) {
            const auto model =
                calibrate(sync.get_communicator(), {}, sync.compactor(), sync.codec());
            tuner.emplace(candidate_strategies(model, ranks, bucket_shapes(sync)));
          }
          tuned_step = tuner && tuner->tuning();
          if (tuned_step) tuner->begin_step(sync);
        }
        if (cfg.overlap) {
          // Layer k's weights and bias lie from tensor 2k's offset on, and backward finishes
          // the layers last to first: after layer k, every bucket from that offset on is final.
          sync.begin_step(model.grads());
          const auto& buckets = sync_layout.buckets();
          std::size_t pending = buckets.size();  // buckets [pending, end) are submitted
          loss_sum += model.train_batch(xb.data(), yb.data(), cfg.batch, [&](std::size_t k) {
            const auto t0 = std::chrono::steady_clock::now();
            const std::size_t from = layout.tensor(2 * k).offset;
            while (pending > 0 && buckets[pending - 1].offset >= from) {
              sync.submit_bucket(--pending);
            }
            epoch_sync += detail::seconds_since(t0);
          });
          const auto t0 = std::chrono::steady_clock::now();
          finish();
          epoch_sync += detail::seconds_since(t0);
        } else {
          loss_sum += model.train_batch(xb.data(), yb.data(), cfg.batch);
          const auto t0 = std::chrono::steady_clock::now();
          sync.begin_step(model.grads());
          finish();
          epoch_sync += detail::seconds_since(t0);
        }
        if constexpr (engine) {
          if (tuned_step) tuner->end_step(sync);
        }

        if (cfg.optimizer == optimizer_kind::example) {
          opt.step(model.params(), model.grads(), lr);
        } else if (!fused) {
          psgd.step(model.params(), model.grads(), velocity);
        }
        bytes_sent += static_cast<double>(sync.stats().bytes_sent);

        if constexpr (engine) {
          if (pr) {
            const auto t1 = std::chrono::steady_clock::now();
            if (pr->step(sync, std::span<const float>(model.params()))) {
              ++res.mask_updates;
              // Newly pruned entries start at exactly 0. Between updates they stay there
              // without help: their averaged gradient is +0, so the momentum stays 0 and so
              // does w.
              apply_masks(sync_layout, sync.masks(), model.params());
              apply_masks(sync_layout, sync.masks(), velocity);
            }
            epoch_prune += detail::seconds_since(t1);
          }
        }
        if (::examples::evaluates_after(s, steps_per_epoch, cfg.evals_per_epoch)) {
          const auto t2 = std::chrono::steady_clock::now();
          double so_far = train_seconds + detail::seconds_since(epoch_start) - epoch_eval;
          MPI_Allreduce(MPI_IN_PLACE, &so_far, 1, MPI_DOUBLE, MPI_SUM, comm);
          accuracy = detail::evaluate(model, x_test, y_test, test_set.count, comm);
          res.evals.push_back(
              {.step = step + 1,
               .epoch = static_cast<double>(step + 1) / static_cast<double>(steps_per_epoch),
               .train_seconds = so_far / ranks,
               .test_accuracy = accuracy});
          epoch_eval += detail::seconds_since(t2);
        }
      }
      // Loss summed, times averaged over the ranks (a fast rank waits longer in the sync).
      double sums[4] = {loss_sum, detail::seconds_since(epoch_start) - epoch_eval, epoch_sync,
                        epoch_prune};
      MPI_Allreduce(MPI_IN_PLACE, sums, 4, MPI_DOUBLE, MPI_SUM, comm);
      const double epoch_seconds = sums[1] / ranks;
      epoch_sync = sums[2] / ranks;
      epoch_prune = sums[3] / ranks;
      train_seconds += epoch_seconds;
      sync_seconds += epoch_sync;
      prune_seconds += epoch_prune;

      epoch_record rec;
      rec.epoch = epoch;
      rec.train_loss =
          sums[0] / static_cast<double>(steps_per_epoch * static_cast<std::size_t>(ranks));
      rec.test_accuracy = accuracy;  // the epoch's last evaluation is at its end
      std::size_t kept = 0;
      std::size_t total = 0;
      for (std::size_t i = 0; i < sync_layout.tensor_count(); ++i) {
        if (!prunable[i]) continue;
        kept += sync.masks()[i].count();
        total += sync_layout.tensor(i).size;
      }
      rec.sparsity = 1.0 - static_cast<double>(kept) / static_cast<double>(total);
      rec.bytes_per_step = sync.stats().bytes_sent;
      rec.step_seconds = epoch_seconds / static_cast<double>(steps_per_epoch);
      rec.sync_seconds = epoch_sync / static_cast<double>(steps_per_epoch);
      rec.prune_seconds = epoch_prune / static_cast<double>(steps_per_epoch);
      rec.epoch_seconds = epoch_seconds;
      res.history.push_back(rec);
      res.kept_weights = kept;
      res.prunable_weights = total;
      if (on_epoch) on_epoch(rec);
    }

    res.test_accuracy = res.history.back().test_accuracy;
    res.sparsity = res.history.back().sparsity;
    res.bytes_per_step = sync.stats().bytes_sent;
    res.dense_bytes_per_step = sync.stats().dense_bytes;
    res.collectives_per_step = sync.stats().collectives;
    res.mean_bytes_per_step = bytes_sent / static_cast<double>(step);
    res.steps = step;
    res.train_seconds = train_seconds;
    res.step_seconds = train_seconds / static_cast<double>(step);
    res.sync_seconds = sync_seconds / static_cast<double>(step);
    res.prune_seconds = prune_seconds / static_cast<double>(step);
    res.weights_agree = ::examples::same_on_all_ranks(model.params(), comm);
    res.masks = sync.masks();
    res.params.assign(model.params().begin(), model.params().end());
    res.layout = sync_layout;
    res.total_seconds = detail::seconds_since(run_start);
    return res;
  };

  if (exchange != nullptr) {
    ::examples::exchange_engine x{mpi_communicator{comm}, layout, *exchange};
    x.bind_params(model.params());
    return run(x);
  }
  if (cfg.ternary) {
    // One bucket per tensor, and per block of ternary_rows rows of a weight matrix, so that
    // each gets its own ternary scale (the layers' gradients differ by orders of magnitude,
    // and so do the rows of one matrix; a shared scale would round most of them to 0). The
    // blocks are the same entries at the same offsets as the model's tensors.
    param_layout per_tensor(1);
    for (const auto& t : layout.tensors()) {
      if (t.rows == 0 || cfg.ternary_rows == 0 || cfg.ternary_rows >= t.rows) {
        if (t.rows == 0) {
          per_tensor.add(t.name, t.size);
        } else {
          per_tensor.add(t.name, t.rows, t.cols);
        }
        continue;
      }
      for (std::size_t r = 0; r < t.rows; r += cfg.ternary_rows) {
        const std::size_t n = std::min(cfg.ternary_rows, t.rows - r);
        per_tensor.add(t.name + ".rows" + std::to_string(r), n, t.cols);
      }
    }
    pactrain::sync sync{
        mpi_communicator{comm}, per_tensor,
        error_feedback{ternary_codec{
            {.seed = cfg.seed, .scale = cfg.ternary_scale, .scale_block = cfg.ternary_block}}},
        sync_opt};
    return run(sync);
  }
  pactrain::sync sync{mpi_communicator{comm}, layout, sync_opt};
  return run(sync);
}

}  // namespace pactrain::fmnist
