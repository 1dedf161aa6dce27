// Codecs: how payload values are represented on the wire.
//
// A compacted allreduce is correct only when decode(sum of encode(x_r)) == sum of x_r, i.e.
// when the codec is linear under the reduction; codec_traits<K>::is_linear states it, and
// the sync engine refuses, at compile time, a codec that does not.
//
// The engine calls a codec once per bucket and step (the bucket_codec concept):
//   wire_size(n, P)                 wire elements for n payload values summed over P ranks;
//   validate(P)                     throws pactrain::error if P ranks could overflow the wire;
//   encode(payload, wire, ctx)      this rank's contribution;
//   decode(wire, payload, ctx)      the reduced wire -> the mean over ranks (1/P folded in);
//   decode_local(wire, payload, ctx) what this rank's own encoding stands for (error feedback).
// Optional fused forms for error feedback: see feedback.hpp. The codecs that ship:
// identity_codec (here), fp16_codec and bf16_codec (codec/half_precision.hpp), ternary_codec
// (codec/ternary.hpp).
#pragma once

#include <pactrain/concepts.hpp>
#include <pactrain/digest.hpp>
#include <pactrain/error.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>

namespace pactrain {

/// What the engine tells a codec about the bucket being encoded or decoded.
struct codec_context {
  int rank = 0;              // this rank
  int size = 1;              // P: ranks whose encodings are summed
  std::uint64_t step = 0;    // the engine's step counter (seeds stochastic rounding)
  std::uint64_t bucket = 0;  // the bucket: separates random sequences within a step
  float scale = 0;           // the shared scale, for codecs with uses_scale
  /// Codecs with scale blocks (scale_count): one shared scale per block of the bucket's
  /// input. Empty: `scale` serves every block.
  std::span<const float> scales = {};
};

/// Properties of a codec. Specialise for new codecs; the primary template claims nothing.
template <class Codec>
struct codec_traits {
  static constexpr bool is_linear = false;
  static constexpr bool is_identity = false;
};

/// A payload representation: value_type (gradient entries), wire_type (summed elements).
template <class K>
concept gradient_codec = gradient_value<typename K::value_type> && requires {
  typename K::wire_type;
  { codec_traits<K>::is_linear } -> std::convertible_to<bool>;
};

/// A codec the engine can run per bucket (see the top of this file). A codec with
/// `uses_scale` also gives local_scale(payload), the statistic the engine reduces with MAX
/// over ranks into codec_context::scale (Inf or NaN when the payload holds one), and
/// scale_from_previous_step(); its decode must be finite whenever the scale is. It may give
/// several scales per bucket: scale_count(n) for an input of n entries, and
/// local_scales(payload, out), reduced alike into codec_context::scales.
template <class K>
concept bucket_codec = gradient_codec<K> &&
    requires(const K& k, std::span<const typename K::value_type> in,
             std::span<typename K::value_type> out, std::span<const typename K::wire_type> cw,
             std::span<typename K::wire_type> w, const codec_context& ctx, std::size_t n, int p) {
  { K::uses_scale } -> std::convertible_to<bool>;
  { k.wire_size(n, p) } -> std::same_as<std::size_t>;
  k.validate(p);
  k.encode(in, w, ctx);
  k.decode(cw, out, ctx);
  k.decode_local(cw, out, ctx);
};

namespace detail {

inline void check_codec_spans(const char* codec, const char* op, const void* in, std::size_t n,
                              const void* out, std::size_t m, std::size_t want_m) {
  PACTRAIN_EXPECTS((in != nullptr || n == 0) && (out != nullptr || m == 0),
                   std::string(codec) + "::" + op + ": null buffer");
  PACTRAIN_EXPECTS(m == want_m, std::string(codec) + "::" + op + ": " + std::to_string(n) +
                                    " values need " + std::to_string(want_m) + " wire elements, " +
                                    std::to_string(m) + " given");
}

inline void check_ranks(const char* codec, int p) {
  PACTRAIN_EXPECTS(
      p >= 1, std::string(codec) + ": " + std::to_string(p) + " ranks; a sum needs at least one");
}

template <class T>
void multiply(std::span<T> v, T f) noexcept {
  for (auto& x : v) x *= f;
}

}  // namespace detail

/// Sends payload values as they are. The engine runs it on its exact path: the allreduce
/// sums the payload itself and the 1/P factor is folded into the scatter.
template <gradient_value T>
struct identity_codec {
  using value_type = T;  // gradients and payload
  using wire_type = T;   // what the allreduce sums
  static constexpr bool uses_scale = false;

  static std::size_t wire_size(std::size_t n, int) noexcept { return n; }
  static void validate(int p) { detail::check_ranks("identity_codec", p); }
  static void encode(std::span<const T> in, std::span<T> wire, const codec_context&) {
    detail::check_codec_spans("identity_codec", "encode", in.data(), in.size(), wire.data(),
                              wire.size(), in.size());
    if (!in.empty()) std::memmove(wire.data(), in.data(), in.size_bytes());
  }
  static void decode(std::span<const T> wire, std::span<T> out, const codec_context& c) {
    decode_local(wire, out, c);
    detail::multiply(out, T(1) / static_cast<T>(c.size));
  }
  static void decode_local(std::span<const T> wire, std::span<T> out, const codec_context&) {
    detail::check_codec_spans("identity_codec", "decode", out.data(), out.size(), wire.data(),
                              wire.size(), out.size());
    if (!out.empty()) std::memmove(out.data(), wire.data(), out.size_bytes());
  }
};

template <gradient_value T>
struct codec_traits<identity_codec<T>> {
  static constexpr bool is_linear = true;
  static constexpr bool is_identity = true;
};

static_assert(bucket_codec<identity_codec<float>> && bucket_codec<identity_codec<double>>);

}  // namespace pactrain
