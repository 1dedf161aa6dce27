// 16-bit float codecs: fp16_codec (IEEE binary16) and bf16_codec (bfloat16) on the wire.
#pragma once

#include <pactrain/codec.hpp>
#include <pactrain/digest.hpp>
#include <pactrain/half.hpp>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

namespace pactrain {

/// Float gradients as 16-bit floats (Wire = half or bfloat16); decode returns the mean. Exact
/// when every value and partial sum is representable in Wire, else each pairwise combine rounds
/// once, in the communicator's order. Half sums beyond 65504 become inf.
template <half_value Wire>
struct cast_codec {
  using value_type = float;
  using wire_type = Wire;
  static constexpr bool uses_scale = false;
  static constexpr const char* name = std::same_as<Wire, half> ? "fp16_codec" : "bf16_codec";

  static std::size_t wire_size(std::size_t n, int) noexcept { return n; }
  static void validate(int p) { detail::check_ranks(name, p); }
  static void encode(std::span<const float> in, std::span<Wire> wire, const codec_context&) {
    detail::check_codec_spans(name, "encode", in.data(), in.size(), wire.data(), wire.size(),
                              in.size());
    detail::from_float(in.data(), wire.data(), in.size());
  }
  static void decode(std::span<const Wire> wire, std::span<float> out, const codec_context& c) {
    decode_local(wire, out, c);
    detail::multiply(out, 1.0f / static_cast<float>(c.size));
  }
  static void decode_local(std::span<const Wire> wire, std::span<float> out, const codec_context&) {
    detail::check_codec_spans(name, "decode", out.data(), out.size(), wire.data(), wire.size(),
                              out.size());
    detail::to_float(wire.data(), out.data(), out.size());
  }
  [[nodiscard]] static std::uint64_t digest() noexcept {
    return digest_builder(0x63617374)
        .add(std::uint64_t{sizeof(Wire)})
        .add(std::string_view(name))
        .value();
  }
};

using fp16_codec = cast_codec<half>;      // IEEE binary16 on the wire
using bf16_codec = cast_codec<bfloat16>;  // bfloat16 on the wire

template <half_value Wire>
struct codec_traits<cast_codec<Wire>> {
  static constexpr bool is_linear = true;  // up to rounding, see cast_codec
  static constexpr bool is_identity = false;
};

static_assert(bucket_codec<fp16_codec> && bucket_codec<bf16_codec>);

namespace detail {
/// True for the 16-bit cast codecs (fp16_codec, bf16_codec).
template <class Codec>
inline constexpr bool is_cast_codec_v = false;
template <half_value Wire>
inline constexpr bool is_cast_codec_v<cast_codec<Wire>> = true;
}  // namespace detail

}  // namespace pactrain
