// The device engine's buffers of one commit, sized from its workspace layout and plans: the
// payload, the coded buckets' wire elements, the ternary codec's scales and residuals, the
// per-bucket launch table, the open step's submission flags and the collectives' requests.
// Built before the commit's agreement, installed after it with one move (the device
// counterpart of detail/sync/host_workspace.hpp). Internal.
#pragma once

#include <pactrain/codec.hpp>
#include <pactrain/codec/ternary.hpp>
#include <pactrain/cuda/detail/device_buckets.hpp>
#include <pactrain/cuda/detail/device_collectives.hpp>
#include <pactrain/cuda/detail/device_compactor.hpp>
#include <pactrain/cuda/detail/device_ternary.hpp>
#include <pactrain/detail/sync/workspace.hpp>
#include <pactrain/feedback.hpp>
#include <pactrain/layout.hpp>

#include <cstddef>
#include <span>
#include <type_traits>
#include <vector>

namespace pactrain::detail {

template <class Codec, class Comm, class Exec, bool StreamOrdered>
struct device_workspace {
  using value_type = typename Codec::value_type;
  using wire_type = typename Codec::wire_type;
  using stream_type = typename Exec::stream_type;
  using plan_type = typename basic_device_compactor<Exec>::plan_type;
  template <class T>
  using buffer = typename Exec::template buffer<T>;
  static constexpr bool is_ternary = std::is_same_v<base_codec_t<Codec>, ternary_codec>;
  struct no_ternary {};

  buffer<value_type> payload;
  buffer<wire_type> wire;  // coded buckets only
  std::conditional_t<is_ternary, device_ternary<Exec>, no_ternary> ternary;
  bucket_table<Exec> buckets;  // one gather and one scatter launch per bucket
  device_collectives<Comm, Exec, StreamOrdered> collectives;

  /// Every buffer for workspace `w` and `plans`, allocated and uploaded on `home` (ready for
  /// work queued after it there). May throw.
  [[nodiscard]] static device_workspace allocate(const Exec& exec, const Codec& codec,
                                                 bool feedback, const param_layout& layout,
                                                 const workspace_layout& w,
                                                 std::span<const plan_type> plans,
                                                 stream_type home) {
    device_workspace n;
    n.payload = buffer<value_type>(w.payload_size(), home);
    if constexpr (!codec_traits<Codec>::is_identity)
      n.wire = buffer<wire_type>(w.wire_size(), home);
    if constexpr (is_ternary) n.ternary = device_ternary<Exec>(exec, codec, w, feedback, home);
    n.buckets = bucket_table<Exec>(exec, layout, w, plans, home);
    n.collectives = device_collectives<Comm, Exec, StreamOrdered>(layout.buckets().size());
    return n;
  }

  /// Bucket b's payload entries, and its wire elements (coded buckets).
  [[nodiscard]] std::span<value_type> bucket_payload(const workspace_layout& w, std::size_t b) {
    return {payload.data() + w.bucket_payload[b], w.payload_of(b)};
  }
  [[nodiscard]] std::span<wire_type> bucket_wire(const workspace_layout& w, std::size_t b) {
    return {wire.data() + w.wire[b], w.wire_of(b)};
  }
};

}  // namespace pactrain::detail
