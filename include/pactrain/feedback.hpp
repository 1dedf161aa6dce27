// Error feedback: a codec wrapper, and the encode steps the engine runs with it.
//
//   pactrain::sync s{comm, layout, pactrain::error_feedback{pactrain::ternary_codec{{.seed = 1}}}};
//
// A codec may offer fused forms the engine then uses: encode_residual(payload, wire, residual,
// ctx) encodes and sets residual = payload - decode_local(wire) in one pass, bit-identical to
// the separate steps; encode_feedback(payload, wire, residual, ctx) does the same for
// payload + residual, without writing the sum back.
#pragma once

#include <pactrain/codec.hpp>
#include <pactrain/error.hpp>

#include <cstddef>
#include <span>
#include <string>
#include <utility>

namespace pactrain {

/// Codec with error feedback: the engine keeps, per codec input entry, what this rank's
/// encodings failed to deliver (zero after every commit of masks or strategies) and adds it to
/// the next step's input. Encodes, decodes and is configured as Codec; does nothing for the
/// identity codec.
template <class Codec>
struct error_feedback : Codec {
  error_feedback() = default;
  /// Implicit: sync<Comm, error_feedback<C>> s{comm, layout, C{...}} takes C's settings.
  error_feedback(Codec codec) : Codec(std::move(codec)) {}  // NOLINT(google-explicit-constructor)
};
template <class Codec>
error_feedback(Codec) -> error_feedback<Codec>;

template <class Codec>
struct codec_traits<error_feedback<Codec>> : codec_traits<Codec> {};

namespace detail {
template <class Codec>
struct feedback_of {
  static constexpr bool value = false;
  using codec = Codec;
};
template <class Codec>
struct feedback_of<error_feedback<Codec>> {
  static constexpr bool value = true;
  using codec = Codec;
};
}  // namespace detail

/// True for error_feedback<C>: the engine keeps residuals (unless C is the identity codec).
template <class Codec>
inline constexpr bool has_feedback_v = detail::feedback_of<Codec>::value;

/// The codec that encodes: C for error_feedback<C>, else Codec.
template <class Codec>
using base_codec_t = typename detail::feedback_of<Codec>::codec;

/// Encodes `in` and sets residual = in - decode_local(wire): what this rank's encoding failed
/// to deliver (error feedback). residual must not overlap in.
template <bucket_codec K>
void encode_with_residual(const K& codec, std::span<const typename K::value_type> in,
                          std::span<typename K::wire_type> wire,
                          std::span<typename K::value_type> residual, const codec_context& c) {
  if constexpr (requires { codec.encode_residual(in, wire, residual, c); }) {
    codec.encode_residual(in, wire, residual, c);
  } else {
    codec.encode(in, wire, c);
    codec.decode_local(std::span<const typename K::wire_type>(wire), residual, c);
    for (std::size_t k = 0; k < residual.size(); ++k) residual[k] = in[k] - residual[k];
  }
}

/// Error feedback's step: encodes x = in + residual_in and sets residual_out = x -
/// decode_local(wire); residual_in is left as it was unless it is residual_out. One pass where
/// the codec has encode_feedback, and `in` is left alone; otherwise x is written into `in`
/// first, then encode_with_residual. The residuals must not overlap `in`, nor each other
/// unless they are the same buffer.
template <bucket_codec K>
void encode_with_feedback(const K& codec, std::span<typename K::value_type> in,
                          std::span<typename K::wire_type> wire,
                          std::span<const typename K::value_type> residual_in,
                          std::span<typename K::value_type> residual_out, const codec_context& c) {
  using T = typename K::value_type;
  if constexpr (requires {
                  codec.encode_feedback(std::span<const T>(in), wire, residual_in, residual_out, c);
                }) {
    codec.encode_feedback(std::span<const T>(in), wire, residual_in, residual_out, c);
  } else {
    for (const std::size_t n : {residual_in.size(), residual_out.size()}) {
      PACTRAIN_EXPECTS(n == in.size(), "encode_with_feedback: " + std::to_string(in.size()) +
                                           " values but " + std::to_string(n) + " residuals");
    }
    for (std::size_t k = 0; k < in.size(); ++k) in[k] += residual_in[k];
    encode_with_residual(codec, std::span<const T>(in), wire, residual_out, c);
  }
}

/// As above with one residual buffer, updated in place.
template <bucket_codec K>
void encode_with_feedback(const K& codec, std::span<typename K::value_type> in,
                          std::span<typename K::wire_type> wire,
                          std::span<typename K::value_type> residual, const codec_context& c) {
  using T = typename K::value_type;
  encode_with_feedback(codec, in, wire, std::span<const T>(residual), residual, c);
}

}  // namespace pactrain
