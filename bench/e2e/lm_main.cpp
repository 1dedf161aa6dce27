// pactrain_e2e_lm: one end-to-end training run of the LibTorch language model (the byte-level
// transformer of examples/torch_lm on Debian's fortunes, examples/common/torch_train.hpp's
// loop) with one method, written as one JSON point for bench/e2e/report.py; bench/e2e/run.sh
// runs the grid on the bandwidth-shaped testbed.
//
//   mpiexec -n 4 build/bench/pactrain_e2e_lm --method ternary --out point.json
//
// Methods as pactrain_e2e_cnn's (dense, sparse, ternary, topk, powersgd, fp16). The quality is
// the validation bits per byte (lower is better); throughput counts predicted bytes (tokens).
// The recipe is the example's (lr 0.4, clipping at norm 1, global pruning to 80%) on a shorter
// run, so that a grid point takes minutes: 4 epochs over the first 800,000 bytes of the
// training text, pruned from 25% to 75% of the steps, so that the last epoch is the steady
// state.
//
// Options (defaults in brackets):
//   --method M          dense|sparse|ternary|topk|powersgd|fp16 [sparse]
//   --powersgd-rank R   R or match [4]
//   the LibTorch examples' run options (examples/common/torch_train.hpp: --epochs [4],
//   --batch [16], --lr [0.4], --clip [1], --sparsity [0.8], --prune-window [0.25,0.75],
//   --prune-updates [20], --scope [global], --ternary-block [128], --seed, ...)
//   --layers N --dim D --heads H --context T   the transformer [2, 128, 4, 64]
//   --ternary-buckets one|per-tensor   [one]
//   --ternary-scale current|previous   where the scales come from [current]
//   --train-limit N [800000], --test-limit N (validation bytes) [0: all]
//   --data DIR          the fortune files [/usr/share/games/fortunes]
//   --link NAME, --link-bits N   recorded in the point (the testbed's rate) [none, 0]
//   --out PATH          the JSON point (rank 0 writes it)
#include <pactrain/torch.hpp>  // first: LibTorch's glog macros must not meet others

#include "torch_method.hpp"

#include "common/run_main.hpp"
#include "common/torch_train.hpp"
#include "torch_lm/task.hpp"

#include <mpi.h>

#include <cstddef>
#include <cstdio>
#include <string>

namespace {

namespace lm = examples::torch_lm;

struct options : e2e::torch_options {
  lm::model_config model;
};

const std::string usage = std::string("usage: pactrain_e2e_lm\n") + e2e::torch_options_usage +
                          examples::torch_cli_usage + "\n       " + lm::model_usage;

options parse(int argc, char** argv) {
  options o;
  lm::default_recipe(o.cli);
  o.cli.run.epochs = 4;
  o.cli.run.prune_start = 0.25;
  o.cli.run.prune_end = 0.75;
  o.train_limit = 800000;
  o.data = lm::default_data_dir;
  examples::parse_command_line(
      argc, argv, usage, o.cli, [&](const std::string& a, const std::string& v) {
        return lm::parse_model_option(a, v, o.model) || e2e::parse_torch_option(a, v, o);
      });
  e2e::check_torch_options(o, "pactrain_e2e_lm", usage);
  lm::check_model(o.model);
  return o;
}

int run(int argc, char** argv) {
  int rank = 0;
  int ranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  const options o = parse(argc, argv);  // same arguments, same verdict on every rank
  const examples::torch_run_options& r = o.cli.run;
  torch::set_num_threads(1);  // ranks share cores

  lm::corpus text;
  if (!lm::load(o.data, o.train_limit, o.test_limit, o.model, text, MPI_COMM_WORLD,
                "pactrain_e2e_lm"))
    return 1;
  lm::lm_task task(text, o.model, rank, ranks, r.seed);
  const auto quality = examples::metric::bits_per_byte;
  if (rank == 0) {
    std::printf("pactrain_e2e_lm: %s, %d ranks, link %s, %d epochs, %zu bytes to train on\n",
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

}  // namespace

int main(int argc, char** argv) {
  return examples::run_main(argc, argv, "pactrain_e2e_lm", [&] { return run(argc, argv); });
}
