// pactrain_e2e_cnn: one end-to-end training run of the LibTorch CNN on Fashion-MNIST
// (examples/torch_cnn's model and task, examples/common/torch_train.hpp's loop) with one
// method, written as one JSON point for bench/e2e/report.py; bench/e2e/run.sh runs the grid
// on the bandwidth-shaped testbed.
//
//   mpiexec -n 4 build/bench/pactrain_e2e_cnn --method ternary --epochs 6 --out point.json
//
// Methods as pactrain_e2e's (dense, sparse, ternary, topk, powersgd, fp16) but auto: the
// LibTorch loop has no strategy tuner. Every method trains the same model from the same seed
// on the same data for the same steps, with the CNN example's recipe; the baselines train
// dense through examples::exchange_engine.
//
// Options (defaults in brackets):
//   --method M          dense|sparse|ternary|topk|powersgd|fp16 [sparse]
//   --powersgd-rank R   R or match [4]
//   the LibTorch examples' run options (examples/common/torch_train.hpp: --epochs [6],
//   --batch [32], --lr, --momentum, --weight-decay, --sparsity [0.9], --prune-window
//   [0.1,0.5], --prune-updates, --scope [global], --ternary-block [128], --seed, ...)
//   --ternary-buckets one|per-tensor   [one]
//   --ternary-scale current|previous   where the scales come from [current]
//   --train-limit N, --test-limit N [0: all]    --data DIR
//   --link NAME, --link-bits N   recorded in the point (the testbed's rate) [none, 0]
//   --out PATH          the JSON point (rank 0 writes it)
#include <pactrain/torch.hpp>  // first: LibTorch's glog macros must not meet others

#include "torch_method.hpp"

#include "common/run_main.hpp"
#include "common/torch_train.hpp"
#include "fmnist/idx.hpp"
#include "fmnist/load.hpp"
#include "torch_cnn/task.hpp"

#include <mpi.h>

#include <cstddef>
#include <cstdio>
#include <string>

namespace {

namespace fm = pactrain::fmnist;

const std::string usage =
    std::string("usage: pactrain_e2e_cnn\n") + e2e::torch_options_usage + examples::torch_cli_usage;

e2e::torch_options parse(int argc, char** argv) {
  e2e::torch_options o;
  examples::torch_cnn::default_recipe(o.cli);
  o.cli.run.epochs = 6;
  o.cli.ternary_block = 128;
  examples::parse_command_line(
      argc, argv, usage, o.cli,
      [&](const std::string& a, const std::string& v) { return e2e::parse_torch_option(a, v, o); });
  e2e::check_torch_options(o, "pactrain_e2e_cnn", usage);
  return o;
}

int run(int argc, char** argv) {
  int rank = 0;
  int ranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  const e2e::torch_options o = parse(argc, argv);  // same arguments, same verdict on every rank
  const examples::torch_run_options& r = o.cli.run;
  torch::set_num_threads(1);  // ranks share cores

  fm::dataset train_set;
  fm::dataset test_set;
  if (!fm::load_splits(o.data, o.train_limit, o.test_limit, train_set, test_set, MPI_COMM_WORLD))
    return 1;
  examples::torch_cnn::cnn_task task(train_set, test_set, rank, ranks, r.seed);
  if (rank == 0) {
    std::printf("pactrain_e2e_cnn: %s, %d ranks, link %s, %d epochs\n", o.method.c_str(), ranks,
                o.link.c_str(), r.epochs);
    examples::print_progress_header();
  }
  const examples::train_result res =
      e2e::train_method(o, task, MPI_COMM_WORLD, examples::metric::accuracy);
  const std::size_t batch = static_cast<std::size_t>(r.batch) * static_cast<std::size_t>(ranks);
  e2e::write_torch_point(o, res, e2e::torch_meta(o, "fmnist_cnn", batch), rank, ranks);
  return res.weights_agree ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  return examples::run_main(argc, argv, "pactrain_e2e_cnn", [&] { return run(argc, argv); });
}
