// pactrain_e2e_torch: one end-to-end training run of a LibTorch trainer with one method,
// written as one JSON point for bench/e2e/report.py; bench/e2e/run.sh runs the grid on the
// bandwidth-shaped testbed. The trainer is the first argument:
//   cnn  the CNN on Fashion-MNIST (examples/torch_cnn's model and task)
//   lm   the byte-level transformer language model on Debian's fortunes (examples/torch_lm's)
// Both go through examples/common/torch_train.hpp's loop. One program for both: what a method
// instantiates (the engines, the exchanges, LibTorch's headers) is most of the compile time,
// and one translation unit compiles it once (31 s against 30 + 30 s for two programs, 2 cores).
//
//   mpiexec -n 4 build/bench/pactrain_e2e_torch cnn --method ternary --out point.json
//   mpiexec -n 4 build/bench/pactrain_e2e_torch lm --method powersgd --powersgd-rank match
//
// Methods as pactrain_e2e's (dense, sparse, ternary, topk, powersgd, fp16) but auto: the
// LibTorch loop has no strategy tuner. Every method trains the same model from the same seed
// on the same data for the same steps, with the example's recipe; the baselines train dense
// through examples::exchange_engine.
//
// Options of both trainers (defaults in brackets: cnn's, then lm's):
//   --method M          dense|sparse|ternary|topk|powersgd|fp16 [sparse]
//   --powersgd-rank R   R or match [4]
//   --powersgd-start F  PowerSGD's dense start, a fraction of the steps [0]
//   --dgc-sparsity S    DGC's final sparsity [0.999]
//   --dgc-warmup-epochs E  DGC's sparsity warm-up, at most a quarter of the run [4]
//   the LibTorch examples' run options (examples/common/torch_train.hpp: --epochs [6; 4],
//   --batch [32; 16], --lr [0.05; 0.4], --clip [0; 1], --sparsity [0.9; 0.8], --prune-window
//   [0.1,0.5; 0.25,0.75], --prune-updates [20], --scope [global], --ternary-block [128],
//   --seed, ...)
//   --ternary-buckets one|per-tensor   [one]
//   --ternary-scale current|previous   where the scales come from [current]
//   --train-limit N [0: all; 800000], --test-limit N [0: all]
//   --data DIR          the Fashion-MNIST files [Debian's]; the fortune files [Debian's]
//   --link NAME, --link-bits N   recorded in the point (the testbed's rate) [none, 0]
//   --machine TEXT      recorded in the point (what ran it) [not recorded]
//   --out PATH          the JSON point (rank 0 writes it)
// lm's own: --layers N --dim D --heads H --context T   the transformer [2, 128, 4, 64]
//
// The CNN's quality is the test accuracy; the language model's the validation bits per byte
// (lower is better), and its throughput counts predicted bytes (tokens). The language model's
// recipe is the example's on a shorter run, so that a grid point takes minutes: 4 epochs over
// the first 800,000 bytes of the training text, pruned from 25% to 75% of the steps, so that
// the last epoch is the steady state.
#include <pactrain/torch.hpp>  // first: LibTorch's glog macros must not meet others

#include "torch_method.hpp"

#include "common/run_main.hpp"
#include "common/torch_train.hpp"
#include "fmnist/idx.hpp"
#include "fmnist/load.hpp"
#include "torch_cnn/task.hpp"
#include "torch_lm/task.hpp"

#include <mpi.h>

#include <cstddef>
#include <cstdio>
#include <string>

namespace {

constexpr const char* program = "pactrain_e2e_torch";

const std::string usage_head = "usage: pactrain_e2e_torch cnn|lm\n";

namespace cnn {

namespace fm = pactrain::fmnist;

const std::string usage = usage_head + e2e::torch_options_usage + examples::torch_cli_usage;

// argv[0] is the trainer's name: the options start at argv[1], as in a program of its own.
e2e::torch_options parse(int argc, char** argv) {
  e2e::torch_options o;
  examples::torch_cnn::default_recipe(o.cli);
  o.cli.run.epochs = 6;
  o.cli.run.shape.rewind = 0;  // every method one schedule; --lr-rewind 1 is a variant
  o.cli.run.evals_per_epoch = 4;
  examples::parse_command_line(
      argc, argv, usage, o.cli,
      [&](const std::string& a, const std::string& v) { return e2e::parse_torch_option(a, v, o); });
  e2e::check_torch_options(o, program, usage);
  return o;
}

int run(int argc, char** argv, int rank, int ranks) {
  const e2e::torch_options o = parse(argc, argv);  // same arguments, same verdict on every rank
  const examples::torch_run_options& r = o.cli.run;

  fm::dataset train_set;
  fm::dataset test_set;
  if (!fm::load_splits(o.data, o.train_limit, o.test_limit, train_set, test_set, MPI_COMM_WORLD))
    return 1;
  examples::torch_cnn::cnn_task task(train_set, test_set, rank, ranks, r.seed);
  if (rank == 0) {
    std::printf("%s cnn: %s, %d ranks, link %s, %d epochs\n", program, o.method.c_str(), ranks,
                o.link.c_str(), r.epochs);
    examples::print_progress_header();
  }
  const examples::train_result res =
      e2e::train_method(o, task, MPI_COMM_WORLD, examples::metric::accuracy);
  const std::size_t batch = static_cast<std::size_t>(r.batch) * static_cast<std::size_t>(ranks);
  e2e::write_torch_point(o, res, e2e::torch_meta(o, "fmnist_cnn", batch), rank, ranks);
  return res.weights_agree ? 0 : 1;
}

}  // namespace cnn

namespace lm {

namespace task_lm = examples::torch_lm;

struct options : e2e::torch_options {
  task_lm::model_config model;
};

const std::string usage = usage_head + e2e::torch_options_usage + examples::torch_cli_usage +
                          "\n       " + task_lm::model_usage;

options parse(int argc, char** argv) {
  options o;
  task_lm::default_recipe(o.cli);
  o.cli.run.epochs = 4;
  o.cli.run.evals_per_epoch = 4;
  o.cli.run.prune_start = 0.25;
  o.cli.run.prune_end = 0.75;
  o.train_limit = 800000;
  o.data = task_lm::default_data_dir;
  examples::parse_command_line(
      argc, argv, usage, o.cli, [&](const std::string& a, const std::string& v) {
        return task_lm::parse_model_option(a, v, o.model) || e2e::parse_torch_option(a, v, o);
      });
  e2e::check_torch_options(o, program, usage);
  task_lm::check_model(o.model);
  return o;
}

int run(int argc, char** argv, int rank, int ranks) {
  const options o = parse(argc, argv);  // same arguments, same verdict on every rank
  const examples::torch_run_options& r = o.cli.run;

  task_lm::corpus text;
  if (!task_lm::load(o.data, o.train_limit, o.test_limit, o.model, text, MPI_COMM_WORLD, program))
    return 1;
  task_lm::lm_task task(text, o.model, rank, ranks, r.seed);
  const auto quality = examples::metric::bits_per_byte;
  if (rank == 0) {
    std::printf("%s lm: %s, %d ranks, link %s, %d epochs, %zu bytes to train on\n", program,
                o.method.c_str(), ranks, o.link.c_str(), r.epochs, text.train.size());
    examples::print_progress_header(quality);
  }
  const examples::train_result res = e2e::train_method(o, task, MPI_COMM_WORLD, quality);
  const std::size_t windows = static_cast<std::size_t>(r.batch) * static_cast<std::size_t>(ranks);
  e2e::point_meta meta = e2e::torch_meta(o, "fortunes_lm", windows);
  meta.units_per_step = windows * static_cast<std::size_t>(o.model.context);
  meta.unit = "tokens";
  meta.quality = quality;
  e2e::write_torch_point(o, res, meta, rank, ranks);
  return res.weights_agree ? 0 : 1;
}

}  // namespace lm

int run(int argc, char** argv) {
  const auto [rank, ranks] = examples::world();
  torch::set_num_threads(1);  // ranks share cores
  const std::string trainer = argc > 1 ? argv[1] : "";
  if (trainer == "cnn") return cnn::run(argc - 1, argv + 1, rank, ranks);
  if (trainer == "lm") return lm::run(argc - 1, argv + 1, rank, ranks);
  throw pactrain::error("the first argument must be the trainer, cnn or lm, not '" + trainer +
                        "'\n" + usage_head + "       (cnn|lm --help lists its options)");
}

}  // namespace

int main(int argc, char** argv) {
  return examples::run_main(argc, argv, program, [&] { return run(argc, argv); });
}
