// The engine methods: pactrain::sync over a random mask of the run's density, with the identity
// codec (sparse), fp16 on the kept entries (sparse-fp16) or ternary lanes with error feedback
// (sparse-ternary). auto (auto.cpp) plans and tunes two of these.
#pragma once

#include "harness.hpp"

#include <map>
#include <type_traits>

namespace sync_bench {

inline std::vector<pactrain::bitmap_mask> bench_masks(const pactrain::param_layout& l,
                                                      const options& o) {
  std::vector<float> w(l.total_size(), 0.0f);  // random_pruning looks only at the layout
  return pactrain::random_pruning{.seed = o.seed}.compute(
      l, std::span<const float>(w), 1.0 - o.density, std::vector<bool>(l.tensor_count(), true));
}

/// "codec strategy:count ...", e.g. "ternary dense_plain:1 sparse:24".
inline std::string plan_text(std::string codec, const std::vector<pactrain::bucket_strategy>& s) {
  std::map<std::string, std::size_t> count;
  for (auto st : s) ++count[pactrain::to_string(st)];
  for (const auto& [name, n] : count) codec += " " + name + ":" + std::to_string(n);
  return codec;
}

/// pactrain::sync over a random mask of the density: plain compaction (identity codec), or a
/// codec on the kept entries (sparse-fp16, sparse-ternary with error feedback); auto plans
/// and tunes its methods (see make_auto).
template <class Codec>
class engine_method final : public method {
  using base = pactrain::base_codec_t<Codec>;

 public:
  engine_method(MPI_Comm comm, const options& o, std::size_t n, Codec codec = {},
                  pactrain::sync_options opt = {})
      : sync_(pactrain::mpi_communicator{comm}, make_layout(n, o.tensor), std::move(codec), opt) {
    sync_.set_masks(bench_masks(sync_.layout(), o));
  }
  /// Collective: the plans worth timing, from a cost model of the local work calibrated over
  /// `link`.
  std::vector<pactrain::strategy_choice> candidates(const options& o,
                                                    const pactrain::link_model& link) {
    const auto model = pactrain::calibrate_local(sync_.get_communicator(), link, calibration(o),
                                                 sync_.compactor(), sync_.codec());
    return pactrain::candidate_strategies(model, sync_.get_communicator().size(),
                                          pactrain::bucket_shapes(sync_));
  }
  /// Collective: puts a plan in force.
  void use(const pactrain::strategy_choice& p) {
    if (sync_.strategies() != p.strategies) sync_.set_strategies(p.strategies);
    predicted_ = p.predicted_seconds;
  }
  /// Planned: the planner's predicted seconds per sync (the same on every rank).
  [[nodiscard]] double predicted_seconds() const override { return predicted_; }
  double sync(std::span<float> g) override {
    sync_.allreduce(std::span<float>(g));
    return sync_.stats().gather_seconds + sync_.stats().scatter_seconds;
  }
  [[nodiscard]] std::size_t bytes_sent() const override { return sync_.stats().bytes_sent; }
  [[nodiscard]] std::string plan() const override {
    return plan_text(codec_name(), sync_.strategies());
  }
  std::vector<float> reference(const options& o, int ranks) override {
    auto avg = dense_average(o, sync_.layout().total_size(), ranks);
    pactrain::apply_masks(sync_.layout(), sync_.masks(), std::span<float>(avg));
    for (auto& v : avg) v += 0.0f;  // -0 -> +0, as the engine returns
    return avg;
  }
  // identity: exact. fp16/bf16: each value rounds once on encode and every partial sum once
  // more (|g| < 1). ternary: one draw of an unbiased estimate, within 2 scales (|g| < 1).
  [[nodiscard]] double tolerance(int ranks) const override {
    if constexpr (pactrain::codec_traits<Codec>::is_identity) {
      return 0.0;
    } else if constexpr (std::is_same_v<base, pactrain::ternary_codec>) {
      return 2.0;
    } else {
      return ranks * 0x1p-7;
    }
  }

 private:
  pactrain::sync<pactrain::mpi_communicator, Codec> sync_;
  double predicted_ = -1.0;

  static std::string codec_name() {
    if constexpr (pactrain::codec_traits<Codec>::is_identity) {
      return "identity";
    } else if constexpr (std::is_same_v<base, pactrain::ternary_codec>) {
      return "ternary";
    } else if constexpr (std::is_same_v<base, pactrain::fp16_codec>) {
      return "fp16";
    } else {
      return "codec";
    }
  }
};

}  // namespace sync_bench
