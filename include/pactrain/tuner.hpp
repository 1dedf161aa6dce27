// Measured choice among candidate configurations: time a few real steps of each, keep the
// fastest (as FFTW's measured plans, or cuDNN's benchmark mode).
//
//   auto model = pactrain::calibrate(comm, {}, sync.compactor(), sync.codec());
//   auto choices = pactrain::candidate_strategies(model, comm.size(),
//                                                 pactrain::bucket_shapes(sync));
//   pactrain::strategy_tuner tuner{choices};       // or a list of strategy vectors
//   for (each step) {
//     ... backward ...
//     tuner.allreduce(sync, grads);  // collective; the first choices.size() * trials steps time
//   }                                // the candidates in turn, then the fastest stays
//
// The cost model ranks strategies well where they differ by a wide margin, but not to a few
// percent: the overlap of local work and the network, and the cores ranks share, are beyond
// it. Where the predictions are close, timing decides. A timed step is the slowest rank's
// (one MAX allreduce of a double per step while tuning), so every rank keeps the same
// candidate.
#pragma once

#include <pactrain/communicator.hpp>
#include <pactrain/concepts.hpp>
#include <pactrain/error.hpp>
#include <pactrain/planner.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <limits>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace pactrain {

/// Chooses among `candidates` configurations by timing steps: they take turns, one step each
/// (0, 1, .., n-1, 0, 1, ..), until each has run `trials`; the lowest median wins (the first of
/// equals).
class step_tuner {
 public:
  /// Throws pactrain::error for no candidates or trials < 1.
  explicit step_tuner(std::size_t candidates, int trials = 3) : n_(candidates), trials_(trials) {
    PACTRAIN_EXPECTS(candidates >= 1, "step_tuner: need at least one candidate");
    PACTRAIN_EXPECTS(trials >= 1, "step_tuner: trials must be >= 1, not " + std::to_string(trials));
    times_.resize(n_);
  }

  [[nodiscard]] std::size_t candidates() const noexcept { return n_; }
  [[nodiscard]] int trials() const noexcept { return trials_; }
  /// True until every candidate has run its trials.
  [[nodiscard]] bool tuning() const noexcept {
    return step_ < n_ * static_cast<std::size_t>(trials_);
  }
  /// The candidate to run this step: while tuning the next in turn, then the fastest.
  [[nodiscard]] std::size_t current() const noexcept { return tuning() ? step_ % n_ : best_; }

  /// Collective while tuning (one MAX allreduce of a double), then a no-op: the step just run
  /// with current() took `seconds` here. A negative or non-finite time throws pactrain::error
  /// before communicating and changes nothing (the other ranks then wait: stop the job).
  template <communicator Comm>
  void record(Comm& comm, double seconds) {
    if (!tuning()) return;
    PACTRAIN_EXPECTS(
        std::isfinite(seconds) && seconds >= 0,
        "step_tuner::record: a step time must be finite and >= 0, not " + std::to_string(seconds));
    double t = seconds;
    comm.allreduce(std::span<double>(&t, 1), reduce_op::max);
    times_[current()].push_back(t);
    ++step_;
    if (!tuning()) {
      for (std::size_t c = 0; c < n_; ++c) {
        if (median(c) < median(best_)) best_ = c;
      }
    }
  }

  /// The kept candidate. Throws pactrain::error while tuning.
  [[nodiscard]] std::size_t best() const {
    PACTRAIN_EXPECTS(!tuning(),
                     "step_tuner::best: still tuning (" + std::to_string(step_) + " of " +
                         std::to_string(n_ * static_cast<std::size_t>(trials_)) + " steps timed)");
    return best_;
  }

  /// The median of candidate c's timed steps so far (slowest rank's seconds); infinity
  /// before its first.
  [[nodiscard]] double median(std::size_t c) const {
    PACTRAIN_EXPECTS(
        c < n_, "step_tuner::median: candidate " + std::to_string(c) + " of " + std::to_string(n_));
    auto t = times_[c];
    if (t.empty()) return std::numeric_limits<double>::infinity();
    const auto mid = t.begin() + static_cast<std::ptrdiff_t>(t.size() / 2);
    std::nth_element(t.begin(), mid, t.end());
    return *mid;
  }

 private:
  std::size_t n_;
  int trials_;
  std::size_t step_ = 0;
  std::size_t best_ = 0;
  std::vector<std::vector<double>> times_;
};

/// A step_tuner over strategy vectors (one per bucket). Switching calls sync::set_strategies,
/// outside the timed step, so error feedback's residuals live one step while tuning; once
/// tuning ends the fastest candidate stays in force.
class strategy_tuner {
 public:
  /// Throws pactrain::error for no candidates, trials < 1, or candidates of different
  /// lengths (the engine checks the length against its buckets when a candidate is applied).
  explicit strategy_tuner(std::vector<std::vector<bucket_strategy>> candidates, int trials = 3)
      : candidates_(std::move(candidates)), tuner_(candidates_.size(), trials) {
    for (const auto& c : candidates_) {
      PACTRAIN_EXPECTS(c.size() == candidates_.front().size(),
                       "strategy_tuner: candidates have " +
                           std::to_string(candidates_.front().size()) + " and " +
                           std::to_string(c.size()) + " strategies");
    }
  }
  /// The strategies of candidate_strategies' choices, in their order.
  explicit strategy_tuner(std::span<const strategy_choice> choices, int trials = 3)
      : strategy_tuner(strategies_of(choices), trials) {}

  /// Collective: applies this step's candidate (set_strategies, only where it differs) and
  /// starts the clock. Then run the step (sync.allreduce, or begin_step, submit_bucket and
  /// finish_step, timed with what the caller computes between them), then end_step.
  template <sync_engine Sync>
  void begin_step(Sync& sync) {
    const auto& want = candidates_[tuner_.current()];
    if (sync.strategies() != want) sync.set_strategies(want);
    start_ = std::chrono::steady_clock::now();
  }

  /// Collective while tuning: stops the clock and records the step.
  template <sync_engine Sync>
  void end_step(Sync& sync) {
    const double t =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    const bool was_tuning = tuner_.tuning();
    tuner_.record(sync.get_communicator(), t);
    // The winner goes into force now, so that it stays even for steps run without the tuner.
    if (was_tuning && !tuner_.tuning()) begin_step(sync);
  }

  /// begin_step, sync.allreduce(grads), end_step.
  template <sync_engine Sync>
  void allreduce(Sync& sync, std::span<typename Sync::value_type> grads) {
    begin_step(sync);
    sync.allreduce(grads);
    end_step(sync);
  }

  [[nodiscard]] const step_tuner& tuner() const noexcept { return tuner_; }
  [[nodiscard]] bool tuning() const noexcept { return tuner_.tuning(); }
  [[nodiscard]] const std::vector<std::vector<bucket_strategy>>& candidates() const noexcept {
    return candidates_;
  }
  /// The kept strategies. Throws pactrain::error while tuning.
  [[nodiscard]] const std::vector<bucket_strategy>& best() const {
    return candidates_[tuner_.best()];
  }

 private:
  static std::vector<std::vector<bucket_strategy>> strategies_of(
      std::span<const strategy_choice> p) {
    std::vector<std::vector<bucket_strategy>> out;
    out.reserve(p.size());
    for (const auto& x : p) out.push_back(x.strategies);
    return out;
  }

  std::vector<std::vector<bucket_strategy>> candidates_;
  step_tuner tuner_;
  std::chrono::steady_clock::time_point start_{};
};

}  // namespace pactrain
