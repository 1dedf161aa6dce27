// pactrain_torch_cnn: a LibTorch convolutional network on Fashion-MNIST, data-parallel over
// MPI, dense against pruned (and ternary-coded) gradient synchronisation through
// pactrain/torch.hpp, with the same seed and epochs, one run after the other.
//
// Build and run (from the repository root; needs libtorch-dev, zlib1g-dev and
// dataset-fashion-mnist; one LibTorch thread per rank when ranks share cores):
//   cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
//   cmake --build build --target pactrain_torch_cnn
//   export OMPI_MCA_mpi_yield_when_idle=1 OMP_NUM_THREADS=1
//   mpiexec --allow-run-as-root --oversubscribe -n 4 build/examples/pactrain_torch_cnn
// PACTRAIN_DEMO=torch-cnn scripts/demo.sh does all of it (and writes build/demo/summary.json).
//
// Options (defaults in brackets):
//   --mode all|both|dense|sparse|ternary  which runs [all: dense, sparse, ternary; both: the
//                             first two]
//   --epochs N                epochs of each run [4]
//   --batch B                 mini-batch per rank [32]
//   --lr X                    peak learning rate, cosine decay to 0 [0.05]
//   --momentum X              SGD momentum [0.9]
//   --weight-decay X          L2 weight decay [5e-4]
//   --sparsity S              final fraction of weights pruned in the pruned runs [0.9]
//   --prune-window A,B        gradual pruning from A to B, fractions of the steps [0.1,0.6]
//   --prune-updates N         mask updates in the window [20]
//   --train-limit N           use the first N training samples (0: all) [0]
//   --test-limit N            use the first N test samples (0: all) [0]
//   --data DIR                the four IDX files [/usr/share/datasets/fashion-mnist]
//   --summary PATH            write a JSON summary (accuracies as fractions in [0, 1])
//   --seed N                  initialisation, shuffling and rounding seed [1]
#include <pactrain/torch.hpp>  // first: LibTorch's glog macros must not meet others

#include "common/cli.hpp"
#include "common/run_main.hpp"
#include "common/run_report.hpp"
#include "fmnist/idx.hpp"
#include "fmnist/load.hpp"

#include <pactrain/mpi.hpp>
#include <pactrain/pactrain.hpp>
#include <pactrain/sgd.hpp>

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <numbers>
#include <optional>
#include <random>
#include <string>
#include <vector>

namespace {

namespace fm = pactrain::fmnist;
using clock_type = std::chrono::steady_clock;

/// conv(1->16, 5x5) -> relu -> maxpool 2 -> conv(16->32, 5x5) -> relu -> maxpool 2 ->
/// fc(512->128) -> relu -> fc(128->10).
struct cnn_impl : torch::nn::Module {
  cnn_impl()
      : conv1(register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 16, 5)))),
        conv2(register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(16, 32, 5)))),
        fc1(register_module("fc1", torch::nn::Linear(512, 128))),
        fc2(register_module("fc2", torch::nn::Linear(128, 10))) {}

  torch::Tensor forward(torch::Tensor x) {
    x = torch::max_pool2d(torch::relu(conv1->forward(x)), 2);
    x = torch::max_pool2d(torch::relu(conv2->forward(x)), 2);
    x = torch::relu(fc1->forward(x.flatten(1)));
    return fc2->forward(x);
  }

  torch::nn::Conv2d conv1;
  torch::nn::Conv2d conv2;
  torch::nn::Linear fc1;
  torch::nn::Linear fc2;
};
TORCH_MODULE_IMPL(cnn, cnn_impl);

const char* const model_name = "conv5x5(1-16)-pool-conv5x5(16-32)-pool-fc(512-128)-fc(128-10)";

struct options {
  std::string mode = "all";
  int epochs = 4;
  std::int64_t batch = 32;  // per rank
  double lr = 0.05;
  double momentum = 0.9;
  double weight_decay = 5e-4;
  double sparsity = 0.9;
  double prune_start = 0.1;
  double prune_end = 0.6;
  std::uint64_t prune_updates = 20;
  std::size_t train_limit = 0;
  std::size_t test_limit = 0;
  std::uint64_t seed = 1;
  std::string data = fm::default_data_dir;
  std::string summary;
};

constexpr const char* usage =
    "usage: pactrain_torch_cnn [--mode all|both|dense|sparse|ternary] [--epochs N] [--batch B]\n"
    "       [--lr X] [--momentum X] [--weight-decay X] [--sparsity S] [--prune-window A,B]\n"
    "       [--prune-updates N] [--train-limit N] [--test-limit N] [--data DIR]\n"
    "       [--summary PATH] [--seed N]";

options parse(int argc, char** argv) {
  using examples::to_count;
  using examples::to_double;
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") throw pactrain::error(usage);
    if (i + 1 >= argc) throw pactrain::error(a + ": missing value (or unknown option)\n" + usage);
    const std::string v = argv[++i];
    if (a == "--mode") {
      if (v != "all" && v != "both" && v != "dense" && v != "sparse" && v != "ternary") {
        throw pactrain::error("--mode: expected all, both, dense, sparse or ternary, got '" + v +
                              "'");
      }
      o.mode = v;
    } else if (a == "--epochs") {
      o.epochs = static_cast<int>(to_count(a, v));
    } else if (a == "--batch") {
      o.batch = static_cast<std::int64_t>(to_count(a, v));
    } else if (a == "--lr") {
      o.lr = to_double(a, v);
    } else if (a == "--momentum") {
      o.momentum = to_double(a, v);
    } else if (a == "--weight-decay") {
      o.weight_decay = to_double(a, v);
    } else if (a == "--sparsity") {
      o.sparsity = to_double(a, v);
    } else if (a == "--prune-window") {
      const auto p = examples::split(v, ',');
      if (p.size() != 2) throw pactrain::error("--prune-window: expected A,B, got '" + v + "'");
      o.prune_start = to_double(a, p[0]);
      o.prune_end = to_double(a, p[1]);
    } else if (a == "--prune-updates") {
      o.prune_updates = to_count(a, v);
    } else if (a == "--train-limit") {
      o.train_limit = to_count(a, v);
    } else if (a == "--test-limit") {
      o.test_limit = to_count(a, v);
    } else if (a == "--data") {
      o.data = v;
    } else if (a == "--summary") {
      o.summary = v;
    } else if (a == "--seed") {
      o.seed = to_count(a, v);
    } else {
      throw pactrain::error("unknown option '" + a + "'\n" + usage);
    }
  }
  if (o.epochs < 1 || o.batch < 1) throw pactrain::error("--epochs and --batch must be positive");
  if (!(o.sparsity > 0.0 && o.sparsity < 1.0))
    throw pactrain::error("--sparsity must be in (0, 1)");
  if (!(o.lr > 0.0) || !(o.momentum >= 0.0 && o.momentum < 1.0) || !(o.weight_decay >= 0.0))
    throw pactrain::error("need --lr > 0, 0 <= --momentum < 1 and --weight-decay >= 0");
  if (!(o.prune_start >= 0.0 && o.prune_start < o.prune_end && o.prune_end <= 1.0))
    throw pactrain::error("--prune-window: need 0 <= A < B <= 1");
  if (o.prune_updates < 1) throw pactrain::error("--prune-updates must be positive");
  return o;
}

/// This rank's samples (rank r takes r, r + P, ...) as normalised images [n, 1, 28, 28] and
/// labels [n].
struct shard {
  torch::Tensor x;
  torch::Tensor y;
};

shard make_shard(const fm::dataset& d, int rank, int ranks) {
  std::vector<std::int64_t> rows;
  for (std::size_t i = static_cast<std::size_t>(rank); i < d.count;
       i += static_cast<std::size_t>(ranks)) {
    rows.push_back(static_cast<std::int64_t>(i));
  }
  const auto n = static_cast<std::int64_t>(d.count);
  const auto side = static_cast<std::int64_t>(d.rows);
  const torch::Tensor all = torch::from_blob(const_cast<std::uint8_t*>(d.pixels.data()),
                                             {n, 1, side, side}, torch::kUInt8);
  const torch::Tensor labels =
      torch::from_blob(const_cast<std::uint8_t*>(d.labels.data()), {n}, torch::kUInt8);
  const torch::Tensor index = torch::tensor(rows, torch::kInt64);
  constexpr double mean = 0.2860;  // of the Fashion-MNIST training pixels
  constexpr double std_dev = 0.3530;
  return {(all.index_select(0, index).to(torch::kFloat32) / 255.0 - mean) / std_dev,
          labels.index_select(0, index).to(torch::kInt64)};
}

/// Test accuracy: each rank scores its shard, the counts are summed.
double evaluate(cnn& model, const shard& test, std::size_t test_count, MPI_Comm comm) {
  torch::NoGradGuard no_grad;
  model->eval();
  long long correct = 0;
  const std::int64_t n = test.x.size(0);
  for (std::int64_t at = 0; at < n; at += 1000) {
    const std::int64_t m = std::min<std::int64_t>(1000, n - at);
    const torch::Tensor pred = model->forward(test.x.narrow(0, at, m)).argmax(1);
    correct += pred.eq(test.y.narrow(0, at, m)).sum().item<std::int64_t>();
  }
  model->train();
  MPI_Allreduce(MPI_IN_PLACE, &correct, 1, MPI_LONG_LONG, MPI_SUM, comm);
  return static_cast<double>(correct) / static_cast<double>(test_count);
}

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

/// One run (collective). `sparsity` 0 is the dense baseline: no pruner. `topt` and
/// `engine_args` (after the communicator and layout) configure the engine.
template <class Sync, class... EngineArgs>
examples::train_result train(const options& o, double sparsity, const shard& train_shard,
                             const shard& test_shard, std::size_t test_count, MPI_Comm comm,
                             const char* name, pactrain::torch_options topt,
                             EngineArgs&&... engine_args) {
  const auto run_start = clock_type::now();
  int rank = 0;
  int ranks = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &ranks);
  // Every rank takes the same number of steps: the smallest shard decides.
  int min_shard = static_cast<int>(train_shard.x.size(0));
  MPI_Allreduce(MPI_IN_PLACE, &min_shard, 1, MPI_INT, MPI_MIN, comm);
  const auto steps_per_epoch = static_cast<std::uint64_t>(min_shard / o.batch);
  PACTRAIN_EXPECTS(steps_per_epoch > 0, "pactrain_torch_cnn: less than one batch per rank");
  const std::uint64_t total_steps = steps_per_epoch * static_cast<std::uint64_t>(o.epochs);

  torch::manual_seed(o.seed);  // the same initial weights everywhere (broadcast makes sure)
  cnn model;
  using pruner_type = pactrain::pruner<pactrain::magnitude_pruning, pactrain::gradual_schedule>;

  // [snippet:setup]
  pactrain::torch_params params(*model, topt);
  Sync sync{pactrain::mpi_communicator{comm}, params.layout(), engine_args...};
  params.broadcast(sync.get_communicator());
  pactrain::torch_overlap<Sync> overlap(params, sync);
  pactrain::sgd opt({.lr = o.lr, .momentum = o.momentum, .weight_decay = o.weight_decay});
  std::optional<pruner_type> pruner;  // none in the dense run
  if (sparsity > 0) {
    pruner.emplace(pactrain::magnitude_pruning{},
                   pactrain::gradual_schedule::over_run(total_steps, o.prune_start, o.prune_end,
                                                        sparsity, o.prune_updates),
                   params.prunable());
  }
  // [/snippet:setup]

  examples::train_result res;
  res.steps_per_epoch = steps_per_epoch;
  std::vector<std::int64_t> order(static_cast<std::size_t>(train_shard.x.size(0)));
  std::uint64_t step = 0;
  for (int epoch = 1; epoch <= o.epochs; ++epoch) {
    // The same permutation of shard positions on every rank.
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = static_cast<std::int64_t>(i);
    std::mt19937_64 rng(o.seed * 0x9e3779b97f4a7c15ULL + static_cast<std::uint64_t>(epoch));
    std::shuffle(order.begin(), order.end(), rng);
    const torch::Tensor perm = torch::tensor(order, torch::kInt64);

    double loss_sum = 0;
    double sync_seconds = 0;
    double prune_seconds = 0;
    const auto epoch_start = clock_type::now();
    for (std::uint64_t s = 0; s < steps_per_epoch; ++s, ++step) {
      const torch::Tensor rows = perm.narrow(0, static_cast<std::int64_t>(s) * o.batch, o.batch);
      const torch::Tensor x = train_shard.x.index_select(0, rows);
      const torch::Tensor y = train_shard.y.index_select(0, rows);
      opt.set_lr(0.5 * o.lr *
                 (1.0 + std::cos(std::numbers::pi * static_cast<double>(step) /
                                 static_cast<double>(total_steps))));
      // [snippet:step]
      overlap.begin_step();  // instead of zero_grad
      const torch::Tensor loss = torch::nn::functional::cross_entropy(model->forward(x), y);
      loss.backward();        // each bucket leaves when its gradients are written
      overlap.finish_step();  // averaged over the ranks, +0 at pruned entries
      if (sync.stats().nonfinite_buckets == 0)
        opt.step(params.values(), params.grads(), params.momentum());
      // [/snippet:step]
      // The engine's own phases; its step clock also spans backward, which the hooks overlap.
      const pactrain::sync_stats& st = sync.stats();
      sync_seconds += st.gather_seconds + st.allreduce_seconds + st.scatter_seconds;
      const auto prune_start = clock_type::now();
      // [snippet:prune]
      if (pruner && pruner->step(sync, params.values_const())) params.apply_masks(sync.masks());
      // [/snippet:prune]
      prune_seconds += seconds_since(prune_start);
      if (pruner && pruner->schedule().is_update_step(step)) ++res.mask_updates;
      loss_sum += loss.item<double>();
    }
    // Loss summed, times averaged over the ranks (a fast rank waits longer in the sync).
    double sums[4] = {loss_sum, seconds_since(epoch_start), sync_seconds, prune_seconds};
    MPI_Allreduce(MPI_IN_PLACE, sums, 4, MPI_DOUBLE, MPI_SUM, comm);
    const auto per_step = static_cast<double>(steps_per_epoch);
    examples::epoch_record rec;
    rec.epoch = epoch;
    rec.train_loss = sums[0] / (per_step * ranks);
    rec.epoch_seconds = sums[1] / ranks;
    rec.step_seconds = rec.epoch_seconds / per_step;
    rec.sync_seconds = sums[2] / ranks / per_step;
    rec.prune_seconds = sums[3] / ranks / per_step;
    rec.test_accuracy = evaluate(model, test_shard, test_count, comm);
    std::size_t kept = 0;
    std::size_t total = 0;
    for (std::size_t i = 0; i < params.layout().tensor_count(); ++i) {
      if (!params.prunable()[i]) continue;
      kept += sync.masks()[i].count();
      total += params.layout().tensor(i).size;
    }
    rec.sparsity = 1.0 - static_cast<double>(kept) / static_cast<double>(total);
    rec.bytes_per_step = sync.stats().bytes_sent;
    res.kept_weights = kept;
    res.prunable_weights = total;
    res.history.push_back(rec);
    res.train_seconds += rec.epoch_seconds;
    res.sync_seconds += rec.sync_seconds * per_step;
    res.prune_seconds += rec.prune_seconds * per_step;
    if (rank == 0) examples::print_progress(name, rec);
  }
  res.test_accuracy = res.history.back().test_accuracy;
  res.sparsity = res.history.back().sparsity;
  res.bytes_per_step = sync.stats().bytes_sent;
  res.dense_bytes_per_step = sync.stats().dense_bytes;
  res.steps = step;
  res.step_seconds = res.train_seconds / static_cast<double>(step);
  res.sync_seconds /= static_cast<double>(step);
  res.prune_seconds /= static_cast<double>(step);
  res.weights_agree = examples::same_on_all_ranks(params.values_const(), comm);
  res.masks = sync.masks();
  res.params.assign(params.values_const().begin(), params.values_const().end());
  res.layout = params.layout();
  res.total_seconds = seconds_since(run_start);
  return res;
}

int run(int argc, char** argv) {
  const auto wall_start = clock_type::now();
  int rank = 0;
  int ranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  const options o = parse(argc, argv);  // same arguments, same verdict on every rank
  // Ranks usually share cores: LibTorch's own thread pools would oversubscribe them.
  torch::set_num_threads(1);

  fm::dataset train_set;
  fm::dataset test_set;
  if (!fm::load_splits(o.data, o.train_limit, o.test_limit, train_set, test_set, MPI_COMM_WORLD))
    return 1;
  const shard train_shard = make_shard(train_set, rank, ranks);
  const shard test_shard = make_shard(test_set, rank, ranks);

  cnn probe;
  std::size_t parameters = 0;
  for (const auto& p : probe->parameters()) parameters += static_cast<std::size_t>(p.numel());
  const std::size_t per_epoch =
      train_set.count / static_cast<std::size_t>(ranks) / static_cast<std::size_t>(o.batch);
  if (rank == 0) {
    std::printf(
        "pactrain %s Fashion-MNIST on LibTorch: %d ranks, CNN %s (%zu parameters), %zu train / "
        "%zu test samples\n",
        pactrain::version_string(), ranks, model_name, parameters, train_set.count, test_set.count);
    std::printf(
        "%d epochs of %zu steps, batch %lld per rank (%lld global), lr %g (cosine to 0), "
        "momentum %g, weight decay %g, seed %llu\n"
        "pruned runs: gradual global magnitude pruning of the weights to %.0f%% over steps "
        "%.0f%%-%.0f%%, biases dense; ternary run: kept entries sent as ternary lanes with "
        "error feedback, one scale per tensor\n",
        o.epochs, per_epoch, static_cast<long long>(o.batch),
        static_cast<long long>(o.batch) * ranks, o.lr, o.momentum, o.weight_decay,
        static_cast<unsigned long long>(o.seed), 100.0 * o.sparsity, 100.0 * o.prune_start,
        100.0 * o.prune_end);
    examples::print_progress_header();
  }

  using plain_sync =
      pactrain::sync<pactrain::bitmap_mask, pactrain::host_compactor, pactrain::mpi_communicator>;
  using ternary_sync =
      pactrain::sync<pactrain::bitmap_mask, pactrain::host_compactor, pactrain::mpi_communicator,
                     pactrain::ternary_codec, pactrain::error_feedback>;
  const auto strategy = [](pactrain::bucket_strategy s) {
    return pactrain::sync_options{.strategy = s};
  };
  std::vector<examples::named_run> runs;
  const auto wants = [&](const char* name) {
    return o.mode == name || o.mode == "all" ||
           (o.mode == "both" && std::string(name) != "ternary");
  };
  if (wants("dense")) {
    runs.push_back(
        {"dense", train<plain_sync>(o, 0.0, train_shard, test_shard, test_set.count, MPI_COMM_WORLD,
                                    "dense", {}, strategy(pactrain::bucket_strategy::dense))});
  }
  if (wants("sparse")) {
    runs.push_back({"sparse", train<plain_sync>(o, o.sparsity, train_shard, test_shard,
                                                test_set.count, MPI_COMM_WORLD, "sparse", {},
                                                strategy(pactrain::bucket_strategy::sparse))});
  }
  if (wants("ternary")) {
    // A bucket per tensor, so that each tensor gets its own ternary scale (the layers'
    // gradients differ by orders of magnitude; a shared scale would round most to 0).
    runs.push_back(
        {"ternary", train<ternary_sync>(o, o.sparsity, train_shard, test_shard, test_set.count,
                                        MPI_COMM_WORLD, "ternary", {.bucket_capacity = 1},
                                        pactrain::ternary_codec{{.seed = o.seed}},
                                        strategy(pactrain::bucket_strategy::sparse))});
  }
  const double wall = seconds_since(wall_start);

  bool agree = true;
  for (const auto& r : runs) agree = agree && r.result.weights_agree;
  if (rank == 0) {
    examples::print_table(runs, wall, agree);
    if (!o.summary.empty()) {
      const std::string model = "{\"name\": \"" + std::string(model_name) +
                                "\", \"parameters\": " + std::to_string(parameters) + "}";
      const std::string config =
          "{\"batch_per_rank\": " + std::to_string(o.batch) +
          ", \"global_batch\": " + std::to_string(o.batch * ranks) +
          ", \"lr\": " + examples::num(o.lr) +
          ", \"lr_schedule\": \"cosine to 0\", \"momentum\": " + examples::num(o.momentum) +
          ", \"weight_decay\": " + examples::num(o.weight_decay) +
          ", \"target_sparsity\": " + examples::num(o.sparsity) +
          ", \"prune_start\": " + examples::num(o.prune_start) +
          ", \"prune_end\": " + examples::num(o.prune_end) +
          ", \"prune_updates\": " + std::to_string(o.prune_updates) +
          ", \"scope\": \"global\", \"overlap\": true, \"train_samples\": " +
          std::to_string(train_set.count) +
          ", \"test_samples\": " + std::to_string(test_set.count) + "}";
      examples::write_summary(o.summary, {ranks, o.epochs, o.seed, model, config}, runs, wall);
      std::printf("summary: %s\n", o.summary.c_str());
    }
  }
  return agree ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  return examples::run_main(argc, argv, "pactrain_torch_cnn", [&] { return run(argc, argv); });
}
