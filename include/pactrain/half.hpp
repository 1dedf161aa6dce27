// 16-bit floating-point value types: pactrain::half (IEEE binary16) and pactrain::bfloat16.
//
// Host types that round exactly as the GPU does: conversion from float rounds to nearest
// even as CUDA's __float2half_rn and __float2bfloat16_rn (subnormals kept, overflow to inf,
// every NaN becomes the canonical quiet NaN 0x7fff); conversion to float is exact (a NaN
// stays a NaN, quieted for half as the x86 F16C instructions do). They are storage types:
// arithmetic converts to float first.
#pragma once

#include <pactrain/detail/config.hpp>
#include <pactrain/detail/cpu.hpp>

#include <bit>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#if PACTRAIN_HAS_X86_KERNELS
#include <immintrin.h>
#endif

namespace pactrain {

namespace detail {

/// float -> binary16 bits, round to nearest even, as CUDA's __float2half_rn.
constexpr std::uint16_t float_to_half_bits(float f) noexcept {
  const auto x = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t u = x & 0x7fffffffu;
  if (u > 0x7f800000u) return 0x7fffu;                                      // NaN
  if (u >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // >= 65520: inf
  if (u >= 0x38800000u) {                                                   // normal half
    std::uint32_t h = (u - 0x38000000u) >> 13;  // rebias the exponent by 127 - 15
    const std::uint32_t rem = u & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u) != 0)) ++h;  // a carry is still right
    return static_cast<std::uint16_t>(sign | h);
  }
  if (u <= 0x33000000u) return static_cast<std::uint16_t>(sign);  // <= 2^-25: ties to 0
  const std::uint32_t mant = (u & 0x7fffffu) | 0x800000u;
  const std::uint32_t shift = 126u - (u >> 23);  // 14..24
  std::uint32_t h = mant >> shift;
  const std::uint32_t rem = mant & ((1u << shift) - 1u);
  const std::uint32_t halfway = 1u << (shift - 1u);
  if (rem > halfway || (rem == halfway && (h & 1u) != 0)) ++h;
  return static_cast<std::uint16_t>(sign | h);
}

/// binary16 bits -> float, exact.
constexpr float half_bits_to_float(std::uint16_t h) noexcept {
  const std::uint32_t sign = (static_cast<std::uint32_t>(h) & 0x8000u) << 16;
  const std::uint32_t e = (h >> 10) & 0x1fu;
  const std::uint32_t m = h & 0x3ffu;
  std::uint32_t x = 0;
  if (e == 0) {
    if (m == 0) {
      x = sign;
    } else {  // subnormal m * 2^-24: normalise
      const auto p = static_cast<std::uint32_t>(std::bit_width(m)) - 1u;  // 0..9
      x = sign | ((p + 103u) << 23) | ((m << (23u - p)) & 0x7fffffu);
    }
  } else if (e == 31) {
    x = sign | 0x7f800000u | (m << 13) | (m != 0 ? 0x400000u : 0u);  // NaN comes out quiet
  } else {
    x = sign | ((e + 112u) << 23) | (m << 13);
  }
  return std::bit_cast<float>(x);
}

/// float -> bfloat16 bits, round to nearest even, as CUDA's __float2bfloat16_rn.
constexpr std::uint16_t float_to_bfloat16_bits(float f) noexcept {
  const auto u = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;  // no NaN: cannot wrap
  return static_cast<std::uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? 0x7fffu : r);
}

/// bfloat16 bits -> float, exact.
constexpr float bfloat16_bits_to_float(std::uint16_t b) noexcept {
  return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16);
}

}  // namespace detail

/// IEEE binary16, as CUDA's __half. Trivially copyable, 16 bits; explicit conversions.
class half {
 public:
  constexpr half() noexcept = default;
  /// Rounds to nearest even.
  constexpr explicit half(float f) noexcept : bits_(detail::float_to_half_bits(f)) {}
  /// Exact.
  constexpr explicit operator float() const noexcept { return detail::half_bits_to_float(bits_); }
  [[nodiscard]] static constexpr half from_bits(std::uint16_t b) noexcept {
    half h;
    h.bits_ = b;
    return h;
  }
  [[nodiscard]] constexpr std::uint16_t bits() const noexcept { return bits_; }

 private:
  std::uint16_t bits_ = 0;
};

/// bfloat16 (the upper half of an IEEE binary32), as CUDA's __nv_bfloat16.
class bfloat16 {
 public:
  constexpr bfloat16() noexcept = default;
  /// Rounds to nearest even.
  constexpr explicit bfloat16(float f) noexcept : bits_(detail::float_to_bfloat16_bits(f)) {}
  /// Exact.
  constexpr explicit operator float() const noexcept {
    return detail::bfloat16_bits_to_float(bits_);
  }
  [[nodiscard]] static constexpr bfloat16 from_bits(std::uint16_t b) noexcept {
    bfloat16 h;
    h.bits_ = b;
    return h;
  }
  [[nodiscard]] constexpr std::uint16_t bits() const noexcept { return bits_; }

 private:
  std::uint16_t bits_ = 0;
};

static_assert(sizeof(half) == 2 && std::is_trivially_copyable_v<half>);
static_assert(sizeof(bfloat16) == 2 && std::is_trivially_copyable_v<bfloat16>);

/// The 16-bit float types.
template <class T>
concept half_value = std::same_as<T, half> || std::same_as<T, bfloat16>;

namespace detail {

// ---- bulk conversions ------------------------------------------------------------------------
// Plain loops the compiler vectorises; for half, the F16C instructions where the CPU has them
// (they round the same way; only NaNs need the canonical pattern put back).

inline void to_float(const bfloat16* in, float* out, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i) out[i] = bfloat16_bits_to_float(in[i].bits());
}

inline void from_float(const float* in, bfloat16* out, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i) out[i] = bfloat16::from_bits(float_to_bfloat16_bits(in[i]));
}

#if PACTRAIN_HAS_X86_KERNELS
#define PACTRAIN_TARGET_F16C __attribute__((target("avx,f16c")))

PACTRAIN_TARGET_F16C inline void to_float_f16c(const half* in, float* out, std::size_t n) noexcept {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(out + i,
                     _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i))));
  }
  for (; i < n; ++i) out[i] = half_bits_to_float(in[i].bits());
}

PACTRAIN_TARGET_F16C inline void from_float_f16c(const float* in, half* out,
                                                 std::size_t n) noexcept {
  const __m128i abs_mask = _mm_set1_epi16(0x7fff);
  const __m128i inf = _mm_set1_epi16(0x7c00);
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT);
    // NaN (|h| > 0x7c00, a signed compare of values below 0x8000) -> 0x7fff, as CUDA.
    const __m128i nan = _mm_cmpgt_epi16(_mm_and_si128(h, abs_mask), inf);
    h = _mm_or_si128(_mm_andnot_si128(nan, h), _mm_and_si128(nan, abs_mask));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), h);
  }
  for (; i < n; ++i) out[i] = half::from_bits(float_to_half_bits(in[i]));
}

#endif

inline void to_float(const half* in, float* out, std::size_t n) noexcept {
#if PACTRAIN_HAS_X86_KERNELS
  if (cpu().f16c) return to_float_f16c(in, out, n);
#endif
  for (std::size_t i = 0; i < n; ++i) out[i] = half_bits_to_float(in[i].bits());
}

inline void from_float(const float* in, half* out, std::size_t n) noexcept {
#if PACTRAIN_HAS_X86_KERNELS
  if (cpu().f16c) return from_float_f16c(in, out, n);
#endif
  for (std::size_t i = 0; i < n; ++i) out[i] = half::from_bits(float_to_half_bits(in[i]));
}

/// inout[i] = round(op(float(in[i]), float(inout[i]))): one rounding per pairwise combine, so
/// a sum is the correctly rounded 16-bit sum of the two operands.
template <half_value T, class Op>
void combine(const T* in, T* inout, std::size_t n, Op op) noexcept {
  constexpr std::size_t chunk = 256;
  float a[chunk];
  float b[chunk];
  for (std::size_t at = 0; at < n; at += chunk) {
    const std::size_t m = n - at < chunk ? n - at : chunk;
    to_float(in + at, a, m);
    to_float(inout + at, b, m);
    for (std::size_t i = 0; i < m; ++i) b[i] = op(a[i], b[i]);
    from_float(b, inout + at, m);
  }
}

}  // namespace detail
}  // namespace pactrain

#undef PACTRAIN_TARGET_F16C
