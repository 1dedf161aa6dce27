// The learning-rate schedule of pactrain's trainers: a linear warm-up, a hold at the peak,
// a cosine decay to 0, and in pruned runs a second cosine cycle after the last mask update.
//
// Header-only; used by examples/fmnist and the LibTorch examples. Build and run a trainer that
// uses it (from the repository root):
//   cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
//   cmake --build build --target pactrain_fmnist
//   mpiexec --allow-run-as-root --oversubscribe -n 4 build/examples/pactrain_fmnist
#pragma once

#include <pactrain/pruning/pruner.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numbers>

namespace examples {

/// The shape of a run's learning rate, as fractions of its steps.
struct lr_shape {
  double warmup = 0.0;  // linear rise from 0 to the peak over this fraction
  double hold = 0.0;    // then the peak for this fraction, then a cosine decay to 0
  // Pruned runs only: after the last mask update the rate goes back up to rewind x peak and
  // decays by cosine to 0 again, a second cycle for the final sparse network, which the
  // nearly spent first cycle leaves underfitted (0: no second cycle).
  double rewind = 0.0;
};

/// The step after which a run of `total_steps` steps no longer changes its masks.
inline std::uint64_t last_mask_update(const pactrain::gradual_schedule& s,
                                      std::uint64_t total_steps) {
  return std::min(total_steps, s.start_step + s.interval * s.updates);
}

/// The factor (of the peak rate) at step t of n; `last_update` is last_mask_update of a
/// pruned run, n in a dense one.
inline double lr_factor(const lr_shape& shape, std::uint64_t t, std::uint64_t n,
                        std::uint64_t last_update) {
  const auto cosine = [](double q) { return 0.5 * (1.0 + std::cos(std::numbers::pi * q)); };
  if (shape.rewind > 0.0 && t > last_update && last_update < n) {
    const double q = static_cast<double>(t - last_update) / static_cast<double>(n - last_update);
    return shape.rewind * cosine(q);
  }
  const double p = static_cast<double>(t) / static_cast<double>(n);
  if (p < shape.warmup) return (p + 1.0 / static_cast<double>(n)) / shape.warmup;
  const double decay_from = shape.warmup + shape.hold;
  if (p < decay_from) return 1.0;
  return cosine((p - decay_from) / (1.0 - decay_from));
}

}  // namespace examples
