// The adaptive planner: per bucket, the strategy a cost model (cost_model.hpp) predicts to
// be fastest. Deterministic in its inputs, so ranks with the same model choose the same.
//
//   auto model = pactrain::calibrate(comm);                  // collective: timed collectives
//   (or calibrate_link once, then calibrate_local per engine, to compare engines on one link)
//   auto choice = pactrain::choose_strategies(model, comm.size(), pactrain::bucket_shapes(sync));
//   sync.set_strategies(choice.strategies);                  // collective, checked across ranks
//
// For an engine with a codec (ternary, fp16) the coded paths are candidates too, and a bucket
// may stay plain (sparse_plain, dense_plain) where encoding does not pay.
#pragma once

#include <pactrain/codec.hpp>
#include <pactrain/concepts.hpp>
#include <pactrain/cost_model.hpp>
#include <pactrain/error.hpp>
#include <pactrain/strategy.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <initializer_list>
#include <limits>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace pactrain {

struct choice_options {
  /// A bucket leaves the plain dense path only when predicted at least this fraction faster,
  /// so that model error cannot make a step slower than dense where the gain is marginal.
  double margin = 0.05;
  /// Buckets of fewer entries stay dense (small tensors: latency-bound either way).
  std::size_t min_sparse_entries = 4096;
};

struct strategy_choice {
  std::vector<bucket_strategy> strategies;   // one per bucket
  std::vector<bucket_costs> costs;           // the predictions behind them
  double predicted_seconds = 0;              // of the chosen strategies, all buckets
  double predicted_dense_plain_seconds = 0;  // if every bucket went dense
  bool scale_round = false;                  // the step pays one scale round (in predicted_seconds)
};

namespace detail {

inline void check_shape(const bucket_shape& s, const char* op) {
  PACTRAIN_EXPECTS(s.kept <= s.entries, std::string(op) + ": a bucket keeps more entries (" +
                                            std::to_string(s.kept) + ") than it has (" +
                                            std::to_string(s.entries) + ")");
  PACTRAIN_EXPECTS(s.value_bytes > 0, std::string(op) + ": value_bytes must be positive");
}

}  // namespace detail

inline strategy_choice predict_strategies(const cost_model& m, int ranks,
                                          std::span<const bucket_shape> b,
                                          std::vector<bucket_strategy> strategies);

/// Local and deterministic: per bucket the predicted fastest path where it beats plain dense by
/// opt.margin (else plain dense), and all plain where the scale round makes coding lose. Throws
/// pactrain::error for an invalid model, ranks < 1, a margin outside [0, 1) or a bad shape.
inline strategy_choice choose_strategies(const cost_model& m, int ranks,
                                         std::span<const bucket_shape> b, choice_options opt = {}) {
  m.validate();
  PACTRAIN_EXPECTS(ranks >= 1, "choose_strategies: ranks must be >= 1");
  PACTRAIN_EXPECTS(std::isfinite(opt.margin) && opt.margin >= 0 && opt.margin < 1,
                   "choose_strategies: margin must be in [0, 1)");
  // Per bucket: the fastest path, and the fastest without the codec; plain dense unless the
  // winner beats it by the margin.
  std::vector<bucket_strategy> chosen;
  std::vector<bucket_strategy> plain;
  chosen.reserve(b.size());
  plain.reserve(b.size());
  for (const auto& s : b) {
    detail::check_shape(s, "choose_strategies");
    const auto c = predict(m, ranks, s);
    const auto plain_dense = s.has_codec ? bucket_strategy::dense_plain : bucket_strategy::dense;
    const auto plain_sparse = s.has_codec ? bucket_strategy::sparse_plain : bucket_strategy::sparse;
    const auto choose = [&](std::initializer_list<std::pair<double, bucket_strategy>> options) {
      auto best = std::pair{c.dense_plain, plain_dense};
      for (const auto& k : options) {
        if (k.first < best.first) best = k;
      }
      if (s.entries < opt.min_sparse_entries || !(best.first <= (1 - opt.margin) * c.dense_plain)) {
        best = {c.dense_plain, plain_dense};
      }
      return best.second;
    };
    chosen.push_back(choose({{c.sparse_plain, plain_sparse},
                             {c.sparse_coded, bucket_strategy::sparse},
                             {c.dense_coded, bucket_strategy::dense}}));
    plain.push_back(choose({{c.sparse_plain, plain_sparse}}));
  }
  auto p = predict_strategies(m, ranks, b, std::move(chosen));
  // The scale round is one per step, shared by the coded buckets: coding must win with it.
  if (p.scale_round) {
    auto q = predict_strategies(m, ranks, b, std::move(plain));
    if (q.predicted_seconds <= p.predicted_seconds) p = std::move(q);
  }
  return p;
}

/// The predicted cost of strategy `s` for a bucket whose predictions are `c`.
inline double cost_of(const bucket_costs& c, const bucket_shape& b, bucket_strategy s) noexcept {
  if (!b.has_codec || is_plain(s)) return is_sparse(s) ? c.sparse_plain : c.dense_plain;
  return is_sparse(s) ? c.sparse_coded : c.dense_coded;
}

/// The prediction for a step under `strategies` (one per bucket): the buckets' costs, plus
/// the one scale round of a step in which a coded bucket needs one. For a bucket without a
/// codec, coded and plain strategies are the same path and cost the same.
inline strategy_choice predict_strategies(const cost_model& m, int ranks,
                                          std::span<const bucket_shape> b,
                                          std::vector<bucket_strategy> strategies) {
  m.validate();
  PACTRAIN_EXPECTS(strategies.size() == b.size(),
                   "predict_strategies: " + std::to_string(strategies.size()) + " strategies for " +
                       std::to_string(b.size()) + " buckets");
  strategy_choice p;
  std::size_t scaled = 0;
  for (std::size_t i = 0; i < b.size(); ++i) {
    detail::check_shape(b[i], "predict_strategies");
    const auto c = predict(m, ranks, b[i]);
    p.costs.push_back(c);
    p.predicted_seconds += cost_of(c, b[i], strategies[i]);
    p.predicted_dense_plain_seconds += c.dense_plain;
    scaled += b[i].has_codec && b[i].scale_round && !is_plain(strategies[i]);
  }
  p.scale_round = scaled != 0;
  if (p.scale_round) {
    p.predicted_seconds += predict_allreduce(m, ranks, scaled * sizeof(std::uint64_t));
  }
  p.strategies = std::move(strategies);
  return p;
}

struct candidate_options {
  choice_options choice = {};
  /// Choices predicted more than this factor slower than the best prediction are left out.
  /// The model ranks clear winners well but can be off by 2x where strategies are close,
  /// which is where timing them decides.
  double keep_within = 3.0;
};

/// Local and deterministic: choose_strategies' choice, then one uniform choice per strategy
/// (small buckets plain dense) by prediction, without duplicates or those above keep_within
/// times the best. Throws as choose_strategies does, and unless keep_within is finite and >= 1.
inline std::vector<strategy_choice> candidate_strategies(const cost_model& m, int ranks,
                                                         std::span<const bucket_shape> b,
                                                         candidate_options opt = {}) {
  PACTRAIN_EXPECTS(std::isfinite(opt.keep_within) && opt.keep_within >= 1,
                   "candidate_strategies: keep_within must be finite and >= 1");
  std::vector<strategy_choice> out{choose_strategies(m, ranks, b, opt.choice)};
  const bool codec = std::any_of(b.begin(), b.end(), [](const auto& s) { return s.has_codec; });
  // Without a codec the coded strategies are the plain paths, named sparse and dense.
  const auto all =
      codec ? std::vector<bucket_strategy>{bucket_strategy::sparse_plain, bucket_strategy::sparse,
                                           bucket_strategy::dense_plain, bucket_strategy::dense}
            : std::vector<bucket_strategy>{bucket_strategy::sparse, bucket_strategy::dense};
  const auto small_bucket = codec ? bucket_strategy::dense_plain : bucket_strategy::dense;
  std::vector<strategy_choice> uniform;
  for (const auto s : all) {
    std::vector<bucket_strategy> st;
    st.reserve(b.size());
    for (const auto& sh : b) {
      st.push_back(sh.entries < opt.choice.min_sparse_entries ? small_bucket : s);
    }
    uniform.push_back(predict_strategies(m, ranks, b, std::move(st)));
  }
  std::stable_sort(uniform.begin(), uniform.end(), [](const auto& x, const auto& y) {
    return x.predicted_seconds < y.predicted_seconds;
  });
  for (auto& u : uniform) {
    const bool seen = std::any_of(out.begin(), out.end(),
                                  [&](const auto& o) { return o.strategies == u.strategies; });
    if (!seen) out.push_back(std::move(u));
  }
  double best = std::numeric_limits<double>::infinity();
  for (const auto& o : out) best = std::min(best, o.predicted_seconds);
  out.erase(
      std::remove_if(out.begin() + 1, out.end(),
                     [&](const auto& o) { return o.predicted_seconds > opt.keep_within * best; }),
      out.end());
  return out;
}

/// The shapes of a sync engine's buckets under its current masks.
template <sync_engine Sync>
std::vector<bucket_shape> bucket_shapes(const Sync& s) {
  std::vector<bucket_shape> out;
  const auto& buckets = s.layout().buckets();
  out.reserve(buckets.size());
  constexpr bool has_codec = !codec_traits<typename Sync::codec_type>::is_identity;
  for (std::size_t i = 0; i < buckets.size(); ++i) {
    bucket_shape b{buckets[i].size, s.payload_size(i), sizeof(typename Sync::value_type)};
    if constexpr (has_codec) {
      b.has_codec = true;
      if constexpr (Sync::codec_type::uses_scale) {
        b.scale_round = !s.codec().scale_from_previous_step();
      }
      b.coded_sparse_bytes = s.wire_bytes(i, bucket_strategy::sparse);
      b.coded_dense_bytes = s.wire_bytes(i, bucket_strategy::dense);
    }
    out.push_back(b);
  }
  return out;
}

}  // namespace pactrain
