// The ranking behind the magnitude pruning policies: which `keep` of n scores are the highest
// (ties to the lower index), as bitmap words, in linear time. Internal.
#pragma once

#include <pactrain/detail/config.hpp>
#include <pactrain/detail/cpu.hpp>
#include <pactrain/error.hpp>

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <type_traits>
#include <vector>

namespace pactrain::detail {

// An unsigned key whose order is the score's (floats by their bits, negatives flipped).
template <class S>
auto order_key(S s) noexcept {
  if constexpr (std::is_floating_point_v<S>) {
    using K = std::conditional_t<sizeof(S) == 4, std::uint32_t, std::uint64_t>;
    const auto b = std::bit_cast<K>(s == S(0) ? S(0) : s);  // -0 ties with +0, as in a compare
    constexpr K sign = K{1} << (8 * sizeof(K) - 1);
    return (b & sign) != 0 ? static_cast<K>(~b) : static_cast<K>(b | sign);
  } else {
    return static_cast<std::make_unsigned_t<S>>(s);
  }
}

// Below this many scores, nth_element; above, radix selection.
inline constexpr std::size_t radix_select_min = 4096;

// Bit j of the result is byte j of the 8 bytes at b, each 0 or 1: the multiply moves byte j's
// bit to bit 56 + j, and no two partial products overlap there.
inline std::uint64_t pack_bytes8(const unsigned char* b) noexcept {
  std::uint64_t x = 0;
  std::memcpy(&x, b, 8);
  return (x * 0x0102040810204080ULL) >> 56;
}

// The bits of the 64 keys at k that are above `prefix` and equal to it. The compares write
// bytes, a loop the compiler vectorises, and pack_bytes8 turns them into bits: a shift and an
// OR per key into a word did not vectorise and cost a large share of a ranking.
template <class K>
PACTRAIN_ALWAYS_INLINE void above_and_equal(const K* k, K prefix, std::uint64_t& above,
                                            std::uint64_t& equal) noexcept {
  unsigned char gt[64];
  unsigned char eq[64];
  for (std::size_t j = 0; j < 64; ++j) {
    gt[j] = static_cast<unsigned char>(k[j] > prefix);
    eq[j] = static_cast<unsigned char>(k[j] == prefix);
  }
  above = 0;
  equal = 0;
  for (unsigned q = 0; q < 8; ++q) {
    above |= pack_bytes8(gt + 8 * q) << (8 * q);
    equal |= pack_bytes8(eq + 8 * q) << (8 * q);
  }
}

// The kept words of top_words' last pass: every key above `prefix`, and the first `need` keys
// equal to it (lowest index first).
template <class K>
PACTRAIN_ALWAYS_INLINE void kept_words_body(const K* key, std::size_t n, K prefix, std::size_t need,
                                            std::uint64_t* words) noexcept {
  for (std::size_t w = 0; w < words_for(n); ++w) {
    const std::size_t base = w * 64;
    std::uint64_t higher = 0;
    std::uint64_t equal = 0;
    if (n - base >= 64) {
      above_and_equal(key + base, prefix, higher, equal);
    } else {
      for (std::size_t j = 0; j < n - base; ++j) {
        higher |= static_cast<std::uint64_t>(key[base + j] > prefix) << j;
        equal |= static_cast<std::uint64_t>(key[base + j] == prefix) << j;
      }
    }
    if (need != 0 && equal != 0) {
      if (static_cast<std::size_t>(std::popcount(equal)) > need) {
        std::uint64_t beyond = equal;  // the equal ones after the first `need`
        for (std::size_t t = 0; t < need; ++t) beyond &= beyond - 1;
        equal ^= beyond;
      }
      need -= static_cast<std::size_t>(std::popcount(equal));
      higher |= equal;
    }
    words[w] = higher;
  }
}

#if PACTRAIN_HAS_X86_KERNELS
template <class K>
__attribute__((target("avx2"))) PACTRAIN_VECTORIZE void kept_words_avx2(
    const K* key, std::size_t n, K prefix, std::size_t need, std::uint64_t* words) noexcept {
  kept_words_body(key, n, prefix, need, words);
}
#endif

template <class K>
PACTRAIN_VECTORIZE void kept_words(const K* key, std::size_t n, K prefix, std::size_t need,
                                   std::uint64_t* words) noexcept {
#if PACTRAIN_HAS_X86_KERNELS
  if (cpu().avx2) return kept_words_avx2(key, n, prefix, need, words);
#endif
  kept_words_body(key, n, prefix, need, words);
}

// Kept flags of the `keep` highest scores among n (score descending, index ascending).
// Large n: radix selection on the scores' order keys, most significant digit first, 11 bits a
// digit (a 2,048-bin histogram stays in L1). The first digit is counted while the keys are
// made; the keys sharing it with the keep-th highest are copied out, and each later digit is
// counted over those alone (usually a small share of n). A last pass keeps every higher key
// and the lowest-indexed equal ones, 64 at a time, without a branch per key. Linear time and
// sequential reads, where nth_element over an index array jumps around. It halved the time of
// 16-bit digits, each counted over all n, with a branch per key in the last pass
// (bench/micro/policy_bench.cpp; bench/results/measurements.md).
template <class Score>
std::vector<std::uint64_t> top_words(std::size_t n, std::size_t keep, Score&& score) {
  std::vector<std::uint64_t> words(words_for(n), 0);
  if (keep == 0) return words;
  if (keep >= n || n < radix_select_min) {
    std::vector<std::size_t> idx(n);
    for (std::size_t i = 0; i < n; ++i) idx[i] = i;
    if (keep < n) {
      const auto before = [&](std::size_t a, std::size_t b) {
        const auto sa = score(a);
        const auto sb = score(b);
        return sa > sb || (sa == sb && a < b);
      };
      std::nth_element(idx.begin(), idx.begin() + static_cast<std::ptrdiff_t>(keep - 1), idx.end(),
                       before);
      idx.resize(keep);
    }
    for (std::size_t i : idx) words[i / 64] |= 1ULL << (i % 64);
    return words;
  }
  using K = decltype(order_key(score(std::size_t{0})));
  constexpr int digit_bits = 11;
  std::vector<std::size_t> hist(std::size_t{1} << digit_bits);
  // The shift of the digit being counted.
  int shift = std::max(8 * static_cast<int>(sizeof(K)) - digit_bits, 0);
  // Each score once (a random policy's is a hash); every entry is written before it is read.
  const auto key = std::make_unique_for_overwrite<K[]>(n);
  for (std::size_t i = 0; i < n; ++i) {
    key[i] = order_key(score(i));
    ++hist[static_cast<std::size_t>(key[i] >> shift)];
  }
  K prefix = 0;             // the digits of the keep-th highest key found so far
  std::size_t need = keep;  // how many still to take among keys matching the prefix
  std::vector<K> candidates;
  std::span<const K> in(key.get(), n);  // the keys matching the prefix above the digit counted
  for (;;) {
    std::size_t above = 0;
    std::size_t d = hist.size() - 1;
    while (above + hist[d] < need) above += hist[d--];
    need -= above;
    prefix |= static_cast<K>(static_cast<K>(d) << shift);
    if (shift == 0) break;
    const int next_shift = std::max(shift - digit_bits, 0);
    const K low = static_cast<K>((K{1} << (shift - next_shift)) - 1);
    if (hist[d] != in.size()) {  // copy out the keys with digit d (without a branch per key)
      std::vector<K> match(hist[d] + 1);
      std::size_t m = 0;
      for (const K k : in) {
        match[m] = k;
        m += static_cast<std::size_t>(static_cast<K>(k >> shift) == (prefix >> shift));
      }
      match.pop_back();
      candidates = std::move(match);
      in = candidates;
    }
    shift = next_shift;
    std::fill(hist.begin(), hist.end(), 0);
    for (const K k : in) ++hist[static_cast<std::size_t>((k >> shift) & low)];
  }
  // prefix is the keep-th highest key; `need` of the keys equal to it are kept, lowest first.
  kept_words(key.get(), n, prefix, need, words.data());
  return words;
}

/// Bits [first, first + n) of `words` as words of their own (bit 0 is bit `first`).
inline std::vector<std::uint64_t> bit_range(std::span<const std::uint64_t> words, std::size_t first,
                                            std::size_t n) {
  std::vector<std::uint64_t> out(words_for(n), 0);
  const std::size_t w0 = first / 64;
  const unsigned shift = static_cast<unsigned>(first % 64);
  for (std::size_t k = 0; k < out.size(); ++k) {
    std::uint64_t v = words[w0 + k] >> shift;
    if (shift != 0 && w0 + k + 1 < words.size()) v |= words[w0 + k + 1] << (64 - shift);
    out[k] = v;
  }
  if (n % 64 != 0) out.back() &= (std::uint64_t{1} << (n % 64)) - 1;
  return out;
}

}  // namespace pactrain::detail
