// Deterministic, exactly summable test data and random masks shared by the tests.
#pragma once

#include <pactrain/detail/random.hpp>
#include <pactrain/layout.hpp>
#include <pactrain/mask.hpp>

#include <bit>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace pactrain::test {

inline std::uint64_t mix(std::uint64_t z) noexcept { return pactrain::detail::splitmix64(z); }

inline std::uint64_t hash3(std::uint64_t a, std::uint64_t b, std::uint64_t c) noexcept {
  return mix(a ^ mix(b ^ mix(c)));
}

/// A dyadic value in [-125, 125] with 3 fractional bits: sums of a few thousand of them are
/// exact in float, whatever the order.
template <class T>
T value(std::uint64_t seed, std::uint64_t rank, std::uint64_t i) noexcept {
  const auto v = static_cast<std::int64_t>(hash3(seed, rank, i) % 2001) - 1000;
  return static_cast<T>(v) / T(8);
}

template <class T>
std::vector<T> values(std::size_t n, std::uint64_t seed, std::uint64_t rank = 0) {
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = value<T>(seed, rank, i);
  return v;
}

/// m / 8 with |m| <= limit: with limit 255 (half) or 15 (bf16) every partial sum over up to 4
/// ranks is representable, so 16-bit reductions are exact in any order.
inline std::vector<float> small_values(std::size_t n, std::uint64_t seed, std::uint64_t rank,
                                       int limit) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) {
    const auto m = static_cast<int>(hash3(seed, rank, i) % (2 * limit + 1)) - limit;
    v[i] = static_cast<float>(m) / 8.0f;
  }
  return v;
}

/// Keeps each entry with probability `density`, decided by a hash of (seed, i).
inline bitmap_mask random_mask(std::size_t n, double density, std::uint64_t seed) {
  const auto threshold = static_cast<std::uint64_t>(density * 18446744073709551615.0);
  return bitmap_mask::from_predicate(n, [&](std::size_t i) {
    return density >= 1.0 || (density > 0.0 && mix(seed * 1000003ULL + i) < threshold);
  });
}

/// A random mask that keeps whole blocks of B entries.
template <std::size_t B>
block_mask<B> random_block_mask(std::size_t n, double density, std::uint64_t seed) {
  return block_mask<B>(n, random_mask(block_mask<B>::block_count(n), density, seed));
}

/// One random mask per tensor of a layout, of any representation (block masks keep whole
/// blocks).
template <class Mask>
std::vector<Mask> masks_for(const param_layout& l, double density, std::uint64_t seed) {
  std::vector<Mask> m;
  for (const auto& t : l.tensors()) {
    if constexpr (Mask::kind == mask_kind::block) {
      m.push_back(random_block_mask<Mask::block_size>(t.size, density, seed + t.offset));
    } else {
      m.push_back(mask_cast<Mask>(random_mask(t.size, density, seed + t.offset)));
    }
  }
  return m;
}

/// The flat gradient g with pruned entries set to zero.
template <class Mask, class T>
std::vector<T> masked(const param_layout& l, const std::vector<Mask>& masks, std::vector<T> g) {
  for (std::size_t i = 0; i < l.tensor_count(); ++i) {
    const auto& t = l.tensor(i);
    for (std::size_t j = 0; j < t.size; ++j) {
      if (!masks[i].test(j)) g[t.offset + j] = T(0);
    }
  }
  return g;
}

/// Values in [-0.99, 0.99] that are not dyadic (for codecs, whose rounding they exercise):
/// entry i is a hash of (a, b, i).
inline std::vector<float> spread_values(std::size_t n, std::uint64_t a, std::uint64_t b) {
  std::vector<float> g(n);
  for (std::size_t i = 0; i < n; ++i) {
    g[i] = static_cast<float>(static_cast<int>(hash3(a, b, i) % 2001) - 1000) / 1013.0f;
  }
  return g;
}

/// True when a and b hold the same floats bit for bit (NaNs and signed zeros included).
inline bool same_bits(std::span<const float> a, std::span<const float> b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::bit_cast<std::uint32_t>(a[i]) != std::bit_cast<std::uint32_t>(b[i])) return false;
  }
  return true;
}

/// A small model in three buckets of at most 300 entries, with an empty tensor.
inline param_layout small_layout() {
  param_layout l(300);
  l.add("fc1.weight", 20, 13).add("fc1.bias", 20).add("empty", 0).add("fc2.weight", 7, 71);
  l.add("fc2.bias", 7);
  return l;
}

/// Nine words and a tail of 13 entries: whole words kept or pruned, single bytes and nibbles,
/// alternating bits, and a last word that ends mid-byte, so that every fast path and every
/// tail of a compaction kernel is taken.
inline bitmap_mask word_pattern_mask() {
  return bitmap_mask::from_predicate(64 * 9 + 13, [](std::size_t i) {
    const std::size_t j = i % 64;
    switch (i / 64) {
      case 0: return true;
      case 1: return false;
      case 2: return j < 8;
      case 3: return j % 2 == 1;
      case 4: return j >= 60;
      case 5: return j % 9 == 0;
      case 6: return (j / 4) % 2 == 0;
      case 7: return j == 63;
      case 8: return j != 5;
      default: return j % 3 != 0;
    }
  });
}

inline constexpr double densities[] = {0.0, 0.01, 0.5, 0.99, 1.0};
inline constexpr std::size_t sizes[] = {0, 1, 7, 63, 64, 65, 127, 200, 1000, 4099};

}  // namespace pactrain::test
