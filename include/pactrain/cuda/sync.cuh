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
// The mask tracker's few uint64 words travel from host memory (the communicator accepts
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
#include <pactrain/communicator.hpp>
#include <pactrain/cuda/compactor.cuh>
#include <pactrain/cuda/detail/compactor_kernels.cuh>
#include <pactrain/detail/agreement.hpp>
#include <pactrain/detail/cuda_runtime.hpp>
#include <pactrain/error.hpp>
#include <pactrain/layout.hpp>
#include <pactrain/mask.hpp>
#include <pactrain/sync.hpp>

#include <cuda/stream_ref>

#include <chrono>
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

/// The sync engine over device gradient buffers (see the top of this file). Same shape as
/// the host engine: constructor, set_masks, reject_masks, set_strategies are collective and
/// checked across ranks; allreduce takes the flat buffer of all tensors (device memory,
/// layout().total_size() entries). Its stream is the last argument; allreduce_async never
/// synchronises, allreduce synchronises the stream before returning.
///
/// Steps on different streams are ordered by the engine (the new stream waits for the
/// previous step, without blocking the host). set_masks and set_strategies wait for the last
/// step and build the new plans before returning. Not copyable or movable.
template <gradient_mask Mask, communicator Comm, class Codec, class Feedback>
class sync<Mask, cuda_compactor, Comm, Codec, Feedback> {
  static_assert(gradient_codec<Codec>,
                "pactrain::sync: Codec must model gradient_codec (value_type, wire_type, "
                "codec_traits)");
  static_assert(codec_traits<Codec>::is_linear,
                "pactrain::sync: a compacted allreduce sums encoded payloads, which is correct "
                "only for codecs that are linear under summation (codec_traits<Codec>::is_linear)");
  static_assert(codec_traits<Codec>::is_identity || detail::is_cast_codec_v<Codec>,
                "pactrain::sync on device buffers (cuda_compactor) supports identity_codec, "
                "fp16_codec and bf16_codec so far; use the host engine (host_compactor) for "
                "ternary_codec");
  static_assert(codec_traits<Codec>::is_identity || !Feedback::enabled,
                "pactrain::sync on device buffers has no error feedback yet (use no_feedback)");
  static_assert(feedback_policy<Feedback>,
                "pactrain::sync: Feedback must be no_feedback or error_feedback (feedback_policy)");
  static_assert(compactor_for<cuda_compactor, Mask, typename Codec::value_type>,
                "pactrain::sync: cuda_compactor must handle Mask and the codec's value_type");
  static_assert(stream_ordered_communicator<Comm, typename Codec::wire_type>,
                "pactrain::sync on device buffers needs a stream-ordered communicator "
                "(nccl_communicator, mpi_cuda_communicator): allreduce_async(span, op, "
                "cudaStream_t)");

 public:
  using mask_type = Mask;
  using compactor_type = cuda_compactor;
  using communicator_type = Comm;
  using codec_type = Codec;
  using feedback_type = Feedback;
  using value_type = typename Codec::value_type;
  using wire_type = typename Codec::wire_type;
  using plan_type = cuda_compactor::plan_type;

  /// Collective: checks that all ranks hold the same layout and starts with every entry
  /// kept. Plans and the payload live on `stream` (it must outlive the engine); the
  /// constructor synchronises it.
  sync(Comm comm, param_layout layout, cuda_compactor compactor = {}, sync_options opt = {},
       Codec codec = {}, cuda::stream_ref stream = {})
      : comm_(std::move(comm)),
        layout_(std::move(layout)),
        compactor_(std::move(compactor)),
        codec_(std::move(codec)),
        strategies_(layout_.buckets().size(), opt.strategy),
        home_(stream.get()),
        last_(stream.get()) {
    std::vector<Mask> full;
    full.reserve(layout_.tensor_count());
    for (const auto& t : layout_.tensors()) full.push_back(Mask::full(t.size));
    commit(std::move(full), strategies_, "sync");
  }

  sync(const sync&) = delete;
  sync& operator=(const sync&) = delete;
  /// Waits for the last step (its kernels use the plans and payload freed here).
  ~sync() {
    (void)cudaStreamSynchronize(last_);
    if (step_event_ != nullptr) (void)cudaEventDestroy(step_event_);
  }

  /// Collective: replaces the masks (one per tensor, in layout order) after checking that
  /// every rank gives the same ones, and rebuilds the plans on the device. On disagreement or
  /// bad input on any rank every rank throws the same pactrain::error; the previous masks
  /// stay in force.
  void set_masks(std::vector<Mask> masks) { commit(std::move(masks), strategies_, "set_masks"); }

  /// Collective: the counterpart of set_masks for a rank that could not produce its masks;
  /// every rank throws the same pactrain::error naming this rank and `reason`.
  [[noreturn]] void reject_masks(std::string reason) {
    if (reason.empty()) reason = "no reason given";
    detail::agreement_input in;
    in.layout = &layout_;
    in.operation = "set_masks";
    in.local_error = std::move(reason);
    detail::agree(comm_, in);
    PACTRAIN_FAIL("set_masks: rejected");  // not reached: agree throws
  }

  /// Collective: the strategy of every bucket (one per bucket), checked across ranks.
  void set_strategies(std::vector<bucket_strategy> s) {
    commit(masks_, std::move(s), "set_strategies");
  }

  /// Averages `grads` (device memory, the flat buffer of all tensors) across ranks in place,
  /// queued on `stream`; pruned entries come back as +0. Never synchronises. Bad input
  /// throws pactrain::error before anything is queued.
  void allreduce_async(std::span<value_type> grads, cuda::stream_ref stream = {}) {
    PACTRAIN_EXPECTS(grads.size() == layout_.total_size(),
                     "sync::allreduce: buffer has " + std::to_string(grads.size()) +
                         " entries, the layout " + std::to_string(layout_.total_size()));
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

  [[nodiscard]] const param_layout& layout() const noexcept { return layout_; }
  [[nodiscard]] const std::vector<Mask>& masks() const noexcept { return masks_; }
  [[nodiscard]] const plan_type& plan(std::size_t tensor) const { return plans_.at(tensor); }
  [[nodiscard]] const std::vector<bucket_strategy>& strategies() const noexcept {
    return strategies_;
  }
  /// Payload entries sent for bucket b under the sparse strategy.
  [[nodiscard]] std::size_t payload_size(std::size_t b) const { return bucket_payload_.at(b); }
  [[nodiscard]] const Codec& codec() const noexcept { return codec_; }
  [[nodiscard]] std::uint64_t step() const noexcept { return step_; }
  /// What the last step did. The *_seconds fields are host time spent queueing each phase
  /// (the device work is asynchronous); total_seconds likewise, plus the final
  /// synchronisation of allreduce().
  [[nodiscard]] const sync_stats& stats() const noexcept { return stats_; }
  [[nodiscard]] Comm& get_communicator() noexcept { return comm_; }
  [[nodiscard]] const cuda_compactor& compactor() const noexcept { return compactor_; }

 private:
  using clock = std::chrono::steady_clock;
  static constexpr bool is_identity = codec_traits<Codec>::is_identity;
  // allreduce_async checked the gradient buffer once; the payload is the engine's own.
  static constexpr detail::device_buffers_checked checked{};

  static double seconds_since(clock::time_point t0) {
    return std::chrono::duration<double>(clock::now() - t0).count();
  }

  void commit(std::vector<Mask> masks, std::vector<bucket_strategy> strategies, const char* op) {
    detail::agreement_input in;
    in.layout = &layout_;
    in.operation = op;
    std::vector<std::uint64_t> digests;
    std::vector<plan_type> plans;
    try {
      detail::check_commit_sizes(layout_, masks, strategies.size());
      for (auto st : strategies) {
        PACTRAIN_EXPECTS(st == bucket_strategy::sparse || st == bucket_strategy::dense,
                         std::string("strategy ") + to_string(st) +
                             ": the CUDA engine runs the sparse and dense strategies only");
      }
      digests.reserve(masks.size());
      plans.reserve(masks.size());
      for (const auto& m : masks) {
        digests.push_back(m.digest());
        plans.push_back(compactor_.make_plan(m, home_));
      }
      codec_.validate(comm_.size());
    } catch (const std::exception& e) {  // cuda_error and bad_alloc too: never leave peers waiting
      in.local_error = e.what();
    }
    digest_builder cd(0x73747261);  // "stra"
    for (auto s : strategies) cd.add(static_cast<std::uint64_t>(s));
    in.config_digest = cd.value();
    if constexpr (requires { codec_.digest(); }) in.codec_digest = codec_.digest();
    in.mask_digests = digests;
    detail::agree(comm_, in);

    // Everyone agrees. The last step may still use the old plans and payload: let it finish,
    // and let the new plans be built, before swapping.
    PACTRAIN_CUDA_TRY(cudaStreamSynchronize(last_));
    PACTRAIN_CUDA_TRY(cudaStreamSynchronize(home_));
    const std::size_t nb = layout_.buckets().size();
    std::vector<std::size_t> offset(masks.size());
    std::vector<std::size_t> start(nb);
    std::vector<std::size_t> per_bucket(nb, 0);
    std::size_t total = 0;
    for (std::size_t b = 0; b < nb; ++b) {
      const auto& bk = layout_.buckets()[b];
      start[b] = total;
      for (std::size_t i = bk.first_tensor; i < bk.first_tensor + bk.tensor_count; ++i) {
        offset[i] = total;
        total += plans[i].count();
        per_bucket[b] += plans[i].count();
      }
    }
    // Codecs: wire elements bucket by bucket, one per codec input (the sparse payload or the
    // whole dense bucket).
    std::vector<std::size_t> wire_offset(nb + 1, 0);
    if constexpr (!is_identity) {
      for (std::size_t b = 0; b < nb; ++b) {
        const std::size_t in =
            strategies[b] == bucket_strategy::sparse ? per_bucket[b] : layout_.buckets()[b].size;
        wire_offset[b + 1] = wire_offset[b] + codec_.wire_size(in, comm_.size());
      }
    }
    detail::device_buffer<value_type> payload(total, home_);
    detail::device_buffer<wire_type> wire(is_identity ? 0 : wire_offset[nb], home_);
    PACTRAIN_CUDA_TRY(cudaStreamSynchronize(home_));  // the buffers exist for every stream
    payload_ = std::move(payload);
    wire_ = std::move(wire);
    wire_offset_ = std::move(wire_offset);
    masks_ = std::move(masks);
    plans_ = std::move(plans);
    strategies_ = std::move(strategies);
    tensor_payload_offset_ = std::move(offset);
    bucket_start_ = std::move(start);
    bucket_payload_ = std::move(per_bucket);
  }

  std::span<value_type> tensor_payload(std::size_t i) {
    return {payload_.data() + tensor_payload_offset_[i], plans_[i].count()};
  }

  // Codecs: the wire elements of sparse bucket b's tensor i (one per kept entry), and of
  // bucket b.
  std::span<wire_type> tensor_wire(std::size_t b, std::size_t i) {
    return {wire_.data() + wire_offset_[b] + (tensor_payload_offset_[i] - bucket_start_[b]),
            plans_[i].count()};
  }
  std::span<wire_type> bucket_wire(std::size_t b) {
    return {wire_.data() + wire_offset_[b], wire_offset_[b + 1] - wire_offset_[b]};
  }

  // Orders this step after the previous one when it ran on another stream (the payload is
  // shared), without blocking the host.
  void follow_previous_step(cudaStream_t stream) {
    if (stream == last_ || step_ == 0) return;
    if (step_event_ == nullptr) {
      PACTRAIN_CUDA_TRY(cudaEventCreateWithFlags(&step_event_, cudaEventDisableTiming));
    }
    PACTRAIN_CUDA_TRY(cudaEventRecord(step_event_, last_));
    PACTRAIN_CUDA_TRY(cudaStreamWaitEvent(stream, step_event_, 0));
  }

  void run(std::span<value_type> grads, cudaStream_t stream) {
    const auto& buckets = layout_.buckets();
    const auto& tensors = layout_.tensors();
    sync_stats s = stats_;
    s.collectives = 0;
    s.bytes_sent = 0;
    s.dense_bytes = 0;
    s.gather_seconds = s.allreduce_seconds = s.scatter_seconds = 0;
    for (const auto& bk : buckets) s.dense_bytes += bk.size * sizeof(value_type);
    const auto step_start = clock::now();
    follow_previous_step(stream);
    last_ = stream;
    const value_type scale = value_type(1) / static_cast<value_type>(comm_.size());
    const auto dense_of = [&](std::size_t i) {
      return grads.subspan(tensors[i].offset, tensors[i].size);
    };

    // Gather every sparse bucket's payload (a codec's encode fused in); a codec also encodes
    // each dense bucket, its pruned entries zeroed first.
    auto t0 = clock::now();
    for (std::size_t b = 0; b < buckets.size(); ++b) {
      const auto& bk = buckets[b];
      if (strategies_[b] == bucket_strategy::sparse) {
        for (std::size_t i = bk.first_tensor; i < bk.first_tensor + bk.tensor_count; ++i) {
          const std::span<const value_type> d(dense_of(i));
          if constexpr (is_identity) {
            compactor_.gather_async(plans_[i], d, tensor_payload(i), stream, checked);
          } else {
            compactor_.gather_async(plans_[i], d, tensor_wire(b, i), stream, checked);
          }
        }
      } else if constexpr (!is_identity) {
        if (bk.size == 0) continue;
        for (std::size_t i = bk.first_tensor; i < bk.first_tensor + bk.tensor_count; ++i) {
          if (plans_[i].count() != plans_[i].size()) expand_dense(i, dense_of(i), 1, stream);
        }
        const auto region = grads.subspan(bk.offset, bk.size);
        detail::encode_kernel<value_type, wire_type>
            <<<detail::grid_for(bk.size), detail::kernel_block, 0, stream>>>(
                region.data(), bucket_wire(b).data(), bk.size);
        PACTRAIN_CUDA_TRY(cudaGetLastError());
      }
    }
    s.gather_seconds = seconds_since(t0);

    // One collective per bucket, launched together where the communicator can group them.
    t0 = clock::now();
    constexpr bool groups = requires(Comm & c) {
      c.group_start();
      c.group_end();
    };
    if constexpr (groups) comm_.group_start();
    try {
      for (std::size_t b = 0; b < buckets.size(); ++b) {
        std::span<wire_type> region;
        if constexpr (is_identity) {
          region =
              strategies_[b] == bucket_strategy::sparse
                  ? std::span<value_type>(payload_.data() + bucket_start_[b], bucket_payload_[b])
                  : grads.subspan(buckets[b].offset, buckets[b].size);
        } else {
          region = bucket_wire(b);
        }
        if (region.empty()) continue;  // nothing kept: the same on every rank
        (void)comm_.allreduce_async(region, reduce_op::sum, stream);
        ++s.collectives;
        s.bytes_sent += region.size_bytes();
      }
    } catch (...) {
      if constexpr (groups) {
        try {
          comm_.group_end();
        } catch (...) {  // the first error is the one to report
        }
      }
      throw;
    }
    if constexpr (groups) comm_.group_end();
    s.allreduce_seconds = seconds_since(t0);

    // Expand: the mean, +0 at pruned entries. A codec decodes each dense bucket in place
    // (pruned entries were sent as +0 by every rank, so they come back +0).
    t0 = clock::now();
    for (std::size_t b = 0; b < buckets.size(); ++b) {
      const auto& bk = buckets[b];
      if constexpr (!is_identity) {
        if (strategies_[b] != bucket_strategy::sparse && bk.size != 0) {
          detail::decode_kernel<value_type, wire_type>
              <<<detail::grid_for(bk.size), detail::kernel_block, 0, stream>>>(
                  bucket_wire(b).data(), grads.data() + bk.offset, bk.size, scale);
          PACTRAIN_CUDA_TRY(cudaGetLastError());
        }
      }
      for (std::size_t i = bk.first_tensor; i < bk.first_tensor + bk.tensor_count; ++i) {
        if (strategies_[b] != bucket_strategy::sparse) {
          if constexpr (is_identity) expand_dense(i, dense_of(i), scale, stream);
        } else if constexpr (is_identity) {
          compactor_.scatter_async(plans_[i], std::span<const value_type>(tensor_payload(i)),
                                   dense_of(i), scale, stream, checked);
        } else {  // decode (the mean) fused into the scatter
          compactor_.scatter_async(plans_[i], std::span<const wire_type>(tensor_wire(b, i)),
                                   dense_of(i), scale, stream, checked);
        }
      }
    }
    s.scatter_seconds = seconds_since(t0);

    ++step_;
    ++s.steps;
    s.total_bytes_sent += s.bytes_sent;
    s.total_seconds += seconds_since(step_start);
    stats_ = s;
  }

  // A reduced dense tensor in place: times scale at kept entries, +0 elsewhere.
  void expand_dense(std::size_t i, std::span<value_type> d, value_type scale, cudaStream_t stream) {
    if (d.empty()) return;
    if (plans_[i].count() == plans_[i].size()) {
      if (scale == value_type(1)) return;
      detail::scale_kernel<value_type>
          <<<detail::grid_for(d.size()), detail::kernel_block, 0, stream>>>(d.data(), d.data(),
                                                                            d.size(), scale);
      PACTRAIN_CUDA_TRY(cudaGetLastError());
      return;
    }
    compactor_.gather_async(plans_[i], std::span<const value_type>(d), tensor_payload(i), stream,
                            checked);
    compactor_.scatter_async(plans_[i], std::span<const value_type>(tensor_payload(i)), d, scale,
                             stream, checked);
  }

  Comm comm_;
  param_layout layout_;
  cuda_compactor compactor_;
  Codec codec_;
  std::vector<bucket_strategy> strategies_;
  cudaStream_t home_ = nullptr;  // plans and payload are allocated and freed here
  cudaStream_t last_ = nullptr;  // the stream of the last step
  cudaEvent_t step_event_ = nullptr;
  std::vector<Mask> masks_;
  std::vector<plan_type> plans_;
  std::vector<std::size_t> tensor_payload_offset_;
  std::vector<std::size_t> bucket_start_;
  std::vector<std::size_t> bucket_payload_;
  detail::device_buffer<value_type> payload_;
  detail::device_buffer<wire_type> wire_;  // codecs only
  std::vector<std::size_t> wire_offset_;   // wire elements before bucket b
  sync_stats stats_;
  std::uint64_t step_ = 0;
};

}  // namespace pactrain
