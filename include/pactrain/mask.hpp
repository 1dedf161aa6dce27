// Gradient masks: which entries of a tensor the pruning keeps.
//
// Three representations model the `gradient_mask` concept:
//   bitmap_mask    one bit per entry in 64-bit words, plus a per-word rank prefix so the
//                  payload slot of a kept entry, rank(i), is O(1);
//   index_mask     the sorted indices of the kept entries (compact at low density);
//   block_mask<B>  one bit per block of B consecutive entries (structured pruning).
// All three describe the same thing, a set of kept entries of a tensor of size() entries, and
// convert into one another with mask_cast. digest() depends only on that set and the size, so
// equal masks have equal digests whatever their representation and on every machine.
#pragma once

#include <pactrain/detail/config.hpp>
#include <pactrain/detail/mask_words.hpp>
#include <pactrain/digest.hpp>
#include <pactrain/error.hpp>

#include <algorithm>
#include <bit>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace pactrain {

// mask_kind (the serialisation tags), detail::words_for and detail::run_sink are in
// detail/mask_words.hpp, with the helpers every mask type shares.

/// A set of kept entries of a tensor of `size()` entries. `for_each_run(f)` calls f(begin,
/// length) for every maximal run of kept entries, in increasing order; `full(n)` keeps every
/// entry and `none(n)` keeps none.
template <class M>
concept gradient_mask = std::regular<M> && requires(const M& m, std::size_t i, detail::run_sink f) {
  { m.size() } -> std::same_as<std::size_t>;
  { m.count() } -> std::same_as<std::size_t>;
  { m.test(i) } -> std::same_as<bool>;
  { m.digest() } -> std::same_as<std::uint64_t>;
  m.for_each_run(f);
  { M::full(i) } -> std::same_as<M>;
  { M::none(i) } -> std::same_as<M>;
  { M::kind } -> std::convertible_to<mask_kind>;
};

// --------------------------------------------------------------------------------------------

/// One bit per entry. test(i) and slot(i) are O(1).
class bitmap_mask {
 public:
  static constexpr mask_kind kind = mask_kind::bitmap;

  /// An empty mask of size 0.
  bitmap_mask() : rank_(1, 0) {}

  /// A mask of n entries, all kept (value = true) or all pruned.
  explicit bitmap_mask(std::size_t n, bool value = false)
      : size_(n), words_(detail::words_for(n), value ? ~0ULL : 0ULL) {
    clear_tail();
    build_rank();
  }

  /// A mask from its words: bit i % 64 of words[i / 64] is entry i. Throws pactrain::error
  /// unless words.size() == ceil(n / 64) and the bits past n are zero.
  bitmap_mask(std::size_t n, std::vector<std::uint64_t> words)
      : size_(n), words_(std::move(words)) {
    PACTRAIN_EXPECTS(words_.size() == detail::words_for(n),
                     "bitmap_mask: " + std::to_string(words_.size()) + " words given for " +
                         std::to_string(n) + " entries, expected " +
                         std::to_string(detail::words_for(n)));
    if (n % 64 != 0) {
      PACTRAIN_EXPECTS((words_.back() >> (n % 64)) == 0,
                       "bitmap_mask: bits set past the last entry");
    }
    build_rank();
  }

  static bitmap_mask full(std::size_t n) { return bitmap_mask(n, true); }
  static bitmap_mask none(std::size_t n) { return bitmap_mask(n, false); }

  /// A mask keeping entry i where keep(i) is true.
  template <class Pred>
  static bitmap_mask from_predicate(std::size_t n, Pred&& keep) {
    std::vector<std::uint64_t> w(detail::words_for(n), 0);
    for (std::size_t i = 0; i < n; ++i) {
      if (keep(i)) w[i / 64] |= 1ULL << (i % 64);
    }
    return bitmap_mask(n, std::move(w));
  }

  /// A bitmap of any other mask.
  template <gradient_mask Mask>
  static bitmap_mask from_mask(const Mask& m) {
    std::vector<std::uint64_t> w;
    w.reserve(detail::words_for(m.size()));
    detail::for_each_word(m, [&](std::uint64_t x) { w.push_back(x); });
    return bitmap_mask(m.size(), std::move(w));
  }

  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] std::size_t count() const noexcept {
    return static_cast<std::size_t>(rank_.back());
  }
  [[nodiscard]] bool test(std::size_t i) const noexcept {
    return i < size_ && ((words_[i / 64] >> (i % 64)) & 1U) != 0;
  }
  /// Number of kept entries before entry i (i <= size()): the payload slot of entry i when
  /// it is kept.
  [[nodiscard]] std::size_t rank(std::size_t i) const noexcept {
    if (i >= size_) return count();
    const std::uint64_t below = words_[i / 64] & ((1ULL << (i % 64)) - 1);
    return static_cast<std::size_t>(rank_[i / 64]) + static_cast<std::size_t>(std::popcount(below));
  }

  [[nodiscard]] std::span<const std::uint64_t> words() const noexcept { return words_; }
  /// rank_prefix()[w] = kept entries in words [0, w); one more element than words().
  [[nodiscard]] std::span<const std::uint64_t> rank_prefix() const noexcept { return rank_; }

  [[nodiscard]] std::uint64_t digest() const {
    digest_builder d(0x6d61736b);
    d.add(static_cast<std::uint64_t>(size_));
    d.add(std::span<const std::uint64_t>(words_));
    return d.value();
  }

  template <class F>
  void for_each_run(F&& f) const {
    std::size_t pos = 0;
    while (pos < size_) {
      const std::size_t begin = find_next(pos, true);
      if (begin >= size_) break;
      const std::size_t end = find_next(begin, false);
      f(begin, end - begin);
      pos = end;
    }
  }

  friend bool operator==(const bitmap_mask& a, const bitmap_mask& b) noexcept {
    return a.size_ == b.size_ && a.words_ == b.words_;
  }

 private:
  void clear_tail() noexcept {
    if (size_ % 64 != 0) words_.back() &= (1ULL << (size_ % 64)) - 1;
  }
  void build_rank() {
    rank_.assign(words_.size() + 1, 0);
    for (std::size_t w = 0; w < words_.size(); ++w) {
      rank_[w + 1] = rank_[w] + static_cast<std::uint64_t>(std::popcount(words_[w]));
    }
  }
  // First position >= pos whose bit equals `bit`, or size_ if none.
  [[nodiscard]] std::size_t find_next(std::size_t pos, bool bit) const noexcept {
    std::size_t wi = pos / 64;
    std::uint64_t w = bit ? words_[wi] : ~words_[wi];
    w &= ~0ULL << (pos % 64);
    while (w == 0) {
      if (++wi == words_.size()) return size_;
      w = bit ? words_[wi] : ~words_[wi];
    }
    return std::min(size_, wi * 64 + static_cast<std::size_t>(std::countr_zero(w)));
  }

  std::size_t size_ = 0;
  std::vector<std::uint64_t> words_;
  std::vector<std::uint64_t> rank_;
};

// --------------------------------------------------------------------------------------------

/// The sorted indices of the kept entries. test(i) is O(log count).
class index_mask {
 public:
  static constexpr mask_kind kind = mask_kind::index;

  index_mask() = default;

  /// Throws pactrain::error unless the indices are strictly increasing and below n.
  index_mask(std::size_t n, std::vector<std::uint64_t> indices)
      : size_(n), indices_(std::move(indices)) {
    for (std::size_t k = 0; k < indices_.size(); ++k) {
      PACTRAIN_EXPECTS(indices_[k] < n, "index_mask: index " + std::to_string(indices_[k]) +
                                            " out of range for " + std::to_string(n) + " entries");
      PACTRAIN_EXPECTS(
          k == 0 || indices_[k - 1] < indices_[k],
          "index_mask: indices not strictly increasing at position " + std::to_string(k));
    }
  }

  static index_mask full(std::size_t n) {
    std::vector<std::uint64_t> v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = i;
    return index_mask(n, std::move(v));
  }
  static index_mask none(std::size_t n) { return index_mask(n, {}); }

  template <gradient_mask Mask>
  static index_mask from_mask(const Mask& m) {
    std::vector<std::uint64_t> v;
    v.reserve(m.count());
    m.for_each_run([&](std::size_t b, std::size_t len) {
      for (std::size_t i = b; i < b + len; ++i) v.push_back(i);
    });
    index_mask r;
    r.size_ = m.size();
    r.indices_ = std::move(v);  // sorted and in range by construction
    return r;
  }

  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] std::size_t count() const noexcept { return indices_.size(); }
  [[nodiscard]] bool test(std::size_t i) const noexcept {
    return std::binary_search(indices_.begin(), indices_.end(), static_cast<std::uint64_t>(i));
  }
  [[nodiscard]] std::span<const std::uint64_t> indices() const noexcept { return indices_; }
  [[nodiscard]] std::uint64_t digest() const { return detail::mask_digest(*this); }

  template <class F>
  void for_each_run(F&& f) const {
    std::size_t k = 0;
    while (k < indices_.size()) {
      std::size_t j = k + 1;
      while (j < indices_.size() && indices_[j] == indices_[j - 1] + 1) ++j;
      f(static_cast<std::size_t>(indices_[k]), j - k);
      k = j;
    }
  }

  friend bool operator==(const index_mask&, const index_mask&) = default;

 private:
  std::size_t size_ = 0;
  std::vector<std::uint64_t> indices_;
};

// --------------------------------------------------------------------------------------------

/// One bit per block of B consecutive entries; the last block may be shorter than B.
template <std::size_t B>
class block_mask {
  static_assert(B > 0, "block_mask<B>: the block size B must be positive");

 public:
  static constexpr mask_kind kind = mask_kind::block;
  static constexpr std::size_t block_size = B;

  block_mask() = default;

  /// Throws pactrain::error unless blocks.size() == ceil(n / B).
  block_mask(std::size_t n, bitmap_mask blocks) : size_(n), blocks_(std::move(blocks)) {
    PACTRAIN_EXPECTS(blocks_.size() == block_count(n),
                     "block_mask: " + std::to_string(blocks_.size()) + " blocks given for " +
                         std::to_string(n) + " entries in blocks of " + std::to_string(B) +
                         ", expected " + std::to_string(block_count(n)));
    count_ = blocks_.count() * B;
    if (n % B != 0 && blocks_.test(blocks_.size() - 1)) count_ -= B - n % B;
  }

  static block_mask full(std::size_t n) { return block_mask(n, bitmap_mask::full(block_count(n))); }
  static block_mask none(std::size_t n) { return block_mask(n, bitmap_mask::none(block_count(n))); }

  /// The block mask equal to `m`. Throws pactrain::error if some block of B entries is
  /// partly kept, since no block mask can represent it.
  template <gradient_mask Mask>
  static block_mask from_mask(const Mask& m) {
    const std::size_t n = m.size();
    std::vector<std::uint64_t> w(detail::words_for(block_count(n)), 0);
    m.for_each_run([&](std::size_t b, std::size_t len) {
      const std::size_t e = b + len;
      PACTRAIN_EXPECTS(b % B == 0 && (e % B == 0 || e == n),
                       "block_mask: mask keeps part of the block of " + std::to_string(B) +
                           " entries at " + std::to_string(((b % B != 0) ? b : e) / B * B) +
                           "; it is not block-structured");
      for (std::size_t k = b / B; k < (e + B - 1) / B; ++k) w[k / 64] |= 1ULL << (k % 64);
    });
    return block_mask(n, bitmap_mask(block_count(n), std::move(w)));
  }

  /// ceil(n / B), without the overflow of n + B - 1.
  static constexpr std::size_t block_count(std::size_t n) noexcept {
    return n / B + (n % B != 0 ? 1 : 0);
  }

  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] std::size_t count() const noexcept { return count_; }
  [[nodiscard]] bool test(std::size_t i) const noexcept { return i < size_ && blocks_.test(i / B); }
  [[nodiscard]] const bitmap_mask& blocks() const noexcept { return blocks_; }
  [[nodiscard]] std::uint64_t digest() const { return detail::mask_digest(*this); }

  template <class F>
  void for_each_run(F&& f) const {
    blocks_.for_each_run([&](std::size_t b, std::size_t len) {
      const std::size_t begin = b * B;
      const std::size_t end = std::min(size_, (b + len) * B);
      f(begin, end - begin);
    });
  }

  friend bool operator==(const block_mask&, const block_mask&) = default;

 private:
  std::size_t size_ = 0;
  std::size_t count_ = 0;
  bitmap_mask blocks_;
};

static_assert(gradient_mask<bitmap_mask>);
static_assert(gradient_mask<index_mask>);
static_assert(gradient_mask<block_mask<64>>);

/// Converts between mask representations; the kept set is preserved exactly. Converting to
/// block_mask<B> throws pactrain::error when the mask is not block-structured.
template <gradient_mask To, gradient_mask From>
To mask_cast(const From& m) {
  if constexpr (std::is_same_v<To, From>) {
    return m;
  } else {
    return To::from_mask(m);
  }
}

}  // namespace pactrain
