// What pactrain's trainers report: the record of a run and of each epoch, the check that the
// weights agree across ranks, the side-by-side table and the JSON summary. Shared by
// examples/fmnist (Eigen), examples/torch_cnn and examples/torch_lm (LibTorch), so that all
// print the same table and write summaries with the same keys; the classifiers report test
// accuracy, the language model validation loss and bits per byte.
//
// Header-only. Build and run a trainer that uses it (from the repository root):
//   cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
//   cmake --build build --target pactrain_fmnist
//   export OMPI_MCA_mpi_yield_when_idle=1
//   mpiexec --allow-run-as-root --oversubscribe -n 4 build/examples/pactrain_fmnist
#pragma once

#include <pactrain/digest.hpp>
#include <pactrain/error.hpp>
#include <pactrain/layout.hpp>
#include <pactrain/mask.hpp>
#include <pactrain/pactrain.hpp>

#include <mpi.h>

#include <bit>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace examples {

/// What a trainer's quality is measured by.
enum class metric {
  accuracy,       // test accuracy (higher is better); gaps in points
  bits_per_byte,  // validation bits per byte (lower is better); gaps as ratios
};

/// Per-epoch progress (every rank has the same values).
struct epoch_record {
  int epoch = 0;
  double train_loss = 0;           // mean over the epoch's steps and all ranks
  double test_accuracy = 0;        // fraction in [0, 1] (classifiers)
  double val_loss = 0;             // mean validation loss in nats per byte (language model)
  double val_bpb = 0;              // validation bits per byte (language model)
  double sparsity = 0;             // fraction of prunable weights pruned at the epoch's end
  std::size_t bytes_per_step = 0;  // payload bytes this rank sent in the epoch's last step
  double step_seconds = 0;         // mean wall time per step
  double sync_seconds = 0;         // mean wall time per step inside the sync engine's calls
  double prune_seconds = 0;        // mean wall time per step in pruner.step and apply_masks
  double epoch_seconds = 0;        // training steps only (no evaluation)
};

/// One evaluation of the model during a run (every rank has the same values).
struct eval_record {
  std::uint64_t step = 0;    // steps taken before it
  double epoch = 0;          // step / steps per epoch: 1.25 is a quarter into the second epoch
  double train_seconds = 0;  // wall time of the steps so far (no evaluation), mean over ranks
  double test_accuracy = 0;  // classifiers
  double val_bpb = 0;        // language model
};

/// Whether a run evaluates after step `s` (from 0) of an epoch of `steps` steps, evaluating
/// `per_epoch` times an epoch at evenly spread steps, the last at the epoch's end.
inline bool evaluates_after(std::uint64_t s, std::uint64_t steps, std::uint64_t per_epoch) {
  return (s + 1) * per_epoch / steps != s * per_epoch / steps;
}

/// One run of a trainer, dense or pruned.
struct train_result {
  double test_accuracy = 0;  // at the end (classifiers)
  double val_loss = 0;       // at the end (language model)
  double val_bpb = 0;
  double sparsity = 0;
  std::size_t kept_weights = 0;      // kept entries of the prunable tensors at the end
  std::size_t prunable_weights = 0;  // entries of the prunable tensors
  std::size_t bytes_per_step = 0;    // payload bytes each rank sent in the last step
  std::size_t dense_bytes_per_step = 0;
  double mean_bytes_per_step = 0;  // payload bytes each rank sent per step, over the whole run
  double step_seconds = 0;         // mean wall time per step over the run
  double sync_seconds = 0;         // mean wall time per step inside the sync engine's calls
  double prune_seconds = 0;        // mean wall time per step in pruner.step and apply_masks
  double train_seconds = 0;        // all steps (no evaluation)
  double total_seconds = 0;        // including evaluation
  std::uint64_t steps = 0;
  std::size_t steps_per_epoch = 0;
  std::size_t mask_updates = 0;
  std::size_t collectives_per_step = 0;  // collectives the last step issued
  bool weights_agree = false;            // bit-identical weights on every rank at the end
  std::vector<epoch_record> history;
  std::vector<eval_record> evals;            // every evaluation, the epochs' last ones included
  std::vector<pactrain::bitmap_mask> masks;  // final masks, in layout order
  std::vector<float> params;                 // final parameters
  pactrain::param_layout layout;
};

/// Collective: whether `v` holds the same bits on every rank of `comm`.
inline bool same_on_all_ranks(std::span<const float> v, MPI_Comm comm) {
  pactrain::digest_builder d(0x77656967);  // "weig"
  for (float f : v) d.add(static_cast<std::uint64_t>(std::bit_cast<std::uint32_t>(f)));
  unsigned long long mine[2] = {d.value(), ~d.value()};
  MPI_Allreduce(MPI_IN_PLACE, mine, 2, MPI_UNSIGNED_LONG_LONG, MPI_MAX, comm);
  return mine[0] == ~mine[1];
}

inline std::string join(const std::vector<std::size_t>& v, const char* sep) {
  std::string s;
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? sep : "") + std::to_string(v[i]);
  return s;
}

/// `v` as a JSON number; null where it is not finite (JSON has no Inf or NaN).
inline std::string num(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

// A float setting as it was given (0.1, not 0.100000001).
inline std::string num(float v) {
  if (!std::isfinite(v)) return "null";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.7g", static_cast<double>(v));
  return buf;
}

struct named_run {
  std::string name;  // dense, sparse or ternary
  train_result result;
};

inline const train_result* find_run(const std::vector<named_run>& runs, std::string_view name) {
  for (const auto& r : runs)
    if (r.name == name) return &r.result;
  return nullptr;
}

/// Wall time since `t0`, in seconds.
inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

/// The header of the per-epoch lines.
inline void print_progress_header(metric m = metric::accuracy) {
  std::printf("%-7s %5s %8s %9s %9s %12s %9s %6s %6s\n", "run", "epoch", "loss",
              m == metric::accuracy ? "test acc" : "val bpb", "sparsity", "bytes/step", "step ms",
              "sync", "prune");
  std::fflush(stdout);
}

/// One epoch's line of run `run` (rank 0 prints them).
inline void print_progress(const char* run, const epoch_record& e, metric m = metric::accuracy) {
  char quality[32];
  if (m == metric::accuracy) {
    std::snprintf(quality, sizeof quality, "%8.2f%%", 100.0 * e.test_accuracy);
  } else {
    std::snprintf(quality, sizeof quality, "%9.4f", e.val_bpb);
  }
  std::printf("%-7s %5d %8.4f %s %8.1f%% %12zu %9.2f %5.0f%% %5.0f%%\n", run, e.epoch, e.train_loss,
              quality, 100.0 * e.sparsity, e.bytes_per_step, 1e3 * e.step_seconds,
              100.0 * e.sync_seconds / e.step_seconds, 100.0 * e.prune_seconds / e.step_seconds);
  std::fflush(stdout);
}

/// The side-by-side table of the runs, the gaps to the dense run and the wall time.
inline void print_table(const std::vector<named_run>& runs, double wall, bool agree,
                        metric m = metric::accuracy) {
  const auto* dense = find_run(runs, "dense");
  std::printf("\n%-22s", "");
  for (const auto& r : runs) std::printf(" %12s", r.name.c_str());
  std::printf("\n");
  const auto row = [&](const char* label, auto get) {
    std::printf("%-22s", label);
    for (const auto& r : runs) std::printf(" %12s", get(r.result).c_str());
    std::printf("\n");
  };
  const auto fmt = [](const char* f, double v) {
    char buf[64];
    std::snprintf(buf, sizeof buf, f, v);
    return std::string(buf);
  };
  if (m == metric::accuracy) {
    row("test accuracy",
        [&](const train_result& r) { return fmt("%.2f%%", 100.0 * r.test_accuracy); });
  } else {
    row("val loss (nats/byte)", [&](const train_result& r) { return fmt("%.4f", r.val_loss); });
    row("val bits per byte", [&](const train_result& r) { return fmt("%.4f", r.val_bpb); });
  }
  row("weights pruned", [&](const train_result& r) { return fmt("%.1f%%", 100.0 * r.sparsity); });
  row("bytes sent per step",
      [&](const train_result& r) { return std::to_string(r.bytes_per_step); });
  row("mean bytes per step",
      [&](const train_result& r) { return fmt("%.0f", r.mean_bytes_per_step); });
  row("step time (ms)", [&](const train_result& r) { return fmt("%.2f", 1e3 * r.step_seconds); });
  row("sync time (ms/step)",
      [&](const train_result& r) { return fmt("%.2f", 1e3 * r.sync_seconds); });
  row("run time (s)", [&](const train_result& r) { return fmt("%.1f", r.total_seconds); });
  for (const auto& r : runs) {
    if (dense == nullptr || r.name == "dense") continue;
    if (m == metric::accuracy) {
      std::printf("accuracy gap %.2f points (dense - %s)",
                  100.0 * (dense->test_accuracy - r.result.test_accuracy), r.name.c_str());
    } else {
      std::printf("bits per byte %+.2f%% (%s against dense)",
                  100.0 * (r.result.val_bpb / dense->val_bpb - 1.0), r.name.c_str());
    }
    std::printf("; %s sends %.1f%% of the dense bytes\n", r.name.c_str(),
                100.0 * static_cast<double>(r.result.bytes_per_step) /
                    static_cast<double>(dense->bytes_per_step));
  }
  std::printf("total wall time %.1f s; weights bit-identical on all ranks: %s\n", wall,
              agree ? "yes" : "NO");
}

inline std::string run_json(const train_result& r, const char* indent, metric m) {
  std::ostringstream o;
  const std::string in = indent;
  o << "{\n";
  if (m == metric::accuracy) {
    o << in << "  \"test_accuracy\": " << num(r.test_accuracy) << ",\n";
  } else {
    o << in << "  \"val_loss\": " << num(r.val_loss) << ",\n";
    o << in << "  \"val_bits_per_byte\": " << num(r.val_bpb) << ",\n";
  }
  o << in << "  \"sparsity\": " << num(r.sparsity) << ",\n";
  o << in << "  \"kept_weights\": " << r.kept_weights << ",\n";
  o << in << "  \"prunable_weights\": " << r.prunable_weights << ",\n";
  o << in << "  \"bytes_per_step\": " << r.bytes_per_step << ",\n";
  o << in << "  \"dense_bytes_per_step\": " << r.dense_bytes_per_step << ",\n";
  o << in << "  \"mean_bytes_per_step\": " << num(r.mean_bytes_per_step) << ",\n";
  o << in << "  \"step_seconds\": " << num(r.step_seconds) << ",\n";
  o << in << "  \"sync_seconds_per_step\": " << num(r.sync_seconds) << ",\n";
  o << in << "  \"sync_share\": " << num(r.sync_seconds / r.step_seconds) << ",\n";
  o << in << "  \"prune_seconds_per_step\": " << num(r.prune_seconds) << ",\n";
  o << in << "  \"steps\": " << r.steps << ",\n";
  o << in << "  \"mask_updates\": " << r.mask_updates << ",\n";
  o << in << "  \"train_seconds\": " << num(r.train_seconds) << ",\n";
  o << in << "  \"total_seconds\": " << num(r.total_seconds) << ",\n";
  o << in << "  \"weights_agree_across_ranks\": " << (r.weights_agree ? "true" : "false") << ",\n";
  o << in << "  \"tensors\": [";
  for (std::size_t i = 0; i < r.layout.tensor_count(); ++i) {
    const auto& t = r.layout.tensor(i);
    o << (i ? ", " : "") << "{\"name\": \"" << t.name << "\", \"size\": " << t.size
      << ", \"kept\": " << r.masks[i].count() << "}";
  }
  o << "],\n";
  o << in << "  \"history\": [\n";
  for (std::size_t i = 0; i < r.history.size(); ++i) {
    const auto& h = r.history[i];
    o << in << "    {\"epoch\": " << h.epoch << ", \"train_loss\": " << num(h.train_loss);
    if (m == metric::accuracy) {
      o << ", \"test_accuracy\": " << num(h.test_accuracy);
    } else {
      o << ", \"val_loss\": " << num(h.val_loss) << ", \"val_bits_per_byte\": " << num(h.val_bpb);
    }
    o << ", \"sparsity\": " << num(h.sparsity) << ", \"bytes_per_step\": " << h.bytes_per_step
      << ", \"step_seconds\": " << num(h.step_seconds)
      << ", \"sync_seconds_per_step\": " << num(h.sync_seconds) << "}"
      << (i + 1 < r.history.size() ? "," : "") << "\n";
  }
  o << in << "  ]\n" << in << "}";
  return o.str();
}

/// What a summary says about the trainer: `model` and `config` are JSON objects written as
/// they are.
struct summary_header {
  int ranks = 1;
  int epochs = 0;
  std::uint64_t seed = 0;
  std::string model;
  std::string config;
  metric quality = metric::accuracy;
};

/// Writes the JSON summary to `path` (creating its folder): the header, one section per run,
/// the gaps to the dense run (accuracy_gap_points, or bits_per_byte_ratio for a language model,
/// and bytes_ratio for sparse; ternary_* for ternary) and the wall time. Accuracies are
/// fractions in [0, 1]; values that are not finite are written as null. Throws pactrain::error if
/// the file cannot be written.
inline void write_summary(const std::string& path, const summary_header& h,
                          const std::vector<named_run>& runs, double wall) {
  std::ostringstream j;
  j << "{\n";
  j << "  \"pactrain_version\": \"" << pactrain::version_string() << "\",\n";
  j << "  \"ranks\": " << h.ranks << ",\n";
  j << "  \"epochs\": " << h.epochs << ",\n";
  j << "  \"seed\": " << h.seed << ",\n";
  if (h.quality == metric::accuracy) j << "  \"accuracy_unit\": \"fraction\",\n";
  j << "  \"model\": " << h.model << ",\n";
  j << "  \"config\": " << h.config << ",\n";
  for (const auto& r : runs)
    j << "  \"" << r.name << "\": " << run_json(r.result, "  ", h.quality) << ",\n";
  const auto* dense = find_run(runs, "dense");
  for (const char* name : {"sparse", "ternary"}) {
    const auto* r = find_run(runs, name);
    if (dense == nullptr || r == nullptr) continue;
    const std::string prefix = std::string(name) == "sparse" ? "" : "ternary_";
    if (h.quality == metric::accuracy) {
      j << "  \"" << prefix
        << "accuracy_gap_points\": " << num(100.0 * (dense->test_accuracy - r->test_accuracy))
        << ",\n";
    } else {
      j << "  \"" << prefix << "bits_per_byte_ratio\": " << num(r->val_bpb / dense->val_bpb)
        << ",\n";
    }
    j << "  \"" << prefix << "bytes_ratio\": "
      << num(static_cast<double>(r->bytes_per_step) / static_cast<double>(dense->bytes_per_step))
      << ",\n";
  }
  j << "  \"wall_seconds\": " << num(wall) << "\n}\n";

  const std::filesystem::path p(path);
  std::error_code ec;
  if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path(), ec);
  if (ec) throw pactrain::error("cannot write the summary to " + path + ": " + ec.message());
  std::ofstream f(p);
  f << j.str();
  if (!f) throw pactrain::error("cannot write the summary to " + path);
}

}  // namespace examples
