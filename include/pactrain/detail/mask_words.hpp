// What every mask type shares: the serialisation tags (mask_kind, public, named by mask.hpp),
// and the canonical words of any mask with what is computed from them: the word stream that
// digests are defined on, the number of kept runs, the digest. Included by mask.hpp.
#pragma once

#include <pactrain/digest.hpp>

#include <algorithm>
#include <bit>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>

namespace pactrain {

/// Serialisation tags of the mask representations; part of the binary format.
enum class mask_kind : std::uint32_t { bitmap = 1, index = 2, block = 3 };

namespace detail {

inline constexpr std::size_t words_for(std::size_t bits) noexcept { return (bits + 63) / 64; }

/// A callable that accepts (begin, length) runs; used to state the gradient_mask concept.
struct run_sink {
  void operator()(std::size_t, std::size_t) const noexcept {}
};

/// A bitmap mask whose words() are the canonical words (bit i % 64 of word i / 64 is entry i,
/// the bits past size() zero), which the helpers below read directly.
template <class M>
concept word_bitmap = (M::kind == mask_kind::bitmap) && requires(const M& m) {
  { m.words() } -> std::convertible_to<std::span<const std::uint64_t>>;
};

/// Streams the entry-level 64-bit words of any mask, in order, from its runs (a word_bitmap's
/// are its own): the canonical form that digests are defined on. O(size/64 + runs).
template <class Mask, class F>
void for_each_word(const Mask& m, F&& emit) {
  if constexpr (word_bitmap<Mask>) {
    for (const std::uint64_t w : m.words()) emit(w);
  } else {
    const std::size_t nwords = words_for(m.size());
    std::size_t wi = 0;
    std::uint64_t cur = 0;
    m.for_each_run([&](std::size_t begin, std::size_t len) {
      std::size_t pos = begin;
      const std::size_t end = begin + len;
      while (pos < end) {
        const std::size_t w = pos / 64;
        while (wi < w) {
          emit(cur);
          cur = 0;
          ++wi;
        }
        const unsigned lo = static_cast<unsigned>(pos % 64);
        const std::size_t take = std::min<std::size_t>(64 - lo, end - pos);
        const std::uint64_t bits = take == 64 ? ~0ULL : (((1ULL << take) - 1) << lo);
        cur |= bits;
        pos += take;
      }
    });
    while (wi < nwords) {
      emit(cur);
      cur = 0;
      ++wi;
    }
  }
}

/// The number of maximal runs of kept entries: a word_bitmap's from its words (a run starts at
/// every kept bit whose predecessor is not kept), O(size/64); any other mask's from its runs.
template <class Mask>
std::size_t run_count(const Mask& m) {
  std::size_t runs = 0;
  if constexpr (word_bitmap<Mask>) {
    std::uint64_t carry = 0;  // the last bit of the word before
    for (const std::uint64_t w : m.words()) {
      runs += static_cast<std::size_t>(std::popcount(w & ~((w << 1) | carry)));
      carry = w >> 63;
    }
  } else {
    m.for_each_run([&](std::size_t, std::size_t) { ++runs; });
  }
  return runs;
}

/// The digest of a mask: its size, then its canonical words.
template <class Mask>
std::uint64_t mask_digest(const Mask& m) {
  digest_builder d(0x6d61736b);  // "mask"
  d.add(static_cast<std::uint64_t>(m.size()));
  for_each_word(m, [&](std::uint64_t w) { d.add(w); });
  return d.value();
}

}  // namespace detail
}  // namespace pactrain
