// What bench/e2e's LibTorch trainers (pactrain_e2e_torch cnn and lm) share: their options
// besides the task's, one run of a method through examples/common/torch_train.hpp's loop, and
// its JSON point. The trainers differ only in the task they train.
#pragma once

#include <pactrain/torch.hpp>  // first: LibTorch's glog macros must not meet others

#include "point.hpp"

#include "common/cli.hpp"
#include "common/run_report.hpp"
#include "common/torch_train.hpp"

#include <mpi.h>

#include <cstddef>
#include <memory>
#include <string>

namespace e2e {

/// The options of a LibTorch e2e program: the method's, the loop's (examples::torch_cli) and
/// the ternary run's buckets and scales.
struct torch_options : run_options {
  examples::torch_cli cli;
  // Ternary: one bucket for all tensors (the LibTorch examples' default: a scale round and a
  // collective per step, a scale per --ternary-block kept entries) or one per tensor. One
  // bucket took 11.8 ms per step after pruning at 100 Mbit/s on 4 ranks against 16.1 ms (the
  // CNN, on the earlier testbed whose small messages crossed unshaped).
  bool ternary_one_bucket = true;
  pactrain::scale_source ternary_scale = pactrain::scale_source::current_max;
};

/// The usage lines of the options parse_torch_option reads (besides torch_cli's).
inline constexpr const char* torch_options_usage =
    "       [--method dense|sparse|ternary|topk|powersgd|fp16] [--powersgd-rank R|match]\n"
    "       [--powersgd-start F] [--dgc-sparsity S] [--dgc-warmup-epochs E]\n"
    "       [--train-limit N] [--test-limit N] [--data DIR] [--link NAME] [--link-bits N]\n"
    "       [--machine TEXT] [--label NAME] [--out PATH]\n"
    "       [--ternary-buckets per-tensor|one] [--ternary-scale current|previous]\n";

/// Reads option `a` with value `v` into `o`; false if `a` is none of torch_options' (besides
/// torch_cli's, which examples::parse_command_line reads).
inline bool parse_torch_option(const std::string& a, const std::string& v, torch_options& o) {
  if (a == "--ternary-buckets") {
    o.ternary_one_bucket = examples::one_of<bool>(a, v, {{"one", true}, {"per-tensor", false}});
    return true;
  }
  if (a == "--ternary-scale") {
    o.ternary_scale = examples::scale_source_option(a, v);
    return true;
  }
  return parse_run_option(a, v, o);
}

/// Throws pactrain::error unless the options name one run of a method the LibTorch loop has
/// (all but auto: it has no strategy tuner).
inline void check_torch_options(const torch_options& o, const char* program,
                                const std::string& usage) {
  if (o.cli.mode != "all" || !o.cli.summary.empty()) {
    throw pactrain::error(std::string("--mode and --summary are the examples' options, not ") +
                          program + "'s: use --method and --out");
  }
  check_method(o, "dense sparse ternary topk powersgd fp16", usage);
}

/// One run of `o.method` on `task` (collective over `comm`): pactrain's methods through its
/// sync engine, the baselines through a gradient exchange training dense. Every method trains
/// the same model from the same seed on the same data for the same steps.
template <class Task>
examples::train_result train_method(const torch_options& o, Task& task, MPI_Comm comm,
                                    examples::metric quality) {
  const examples::torch_run_options& r = o.cli.run;
  using plain_sync = pactrain::sync<pactrain::mpi_communicator>;
  using ternary_sync =
      pactrain::sync<pactrain::mpi_communicator, pactrain::error_feedback<pactrain::ternary_codec>>;
  const pactrain::sync_options sparse{.strategy = pactrain::bucket_strategy::sparse};
  if (o.method == "sparse") {
    return examples::torch_train<plain_sync>(r, o.cli.sparsity, task, comm, "sparse", quality, {},
                                             sparse);
  }
  if (o.method == "ternary") {
    pactrain::torch_options topt;
    if (!o.ternary_one_bucket) topt.bucket_capacity = 1;
    return examples::torch_train<ternary_sync>(
        r, o.cli.sparsity, task, comm, "ternary", quality, topt,
        pactrain::ternary_codec{
            {.seed = r.seed, .scale = o.ternary_scale, .scale_block = o.cli.ternary_block}},
        sparse);
  }
  // The layout and prunable tensors of the model every run builds.
  auto probe = task.model();
  const pactrain::torch_params probe_params(*probe);
  const pactrain::param_layout& layout = probe_params.layout();
  const std::size_t k = kept_entries(layout, probe_params.prunable(), o.cli.sparsity);
  // The run's steps as torch_train counts them: the smallest shard decides.
  auto shard = static_cast<unsigned long long>(task.local_samples());
  MPI_Allreduce(MPI_IN_PLACE, &shard, 1, MPI_UNSIGNED_LONG_LONG, MPI_MIN, comm);
  const std::uint64_t per_epoch = shard / static_cast<std::uint64_t>(r.batch);
  const std::unique_ptr<examples::gradient_exchange> x =
      make_exchange(o, comm, layout,
                    {.k = k,
                     .momentum = static_cast<float>(r.momentum),
                     .weight_decay = static_cast<float>(r.weight_decay),
                     .seed = r.seed,
                     .steps_per_epoch = per_epoch,
                     .steps = per_epoch * static_cast<std::uint64_t>(r.epochs)});
  return examples::torch_train<examples::exchange_engine>(r, 0.0, task, comm, o.method.c_str(),
                                                          quality, {}, *x);
}

/// The point's description of a run with options `o`: `trainer` and `global_batch` (samples
/// per step over all ranks), the rest from the options; accuracy as its quality and samples
/// as its unit, which a caller may change.
inline point_meta torch_meta(const torch_options& o, const char* trainer,
                             std::size_t global_batch) {
  point_meta m;
  m.trainer = trainer;
  m.link = o.link;
  m.link_bits = o.link_bits;
  m.machine = o.machine;
  m.method = method_label(o);
  m.epochs = o.cli.run.epochs;
  m.seed = o.cli.run.seed;
  m.lr_rewind = o.cli.run.shape.rewind;
  m.evals_per_epoch = o.cli.run.evals_per_epoch;
  m.global_batch = global_batch;
  return m;
}

/// Writes the point of run `res` to o.out (rank 0; nothing where o.out is empty). The steady
/// state is the epochs that start after the pruned runs' last mask update.
inline void write_torch_point(const torch_options& o, const examples::train_result& res,
                              const point_meta& meta, int rank, int ranks) {
  if (rank != 0 || o.out.empty()) return;
  const examples::torch_run_options& r = o.cli.run;
  const auto schedule = pactrain::gradual_schedule::over_run(res.steps, r.prune_start, r.prune_end,
                                                             o.cli.sparsity, r.prune_updates);
  const std::size_t steady =
      steady_epoch(examples::last_mask_update(schedule, res.steps), res.steps_per_epoch, r.epochs);
  write_point(o.out, point_json(meta, res, ranks, steady));
}

}  // namespace e2e
