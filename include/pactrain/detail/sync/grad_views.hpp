// The checks both engines make on the gradients a step is given: one flat buffer of every
// tensor, or one buffer per tensor in layout order. Each throws pactrain::error naming the
// call (`op`: "allreduce", "begin_step") before anything changes.
#pragma once

#include <pactrain/error.hpp>
#include <pactrain/layout.hpp>

#include <cstddef>
#include <span>
#include <string>

namespace pactrain::detail {

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

}  // namespace pactrain::detail
