// Error feedback: the engine's fifth template parameter, and the encode steps it runs.
//
// A codec may offer fused forms the engine then uses: encode_residual(payload, wire, residual,
// ctx) encodes and sets residual = payload - decode_local(wire) in one pass, bit-identical to
// the separate steps; encode_feedback(payload, wire, residual, ctx) does the same for
// payload + residual, without writing the sum back.
#pragma once

#include <pactrain/codec.hpp>
#include <pactrain/error.hpp>

#include <concepts>
#include <cstddef>
#include <span>
#include <string>

namespace pactrain {

/// The engine's fifth template parameter. error_feedback keeps, per codec input entry, what this
/// rank's encodings failed to deliver (zero after every commit of masks or strategies) and adds
/// it to the next step's input; it does nothing for the identity codec.
struct no_feedback {
  static constexpr bool enabled = false;
};
struct error_feedback {
  static constexpr bool enabled = true;
};

template <class F>
concept feedback_policy = requires {
  { F::enabled } -> std::convertible_to<bool>;
};

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
