// cuda_compactor: gather and scatter of pruned gradients in device memory.
//
//   pactrain::cuda_compactor c;
//   auto plan = c.make_plan(mask, stream);                  // uploads the mask, builds on the GPU
//   c.gather_async(plan, dense, payload, stream);           // payload[k] = dense[k-th kept]
//   c.scatter_async(plan, payload, dense, 1.0f / P, stream) // dense = payload/P, +0 elsewhere
//
// The same contract as host_compactor (same payload order, +0 at pruned entries, the scale
// applied with one multiply), so its results equal host_compactor's bit for bit. The host
// mask types are the API: make_plan uploads the mask's words (bitmap_mask, block_mask<B>) or
// indices (index_mask) and computes the rank of each word on the device with CUB.
//
// Streams: every operation takes the stream last (default: the default stream). The *_async
// forms never synchronise; gather and scatter synchronise the stream before returning.
// make_plan is stream-ordered: the plan is ready for work queued after it on the same
// stream (use it on another stream only after synchronising). Plans own device memory,
// allocated and freed in stream order on the stream they were built on, which must outlive
// them.
//
// Errors: bad input (wrong sizes, overlapping buffers, null or host pointers where device
// memory is required) throws pactrain::error before anything is launched, and changes
// nothing. A failing CUDA call throws pactrain::cuda_error. Device-side faults surface as a
// cuda_error from a later call on the stream.
#pragma once

#if !defined(__CUDACC__)
#error \
    "pactrain/cuda/compactor.cuh needs nvcc (CUDA); host-only code includes <pactrain/pactrain.hpp>"
#endif

#include <pactrain/compactor.hpp>
#include <pactrain/cuda/detail/compactor_kernels.cuh>
#include <pactrain/detail/cuda_runtime.hpp>
#include <pactrain/error.hpp>
#include <pactrain/mask.hpp>

#include <cub/device/device_scan.cuh>
#include <cuda/stream_ref>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <span>
#include <string>
#include <vector>

namespace pactrain {

namespace detail {
/// Tag for engines that have already checked that their buffers are device memory: the
/// compactor then checks only sizes and overlap, saving a cudaPointerGetAttributes per buffer
/// on every step.
struct device_buffers_checked {};
}  // namespace detail

/// Payload element types of cuda_compactor for T gradients: T itself, or a 16-bit float for
/// float gradients (the fp16/bf16 codecs' encode and decode fused into gather and scatter).
template <class W, class T>
concept device_payload = std::same_as<W, T> ||(std::same_as<T, float>&& half_value<W>);

/// The compactor for buffers in device memory (see the top of this file).
class cuda_compactor {
 public:
  static constexpr memory_space memory = memory_space::device;

  /// A compaction plan for one tensor, in device memory; movable, not copyable. Format bitmap:
  /// one bit per unit() entries (B for block_mask<B>, else 1) and the kept units before each
  /// word; format indices: the kept indices (index_mask).
  class plan_type {
   public:
    plan_type() = default;
    [[nodiscard]] std::size_t size() const noexcept { return size_; }
    [[nodiscard]] std::size_t count() const noexcept { return count_; }
    [[nodiscard]] plan_format format() const noexcept { return format_; }
    /// Entries per mask bit (bitmap format).
    [[nodiscard]] std::size_t unit() const noexcept { return unit_; }
    /// Device arrays, for tests and custom kernels: the mask words, the kept units before
    /// each word (bitmap format) and the kept indices (indices format).
    [[nodiscard]] std::span<const std::uint64_t> device_words() const noexcept {
      return {words_.data(), words_.size()};
    }
    [[nodiscard]] std::span<const std::uint64_t> device_ranks() const noexcept {
      return {ranks_.data(), ranks_.size()};
    }
    [[nodiscard]] std::span<const std::uint64_t> device_indices() const noexcept {
      return {indices_.data(), indices_.size()};
    }

   private:
    friend class cuda_compactor;
    [[nodiscard]] detail::bitmap_view view() const noexcept {
      return {words_.data(), ranks_.data(), size_, unit_};
    }
    std::size_t size_ = 0;
    std::size_t count_ = 0;
    std::size_t unit_ = 1;
    plan_format format_ = plan_format::bitmap;
    detail::device_buffer<std::uint64_t> words_;
    detail::device_buffer<std::uint64_t> ranks_;
    detail::device_buffer<std::uint64_t> indices_;
  };

  /// Builds the plan of `mask` on `stream`, ready for work queued after it there. Does not
  /// synchronise; the host mask may be destroyed as soon as this returns.
  template <gradient_mask Mask>
  [[nodiscard]] plan_type make_plan(const Mask& mask, cuda::stream_ref stream = {}) const {
    plan_type p;
    p.size_ = mask.size();
    p.count_ = mask.count();
    const cudaStream_t s = stream.get();
    if constexpr (Mask::kind == mask_kind::index) {
      p.format_ = plan_format::indices;
      upload(p.indices_, mask.indices(), s);
    } else {
      p.format_ = plan_format::bitmap;
      if constexpr (Mask::kind == mask_kind::block) {
        p.unit_ = Mask::block_size;
        upload(p.words_, mask.blocks().words(), s);
      } else if constexpr (requires { mask.words(); }) {
        upload(p.words_, mask.words(), s);
      } else {  // any other representation: its canonical words
        std::vector<std::uint64_t> w;
        w.reserve(detail::words_for(mask.size()));
        detail::for_each_word(mask, [&](std::uint64_t x) { w.push_back(x); });
        upload(p.words_, std::span<const std::uint64_t>(w), s);
      }
      build_ranks(p, s);
    }
    return p;
  }

  /// payload[k] = dense[k-th kept index], queued on `stream`; never synchronises. Throws
  /// pactrain::error, launching nothing, unless the sizes fit the plan and both buffers are
  /// disjoint device memory. A half or bfloat16 payload gets each value rounded to nearest even.
  template <gradient_value T, class W>
  requires device_payload<W, T>
  void gather_async(const plan_type& plan, std::span<const T> dense, std::span<W> payload,
                    cuda::stream_ref stream = {}) const {
    check_buffers(plan, dense.data(), dense.size(), payload.data(), payload.size(), "gather");
    check_memory(dense.data(), dense.size(), payload.data(), payload.size(),
                 "cuda_compactor::gather: ");
    gather_async(plan, dense, payload, stream, detail::device_buffers_checked{});
  }
  /// As above, for callers that have checked that the buffers are device memory.
  template <gradient_value T, class W>
  requires device_payload<W, T>
  void gather_async(const plan_type& plan, std::span<const T> dense, std::span<W> payload,
                    cuda::stream_ref stream, detail::device_buffers_checked) const {
    check_buffers(plan, dense.data(), dense.size(), payload.data(), payload.size(), "gather");
    if (plan.count_ == 0) return;
    const cudaStream_t s = stream.get();
    if (plan.format_ == plan_format::indices) {
      detail::gather_indices_kernel<T, W>
          <<<detail::grid_for(plan.count_), detail::kernel_block, 0, s>>>(
              plan.indices_.data(), plan.count_, dense.data(), payload.data());
    } else {
      detail::gather_bitmap_kernel<T, W>
          <<<detail::grid_for((plan.size_ + 3) / 4), detail::kernel_block, 0, s>>>(
              plan.view(), dense.data(), payload.data(), aligned(dense.data()));
    }
    PACTRAIN_CUDA_TRY(cudaGetLastError());
  }

  /// dense[i] = scale * payload[rank(i)] at kept entries, +0 at pruned ones (every entry is
  /// written), queued on `stream`; never synchronises. Preconditions as for gather_async. A
  /// half or bfloat16 payload is widened exactly before the multiply.
  template <gradient_value T, class W>
  requires device_payload<W, T>
  void scatter_async(const plan_type& plan, std::span<const W> payload, std::span<T> dense, T scale,
                     cuda::stream_ref stream = {}) const {
    check_buffers(plan, dense.data(), dense.size(), payload.data(), payload.size(), "scatter");
    check_memory(dense.data(), dense.size(), payload.data(), payload.size(),
                 "cuda_compactor::scatter: ");
    scatter_async(plan, payload, dense, scale, stream, detail::device_buffers_checked{});
  }
  /// As above, for callers that have checked that the buffers are device memory.
  template <gradient_value T, class W>
  requires device_payload<W, T>
  void scatter_async(const plan_type& plan, std::span<const W> payload, std::span<T> dense, T scale,
                     cuda::stream_ref stream, detail::device_buffers_checked) const {
    check_buffers(plan, dense.data(), dense.size(), payload.data(), payload.size(), "scatter");
    if (plan.size_ == 0) return;
    const cudaStream_t s = stream.get();
    if (plan.format_ == plan_format::indices) {
      // Zero everything (+0), then write the kept entries after it on the same stream.
      PACTRAIN_CUDA_TRY(cudaMemsetAsync(dense.data(), 0, dense.size_bytes(), s));
      if (plan.count_ == 0) return;
      detail::scatter_indices_kernel<T, W>
          <<<detail::grid_for(plan.count_), detail::kernel_block, 0, s>>>(
              plan.indices_.data(), plan.count_, payload.data(), dense.data(), scale);
    } else {
      detail::scatter_bitmap_kernel<T, W>
          <<<detail::grid_for((plan.size_ + 3) / 4), detail::kernel_block, 0, s>>>(
              plan.view(), payload.data(), dense.data(), scale, aligned(dense.data()));
    }
    PACTRAIN_CUDA_TRY(cudaGetLastError());
  }

  /// gather_async, then synchronises `stream`.
  template <gradient_value T, class W>
  requires device_payload<W, T>
  void gather(const plan_type& plan, std::span<const T> dense, std::span<W> payload,
              cuda::stream_ref stream = {}) const {
    gather_async(plan, dense, payload, stream);
    PACTRAIN_CUDA_TRY(cudaStreamSynchronize(stream.get()));
  }

  /// scatter_async, then synchronises `stream`.
  template <gradient_value T, class W>
  requires device_payload<W, T>
  void scatter(const plan_type& plan, std::span<const W> payload, std::span<T> dense, T scale,
               cuda::stream_ref stream = {}) const {
    scatter_async(plan, payload, dense, scale, stream);
    PACTRAIN_CUDA_TRY(cudaStreamSynchronize(stream.get()));
  }

 private:
  template <class T>
  static bool aligned(const T* p) noexcept {
    return reinterpret_cast<std::uintptr_t>(p) % sizeof(detail::vec4<T>) == 0;
  }

  static void upload(detail::device_buffer<std::uint64_t>& dst, std::span<const std::uint64_t> src,
                     cudaStream_t s) {
    dst = detail::device_buffer<std::uint64_t>(src.size(), s);
    if (src.empty()) return;
    // From pageable memory the copy is staged before this returns, so `src` may go away.
    PACTRAIN_CUDA_TRY(
        cudaMemcpyAsync(dst.data(), src.data(), src.size_bytes(), cudaMemcpyHostToDevice, s));
  }

  // ranks[w] = kept units in words [0, w): popcounts, then an exclusive scan.
  static void build_ranks(plan_type& p, cudaStream_t s) {
    const std::size_t n = p.words_.size();
    p.ranks_ = detail::device_buffer<std::uint64_t>(n, s);
    if (n == 0) return;
    detail::device_buffer<std::uint64_t> counts(n, s);
    detail::popcount_kernel<<<detail::grid_for(n), detail::kernel_block, 0, s>>>(p.words_.data(), n,
                                                                                 counts.data());
    PACTRAIN_CUDA_TRY(cudaGetLastError());
    std::size_t temp_bytes = 0;
    PACTRAIN_CUDA_TRY(
        cub::DeviceScan::ExclusiveSum(nullptr, temp_bytes, counts.data(), p.ranks_.data(), n, s));
    detail::device_buffer<std::byte> temp(temp_bytes, s);
    PACTRAIN_CUDA_TRY(cub::DeviceScan::ExclusiveSum(temp.data(), temp_bytes, counts.data(),
                                                    p.ranks_.data(), n, s));
  }

  // Where the buffers live (after check_buffers: sizes first, the clearer message). `where`
  // is the message's prefix, e.g. "cuda_compactor::gather: ".
  template <class T, class W>
  static void check_memory(const T* dense, std::size_t dense_size, const W* payload,
                           std::size_t payload_size, const char* where) {
    detail::expect_device_buffer(dense, dense_size, where, "dense");
    detail::expect_device_buffer(payload, payload_size, where, "payload");
  }

  template <class T, class W>
  static void check_buffers(const plan_type& plan, const T* dense, std::size_t dense_size,
                            const W* payload, std::size_t payload_size, const char* op) {
    detail::check_compaction_buffers("cuda_compactor", op, plan.size_, plan.count_, dense,
                                     dense_size, payload, payload_size);
  }
};

static_assert(compactor_for<cuda_compactor, bitmap_mask, float>);
static_assert(compactor_for<cuda_compactor, index_mask, double>);
static_assert(compactor_for<cuda_compactor, block_mask<32>, float>);

}  // namespace pactrain
