// pactrain_torch_lm: a small decoder-only transformer (byte-level, causal self-attention)
// trained on the English text of Debian's `fortunes` package with LibTorch, data-parallel
// over MPI, dense against pruned (and ternary-coded) gradient synchronisation through
// pactrain/torch.hpp, with the same seed and epochs, one run after the other. It reports the
// validation loss and bits per byte on held-out fortunes.
//
// Build and run (from the repository root; needs libtorch-dev and fortunes; one LibTorch
// thread per rank when ranks share cores):
//   cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
//   cmake --build build --target pactrain_torch_lm
//   export OMPI_MCA_mpi_yield_when_idle=1 OMP_NUM_THREADS=1
//   mpiexec --allow-run-as-root --oversubscribe -n 4 build/examples/pactrain_torch_lm
// PACTRAIN_DEMO=torch-lm scripts/demo.sh does all of it (and writes build/demo/summary.json).
//
// Options (defaults in brackets):
//   --mode all|both|dense|sparse|ternary  which runs [all: dense, sparse, ternary; both: the
//                             first two]
//   --epochs N                passes over the training text [3]
//   --batch B                 sequences per rank and step [16]
//   --lr X                    peak learning rate [0.4]
//   --lr-warmup F             linear warm-up over this fraction of the steps [0.05]
//   --lr-rewind F             pruned runs: a second cosine cycle from F x lr after the last
//                             mask update (0: none) [0]
//   --momentum X              SGD momentum [0.9]
//   --weight-decay X          L2 weight decay [0]
//   --clip X                  largest norm of the averaged gradient (0: no clipping) [1]
//   --fused on|off            on: the optimizer step fused into the sync (only kept
//                             weights updated, from the payloads; the same bits;
//                             needs --clip 0) [off]
//   --sparsity S              final fraction of weights pruned in the pruned runs [0.8]
//   --prune-window A,B        gradual pruning from A to B, fractions of the steps [0.3,0.9]
//   --prune-updates N         mask updates in the window [20]
//   --scope per-tensor|global magnitude ranking within each tensor or across all [global]
//   --ternary-block B         ternary run: one scale per B kept entries (0: per bucket) [128]
//   --layers N --dim D --heads H --context T   the transformer [2, 128, 4, 64]
//   --train-limit N           use the first N bytes of the training text (0: all) [0]
//   --val-limit N             use the first N bytes of the validation text (0: all) [0]
//   --data DIR                the fortune files [/usr/share/games/fortunes]
//   --summary PATH            write a JSON summary
//   --seed N                  initialisation, sampling and rounding seed [1]
#include <pactrain/torch.hpp>  // first: LibTorch's glog macros must not meet others

#include "common/run_main.hpp"
#include "common/torch_train.hpp"
#include "torch_lm/task.hpp"

#include <mpi.h>

#include <chrono>
#include <cstddef>
#include <cstdio>
#include <string>

namespace {

namespace lm = examples::torch_lm;

struct options {
  examples::torch_cli cli;
  lm::model_config model;
  std::size_t train_limit = 0;
  std::size_t val_limit = 0;
  std::string data = lm::default_data_dir;
};

const std::string usage = std::string("usage: pactrain_torch_lm\n") + examples::torch_cli_usage +
                          "\n       " + lm::model_usage +
                          " [--train-limit N] [--val-limit N] [--data DIR]";

options parse(int argc, char** argv) {
  options o;
  lm::default_recipe(o.cli);
  examples::parse_command_line(argc, argv, usage, o.cli,
                               [&](const std::string& a, const std::string& v) {
                                 if (lm::parse_model_option(a, v, o.model)) return true;
                                 if (a == "--train-limit") {
                                   o.train_limit = examples::to_count(a, v);
                                 } else if (a == "--val-limit") {
                                   o.val_limit = examples::to_count(a, v);
                                 } else if (a == "--data") {
                                   o.data = v;
                                 } else {
                                   return false;
                                 }
                                 return true;
                               });
  lm::check_model(o.model);
  return o;
}

int run(int argc, char** argv) {
  const auto wall_start = std::chrono::steady_clock::now();
  const auto [rank, ranks] = examples::world();
  const options o = parse(argc, argv);  // same arguments, same verdict on every rank
  const examples::torch_run_options& r = o.cli.run;
  // Ranks usually share cores: LibTorch's own thread pools would oversubscribe them.
  torch::set_num_threads(1);

  lm::corpus text;
  if (!lm::load(o.data, o.train_limit, o.val_limit, o.model, text, MPI_COMM_WORLD,
                "pactrain_torch_lm"))
    return 1;
  lm::lm_task task(text, o.model, rank, ranks, r.seed);

  const std::size_t parameters = examples::parameter_count(*task.model());
  const std::size_t per_epoch = task.local_samples() / static_cast<std::size_t>(r.batch);
  const std::string model_name = lm::describe(o.model);
  if (rank == 0) {
    std::printf(
        "pactrain %s language model on LibTorch: %d ranks, %s (%zu parameters)\n"
        "text: %zu fortunes from %zu files of %s, %zu bytes to train on, %zu held out\n",
        pactrain::version_string(), ranks, model_name.c_str(), parameters, text.fortunes,
        text.files, o.data.c_str(), text.train.size(), text.valid.size());
    std::printf("%d epochs of %zu steps, %lld sequences per rank (%lld tokens)\n", r.epochs,
                per_epoch, static_cast<long long>(r.batch),
                static_cast<long long>(r.batch * o.model.context));
    examples::print_recipe(o.cli, "matrices", "biases and norms");
    examples::print_progress_header(examples::metric::bits_per_byte);
  }

  const std::string model = "{\"name\": \"" + model_name +
                            "\", \"parameters\": " + std::to_string(parameters) +
                            ", \"layers\": " + std::to_string(o.model.layers) +
                            ", \"dim\": " + std::to_string(o.model.dim) +
                            ", \"heads\": " + std::to_string(o.model.heads) +
                            ", \"context\": " + std::to_string(o.model.context) + "}";
  return examples::run_and_report(o.cli, task, examples::metric::bits_per_byte, MPI_COMM_WORLD,
                                  wall_start, model,
                                  ", \"train_bytes\": " + std::to_string(text.train.size()) +
                                      ", \"val_bytes\": " + std::to_string(text.valid.size()));
}

}  // namespace

int main(int argc, char** argv) {
  return examples::run_main(argc, argv, "pactrain_torch_lm", [&] { return run(argc, argv); });
}
