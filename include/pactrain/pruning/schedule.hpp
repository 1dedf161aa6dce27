// Pruning schedules: when masks change and to what sparsity, by training step.
#pragma once

#include <pactrain/digest.hpp>
#include <pactrain/error.hpp>
#include <pactrain/pruning/policies.hpp>  // pruned_count checks a sparsity

#include <algorithm>
#include <bit>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string>

namespace pactrain {

/// When masks change (is_update_step) and to what sparsity (sparsity_at), by training step.
/// A schedule may give digest(), a hash of its settings, which the pruner compares across ranks.
template <class S>
concept pruning_schedule = requires(const S& s, std::uint64_t t) {
  { s.sparsity_at(t) } -> std::convertible_to<double>;
  { s.is_update_step(t) } -> std::convertible_to<bool>;
  s.validate();
};

/// Dense until `step`, then `sparsity` from that step on; one update at `step`.
struct one_shot_schedule {
  std::uint64_t step = 0;
  double sparsity = 0.9;

  void validate() const { (void)pruned_count(0, sparsity); }
  [[nodiscard]] double sparsity_at(std::uint64_t t) const noexcept {
    return t < step ? 0.0 : sparsity;
  }
  [[nodiscard]] bool is_update_step(std::uint64_t t) const noexcept { return t == step; }
  [[nodiscard]] std::uint64_t digest() const noexcept {
    return digest_builder(0x6f6e6573).add(step).add(std::bit_cast<std::uint64_t>(sparsity)).value();
  }
};

/// Gradual pruning (Zhu & Gupta, 2017): dense warm-up for steps < start_step, then
///   s_t = s_f + (s_i - s_f) * (1 - (t - t0) / (n * dt))^3   for t0 <= t <= t0 + n * dt,
/// and s_f after; masks are updated at t0 + k * dt for k = 0..n (n = updates).
struct gradual_schedule {
  double initial_sparsity = 0.0;
  double final_sparsity = 0.9;
  std::uint64_t start_step = 0;
  std::uint64_t interval = 100;
  std::uint64_t updates = 10;

  void validate() const {
    PACTRAIN_EXPECTS(
        initial_sparsity >= 0.0 && initial_sparsity <= final_sparsity && final_sparsity <= 1.0,
        "gradual_schedule: need 0 <= initial_sparsity <= final_sparsity <= 1");
    PACTRAIN_EXPECTS(interval > 0 && updates > 0,
                     "gradual_schedule: interval and updates must be positive");
  }
  [[nodiscard]] double sparsity_at(std::uint64_t t) const noexcept {
    if (t < start_step) return 0.0;
    const double span = static_cast<double>(interval) * static_cast<double>(updates);
    const double f = std::min(1.0, static_cast<double>(t - start_step) / span);
    const double r = 1.0 - f;
    return final_sparsity + (initial_sparsity - final_sparsity) * r * r * r;
  }
  [[nodiscard]] bool is_update_step(std::uint64_t t) const noexcept {
    return t >= start_step && (t - start_step) % interval == 0 &&
           (t - start_step) / interval <= updates;
  }
  /// The schedule of a run of `total_steps` steps: dense until start * total_steps, then
  /// `updates` mask updates (fewer if the window has fewer steps) rising to final_sparsity at
  /// end * total_steps (fractions rounded to the nearest step). Throws pactrain::error unless
  /// 0 <= start <= end <= 1.
  [[nodiscard]] static gradual_schedule over_run(std::uint64_t total_steps, double start,
                                                 double end, double final_sparsity,
                                                 std::uint64_t updates = 20) {
    PACTRAIN_EXPECTS(start >= 0.0 && start <= end && end <= 1.0,
                     "gradual_schedule::over_run: need 0 <= start <= end <= 1");
    PACTRAIN_EXPECTS(updates > 0, "gradual_schedule::over_run: updates must be positive");
    const auto at = [&](double f) {
      return static_cast<std::uint64_t>(std::llround(f * static_cast<double>(total_steps)));
    };
    const std::uint64_t first = at(start);
    const std::uint64_t last = std::max(at(end), first + 1);
    const std::uint64_t n = std::max<std::uint64_t>(1, std::min(updates, last - first));
    gradual_schedule g{.initial_sparsity = 0.0,
                       .final_sparsity = final_sparsity,
                       .start_step = first,
                       .interval = std::max<std::uint64_t>(1, (last - first) / n),
                       .updates = n};
    g.validate();
    return g;
  }

  [[nodiscard]] std::uint64_t digest() const noexcept {
    return digest_builder(0x67726164)  // "grad"
        .add(std::bit_cast<std::uint64_t>(initial_sparsity))
        .add(std::bit_cast<std::uint64_t>(final_sparsity))
        .add(start_step)
        .add(interval)
        .add(updates)
        .value();
  }
};

static_assert(pruning_schedule<one_shot_schedule>);

}  // namespace pactrain
