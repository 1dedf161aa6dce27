// pactrain::sync on device buffers: the same engine, specialised for cuda_compactor.
//
//   ncclComm_t nccl = ...;                         // the user's, one rank per GPU
//   using sync_t = pactrain::sync<pactrain::bitmap_mask, pactrain::cuda_compactor,
//                                 pactrain::nccl_communicator>;
//   sync_t sync{pactrain::nccl_communicator{nccl, stream}, layout};  // collective
//   sync.set_masks(masks);                         // collective; checked across ranks
//   sync.allreduce_async(device_grads, stream);    // queued on stream; averaged, +0 pruned
//
// Per step and bucket, all queued on the caller's stream and never synchronised:
// gather the kept entries (sparse) into the payload, allreduce (SUM) the payloads or the whole
// dense buckets -- grouped into one NCCL launch where the communicator offers
// group_start/group_end -- then scatter with the 1/P scale fused in (+0 at pruned entries).
//
// The communicator must be stream-ordered on device buffers: after
// allreduce_async(span, op, stream) returns, work queued later on `stream` sees the result
// (nccl_communicator queues it there; mpi_cuda_communicator completes it before returning).
// The agreement's few uint64 words travel from host memory (the communicator accepts
// host spans for them).
//
// Codecs: identity_codec<float|double>, and fp16_codec/bf16_codec with the rounding fused into
// the gather and the widening and 1/P into the scatter (dense buckets: an encode and a decode
// kernel), bit for bit as the host engine. ternary_codec and error feedback run on the host
// engine only.
#pragma once

#if !defined(__CUDACC__)
#error "pactrain/cuda/sync.cuh needs nvcc (CUDA); host-only code includes <pactrain/pactrain.hpp>"
#endif

#include <pactrain/codec.hpp>
#include <pactrain/codec/half_cast.hpp>
#include <pactrain/communicator.hpp>
#include <pactrain/cuda/compactor.cuh>
#include <pactrain/cuda/detail/compactor_kernels.cuh>
#include <pactrain/detail/agreement.hpp>
#include <pactrain/detail/cuda_runtime.hpp>
#include <pactrain/detail/sync/core.hpp>
#include <pactrain/error.hpp>
#include <pactrain/layout.hpp>
#include <pactrain/mask.hpp>
#include <pactrain/sync.hpp>

#include <cuda/stream_ref>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace pactrain {

namespace detail {
template <class Codec>
inline constexpr bool is_cast_codec_v = false;
template <half_value Wire>
inline constexpr bool is_cast_codec_v<cast_codec<Wire>> = true;
}  // namespace detail

/// A communicator that can reduce device buffers of T in stream order (see the top of this
/// file): nccl_communicator, mpi_cuda_communicator.
template <class C, class T>
concept stream_ordered_communicator = communicator<C> &&
    requires(C& c, std::span<T> d, cudaStream_t s) {
  c.allreduce_async(d, reduce_op::sum, s);
};

/// The sync engine over device gradient buffers (see the top of this file), with the host
/// engine's collective, cross-checked configuration calls. Steps on different streams run in
/// call order without blocking the host. Not copyable or movable.
template <gradient_mask Mask, communicator Comm, class Codec, class Feedback>
class sync<Mask, cuda_compactor, Comm, Codec, Feedback>
    : public detail::sync_core<sync<Mask, cuda_compactor, Comm, Codec, Feedback>, Mask,
                               cuda_compactor, Comm, Codec, Feedback> {
  using core = detail::sync_core<sync, Mask, cuda_compactor, Comm, Codec, Feedback>;
  friend core;
  static constexpr bool checked_supported = false;  // sync_options::checked: host engine only

  static_assert(codec_traits<Codec>::is_identity || detail::is_cast_codec_v<Codec>,
                "pactrain::sync on device buffers (cuda_compactor) supports identity_codec, "
                "fp16_codec and bf16_codec so far; use the host engine (host_compactor) for "
                "ternary_codec");
  static_assert(codec_traits<Codec>::is_identity || !Feedback::enabled,
                "pactrain::sync on device buffers has no error feedback yet (use no_feedback)");
  static_assert(stream_ordered_communicator<Comm, typename Codec::wire_type>,
                "pactrain::sync on device buffers needs a stream-ordered communicator "
                "(nccl_communicator, mpi_cuda_communicator): allreduce_async(span, op, "
                "cudaStream_t)");

 public:
  using typename core::plan_type;
  using typename core::value_type;
  using typename core::wire_type;

  /// Collective: checks that all ranks hold the same layout and starts with every entry
  /// kept. Plans and the payload live on `stream` (it must outlive the engine); the
  /// constructor synchronises it.
  sync(Comm comm, param_layout layout, cuda_compactor compactor = {}, sync_options opt = {},
       Codec codec = {}, cuda::stream_ref stream = {})
      : core(std::move(comm), std::move(layout), std::move(compactor), opt, std::move(codec)),
        home_(stream.get()),
        last_(stream.get()) {
    this->commit_full("sync");
  }

  /// The same, with the default compactor and codec: sync{comm, layout, stream}.
  sync(Comm comm, param_layout layout, cuda::stream_ref stream, sync_options opt = {})
      : sync(std::move(comm), std::move(layout), cuda_compactor{}, opt, Codec{}, stream) {}

  sync(const sync&) = delete;
  sync& operator=(const sync&) = delete;
  /// Waits for the last step (its kernels use the plans and payload freed here).
  ~sync() {
    (void)cudaStreamSynchronize(last_);
    if (step_event_ != nullptr) (void)cudaEventDestroy(step_event_);
  }

  /// Collective, as on the host engine (sync.hpp); set_masks and set_strategies wait for the
  /// last step and build the new plans before returning. On bad input or disagreement on any
  /// rank, every rank throws the same pactrain::error and nothing changes.
  using core::reject_masks;
  using core::set_masks;
  using core::set_strategies;

  /// Averages `grads` (device memory, the flat buffer of all tensors) across ranks in place,
  /// queued on `stream`; pruned entries come back as +0. Never synchronises. Bad input
  /// throws pactrain::error before anything is queued.
  void allreduce_async(std::span<value_type> grads, cuda::stream_ref stream = {}) {
    PACTRAIN_EXPECTS(grads.size() == this->layout_.total_size(),
                     "sync::allreduce: buffer has " + std::to_string(grads.size()) +
                         " entries, the layout " + std::to_string(this->layout_.total_size()));
    detail::expect_device_buffer(grads.data(), grads.size(), "sync::allreduce: ", "gradient");
    run(grads, stream.get());
  }

  /// allreduce_async, then synchronises `stream`.
  void allreduce(std::span<value_type> grads, cuda::stream_ref stream = {}) {
    allreduce_async(grads, stream);
    PACTRAIN_CUDA_TRY(cudaStreamSynchronize(stream.get()));
  }

  /// As above for a pointer and a size.
  void allreduce(value_type* data, std::size_t n, cuda::stream_ref stream = {}) {
    PACTRAIN_EXPECTS(data != nullptr || n == 0,
                     "sync::allreduce: null buffer with " + std::to_string(n) + " entries");
    allreduce(std::span<value_type>(data, n), stream);
  }

 private:
  // allreduce_async checked the gradient buffer once; the payload is the engine's own.
  static constexpr detail::device_buffers_checked checked{};
  using core::is_identity;

  // --- commit hooks (see detail/sync/core.hpp) ---

  void check_commit(const char*) const noexcept {}
  static void check_strategy(bucket_strategy st) {
    PACTRAIN_EXPECTS(st == bucket_strategy::sparse || st == bucket_strategy::dense,
                     std::string("strategy ") + to_string(st) +
                         ": the CUDA engine runs the sparse and dense strategies only");
  }
  plan_type build_plan(const Mask& m) { return this->compactor_.make_plan(m, home_); }
  // The last step may still use the old plans and payload: let it finish, and let the new
  // plans be built, before the swap.
  struct workspace_buffers {
    detail::device_buffer<value_type> payload;
    detail::device_buffer<wire_type> wire;
  };
  // May throw: runs before the agreement, so a failure reaches every rank.
  workspace_buffers allocate_workspace(const detail::workspace_layout& w) {
    PACTRAIN_CUDA_TRY(cudaStreamSynchronize(last_));
    PACTRAIN_CUDA_TRY(cudaStreamSynchronize(home_));
    workspace_buffers n{detail::device_buffer<value_type>(w.payload_size(), home_),
                        detail::device_buffer<wire_type>(is_identity ? 0 : w.wire_size(), home_)};
    PACTRAIN_CUDA_TRY(cudaStreamSynchronize(home_));  // the buffers exist for every stream
    return n;
  }
  void install_workspace(workspace_buffers&& n) noexcept {
    payload_ = std::move(n.payload);
    wire_ = std::move(n.wire);
  }

  const detail::workspace_layout& ws() const noexcept { return this->workspace_; }
  std::span<value_type> tensor_payload(std::size_t i) {
    return {payload_.data() + ws().tensor_payload[i], this->plans_[i].count()};
  }
  std::span<value_type> bucket_payload(std::size_t b) {
    return {payload_.data() + ws().bucket_payload[b], ws().payload_of(b)};
  }

  // Codecs: the wire elements of sparse bucket b's tensor i (one per kept entry), and of
  // bucket b.
  std::span<wire_type> tensor_wire(std::size_t b, std::size_t i) {
    return {wire_.data() + ws().wire[b] + (ws().tensor_payload[i] - ws().bucket_payload[b]),
            this->plans_[i].count()};
  }
  std::span<wire_type> bucket_wire(std::size_t b) {
    return {wire_.data() + ws().wire[b], ws().wire_of(b)};
  }

  // Orders this step after the previous one when it ran on another stream (the payload is
  // shared), without blocking the host.
  void follow_previous_step(cudaStream_t stream) {
    if (stream == last_ || this->step_ == 0) return;
    if (step_event_ == nullptr) {
      PACTRAIN_CUDA_TRY(cudaEventCreateWithFlags(&step_event_, cudaEventDisableTiming));
    }
    PACTRAIN_CUDA_TRY(cudaEventRecord(step_event_, last_));
    PACTRAIN_CUDA_TRY(cudaStreamWaitEvent(stream, step_event_, 0));
  }

  void run(std::span<value_type> grads, cudaStream_t stream) {
    sync_stats s = this->begin_stats();
    const auto step_start = detail::sync_clock::now();
    follow_previous_step(stream);
    last_ = stream;
    const value_type scale = value_type(1) / static_cast<value_type>(this->comm_.size());
    {
      detail::phase_timer t(s.gather_seconds);
      gather(grads, stream);
    }
    {
      detail::phase_timer t(s.allreduce_seconds);
      reduce(grads, stream, s);
    }
    {
      detail::phase_timer t(s.scatter_seconds);
      expand(grads, scale, stream);
    }
    this->end_step(s, step_start);
  }

  std::span<value_type> dense_of(std::span<value_type> grads, std::size_t i) const {
    const auto& t = this->layout_.tensors()[i];
    return grads.subspan(t.offset, t.size);
  }

  // Gathers every sparse bucket's payload (a codec's encode fused in); a codec also encodes
  // each dense bucket, its pruned entries zeroed first.
  void gather(std::span<value_type> grads, cudaStream_t stream) {
    const auto& buckets = this->layout_.buckets();
    for (std::size_t b = 0; b < buckets.size(); ++b) {
      const auto& bk = buckets[b];
      if (is_sparse(this->strategies_[b])) {
        for (std::size_t i = bk.first_tensor; i < bk.first_tensor + bk.tensor_count; ++i) {
          const std::span<const value_type> d(dense_of(grads, i));
          if constexpr (is_identity) {
            this->compactor_.gather_async(this->plans_[i], d, tensor_payload(i), stream, checked);
          } else {
            this->compactor_.gather_async(this->plans_[i], d, tensor_wire(b, i), stream, checked);
          }
        }
      } else if constexpr (!is_identity) {
        if (bk.size == 0) continue;
        for (std::size_t i = bk.first_tensor; i < bk.first_tensor + bk.tensor_count; ++i) {
          const auto& p = this->plans_[i];
          if (p.count() != p.size()) expand_dense(i, dense_of(grads, i), 1, stream);
        }
        detail::encode_kernel<value_type, wire_type>
            <<<detail::grid_for(bk.size), detail::kernel_block, 0, stream>>>(
                grads.data() + bk.offset, bucket_wire(b).data(), bk.size);
        PACTRAIN_CUDA_TRY(cudaGetLastError());
      }
    }
  }

  // One collective per bucket, launched together where the communicator can group them.
  void reduce(std::span<value_type> grads, cudaStream_t stream, sync_stats& s) {
    constexpr bool groups = requires(Comm & c) {
      c.group_start();
      c.group_end();
    };
    auto& comm = this->comm_;
    const auto& buckets = this->layout_.buckets();
    if constexpr (groups) comm.group_start();
    try {
      for (std::size_t b = 0; b < buckets.size(); ++b) {
        std::span<wire_type> region;
        if constexpr (is_identity) {
          region = is_sparse(this->strategies_[b])
                       ? bucket_payload(b)
                       : grads.subspan(buckets[b].offset, buckets[b].size);
        } else {
          region = bucket_wire(b);
        }
        if (region.empty()) continue;  // nothing kept: the same on every rank
        (void)comm.allreduce_async(region, reduce_op::sum, stream);
        ++s.collectives;
        s.bytes_sent += region.size_bytes();
      }
    } catch (...) {
      if constexpr (groups) {
        try {
          comm.group_end();
        } catch (...) {  // the first error is the one to report
        }
      }
      throw;
    }
    if constexpr (groups) comm.group_end();
  }

  // The mean, +0 at pruned entries. A codec decodes each dense bucket in place (pruned
  // entries were sent as +0 by every rank, so they come back +0).
  void expand(std::span<value_type> grads, value_type scale, cudaStream_t stream) {
    const auto& buckets = this->layout_.buckets();
    for (std::size_t b = 0; b < buckets.size(); ++b) {
      const auto& bk = buckets[b];
      const bool sparse = is_sparse(this->strategies_[b]);
      if constexpr (!is_identity) {
        if (!sparse && bk.size != 0) {
          detail::decode_kernel<value_type, wire_type>
              <<<detail::grid_for(bk.size), detail::kernel_block, 0, stream>>>(
                  bucket_wire(b).data(), grads.data() + bk.offset, bk.size, scale);
          PACTRAIN_CUDA_TRY(cudaGetLastError());
        }
      }
      for (std::size_t i = bk.first_tensor; i < bk.first_tensor + bk.tensor_count; ++i) {
        const auto& p = this->plans_[i];
        if (!sparse) {
          if constexpr (is_identity) expand_dense(i, dense_of(grads, i), scale, stream);
        } else if constexpr (is_identity) {
          this->compactor_.scatter_async(p, std::span<const value_type>(tensor_payload(i)),
                                         dense_of(grads, i), scale, stream, checked);
        } else {  // decode (the mean) fused into the scatter
          this->compactor_.scatter_async(p, std::span<const wire_type>(tensor_wire(b, i)),
                                         dense_of(grads, i), scale, stream, checked);
        }
      }
    }
  }

  // A reduced dense tensor in place: times scale at kept entries, +0 elsewhere.
  void expand_dense(std::size_t i, std::span<value_type> d, value_type scale, cudaStream_t stream) {
    if (d.empty()) return;
    const auto& p = this->plans_[i];
    if (p.count() == p.size()) {
      if (scale == value_type(1)) return;
      detail::scale_kernel<value_type>
          <<<detail::grid_for(d.size()), detail::kernel_block, 0, stream>>>(d.data(), d.data(),
                                                                            d.size(), scale);
      PACTRAIN_CUDA_TRY(cudaGetLastError());
      return;
    }
    this->compactor_.gather_async(p, std::span<const value_type>(d), tensor_payload(i), stream,
                                  checked);
    this->compactor_.scatter_async(p, std::span<const value_type>(tensor_payload(i)), d, scale,
                                   stream, checked);
  }

  cudaStream_t home_ = nullptr;  // plans and payload are allocated and freed here
  cudaStream_t last_ = nullptr;  // the stream of the last step
  cudaEvent_t step_event_ = nullptr;
  detail::device_buffer<value_type> payload_;
  detail::device_buffer<wire_type> wire_;  // codecs only
};

}  // namespace pactrain
