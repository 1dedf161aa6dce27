// The adaptive planner: per bucket, the strategy a cost model predicts to be fastest.
//
//   auto model = pactrain::calibrate(comm);                  // collective: timed collectives
//   (or calibrate_link once, then calibrate_local per engine, to compare engines on one link)
//   auto plan = pactrain::plan_buckets(model, comm.size(), pactrain::bucket_shapes(sync));
//   sync.set_strategies(plan.strategies);                    // collective, checked across ranks
//
// The model is alpha-beta (latency per ring step, time per byte on the link) plus the local
// work of each path per entry. For an engine with a codec (ternary, fp16) the planner also
// weighs the coded paths: fewer bytes on the link against encoding and decoding per entry,
// and may leave a bucket plain (sparse_plain, dense_plain) where encoding does not pay. Calibration
// times a few collectives and compaction on every rank and takes the maximum over ranks, so every
// rank holds the same model and makes the same choices; a model can also be given by hand.
#pragma once

#include <pactrain/communicator.hpp>
#include <pactrain/compactor.hpp>
#include <pactrain/error.hpp>
#include <pactrain/mask.hpp>
#include <pactrain/sync.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace pactrain {

/// Seconds the planner predicts with. All fields must be finite and >= 0.
struct cost_model {
  double latency = 0;                    // alpha: one ring step of a collective
  double seconds_per_byte = 0;           // beta: one byte crossing a rank's link
  double compact_seconds_per_entry = 0;  // gather + scatter, per entry of a sparse bucket
  double dense_seconds_per_entry = 0;    // masking and scaling, per entry of a dense bucket
  double codec_seconds_per_entry = 0;    // encode, decode and feedback, per codec input entry

  void validate() const {
    for (double v : {latency, seconds_per_byte, compact_seconds_per_entry, dense_seconds_per_entry,
                     codec_seconds_per_entry}) {
      PACTRAIN_EXPECTS(std::isfinite(v) && v >= 0,
                       "cost_model: every cost must be finite and >= 0");
    }
  }
};

/// What the planner needs to know of one bucket.
struct bucket_shape {
  std::size_t entries = 0;      // dense entries
  std::size_t kept = 0;         // entries the masks keep (<= entries)
  std::size_t value_bytes = 4;  // bytes per entry of a plain payload
  /// The engine has a codec (not the identity): the coded strategies are candidates, with
  /// these wire bytes for the kept entries and for the whole bucket.
  bool has_codec = false;
  std::size_t coded_sparse_bytes = 0;
  std::size_t coded_dense_bytes = 0;
  /// The codec's scale is reduced before encoding (ternary with scale_source::current_max):
  /// a step with any coded bucket pays one small MAX allreduce more.
  bool scale_round = false;
};

/// Predicted seconds of one bucket under each strategy; the coded ones are infinite when
/// the engine has no codec.
struct bucket_costs {
  double dense = 0;   // dense_plain (dense with the identity codec)
  double sparse = 0;  // sparse_plain (sparse with the identity codec)
  double sparse_coded = std::numeric_limits<double>::infinity();  // sparse through the codec
  double dense_coded = std::numeric_limits<double>::infinity();   // dense through the codec
};

/// Ring allreduce of `bytes` on `ranks` ranks: 2(P-1) steps, 2(P-1)/P of the bytes per link.
inline double predict_allreduce(const cost_model& m, int ranks, std::size_t bytes) {
  if (ranks <= 1 || bytes == 0) return 0;
  const double p = ranks;
  return 2 * (p - 1) * m.latency +
         2 * (p - 1) / p * static_cast<double>(bytes) * m.seconds_per_byte;
}

inline bucket_costs predict(const cost_model& m, int ranks, const bucket_shape& b) {
  const double n = static_cast<double>(b.entries);
  bucket_costs c;
  c.dense = predict_allreduce(m, ranks, b.entries * b.value_bytes) + n * m.dense_seconds_per_entry;
  c.sparse = predict_allreduce(m, ranks, b.kept * b.value_bytes) + n * m.compact_seconds_per_entry;
  if (b.has_codec) {
    c.sparse_coded = predict_allreduce(m, ranks, b.coded_sparse_bytes) +
                     n * m.compact_seconds_per_entry +
                     static_cast<double>(b.kept) * m.codec_seconds_per_entry;
    c.dense_coded = predict_allreduce(m, ranks, b.coded_dense_bytes) +
                    n * (m.dense_seconds_per_entry + m.codec_seconds_per_entry);
  }
  return c;
}

struct plan_options {
  /// A bucket leaves the plain dense path only when predicted at least this fraction faster,
  /// so that model error cannot make a step slower than dense where the gain is marginal.
  double margin = 0.05;
  /// Buckets of fewer entries stay dense (small tensors: latency-bound either way).
  std::size_t min_sparse_entries = 4096;
};

struct bucket_plan {
  std::vector<bucket_strategy> strategies;  // one per bucket
  std::vector<bucket_costs> costs;          // the predictions behind them
  double predicted_seconds = 0;             // of the chosen strategies, all buckets
  double predicted_dense_seconds = 0;       // if every bucket went dense
  bool scale_round = false;                 // the step pays one scale round (in predicted_seconds)
};

namespace detail {

inline void check_shape(const bucket_shape& s, const char* op) {
  PACTRAIN_EXPECTS(s.kept <= s.entries, std::string(op) + ": a bucket keeps more entries (" +
                                            std::to_string(s.kept) + ") than it has (" +
                                            std::to_string(s.entries) + ")");
  PACTRAIN_EXPECTS(s.value_bytes > 0, std::string(op) + ": value_bytes must be positive");
}

}  // namespace detail

inline bucket_plan predict_plan(const cost_model& m, int ranks, std::span<const bucket_shape> b,
                                std::vector<bucket_strategy> strategies);

/// Chooses each bucket's strategy: the predicted fastest of dense, sparse and, for an engine
/// with a codec, the coded sparse and dense paths, if it beats the plain dense path by the
/// margin; otherwise plain dense. For an engine with a codec the plain choices are
/// dense_plain and sparse_plain, the coded ones sparse and dense; without one, dense and
/// sparse. Deterministic in its inputs, so ranks holding the same model and shapes choose
/// the same.
inline bucket_plan plan_buckets(const cost_model& m, int ranks, std::span<const bucket_shape> b,
                                plan_options opt = {}) {
  m.validate();
  PACTRAIN_EXPECTS(ranks >= 1, "plan_buckets: ranks must be >= 1");
  PACTRAIN_EXPECTS(std::isfinite(opt.margin) && opt.margin >= 0 && opt.margin < 1,
                   "plan_buckets: margin must be in [0, 1)");
  // Per bucket: the fastest path, and the fastest without the codec; plain dense unless the
  // winner beats it by the margin.
  std::vector<bucket_strategy> chosen;
  std::vector<bucket_strategy> plain;
  chosen.reserve(b.size());
  plain.reserve(b.size());
  for (const auto& s : b) {
    detail::check_shape(s, "plan_buckets");
    const auto c = predict(m, ranks, s);
    const auto plain_dense = s.has_codec ? bucket_strategy::dense_plain : bucket_strategy::dense;
    const auto plain_sparse = s.has_codec ? bucket_strategy::sparse_plain : bucket_strategy::sparse;
    const auto choose = [&](std::initializer_list<std::pair<double, bucket_strategy>> options) {
      auto best = std::pair{c.dense, plain_dense};
      for (const auto& k : options) {
        if (k.first < best.first) best = k;
      }
      if (s.entries < opt.min_sparse_entries || !(best.first <= (1 - opt.margin) * c.dense)) {
        best = {c.dense, plain_dense};
      }
      return best.second;
    };
    chosen.push_back(choose({{c.sparse, plain_sparse},
                             {c.sparse_coded, bucket_strategy::sparse},
                             {c.dense_coded, bucket_strategy::dense}}));
    plain.push_back(choose({{c.sparse, plain_sparse}}));
  }
  auto p = predict_plan(m, ranks, b, std::move(chosen));
  // The scale round is one per step, shared by the coded buckets: coding must win with it.
  if (p.scale_round) {
    auto q = predict_plan(m, ranks, b, std::move(plain));
    if (q.predicted_seconds <= p.predicted_seconds) p = std::move(q);
  }
  return p;
}

/// The predicted cost of strategy `s` for a bucket whose predictions are `c`.
inline double cost_of(const bucket_costs& c, const bucket_shape& b, bucket_strategy s) noexcept {
  if (!b.has_codec || is_plain(s)) return is_sparse(s) ? c.sparse : c.dense;
  return is_sparse(s) ? c.sparse_coded : c.dense_coded;
}

/// The prediction for a step under `strategies` (one per bucket): the buckets' costs, plus
/// the one scale round of a step in which a coded bucket needs one. For a bucket without a
/// codec, coded and plain strategies are the same path and cost the same.
inline bucket_plan predict_plan(const cost_model& m, int ranks, std::span<const bucket_shape> b,
                                std::vector<bucket_strategy> strategies) {
  m.validate();
  PACTRAIN_EXPECTS(strategies.size() == b.size(),
                   "predict_plan: " + std::to_string(strategies.size()) + " strategies for " +
                       std::to_string(b.size()) + " buckets");
  bucket_plan p;
  std::size_t scaled = 0;
  for (std::size_t i = 0; i < b.size(); ++i) {
    detail::check_shape(b[i], "predict_plan");
    const auto c = predict(m, ranks, b[i]);
    p.costs.push_back(c);
    p.predicted_seconds += cost_of(c, b[i], strategies[i]);
    p.predicted_dense_seconds += c.dense;
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
  plan_options plan = {};
  /// Plans predicted more than this factor slower than the best prediction are left out.
  /// The model ranks clear winners well but can be off by 2x where strategies are close,
  /// which is where timing them decides.
  double keep_within = 3.0;
};

/// The plans worth timing (see step_tuner): plan_buckets' choice first (always kept), then
/// one plan per strategy the engine has, every bucket on it (buckets below
/// min_sparse_entries stay on the plain dense path), in order of prediction; duplicates and
/// plans predicted slower than keep_within times the best are left out. Deterministic in its
/// inputs, so every rank holding the same model gets the same list.
inline std::vector<bucket_plan> candidate_plans(const cost_model& m, int ranks,
                                                std::span<const bucket_shape> b,
                                                candidate_options opt = {}) {
  PACTRAIN_EXPECTS(std::isfinite(opt.keep_within) && opt.keep_within >= 1,
                   "candidate_plans: keep_within must be finite and >= 1");
  std::vector<bucket_plan> out{plan_buckets(m, ranks, b, opt.plan)};
  const bool codec = std::any_of(b.begin(), b.end(), [](const auto& s) { return s.has_codec; });
  // Without a codec the coded strategies are the plain paths, named sparse and dense.
  const auto all = codec ? std::vector<bucket_strategy>{bucket_strategy::sparse_plain,
                                                        bucket_strategy::sparse,
                                                        bucket_strategy::dense_plain,
                                                        bucket_strategy::dense}
                         : std::vector<bucket_strategy>{bucket_strategy::sparse,
                                                        bucket_strategy::dense};
  const auto small_bucket = codec ? bucket_strategy::dense_plain : bucket_strategy::dense;
  std::vector<bucket_plan> uniform;
  for (const auto s : all) {
    std::vector<bucket_strategy> st;
    st.reserve(b.size());
    for (const auto& sh : b) {
      st.push_back(sh.entries < opt.plan.min_sparse_entries ? small_bucket : s);
    }
    uniform.push_back(predict_plan(m, ranks, b, std::move(st)));
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
  out.erase(std::remove_if(out.begin() + 1, out.end(),
                           [&](const auto& o) { return o.predicted_seconds > opt.keep_within * best; }),
            out.end());
  return out;
}

/// The shapes of a sync engine's buckets under its current masks.
template <class Sync>
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

struct calibration_options {
  std::size_t small_bytes = 4096;      // latency point
  std::size_t large_bytes = 4u << 20;  // bandwidth point
  /// Entries of the compaction and codec timings. Local work is memory-bound once buffers
  /// leave the cache, so time it at the size of your buckets (the default is 16 MiB of float).
  std::size_t compact_entries = 4u << 20;
  double compact_density = 0.1;
  int repetitions = 5;  // median of this many, after one warm-up
};

/// The link half of a cost_model: alpha and beta.
struct link_model {
  double latency = 0;
  double seconds_per_byte = 0;
};

namespace detail {

template <class F>
double median_seconds(int reps, F&& f) {
  f();  // warm-up: first-touch pages, connections
  std::vector<double> t;
  t.reserve(static_cast<std::size_t>(reps));
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::nth_element(t.begin(), t.begin() + static_cast<std::ptrdiff_t>(t.size() / 2), t.end());
  return t[t.size() / 2];
}

inline void check_calibration_options(const calibration_options& opt) {
  PACTRAIN_EXPECTS(opt.small_bytes >= sizeof(float) && opt.large_bytes > opt.small_bytes,
                   "calibrate: need 4 <= small_bytes < large_bytes");
  PACTRAIN_EXPECTS(opt.repetitions >= 1 && opt.compact_entries > 0 && opt.compact_density > 0 &&
                       opt.compact_density <= 1,
                   "calibrate: need repetitions >= 1, compact_entries > 0 and a density in (0, 1]");
}

}  // namespace detail

/// Collective: times float allreduces of two sizes on `comm`, as the engine runs them (started
/// nonblocking, then waited for), and solves the alpha-beta pair from them; both are the
/// maximum over the ranks. Calibrate the link once and reuse it for every engine you compare:
/// two calibrations of a noisy link differ more than the engines may.
template <communicator Comm>
link_model calibrate_link(Comm& comm, calibration_options opt = {}) {
  detail::check_calibration_options(opt);
  std::vector<float> buf(opt.large_bytes / sizeof(float), 1.0f);
  auto time_allreduce = [&](std::size_t bytes) {
    auto s = std::span<float>(buf).first(bytes / sizeof(float));
    return detail::median_seconds(opt.repetitions,
                                  [&] { comm.allreduce_async(s, reduce_op::sum).wait(); });
  };
  double v[2] = {time_allreduce(opt.small_bytes), time_allreduce(opt.large_bytes)};
  comm.allreduce(std::span<double>(v), reduce_op::max);  // the same model on every rank
  link_model l;
  const int p = comm.size();
  if (p > 1) {
    // t = 2(P-1) alpha + 2(P-1)/P S beta at both sizes.
    const double steps = 2.0 * (p - 1);
    const double share = steps / p;
    const double s1 = static_cast<double>(opt.small_bytes);
    const double s2 = static_cast<double>(opt.large_bytes);
    l.seconds_per_byte = std::max(0.0, (v[1] - v[0]) / (share * (s2 - s1)));
    l.latency = std::max(0.0, (v[0] - share * s1 * l.seconds_per_byte) / steps);
  }
  return l;
}

/// Collective: a cost model over a measured `link`. Times `compactor`'s gather + scatter and
/// a dense scaling pass per entry and, for a codec other than the identity, what the engine
/// does per coded entry with error feedback (encode_with_feedback, decode), all over
/// compact_entries values; every value is the maximum over ranks.
template <communicator Comm, class Compactor = host_compactor, class Codec = identity_codec<float>>
cost_model calibrate_local(Comm& comm, const link_model& link, calibration_options opt = {},
                           const Compactor& compactor = {}, const Codec& codec = {}) {
  detail::check_calibration_options(opt);
  PACTRAIN_EXPECTS(std::isfinite(link.latency) && link.latency >= 0 &&
                       std::isfinite(link.seconds_per_byte) && link.seconds_per_byte >= 0,
                   "calibrate_local: the link model must be finite and >= 0");
  // Local work: gather + scatter at the given density, and the dense path's scaling pass.
  const std::size_t n = opt.compact_entries;
  const auto stride = static_cast<std::size_t>(std::max(1.0, std::round(1 / opt.compact_density)));
  const auto mask = bitmap_mask::from_predicate(n, [&](std::size_t i) { return i % stride == 0; });
  const auto plan = compactor.make_plan(mask);
  std::vector<float> dense(n, 0.5f), out(n), payload(plan.count());
  const double t_compact = detail::median_seconds(opt.repetitions, [&] {
    compactor.gather(plan, std::span<const float>(dense), std::span<float>(payload));
    compactor.scatter(plan, std::span<const float>(payload), std::span<float>(out), 0.25f);
  });
  const double t_scale = detail::median_seconds(opt.repetitions, [&] {
    for (std::size_t i = 0; i < n; ++i) out[i] = dense[i] * 0.25f;
  });
  double t_codec = 0;
  if constexpr (!codec_traits<Codec>::is_identity) {
    using value_type = typename Codec::value_type;
    using wire_type = typename Codec::wire_type;
    std::vector<value_type> in(n), back(n), residual(n, value_type(0));
    for (std::size_t i = 0; i < n; ++i) {
      in[i] = value_type(static_cast<float>(i % 7) * 0.125f - 0.375f);
    }
    std::vector<wire_type> wire(codec.wire_size(n, comm.size()));
    const codec_context ctx{.rank = comm.rank(), .size = comm.size(), .scale = 0.5f};
    t_codec = detail::median_seconds(opt.repetitions, [&] {
      encode_with_feedback(codec, std::span(in), std::span(wire), std::span(residual), ctx);
      codec.decode(std::span<const wire_type>(wire), std::span(back), ctx);
    });
  }

  double v[3] = {t_compact, t_scale, t_codec};
  comm.allreduce(std::span<double>(v), reduce_op::max);  // the same model on every rank

  cost_model m;
  m.latency = link.latency;
  m.seconds_per_byte = link.seconds_per_byte;
  m.compact_seconds_per_entry = v[0] / static_cast<double>(n);
  m.dense_seconds_per_entry = v[1] / static_cast<double>(n);
  m.codec_seconds_per_entry = v[2] / static_cast<double>(n);
  return m;
}

/// Collective: calibrate_link, then calibrate_local over it. About a second on a 1 Gbit/s
/// link with the default options.
template <communicator Comm, class Compactor = host_compactor, class Codec = identity_codec<float>>
cost_model calibrate(Comm& comm, calibration_options opt = {}, const Compactor& compactor = {},
                     const Codec& codec = {}) {
  return calibrate_local(comm, calibrate_link(comm, opt), opt, compactor, codec);
}

}  // namespace pactrain
