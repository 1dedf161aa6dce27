// The scale rounds of a scaled codec (ternary_codec): every bucket's local max |g| reduced
// with MAX over ranks into the scale its encoding uses (or, for a codec with scale_count,
// one per block of the bucket, all in the bucket's round). For codecs without a scale the
// exchange is empty and every call does nothing.
//
// Rounds, per step (each a small uint64 allreduce, MAX; scales travel as float bits):
//   current_max   submit_bucket: one nonblocking round per submitted bucket, completed at
//                 the next submission; finish_step: one blocking round over every bucket it
//                 prepares that still needs its scale.
//   previous_max  none before encoding (last step's scales are used); one nonblocking round
//                 over every bucket's local max runs alongside the step's data and gives the
//                 next step's scales. The first step after a commit falls back to current_max.
// A non-finite local max (an Inf or NaN in the gradient) makes the reduced word non-finite on
// every rank: current_max learns it before encoding, previous_max from the round of next
// step's scales. A step with any non-finite bucket keeps the scales it started with.
#pragma once

#include <pactrain/communicator.hpp>
#include <pactrain/detail/sync/phase_timer.hpp>
#include <pactrain/sync_options.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace pactrain::detail {

/// Scales of a codec input of n entries: the codec's scale_count, else one.
template <class Codec>
[[nodiscard]] std::size_t scale_count_of(const Codec& codec, std::size_t n) {
  if constexpr (requires { codec.scale_count(n); }) {
    return codec.scale_count(n);
  } else {
    return 1;
  }
}

/// The part of the exchange a checkpoint keeps: the last step's global scales, and whether
/// they are valid. Shared by both specializations so the saved format is one.
class saved_scales {
 public:
  [[nodiscard]] const std::vector<float>& previous() const noexcept { return previous_; }
  [[nodiscard]] bool ready() const noexcept { return ready_; }
  void restore(std::vector<float> previous, bool ready) noexcept {
    previous_ = std::move(previous);
    ready_ = ready;
  }

 protected:
  void forget(std::size_t buckets) {
    previous_.assign(buckets, 0.0f);
    ready_ = false;
  }

  std::vector<float> previous_;  // previous_max: the last step's global scales
  bool ready_ = false;           // previous_ holds valid scales
};

template <class Codec, class Comm, bool = Codec::uses_scale>
class scale_exchange : public saved_scales {
 public:
  using request_type = typename Comm::request_type;

  /// A commit: the previous step's scales no longer describe the buckets. `inputs(b)`: bucket
  /// b's codec input entries, which decide its number of scales.
  template <class Inputs>
  void reset(const Codec& codec, std::size_t buckets, Inputs&& inputs) {
    first_.assign(buckets + 1, 0);
    for (std::size_t b = 0; b < buckets; ++b) {
      first_[b + 1] = first_[b] + scale_count_of(codec, inputs(b));
    }
    forget(first_.back());
    local_.assign(first_.back(), 0);
    used_.assign(first_.back(), 0.0f);
  }

  void open_step(const Codec& codec, std::size_t buckets) {
    pending_.clear();
    requests_.clear();
    requests_.resize(buckets);
    words_.resize(local_.size());  // a round writes its bucket's words before sending them
    reuse_ = codec.scale_from_previous_step() && ready_;
    if (reuse_) used_ = previous_;
  }

  /// A failed step: forget the rounds in flight.
  void abandon() noexcept {
    pending_.clear();
    requests_.clear();
  }

  /// Records bucket b's local statistics from its (fresh) codec input.
  template <class T>
  void note_local(const Codec& codec, std::size_t b, std::span<const T> input) {
    if constexpr (requires { codec.scale_count(input.size()); }) {
      local_scales_.resize(count(b));
      codec.local_scales(input, std::span<float>(local_scales_));
      for (std::size_t k = 0; k < count(b); ++k) {
        local_[first_[b] + k] = std::bit_cast<std::uint32_t>(local_scales_[k]);
      }
    } else {
      local_[first_[b]] =
          std::bit_cast<std::uint32_t>(static_cast<float>(codec.local_scale(input)));
    }
  }

  /// Whether a prepared bucket (`scaled`: its route's) must wait for a round of this step.
  [[nodiscard]] bool needs_round(bool scaled) const noexcept { return !reuse_ && scaled; }

  /// The scales bucket b encodes and decodes with this step (its first, and all).
  [[nodiscard]] float scale(std::size_t b) const noexcept { return used_[first_[b]]; }
  [[nodiscard]] std::span<const float> scales(std::size_t b) const noexcept {
    return std::span<const float>(used_).subspan(first_[b], count(b));
  }
  /// False when one of bucket b's scales of this step is Inf or NaN: some rank's gradient was.
  [[nodiscard]] bool finite(std::size_t b) const noexcept {
    for (const float x : scales(b)) {
      if (!std::isfinite(x)) return false;
    }
    return true;
  }

  /// Starts the nonblocking round of bucket b's scale (submit_bucket, current_max).
  void start(Comm& comm, sync_stats& s, std::size_t b) {
    phase_timer t(s.allreduce_seconds);
    pending_.push_back(b);
    auto words = std::span<std::uint64_t>(words_).subspan(first_[b], count(b));
    std::copy_n(local_.begin() + static_cast<std::ptrdiff_t>(first_[b]), count(b), words.begin());
    requests_[b] = comm.allreduce_async(words, reduce_op::max);
    ++s.collectives;
    s.bytes_sent += words.size_bytes();
  }

  /// Completes the rounds start() began, in their order, calling send(b) for each.
  template <class Send>
  void complete_started(sync_stats& s, Send&& send) {
    for (const std::size_t b : pending_) {
      {
        phase_timer t(s.allreduce_seconds);
        requests_[b].wait();
      }
      for (std::size_t k = first_[b]; k < first_[b + 1]; ++k) used_[k] = as_float(words_[k]);
      send(b);
    }
    pending_.clear();
  }

  /// One blocking round over the buckets in `due` (the same list on every rank).
  void reduce_due(Comm& comm, sync_stats& s, std::span<const std::size_t> due) {
    phase_timer t(s.allreduce_seconds);
    round_.clear();
    for (const auto b : due) {
      for (std::size_t k = first_[b]; k < first_[b + 1]; ++k) round_.push_back(local_[k]);
    }
    comm.allreduce(std::span<std::uint64_t>(round_), reduce_op::max);
    std::size_t at = 0;
    for (const auto b : due) {
      for (std::size_t k = first_[b]; k < first_[b + 1]; ++k) used_[k] = as_float(round_[at++]);
    }
    ++s.collectives;
    s.bytes_sent += round_.size() * sizeof(std::uint64_t);
  }

  /// previous_max: starts the round of next step's scales alongside this step's data, when
  /// any bucket has codec input (`any`, the same on every rank).
  void start_next(Comm& comm, sync_stats& s, bool any) {
    next_pending_ = reuse_ && any;
    if (!next_pending_) return;
    phase_timer t(s.allreduce_seconds);
    next_ = comm.allreduce_async(std::span<std::uint64_t>(local_), reduce_op::max);
    ++s.collectives;
    s.bytes_sent += local_.size() * sizeof(std::uint64_t);
  }

  /// Waits for the round start_next began, if any.
  void wait_next(sync_stats& s) {
    if (!next_pending_) return;
    phase_timer t(s.allreduce_seconds);
    next_.wait();
  }

  /// After wait_next: bucket b's gradient held an Inf or a NaN on some rank (previous_max).
  [[nodiscard]] bool next_nonfinite(std::size_t b) const noexcept {
    if (!next_pending_) return false;
    for (std::size_t k = first_[b]; k < first_[b + 1]; ++k) {
      if (!std::isfinite(as_float(local_[k]))) return true;
    }
    return false;
  }

  /// Closes the step: next step's scales are the round's result (previous_max in use) or
  /// this step's (previous_max falling back to current_max); a non-finite step keeps the old.
  void finish_next(const Codec& codec, bool finite) {
    if (finite && next_pending_) {
      for (std::size_t k = 0; k < local_.size(); ++k) previous_[k] = as_float(local_[k]);
    } else if (finite && !reuse_ && codec.scale_from_previous_step()) {
      previous_ = used_;
      ready_ = true;
    }
    next_pending_ = false;
  }

 private:
  static float as_float(std::uint64_t word) noexcept {
    return std::bit_cast<float>(static_cast<std::uint32_t>(word));
  }
  [[nodiscard]] std::size_t count(std::size_t b) const noexcept {
    return first_[b + 1] - first_[b];
  }

  std::vector<std::size_t> first_;      // per bucket + 1: scales before it
  std::vector<float> local_scales_;     // note_local's scratch (kept: no allocation per step)
  std::vector<std::uint64_t> local_;    // bits of each local scale (non-negative)
  std::vector<std::uint64_t> round_;    // a blocking round's words
  std::vector<std::size_t> pending_;    // submit_bucket's rounds in flight, in order
  std::vector<request_type> requests_;  // per bucket: its round in flight
  std::vector<std::uint64_t> words_;    // per scale: its bucket's round's word
  request_type next_{};                 // previous_max: next step's round
  bool next_pending_ = false;
  std::vector<float> used_;  // this step's scales, bucket by bucket
  bool reuse_ = false;       // previous_ in force this step
};

/// Codecs without a scale: nothing to exchange. The saved state still holds one (zero) scale
/// per bucket for every codec but the identity, so the format is the same for all codecs.
template <class Codec, class Comm>
class scale_exchange<Codec, Comm, false> : public saved_scales {
 public:
  template <class Inputs>
  void reset(const Codec&, std::size_t buckets, Inputs&&) {
    forget(buckets);
  }
  void open_step(const Codec&, std::size_t) noexcept {}
  void abandon() noexcept {}
  template <class T>
  void note_local(const Codec&, std::size_t, std::span<const T>) noexcept {}
  [[nodiscard]] bool needs_round(bool) const noexcept { return false; }
  [[nodiscard]] float scale(std::size_t) const noexcept { return 0.0f; }
  [[nodiscard]] std::span<const float> scales(std::size_t) const noexcept { return {}; }
  void start(Comm&, sync_stats&, std::size_t) noexcept {}
  void reduce_due(Comm&, sync_stats&, std::span<const std::size_t>) noexcept {}
  template <class Send>
  void complete_started(sync_stats&, Send&&) noexcept {}
  [[nodiscard]] bool finite(std::size_t) const noexcept { return true; }
  void start_next(Comm&, sync_stats&, bool) noexcept {}
  void wait_next(sync_stats&) noexcept {}
  [[nodiscard]] bool next_nonfinite(std::size_t) const noexcept { return false; }
  void finish_next(const Codec&, bool) noexcept {}
};

}  // namespace pactrain::detail
