// How every bucket travels and where its data lives in the engine's workspaces: computed once
// per commit from the compaction plans and strategies (size first, then carve, as CUB's
// temporary storage), and read, never recomputed, by the step of either engine.
#pragma once

#include <pactrain/error.hpp>
#include <pactrain/layout.hpp>
#include <pactrain/strategy.hpp>

#include <cstddef>
#include <span>
#include <vector>

namespace pactrain::detail {

/// How a bucket travels in a step, fixed at each commit and the same on every rank.
struct bucket_route {
  bool sparse = false;  // its kept entries gathered into the payload (else the whole bucket)
  bool coded = false;   // through the codec (else summed as value_type, scaled by 1/P after)
  bool scaled = false;  // coded with codec input, by a codec with scales: it needs a round
  bool empty = true;    // nothing to send (no kept entries, or no entries)
};

/// Offsets into three workspaces, bucket by bucket in layout order: the payload (every tensor's
/// kept entries), the codec input (a bucket's payload, sparse, or all its entries, dense; none
/// where it bypasses the codec) and the wire (the codec's wire elements).
struct workspace_layout {
  std::vector<std::size_t> tensor_payload;  // per tensor: its first payload entry
  std::vector<std::size_t> bucket_payload;  // per bucket + 1: payload entries before it
  std::vector<std::size_t> codec_input;     // per bucket + 1: codec inputs before it
  std::vector<std::size_t> wire;            // per bucket + 1: wire elements before it
  std::vector<bucket_route> routes;         // per bucket

  [[nodiscard]] std::size_t buckets() const noexcept { return wire.empty() ? 0 : wire.size() - 1; }
  [[nodiscard]] std::size_t payload_size() const noexcept {
    return bucket_payload.empty() ? 0 : bucket_payload.back();
  }
  [[nodiscard]] std::size_t codec_input_size() const noexcept {
    return codec_input.empty() ? 0 : codec_input.back();
  }
  [[nodiscard]] std::size_t wire_size() const noexcept { return wire.empty() ? 0 : wire.back(); }
  /// Payload entries of bucket b, and its codec inputs and wire elements.
  [[nodiscard]] std::size_t payload_of(std::size_t b) const {
    return bucket_payload[b + 1] - bucket_payload[b];
  }
  [[nodiscard]] std::size_t codec_input_of(std::size_t b) const {
    return codec_input[b + 1] - codec_input[b];
  }
  [[nodiscard]] std::size_t wire_of(std::size_t b) const { return wire[b + 1] - wire[b]; }

  /// `kept(i)`: entries tensor i keeps; `coded(s)`: whether strategy s runs the codec;
  /// `wire_size(n)`: the codec's wire elements for n inputs; `scales`: the codec has scales.
  template <class Kept, class Coded, class WireSize>
  static workspace_layout make(const param_layout& layout,
                               std::span<const bucket_strategy> strategies, Kept&& kept,
                               Coded&& coded, WireSize&& wire_size, bool scales) {
    const auto& buckets = layout.buckets();
    PACTRAIN_EXPECTS(strategies.size() == buckets.size(), "workspace: one strategy per bucket");
    workspace_layout w;
    w.tensor_payload.resize(layout.tensor_count());
    w.bucket_payload.assign(buckets.size() + 1, 0);
    w.codec_input.assign(buckets.size() + 1, 0);
    w.wire.assign(buckets.size() + 1, 0);
    w.routes.resize(buckets.size());
    for (std::size_t b = 0; b < buckets.size(); ++b) {
      const auto& bk = buckets[b];
      std::size_t at = w.bucket_payload[b];
      for (std::size_t i = bk.first_tensor; i < bk.first_tensor + bk.tensor_count; ++i) {
        w.tensor_payload[i] = at;
        at += kept(i);
      }
      w.bucket_payload[b + 1] = at;
      const std::size_t payload = at - w.bucket_payload[b];
      auto& r = w.routes[b];
      r.sparse = is_sparse(strategies[b]);
      r.coded = coded(strategies[b]);
      r.empty = (r.sparse ? payload : bk.size) == 0;
      r.scaled = scales && r.coded && !r.empty;
      const std::size_t in = !r.coded ? 0 : (r.sparse ? payload : bk.size);
      w.codec_input[b + 1] = w.codec_input[b] + in;
      const std::size_t elements = in == 0 ? 0 : wire_size(in);
      PACTRAIN_EXPECTS(elements <= static_cast<std::size_t>(-1) - w.wire[b],
                       "workspace: the codec's wire elements overflow size_t");
      w.wire[b + 1] = w.wire[b] + elements;
    }
    return w;
  }
};

}  // namespace pactrain::detail
