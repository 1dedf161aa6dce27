// What an engine's open step records, whichever memory its buffers live in: whether a step is
// open, which buckets were submitted, the order in which their collectives started, which came
// back non-finite, its statistics and its start.
// The host step (host_step.hpp) adds its views, regions and requests; the device pipeline
// (cuda/detail/device_pipeline.hpp) uses it as it is; step_flow.hpp reads it for both.
#pragma once

#include <pactrain/detail/sync/phase_timer.hpp>
#include <pactrain/error.hpp>
#include <pactrain/sync_options.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace pactrain::detail {

/// finish() without a fused update.
struct no_update {};

class step_state {
 public:
  [[nodiscard]] bool open() const noexcept { return open_; }

  void check_closed(const char* op) const {
    PACTRAIN_EXPECTS(!open_, std::string("sync::") + op +
                                 ": a step is open (begun and not finished); finish it first");
  }
  void check_open(const char* op) const {
    PACTRAIN_EXPECTS(open_, std::string("sync::") + op + ": no step is open (call begin_step)");
  }
  /// For submit_bucket(b): throws, changing nothing, when b was submitted in this step.
  void check_unsubmitted(std::size_t b) const {
    PACTRAIN_EXPECTS(submitted_[b] == 0, "sync::submit_bucket: bucket " + std::to_string(b) +
                                             " was already submitted in this step");
  }

  /// Opens a step of `buckets` buckets, none submitted, all finite, with `stats` to add to.
  void begin(std::size_t buckets, const sync_stats& stats) {
    submitted_.assign(buckets, 0);
    nonfinite_.assign(buckets, 0);
    nonfinite_count_ = 0;
    order_.clear();
    order_.reserve(buckets);
    stats_ = stats;
    start_ = sync_clock::now();
    open_ = true;
  }
  /// Closes the step (completed or abandoned).
  void close() noexcept { open_ = false; }

  [[nodiscard]] std::size_t buckets() const noexcept { return submitted_.size(); }
  [[nodiscard]] bool submitted(std::size_t b) const { return submitted_[b] != 0; }
  void mark_submitted(std::size_t b) { submitted_[b] = 1; }
  /// Buckets whose collective has started, in order.
  [[nodiscard]] const std::vector<std::size_t>& order() const noexcept { return order_; }
  void started(std::size_t b) { order_.push_back(b); }
  /// Bucket b's result holds an Inf or a NaN (a verdict every rank reaches alike).
  [[nodiscard]] bool nonfinite(std::size_t b) const { return nonfinite_[b] != 0; }
  void mark_nonfinite(std::size_t b) {
    nonfinite_count_ += nonfinite_[b] == 0;
    nonfinite_[b] = 1;
  }
  [[nodiscard]] std::size_t nonfinite_count() const noexcept { return nonfinite_count_; }
  sync_stats& stats() noexcept { return stats_; }
  [[nodiscard]] sync_clock::time_point start() const noexcept { return start_; }

 private:
  bool open_ = false;
  std::vector<std::uint8_t> submitted_;  // per bucket
  std::vector<std::uint8_t> nonfinite_;  // per bucket
  std::size_t nonfinite_count_ = 0;
  std::vector<std::size_t> order_;  // buckets in order of their collective's start
  sync_stats stats_;                // the step's, handed over when it completes
  sync_clock::time_point start_{};
};

}  // namespace pactrain::detail
