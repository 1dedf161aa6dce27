// basic_device_compactor<Exec>: gather and scatter of pruned gradients in device memory, over an
// execution backend. Internal; the public names are cuda_compactor (<pactrain/cuda/compactor.cuh>,
// hand-written kernels) and thrust_compactor (<pactrain/cuda/thrust_compactor.hpp>, Thrust
// algorithms: the reference on the GPU and the device math on the CPU).
//
// Exec provides: memory; stream_type (default-constructible: the default stream); buffer<T>
// (an owning array: buffer(n, stream), data(), size()); for_each(n, f, s);
// exclusive_popcount_scan(words, out, n, s); upload / download / copy / zero; synchronize(s);
// expect_device(p, n, where, what); and the names its errors carry (name, gather_where,
// scatter_where). Compiles without nvcc where Exec does.
#pragma once

#include <pactrain/compactor.hpp>
#include <pactrain/cuda/detail/device_ops.hpp>
#include <pactrain/error.hpp>
#include <pactrain/half.hpp>
#include <pactrain/mask.hpp>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace pactrain {

namespace detail {
/// Tag for engines that have already checked that their buffers are device memory: the
/// compactor then checks only sizes and overlap, saving a pointer query per buffer on every
/// step.
struct device_buffers_checked {};
}  // namespace detail

/// Payload element types of the device compactors for T gradients: T itself, or a 16-bit float
/// for float gradients (the fp16/bf16 codecs' encode and decode fused into gather and scatter).
template <class W, class T>
concept device_payload = std::same_as<W, T> ||(std::same_as<T, float>&& half_value<W>);

/// The compactor for buffers in Exec's device memory (see the top of this file and
/// <pactrain/cuda/compactor.cuh> for the contract).
template <class Exec>
class basic_device_compactor {
 public:
  static constexpr memory_space memory = Exec::memory;
  using exec_type = Exec;
  using stream_type = typename Exec::stream_type;

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
    friend class basic_device_compactor;
    [[nodiscard]] detail::bitmap_view view() const noexcept {
      return {words_.data(), ranks_.data(), size_, unit_};
    }
    std::size_t size_ = 0;
    std::size_t count_ = 0;
    std::size_t unit_ = 1;
    plan_format format_ = plan_format::bitmap;
    typename Exec::template buffer<std::uint64_t> words_;
    typename Exec::template buffer<std::uint64_t> ranks_;
    typename Exec::template buffer<std::uint64_t> indices_;
  };

  basic_device_compactor() = default;
  explicit basic_device_compactor(Exec exec) : exec_(std::move(exec)) {}

  [[nodiscard]] const Exec& exec() const noexcept { return exec_; }

  /// Builds the plan of `mask` on `stream`, ready for work queued after it there. Does not
  /// synchronise; the host mask may be destroyed as soon as this returns.
  template <gradient_mask Mask>
  [[nodiscard]] plan_type make_plan(const Mask& mask, stream_type stream = {}) const {
    plan_type p;
    p.size_ = mask.size();
    p.count_ = mask.count();
    if constexpr (Mask::kind == mask_kind::index) {
      p.format_ = plan_format::indices;
      upload(p.indices_, mask.indices(), stream);
    } else {
      p.format_ = plan_format::bitmap;
      if constexpr (Mask::kind == mask_kind::block) {
        p.unit_ = Mask::block_size;
        upload(p.words_, mask.blocks().words(), stream);
      } else if constexpr (requires { mask.words(); }) {
        upload(p.words_, mask.words(), stream);
      } else {  // any other representation: its canonical words
        std::vector<std::uint64_t> w;
        w.reserve(detail::words_for(mask.size()));
        detail::for_each_word(mask, [&](std::uint64_t x) { w.push_back(x); });
        upload(p.words_, std::span<const std::uint64_t>(w), stream);
      }
      const std::size_t n = p.words_.size();
      p.ranks_ = typename Exec::template buffer<std::uint64_t>(n, stream);
      exec_.exclusive_popcount_scan(p.words_.data(), p.ranks_.data(), n, stream);
    }
    return p;
  }

  /// The entry of a plan's tensor in a bucket-wide launch (detail::bucket_tensor): tensor
  /// `tensor` of the layout starts at `offset` in the flat gradient buffer and at `payload` in the
  /// bucket's payload, and its work items after `first_item` others.
  [[nodiscard]] static detail::bucket_tensor bucket_entry(const plan_type& p, std::size_t tensor,
                                                          std::size_t offset, std::size_t payload,
                                                          std::size_t first_item) noexcept {
    const bool by_index = p.format_ == plan_format::indices;
    return {p.view(), p.indices_.data(), by_index, p.count_, tensor, offset, payload, first_item};
  }
  /// Work items of a plan's tensor in a bucket-wide launch.
  [[nodiscard]] static std::size_t bucket_items(const plan_type& p) noexcept {
    return detail::bucket_items(p.size_, p.count_, p.format_ == plan_format::indices);
  }

  /// payload[k] = dense[k-th kept index], queued on `stream`; never synchronises. Throws
  /// pactrain::error, launching nothing, unless the sizes fit the plan and both buffers are
  /// disjoint device memory. A half or bfloat16 payload gets each value rounded to nearest even.
  template <gradient_value T, class W>
  requires device_payload<W, T>
  void gather_async(const plan_type& plan, std::span<const T> dense, std::span<W> payload,
                    stream_type stream = {}) const {
    check_buffers(plan, dense.data(), dense.size(), payload.data(), payload.size(), "gather");
    check_memory(dense.data(), dense.size(), payload.data(), payload.size(), "gather");
    gather_async(plan, dense, payload, stream, detail::device_buffers_checked{});
  }
  /// As above, for callers that have checked that the buffers are device memory.
  template <gradient_value T, class W>
  requires device_payload<W, T>
  void gather_async(const plan_type& plan, std::span<const T> dense, std::span<W> payload,
                    stream_type stream, detail::device_buffers_checked) const {
    check_buffers(plan, dense.data(), dense.size(), payload.data(), payload.size(), "gather");
    if (plan.count_ == 0) return;
    if (plan.format_ == plan_format::indices) {
      exec_.for_each(
          plan.count_,
          detail::gather_indices_op<T, W>{plan.indices_.data(), dense.data(), payload.data()},
          stream);
    } else {
      const auto grid = detail::quad_grid::of(dense.data(), plan.size_);
      exec_.for_each(
          grid.quads,
          detail::gather_bitmap_op<T, W>{plan.view(), dense.data(), payload.data(), grid}, stream);
    }
  }

  /// dense[i] = factor * payload[rank(i)] at kept entries, +0 at pruned ones (every entry is
  /// written), queued on `stream`; never synchronises. Preconditions as for gather_async. A
  /// half or bfloat16 payload is widened exactly before the multiply.
  template <gradient_value T, class W>
  requires device_payload<W, T>
  void scatter_async(const plan_type& plan, std::span<const W> payload, std::span<T> dense,
                     T factor, stream_type stream = {}) const {
    check_buffers(plan, dense.data(), dense.size(), payload.data(), payload.size(), "scatter");
    check_memory(dense.data(), dense.size(), payload.data(), payload.size(), "scatter");
    scatter_async(plan, payload, dense, factor, stream, detail::device_buffers_checked{});
  }
  /// As above, for callers that have checked that the buffers are device memory.
  template <gradient_value T, class W>
  requires device_payload<W, T>
  void scatter_async(const plan_type& plan, std::span<const W> payload, std::span<T> dense,
                     T factor, stream_type stream, detail::device_buffers_checked) const {
    check_buffers(plan, dense.data(), dense.size(), payload.data(), payload.size(), "scatter");
    if (plan.size_ == 0) return;
    if (plan.format_ == plan_format::indices) {
      // Zero everything (+0), then write the kept entries after it on the same stream.
      exec_.zero(dense.data(), dense.size(), stream);
      exec_.for_each(plan.count_,
                     detail::scatter_indices_op<T, W>{plan.indices_.data(), payload.data(),
                                                      dense.data(), factor},
                     stream);
    } else {
      const auto grid = detail::quad_grid::of(dense.data(), plan.size_);
      exec_.for_each(
          grid.quads,
          detail::scatter_bitmap_op<T, W>{plan.view(), payload.data(), dense.data(), factor, grid},
          stream);
    }
  }

  /// gather_async, then synchronises `stream`.
  template <gradient_value T, class W>
  requires device_payload<W, T>
  void gather(const plan_type& plan, std::span<const T> dense, std::span<W> payload,
              stream_type stream = {}) const {
    gather_async(plan, dense, payload, stream);
    exec_.synchronize(stream);
  }

  /// scatter_async, then synchronises `stream`.
  template <gradient_value T, class W>
  requires device_payload<W, T>
  void scatter(const plan_type& plan, std::span<const W> payload, std::span<T> dense, T factor,
               stream_type stream = {}) const {
    scatter_async(plan, payload, dense, factor, stream);
    exec_.synchronize(stream);
  }

 private:
  void upload(typename Exec::template buffer<std::uint64_t>& dst,
              std::span<const std::uint64_t> src, stream_type s) const {
    dst = typename Exec::template buffer<std::uint64_t>(src.size(), s);
    exec_.upload(dst.data(), src.data(), src.size(), s);
  }

  // Where the buffers live (after check_buffers: sizes first, the clearer message).
  template <class T, class W>
  static void check_memory(const T* dense, std::size_t dense_size, const W* payload,
                           std::size_t payload_size, const char* op) {
    const char* where = op[0] == 'g' ? Exec::gather_where : Exec::scatter_where;
    Exec::expect_device(dense, dense_size, where, "dense");
    Exec::expect_device(payload, payload_size, where, "payload");
  }

  template <class T, class W>
  static void check_buffers(const plan_type& plan, const T* dense, std::size_t dense_size,
                            const W* payload, std::size_t payload_size, const char* op) {
    detail::check_compaction_buffers(Exec::name, op, plan.size_, plan.count_, dense, dense_size,
                                     payload, payload_size);
  }

  Exec exec_{};
};

}  // namespace pactrain
