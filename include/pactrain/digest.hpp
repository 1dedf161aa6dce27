// A portable 64-bit digest: the same value for the same input on every machine.
//
// The agreement compares digests of masks and layouts across ranks, so the digest is
// defined on values (64-bit words, lengths, characters), never on in-memory bytes, and has
// no endianness or padding dependence. It is a fast mixing hash, not a cryptographic one.
#pragma once

#include <pactrain/detail/random.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

namespace pactrain {

/// Streaming digest over 64-bit words. Feed it with `add`, read it with `value`.
class digest_builder {
 public:
  constexpr explicit digest_builder(std::uint64_t seed = 0) noexcept
      : state_(seed ^ 0x9e3779b97f4a7c15ULL) {}

  constexpr digest_builder& add(std::uint64_t word) noexcept {
    state_ = rotl(state_ ^ mix(word + length_), 27) * 0x9fb21c651e98df25ULL + 0x2b7e151628aed2a7ULL;
    ++length_;
    return *this;
  }

  constexpr digest_builder& add(std::span<const std::uint64_t> words) noexcept {
    for (std::uint64_t w : words) add(w);
    return *this;
  }

  /// Adds a string: its length, then its characters packed eight to a word (little end
  /// first), so "ab" and "a","b" differ.
  constexpr digest_builder& add(std::string_view s) noexcept {
    return add_packed(s, [](char c) { return static_cast<unsigned char>(c); });
  }

  /// Adds bytes the same way.
  constexpr digest_builder& add_bytes(std::span<const std::byte> bytes) noexcept {
    return add_packed(bytes, [](std::byte b) { return static_cast<unsigned char>(b); });
  }

  [[nodiscard]] constexpr std::uint64_t value() const noexcept { return mix(state_ ^ length_); }

 private:
  template <class Range, class ToByte>
  constexpr digest_builder& add_packed(const Range& r, ToByte to_byte) noexcept {
    add(static_cast<std::uint64_t>(r.size()));
    std::uint64_t w = 0;
    std::size_t k = 0;
    for (auto x : r) {
      w |= static_cast<std::uint64_t>(to_byte(x)) << (8 * k);
      if (++k == 8) {
        add(w);
        w = 0;
        k = 0;
      }
    }
    if (k != 0) add(w);
    return *this;
  }

  static constexpr std::uint64_t rotl(std::uint64_t x, int r) noexcept {
    return (x << r) | (x >> (64 - r));
  }
  static constexpr std::uint64_t mix(std::uint64_t z) noexcept { return detail::mix64(z); }

  std::uint64_t state_;
  std::uint64_t length_ = 0;
};

}  // namespace pactrain
