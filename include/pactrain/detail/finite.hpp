// Finiteness by bit pattern, in branch-free passes that vectorise (AVX2 chosen at run time):
// the largest magnitude orders NaN above Inf above every finite value, whatever the order of
// the entries (a float max would drop NaNs or keep them by position).
#pragma once

#include <pactrain/detail/config.hpp>
#include <pactrain/detail/cpu.hpp>

#include <bit>
#include <cstdint>
#include <span>

#if PACTRAIN_HAS_X86_KERNELS
#define PACTRAIN_FINITE_AVX2 __attribute__((target("avx2"))) PACTRAIN_VECTORIZE
#endif

namespace pactrain::detail {

template <class T>
struct magnitude_bits;
template <>
struct magnitude_bits<float> {
  using type = std::int32_t;  // the sign bit cleared, so signed order is magnitude order
  static constexpr type magnitude = 0x7fffffff;
  static constexpr type infinity = 0x7f800000;
};
template <>
struct magnitude_bits<double> {
  using type = std::int64_t;
  static constexpr type magnitude = 0x7fffffffffffffff;
  static constexpr type infinity = 0x7ff0000000000000;
};

template <class T>
PACTRAIN_ALWAYS_INLINE typename magnitude_bits<T>::type largest_magnitude_body(
    std::span<const T> v) noexcept {
  using bits = magnitude_bits<T>;
  typename bits::type m = 0;
  for (const T x : v) {
    const auto u = std::bit_cast<typename bits::type>(x) & bits::magnitude;
    m = u > m ? u : m;
  }
  return m;
}

// An exponent of all ones is an Inf or a NaN: OR of a compare per entry, no max needed.
template <class T>
PACTRAIN_ALWAYS_INLINE bool all_finite_body(std::span<const T> v) noexcept {
  using bits = magnitude_bits<T>;
  typename bits::type bad = 0;
  for (const T x : v) {
    const auto u = std::bit_cast<typename bits::type>(x);
    bad |= static_cast<typename bits::type>((u & bits::infinity) == bits::infinity);
  }
  return bad == 0;
}

#if PACTRAIN_HAS_X86_KERNELS
template <class T>
PACTRAIN_FINITE_AVX2 typename magnitude_bits<T>::type largest_magnitude_avx2(
    std::span<const T> v) noexcept {
  return largest_magnitude_body(v);
}
template <class T>
PACTRAIN_FINITE_AVX2 bool all_finite_avx2(std::span<const T> v) noexcept {
  return all_finite_body(v);
}
#endif

/// The bits of the largest |x| in v (0 when empty): at or above magnitude_bits<T>::infinity
/// exactly when v holds an Inf or a NaN.
template <class T>
PACTRAIN_VECTORIZE typename magnitude_bits<T>::type largest_magnitude_bits(
    std::span<const T> v) noexcept {
#if PACTRAIN_HAS_X86_KERNELS
  if (cpu().avx2) return largest_magnitude_avx2(v);
#endif
  return largest_magnitude_body(v);
}

/// True when v holds no Inf and no NaN.
template <class T>
[[nodiscard]] PACTRAIN_VECTORIZE bool all_finite(std::span<const T> v) noexcept {
#if PACTRAIN_HAS_X86_KERNELS
  if (cpu().avx2) return all_finite_avx2(v);
#endif
  return all_finite_body(v);
}

}  // namespace pactrain::detail

#undef PACTRAIN_FINITE_AVX2
