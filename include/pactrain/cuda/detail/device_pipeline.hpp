// The device engine's step primitives (device_engine.hpp adds the public face and the commit
// checks on top; step_flow.hpp runs the step over them), queued on the step's stream over the
// bucket operations of device_backend.hpp:
//   prepare, send  gather (the codec input, local scales), encode, and the sum: at once for
//                  submit_bucket (a scaled ternary bucket behind a MAX round of its own), in
//                  one group for finish_step (behind one MAX round for the scales they need);
//   start_next     previous_max's round of the next step's scales;
//   complete       decode and expand, or hold the payload for a fused update.
// The ternary residuals and selector, and previous_max's scales, advance on the device only
// when every scale of the step is finite (device_ternary.hpp).
// The verdict is deferred (the host learns it only by waiting): sync::allreduce waits, judges
// each bucket's result as the host engine does, reports the non-finite ones and keeps the step
// counter; a queued step (allreduce_async, finish_step) reports none and advances it. A fused
// update (finish_step(update)) waits for the verdict, then takes the results.
#pragma once

#include <pactrain/cuda/detail/device_backend.hpp>
#include <pactrain/cuda/detail/device_words.hpp>
#include <pactrain/detail/sync/phase_timer.hpp>
#include <pactrain/detail/sync/step_state.hpp>
#include <pactrain/strategy.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>
#include <vector>

namespace pactrain::detail {

/// The step hooks and step primitives of the device engine, and its deferred verdict.
template <class Engine, communicator Comm, class Codec, gradient_mask Mask, class Exec>
class device_pipeline : public device_backend<Engine, Comm, Codec, Mask, Exec> {
  using backend = device_backend<Engine, Comm, Codec, Mask, Exec>;
  friend step_flow<Engine, Comm, Codec, Mask, basic_device_compactor<Exec>>;

 public:
  using typename backend::plan_type;
  using typename backend::stream_type;
  using typename backend::value_type;
  using typename backend::wire_type;

 protected:
  using backend::backend;
  using backend::bucket_payload;
  using backend::bufs_;
  using backend::current_;
  using backend::encode_one;
  using backend::exec;
  using backend::expand_one;
  using backend::factor_of_plain;
  using backend::gather_one;
  using backend::hold_payload;
  using backend::home_;
  using backend::io_;
  using backend::is_ternary;
  using backend::reduce_one;
  using backend::reusing;
  using backend::scaled;
  using backend::step_done_;
  using backend::stream_;
  using backend::verdicts_;
  using backend::verdicts_host_;
  using backend::ws;

  // --- step hooks (see detail/sync/step_entry.hpp); bad input throws before anything is queued
  // and leaves no step open ---

  step_state& current() noexcept { return current_; }
  const step_state& current() const noexcept { return current_; }
  // `grads`: one flat buffer or one per tensor; `op`: "allreduce" or "begin_step".
  template <class Grads>
  void set_views(Grads grads, const char* op) {
    io_.set(this->layout_, grads, op);
  }
  void open_step(stream_type stream) {
    // The payload is shared: a step on another stream runs after the previous one, without
    // blocking the host.
    step_done_.order(Exec::native(stream));
    io_.begin(exec(), this->layout_, this->strategies_, stream, home_, step_done_);
    if constexpr (is_ternary) bufs_.ternary.begin_step(exec(), stream);
    stream_ = stream;
    group_.clear();
    current_.begin(this->layout_.buckets().size(), this->begin_stats());
  }
  // What was queued still runs.
  void abandon_step() noexcept { current_.close(); }

  // --- the bucket primitives of step_flow.hpp ---

  static void send_ready() noexcept {}  // a bucket is sent behind its round on the stream
  // Bucket b's codec input; a scaled one takes its own scale words (submit_bucket's round, or
  // previous_max's next round) or the next ones of finish's round.
  void prepare(std::size_t b, bool alone) {
    phase_timer t(current_.stats().gather_seconds);
    if constexpr (is_ternary) {
      if (scaled(b)) (void)(alone || reusing() ? bufs_.ternary.own(b) : bufs_.ternary.in_round(b));
    }
    gather_one(b);
    current_.mark_submitted(b);
  }
  [[nodiscard]] bool needs_round(std::size_t b) const { return scaled(b) && !reusing(); }
  void start_round(std::size_t b) {
    if constexpr (is_ternary) {
      phase_timer t(current_.stats().allreduce_seconds);
      bufs_.collectives.max(this->comm_, bufs_.ternary.slots(b), stream_, current_.stats());
      bufs_.ternary.note_verdict(exec(), b, stream_);
    }
    send(b, false);
  }
  void round(std::span<const std::size_t> due) {
    if constexpr (is_ternary) {
      phase_timer t(current_.stats().allreduce_seconds);
      bufs_.collectives.max(this->comm_, bufs_.ternary.round(), stream_, current_.stats());
      for (const auto b : due) bufs_.ternary.note_verdict(exec(), b, stream_);
    }
  }
  // The ternary encode (the 16-bit codecs' is fused into the gather); the sum now, or, for
  // finish's buckets, in flush's group.
  void send(std::size_t b, bool grouped) {
    current_.started(b);
    if constexpr (is_ternary) {
      if (scaled(b)) {
        phase_timer t(current_.stats().gather_seconds);
        encode_one(b);
      }
    }
    if (grouped) return group_.push_back(b);
    phase_timer t(current_.stats().allreduce_seconds);
    reduce_one(b);
  }
  // The grouped sums, launched together where the communicator can; then, for host
  // communicators, waits for every sum of the step.
  void flush() {
    phase_timer t(current_.stats().allreduce_seconds);
    bufs_.collectives.group(this->comm_, [&] {
      for (const auto b : group_) reduce_one(b);
    });
  }
  // previous_max: the round of the next step's scales, which also judges this step's.
  void start_next() {
    next_ = reusing() && ws().codec_input_size() != 0;
    if constexpr (is_ternary) {
      if (!next_) return;
      phase_timer t(current_.stats().allreduce_seconds);
      bufs_.collectives.max(this->comm_, bufs_.ternary.next_round(), stream_, current_.stats());
      for (std::size_t b = 0; b < current_.buckets(); ++b) {
        if (scaled(b)) bufs_.ternary.note_verdict(exec(), b, stream_);
      }
    }
  }
  void complete(std::size_t b, bool hold) {
    phase_timer t(current_.stats().scatter_seconds);
    if (hold) {
      hold_payload(b, factor_of_plain());
    } else {
      expand_one(b, factor_of_plain());
    }
  }
  // `judge`: wait for the step and judge its results (the synchronous step).
  void close_rounds(bool judge, bool fused) {
    {
      phase_timer t(current_.stats().scatter_seconds);
      if (judge) queue_verdicts(fused);
      if constexpr (is_ternary) {
        bufs_.ternary.end_step(
            exec(), stream_,
            judge ? std::span<const std::uint64_t>(verdicts_.data(), verdicts_.size())
                  : std::span<const std::uint64_t>{},
            next_);
      }
    }
    if (judge) read_verdicts();
  }
  void keep_state(bool finite) {
    step_done_.record(Exec::native(stream_));
    if constexpr (is_ternary) bufs_.ternary.settle(finite);
  }
  [[nodiscard]] std::span<value_type> tensor_payload(std::size_t i) {
    return {bufs_.payload.data() + ws().tensor_payload[i], this->plans_[i].count()};
  }
  [[nodiscard]] std::span<value_type> tensor(std::size_t i) { return io_.tensor(this->layout_, i); }
  void write_back(std::size_t b) {
    bufs_.buckets.scatter(exec(), b, bucket_payload(b).data(), io_.tensors(), io_.host_tensors(),
                          this->factor(b), stream_);
  }

  // --- the deferred verdict ---

  // One flag word per bucket, set by any Inf or NaN in its written-back result (pruned
  // entries are +0 by now), or, for a sparse bucket held for a fused update, in its payload.
  void queue_verdicts(bool fused) {
    exec().zero(verdicts_.data(), verdicts_.size(), stream_);
    const auto flag = [&](std::size_t b, const value_type* first, std::size_t n) {
      exec().for_each(n, nonfinite_flag_op<value_type>{first, verdicts_.data() + b}, stream_);
    };
    for (std::size_t b = 0; b < verdicts_.size(); ++b) {
      if (fused && this->route(b).sparse) {
        if (const auto p = bucket_payload(b); !p.empty()) flag(b, p.data(), p.size());
      } else {
        io_.for_each_run(this->layout_, b,
                         [&](const value_type* first, std::size_t n) { flag(b, first, n); });
      }
    }
  }
  // Waits for the step; marks its non-finite buckets (the ternary residuals' rule read the
  // same flags on the device).
  void read_verdicts() {
    verdicts_host_.resize(verdicts_.size());
    exec().download(verdicts_host_.data(), verdicts_.data(), verdicts_.size(), stream_);
    for (std::size_t b = 0; b < verdicts_host_.size(); ++b) {
      if (verdicts_host_[b] != 0) current_.mark_nonfinite(b);
    }
  }

  std::vector<std::size_t> group_;  // finish's buckets, summed in one group by flush
  bool next_ = false;               // previous_max's next round runs in this step
};

}  // namespace pactrain::detail
