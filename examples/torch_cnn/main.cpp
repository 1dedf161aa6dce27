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
//   --ternary-block B         ternary run: one scale per B kept entries (0: per bucket) [128]
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
#include "torch_cnn/task.hpp"

#include <mpi.h>

#include <chrono>
#include <cstddef>
#include <cstdio>
#include <string>

namespace {

namespace fm = pactrain::fmnist;
using examples::torch_cnn::cnn_task;
using examples::torch_cnn::model_name;

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
  examples::torch_cnn::default_recipe(o.cli);
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

int run(int argc, char** argv) {
  const auto wall_start = std::chrono::steady_clock::now();
  const auto [rank, ranks] = examples::world();
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
