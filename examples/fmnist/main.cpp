// pactrain_fmnist: data-parallel MLP training on Fashion-MNIST over MPI, dense against pruned
// gradient synchronisation, with the same seed and epochs, one run after the other.
//
// Build and run (from the repository root; needs libeigen3-dev, zlib1g-dev and
// dataset-fashion-mnist; --allow-run-as-root and --oversubscribe are for Open MPI as root
// with more ranks than cores, and yielding keeps oversubscribed ranks from starving each other):
//   cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
//   cmake --build build --target pactrain_fmnist
//   export OMPI_MCA_mpi_yield_when_idle=1
//   mpiexec --allow-run-as-root --oversubscribe -n 4 build/examples/pactrain_fmnist
// scripts/demo.sh does all of it (and writes build/demo/summary.json).
//
// Options (defaults in brackets):
//   --mode both|dense|sparse|ternary  which runs [both: dense, then sparse (then ternary)]
//   --codec none|ternary      ternary: also a run of the sparse setup whose kept entries travel
//                             as ternary lanes with error feedback [none]
//   --epochs N                epochs of each run [17]
//   --batch B                 mini-batch per rank [128]
//   --lr X                    peak learning rate [0.1]
//   --lr-warmup F             fraction of the steps over which the rate rises linearly from 0
//                             to the peak [0.05]
//   --lr-hold F               fraction of the steps at the peak rate, then cosine to 0 [0]
//   --lr-rewind X             pruned runs: after the last mask update, a second cosine from
//                             X times the peak rate to 0 (0: none) [1]
//   --momentum X              SGD momentum [0.9]
//   --weight-decay X          L2 weight decay [0.0001]
//   --sparsity S              final fraction of weights pruned in the sparse run [0.9]
//   --prune-window A,B        gradual pruning from A to B, fractions of the steps [0.2,0.7]
//   --prune-updates N         mask updates in the window [20]
//   --scope global|per-tensor magnitude ranking across all weights or per tensor [global]
//   --hidden A,B,...          hidden layer sizes [1024,64]
//   --train-limit N           use the first N training samples (0: all) [0]
//   --test-limit N            use the first N test samples (0: all) [0]
//   --data DIR                the four IDX files [/usr/share/datasets/fashion-mnist]
//   --summary PATH            write a JSON summary (accuracies as fractions in [0, 1])
//   --seed N                  initialisation and shuffling seed [1]
//   --ternary-rows R          ternary run: a bucket, and so a scale, per block of R rows of
//                             each weight matrix (0: a bucket per tensor) [0]
//   --ternary-block B         ternary run: one scale per B kept entries of a bucket (0: one
//                             per bucket) [1024]
//   --ternary-scale current|previous  ternary run: the scale from a MAX allreduce before
//                             encoding, or the previous step's, reduced beside the data
//                             [previous]
//   --overlap on|off          on: hand each layer's gradients to the sync engine as soon as
//                             backward has produced them (submit_bucket); off: one
//                             sync.allreduce after backward; the same bits either way [on]
//   --optimizer example|sgd|fused  example: the MLP's own SGD with momentum (mlp.hpp); sgd:
//                             pactrain::sgd after the sync (torch's rounding, with FMA);
//                             fused: pactrain::sgd inside the sync, updating only kept
//                             weights from the payloads; the bits of sgd [example]
#include "common/cli.hpp"
#include "common/run_main.hpp"
#include "common/run_report.hpp"
#include "fmnist/idx.hpp"
#include "fmnist/load.hpp"
#include "fmnist/mlp.hpp"
#include "fmnist/options.hpp"
#include "fmnist/trainer.hpp"

#include <pactrain/mpi.hpp>
#include <pactrain/pactrain.hpp>

#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

namespace {

namespace fm = pactrain::fmnist;

struct options {
  fm::train_config cfg;
  double sparsity = 0.9;
  std::string mode = "both";
  bool ternary = false;  // --codec ternary
  std::size_t train_limit = 0;
  std::size_t test_limit = 0;
  std::string data = fm::default_data_dir;
  std::string summary;
};

constexpr const char* usage =
    "usage: pactrain_fmnist [--mode both|dense|sparse|ternary] [--codec none|ternary] [--epochs "
    "N]\n"
    "       [--batch B] [--lr X] [--lr-warmup F] [--lr-hold F] [--lr-rewind X] [--momentum X]\n"
    "       [--weight-decay X] [--sparsity S] [--prune-window A,B] [--prune-updates N]\n"
    "       [--scope global|per-tensor] [--hidden A,B,...]\n"
    "       [--train-limit N] [--test-limit N] [--data DIR] [--summary PATH] [--seed N]\n"
    "       [--overlap on|off] [--ternary-rows R] [--ternary-block B] [--ternary-scale "
    "current|previous]\n"
    "       [--optimizer example|sgd|fused]";

options parse(int argc, char** argv) {
  using examples::to_count;
  using examples::to_double;
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") throw pactrain::error(usage);
    if (i + 1 >= argc) throw pactrain::error(a + ": missing value (or unknown option)\n" + usage);
    const std::string v = argv[++i];
    if (fm::parse_train_option(a, v, o.cfg)) continue;
    if (a == "--mode") {
      o.mode = examples::one_of(a, v, {"both", "dense", "sparse", "ternary"});
    } else if (a == "--codec") {
      o.ternary = examples::one_of<bool>(a, v, {{"ternary", true}, {"none", false}});
    } else if (a == "--sparsity") {
      o.sparsity = to_double(a, v);
    } else if (a == "--train-limit") {
      o.train_limit = to_count(a, v);
    } else if (a == "--test-limit") {
      o.test_limit = to_count(a, v);
    } else if (a == "--data") {
      o.data = v;
    } else if (a == "--summary") {
      o.summary = v;
    } else {
      throw pactrain::error("unknown option '" + a + "'\n" + usage);
    }
  }
  if (o.cfg.epochs < 1 || o.cfg.batch < 1)
    throw pactrain::error("--epochs and --batch must be positive");
  if (!(o.sparsity > 0.0 && o.sparsity < 1.0))
    throw pactrain::error("--sparsity must be in (0, 1)");
  if (!(o.cfg.lr > 0.0f) || !(o.cfg.momentum >= 0.0f && o.cfg.momentum < 1.0f) ||
      !(o.cfg.weight_decay >= 0.0f)) {
    throw pactrain::error("need --lr > 0, 0 <= --momentum < 1 and --weight-decay >= 0");
  }
  if (!(o.cfg.prune_start >= 0.0 && o.cfg.prune_start < o.cfg.prune_end && o.cfg.prune_end <= 1.0))
    throw pactrain::error("--prune-window: need 0 <= A < B <= 1");
  if (!(o.cfg.lr_warmup >= 0.0 && o.cfg.lr_hold >= 0.0 && o.cfg.lr_warmup + o.cfg.lr_hold < 1.0))
    throw pactrain::error("need --lr-warmup, --lr-hold >= 0 and --lr-warmup + --lr-hold < 1");
  if (!(o.cfg.lr_rewind >= 0.0)) throw pactrain::error("--lr-rewind must not be negative");
  if (o.cfg.prune_updates < 1) throw pactrain::error("--prune-updates must be positive");
  for (auto h : o.cfg.hidden)
    if (h == 0) throw pactrain::error("--hidden: layer sizes must be positive");
  return o;
}

using examples::join;
using examples::named_run;
using examples::num;

void write_summary(const options& o, int ranks, const fm::train_config& cfg,
                   const std::vector<std::size_t>& sizes, std::size_t params,
                   std::size_t train_count, std::size_t test_count,
                   const std::vector<named_run>& runs, double wall) {
  std::ostringstream model;
  model << "{\"sizes\": [" << join(sizes, ", ") << "], \"parameters\": " << params << "}";
  std::ostringstream c;
  c << "{\"batch_per_rank\": " << cfg.batch
    << ", \"global_batch\": " << cfg.batch * static_cast<std::size_t>(ranks)
    << ", \"lr\": " << num(cfg.lr) << ", \"lr_warmup\": " << num(cfg.lr_warmup)
    << ", \"lr_hold\": " << num(cfg.lr_hold) << ", \"lr_rewind\": " << num(cfg.lr_rewind)
    << ", \"lr_schedule\": \"linear from 0 over lr_warmup of the steps, constant for lr_hold, then "
       "cosine to 0; pruned runs: "
       "after the last mask update, cosine from lr_rewind x lr to 0\", \"momentum\": "
    << num(cfg.momentum) << ", \"weight_decay\": " << num(cfg.weight_decay)
    << ", \"target_sparsity\": " << num(o.sparsity) << ", \"prune_start\": " << num(cfg.prune_start)
    << ", \"prune_end\": " << num(cfg.prune_end) << ", \"prune_updates\": " << cfg.prune_updates
    << ", \"scope\": \"" << (cfg.scope == pactrain::pruning_scope::global ? "global" : "per-tensor")
    << "\", \"overlap\": " << (cfg.overlap ? "true" : "false") << ", \"optimizer\": \""
    << fm::to_string(cfg.optimizer) << "\", \"train_samples\": " << train_count
    << ", \"test_samples\": " << test_count << "}";
  examples::write_summary(o.summary, {ranks, cfg.epochs, cfg.seed, model.str(), c.str()}, runs,
                          wall);
}

int run(int argc, char** argv) {
  const auto wall_start = std::chrono::steady_clock::now();
  const auto [rank, ranks] = examples::world();

  const options o = parse(argc, argv);  // same arguments, same verdict on every rank

  fm::dataset train_set;
  fm::dataset test_set;
  if (!fm::load_splits(o.data, o.train_limit, o.test_limit, train_set, test_set, MPI_COMM_WORLD))
    return 1;

  std::vector<std::size_t> sizes{train_set.features()};
  sizes.insert(sizes.end(), o.cfg.hidden.begin(), o.cfg.hidden.end());
  sizes.push_back(fm::class_count);
  const fm::mlp shape(sizes);
  const std::size_t params = shape.layout().total_size();
  const std::size_t per_epoch = train_set.count / static_cast<std::size_t>(ranks) / o.cfg.batch;
  if (rank == 0) {
    std::printf(
        "pactrain %s Fashion-MNIST: %d ranks, MLP %s (%zu parameters), %zu train / %zu test "
        "samples\n",
        pactrain::version_string(), ranks, join(sizes, "-").c_str(), params, train_set.count,
        test_set.count);
    char rewind[96] = "";
    if (o.cfg.lr_rewind > 0.0) {
      std::snprintf(rewind, sizeof rewind, ", then lr back to %g and cosine to 0",
                    static_cast<double>(o.cfg.lr) * o.cfg.lr_rewind);
    }
    std::printf(
        "%d epochs of %zu steps, batch %zu per rank (%zu global), lr %g (warm-up over %.0f%% of "
        "the steps, held for %.0f%%, then cosine to 0), momentum %g, weight decay %g, seed %llu\n"
        "sparse run: gradual %s magnitude pruning of the weights to %.0f%% over steps "
        "%.0f%%-%.0f%%%s, biases dense%s\n",
        o.cfg.epochs, per_epoch, o.cfg.batch, o.cfg.batch * static_cast<std::size_t>(ranks),
        static_cast<double>(o.cfg.lr), 100.0 * o.cfg.lr_warmup, 100.0 * o.cfg.lr_hold,
        static_cast<double>(o.cfg.momentum), static_cast<double>(o.cfg.weight_decay),
        static_cast<unsigned long long>(o.cfg.seed),
        o.cfg.scope == pactrain::pruning_scope::global ? "global" : "per-tensor",
        100.0 * o.sparsity, 100.0 * o.cfg.prune_start, 100.0 * o.cfg.prune_end, rewind,
        o.ternary ? "; ternary run: the same, kept entries sent as ternary lanes with error "
                    "feedback"
                  : "");
    examples::print_progress_header();
  }

  const auto run_one = [&](const char* name, double sparsity, bool ternary) {
    fm::train_config cfg = o.cfg;
    cfg.sparsity = sparsity;
    cfg.ternary = ternary;
    return fm::train(cfg, train_set, test_set, MPI_COMM_WORLD, [&](const fm::epoch_record& e) {
      if (rank != 0) return;
      examples::print_progress(name, e);
    });
  };

  std::vector<named_run> runs;
  if (o.mode == "both" || o.mode == "dense")
    runs.push_back({"dense", run_one("dense", 0.0, false)});
  if (o.mode == "both" || o.mode == "sparse") {
    runs.push_back({"sparse", run_one("sparse", o.sparsity, false)});
  }
  if (o.mode == "ternary" || (o.ternary && o.mode != "dense")) {
    runs.push_back({"ternary", run_one("ternary", o.sparsity, true)});
  }
  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();

  bool agree = true;
  for (const auto& r : runs) agree = agree && r.result.weights_agree;
  if (rank == 0) {
    examples::print_table(runs, wall, agree);
    if (!o.summary.empty()) {
      write_summary(o, ranks, o.cfg, sizes, params, train_set.count, test_set.count, runs, wall);
      std::printf("summary: %s\n", o.summary.c_str());
    }
  }
  return agree ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  return examples::run_main(argc, argv, "pactrain_fmnist", [&] { return run(argc, argv); });
}
