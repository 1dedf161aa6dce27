// The trainer's command-line options (train_config), shared by pactrain_fmnist and
// bench/e2e's pactrain_e2e, so that both read them alike.
#pragma once

#include "common/cli.hpp"
#include "fmnist/trainer.hpp"

#include <pactrain/error.hpp>

#include <string>

namespace pactrain::fmnist {

/// Reads option `a` with value `v` into `cfg`; false if `a` is not a train_config option.
/// Throws pactrain::error for a bad value.
inline bool parse_train_option(const std::string& a, const std::string& v, train_config& cfg) {
  using ::examples::to_count;
  using ::examples::to_double;
  if (a == "--epochs") {
    cfg.epochs = static_cast<int>(to_count(a, v));
  } else if (a == "--batch") {
    cfg.batch = to_count(a, v);
  } else if (a == "--lr") {
    cfg.lr = static_cast<float>(to_double(a, v));
  } else if (a == "--lr-hold") {
    cfg.lr_hold = to_double(a, v);
  } else if (a == "--lr-warmup") {
    cfg.lr_warmup = to_double(a, v);
  } else if (a == "--lr-rewind") {
    cfg.lr_rewind = to_double(a, v);
  } else if (a == "--momentum") {
    cfg.momentum = static_cast<float>(to_double(a, v));
  } else if (a == "--weight-decay") {
    cfg.weight_decay = static_cast<float>(to_double(a, v));
  } else if (a == "--prune-window") {
    const auto p = ::examples::split(v, ',');
    if (p.size() != 2) throw pactrain::error("--prune-window: expected A,B, got '" + v + "'");
    cfg.prune_start = to_double(a, p[0]);
    cfg.prune_end = to_double(a, p[1]);
  } else if (a == "--prune-updates") {
    cfg.prune_updates = to_count(a, v);
  } else if (a == "--scope") {
    cfg.scope = ::examples::scope_option(a, v);
  } else if (a == "--hidden") {
    cfg.hidden.clear();
    for (const auto& h : ::examples::split(v, ',')) cfg.hidden.push_back(to_count(a, h));
  } else if (a == "--seed") {
    cfg.seed = to_count(a, v);
  } else if (a == "--ternary-rows") {
    cfg.ternary_rows = to_count(a, v);
  } else if (a == "--ternary-block") {
    cfg.ternary_block = to_count(a, v);
  } else if (a == "--ternary-scale") {
    cfg.ternary_scale = ::examples::scale_source_option(a, v);
  } else if (a == "--overlap") {
    cfg.overlap = ::examples::on_off(a, v);
  } else if (a == "--optimizer") {
    cfg.optimizer = optimizer_from_string(v);
  } else if (a == "--evals-per-epoch") {
    cfg.evals_per_epoch = to_count(a, v);
  } else {
    return false;
  }
  return true;
}

}  // namespace pactrain::fmnist
