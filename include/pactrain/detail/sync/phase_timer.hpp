// A scope's wall time, added to one field of sync_stats when the scope ends.
#pragma once

#include <chrono>

namespace pactrain::detail {

using sync_clock = std::chrono::steady_clock;

inline double seconds_since(sync_clock::time_point t0) noexcept {
  return std::chrono::duration<double>(sync_clock::now() - t0).count();
}

/// Adds the seconds from construction to destruction to `total` (also when unwinding).
class phase_timer {
 public:
  explicit phase_timer(double& total) noexcept : total_(total), start_(sync_clock::now()) {}
  phase_timer(const phase_timer&) = delete;
  phase_timer& operator=(const phase_timer&) = delete;
  ~phase_timer() { total_ += seconds_since(start_); }

 private:
  double& total_;
  sync_clock::time_point start_;
};

}  // namespace pactrain::detail
