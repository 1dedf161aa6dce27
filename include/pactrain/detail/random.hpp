// The integer mixers behind every counter-based random sequence of the project: the library's
// stochastic rounding, and the seeded data of tests, benchmarks and examples.
#pragma once

#include <pactrain/detail/config.hpp>

#include <cstdint>

namespace pactrain::detail {

/// splitmix64's finaliser (Steele, Lea and Flood 2014): every input bit reaches every output bit.
inline constexpr std::uint64_t mix64(std::uint64_t z) noexcept {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/// splitmix64: the z-th output of the stream (golden-ratio increment, then the finaliser).
inline constexpr std::uint64_t splitmix64(std::uint64_t z) noexcept {
  return mix64(z + 0x9e3779b97f4a7c15ull);
}

/// A 32-bit mixer with low bias (Wellons' lowbias32); cheap enough to vectorise per entry.
PACTRAIN_ALWAYS_INLINE PACTRAIN_HOST_DEVICE constexpr std::uint32_t lowbias32(
    std::uint32_t x) noexcept {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

}  // namespace pactrain::detail
