// The device engine's bucket operations (device_pipeline.hpp builds the step's primitives on them),
// queued on the step's stream and never synchronised:
//   gather    the bucket's codec input: its gathered payload (sparse; the 16-bit codecs'
//             rounding fused in) or its dense region (staged in when its tensors are not back
//             to back), pruned entries zeroed for a coded dense bucket; ternary local scales;
//   encode    the ternary encode, with the scales of this step's round or (previous_max) the
//             last finite step's;
//   reduce    the SUM (grouped into one launch where the communicator can);
//   expand    decode, scatter (+0 at pruned entries, 1/P folded in where no decode did it),
//             stage out; or, for a fused update, hold the payload decoded.
// A coded bucket whose scale is not finite comes back all NaN (device_ternary.hpp).
#pragma once

#include <pactrain/codec.hpp>
#include <pactrain/codec/half_precision.hpp>
#include <pactrain/communicator.hpp>
#include <pactrain/cuda/detail/device_collectives.hpp>
#include <pactrain/cuda/detail/device_compactor.hpp>
#include <pactrain/cuda/detail/device_grads.hpp>
#include <pactrain/cuda/detail/device_ops.hpp>
#include <pactrain/cuda/detail/device_ternary.hpp>
#include <pactrain/cuda/detail/device_words.hpp>
#include <pactrain/cuda/detail/device_workspace.hpp>
#include <pactrain/detail/sync/commit.hpp>
#include <pactrain/detail/sync/phase_timer.hpp>
#include <pactrain/detail/sync/step_flow.hpp>
#include <pactrain/detail/sync/step_state.hpp>
#include <pactrain/error.hpp>
#include <pactrain/layout.hpp>
#include <pactrain/mask.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

namespace pactrain::detail {

/// The bucket primitives of the device engine over basic_device_compactor<Exec>, queued on the
/// step's stream, and the state they share. Engine is the sync specialisation deriving from
/// it through device_pipeline (sync_core's hooks live there).
template <class Engine, communicator Comm, class Codec, gradient_mask Mask, class Exec>
class device_backend : public step_flow<Engine, Comm, Codec, Mask, basic_device_compactor<Exec>> {
  using compactor_t = basic_device_compactor<Exec>;
  using core = sync_core<Engine, Comm, Codec, Mask, compactor_t>;
  using flow = step_flow<Engine, Comm, Codec, Mask, compactor_t>;
  using base_codec = base_codec_t<Codec>;

 protected:
  static constexpr bool is_ternary = std::is_same_v<base_codec, ternary_codec>;
  // Plain buckets send value_type, coded ones wire_type (and ternary scales uint64 words):
  // the communicator reduces them all.
  static constexpr bool stream_ordered =
      stream_ordered_for<Comm, Exec, typename Codec::wire_type> &&
      stream_ordered_for<Comm, Exec, typename Codec::value_type> &&
      (!is_ternary || stream_ordered_for<Comm, Exec, std::uint64_t>);

  static_assert(codec_traits<Codec>::is_identity || is_cast_codec_v<base_codec> || is_ternary,
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

 protected:
  using workspace_buffers = device_workspace<Codec, Comm, Exec, stream_ordered>;

  device_backend(Comm comm, param_layout layout, Codec codec, compactor_t compactor,
                 sync_options opt, stream_type stream)
      : flow(std::move(comm), std::move(layout), std::move(codec), std::move(compactor), opt),
        home_(stream),
        io_(this->layout_, stream),
        verdicts_(this->layout_.buckets().size(), stream) {}

  device_backend(const device_backend&) = delete;
  device_backend& operator=(const device_backend&) = delete;
  /// Waits for the last step (its kernels use the plans and payload freed here), even when
  /// the stream it ran on has been destroyed since.
  ~device_backend() { step_done_.wait_noexcept(); }

  const Exec& exec() const noexcept { return this->compactor_.exec(); }

  // --- commit hooks (see detail/sync/commit.hpp) ---

  plan_type build_plan(const Mask& m) { return this->compactor_.make_plan(m, home_); }
  // May throw: runs before the agreement, so a failure reaches every rank. The last step may
  // still use the old plans and payload: let it finish, and let the new plans be built,
  // before the swap.
  workspace_buffers allocate_workspace(const workspace_layout& w,
                                       std::span<const plan_type> plans) {
    step_done_.wait();
    exec().synchronize(home_);
    auto n = workspace_buffers::allocate(exec(), this->codec_, this->feedback, this->layout_, w,
                                         plans, home_);
    exec().synchronize(home_);  // the buffers exist for every stream
    return n;
  }
  void install_workspace(workspace_buffers&& n) noexcept { bufs_ = std::move(n); }

  const workspace_layout& ws() const noexcept { return this->workspace_; }
  std::span<value_type> bucket_payload(std::size_t b) { return bufs_.bucket_payload(ws(), b); }
  std::span<wire_type> bucket_wire(std::size_t b) { return bufs_.bucket_wire(ws(), b); }

  // Gathers sparse bucket b's payload (a codec's encode fused in where the bucket is coded);
  // a dense bucket's tensors are copied into its region if they are not in place, and a
  // coded one is encoded whole, its pruned entries zeroed first.
  void gather_one(std::size_t b) {
    const auto& bk = this->layout_.buckets()[b];
    const bool plain = this->plain(b);
    const bool sparse = this->route(b).sparse;
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
          bk.size, encode_op<value_type, wire_type>{io_.region(b), bucket_wire(b).data()}, stream_);
    }
  }

  // Bucket b's collective: queued on the step's stream (stream-ordered communicators), or
  // started and left in flight until flush waits (host communicators).
  void reduce_one(std::size_t b) {
    const auto& bk = this->layout_.buckets()[b];
    auto& c = this->comm_;
    if (!this->plain(b)) {
      bufs_.collectives.sum(c, bucket_wire(b), stream_, current_.stats());
    } else if (this->route(b).sparse) {
      bufs_.collectives.sum(c, bucket_payload(b), stream_, current_.stats());
    } else {
      bufs_.collectives.sum(c, std::span<value_type>(io_.region(b), bk.size), stream_,
                            current_.stats());
    }
  }

  // Bucket b's mean, +0 at pruned entries. A coded dense bucket is decoded in place (pruned
  // entries were sent as +0 by every rank, so they come back +0); a sparse one is scattered
  // with the decode fused in.
  void expand_one(std::size_t b, value_type factor) {
    const auto& bk = this->layout_.buckets()[b];
    const bool plain = this->plain(b);
    if (this->route(b).sparse) {
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
            bk.size, decode_op<value_type, wire_type>{bucket_wire(b).data(), io_.region(b), factor},
            stream_);
      }
    } else {
      expand_dense_bucket(b, factor);
    }
    io_.stage_out(exec(), this->layout_, b, stream_);
  }

  value_type factor_of_plain() const {
    return value_type(1) / static_cast<value_type>(this->comm_.size());
  }
  // A sparse bucket kept for a fused update: its payload as the update reads it (a plain
  // bucket's sum, the mean elsewhere).
  void hold_payload(std::size_t b, value_type factor) {
    if (this->plain(b)) return;
    if constexpr (is_ternary) {
      decode_ternary(b);
    } else {
      const auto p = bucket_payload(b);
      exec().for_each(p.size(),
                      decode_op<value_type, wire_type>{bucket_wire(b).data(), p.data(), factor},
                      stream_);
    }
  }
  // --- ternary_codec (see device_ternary.hpp) ---

  // A coded bucket with codec input: it needs scales.
  bool scaled(std::size_t b) const { return this->route(b).scaled; }
  // Bucket b's codec input: its gathered payload (sparse) or its dense region.
  value_type* codec_input(std::size_t b) {
    return this->route(b).sparse ? bucket_payload(b).data() : io_.region(b);
  }
  std::size_t codec_input_size(std::size_t b) const { return ws().codec_input_of(b); }
  codec_context context(std::size_t b) const noexcept {
    return {
        .rank = this->comm_.rank(), .size = this->comm_.size(), .step = this->step_, .bucket = b};
  }
  void encode_one(std::size_t b) {
    bufs_.ternary.encode(exec(), this->codec_, context(b), codec_input(b), codec_input_size(b),
                         ws().codec_input[b], bucket_wire(b).data(), stream_);
  }
  [[nodiscard]] bool reusing() const noexcept {
    if constexpr (is_ternary) return bufs_.ternary.reusing();
    return false;
  }
  // The mean into the codec input's place (NaN where a scale is not finite).
  void decode_ternary(std::size_t b) {
    if (!scaled(b)) return;
    bufs_.ternary.decode(exec(), this->codec_, this->comm_.size(), b, bucket_wire(b).data(),
                         codec_input(b), codec_input_size(b), stream_);
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
      exec().for_each(bk.size, times_op<value_type>{d, d, factor}, stream_);
      return;
    }
    const auto region = io_.region_source(this->layout_, b);
    bufs_.buckets.gather(exec(), b, region, bucket_payload(b).data(), stream_);
    bufs_.buckets.scatter(exec(), b, bucket_payload(b).data(), region, {}, factor, stream_);
  }

  stream_type home_{};                 // plans and payload are allocated and freed here
  device_grads<value_type, Exec> io_;  // the gradients of the open step
  typename Exec::event step_done_;     // the end of the last step
  workspace_buffers bufs_;             // of the last commit
  typename Exec::template buffer<std::uint64_t> verdicts_;  // per bucket: the deferred verdict
  std::vector<std::uint64_t> verdicts_host_;
  step_state current_;    // the open step
  stream_type stream_{};  // its stream
};

}  // namespace pactrain::detail
