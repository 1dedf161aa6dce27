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
// baselines of baselines.hpp: topk (DGC), powersgd and fp16. Every method trains the same
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
//   and the trainer's options as pactrain_fmnist reads them (examples/fmnist/options.hpp:
//   --lr, --ternary-rows, --ternary-block, --ternary-scale, --optimizer, ...), except that
//   the ternary runs default to --ternary-rows 0 --ternary-block 1024 --ternary-scale previous
//   --train-limit N, --test-limit N [0: all]    --data DIR
//   --link NAME, --link-bits N   recorded in the point (the testbed's rate) [none, 0]
//   --out PATH          the JSON point (rank 0 writes it)
//   --verify            check the baselines on exactly summable data instead of training
#include "baselines.hpp"

#include "fmnist/options.hpp"
#include "fmnist/trainer.hpp"

#include "common/cli.hpp"
#include "common/run_main.hpp"
#include "common/run_report.hpp"
#include "fmnist/load.hpp"
#include "fmnist/mlp.hpp"

#include <mpi.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

namespace {

namespace fm = pactrain::fmnist;

struct options {
  fm::train_config cfg;
  std::string method = "sparse";
  double sparsity = 0.9;
  std::string powersgd_rank = "4";
  std::size_t train_limit = 0;
  std::size_t test_limit = 0;
  std::string data = fm::default_data_dir;
  std::string link = "none";
  std::uint64_t link_bits = 0;
  std::string out;
  bool verify = false;
};

constexpr const char* usage =
    "usage: pactrain_e2e [--method dense|sparse|ternary|auto|topk|powersgd|fp16] [--epochs N]\n"
    "       [--batch B] [--seed N] [--sparsity S] [--prune-window A,B] [--prune-updates N]\n"
    "       [--powersgd-rank R|match] [--ternary-rows R] [--ternary-block B]\n"
    "       [--ternary-scale current|previous] [--optimizer example|sgd|fused]\n"
    "       [--train-limit N] [--test-limit N] [--data DIR]\n"
    "       [--link NAME] [--link-bits N] [--out PATH] | --verify";

options parse(int argc, char** argv) {
  using examples::to_count;
  using examples::to_double;
  options o;
  o.cfg.epochs = 6;
  // Ternary: one bucket per tensor with a scale per 1024 kept entries, reduced beside the data
  // (previous_max): two collectives per step fewer than pactrain_fmnist's default of a bucket
  // and a scale round per 64 rows, which at 100 Mbit/s cut the pruned step from 68 to 31 ms.
  o.cfg.ternary_rows = 0;
  o.cfg.ternary_block = 1024;
  o.cfg.ternary_scale = pactrain::scale_source::previous_max;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--verify") {
      o.verify = true;
      continue;
    }
    if (a == "--help" || a == "-h") throw pactrain::error(usage);
    if (i + 1 >= argc) throw pactrain::error(a + ": missing value (or unknown option)\n" + usage);
    const std::string v = argv[++i];
    if (fm::parse_train_option(a, v, o.cfg)) continue;
    if (a == "--method") {
      o.method = v;
    } else if (a == "--sparsity") {
      o.sparsity = to_double(a, v);
    } else if (a == "--powersgd-rank") {
      if (v != "match") static_cast<void>(to_count(a, v));
      o.powersgd_rank = v;
    } else if (a == "--train-limit") {
      o.train_limit = to_count(a, v);
    } else if (a == "--test-limit") {
      o.test_limit = to_count(a, v);
    } else if (a == "--data") {
      o.data = v;
    } else if (a == "--link") {
      o.link = v;
    } else if (a == "--link-bits") {
      o.link_bits = to_count(a, v);
    } else if (a == "--out") {
      o.out = v;
    } else {
      throw pactrain::error("unknown option '" + a + "'\n" + usage);
    }
  }
  const std::string methods = " dense sparse ternary auto topk powersgd fp16 ";
  if (methods.find(" " + o.method + " ") == std::string::npos)
    throw pactrain::error("--method: unknown method '" + o.method + "'\n" + usage);
  if (o.cfg.epochs < 1 || o.cfg.batch < 1)
    throw pactrain::error("--epochs and --batch must be positive");
  if (!(o.sparsity > 0.0 && o.sparsity < 1.0))
    throw pactrain::error("--sparsity must be in (0, 1)");
  return o;
}

/// Entries the pruned runs keep at the end: the matrices' unpruned share, and every vector.
std::size_t kept_entries(const pactrain::param_layout& l, double sparsity) {
  std::size_t matrices = 0;
  std::size_t vectors = 0;
  for (const auto& t : l.tensors()) (t.rows > 0 ? matrices : vectors) += t.size;
  return matrices - pactrain::pruned_count(matrices, sparsity) + vectors;
}

std::string point_json(const options& o, const fm::train_result& r, int ranks, std::size_t steady,
                       double steady_step) {
  using examples::num;
  std::string method = o.method;
  if (method == "powersgd") method += o.powersgd_rank == "match" ? "M" : o.powersgd_rank;
  std::ostringstream j;
  j << "{\"trainer\": \"fmnist_mlp\", \"link\": \"" << o.link
    << "\", \"link_bits\": " << o.link_bits << ", \"ranks\": " << ranks << ", \"method\": \""
    << method << "\", \"epochs\": " << o.cfg.epochs
    << ", \"steps_per_epoch\": " << r.steps_per_epoch
    << ", \"global_batch\": " << o.cfg.batch * static_cast<std::size_t>(ranks)
    << ", \"samples_per_step\": " << o.cfg.batch * static_cast<std::size_t>(ranks)
    << ", \"final_accuracy\": " << num(r.test_accuracy)
    << ", \"train_seconds\": " << num(r.train_seconds)
    << ", \"total_seconds\": " << num(r.total_seconds)
    << ", \"mean_bytes_per_step\": " << num(r.mean_bytes_per_step)
    << ", \"final_bytes_per_step\": " << r.bytes_per_step
    << ", \"dense_bytes_per_step\": " << r.dense_bytes_per_step
    << ", \"steady_from_epoch\": " << steady << ", \"steady_step_seconds\": " << num(steady_step)
    << ", \"weights_agree\": " << (r.weights_agree ? "true" : "false") << ", \"history\": [";
  double wall = 0;
  for (std::size_t i = 0; i < r.history.size(); ++i) {
    const auto& e = r.history[i];
    wall += e.epoch_seconds;
    j << (i ? ", " : "") << "{\"epoch\": " << e.epoch << ", \"wall_seconds\": " << num(wall)
      << ", \"test_accuracy\": " << num(e.test_accuracy)
      << ", \"train_loss\": " << num(e.train_loss) << ", \"step_seconds\": " << num(e.step_seconds)
      << ", \"bytes_per_step\": " << e.bytes_per_step << ", \"sparsity\": " << num(e.sparsity)
      << "}";
  }
  j << "]}\n";
  return j.str();
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
  const std::size_t n = layout.total_size();

  fm::train_config cfg = o.cfg;
  const bool pactrain_method = o.method == "sparse" || o.method == "ternary" || o.method == "auto";
  if (pactrain_method) cfg.sparsity = o.sparsity;
  cfg.ternary = o.method == "ternary" || o.method == "auto";
  cfg.tune = o.method == "auto";
  std::unique_ptr<fm::gradient_exchange> x;
  const std::size_t kept = kept_entries(layout, o.sparsity);
  if (o.method == "dense" || o.method == "fp16") {
    x = e2e::make_bench_exchange(o.method.c_str(), MPI_COMM_WORLD, n);
  } else if (o.method == "topk") {
    x = std::make_unique<e2e::dgc_exchange>(MPI_COMM_WORLD, n, kept, cfg.momentum,
                                            cfg.weight_decay);
  } else if (o.method == "powersgd") {
    const std::size_t r = o.powersgd_rank == "match"
                              ? e2e::powersgd::rank_for_bytes(layout, kept * sizeof(float))
                              : examples::to_count("--powersgd-rank", o.powersgd_rank);
    x = std::make_unique<e2e::powersgd_exchange>(MPI_COMM_WORLD, layout, r, cfg.seed);
    if (rank == 0) std::printf("powersgd rank %zu\n", r);
  }
  // The steady state: the epochs that start after the pruned runs' last mask update.
  fm::train_config pruned = o.cfg;
  pruned.sparsity = o.sparsity;
  const std::size_t per_epoch = train_set.count / static_cast<std::size_t>(ranks) / cfg.batch;
  const std::uint64_t total = static_cast<std::uint64_t>(cfg.epochs) * per_epoch;
  const std::uint64_t last = fm::last_mask_update(pruned, total);
  std::size_t steady = static_cast<std::size_t>(cfg.epochs);
  for (std::size_t e = 1; e <= static_cast<std::size_t>(cfg.epochs); ++e) {
    if ((e - 1) * per_epoch >= last) {
      steady = e;
      break;
    }
  }
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
  double steady_seconds = 0;
  for (std::size_t e = steady; e <= r.history.size(); ++e)
    steady_seconds += r.history[e - 1].epoch_seconds;
  const double steady_step =
      steady_seconds / static_cast<double>((r.history.size() - steady + 1) * per_epoch);
  if (rank == 0 && !o.out.empty()) {
    std::ofstream f(o.out);
    f << point_json(o, r, ranks, steady, steady_step);
    if (!f) throw pactrain::error("cannot write " + o.out);
    std::printf("point: %s\n", o.out.c_str());
  }
  return r.weights_agree ? 0 : 1;
}

}  // namespace

int verify_baselines(int rank, int ranks);  // verify.cpp

int main(int argc, char** argv) {
  return examples::run_main(argc, argv, "pactrain_e2e", [&] {
    int rank = 0;
    int ranks = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &ranks);
    const options o = parse(argc, argv);
    return o.verify ? verify_baselines(rank, ranks) : train(o, rank, ranks);
  });
}
