// pactrain::sync on device buffers, for any device compactor: basic_device_compactor<Exec>
// (cuda_compactor, thrust_compactor). Internal; users include <pactrain/cuda/sync.cuh> or
// <pactrain/cuda/thrust_compactor.hpp>. The contract is described in <pactrain/cuda/sync.cuh>.
//
// Compiles without nvcc where Exec does (thrust_compactor on Thrust's CPP or OMP system), so
// the engine's device math runs in CI without a GPU.
#pragma once

#include <pactrain/codec.hpp>
#include <pactrain/codec/half_precision.hpp>
#include <pactrain/communicator.hpp>
#include <pactrain/cuda/detail/device_collectives.hpp>
#include <pactrain/cuda/detail/device_compactor.hpp>
#include <pactrain/cuda/detail/device_grads.hpp>
#include <pactrain/cuda/detail/device_ops.hpp>
#include <pactrain/cuda/detail/device_ternary.hpp>
#include <pactrain/cuda/detail/device_workspace.hpp>
#include <pactrain/detail/sync/commit.hpp>
#include <pactrain/error.hpp>
#include <pactrain/layout.hpp>
#include <pactrain/mask.hpp>
#include <pactrain/sync.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace pactrain {

/// The sync engine over device gradient buffers (see <pactrain/cuda/sync.cuh>), with the host
/// engine's collective, cross-checked configuration calls. Steps on different streams run in
/// call order without blocking the host. Not copyable or movable.
template <communicator Comm, class Codec, gradient_mask Mask, class Exec>
class sync<Comm, Codec, Mask, basic_device_compactor<Exec>>
    : public detail::sync_core<sync<Comm, Codec, Mask, basic_device_compactor<Exec>>, Comm, Codec,
                               Mask, basic_device_compactor<Exec>> {
  using compactor_t = basic_device_compactor<Exec>;
  using core = detail::sync_core<sync, Comm, Codec, Mask, compactor_t>;
  using base_codec = base_codec_t<Codec>;
  friend core;
  static constexpr bool checked_supported = false;  // sync_options::checked: host engine only
  static constexpr bool is_ternary = std::is_same_v<base_codec, ternary_codec>;
  // Plain buckets send value_type, coded ones wire_type (and ternary scales uint64 words):
  // the communicator reduces them all.
  static constexpr bool stream_ordered =
      detail::stream_ordered_for<Comm, Exec, typename Codec::wire_type> &&
      detail::stream_ordered_for<Comm, Exec, typename Codec::value_type> &&
      (!is_ternary || detail::stream_ordered_for<Comm, Exec, std::uint64_t>);

  static_assert(codec_traits<Codec>::is_identity || detail::is_cast_codec_v<base_codec> ||
                    is_ternary,
                "pactrain::sync on device buffers supports identity_codec, fp16_codec, "
                "bf16_codec and ternary_codec");
  static_assert(is_ternary || codec_traits<Codec>::is_identity || !has_feedback_v<Codec>,
                "pactrain::sync on device buffers: error feedback runs with ternary_codec (the "
                "16-bit codecs' rounding error is left to the optimizer)");
  static_assert(stream_ordered || Exec::host_accessible,
                "pactrain::sync on device buffers needs a stream-ordered communicator "
                "(nccl_communicator, mpi_cuda_communicator): allreduce_async(span, op, "
                "cudaStream_t)");

 public:
  using typename core::plan_type;
  using typename core::value_type;
  using typename core::wire_type;
  using stream_type = typename Exec::stream_type;

  /// Collective: checks that all ranks hold the same layout and codec settings and starts
  /// with every entry kept, as on the host engine (sync.hpp). Plans and the payload live on
  /// `stream` (it must outlive the engine); the constructor synchronises it.
  sync(Comm comm, param_layout layout, sync_options opt = {}, stream_type stream = {})
      : sync(std::move(comm), std::move(layout), Codec{}, compactor_t{}, opt, stream) {}
  /// As above, on `stream`: sync{comm, layout, stream}.
  sync(Comm comm, param_layout layout, stream_type stream)
      : sync(std::move(comm), std::move(layout), Codec{}, compactor_t{}, sync_options{}, stream) {}
  /// As above, with a codec's settings.
  sync(Comm comm, param_layout layout, Codec codec, sync_options opt = {}, stream_type stream = {})
      : sync(std::move(comm), std::move(layout), std::move(codec), compactor_t{}, opt, stream) {}
  /// As above, with a compactor's settings too.
  sync(Comm comm, param_layout layout, Codec codec, compactor_t compactor, sync_options opt = {},
       stream_type stream = {})
      : core(std::move(comm), std::move(layout), std::move(codec), std::move(compactor), opt),
        home_(stream),
        io_(this->layout_, stream) {
    this->commit_full("sync");
  }

  sync(const sync&) = delete;
  sync& operator=(const sync&) = delete;
  /// Waits for the last step (its kernels use the plans and payload freed here), even when
  /// the stream it ran on has been destroyed since.
  ~sync() { step_done_.wait_noexcept(); }

  /// Collective, as on the host engine (sync.hpp); set_masks and set_strategies wait for the
  /// last step and build the new plans before returning. On bad input or disagreement on any
  /// rank, every rank throws the same pactrain::error and nothing changes.
  using core::reject_masks;
  using core::set_masks;
  using core::set_strategies;

  /// Averages `grads` (device memory, the flat buffer of all tensors) across ranks in place,
  /// queued on `stream`; pruned entries come back as +0. Never synchronises. Bad input
  /// throws pactrain::error before anything is queued.
  void allreduce_async(std::span<value_type> grads, stream_type stream = {}) {
    begin(grads, stream, "allreduce");
    finish();
  }
  /// As above, with each tensor in a buffer of its own (device memory, layout order). A dense
  /// bucket whose tensors do not lie back to back goes through a staging copy.
  void allreduce_async(std::span<const std::span<value_type>> tensors, stream_type stream = {}) {
    begin(tensors, stream, "allreduce");
    finish();
  }

  /// Local: opens a step over `grads` (device memory, all tensors) on `stream`. The buffer
  /// must stay alive, and each bucket's entries untouched from its submission until the work
  /// finish_step queues has run.
  void begin_step(std::span<value_type> grads, stream_type stream = {}) {
    begin(grads, stream, "begin_step");
  }
  /// As above, with each tensor in a buffer of its own.
  void begin_step(std::span<const std::span<value_type>> tensors, stream_type stream = {}) {
    begin(tensors, stream, "begin_step");
  }
  /// Collective: bucket `b`'s gradients are final on the step's stream; queues its gather and
  /// allreduce there now, so that they overlap the backward pass of the next buckets. Every
  /// rank submits the same buckets in the same order.
  void submit_bucket(std::size_t b) {
    check_open("submit_bucket");
    this->check_bucket(b, "submit_bucket");
    PACTRAIN_EXPECTS(bufs_.submitted[b] == 0, "sync::submit_bucket: bucket " + std::to_string(b) +
                                                  " was already submitted in this step");
    closing_on_error([&] {
      if constexpr (is_ternary) {
        if (scaled(b)) bufs_.ternary.own(b);
      }
      gather_one(b);
      if constexpr (is_ternary) {
        if (scaled(b)) {
          bufs_.collectives.max(this->comm_, bufs_.ternary.own(b), stream_, step_stats_);
          encode_one(b);
        }
      }
      reduce_one(b);
      bufs_.submitted[b] = 1;
    });
  }
  /// Collective: submits, in layout order, every bucket not yet submitted (grouped where the
  /// communicator can), then queues every bucket's scatter of the mean. Closes the step;
  /// never synchronises.
  void finish_step() {
    check_open("finish_step");
    finish();
  }
  /// True between begin_step and finish_step.
  [[nodiscard]] bool step_open() const noexcept { return open_; }

  /// allreduce_async, then synchronises `stream`.
  void allreduce(std::span<value_type> grads, stream_type stream = {}) {
    allreduce_async(grads, stream);
    exec().synchronize(stream);
  }

  /// As above for a pointer and a size.
  void allreduce(value_type* data, std::size_t n, stream_type stream = {}) {
    PACTRAIN_EXPECTS(data != nullptr || n == 0,
                     "sync::allreduce: null buffer with " + std::to_string(n) + " entries");
    allreduce(std::span<value_type>(data, n), stream);
  }
  /// allreduce_async over one buffer per tensor, then synchronises `stream`.
  void allreduce(std::span<const std::span<value_type>> tensors, stream_type stream = {}) {
    allreduce_async(tensors, stream);
    exec().synchronize(stream);
  }

 private:
  using core::is_identity;

  const Exec& exec() const noexcept { return this->compactor_.exec(); }

  // --- commit hooks (see detail/sync/commit.hpp) ---

  void check_commit(const char* op) const {
    check_closed(op);
    if constexpr (is_ternary) {
      PACTRAIN_EXPECTS(!this->codec_.scale_from_previous_step(),
                       "ternary_codec's previous_max scales run on the host engine only; on "
                       "device buffers use scale_source::current_max");
    }
  }
  static void check_strategy(bucket_strategy) noexcept {}  // all four run here
  plan_type build_plan(const Mask& m) { return this->compactor_.make_plan(m, home_); }
  using workspace_buffers = detail::device_workspace<Codec, Comm, Exec, stream_ordered>;
  // May throw: runs before the agreement, so a failure reaches every rank. The last step may
  // still use the old plans and payload: let it finish, and let the new plans be built,
  // before the swap.
  workspace_buffers allocate_workspace(const detail::workspace_layout& w,
                                       std::span<const plan_type> plans) {
    step_done_.wait();
    exec().synchronize(home_);
    auto n = workspace_buffers::allocate(exec(), this->codec_, this->feedback, this->layout_, w,
                                         plans, home_);
    exec().synchronize(home_);  // the buffers exist for every stream
    return n;
  }
  void install_workspace(workspace_buffers&& n) noexcept { bufs_ = std::move(n); }

  const detail::workspace_layout& ws() const noexcept { return this->workspace_; }
  std::span<value_type> bucket_payload(std::size_t b) { return bufs_.bucket_payload(ws(), b); }
  std::span<wire_type> bucket_wire(std::size_t b) { return bufs_.bucket_wire(ws(), b); }

  // --- the step ---

  void check_closed(const char* op) const {
    PACTRAIN_EXPECTS(!open_, std::string("sync::") + op +
                                 ": a step is open (begun and not finished); finish it first");
  }
  void check_open(const char* op) const {
    PACTRAIN_EXPECTS(open_, std::string("sync::") + op + ": no step is open (call begin_step)");
  }

  // Bad input throws before anything is queued and leaves no step open. `grads`: one flat
  // buffer or one per tensor; `op`: "allreduce" or "begin_step".
  template <class Grads>
  void begin(Grads grads, stream_type stream, const char* op) {
    check_closed(op);
    io_.set(this->layout_, grads, op);
    step_stats_ = this->begin_stats();
    start_ = detail::sync_clock::now();
    // The payload is shared: a step on another stream runs after the previous one, without
    // blocking the host.
    step_done_.order(Exec::native(stream));
    io_.begin(exec(), this->layout_, this->strategies_, stream, home_, step_done_);
    if constexpr (is_ternary) bufs_.ternary.begin_step(exec(), stream);
    stream_ = stream;
    std::fill(bufs_.submitted.begin(), bufs_.submitted.end(), char{0});
    open_ = true;
  }

  // Runs f; if it throws, the step is closed (what was queued still runs) and the error
  // propagates.
  template <class F>
  void closing_on_error(F&& f) {
    try {
      f();
    } catch (...) {
      open_ = false;
      throw;
    }
  }

  void finish() {
    closing_on_error([&] {
      const auto& buckets = this->layout_.buckets();
      {
        detail::phase_timer t(step_stats_.gather_seconds);
        for (std::size_t b = 0; b < buckets.size(); ++b) {
          if (bufs_.submitted[b] != 0) continue;
          if constexpr (is_ternary) {
            if (scaled(b)) bufs_.ternary.in_round(b);
          }
          gather_one(b);
        }
      }
      if constexpr (is_ternary) {  // one round for every scale they need, then their encoding
        if (!bufs_.ternary.round().empty()) {
          detail::phase_timer t(step_stats_.allreduce_seconds);
          bufs_.collectives.max(this->comm_, bufs_.ternary.round(), stream_, step_stats_);
        }
        detail::phase_timer t(step_stats_.gather_seconds);
        for (std::size_t b = 0; b < buckets.size(); ++b) {
          if (bufs_.submitted[b] == 0 && scaled(b)) encode_one(b);
        }
      }
      {
        detail::phase_timer t(step_stats_.allreduce_seconds);
        reduce_rest();
      }
      {
        detail::phase_timer t(step_stats_.scatter_seconds);
        const value_type factor = value_type(1) / static_cast<value_type>(this->comm_.size());
        for (std::size_t b = 0; b < buckets.size(); ++b) expand_one(b, factor);
        if constexpr (is_ternary) bufs_.ternary.end_step(exec(), stream_);
      }
      step_done_.record(Exec::native(stream_));
    });
    open_ = false;
    this->end_step(step_stats_, start_);
  }

  // Gathers sparse bucket b's payload (a codec's encode fused in where the bucket is coded);
  // a dense bucket's tensors are copied into its region if they are not in place, and a
  // coded one is encoded whole, its pruned entries zeroed first.
  void gather_one(std::size_t b) {
    const auto& bk = this->layout_.buckets()[b];
    const bool plain = this->plain(b);
    const bool sparse = is_sparse(this->strategies_[b]);
    if (sparse) {
      if (plain || is_ternary) {
        bufs_.buckets.gather(exec(), b, io_.tensors(), bucket_payload(b).data(), stream_);
      } else {
        bufs_.buckets.gather(exec(), b, io_.tensors(), bucket_wire(b).data(), stream_);
      }
    } else {
      io_.stage_in(exec(), this->layout_, b, stream_);
      if (!plain && bk.size != 0) expand_dense_bucket(b, 1);  // pruned entries sent as +0
    }
    if (plain) return;
    if constexpr (is_ternary) {
      if (scaled(b)) {
        bufs_.ternary.local_scales(exec(), codec_input(b), codec_input_size(b),
                                   bufs_.ternary.slots(b), stream_);
      }
    } else if (!sparse && bk.size != 0) {
      exec().for_each(
          bk.size, detail::encode_op<value_type, wire_type>{io_.region(b), bucket_wire(b).data()},
          stream_);
    }
  }

  // Bucket b's collective: queued on the step's stream (stream-ordered communicators), or
  // started and left in flight until reduce_rest waits (host communicators).
  void reduce_one(std::size_t b) {
    const auto& bk = this->layout_.buckets()[b];
    auto& c = this->comm_;
    if (!this->plain(b)) {
      bufs_.collectives.sum(c, bucket_wire(b), stream_, step_stats_);
    } else if (is_sparse(this->strategies_[b])) {
      bufs_.collectives.sum(c, bucket_payload(b), stream_, step_stats_);
    } else {
      bufs_.collectives.sum(c, std::span<value_type>(io_.region(b), bk.size), stream_, step_stats_);
    }
  }

  // The collectives of every bucket not yet submitted, launched together where the
  // communicator can group them; then, for host communicators, waits for all of them.
  void reduce_rest() {
    bufs_.collectives.group(this->comm_, [&] {
      for (std::size_t b = 0; b < bufs_.submitted.size(); ++b) {
        if (bufs_.submitted[b] == 0) reduce_one(b);
      }
    });
  }

  // Bucket b's mean, +0 at pruned entries. A coded dense bucket is decoded in place (pruned
  // entries were sent as +0 by every rank, so they come back +0); a sparse one is scattered
  // with the decode fused in.
  void expand_one(std::size_t b, value_type factor) {
    const auto& bk = this->layout_.buckets()[b];
    const bool plain = this->plain(b);
    if (is_sparse(this->strategies_[b])) {
      const auto dst = io_.tensors();
      const auto host = io_.host_tensors();
      if (plain) {
        bufs_.buckets.scatter(exec(), b, bucket_payload(b).data(), dst, host, factor, stream_);
      } else if constexpr (is_ternary) {  // decoded to the mean in the payload
        decode_ternary(b);
        bufs_.buckets.scatter(exec(), b, bucket_payload(b).data(), dst, host, value_type(1),
                              stream_);
      } else {
        bufs_.buckets.scatter(exec(), b, bucket_wire(b).data(), dst, host, factor, stream_);
      }
      return;
    }
    if (!plain) {
      if constexpr (is_ternary) {
        decode_ternary(b);
        expand_dense_bucket(b, 1);  // +0 at pruned entries, where a NaN scale wrote NaN
      } else {
        exec().for_each(
            bk.size,
            detail::decode_op<value_type, wire_type>{bucket_wire(b).data(), io_.region(b), factor},
            stream_);
      }
    } else {
      expand_dense_bucket(b, factor);
    }
    io_.stage_out(exec(), this->layout_, b, stream_);
  }

  // --- ternary_codec (see device_ternary.hpp) ---

  // A coded bucket with codec input: it needs scales.
  bool scaled(std::size_t b) const { return !this->plain(b) && codec_input_size(b) != 0; }
  // Bucket b's codec input: its gathered payload (sparse) or its dense region.
  value_type* codec_input(std::size_t b) {
    return is_sparse(this->strategies_[b]) ? bucket_payload(b).data() : io_.region(b);
  }
  std::size_t codec_input_size(std::size_t b) const { return ws().codec_input_of(b); }
  codec_context context(std::size_t b) const noexcept {
    return {
        .rank = this->comm_.rank(), .size = this->comm_.size(), .step = this->step_, .bucket = b};
  }
  void encode_one(std::size_t b) {
    bufs_.ternary.encode(exec(), this->codec_, context(b), codec_input(b), codec_input_size(b),
                         ws().codec_input[b], bufs_.ternary.slot(b), bucket_wire(b).data(),
                         stream_);
  }
  // The mean into the codec input's place (NaN where a scale is not finite).
  void decode_ternary(std::size_t b) {
    if (!scaled(b)) return;
    bufs_.ternary.decode(exec(), this->codec_, this->comm_.size(), b, bucket_wire(b).data(),
                         codec_input(b), codec_input_size(b), bufs_.ternary.slot(b), stream_);
  }

  // A reduced dense bucket's region in place: times factor at kept entries, +0 elsewhere. A
  // bucket that keeps everything is one factor launch (none for factor 1); otherwise its kept
  // entries go through the payload and back, one launch each.
  void expand_dense_bucket(std::size_t b, value_type factor) {
    const auto& bk = this->layout_.buckets()[b];
    if (bk.size == 0) return;
    if (ws().payload_of(b) == bk.size) {
      if (factor == value_type(1)) return;
      value_type* d = io_.region(b);
      exec().for_each(bk.size, detail::times_op<value_type>{d, d, factor}, stream_);
      return;
    }
    const auto region = io_.region_source(this->layout_, b);
    bufs_.buckets.gather(exec(), b, region, bucket_payload(b).data(), stream_);
    bufs_.buckets.scatter(exec(), b, bucket_payload(b).data(), region, {}, factor, stream_);
  }

  stream_type home_{};                         // plans and payload are allocated and freed here
  detail::device_grads<value_type, Exec> io_;  // the gradients of the open step
  typename Exec::event step_done_;             // the end of the last step
  workspace_buffers bufs_;                     // of the last commit
  // The open step.
  bool open_ = false;
  stream_type stream_{};
  sync_stats step_stats_;
  detail::sync_clock::time_point start_{};
};

}  // namespace pactrain
