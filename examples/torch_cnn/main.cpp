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
//   --epochs N                epochs of each run [15]
//   --batch B                 mini-batch per rank [32]
//   --lr X                    peak learning rate, cosine decay to 0 [0.05]
//   --lr-warmup F             linear warm-up over this fraction of the steps [0.05]
//   --lr-rewind F             pruned runs: a second cosine cycle from F x lr after the last
//                             mask update (0: none) [1]
//   --momentum X              SGD momentum [0.9]
//   --weight-decay X          L2 weight decay [5e-4]
//   --clip X                  largest norm of the averaged gradient (0: no clipping) [0]
//   --fused on|off            on: the optimizer step fused into the sync (only kept
//                             weights updated, from the payloads; the same bits;
//                             needs --clip 0) [off]
//   --sparsity S              final fraction of weights pruned in the pruned runs [0.9]
//   --prune-window A,B        gradual pruning from A to B, fractions of the steps [0.1,0.5]
//   --prune-updates N         mask updates in the window [20]
//   --scope per-tensor|global magnitude ranking within each tensor or across all [global]
//   --ternary-block B         ternary run: one scale per B kept entries (0: per tensor) [0]
//   --train-limit N           use the first N training samples (0: all) [0]
//   --test-limit N            use the first N test samples (0: all) [0]
//   --data DIR                the four IDX files [/usr/share/datasets/fashion-mnist]
//   --summary PATH            write a JSON summary (accuracies as fractions in [0, 1])
//   --seed N                  initialisation, shuffling and rounding seed [1]
#include <pactrain/torch.hpp>  // first: LibTorch's glog macros must not meet others

#include "common/run_main.hpp"
#include "common/torch_train.hpp"
#include "fmnist/idx.hpp"
#include "fmnist/load.hpp"

#include <mpi.h>

#include <algorithm>
#include <chrono>

#include <cstdint>
#include <cstdio>

#include <random>
#include <string>
#include <vector>

namespace {

namespace fm = pactrain::fmnist;

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
  examples::torch_cli cli;
  std::size_t train_limit = 0;
  std::size_t test_limit = 0;
  std::string data = fm::default_data_dir;
};

const std::string usage = std::string("usage: pactrain_torch_cnn\n") + examples::torch_cli_usage +
                          "\n       [--train-limit N] [--test-limit N] [--data DIR]";

options parse(int argc, char** argv) {
  options o;
  examples::torch_run_options& r = o.cli.run;
  r.epochs = 15;
  r.batch = 32;
  r.lr = 0.05;
  r.shape.warmup = 0.05;
  r.shape.rewind = 1.0;
  r.momentum = 0.9;
  r.weight_decay = 5e-4;
  r.prune_start = 0.1;
  r.prune_end = 0.5;
  r.scope = pactrain::pruning_scope::global;
  o.cli.sparsity = 0.9;
  // The program's own options.
  const auto own = [&](const std::string& a, const std::string& v) {
    if (a == "--train-limit") {
      o.train_limit = examples::to_count(a, v);
    } else if (a == "--test-limit") {
      o.test_limit = examples::to_count(a, v);
    } else if (a == "--data") {
      o.data = v;
    } else {
      return false;
    }
    return true;
  };
  examples::parse_command_line(argc, argv, usage, o.cli, own);
  return o;
}

/// The CNN's task for examples::torch_train: rank r's samples (r, r + P, ...) as normalised
/// images [n, 1, 28, 28] and labels [n], shuffled each epoch with the same seeded permutation
/// on every rank; the test accuracy summed over the ranks' shards of the test set.
class cnn_task {
 public:
  cnn_task(const fm::dataset& train, const fm::dataset& test, int rank, int ranks,
           std::uint64_t seed)
      : train_(make_shard(train, rank, ranks)),
        test_(make_shard(test, rank, ranks)),
        test_count_(test.count),
        seed_(seed) {}

  [[nodiscard]] cnn model() const { return cnn(); }
  [[nodiscard]] std::size_t local_samples() const {
    return static_cast<std::size_t>(train_.x.size(0));
  }

  void begin_epoch(int epoch) {
    std::vector<std::int64_t> order(local_samples());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = static_cast<std::int64_t>(i);
    std::mt19937_64 rng(seed_ * 0x9e3779b97f4a7c15ULL + static_cast<std::uint64_t>(epoch));
    std::shuffle(order.begin(), order.end(), rng);
    perm_ = torch::tensor(order, torch::kInt64);
  }

  torch::Tensor loss(cnn& model, std::int64_t at, std::int64_t n) {
    const torch::Tensor rows = perm_.narrow(0, at, n);
    return torch::nn::functional::cross_entropy(model->forward(train_.x.index_select(0, rows)),
                                                train_.y.index_select(0, rows));
  }

  void evaluate(cnn& model, examples::epoch_record& rec, MPI_Comm comm) const {
    long long correct = 0;
    const std::int64_t n = test_.x.size(0);
    for (std::int64_t at = 0; at < n; at += 1000) {
      const std::int64_t m = std::min<std::int64_t>(1000, n - at);
      const torch::Tensor pred = model->forward(test_.x.narrow(0, at, m)).argmax(1);
      correct += pred.eq(test_.y.narrow(0, at, m)).sum().item<std::int64_t>();
    }
    MPI_Allreduce(MPI_IN_PLACE, &correct, 1, MPI_LONG_LONG, MPI_SUM, comm);
    rec.test_accuracy = static_cast<double>(correct) / static_cast<double>(test_count_);
  }

 private:
  struct shard {
    torch::Tensor x;
    torch::Tensor y;
  };

  static shard make_shard(const fm::dataset& d, int rank, int ranks) {
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

  shard train_;
  shard test_;
  std::size_t test_count_;
  std::uint64_t seed_;
  torch::Tensor perm_;
};

int run(int argc, char** argv) {
  const auto wall_start = std::chrono::steady_clock::now();
  int rank = 0;
  int ranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  const options o = parse(argc, argv);  // same arguments, same verdict on every rank
  const examples::torch_run_options& r = o.cli.run;
  // Ranks usually share cores: LibTorch's own thread pools would oversubscribe them.
  torch::set_num_threads(1);

  fm::dataset train_set;
  fm::dataset test_set;
  if (!fm::load_splits(o.data, o.train_limit, o.test_limit, train_set, test_set, MPI_COMM_WORLD))
    return 1;
  cnn_task task(train_set, test_set, rank, ranks, r.seed);

  const std::size_t parameters = examples::parameter_count(*task.model());
  const std::size_t per_epoch =
      train_set.count / static_cast<std::size_t>(ranks) / static_cast<std::size_t>(r.batch);
  if (rank == 0) {
    std::printf(
        "pactrain %s Fashion-MNIST on LibTorch: %d ranks, CNN %s (%zu parameters), %zu train / "
        "%zu test samples\n",
        pactrain::version_string(), ranks, model_name, parameters, train_set.count, test_set.count);
    std::printf("%d epochs of %zu steps, batch %lld per rank (%lld global)\n", r.epochs, per_epoch,
                static_cast<long long>(r.batch), static_cast<long long>(r.batch) * ranks);
    examples::print_recipe(o.cli, "weights", "biases");
    examples::print_progress_header();
  }

  const std::string model = "{\"name\": \"" + std::string(model_name) +
                            "\", \"parameters\": " + std::to_string(parameters) + "}";
  return examples::run_and_report(o.cli, task, examples::metric::accuracy, MPI_COMM_WORLD,
                                  wall_start, model,
                                  ", \"train_samples\": " + std::to_string(train_set.count) +
                                      ", \"test_samples\": " + std::to_string(test_set.count));
}

}  // namespace

int main(int argc, char** argv) {
  return examples::run_main(argc, argv, "pactrain_torch_cnn", [&] { return run(argc, argv); });
}
