// How a host bucket moves between the caller's tensors and the engine's payload workspace,
// through the compactor: gathered (sparse), as one dense region, and expanded back.
#pragma once

#include <pactrain/detail/finite.hpp>
#include <pactrain/detail/sync/workspace.hpp>
#include <pactrain/layout.hpp>

#include <algorithm>
#include <cstddef>
#include <limits>
#include <span>

namespace pactrain::detail {

/// The buckets of one commit: references to the engine's layout, plans, offsets and payload
/// workspace, valid until the next commit. Local; `Step` is the open step (its tensor views).
template <class Compactor, class T>
struct host_buckets {
  using plan_type = typename Compactor::plan_type;

  const Compactor& compactor;
  const param_layout& layout;
  std::span<const plan_type> plans;
  const workspace_layout& workspace;
  std::span<T> payload;

  /// Tensor i's kept entries in the payload workspace.
  [[nodiscard]] std::span<T> tensor_payload(std::size_t i) const {
    return payload.subspan(workspace.tensor_payload[i], plans[i].count());
  }

  /// Sparse bucket b's payload, gathered from its tensors.
  template <class Step>
  std::span<T> gather(std::size_t b, Step& step) const {
    const auto& bk = layout.buckets()[b];
    for (std::size_t i = bk.first_tensor; i < bk.first_tensor + bk.tensor_count; ++i) {
      compactor.gather(plans[i], std::span<const T>(step.view(i)), tensor_payload(i));
    }
    return payload.subspan(workspace.bucket_payload[b], workspace.payload_of(b));
  }

  /// Dense bucket b's region: the caller's buffer when its tensors lie back to back, else a
  /// copy in the step's dense workspace.
  template <class Step>
  std::span<T> dense_region(std::size_t b, Step& step) const {
    const auto& bk = layout.buckets()[b];
    if (bk.size == 0) return {};
    if (T* p = step.in_place(b)) return {p, bk.size};
    auto region = step.dense_workspace(b, bk.size);
    std::size_t at = 0;
    for (std::size_t i = bk.first_tensor; i < bk.first_tensor + bk.tensor_count; ++i) {
      const auto v = step.view(i);
      std::copy(v.begin(), v.end(), region.begin() + static_cast<std::ptrdiff_t>(at));
      at += v.size();
    }
    return region;
  }

  /// Sets the pruned entries of dense bucket b's region to +0.
  void zero_pruned(std::size_t b, std::span<T> region) const {
    const auto& bk = layout.buckets()[b];
    std::size_t at = 0;
    for (std::size_t i = bk.first_tensor; i < bk.first_tensor + bk.tensor_count; ++i) {
      const auto& plan = plans[i];
      if (plan.count() != plan.size()) {
        auto part = region.subspan(at, plan.size());
        compactor.gather(plan, std::span<const T>(part), tensor_payload(i));
        compactor.scatter(plan, std::span<const T>(tensor_payload(i)), part, T(1));
      }
      at += plan.size();
    }
  }

  /// Writes reduced bucket b back to its tensors, times factor, +0 at pruned entries; `region`
  /// is its reduced dense region (dense strategies only).
  template <class Step>
  void expand(std::size_t b, bool sparse, std::span<T> region, Step& step, T factor) const {
    const auto& bk = layout.buckets()[b];
    std::size_t at = 0;
    for (std::size_t i = bk.first_tensor; i < bk.first_tensor + bk.tensor_count; ++i) {
      const auto dst = step.view(i);
      if (sparse) {
        compactor.scatter(plans[i], std::span<const T>(tensor_payload(i)), dst, factor);
      } else {
        expand_dense(i, region.subspan(at, dst.size()), dst, factor);
      }
      at += dst.size();
    }
  }

  /// A coded bucket whose scale or input was not finite: NaN at every kept entry, +0 elsewhere.
  template <class Step>
  void poison(std::size_t b, bool sparse, std::span<T> region, Step& step) const {
    std::fill(region.begin(), region.end(), std::numeric_limits<T>::quiet_NaN());
    expand(b, sparse, region, step, T(1));
  }

  /// Whether bucket b's written-back result is finite: a sparse bucket's payload, or a dense
  /// bucket's tensors (pruned entries +0 by now, as the masked dense allreduce gives).
  template <class Step>
  [[nodiscard]] bool finite(std::size_t b, bool sparse, std::span<const T> region,
                            const Step& step) const {
    if (sparse) return all_finite(region);
    const auto& bk = layout.buckets()[b];
    for (std::size_t i = bk.first_tensor; i < bk.first_tensor + bk.tensor_count; ++i) {
      if (!all_finite(std::span<const T>(step.view(i)))) return false;
    }
    return true;
  }

  /// dst = factor * src at tensor i's kept entries, +0 elsewhere; src may be dst itself.
  void expand_dense(std::size_t i, std::span<T> src, std::span<T> dst, T factor) const {
    const auto& plan = plans[i];
    if (plan.count() == plan.size()) {
      if (factor == T(1) && src.data() == dst.data()) return;  // already in place
      for (std::size_t k = 0; k < dst.size(); ++k) dst[k] = src[k] * factor;
      return;
    }
    compactor.gather(plan, std::span<const T>(src), tensor_payload(i));
    compactor.scatter(plan, std::span<const T>(tensor_payload(i)), dst, factor);
  }
};

}  // namespace pactrain::detail
