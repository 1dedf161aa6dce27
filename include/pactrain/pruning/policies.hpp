// Pruning policies: weights -> one mask per tensor. Every policy is rank-invariant: equal
// weights give equal masks on every rank and machine (ties broken by index, lower index
// kept). Target counts are exact: pruned(n, s) = floor(s * n + 0.5), clamped to [0, n].
#pragma once

#include <pactrain/compactor.hpp>
#include <pactrain/detail/config.hpp>
#include <pactrain/detail/cpu.hpp>
#include <pactrain/detail/finite.hpp>
#include <pactrain/digest.hpp>
#include <pactrain/error.hpp>
#include <pactrain/layout.hpp>
#include <pactrain/mask.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace pactrain {

/// How many of n entries (or blocks) sparsity s prunes; see the header comment.
inline std::size_t pruned_count(std::size_t n, double sparsity) {
  PACTRAIN_EXPECTS(sparsity >= 0.0 && sparsity <= 1.0,
                   "pruning: sparsity " + std::to_string(sparsity) + " is outside [0, 1]");
  const double p = std::floor(sparsity * static_cast<double>(n) + 0.5);
  return std::min(n, static_cast<std::size_t>(p));
}

namespace detail {

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
// OR per key into a word did not vectorise and took a third of a ranking.
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
// sequential reads, where nth_element over an index array jumps around. On 1Mi magnitudes
// (bench/policy_bench.cpp) 3.0 ms at 50% kept, where 16-bit digits, each counted over all n,
// and a branch per key in the last pass took 6.5 ms.
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

template <class T>
void check_finite(std::span<const T> w, const tensor_info& t) {
  if (all_finite(w)) return;  // the vectorised pass; the loop below finds the culprit
  for (std::size_t i = 0; i < w.size(); ++i) {
    PACTRAIN_EXPECTS(std::isfinite(w[i]), "pruning: weight " + std::to_string(i) + " of tensor '" +
                                              t.name + "' is not finite");
  }
}

template <class T>
void check_inputs(const param_layout& l, std::span<const T> w, const std::vector<bool>& prunable) {
  PACTRAIN_EXPECTS(w.data() != nullptr || w.empty(), "pruning: null weight buffer");
  PACTRAIN_EXPECTS(w.size() == l.total_size(),
                   "pruning: weight buffer has " + std::to_string(w.size()) +
                       " entries, the layout " + std::to_string(l.total_size()));
  PACTRAIN_EXPECTS(prunable.size() == l.tensor_count(),
                   "pruning: " + std::to_string(prunable.size()) + " prunable flags for " +
                       std::to_string(l.tensor_count()) + " tensors");
  for (std::size_t i = 0; i < l.tensor_count(); ++i) {
    if (prunable[i]) check_finite(w.subspan(l.tensor(i).offset, l.tensor(i).size), l.tensor(i));
  }
}

// The masks of a policy: a full mask for every tensor not flagged prunable, `make(t, x)` for
// the others in layout order (x: the tensor's weights). The inputs have passed check_inputs.
template <class Mask, class T, class Make>
std::vector<Mask> masks_per_tensor(const param_layout& l, std::span<const T> w,
                                   const std::vector<bool>& prunable, Make&& make) {
  std::vector<Mask> masks;
  masks.reserve(l.tensor_count());
  for (std::size_t i = 0; i < l.tensor_count(); ++i) {
    const auto& t = l.tensor(i);
    if (prunable[i]) {
      masks.push_back(make(t, w.data() + t.offset));
    } else {
      masks.push_back(Mask::full(t.size));
    }
  }
  return masks;
}

}  // namespace detail

/// P::mask_type and p.compute(layout, weights, sparsity, prunable): one mask per tensor, full
/// where prunable is false. Throws pactrain::error on bad sizes, non-finite prunable weights or
/// a sparsity outside [0, 1].
template <class P>
concept pruning_policy = gradient_mask<typename P::mask_type> &&
    requires(const P& p, const param_layout& l, std::span<const float> w, double s,
             const std::vector<bool>& prunable) {
  { p.compute(l, w, s, prunable) } -> std::same_as<std::vector<typename P::mask_type>>;
};

/// Whether magnitude policies rank entries within each tensor or across all prunable ones.
enum class pruning_scope { per_tensor, global };

/// Prunes the smallest |w|: pruned(size, s) entries of each prunable tensor (per_tensor) or
/// pruned(total prunable, s) across them (global), ranked by |w| then flat index.
struct magnitude_pruning {
  using mask_type = bitmap_mask;
  pruning_scope scope = pruning_scope::per_tensor;

  template <gradient_value T>
  std::vector<bitmap_mask> compute(const param_layout& l, std::span<const T> w, double sparsity,
                                   const std::vector<bool>& prunable) const {
    detail::check_inputs(l, w, prunable);
    if (scope == pruning_scope::per_tensor) {
      return detail::masks_per_tensor<bitmap_mask>(
          l, w, prunable, [&](const tensor_info& t, const T* x) {
            const std::size_t keep = t.size - pruned_count(t.size, sparsity);
            return bitmap_mask(t.size, detail::top_words(t.size, keep, [x](std::size_t j) {
                                 return std::abs(x[j]);
                               }));
          });
    }
    // Global: rank every prunable entry by (|w|, flat index); one threshold for all. Their
    // magnitudes lie in one array in flat order, so position order is flat-index order, and
    // each tensor's mask is a run of the kept bits.
    std::size_t total = 0;
    for (std::size_t i = 0; i < l.tensor_count(); ++i) total += prunable[i] ? l.tensor(i).size : 0;
    const auto mag = std::make_unique_for_overwrite<T[]>(total);  // each entry written once
    for (std::size_t i = 0, at = 0; i < l.tensor_count(); ++i) {
      if (!prunable[i]) continue;
      const tensor_info& t = l.tensor(i);
      const T* x = w.data() + t.offset;
      for (std::size_t j = 0; j < t.size; ++j) mag[at + j] = std::abs(x[j]);
      at += t.size;
    }
    const std::size_t keep = total - pruned_count(total, sparsity);
    const auto kept = detail::top_words(total, keep, [&](std::size_t k) { return mag[k]; });
    std::size_t base = 0;  // the tensor's first position among the prunable entries
    return detail::masks_per_tensor<bitmap_mask>(
        l, w, prunable, [&](const tensor_info& t, const T*) {
          bitmap_mask m(t.size, detail::bit_range(kept, base, t.size));
          base += t.size;
          return m;
        });
  }
};

/// N:M along rows (a tensor without a matrix shape is one row): each group of M keeps its N
/// largest |w| (ties by index), a row's short last group of g keeps min(N, g). Any sparsity > 0
/// applies this fixed pattern; 0 keeps everything (the dense warm-up).
class nm_pruning {
 public:
  using mask_type = bitmap_mask;

  /// Throws pactrain::error unless 0 < N <= M.
  nm_pruning(std::size_t n, std::size_t m) : n_(n), m_(m) {
    PACTRAIN_EXPECTS(m > 0 && n > 0 && n <= m, "nm_pruning: need 0 < N <= M, got " +
                                                   std::to_string(n) + ":" + std::to_string(m));
  }
  [[nodiscard]] std::size_t n() const noexcept { return n_; }
  [[nodiscard]] std::size_t m() const noexcept { return m_; }

  template <gradient_value T>
  std::vector<bitmap_mask> compute(const param_layout& l, std::span<const T> w, double sparsity,
                                   const std::vector<bool>& prunable) const {
    detail::check_inputs(l, w, prunable);
    (void)pruned_count(0, sparsity);  // validates the range
    return detail::masks_per_tensor<bitmap_mask>(
        l, w, prunable, [&](const tensor_info& t, const T* x) {
          if (sparsity == 0.0) return bitmap_mask::full(t.size);
          const std::size_t row = t.cols > 0 ? t.cols : t.size;
          std::vector<std::uint64_t> words(detail::words_for(t.size), 0);
          for (std::size_t r0 = 0; r0 < t.size; r0 += row) {
            for (std::size_t g0 = r0; g0 < r0 + row; g0 += m_) {
              const std::size_t g = std::min(m_, r0 + row - g0);
              const auto kept = detail::top_words(
                  g, std::min(n_, g), [&](std::size_t j) { return std::abs(x[g0 + j]); });
              for (std::size_t j = 0; j < g; ++j) {
                if ((kept[j / 64] >> (j % 64)) & 1U)
                  words[(g0 + j) / 64] |= 1ULL << ((g0 + j) % 64);
              }
            }
          }
          return bitmap_mask(t.size, std::move(words));
        });
  }

 private:
  std::size_t n_;
  std::size_t m_;
};

/// Prunes whole blocks of B entries with the smallest mean |w| (a short last block is scored
/// by its own length): pruned(blocks, s) blocks of each prunable tensor.
template <std::size_t B>
struct block_magnitude_pruning {
  using mask_type = block_mask<B>;

  template <gradient_value T>
  std::vector<block_mask<B>> compute(const param_layout& l, std::span<const T> w, double sparsity,
                                     const std::vector<bool>& prunable) const {
    detail::check_inputs(l, w, prunable);
    return detail::masks_per_tensor<block_mask<B>>(
        l, w, prunable, [&](const tensor_info& t, const T* x) {
          const std::size_t nb = block_mask<B>::block_count(t.size);
          std::vector<double> score(nb, 0.0);
          for (std::size_t b = 0; b < nb; ++b) {
            const std::size_t end = std::min(t.size, (b + 1) * B);
            double sum = 0;
            for (std::size_t j = b * B; j < end; ++j) sum += std::abs(static_cast<double>(x[j]));
            score[b] = sum / static_cast<double>(end - b * B);
          }
          const std::size_t keep = nb - pruned_count(nb, sparsity);
          return block_mask<B>(
              t.size, bitmap_mask(nb, detail::top_words(nb, keep,
                                                        [&](std::size_t b) { return score[b]; })));
        });
  }
};

/// Prunes pruned(size, s) entries of each prunable tensor chosen by a hash of (seed, tensor,
/// index): a baseline that ignores the weights. Ranks sharing the seed agree.
struct random_pruning {
  using mask_type = bitmap_mask;
  std::uint64_t seed = 0;

  template <gradient_value T>
  std::vector<bitmap_mask> compute(const param_layout& l, std::span<const T> w, double sparsity,
                                   const std::vector<bool>& prunable) const {
    detail::check_inputs(l, w, prunable);
    return detail::masks_per_tensor<bitmap_mask>(
        l, w, prunable, [&](const tensor_info& t, const T*) {
          const auto i = static_cast<std::uint64_t>(&t - l.tensors().data());
          const std::uint64_t key = digest_builder(seed).add(i).value();
          const std::size_t keep = t.size - pruned_count(t.size, sparsity);
          return bitmap_mask(
              t.size, detail::top_words(t.size, keep, [key](std::size_t j) {
                return digest_builder(key).add(static_cast<std::uint64_t>(j)).value();
              }));
        });
  }
};

static_assert(pruning_policy<magnitude_pruning>);
static_assert(pruning_policy<nm_pruning>);
static_assert(pruning_policy<block_magnitude_pruning<16>>);
static_assert(pruning_policy<random_pruning>);

}  // namespace pactrain
