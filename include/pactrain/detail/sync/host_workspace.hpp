// The host engine's buffers of one commit, sized from its workspace layout: the payload, the
// coded buckets' wire elements, error feedback's residuals (and the step's new ones), and a
// fresh scale exchange. Built before the commit's agreement, installed after it.
#pragma once

#include <pactrain/codec.hpp>
#include <pactrain/detail/sync/scale_exchange.hpp>
#include <pactrain/detail/sync/workspace.hpp>
#include <pactrain/huge_pages.hpp>

namespace pactrain::detail {

template <class Codec, class Comm, bool Feedback>
struct host_workspace_buffers {
  using value_type = typename Codec::value_type;
  using wire_type = typename Codec::wire_type;

  huge_vector<value_type> payload;
  huge_vector<wire_type> wire;
  huge_vector<value_type> residual;       // error feedback: one per codec input entry
  huge_vector<value_type> residual_next;  // the step's new residuals, kept if it is finite
  scale_exchange<Codec, Comm> scales;

  /// May throw (allocation): residuals start at zero, and no previous step's scales exist.
  [[nodiscard]] static host_workspace_buffers allocate(const workspace_layout& w,
                                                       const Codec& codec) {
    host_workspace_buffers n;
    n.payload.assign(w.payload_size(), value_type(0));
    if constexpr (!codec_traits<Codec>::is_identity) {
      n.wire.assign(w.wire_size(), wire_type{});
      if constexpr (Feedback) {
        n.residual.assign(w.codec_input_size(), value_type(0));
        n.residual_next.assign(w.codec_input_size(), value_type(0));
      }
      n.scales.reset(codec, w.buckets(), [&](std::size_t b) { return w.codec_input_of(b); });
    }
    return n;
  }
};

}  // namespace pactrain::detail
