// What bench/e2e's programs (pactrain_e2e: the Fashion-MNIST MLP; pactrain_e2e_torch: the LibTorch
// CNN and language model) share: the gradient exchange a method's name asks for, Top-k's k, the
// steady state of a run and the JSON point bench/e2e/report.py reads. The exchanges themselves
// (bench/baselines/baselines.hpp) are built in exchanges.cpp, so the programs do not compile them.
#pragma once

#include "common/cli.hpp"
#include "common/exchange.hpp"
#include "common/run_report.hpp"
#include "fmnist/idx.hpp"

#include <pactrain/error.hpp>
#include <pactrain/layout.hpp>
#include <pactrain/mpi_algorithms.hpp>
#include <pactrain/pruning/pruner.hpp>

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

namespace e2e {

/// The options both programs read besides their trainer's.
struct run_options {
  std::string method = "sparse";
  std::string powersgd_rank = "4";  // a rank, or match
  double powersgd_start = 0;        // PowerSGD's dense start: a fraction of the run's steps
  double dgc_sparsity = 0.999;      // DGC's final sparsity
  double dgc_warmup_epochs = 4;     // DGC's sparsity warm-up, at most a quarter of the run
  std::size_t train_limit = 0;      // 0: all
  std::size_t test_limit = 0;
  std::string data = pactrain::fmnist::default_data_dir;
  std::string link = "none";  // the testbed's rate, recorded in the point
  std::uint64_t link_bits = 0;
  std::string machine;  // recorded in the point: what ran it (bench/e2e/run.sh's line)
  std::string label;    // the method's name in the point (run.sh's); empty: method_label's
  std::string out;      // the JSON point
};

/// Reads option `a` with value `v` into `o`; false if `a` is not one of run_options'.
inline bool parse_run_option(const std::string& a, const std::string& v, run_options& o) {
  if (a == "--method") {
    o.method = v;
  } else if (a == "--powersgd-rank") {
    if (v != "match") static_cast<void>(examples::to_count(a, v));
    o.powersgd_rank = v;
  } else if (a == "--powersgd-start") {
    o.powersgd_start = examples::to_double(a, v);
    if (!(o.powersgd_start >= 0.0 && o.powersgd_start < 1.0))
      throw pactrain::error("--powersgd-start must be in [0, 1)");
  } else if (a == "--dgc-sparsity") {
    o.dgc_sparsity = examples::to_double(a, v);
    if (!(o.dgc_sparsity > 0.0 && o.dgc_sparsity < 1.0))
      throw pactrain::error("--dgc-sparsity must be in (0, 1)");
  } else if (a == "--dgc-warmup-epochs") {
    o.dgc_warmup_epochs = examples::to_double(a, v);
    if (!(o.dgc_warmup_epochs >= 0.0)) throw pactrain::error("--dgc-warmup-epochs must be >= 0");
  } else if (a == "--train-limit") {
    o.train_limit = examples::to_count(a, v);
  } else if (a == "--test-limit") {
    o.test_limit = examples::to_count(a, v);
  } else if (a == "--data") {
    o.data = v;
  } else if (a == "--link") {
    o.link = v;
  } else if (a == "--link-bits") {
    o.link_bits = examples::to_count(a, v);
  } else if (a == "--machine") {
    o.machine = v;
  } else if (a == "--label") {
    o.label = v;
  } else if (a == "--out") {
    o.out = v;
  } else {
    return false;
  }
  return true;
}

/// Throws pactrain::error (with `usage`) unless o.method is one of `methods` (space-separated).
inline void check_method(const run_options& o, const std::string& methods,
                         const std::string& usage) {
  if ((" " + methods + " ").find(" " + o.method + " ") == std::string::npos)
    throw pactrain::error("--method: unknown method '" + o.method + "'\n" + usage);
}

/// The methods every trainer runs: pactrain's through its sync engine, the baselines through
/// a gradient exchange.
inline bool is_pactrain_method(const std::string& m) {
  return m == "sparse" || m == "ternary" || m == "auto";
}

/// A method's name in the points and the report: --label where given; else PowerSGD's
/// carries its rank (powersgd4) or M where it matches the sparse run's bytes.
inline std::string method_label(const run_options& o) {
  if (!o.label.empty()) return o.label;
  if (o.method != "powersgd") return o.method;
  return o.method + (o.powersgd_rank == "match" ? "M" : o.powersgd_rank);
}

/// Entries the pruned runs keep at the end: the prunable tensors' unpruned share (one global
/// ranking), and every other tensor whole. Top-k's k.
inline std::size_t kept_entries(const pactrain::param_layout& l, const std::vector<bool>& prunable,
                                double sparsity) {
  PACTRAIN_EXPECTS(prunable.size() == l.tensor_count(),
                   "kept_entries: one prunable flag per tensor needed");
  std::size_t pruned_over = 0;
  std::size_t whole = 0;
  for (std::size_t i = 0; i < l.tensor_count(); ++i)
    (prunable[i] ? pruned_over : whole) += l.tensor(i).size;
  return pruned_over - pactrain::pruned_count(pruned_over, sparsity) + whole;
}

/// What a baseline needs to know of the run besides its options (make_exchange).
struct exchange_run {
  std::size_t k = 0;      // entries the pruned runs keep at the end: --powersgd-rank match
  float momentum = 0.0f;  // the trainer's, which DGC applies itself
  float weight_decay = 0.0f;
  std::uint64_t seed = 1;
  std::uint64_t steps_per_epoch = 0;
  std::uint64_t steps = 0;  // of the whole run
};

/// What o.method asks for: dense, fp16, topk (DGC: o.dgc_sparsity after a warm-up of
/// o.dgc_warmup_epochs, at most a quarter of the run) or powersgd (rank o.powersgd_rank, or
/// "match": the rank whose bytes come nearest k floats; dense for the first o.powersgd_start
/// of the steps). Prints DGC's schedule or PowerSGD's rank on rank 0.
std::unique_ptr<examples::gradient_exchange> make_exchange(
    const run_options& o, MPI_Comm comm, const pactrain::param_layout& layout,
    const exchange_run& run);  // exchanges.cpp, compiled once with the baselines

/// The first epoch (from 1) that starts at or after step `last_update`: the steady state of a
/// pruned run, whose masks no longer change; the last epoch if none does.
inline std::size_t steady_epoch(std::uint64_t last_update, std::size_t steps_per_epoch,
                                int epochs) {
  for (std::size_t e = 1; e <= static_cast<std::size_t>(epochs); ++e)
    if ((e - 1) * steps_per_epoch >= last_update) return e;
  return static_cast<std::size_t>(epochs);
}

/// What a point records besides the run's result.
struct point_meta {
  std::string trainer;  // fmnist_mlp, fmnist_cnn, fortunes_lm
  std::string link;     // the testbed's rate, by name
  std::uint64_t link_bits = 0;
  std::string machine;  // empty: not recorded
  std::string method;   // powersgd with its rank: powersgd4, powersgdM
  int epochs = 0;
  std::uint64_t seed = 0;
  double lr_rewind = 0;  // the pruned runs' second learning-rate cycle (0: none)
  std::uint64_t evals_per_epoch = 1;
  std::size_t global_batch = 0;  // samples (language model: windows) per step over all ranks
  // Throughput's unit per step over all ranks: global_batch samples, or the language model's
  // predicted bytes (tokens).
  std::size_t units_per_step = 0;  // 0: global_batch
  const char* unit = "samples";
  examples::metric quality = examples::metric::accuracy;
};

/// `s` as a JSON string, quotes included.
inline std::string json_string(const std::string& s) {
  std::string q = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') {
      q += '\\';
      q += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char u[8];
      std::snprintf(u, sizeof u, "\\u%04x", static_cast<unsigned>(c));
      q += u;
    } else {
      q += c;
    }
  }
  return q + '"';
}

/// The JSON point of a run; `steady` from steady_epoch. Records which allreduce algorithms the
/// MPI library runs (pactrain::mpi_allreduce_algorithms: local, after MPI_Init).
inline std::string point_json(const point_meta& m, const examples::train_result& r, int ranks,
                              std::size_t steady) {
  using examples::num;
  const bool accuracy = m.quality == examples::metric::accuracy;
  double steady_seconds = 0;
  for (std::size_t e = steady; e <= r.history.size(); ++e)
    steady_seconds += r.history[e - 1].epoch_seconds;
  const double steady_step =
      steady_seconds / static_cast<double>((r.history.size() - steady + 1) * r.steps_per_epoch);
  std::ostringstream j;
  j << "{\"trainer\": \"" << m.trainer << "\", \"link\": \"" << m.link
    << "\", \"link_bits\": " << m.link_bits
    << (m.machine.empty() ? "" : ", \"machine\": " + json_string(m.machine))
    << ", \"allreduce_algorithms\": "
    << json_string(pactrain::to_string(pactrain::mpi_allreduce_algorithms()))
    << ", \"ranks\": " << ranks << ", \"method\": \"" << m.method << "\", \"epochs\": " << m.epochs
    << ", \"seed\": " << m.seed << ", \"lr_rewind\": " << num(m.lr_rewind)
    << ", \"evals_per_epoch\": " << m.evals_per_epoch
    << ", \"steps_per_epoch\": " << r.steps_per_epoch << ", \"global_batch\": " << m.global_batch
    << ", \"samples_per_step\": " << (m.units_per_step ? m.units_per_step : m.global_batch)
    << ", \"unit\": \"" << m.unit << "\", \"metric\": \""
    << (accuracy ? "accuracy" : "bits_per_byte") << "\", "
    << (accuracy ? "\"final_accuracy\": " : "\"final_bits_per_byte\": ")
    << num(accuracy ? r.test_accuracy : r.val_bpb)
    << ", \"train_seconds\": " << num(r.train_seconds)
    << ", \"total_seconds\": " << num(r.total_seconds)
    << ", \"mean_bytes_per_step\": " << num(r.mean_bytes_per_step)
    << ", \"final_bytes_per_step\": " << r.bytes_per_step
    << ", \"dense_bytes_per_step\": " << r.dense_bytes_per_step
    << ", \"collectives_per_step\": " << r.collectives_per_step
    << ", \"prune_seconds_per_step\": " << num(r.prune_seconds)
    << ", \"steady_from_epoch\": " << steady << ", \"steady_step_seconds\": " << num(steady_step)
    << ", \"weights_agree\": " << (r.weights_agree ? "true" : "false") << ", \"history\": [";
  double wall = 0;
  for (std::size_t i = 0; i < r.history.size(); ++i) {
    const auto& e = r.history[i];
    wall += e.epoch_seconds;
    j << (i ? ", " : "") << "{\"epoch\": " << e.epoch << ", \"wall_seconds\": " << num(wall)
      << (accuracy ? ", \"test_accuracy\": " : ", \"val_bits_per_byte\": ")
      << num(accuracy ? e.test_accuracy : e.val_bpb) << ", \"train_loss\": " << num(e.train_loss)
      << ", \"step_seconds\": " << num(e.step_seconds)
      << ", \"bytes_per_step\": " << e.bytes_per_step << ", \"sparsity\": " << num(e.sparsity)
      << "}";
  }
  j << "], \"evals\": [";
  for (std::size_t i = 0; i < r.evals.size(); ++i) {
    const auto& e = r.evals[i];
    j << (i ? ", " : "") << "{\"step\": " << e.step << ", \"epoch\": " << num(e.epoch)
      << ", \"wall_seconds\": " << num(e.train_seconds)
      << (accuracy ? ", \"test_accuracy\": " : ", \"val_bits_per_byte\": ")
      << num(accuracy ? e.test_accuracy : e.val_bpb) << "}";
  }
  j << "]}\n";
  return j.str();
}

/// Writes `json` to `path` (on the calling rank); throws pactrain::error if it cannot.
inline void write_point(const std::string& path, const std::string& json) {
  std::ofstream f(path);
  f << json;
  if (!f) throw pactrain::error("cannot write " + path);
  std::printf("point: %s\n", path.c_str());
}

}  // namespace e2e
