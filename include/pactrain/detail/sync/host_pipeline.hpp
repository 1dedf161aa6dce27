// The host engine's bucket primitives, over which step_flow.hpp runs the step (host_engine.hpp
// adds the commit and state hooks on top):
//   prepare   the bucket's codec input: its gathered payload (sparse) or its dense region,
//             pruned entries zeroed for a coded dense bucket; its local scale;
//   send      encode (coded buckets; error feedback adds and keeps the residual here) and
//             start the allreduce;
//   complete  wait in order of submission, decode, expand (+0 at pruned entries, 1/P folded
//             in where no decode did it), and check the result for Inf and NaN at once.
// Non-finite policy: a bucket whose result would hold an Inf or a NaN in a dense allreduce
// comes back non-finite on every rank (a coded bucket whose scale is not finite comes back
// all NaN), is counted in stats, and the step then leaves all state as it was: error feedback
// writes the new residuals to a second buffer that replaces the first only when every bucket
// is finite; the scales and the step counter advance only then.
// Plain buckets (the identity codec, and the plain strategies of any codec) skip encode and
// decode: the payload itself is summed.
#pragma once

#include <pactrain/codec.hpp>
#include <pactrain/communicator.hpp>
#include <pactrain/compactor.hpp>
#include <pactrain/detail/finite.hpp>
#include <pactrain/detail/sync/commit.hpp>
#include <pactrain/detail/sync/host_buckets.hpp>
#include <pactrain/detail/sync/host_step.hpp>
#include <pactrain/detail/sync/host_workspace.hpp>
#include <pactrain/detail/sync/phase_timer.hpp>
#include <pactrain/detail/sync/scale_exchange.hpp>
#include <pactrain/detail/sync/state_format.hpp>
#include <pactrain/detail/sync/step_flow.hpp>
#include <pactrain/error.hpp>
#include <pactrain/feedback.hpp>
#include <pactrain/huge_pages.hpp>

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

namespace pactrain::detail {

/// The bucket primitives of the host engine and the state they share. Engine is the host_engine
/// deriving from it (sync_core's hooks live there).
template <class Engine, communicator Comm, class Codec, gradient_mask Mask, class Compactor>
class host_pipeline : public step_flow<Engine, Comm, Codec, Mask, Compactor> {
  using core = sync_core<Engine, Comm, Codec, Mask, Compactor>;
  using flow = step_flow<Engine, Comm, Codec, Mask, Compactor>;
  friend flow;

  static_assert(bucket_codec<Codec>,
                "pactrain::sync: Codec must provide wire_size, validate, encode, decode and "
                "decode_local (the bucket_codec concept)");
  static_assert(Compactor::memory == memory_space::host,
                "pactrain::sync: this version synchronises host buffers (host_compactor)");
  static_assert(
      requires(Comm & c, std::span<typename Codec::wire_type> w, std::span<std::uint64_t> u) {
        { c.allreduce_async(w, reduce_op::sum) } -> std::same_as<typename Comm::request_type>;
        { c.allreduce_async(u, reduce_op::max) } -> std::same_as<typename Comm::request_type>;
      },
      "pactrain::sync: the communicator cannot sum the codec's wire_type (it needs "
      "allreduce_async of wire_type spans with reduce_op::sum, and of uint64 with max)");

 public:
  using typename core::plan_type;
  using typename core::value_type;
  using typename core::wire_type;
  using request_type = typename Comm::request_type;

  static constexpr bool plain_supported = requires(Comm & c, std::span<value_type> v) {
    { c.allreduce_async(v, reduce_op::sum) } -> std::same_as<request_type>;
  };

 protected:
  using core::feedback;
  using core::is_identity;
  using core::plain;
  using core::route;

  host_pipeline(Comm comm, param_layout layout, Codec codec, Compactor compactor, sync_options opt)
      : flow(std::move(comm), std::move(layout), std::move(codec), std::move(compactor), opt) {}

  void open_step() {
    current_.begin(this->layout_, this->strategies_, this->begin_stats());
    scales_.open_step(this->codec_, this->layout_.buckets().size());
    waited_ = 0;
  }

  // --- the bucket primitives of step_flow.hpp ---

  void send_ready() {
    scales_.complete_started(current_.stats(), [&](std::size_t b) { send(b, false); });
  }

  // The bucket's codec input. A coded dense bucket has its pruned entries zeroed, so they sway
  // neither the scale nor the residuals. The scale comes from the fresh gradient: a residual
  // that counted would feed the scale and, through the noise of a larger scale, itself; what
  // exceeds it clips into the residual.
  void prepare(std::size_t b, bool /*alone*/) {
    phase_timer t(current_.stats().gather_seconds);
    const bool sparse = route(b).sparse;
    const auto io = buckets();
    std::span<value_type> region = sparse ? io.gather(b, current_) : io.dense_region(b, current_);
    if (route(b).coded) {
      if (!sparse) io.zero_pruned(b, region);
      scales_.note_local(this->codec_, b, std::span<const value_type>(region));
    }
    current_.mark_submitted(b, region);
  }
  [[nodiscard]] bool needs_round(std::size_t b) const {
    return scales_.needs_round(route(b).scaled);
  }
  void start_round(std::size_t b) { scales_.start(this->comm_, current_.stats(), b); }
  void round(std::span<const std::size_t> due) {
    scales_.reduce_due(this->comm_, current_.stats(), due);
  }

  // Encode (coded buckets), keep what did not get through (error feedback), start the
  // allreduce. An empty bucket sends nothing: routes follow the agreed masks, so every rank
  // skips the same buckets.
  void send(std::size_t b, bool /*grouped*/) {
    current_.started(b);
    const auto region = current_.region(b);
    if (route(b).empty) return;
    if (route(b).coded && !scales_.finite(b)) {  // known alike on every rank: nothing to sum
      current_.mark_nonfinite(b);
      return;
    }
    auto& s = current_.stats();
    if (plain(b)) {
      if constexpr (is_identity || plain_supported) {
        phase_timer t(s.allreduce_seconds);
        current_.request(b) = this->comm_.allreduce_async(region, reduce_op::sum);
        s.bytes_sent += region.size_bytes();
      }
    } else {
      const auto wire = wire_of(b);
      {
        phase_timer t(s.gather_seconds);
        const codec_context ctx = context(b);
        if constexpr (feedback) {  // the residual is added here, in the codec's pass if it can
          const std::size_t at = this->workspace_.codec_input[b];
          encode_with_feedback(this->codec_, region, wire,
                               std::span<const value_type>(residual_).subspan(at, region.size()),
                               std::span<value_type>(residual_next_).subspan(at, region.size()),
                               ctx);
        } else {
          this->codec_.encode(std::span<const value_type>(region), wire, ctx);
        }
      }
      phase_timer t(s.allreduce_seconds);
      current_.request(b) = this->comm_.allreduce_async(wire, reduce_op::sum);
      s.bytes_sent += wire.size_bytes();
    }
    ++s.collectives;
    current_.progress(0);
  }
  static void flush() noexcept {}  // each sum started at its send
  // The same on every rank: input sizes follow the agreed masks.
  void start_next() {
    scales_.start_next(this->comm_, current_.stats(), this->workspace_.codec_input_size() != 0);
  }

  // Waits for bucket b (the next in order of submission), writes it back and judges it finite
  // or not. A fused update reads a held bucket's payload itself, after every verdict.
  void complete(std::size_t b, bool hold) {
    auto& s = current_.stats();
    {
      phase_timer t(s.allreduce_seconds);
      current_.request(b).wait();
      current_.progress(++waited_);
    }
    phase_timer t(s.scatter_seconds);
    const auto region = current_.region(b);
    const bool sparse = route(b).sparse;
    if (current_.nonfinite(b)) return poison(b, sparse, region);
    if (route(b).coded && !route(b).empty) {
      this->codec_.decode(std::span<const wire_type>(wire_of(b)), region, context(b));
    }
    if (!hold) buckets().expand(b, sparse, region, current_, this->factor(b));
    if (!finite_result(b, sparse, region)) {
      current_.mark_nonfinite(b);
      if (hold) buckets().expand(b, sparse, region, current_, this->factor(b));
    }
  }
  // previous_max encoded with last step's finite scale: an Inf or NaN of this step's gradient
  // shows only in the round of next step's scales.
  void close_rounds(bool /*judge: always*/, bool /*fused*/) {
    auto& s = current_.stats();
    scales_.wait_next(s);
    for (std::size_t b = 0; b < current_.buckets(); ++b) {
      if (route(b).coded && !current_.nonfinite(b) && scales_.next_nonfinite(b)) {
        phase_timer t(s.scatter_seconds);
        poison(b, route(b).sparse, current_.region(b));
        current_.mark_nonfinite(b);
      }
    }
  }
  void keep_state(bool finite) {
    scales_.finish_next(this->codec_, finite);
    if constexpr (feedback) {
      if (finite) residual_.swap(residual_next_);
    }
  }
  [[nodiscard]] std::span<value_type> tensor_payload(std::size_t i) {
    return buckets().tensor_payload(i);
  }
  [[nodiscard]] std::span<value_type> tensor(std::size_t i) const { return current_.view(i); }
  void write_back(std::size_t b) {
    buckets().expand(b, route(b).sparse, current_.region(b), current_, this->factor(b));
  }

  // --- helpers ---

  [[nodiscard]] host_buckets<Compactor, value_type> buckets() {
    return {this->compactor_, this->layout_, this->plans_, this->workspace_, payload_};
  }
  std::span<wire_type> wire_of(std::size_t b) {
    return std::span<wire_type>(wire_).subspan(this->workspace_.wire[b],
                                               this->workspace_.wire_of(b));
  }
  codec_context context(std::size_t b) const noexcept {
    return codec_context{.rank = this->comm_.rank(),
                         .size = this->comm_.size(),
                         .step = this->step_,
                         .bucket = b,
                         .scale = scales_.scale(b),
                         .scales = scales_.scales(b)};
  }
  void poison(std::size_t b, bool sparse, std::span<value_type> region) {
    buckets().poison(b, sparse, region, current_);
  }
  // A scaled codec decodes to finite values when its scale is finite (codec.hpp), and a
  // bucket is encoded only then: nothing to read again.
  [[nodiscard]] bool finite_result(std::size_t b, bool sparse, std::span<const value_type> region) {
    if constexpr (Codec::uses_scale) {
      if (route(b).coded) return true;
    }
    return buckets().finite(b, sparse, region, current_);
  }

  huge_vector<value_type> payload_;        // workspaces on huge pages: streamed every step
  huge_vector<wire_type> wire_;            // coded buckets' wire elements
  huge_vector<value_type> residual_;       // error_feedback: one per codec input entry
  huge_vector<value_type> residual_next_;  // the step's new residuals, kept if it is finite
  scale_exchange<Codec, Comm> scales_;
  host_step<value_type, request_type> current_;  // the open step
  std::size_t waited_ = 0;                       // buckets of the open step waited for
};

}  // namespace pactrain::detail
