// The planner's cost model: alpha-beta for the link (latency per ring step, time per byte)
// plus each path's local work per entry, and its calibration. Calibration is collective: it
// times a few collectives and local passes on every rank and keeps the maximum over ranks,
// so every rank holds the same model. A model can also be given by hand.
#pragma once

#include <pactrain/codec.hpp>
#include <pactrain/communicator.hpp>
#include <pactrain/compactor.hpp>
#include <pactrain/detail/agreement.hpp>
#include <pactrain/digest.hpp>
#include <pactrain/error.hpp>
#include <pactrain/feedback.hpp>
#include <pactrain/mask.hpp>

#include <algorithm>
#include <bit>
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
  double dense_plain = 0;   // dense, values as they are (no codec)
  double sparse_plain = 0;  // sparse, values as they are (no codec)
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
  c.dense_plain =
      predict_allreduce(m, ranks, b.entries * b.value_bytes) + n * m.dense_seconds_per_entry;
  c.sparse_plain =
      predict_allreduce(m, ranks, b.kept * b.value_bytes) + n * m.compact_seconds_per_entry;
  if (b.has_codec) {
    c.sparse_coded = predict_allreduce(m, ranks, b.coded_sparse_bytes) +
                     n * m.compact_seconds_per_entry +
                     static_cast<double>(b.kept) * m.codec_seconds_per_entry;
    c.dense_coded = predict_allreduce(m, ranks, b.coded_dense_bytes) +
                    n * (m.dense_seconds_per_entry + m.codec_seconds_per_entry);
  }
  return c;
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

/// Collective: `check` (local validation) on every rank, then one agreement round over every
/// rank's verdict and `settings` (a digest), so that a bad or differing option throws the same
/// pactrain::error on every rank before any timed collective could mismatch.
template <communicator Comm, class Check>
void agree_calibration(Comm& comm, std::uint64_t settings, const char* op, Check&& check) {
  agreement_input in;
  in.operation = op;
  in.config_name = "calibration options";
  in.config_digest = settings;
  try {
    check();
  } catch (const std::exception& e) {  // never leave the peers waiting
    in.local_error = e.what();
  }
  agree(comm, in);
}

inline digest_builder calibration_digest(const calibration_options& opt) {
  digest_builder d(0x63616c69);  // "cali"
  d.add(static_cast<std::uint64_t>(opt.small_bytes))
      .add(static_cast<std::uint64_t>(opt.large_bytes));
  d.add(static_cast<std::uint64_t>(opt.compact_entries));
  d.add(std::bit_cast<std::uint64_t>(opt.compact_density));
  d.add(static_cast<std::uint64_t>(static_cast<std::int64_t>(opt.repetitions)));
  return d;
}

}  // namespace detail

/// Collective: alpha and beta from timed allreduces of small_bytes and large_bytes, the maximum
/// over ranks; throws pactrain::error on every rank for options invalid or different on any.
/// Measure once and reuse it to compare engines: two calibrations of a noisy link differ more than
/// the engines may.
template <communicator Comm>
link_model calibrate_link(Comm& comm, calibration_options opt = {}) {
  detail::agree_calibration(comm, detail::calibration_digest(opt).value(), "calibrate_link",
                            [&] { detail::check_calibration_options(opt); });
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

/// Collective: a cost model over `link`, timing compaction, dense scaling and (unless the codec
/// is the identity) the codec with error feedback per entry, the maximum over ranks. Throws
/// pactrain::error on every rank for options, links or codec settings that are invalid (a link
/// not finite and >= 0) or differ on any rank.
template <communicator Comm, class Compactor = host_compactor, class Codec = identity_codec<float>>
cost_model calibrate_local(Comm& comm, const link_model& link, calibration_options opt = {},
                           const Compactor& compactor = {}, const Codec& codec = {}) {
  auto settings = detail::calibration_digest(opt);
  settings.add(std::bit_cast<std::uint64_t>(link.latency));
  settings.add(std::bit_cast<std::uint64_t>(link.seconds_per_byte));
  if constexpr (requires { codec.digest(); }) settings.add(codec.digest());
  detail::agree_calibration(comm, settings.value(), "calibrate_local", [&] {
    detail::check_calibration_options(opt);
    PACTRAIN_EXPECTS(std::isfinite(link.latency) && link.latency >= 0 &&
                         std::isfinite(link.seconds_per_byte) && link.seconds_per_byte >= 0,
                     "calibrate_local: the link model must be finite and >= 0");
  });
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
