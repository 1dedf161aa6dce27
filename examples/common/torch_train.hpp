// The data-parallel training loop of pactrain's LibTorch examples: one run (dense, pruned, or
// pruned with a codec) of a model that a task describes, with pactrain/torch.hpp doing the
// integration. examples/torch_cnn and examples/torch_lm differ only in their task.
//
// Header-only. Build and run an example that uses it (from the repository root):
//   cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
//   cmake --build build --target pactrain_torch_cnn
//   export OMPI_MCA_mpi_yield_when_idle=1 OMP_NUM_THREADS=1
//   mpiexec --allow-run-as-root --oversubscribe -n 4 build/examples/pactrain_torch_cnn
#pragma once

#include <pactrain/torch.hpp>  // first: LibTorch's glog macros must not meet others

#include "common/cli.hpp"
#include "common/exchange.hpp"
#include "common/lr_schedule.hpp"
#include "common/run_report.hpp"

#include <pactrain/mpi.hpp>
#include <pactrain/pactrain.hpp>
#include <pactrain/sgd.hpp>

#include <mpi.h>

#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace examples {

/// What a LibTorch run does besides the model and data.
struct torch_run_options {
  int epochs = 1;
  std::int64_t batch = 32;  // per rank
  double lr = 0.05;         // peak learning rate
  lr_shape shape;           // warm-up, hold, cosine decay and (pruned runs) rewind
  double momentum = 0.9;
  double weight_decay = 5e-4;
  double clip = 0.0;  // largest norm of the averaged gradient (0: no clipping)
  // The optimizer step fused into the sync (sgd::fused, torch_overlap::finish_step(update)):
  // only kept weights are updated, from the payloads; the same bits. Not with clipping, which
  // needs the whole averaged gradient.
  bool fused = false;
  double prune_start = 0.1;  // gradual pruning window, fractions of the steps
  double prune_end = 0.6;
  std::uint64_t prune_updates = 20;
  // Whether the magnitude ranking spans all prunable tensors or each keeps the same share.
  pactrain::pruning_scope scope = pactrain::pruning_scope::per_tensor;
  std::uint64_t seed = 1;
  // Evaluations per epoch, at evenly spread steps, the last at the epoch's end; outside the
  // timed steps.
  std::uint64_t evals_per_epoch = 1;
};

/// One run (collective over `comm`). `sparsity` 0 is the dense baseline: no pruner. `topt`
/// and `engine_args` (after the communicator and layout) configure the engine; Sync may also
/// be exchange_engine (engine_args: a gradient_exchange&), which trains dense without the
/// fused step, and with plain SGD where the exchange applies momentum itself. A Task has
///   Model model() const;                          // built from the seed, the same on every rank
///   std::size_t local_samples() const;            // this rank's training samples per epoch
///   void begin_epoch(int epoch);                  // the epoch's order, the same on every rank
///   torch::Tensor loss(Model&, std::int64_t at, std::int64_t n);  // mean loss of samples
///                                                 // [at, at + n) of this rank's epoch order
///   void evaluate(Model&, epoch_record&, MPI_Comm);  // sets the record's quality fields
template <class Sync, class Task, class... EngineArgs>
train_result torch_train(const torch_run_options& o, double sparsity, Task& task, MPI_Comm comm,
                         const char* name, metric quality, pactrain::torch_options topt,
                         EngineArgs&&... engine_args) {
  const auto run_start = std::chrono::steady_clock::now();
  int rank = 0;
  int ranks = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &ranks);
  // Every rank takes the same number of steps: the smallest shard decides.
  auto min_shard = static_cast<unsigned long long>(task.local_samples());
  MPI_Allreduce(MPI_IN_PLACE, &min_shard, 1, MPI_UNSIGNED_LONG_LONG, MPI_MIN, comm);
  const auto steps_per_epoch =
      static_cast<std::uint64_t>(min_shard) / static_cast<std::uint64_t>(o.batch);
  PACTRAIN_EXPECTS(steps_per_epoch > 0, std::string(name) + ": less than one batch per rank");
  PACTRAIN_EXPECTS(o.evals_per_epoch > 0, std::string(name) + ": evals_per_epoch must be positive");
  const std::uint64_t total_steps = steps_per_epoch * static_cast<std::uint64_t>(o.epochs);

  torch::manual_seed(o.seed);  // the same initial weights everywhere (broadcast makes sure)
  auto model = task.model();
  using pruner_type = pactrain::pruner<pactrain::magnitude_pruning, pactrain::gradual_schedule>;

  // [snippet:setup]
  pactrain::torch_params params(*model, topt);
  Sync sync{pactrain::mpi_communicator{comm}, params.layout(), engine_args...};
  params.broadcast(sync.get_communicator());
  pactrain::torch_overlap overlap(params, sync);
  pactrain::sgd opt({.lr = o.lr, .momentum = o.momentum, .weight_decay = o.weight_decay});
  std::optional<pruner_type> pruner;  // none in the dense run
  if (sparsity > 0) {
    pruner.emplace(pactrain::magnitude_pruning{.scope = o.scope},
                   pactrain::gradual_schedule::over_run(total_steps, o.prune_start, o.prune_end,
                                                        sparsity, o.prune_updates),
                   params.prunable());
  }
  // [/snippet:setup]
  constexpr bool engine = !is_exchange_engine<Sync>;
  bool local_clip = false;  // an exchange clips each rank's gradient (DGC): not the average
  if constexpr (!engine) {
    PACTRAIN_EXPECTS(sparsity == 0 && !o.fused,
                     std::string(name) + ": a gradient exchange trains dense, without --fused");
    sync.bind_params(params.values_const());
    if (sync.exchange().applies_momentum()) opt = pactrain::sgd({.lr = o.lr});
    local_clip = sync.exchange().clips_locally();
    if (local_clip) sync.exchange().set_clip(o.clip);
  }
  const std::uint64_t last_update =
      pruner ? last_mask_update(pruner->schedule(), total_steps) : total_steps;

  train_result res;
  res.steps_per_epoch = steps_per_epoch;
  std::uint64_t step = 0;
  double bytes_sent = 0;  // over the run
  for (int epoch = 1; epoch <= o.epochs; ++epoch) {
    task.begin_epoch(epoch);
    double loss_sum = 0;
    double sync_seconds = 0;
    double prune_seconds = 0;
    double eval_seconds = 0;   // evaluation inside the epoch, not timed
    epoch_record quality_rec;  // the last evaluation's quality fields
    const auto epoch_start = std::chrono::steady_clock::now();
    for (std::uint64_t s = 0; s < steps_per_epoch; ++s, ++step) {
      opt.set_lr(o.lr * lr_factor(o.shape, step, total_steps, last_update));
      // [snippet:step]
      overlap.begin_step();  // instead of zero_grad
      const torch::Tensor loss = task.loss(model, static_cast<std::int64_t>(s) * o.batch, o.batch);
      loss.backward();  // each bucket leaves when its gradients are written
      if (o.fused) {    // the kept weights step from the payloads; no gradient written back
        auto update = opt.fused(params.layout(), sync.masks(), params.values(), params.momentum());
        overlap.finish_step(update);  // no update after a non-finite step
      } else {
        overlap.finish_step();  // averaged over the ranks, +0 at pruned entries
        if (sync.stats().nonfinite_buckets == 0) {
          if (o.clip > 0 && !local_clip) {  // averaged: the same on every rank, so is its norm
            const double norm = params.flat_grads().norm().item<double>();
            if (norm > o.clip) params.flat_grads().mul_(o.clip / norm);
          }
          opt.step(params.values(), params.grads(), params.momentum());
        }
      }
      // [/snippet:step]
      // The engine's own phases; its step clock also spans backward, which the hooks overlap.
      const pactrain::sync_stats& st = sync.stats();
      sync_seconds += st.gather_seconds + st.allreduce_seconds + st.scatter_seconds;
      bytes_sent += static_cast<double>(st.bytes_sent);
      const auto prune_at = std::chrono::steady_clock::now();
      if constexpr (engine) {
        // [snippet:prune]
        if (pruner && pruner->step(sync, params.values_const())) params.apply_masks(sync.masks());
        // [/snippet:prune]
      }
      prune_seconds += seconds_since(prune_at);
      if (pruner && pruner->schedule().is_update_step(step)) ++res.mask_updates;
      loss_sum += loss.item<double>();
      if (evaluates_after(s, steps_per_epoch, o.evals_per_epoch)) {
        const auto eval_at = std::chrono::steady_clock::now();
        double so_far = res.train_seconds + seconds_since(epoch_start) - eval_seconds;
        MPI_Allreduce(MPI_IN_PLACE, &so_far, 1, MPI_DOUBLE, MPI_SUM, comm);
        {
          torch::NoGradGuard no_grad;
          model->eval();
          task.evaluate(model, quality_rec, comm);
          model->train();
        }
        res.evals.push_back(
            {.step = step + 1,
             .epoch = static_cast<double>(step + 1) / static_cast<double>(steps_per_epoch),
             .train_seconds = so_far / ranks,
             .test_accuracy = quality_rec.test_accuracy,
             .val_bpb = quality_rec.val_bpb});
        eval_seconds += seconds_since(eval_at);
      }
    }
    // Loss summed, times averaged over the ranks (a fast rank waits longer in the sync).
    double sums[4] = {loss_sum, seconds_since(epoch_start) - eval_seconds, sync_seconds,
                      prune_seconds};
    MPI_Allreduce(MPI_IN_PLACE, sums, 4, MPI_DOUBLE, MPI_SUM, comm);
    const auto per_step = static_cast<double>(steps_per_epoch);
    epoch_record rec;
    rec.epoch = epoch;
    rec.train_loss = sums[0] / (per_step * ranks);
    rec.epoch_seconds = sums[1] / ranks;
    rec.step_seconds = rec.epoch_seconds / per_step;
    rec.sync_seconds = sums[2] / ranks / per_step;
    rec.prune_seconds = sums[3] / ranks / per_step;
    // The epoch's last evaluation is at its end.
    rec.test_accuracy = quality_rec.test_accuracy;
    rec.val_loss = quality_rec.val_loss;
    rec.val_bpb = quality_rec.val_bpb;
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
    if (rank == 0) print_progress(name, rec, quality);
  }
  const epoch_record& last = res.history.back();
  res.test_accuracy = last.test_accuracy;
  res.val_loss = last.val_loss;
  res.val_bpb = last.val_bpb;
  res.sparsity = last.sparsity;
  res.bytes_per_step = sync.stats().bytes_sent;
  res.dense_bytes_per_step = sync.stats().dense_bytes;
  res.collectives_per_step = sync.stats().collectives;
  res.mean_bytes_per_step = bytes_sent / static_cast<double>(step);
  res.steps = step;
  res.step_seconds = res.train_seconds / static_cast<double>(step);
  res.sync_seconds /= static_cast<double>(step);
  res.prune_seconds /= static_cast<double>(step);
  res.weights_agree = same_on_all_ranks(params.values_const(), comm);
  res.masks = sync.masks();
  res.params.assign(params.values_const().begin(), params.values_const().end());
  res.layout = params.layout();
  res.total_seconds = seconds_since(run_start);
  return res;
}

/// The settings every LibTorch example takes from its command line.
struct torch_cli {
  std::string mode = "all";       // all, both (dense and sparse), dense, sparse or ternary
  double sparsity = 0.9;          // final fraction of the prunable weights pruned
  std::size_t ternary_block = 0;  // ternary run: kept entries per scale (0: one per bucket)
  std::string summary;            // JSON summary path (none if empty)
  torch_run_options run;
};

/// The lines of the usage text for the options parse_torch_option reads.
constexpr const char* torch_cli_usage =
    "       [--mode all|both|dense|sparse|ternary] [--epochs N] [--batch B] [--lr X]\n"
    "       [--lr-warmup F] [--lr-rewind F] [--momentum X] [--weight-decay X] [--clip X]\n"
    "       [--fused on|off]\n"
    "       [--sparsity S] [--prune-window A,B] [--prune-updates N] [--scope per-tensor|global]\n"
    "       [--ternary-block B] [--summary PATH] [--seed N] [--evals-per-epoch N]";

/// Reads option `a` with value `v` into `c`; false if `a` is not one of torch_cli's.
inline bool parse_torch_option(const std::string& a, const std::string& v, torch_cli& c) {
  torch_run_options& r = c.run;
  if (a == "--mode") {
    c.mode = one_of(a, v, {"all", "both", "dense", "sparse", "ternary"});
  } else if (a == "--epochs") {
    r.epochs = static_cast<int>(to_count(a, v));
  } else if (a == "--batch") {
    r.batch = static_cast<std::int64_t>(to_count(a, v));
  } else if (a == "--lr") {
    r.lr = to_double(a, v);
  } else if (a == "--lr-warmup") {
    r.shape.warmup = to_double(a, v);
  } else if (a == "--lr-rewind") {
    r.shape.rewind = to_double(a, v);
  } else if (a == "--momentum") {
    r.momentum = to_double(a, v);
  } else if (a == "--weight-decay") {
    r.weight_decay = to_double(a, v);
  } else if (a == "--clip") {
    r.clip = to_double(a, v);
  } else if (a == "--fused") {
    r.fused = on_off(a, v);
  } else if (a == "--sparsity") {
    c.sparsity = to_double(a, v);
  } else if (a == "--prune-window") {
    const auto p = split(v, ',');
    if (p.size() != 2) throw pactrain::error("--prune-window: expected A,B, got '" + v + "'");
    r.prune_start = to_double(a, p[0]);
    r.prune_end = to_double(a, p[1]);
  } else if (a == "--prune-updates") {
    r.prune_updates = to_count(a, v);
  } else if (a == "--scope") {
    r.scope = scope_option(a, v);
  } else if (a == "--ternary-block") {
    c.ternary_block = to_count(a, v);
  } else if (a == "--summary") {
    c.summary = v;
  } else if (a == "--seed") {
    r.seed = to_count(a, v);
  } else if (a == "--evals-per-epoch") {
    r.evals_per_epoch = to_count(a, v);
  } else {
    return false;
  }
  return true;
}

/// How the ternary run scales its lanes, for the programs' headers.
inline std::string ternary_scale_text(const torch_cli& c) {
  return c.ternary_block == 0 ? "one bucket, one scale"
                              : "one bucket, one scale per block of " +
                                    std::to_string(c.ternary_block) + " kept entries";
}

/// Entries of a module's parameters.
inline std::size_t parameter_count(torch::nn::Module& m) {
  std::size_t n = 0;
  for (const auto& p : m.parameters()) n += static_cast<std::size_t>(p.numel());
  return n;
}

/// Prints the recipe lines the LibTorch examples share (on rank 0): the optimiser and its
/// schedule, then the pruned and ternary runs; `pruned` names what the pruner prunes, `dense`
/// what stays dense.
inline void print_recipe(const torch_cli& c, const char* pruned, const char* dense) {
  const torch_run_options& r = c.run;
  std::printf(
      "lr %g (warm-up %g, cosine to 0; pruned runs: rewind %g), momentum %g, weight decay %g, "
      "clip %g, seed %llu\n"
      "pruned runs: gradual %s magnitude pruning of the %s to %.0f%% over steps %.0f%%-%.0f%%, "
      "%s dense; ternary run: kept entries sent as ternary lanes with error feedback, %s\n",
      r.lr, r.shape.warmup, r.shape.rewind, r.momentum, r.weight_decay, r.clip,
      static_cast<unsigned long long>(r.seed),
      r.scope == pactrain::pruning_scope::global ? "global" : "per-tensor", pruned,
      100.0 * c.sparsity, 100.0 * r.prune_start, 100.0 * r.prune_end, dense,
      ternary_scale_text(c).c_str());
}

/// Throws pactrain::error for settings no run can use.
inline void validate(const torch_cli& c);

/// Reads argv into `c`: torch_cli's options, and the program's own through
/// `extra(flag, value)`, which returns false for a flag it does not know. Throws
/// pactrain::error carrying `usage` for --help, a missing value or an unknown option, and for
/// settings validate() refuses.
template <class Extra>
void parse_command_line(int argc, char** argv, const std::string& usage, torch_cli& c,
                        Extra&& extra) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") throw pactrain::error(usage);
    if (i + 1 >= argc) throw pactrain::error(a + ": missing value (or unknown option)\n" + usage);
    const std::string v = argv[++i];
    if (!parse_torch_option(a, v, c) && !extra(a, v))
      throw pactrain::error("unknown option '" + a + "'\n" + usage);
  }
  validate(c);
}

inline void validate(const torch_cli& c) {
  const torch_run_options& r = c.run;
  if (r.epochs < 1 || r.batch < 1) throw pactrain::error("--epochs and --batch must be positive");
  if (!(c.sparsity > 0.0 && c.sparsity < 1.0))
    throw pactrain::error("--sparsity must be in (0, 1)");
  if (!(r.lr > 0.0) || !(r.momentum >= 0.0 && r.momentum < 1.0) || !(r.weight_decay >= 0.0) ||
      !(r.clip >= 0.0))
    throw pactrain::error(
        "need --lr > 0, 0 <= --momentum < 1, --weight-decay >= 0 and --clip >= 0");
  if (r.fused && r.clip > 0.0)
    throw pactrain::error("--fused on needs --clip 0: clipping needs the whole averaged gradient");
  if (!(r.shape.warmup >= 0.0 && r.shape.warmup < 1.0) || !(r.shape.rewind >= 0.0))
    throw pactrain::error("need 0 <= --lr-warmup < 1 and --lr-rewind >= 0");
  if (!(r.prune_start >= 0.0 && r.prune_start < r.prune_end && r.prune_end <= 1.0))
    throw pactrain::error("--prune-window: need 0 <= A < B <= 1");
  if (r.prune_updates < 1) throw pactrain::error("--prune-updates must be positive");
}

/// The runs `c.mode` asks for, one after the other on the same task: dense (whole buckets,
/// no pruner), sparse (pruned to c.sparsity, kept entries as float) and ternary (the sparse run
/// with kept entries as ternary lanes with error feedback, every tensor in one bucket, so one
/// scale round and one allreduce per step, with a scale per block of c.ternary_block kept
/// entries: the layers' gradients differ by orders of magnitude, and so do the rows of one
/// matrix; a shared scale would round most to 0). That is bench/e2e's LibTorch grid.
template <class Task>
std::vector<named_run> run_modes(const torch_cli& c, Task& task, metric quality, MPI_Comm comm) {
  using plain_sync = pactrain::sync<pactrain::mpi_communicator>;
  using ternary_sync =
      pactrain::sync<pactrain::mpi_communicator, pactrain::error_feedback<pactrain::ternary_codec>>;
  const auto strategy = [](pactrain::bucket_strategy s) {
    return pactrain::sync_options{.strategy = s};
  };
  const auto wants = [&](const std::string& name) {
    return c.mode == name || c.mode == "all" || (c.mode == "both" && name != "ternary");
  };
  std::vector<named_run> runs;
  if (wants("dense")) {
    runs.push_back({"dense", torch_train<plain_sync>(c.run, 0.0, task, comm, "dense", quality, {},
                                                     strategy(pactrain::bucket_strategy::dense))});
  }
  if (wants("sparse")) {
    runs.push_back(
        {"sparse", torch_train<plain_sync>(c.run, c.sparsity, task, comm, "sparse", quality, {},
                                           strategy(pactrain::bucket_strategy::sparse))});
  }
  if (wants("ternary")) {
    runs.push_back({"ternary", torch_train<ternary_sync>(
                                   c.run, c.sparsity, task, comm, "ternary", quality, {},
                                   pactrain::ternary_codec{
                                       {.seed = c.run.seed, .scale_block = c.ternary_block}},
                                   strategy(pactrain::bucket_strategy::sparse))});
  }
  return runs;
}

/// The "config" object of a summary: the run settings, then `extra` (", \"key\": value"...).
inline std::string config_json(const torch_cli& c, int ranks, const std::string& extra) {
  const torch_run_options& r = c.run;
  return "{\"batch_per_rank\": " + std::to_string(r.batch) +
         ", \"global_batch\": " + std::to_string(r.batch * ranks) + ", \"lr\": " + num(r.lr) +
         ", \"lr_warmup\": " + num(r.shape.warmup) + ", \"lr_rewind\": " + num(r.shape.rewind) +
         ", \"lr_schedule\": \"cosine to 0\", \"momentum\": " + num(r.momentum) +
         ", \"weight_decay\": " + num(r.weight_decay) + ", \"clip\": " + num(r.clip) +
         ", \"fused\": " + (r.fused ? "true" : "false") +
         ", \"target_sparsity\": " + num(c.sparsity) + ", \"prune_start\": " + num(r.prune_start) +
         ", \"prune_end\": " + num(r.prune_end) +
         ", \"prune_updates\": " + std::to_string(r.prune_updates) + ", \"scope\": \"" +
         (r.scope == pactrain::pruning_scope::global ? "global" : "per-tensor") +
         "\", \"ternary_block\": " + std::to_string(c.ternary_block) + ", \"overlap\": true" +
         extra + "}";
}

/// Runs what `c.mode` asks for (run_modes), then on rank 0 prints the side-by-side table and
/// writes the summary where `c.summary` names a file. `model_json` describes the model (a JSON
/// object) and `config_extra` adds keys to the summary's config (", \"key\": value"...).
/// Returns the program's exit status: 0 when every run ended with the same weights on every
/// rank.
template <class Task>
int run_and_report(const torch_cli& c, Task& task, metric quality, MPI_Comm comm,
                   std::chrono::steady_clock::time_point wall_start, const std::string& model_json,
                   const std::string& config_extra) {
  int rank = 0;
  int ranks = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &ranks);
  const std::vector<named_run> runs = run_modes(c, task, quality, comm);
  const double wall = seconds_since(wall_start);
  bool agree = true;
  for (const auto& run : runs) agree = agree && run.result.weights_agree;
  if (rank == 0) {
    print_table(runs, wall, agree, quality);
    if (!c.summary.empty()) {
      write_summary(c.summary,
                    {ranks, c.run.epochs, c.run.seed, model_json,
                     config_json(c, ranks, config_extra), quality},
                    runs, wall);
      std::printf("summary: %s\n", c.summary.c_str());
    }
  }
  return agree ? 0 : 1;
}

}  // namespace examples
