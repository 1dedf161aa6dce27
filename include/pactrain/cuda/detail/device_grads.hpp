// device_grads<T, Exec>: where a device engine's step finds its gradients. Internal.
//
// A step runs over one flat buffer of every tensor or over one buffer per tensor. Sparse
// buckets reach per-tensor buffers through a device table of their pointers, stored in
// stream order by launches that carry the pointers as arguments, and only when they changed
// since the table was last written. A dense bucket is summed as one region: the caller's
// memory where its tensors lie back to back, else a staging stretch of device memory that its
// tensors are copied into before the collective and out of after it (the staging buffer
// grows when a step needs more, as the host engine's dense workspace does).
// A buffer is checked to be device memory the first time it is seen at its address, not on
// every step.
#pragma once

#include <pactrain/cuda/detail/device_ops.hpp>
#include <pactrain/detail/buffer_checks.hpp>
#include <pactrain/error.hpp>
#include <pactrain/layout.hpp>
#include <pactrain/strategy.hpp>

#include <algorithm>
#include <cstddef>
#include <span>
#include <string>
#include <vector>

namespace pactrain::detail {

template <class T, class Exec>
class device_grads {
 public:
  using stream_type = typename Exec::stream_type;

  device_grads() = default;
  /// Room for `layout`'s tensors; the pointer table lives on `home` (the engine's stream).
  device_grads(const param_layout& layout, stream_type home)
      : table_(layout.tensor_count(), home),
        host_(layout.tensor_count(), nullptr),
        stored_(layout.tensor_count(), nullptr),
        checked_(layout.tensor_count(), nullptr),
        region_(layout.buckets().size(), nullptr),
        staged_(layout.buckets().size(), 0) {}

  /// The step runs over one flat buffer. Throws, changing nothing, on a bad buffer.
  void set(const param_layout& layout, std::span<T> grads, const char* op) {
    check_flat_grads(layout, grads, op);
    if (grads.data() != checked_flat_.data() || grads.size() != checked_flat_.size()) {
      Exec::expect_device(grads.data(), grads.size(), where(op).c_str(), "gradient");
      checked_flat_ = grads;
    }
    flat_ = grads;
    by_tensor_ = false;
  }

  /// The step runs over one buffer per tensor. Throws, changing nothing, on a bad buffer.
  void set(const param_layout& layout, std::span<const std::span<T>> tensors, const char* op) {
    check_tensor_grads(layout, tensors, op);
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      const auto& t = layout.tensors()[i];
      if (tensors[i].data() != checked_[i] && !tensors[i].empty()) {
        Exec::expect_device(tensors[i].data(), tensors[i].size(), where(op).c_str(),
                            ("tensor '" + t.name + "'").c_str());
        checked_[i] = tensors[i].data();
      }
    }
    for (std::size_t i = 0; i < tensors.size(); ++i) host_[i] = tensors[i].data();
    by_tensor_ = true;
  }

  /// Opens the step over the buffers set last, on `stream` (ordered after the last step,
  /// which `last_step` marks): writes the pointer table where it changed, and places every
  /// dense bucket's region. A larger staging buffer is allocated on `home` (the engine's
  /// stream, which outlives it), once nothing uses the old one.
  template <class Event>
  void begin(const Exec& exec, const param_layout& layout,
             std::span<const bucket_strategy> strategies, stream_type stream, stream_type home,
             const Event& last_step) {
    const auto& buckets = layout.buckets();
    std::size_t needed = 0;
    for (std::size_t b = 0; b < buckets.size(); ++b) {
      const auto& bk = buckets[b];
      staged_[b] = 0;
      region_[b] = nullptr;
      if (is_sparse(strategies[b]) || bk.size == 0) continue;
      if (!by_tensor_) {
        region_[b] = flat_.data() + bk.offset;
      } else if (T* p = bucket_in_place<T>(layout, bk, [&](std::size_t i) { return host_[i]; });
                 p != nullptr) {
        region_[b] = p;
      } else {
        staged_[b] = 1;
        needed += bk.size;
      }
    }
    if (stage_.size() < needed) {
      last_step.wait();  // the old stage may be in use on another stream
      stage_ = typename Exec::template buffer<T>(needed, home);
      exec.synchronize(home);  // ready for every stream
    }
    std::size_t at = 0;
    for (std::size_t b = 0; b < buckets.size(); ++b) {
      if (staged_[b] == 0) continue;
      region_[b] = stage_.data() + at;
      at += buckets[b].size;
    }
    if (by_tensor_ && host_ != stored_) store_table(exec, stream);
  }

  /// Where sparse buckets' launches find the tensors.
  [[nodiscard]] dense_source<T> tensors() const noexcept {
    return by_tensor_ ? dense_source<T>{nullptr, 0, table_.data()}
                      : dense_source<T>{flat_.data(), 0, nullptr};
  }
  /// The same pointers as the host knows them: empty for one flat buffer.
  [[nodiscard]] std::span<T* const> host_tensors() const noexcept {
    return by_tensor_ ? std::span<T* const>(host_) : std::span<T* const>{};
  }
  /// Tensor i's entries in the caller's buffers.
  [[nodiscard]] std::span<T> tensor(const param_layout& layout, std::size_t i) const {
    const auto& t = layout.tensors()[i];
    return {by_tensor_ ? host_[i] : flat_.data() + t.offset, t.size};
  }
  /// Dense bucket b's region (its entries back to back) and the source that reads it.
  [[nodiscard]] T* region(std::size_t b) const noexcept { return region_[b]; }
  [[nodiscard]] dense_source<T> region_source(const param_layout& layout,
                                              std::size_t b) const noexcept {
    return {region_[b], layout.buckets()[b].offset, nullptr};
  }

  /// f(first, n) over bucket b's entries in the caller's buffers: one run for a flat buffer,
  /// else one per tensor.
  template <class F>
  void for_each_run(const param_layout& layout, std::size_t b, F&& f) const {
    const auto& bk = layout.buckets()[b];
    if (bk.size == 0) return;
    if (!by_tensor_) return f(flat_.data() + bk.offset, bk.size);
    for (std::size_t i = bk.first_tensor; i < bk.first_tensor + bk.tensor_count; ++i) {
      if (const std::size_t n = layout.tensors()[i].size; n != 0) f(host_[i], n);
    }
  }

  /// Copies staged dense bucket b's tensors into its region (nothing if it runs in place).
  void stage_in(const Exec& exec, const param_layout& layout, std::size_t b,
                stream_type stream) const {
    for_tensors(layout, b,
                [&](T* tensor, T* region, std::size_t n) { exec.copy(region, tensor, n, stream); });
  }
  /// Copies staged dense bucket b's region back to its tensors.
  void stage_out(const Exec& exec, const param_layout& layout, std::size_t b,
                 stream_type stream) const {
    for_tensors(layout, b,
                [&](T* tensor, T* region, std::size_t n) { exec.copy(tensor, region, n, stream); });
  }

 private:
  static std::string where(const char* op) { return std::string("sync::") + op + ": "; }

  template <class F>
  void for_tensors(const param_layout& layout, std::size_t b, F&& f) const {
    if (staged_[b] == 0) return;
    const auto& bk = layout.buckets()[b];
    for (std::size_t i = bk.first_tensor; i < bk.first_tensor + bk.tensor_count; ++i) {
      const auto& t = layout.tensors()[i];
      f(host_[i], region_[b] + (t.offset - bk.offset), t.size);
    }
  }

  // The table in chunks of `chunk` pointers, each one launch carrying them.
  void store_table(const Exec& exec, stream_type stream) {
    constexpr std::size_t chunk = 32;
    for (std::size_t at = 0; at < host_.size(); at += chunk) {
      const std::size_t n = std::min(chunk, host_.size() - at);
      store_op<T*, chunk> op{};
      std::copy_n(host_.begin() + static_cast<std::ptrdiff_t>(at), n, op.values);
      op.dst = table_.data() + at;
      exec.for_each(n, op, stream);
    }
    stored_ = host_;
  }

  typename Exec::template buffer<T*> table_;  // per tensor, on the device
  std::vector<T*> host_;                      // the open step's per-tensor buffers
  std::vector<T*> stored_;                    // what table_ holds
  std::vector<T*> checked_;                   // per tensor: the last buffer found on the device
  std::span<T> flat_;
  std::span<T> checked_flat_;
  bool by_tensor_ = false;
  std::vector<T*> region_;    // per dense bucket in the open step
  std::vector<char> staged_;  // per bucket: its region is a stretch of stage_
  typename Exec::template buffer<T> stage_;
};

}  // namespace pactrain::detail
