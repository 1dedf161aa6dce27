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

#include "point.hpp"

#include "common/run_main.hpp"
#include "common/torch_train.hpp"
#include "fmnist/idx.hpp"
#include "fmnist/load.hpp"
#include "torch_cnn/task.hpp"

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

namespace {

namespace fm = pactrain::fmnist;

struct options : e2e::run_options {
  examples::torch_cli cli;
  // Ternary: one bucket for all tensors (a scale round and a collective per step, a scale per
  // --ternary-block kept entries) or one per tensor (the CNN example's: 8 of each). One bucket
  // took 11.8 ms per step after pruning at 100 Mbit/s on 4 ranks against 16.1 ms.
  bool ternary_one_bucket = true;
  pactrain::scale_source ternary_scale = pactrain::scale_source::current_max;
};

const std::string usage =
    std::string(
        "usage: pactrain_e2e_cnn [--method dense|sparse|ternary|topk|powersgd|fp16]\n"
        "       [--powersgd-rank R|match] [--train-limit N] [--test-limit N] [--data DIR]\n"
        "       [--link NAME] [--link-bits N] [--out PATH]\n"
        "       [--ternary-buckets per-tensor|one] [--ternary-scale current|previous]\n") +
    examples::torch_cli_usage;

options parse(int argc, char** argv) {
  options o;
  examples::torch_cnn::default_recipe(o.cli);
  o.cli.run.epochs = 6;
  o.cli.ternary_block = 128;
  examples::parse_command_line(
      argc, argv, usage, o.cli, [&](const std::string& a, const std::string& v) {
        if (a == "--ternary-buckets") {
          o.ternary_one_bucket =
              examples::one_of<bool>(a, v, {{"one", true}, {"per-tensor", false}});
          return true;
        }
        if (a == "--ternary-scale") {
          o.ternary_scale = examples::scale_source_option(a, v);
          return true;
        }
        return e2e::parse_run_option(a, v, o);
      });
  if (o.cli.mode != "all" || !o.cli.summary.empty())
    throw pactrain::error("--mode and --summary are pactrain_torch_cnn's: use --method and --out");
  e2e::check_method(o, "dense sparse ternary topk powersgd fp16", usage);
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

  fm::dataset train_set;
  fm::dataset test_set;
  if (!fm::load_splits(o.data, o.train_limit, o.test_limit, train_set, test_set, MPI_COMM_WORLD))
    return 1;
  examples::torch_cnn::cnn_task task(train_set, test_set, rank, ranks, r.seed);
  const auto quality = examples::metric::accuracy;
  if (rank == 0) {
    std::printf("pactrain_e2e_cnn: %s, %d ranks, link %s, %d epochs\n", o.method.c_str(), ranks,
                o.link.c_str(), r.epochs);
    examples::print_progress_header();
  }

  using plain_sync =
      pactrain::sync<pactrain::bitmap_mask, pactrain::host_compactor, pactrain::mpi_communicator>;
  using ternary_sync =
      pactrain::sync<pactrain::bitmap_mask, pactrain::host_compactor, pactrain::mpi_communicator,
                     pactrain::ternary_codec, pactrain::error_feedback>;
  const pactrain::sync_options sparse{.strategy = pactrain::bucket_strategy::sparse};
  examples::train_result res;
  if (o.method == "sparse") {
    res = examples::torch_train<plain_sync>(r, o.cli.sparsity, task, MPI_COMM_WORLD, "sparse",
                                            quality, {}, sparse);
  } else if (o.method == "ternary") {
    pactrain::torch_options topt;
    if (!o.ternary_one_bucket) topt.bucket_capacity = 1;
    res = examples::torch_train<ternary_sync>(
        r, o.cli.sparsity, task, MPI_COMM_WORLD, "ternary", quality, topt,
        pactrain::ternary_codec{
            {.seed = r.seed, .scale = o.ternary_scale, .scale_block = o.cli.ternary_block}},
        sparse);
  } else {
    // The layout and prunable tensors of the model every run builds.
    auto probe = task.model();
    const pactrain::torch_params probe_params(*probe);
    const pactrain::param_layout& layout = probe_params.layout();
    const std::size_t k = e2e::kept_entries(layout, probe_params.prunable(), o.cli.sparsity);
    const std::unique_ptr<examples::gradient_exchange> x = e2e::make_exchange(
        o.method, o.powersgd_rank, MPI_COMM_WORLD, layout, k, static_cast<float>(r.momentum),
        static_cast<float>(r.weight_decay), r.seed);
    res = examples::torch_train<examples::exchange_engine>(r, 0.0, task, MPI_COMM_WORLD,
                                                           o.method.c_str(), quality, {}, *x);
  }
  // The steady state: the epochs that start after the pruned runs' last mask update.
  const auto schedule = pactrain::gradual_schedule::over_run(res.steps, r.prune_start, r.prune_end,
                                                             o.cli.sparsity, r.prune_updates);
  const std::size_t steady = e2e::steady_epoch(examples::last_mask_update(schedule, res.steps),
                                               res.steps_per_epoch, r.epochs);
  if (rank == 0 && !o.out.empty()) {
    const e2e::point_meta m{
        .trainer = "fmnist_cnn",
        .link = o.link,
        .link_bits = o.link_bits,
        .method = e2e::method_label(o.method, o.powersgd_rank),
        .epochs = r.epochs,
        .global_batch = static_cast<std::size_t>(r.batch) * static_cast<std::size_t>(ranks)};
    e2e::write_point(o.out, e2e::point_json(m, res, ranks, steady));
  }
  return res.weights_agree ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  return examples::run_main(argc, argv, "pactrain_e2e_cnn", [&] { return run(argc, argv); });
}
