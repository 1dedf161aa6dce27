// The per-entry arithmetic of ternary_codec, shared by its host loops and the device engine's
// kernels (PACTRAIN_HOST_DEVICE), so that both round every entry alike, bit for bit.
#pragma once

#include <pactrain/codec.hpp>
#include <pactrain/detail/config.hpp>
#include <pactrain/detail/random.hpp>

#include <cmath>
#include <cstdint>
#include <utility>

namespace pactrain::detail {

/// The two 32-bit keys of one (seed, rank, step, bucket): the stream of stochastic rounding.
[[nodiscard]] inline std::pair<std::uint32_t, std::uint32_t> ternary_keys(
    std::uint64_t seed, const codec_context& c) noexcept {
  std::uint64_t h = splitmix64(seed ^ 0x7465726e61727900ull);
  h = splitmix64(h ^ static_cast<std::uint64_t>(static_cast<std::uint32_t>(c.rank)));
  h = splitmix64(h ^ c.step);
  h = splitmix64(h ^ c.bucket);
  return {static_cast<std::uint32_t>(h), static_cast<std::uint32_t>(h >> 32)};
}

/// 24 uniform bits of entry k = hi * 2^32 + lo, from the step's keys (hi_key = hi ^ k1).
PACTRAIN_ALWAYS_INLINE PACTRAIN_HOST_DEVICE std::uint32_t ternary_random(
    std::uint32_t lo, std::uint32_t hi_key, std::uint32_t k0) noexcept {
  return lowbias32(lowbias32(lo ^ k0) + hi_key) >> 8;
}

/// u = t + 1 for one value: 1 + sign(g) with probability min(|g| / s, 1), else 1 (inv = 1 / s).
PACTRAIN_ALWAYS_INLINE PACTRAIN_HOST_DEVICE std::uint32_t ternary_lane(float g, float inv,
                                                                       std::uint32_t r) noexcept {
  const float p = std::fabs(g) * inv;  // NaN g: p is NaN, the compare is false, t = 0
  // r < 2^24: exact as a float, and a signed conversion vectorises.
  const std::uint32_t hit = static_cast<float>(static_cast<std::int32_t>(r)) * 0x1p-24f < p;
  const std::uint32_t neg = g < 0.0f;
  return 1u + hit - ((hit & neg) << 1);  // without branches, so that the loop vectorises
}

/// 1 / s for a usable scale; 0 (every lane t = 0, and no division) for a zero, negative, NaN or
/// infinite one.
PACTRAIN_ALWAYS_INLINE PACTRAIN_HOST_DEVICE float ternary_inverse(float s) noexcept {
  return s > 0 && s <= 0x1.fffffep127f ? 1.0f / s : 0.0f;
}

/// What decode_local gives back for lane u at scale s, and so what encoding x missed. The
/// product is exact (u - 1 is -1, 0 or 1), so a contraction to FMA changes nothing.
PACTRAIN_ALWAYS_INLINE PACTRAIN_HOST_DEVICE float ternary_residual(float x, std::uint32_t u,
                                                                   float s) noexcept {
  return x - static_cast<float>(static_cast<std::int32_t>(u - 1u)) * s;
}

}  // namespace pactrain::detail
