// The device engine's step (device_engine.hpp adds the public face and the commit checks on
// top) over the bucket primitives of device_backend.hpp, queued on the step's stream:
//   submit_bucket  gather, a MAX round of its own for a scaled bucket (current_max), encode,
//                  reduce;
//   finish_step    gather every other bucket, one MAX round for the scales they need, encode,
//                  reduce them grouped; previous_max's round of the next step's scales; expand.
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

/// The step of the device engine: the step hooks of sync_core, submit and finish over the
/// bucket primitives, the deferred verdict and the fused update's hand-over.
template <class Engine, communicator Comm, class Codec, gradient_mask Mask, class Exec>
class device_pipeline : public device_backend<Engine, Comm, Codec, Mask, Exec> {
  using backend = device_backend<Engine, Comm, Codec, Mask, Exec>;

 public:
  using typename backend::plan_type;
  using typename backend::stream_type;
  using typename backend::value_type;
  using typename backend::wire_type;

 protected:
  using backend::backend;
  using backend::bucket_payload;
  using backend::bucket_wire;
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
  using backend::reduce_rest;
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
    current_.begin(this->layout_.buckets().size(), this->begin_stats());
  }
  // What was queued still runs.
  void abandon_step() noexcept { current_.close(); }

  // `judge`: wait for the step and judge its results (the synchronous step). `update`: null,
  // or the fused optimizer step (see device_engine.hpp), which takes the sparse buckets'
  // payloads in place of their scatter once the verdict says every bucket is finite.
  template <class Update = no_update>
  void finish_now(bool judge = false, Update* update = nullptr) {
    constexpr bool fused = !std::is_same_v<Update, no_update>;
    const auto& buckets = this->layout_.buckets();
    auto& st = current_.stats();
    const value_type factor = factor_of_plain();
    {
      phase_timer t(st.gather_seconds);
      for (std::size_t b = 0; b < buckets.size(); ++b) {
        if (current_.submitted(b)) continue;
        if constexpr (is_ternary) {
          if (scaled(b)) (void)(reusing() ? bufs_.ternary.own(b) : bufs_.ternary.in_round(b));
        }
        gather_one(b);
      }
    }
    if constexpr (is_ternary) {  // one round for every scale they need, then their encoding
      if (!bufs_.ternary.round().empty()) {
        phase_timer t(st.allreduce_seconds);
        bufs_.collectives.max(this->comm_, bufs_.ternary.round(), stream_, st);
      }
      phase_timer t(st.gather_seconds);
      for (std::size_t b = 0; b < buckets.size(); ++b) {
        if (current_.submitted(b) || !scaled(b)) continue;
        if (!reusing()) bufs_.ternary.note_verdict(exec(), b, stream_);
        encode_one(b);
      }
    }
    {
      phase_timer t(st.allreduce_seconds);
      reduce_rest();
    }
    // previous_max: the round of the next step's scales, which also judges this step's.
    const bool next = reusing() && ws().codec_input_size() != 0;
    if constexpr (is_ternary) {
      if (next) {
        phase_timer t(st.allreduce_seconds);
        bufs_.collectives.max(this->comm_, bufs_.ternary.next_round(), stream_, st);
        for (std::size_t b = 0; b < buckets.size(); ++b) {
          if (scaled(b)) bufs_.ternary.note_verdict(exec(), b, stream_);
        }
      }
    }
    {
      phase_timer t(st.scatter_seconds);
      for (std::size_t b = 0; b < buckets.size(); ++b) {
        if (fused && this->route(b).sparse) {
          hold_payload(b, factor);
        } else {
          expand_one(b, factor);
        }
      }
      if (judge) queue_verdicts(fused);
      if constexpr (is_ternary) {
        bufs_.ternary.end_step(
            exec(), stream_,
            judge ? std::span<const std::uint64_t>(verdicts_.data(), verdicts_.size())
                  : std::span<const std::uint64_t>{},
            next);
      }
    }
    if (judge) read_verdicts();
    if constexpr (fused) hand_over(*update, factor);  // queued after the verdict
    step_done_.record(Exec::native(stream_));
    if constexpr (is_ternary) bufs_.ternary.settle(current_.nonfinite_count() == 0);
    st.nonfinite_buckets = current_.nonfinite_count();
    current_.close();
    this->end_step(st, current_.start());
  }

  // Bucket b's gather and collective now (the step's submit_bucket); a scaled ternary bucket
  // takes a MAX round of its own first.
  void submit_now(std::size_t b) {
    if constexpr (is_ternary) {
      if (scaled(b)) bufs_.ternary.own(b);
    }
    gather_one(b);
    if constexpr (is_ternary) {
      if (scaled(b)) {
        if (!reusing()) {
          bufs_.collectives.max(this->comm_, bufs_.ternary.own(b), stream_, current_.stats());
          bufs_.ternary.note_verdict(exec(), b, stream_);
        }
        encode_one(b);
      }
    }
    reduce_one(b);
    current_.mark_submitted(b);
  }

  // --- the deferred verdict, and the fused update that waits for it ---

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
  // After the verdict: every tensor to `u` in layout order (a sparse bucket's kept entries
  // from its payload, a dense bucket's written-back tensor), then u.done(); after a
  // non-finite step no update, and the sparse buckets are written back instead.
  template <class Update>
  void hand_over(Update& u, value_type inv_p) {
    phase_timer t(current_.stats().scatter_seconds);
    const bool finite = current_.nonfinite_count() == 0;
    const auto& buckets = this->layout_.buckets();
    for (std::size_t b = 0; b < buckets.size(); ++b) {
      const bool sparse = this->route(b).sparse;
      const value_type factor = this->plain(b) ? inv_p : value_type(1);
      if (!finite) {
        if (sparse) {
          bufs_.buckets.scatter(exec(), b, bucket_payload(b).data(), io_.tensors(),
                                io_.host_tensors(), factor, stream_);
        }
        continue;
      }
      const auto& bk = buckets[b];
      for (std::size_t i = bk.first_tensor; i < bk.first_tensor + bk.tensor_count; ++i) {
        if (sparse) {
          u.kept(i,
                 std::span<const value_type>(bufs_.payload.data() + ws().tensor_payload[i],
                                             this->plans_[i].count()),
                 factor);
        } else {
          u.dense(i, std::span<const value_type>(io_.tensor(this->layout_, i)));
        }
      }
    }
    if (finite) u.done();
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
};

}  // namespace pactrain::detail
