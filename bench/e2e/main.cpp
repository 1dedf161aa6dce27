// pactrain_e2e: one end-to-end training run of the Fashion-MNIST MLP (examples/fmnist's
// trainer) with one gradient exchange method, written as one JSON point for
// bench/e2e/report.py; bench/e2e/run.sh runs the grid on the bandwidth-shaped testbed.
//
//   mpiexec -n 4 build/bench/pactrain_e2e --method sparse --epochs 6 --out point.json
//   mpiexec -n 4 build/bench/pactrain_e2e --verify      # the baselines against references
//
// Methods: dense (blocking ring MPI_Allreduce: the dense reference), pactrain's sparse,
// ternary (sparse, kept entries as ternary lanes with error feedback) and auto (ternary, with
// the planner and tuner choosing each bucket's strategy once the masks are final), and the
// baselines of bench/baselines/baselines.hpp: topk (DGC), powersgd and fp16. Every method trains the same
// model from the same seed on the same data for the same steps; topk's k is the number of
// entries the pruned runs keep at the end, and --powersgd-rank match picks the rank whose
// bytes come nearest the sparse run's.
//
// Options (defaults in brackets):
//   --method M          dense|sparse|ternary|auto|topk|powersgd|fp16 [sparse]
//   --epochs N [6]   --batch B [128]   --seed N [1]
//   --sparsity S        final sparsity of the pruned runs, and topk's k [0.9]
//   --prune-window A,B  [0.2,0.7]       --prune-updates N [20]
//   --powersgd-rank R   R or match [4]
//   --powersgd-start F  PowerSGD's dense start, a fraction of the steps [0]
//   --dgc-sparsity S    DGC's final sparsity [0.999]
//   --dgc-warmup-epochs E  DGC's sparsity warm-up, at most a quarter of the run [4]
//   and the trainer's options as pactrain_fmnist reads them (examples/fmnist/options.hpp:
//   --lr, --ternary-rows, --ternary-block, --ternary-scale, --optimizer, ...), with its
//   defaults
//   --train-limit N, --test-limit N [0: all]    --data DIR
//   --link NAME, --link-bits N   recorded in the point (the testbed's rate) [none, 0]
//   --machine TEXT      recorded in the point (what ran it) [not recorded]
//   --out PATH          the JSON point (rank 0 writes it)
//   --verify            check the baselines on exactly summable data instead of training
#include "point.hpp"

#include "fmnist/options.hpp"
#include "fmnist/trainer.hpp"

#include "common/cli.hpp"
#include "common/run_main.hpp"
#include "common/run_report.hpp"
#include "fmnist/load.hpp"
#include "fmnist/mlp.hpp"

#include <mpi.h>

#include <cstdio>
#include <memory>
#include <string>

namespace {

namespace fm = pactrain::fmnist;

struct options : e2e::run_options {
  fm::train_config cfg;
  double sparsity = 0.9;
  bool verify = false;
};

constexpr const char* usage =
    "usage: pactrain_e2e [--method dense|sparse|ternary|auto|topk|powersgd|fp16] [--epochs N]\n"
    "       [--batch B] [--seed N] [--sparsity S] [--prune-window A,B] [--prune-updates N]\n"
    "       [--powersgd-rank R|match] [--powersgd-start F] [--dgc-sparsity S]\n"
    "       [--dgc-warmup-epochs E] [--ternary-rows R] [--ternary-block B]\n"
    "       [--ternary-scale current|previous] [--optimizer example|sgd|fused]\n"
    "       [--train-limit N] [--test-limit N] [--data DIR]\n"
    "       [--lr-rewind F] [--evals-per-epoch N] [--link NAME] [--link-bits N]\n"
    "       [--machine TEXT] [--label NAME] [--out PATH] | --verify";

options parse(int argc, char** argv) {
  options o;
  o.cfg.epochs = 6;
  // Every method the same schedule (one cosine: a pruned run's second cycle after its last mask
  // update is a variant, --lr-rewind 1), and the accuracy 4 times an epoch, so that a time to
  // the target is not quantised to epoch ends.
  o.cfg.lr_rewind = 0;
  o.cfg.evals_per_epoch = 4;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--verify") {
      o.verify = true;
      continue;
    }
    if (a == "--help" || a == "-h") throw pactrain::error(usage);
    if (i + 1 >= argc) throw pactrain::error(a + ": missing value (or unknown option)\n" + usage);
    const std::string v = argv[++i];
    if (fm::parse_train_option(a, v, o.cfg) || e2e::parse_run_option(a, v, o)) continue;
    if (a == "--sparsity") {
      o.sparsity = examples::to_double(a, v);
    } else {
      throw pactrain::error("unknown option '" + a + "'\n" + usage);
    }
  }
  e2e::check_method(o, "dense sparse ternary auto topk powersgd fp16", usage);
  if (o.cfg.epochs < 1 || o.cfg.batch < 1)
    throw pactrain::error("--epochs and --batch must be positive");
  if (!(o.sparsity > 0.0 && o.sparsity < 1.0))
    throw pactrain::error("--sparsity must be in (0, 1)");
  return o;
}

int train(const options& o, int rank, int ranks) {
  fm::dataset train_set;
  fm::dataset test_set;
  if (!fm::load_splits(o.data, o.train_limit, o.test_limit, train_set, test_set, MPI_COMM_WORLD))
    return 1;
  std::vector<std::size_t> sizes{train_set.features()};
  sizes.insert(sizes.end(), o.cfg.hidden.begin(), o.cfg.hidden.end());
  sizes.push_back(fm::class_count);
  const pactrain::param_layout layout = fm::mlp(sizes).layout();

  fm::train_config cfg = o.cfg;
  if (e2e::is_pactrain_method(o.method)) cfg.sparsity = o.sparsity;
  cfg.ternary = o.method == "ternary" || o.method == "auto";
  cfg.tune = o.method == "auto";
  const std::size_t per_epoch = train_set.count / static_cast<std::size_t>(ranks) / cfg.batch;
  const std::uint64_t total = static_cast<std::uint64_t>(cfg.epochs) * per_epoch;
  std::unique_ptr<examples::gradient_exchange> x;
  if (!e2e::is_pactrain_method(o.method)) {
    const std::size_t k = e2e::kept_entries(layout, pactrain::matrix_tensors(layout), o.sparsity);
    x = e2e::make_exchange(o, MPI_COMM_WORLD, layout,
                           {.k = k,
                            .momentum = cfg.momentum,
                            .weight_decay = cfg.weight_decay,
                            .seed = cfg.seed,
                            .steps_per_epoch = per_epoch,
                            .steps = total});
  }
  // The steady state: the epochs that start after the pruned runs' last mask update.
  fm::train_config pruned = o.cfg;
  pruned.sparsity = o.sparsity;
  const std::size_t steady =
      e2e::steady_epoch(fm::last_mask_update(pruned, total), per_epoch, cfg.epochs);
  if (rank == 0) {
    std::printf("pactrain_e2e: %s, %d ranks, link %s, %d epochs of %zu steps\n", o.method.c_str(),
                ranks, o.link.c_str(), cfg.epochs, per_epoch);
    examples::print_progress_header();
  }
  const fm::train_result r = fm::train(
      cfg, train_set, test_set, MPI_COMM_WORLD,
      [&](const fm::epoch_record& e) {
        if (rank == 0) examples::print_progress(o.method.c_str(), e);
      },
      x.get());
  if (rank == 0 && !o.out.empty()) {
    const e2e::point_meta m{.trainer = "fmnist_mlp",
                            .link = o.link,
                            .link_bits = o.link_bits,
                            .machine = o.machine,
                            .method = e2e::method_label(o),
                            .epochs = cfg.epochs,
                            .seed = cfg.seed,
                            .lr_rewind = cfg.lr_rewind,
                            .evals_per_epoch = cfg.evals_per_epoch,
                            .global_batch = cfg.batch * static_cast<std::size_t>(ranks)};
    e2e::write_point(o.out, e2e::point_json(m, r, ranks, steady));
  }
  return r.weights_agree ? 0 : 1;
}

}  // namespace

int verify_baselines(int rank, int ranks);  // bench/baselines/verify.cpp

int main(int argc, char** argv) {
  return examples::run_main(argc, argv, "pactrain_e2e", [&] {
    const auto [rank, ranks] = examples::world();
    const options o = parse(argc, argv);
    return o.verify ? verify_baselines(rank, ranks) : train(o, rank, ranks);
  });
}
