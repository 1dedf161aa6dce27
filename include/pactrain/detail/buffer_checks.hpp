// The checks on buffers a caller hands over, each throwing pactrain::error before anything
// changes, and where a bucket's tensors lie in them: the gradients of a step (one flat buffer of
// every tensor, or one buffer per tensor in layout order; `op` names the call, "allreduce" or
// "begin_step"), and the buffers of a compactor's gather and scatter.
#pragma once

#include <pactrain/error.hpp>
#include <pactrain/layout.hpp>

#include <cstddef>
#include <functional>
#include <span>
#include <string>

namespace pactrain::detail {

/// Where bucket bk's tensors lie back to back in the caller's buffers (`data(i)`: tensor i's
/// first entry), so that a dense bucket can be summed in place: the first entry of their
/// region, else null. Empty tensors are skipped: they never force a copy.
template <class T, class Data>
[[nodiscard]] T* bucket_in_place(const param_layout& layout, const bucket_info& bk, Data&& data) {
  T* first = nullptr;
  T* next = nullptr;
  for (std::size_t i = bk.first_tensor; i < bk.first_tensor + bk.tensor_count; ++i) {
    const std::size_t n = layout.tensors()[i].size;
    if (n == 0) continue;
    T* p = data(i);
    if (first == nullptr) {
      first = p;
    } else if (p != next) {
      return nullptr;
    }
    next = p + n;
  }
  return first;
}

template <class T>
void check_flat_grads(const param_layout& layout, std::span<T> grads, const char* op) {
  PACTRAIN_EXPECTS(grads.data() != nullptr || grads.empty(),
                   std::string("sync::") + op + ": null buffer");
  PACTRAIN_EXPECTS(grads.size() == layout.total_size(),
                   std::string("sync::") + op + ": buffer has " + std::to_string(grads.size()) +
                       " entries, the layout " + std::to_string(layout.total_size()));
}

template <class T>
void check_tensor_grads(const param_layout& layout, std::span<const std::span<T>> tensors,
                        const char* op) {
  PACTRAIN_EXPECTS(tensors.size() == layout.tensor_count(),
                   std::string("sync::") + op + ": " + std::to_string(tensors.size()) +
                       " tensors given, the layout has " + std::to_string(layout.tensor_count()));
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const auto& t = layout.tensors()[i];
    PACTRAIN_EXPECTS(tensors[i].data() != nullptr || tensors[i].empty(),
                     std::string("sync::") + op + ": null buffer for tensor '" + t.name + "'");
    PACTRAIN_EXPECTS(tensors[i].size() == t.size,
                     std::string("sync::") + op + ": tensor '" + t.name + "' has " +
                         std::to_string(tensors[i].size()) + " entries, the layout " +
                         std::to_string(t.size));
  }
}

/// The preconditions of every compactor's gather and scatter: buffer sizes matching the plan,
/// no null buffer with a nonzero size, no overlap. Throws pactrain::error naming
/// `component::op`; the message is built only then, so a check that passes allocates nothing.
template <class T, class W>
void check_compaction_buffers(const char* component, const char* op, std::size_t plan_size,
                              std::size_t plan_count, const T* dense, std::size_t dense_size,
                              const W* payload, std::size_t payload_size) {
  const auto where = [&] { return std::string(component) + "::" + op + ": "; };
  PACTRAIN_EXPECTS(dense_size == plan_size, where() + "dense buffer has " +
                                                std::to_string(dense_size) + " entries, the plan " +
                                                std::to_string(plan_size));
  PACTRAIN_EXPECTS(payload_size == plan_count,
                   where() + "payload buffer has " + std::to_string(payload_size) +
                       " entries, the plan keeps " + std::to_string(plan_count));
  PACTRAIN_EXPECTS(dense != nullptr || dense_size == 0, where() + "null dense buffer");
  PACTRAIN_EXPECTS(payload != nullptr || payload_size == 0, where() + "null payload buffer");
  if (dense_size != 0 && payload_size != 0) {
    // As bytes: the payload may hold another type than the dense tensor (device codecs).
    const auto* d = reinterpret_cast<const std::byte*>(dense);
    const auto* p = reinterpret_cast<const std::byte*>(payload);
    const std::less<const std::byte*> lt;
    const bool apart = !lt(d, p + payload_size * sizeof(W)) || !lt(p, d + dense_size * sizeof(T));
    PACTRAIN_EXPECTS(apart, where() + "dense and payload buffers overlap");
  }
}

}  // namespace pactrain::detail
