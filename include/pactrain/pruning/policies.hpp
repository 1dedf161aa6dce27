// Pruning policies: weights -> one mask per tensor. Every policy is rank-invariant: equal
// weights give equal masks on every rank and machine (ties broken by index, lower index
// kept). Target counts are exact: pruned(n, s) = floor(s * n + 0.5), clamped to [0, n].
#pragma once

#include <pactrain/concepts.hpp>
#include <pactrain/detail/config.hpp>
#include <pactrain/detail/cpu.hpp>
#include <pactrain/detail/finite.hpp>
#include <pactrain/detail/ranking.hpp>
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
