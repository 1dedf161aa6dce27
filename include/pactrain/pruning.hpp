// Pruning: policies that turn weights into masks, schedules that say when and how much,
// and the pruner that drives the mask lifecycle of a sync engine.
//
// Every policy is rank-invariant: equal weights give equal masks on every rank and machine
// (ties are broken by index, lower index kept), so ranks can compute masks locally and the
// mask tracker only confirms what is already true. Target counts are exact:
//   pruned(n, s) = floor(s * n + 0.5), clamped to [0, n]
// entries (or blocks, for block policies) of n are pruned at sparsity s.
#pragma once

#include <pactrain/compactor.hpp>
#include <pactrain/detail/agreement.hpp>
#include <pactrain/digest.hpp>
#include <pactrain/error.hpp>
#include <pactrain/layout.hpp>
#include <pactrain/mask.hpp>
#include <pactrain/serialize.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
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

// Kept flags of the `keep` highest scores among n (score descending, index ascending).
template <class Score>
std::vector<std::uint64_t> top_words(std::size_t n, std::size_t keep, Score&& score) {
  std::vector<std::uint64_t> words(words_for(n), 0);
  if (keep == 0) return words;
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

template <class T>
void check_finite(std::span<const T> w, const tensor_info& t) {
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

}  // namespace detail

/// A policy computes one mask per tensor of a layout from the flat weights:
///   P::mask_type;
///   p.compute(layout, weights, sparsity, prunable) -> std::vector<P::mask_type>
/// Tensors whose prunable flag is false get full masks. Bad input (sizes, non-finite
/// weights, a sparsity outside [0, 1]) throws pactrain::error.
template <class P>
concept pruning_policy = gradient_mask<typename P::mask_type> &&
    requires(const P& p, const param_layout& l, std::span<const float> w, double s,
             const std::vector<bool>& prunable) {
  { p.compute(l, w, s, prunable) } -> std::same_as<std::vector<typename P::mask_type>>;
};

/// Whether magnitude policies rank entries within each tensor or across all prunable ones.
enum class pruning_scope { per_tensor, global };

/// Keeps the largest |w|: per tensor, pruned(size, s) entries of each prunable tensor; global,
/// pruned(total prunable, s) entries across them, ranked by |w| then flat index.
struct magnitude_pruning {
  using mask_type = bitmap_mask;
  pruning_scope scope = pruning_scope::per_tensor;

  template <gradient_value T>
  std::vector<bitmap_mask> compute(const param_layout& l, std::span<const T> w, double sparsity,
                                   const std::vector<bool>& prunable) const {
    detail::check_inputs(l, w, prunable);
    std::vector<bitmap_mask> masks;
    masks.reserve(l.tensor_count());
    if (scope == pruning_scope::per_tensor) {
      for (std::size_t i = 0; i < l.tensor_count(); ++i) {
        const auto& t = l.tensor(i);
        if (!prunable[i]) {
          masks.push_back(bitmap_mask::full(t.size));
          continue;
        }
        const T* x = w.data() + t.offset;
        const std::size_t keep = t.size - pruned_count(t.size, sparsity);
        masks.emplace_back(
            t.size, detail::top_words(t.size, keep, [x](std::size_t j) { return std::abs(x[j]); }));
      }
      return masks;
    }
    // Global: rank every prunable entry by (|w|, flat index); one threshold for all.
    std::vector<std::size_t> flat;  // flat indices of prunable entries, increasing
    for (std::size_t i = 0; i < l.tensor_count(); ++i) {
      if (!prunable[i]) continue;
      for (std::size_t j = 0; j < l.tensor(i).size; ++j) flat.push_back(l.tensor(i).offset + j);
    }
    const std::size_t keep = flat.size() - pruned_count(flat.size(), sparsity);
    const auto kept =
        detail::top_words(flat.size(), keep, [&](std::size_t k) { return std::abs(w[flat[k]]); });
    std::size_t k = 0;
    for (std::size_t i = 0; i < l.tensor_count(); ++i) {
      const auto& t = l.tensor(i);
      if (!prunable[i]) {
        masks.push_back(bitmap_mask::full(t.size));
        continue;
      }
      const std::size_t base = k;
      masks.push_back(bitmap_mask::from_predicate(t.size, [&](std::size_t j) {
        const std::size_t q = base + j;
        return ((kept[q / 64] >> (q % 64)) & 1U) != 0;
      }));
      k += t.size;
    }
    return masks;
  }
};

/// N:M structured pruning along rows: in every group of M consecutive entries of a row, the
/// N largest |w| are kept (ties by index). A row's last group of g < M entries keeps
/// min(N, g). Tensors without a matrix shape are one row. The pattern is fixed: any
/// sparsity > 0 applies it, sparsity 0 keeps everything (dense warm-up).
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
    std::vector<bitmap_mask> masks;
    masks.reserve(l.tensor_count());
    for (std::size_t i = 0; i < l.tensor_count(); ++i) {
      const auto& t = l.tensor(i);
      if (!prunable[i] || sparsity == 0.0) {
        masks.push_back(bitmap_mask::full(t.size));
        continue;
      }
      const std::size_t row = t.cols > 0 ? t.cols : t.size;
      std::vector<std::uint64_t> words(detail::words_for(t.size), 0);
      const T* x = w.data() + t.offset;
      for (std::size_t r0 = 0; r0 < t.size; r0 += row) {
        for (std::size_t g0 = r0; g0 < r0 + row; g0 += m_) {
          const std::size_t g = std::min(m_, r0 + row - g0);
          const auto kept = detail::top_words(g, std::min(n_, g),
                                              [&](std::size_t j) { return std::abs(x[g0 + j]); });
          for (std::size_t j = 0; j < g; ++j) {
            if ((kept[j / 64] >> (j % 64)) & 1U) words[(g0 + j) / 64] |= 1ULL << ((g0 + j) % 64);
          }
        }
      }
      masks.emplace_back(t.size, std::move(words));
    }
    return masks;
  }

 private:
  std::size_t n_;
  std::size_t m_;
};

/// Keeps whole blocks of B entries with the largest mean |w| (a short last block is scored
/// by its own length): pruned(blocks, s) blocks of each prunable tensor.
template <std::size_t B>
struct block_magnitude_pruning {
  using mask_type = block_mask<B>;

  template <gradient_value T>
  std::vector<block_mask<B>> compute(const param_layout& l, std::span<const T> w, double sparsity,
                                     const std::vector<bool>& prunable) const {
    detail::check_inputs(l, w, prunable);
    std::vector<block_mask<B>> masks;
    masks.reserve(l.tensor_count());
    for (std::size_t i = 0; i < l.tensor_count(); ++i) {
      const auto& t = l.tensor(i);
      if (!prunable[i]) {
        masks.push_back(block_mask<B>::full(t.size));
        continue;
      }
      const std::size_t nb = block_mask<B>::block_count(t.size);
      std::vector<double> score(nb, 0.0);
      const T* x = w.data() + t.offset;
      for (std::size_t b = 0; b < nb; ++b) {
        const std::size_t end = std::min(t.size, (b + 1) * B);
        double sum = 0;
        for (std::size_t j = b * B; j < end; ++j) sum += std::abs(static_cast<double>(x[j]));
        score[b] = sum / static_cast<double>(end - b * B);
      }
      const std::size_t keep = nb - pruned_count(nb, sparsity);
      masks.emplace_back(
          t.size,
          bitmap_mask(nb, detail::top_words(nb, keep, [&](std::size_t b) { return score[b]; })));
    }
    return masks;
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
    std::vector<bitmap_mask> masks;
    masks.reserve(l.tensor_count());
    for (std::size_t i = 0; i < l.tensor_count(); ++i) {
      const auto& t = l.tensor(i);
      if (!prunable[i]) {
        masks.push_back(bitmap_mask::full(t.size));
        continue;
      }
      const std::uint64_t key = digest_builder(seed).add(static_cast<std::uint64_t>(i)).value();
      const std::size_t keep = t.size - pruned_count(t.size, sparsity);
      masks.emplace_back(t.size, detail::top_words(t.size, keep, [key](std::size_t j) {
                           return digest_builder(key).add(static_cast<std::uint64_t>(j)).value();
                         }));
    }
    return masks;
  }
};

static_assert(pruning_policy<magnitude_pruning>);
static_assert(pruning_policy<nm_pruning>);
static_assert(pruning_policy<block_magnitude_pruning<16>>);
static_assert(pruning_policy<random_pruning>);

// --- schedules -------------------------------------------------------------------------------

/// When masks change (is_update_step) and to what sparsity (sparsity_at), by training step.
template <class S>
concept pruning_schedule = requires(const S& s, std::uint64_t t) {
  { s.sparsity_at(t) } -> std::convertible_to<double>;
  { s.is_update_step(t) } -> std::convertible_to<bool>;
  s.validate();
};

/// Dense until `step`, then `sparsity` from that step on; one update at `step`.
struct one_shot_schedule {
  std::uint64_t step = 0;
  double sparsity = 0.9;

  void validate() const { (void)pruned_count(0, sparsity); }
  [[nodiscard]] double sparsity_at(std::uint64_t t) const noexcept {
    return t < step ? 0.0 : sparsity;
  }
  [[nodiscard]] bool is_update_step(std::uint64_t t) const noexcept { return t == step; }
};

/// Gradual pruning (Zhu & Gupta, 2017): dense warm-up for steps < start_step, then
///   s_t = s_f + (s_i - s_f) * (1 - (t - t0) / (n * dt))^3   for t0 <= t <= t0 + n * dt,
/// and s_f after; masks are updated at t0 + k * dt for k = 0..n (n = updates).
struct gradual_schedule {
  double initial_sparsity = 0.0;
  double final_sparsity = 0.9;
  std::uint64_t start_step = 0;
  std::uint64_t interval = 100;
  std::uint64_t updates = 10;

  void validate() const {
    PACTRAIN_EXPECTS(
        initial_sparsity >= 0.0 && initial_sparsity <= final_sparsity && final_sparsity <= 1.0,
        "gradual_schedule: need 0 <= initial_sparsity <= final_sparsity <= 1");
    PACTRAIN_EXPECTS(interval > 0 && updates > 0,
                     "gradual_schedule: interval and updates must be positive");
  }
  [[nodiscard]] double sparsity_at(std::uint64_t t) const noexcept {
    if (t < start_step) return 0.0;
    const double span = static_cast<double>(interval) * static_cast<double>(updates);
    const double f = std::min(1.0, static_cast<double>(t - start_step) / span);
    const double r = 1.0 - f;
    return final_sparsity + (initial_sparsity - final_sparsity) * r * r * r;
  }
  [[nodiscard]] bool is_update_step(std::uint64_t t) const noexcept {
    return t >= start_step && (t - start_step) % interval == 0 &&
           (t - start_step) / interval <= updates;
  }
};

static_assert(pruning_schedule<one_shot_schedule>);
static_assert(pruning_schedule<gradual_schedule>);

// --- masks applied to weights and optimizer state ----------------------------------------------

/// Sets the pruned entries of `buffer` (a flat buffer laid out by `layout`: weights, momentum,
/// any optimizer state) to +0, so pruned weights stay exactly zero. Throws pactrain::error
/// (touching nothing) on mismatched sizes.
template <gradient_mask Mask, gradient_value T>
void apply_masks(const param_layout& layout, const std::vector<Mask>& masks, std::span<T> buffer) {
  PACTRAIN_EXPECTS(buffer.data() != nullptr || buffer.empty(), "apply_masks: null buffer");
  PACTRAIN_EXPECTS(buffer.size() == layout.total_size(),
                   "apply_masks: buffer has " + std::to_string(buffer.size()) +
                       " entries, the layout " + std::to_string(layout.total_size()));
  PACTRAIN_EXPECTS(masks.size() == layout.tensor_count(),
                   "apply_masks: " + std::to_string(masks.size()) + " masks for " +
                       std::to_string(layout.tensor_count()) + " tensors");
  for (std::size_t i = 0; i < masks.size(); ++i) {
    PACTRAIN_EXPECTS(masks[i].size() == layout.tensor(i).size,
                     "apply_masks: mask of tensor '" + layout.tensor(i).name + "' has " +
                         std::to_string(masks[i].size()) + " entries, the tensor " +
                         std::to_string(layout.tensor(i).size));
  }
  for (std::size_t i = 0; i < masks.size(); ++i) {
    T* x = buffer.data() + layout.tensor(i).offset;
    std::size_t pos = 0;
    masks[i].for_each_run([&](std::size_t b, std::size_t len) {
      std::fill(x + pos, x + b, T(0));
      pos = b + len;
    });
    std::fill(x + pos, x + masks[i].size(), T(0));
  }
}

// --- the pruner: the mask lifecycle ------------------------------------------------------------

/// Where new masks come from at an update step: each rank computes them (policies are
/// rank-invariant, so equal weights give equal masks), or rank 0 computes and broadcasts.
enum class mask_source { local, root_broadcast };

inline constexpr std::uint32_t checkpoint_format_version = 1;

/// Drives a sync engine's masks through a schedule. Call step() once per training step,
/// after the optimizer step, on every rank; it is collective on update steps. save() and
/// load() checkpoint the masks and the schedule position so that a resumed run continues
/// with bit-identical masks.
template <pruning_policy Policy, pruning_schedule Schedule>
class pruner {
 public:
  using mask_type = typename Policy::mask_type;

  /// `prunable`: one flag per tensor of the layout (biases and norms usually false).
  pruner(Policy policy, Schedule schedule, std::vector<bool> prunable,
         mask_source source = mask_source::local)
      : policy_(std::move(policy)),
        schedule_(std::move(schedule)),
        prunable_(std::move(prunable)),
        source_(source) {
    schedule_.validate();
  }

  /// Advances one training step. On an update step computes the masks for the schedule's
  /// sparsity from `weights` (the flat weights laid out by sync.layout()) and commits them
  /// with sync.set_masks; returns whether masks were committed. Collective on update steps:
  /// a failure on any rank throws on every rank and leaves the old masks in force.
  template <class Sync, gradient_value T>
  bool step(Sync& sync, std::span<const T> weights) {
    static_assert(std::is_same_v<typename Sync::mask_type, mask_type>,
                  "pruner::step: the sync engine's Mask must be the policy's mask_type");
    const std::uint64_t t = step_;
    if (!schedule_.is_update_step(t)) {
      ++step_;
      return false;
    }
    const double s = schedule_.sparsity_at(t);
    std::vector<mask_type> masks;
    std::string failure;
    if (source_ == mask_source::local || sync.get_communicator().size() == 1) {
      try {
        masks = policy_.compute(sync.layout(), weights, s, prunable_);
      } catch (const std::exception& e) {
        failure = e.what();
      }
    } else {
      masks = broadcast_masks(sync, weights, s);
    }
    if (!failure.empty()) {
      sync.reject_masks(std::move(failure));
    } else {
      sync.set_masks(std::move(masks));
    }
    sparsity_ = s;
    ++step_;
    return true;
  }

  [[nodiscard]] std::uint64_t current_step() const noexcept { return step_; }
  /// The sparsity of the last committed update (0 before the first).
  [[nodiscard]] double current_sparsity() const noexcept { return sparsity_; }
  [[nodiscard]] const Schedule& schedule() const noexcept { return schedule_; }
  [[nodiscard]] const std::vector<bool>& prunable() const noexcept { return prunable_; }

  /// The checkpoint: magic "PTRNCKPT", version, layout digest, step, sparsity, then each
  /// tensor's mask in the serialized mask format (length-prefixed), then a checksum; all
  /// integers little-endian.
  template <class Sync>
  [[nodiscard]] std::vector<std::byte> save(const Sync& sync) const {
    std::vector<std::byte> out;
    for (char c : std::string_view("PTRNCKPT")) out.push_back(static_cast<std::byte>(c));
    detail::put_u32(out, checkpoint_format_version);
    detail::put_u32(out, 0);
    detail::put_u64(out, sync.layout().digest());
    detail::put_u64(out, step_);
    detail::put_u64(out, std::bit_cast<std::uint64_t>(sparsity_));
    detail::put_u64(out, sync.masks().size());
    for (const auto& m : sync.masks()) {
      const auto bytes = serialize(m);
      detail::put_u64(out, bytes.size());
      out.insert(out.end(), bytes.begin(), bytes.end());
    }
    detail::put_u64(out, detail::checksum(out));
    return out;
  }

  /// Collective: restores masks and schedule position from save(). A checkpoint that is
  /// corrupt or does not fit sync.layout() throws pactrain::error on every rank and changes
  /// nothing.
  template <class Sync>
  void load(Sync& sync, std::span<const std::byte> in) {
    std::vector<mask_type> masks;
    std::uint64_t step = 0;
    double sparsity = 0;
    std::string failure;
    try {
      parse(sync.layout(), in, masks, step, sparsity);
    } catch (const std::exception& e) {
      failure = e.what();
    }
    if (!failure.empty()) {
      sync.reject_masks(std::move(failure));
      return;  // not reached: reject_masks throws
    }
    sync.set_masks(std::move(masks));
    step_ = step;
    sparsity_ = sparsity;
  }

 private:
  template <class Sync, class T>
  std::vector<mask_type> broadcast_masks(Sync& sync, std::span<const T> weights, double s) {
    auto& comm = sync.get_communicator();
    std::vector<std::byte> blob;
    std::string failure;
    if (comm.rank() == 0) {
      try {
        for (const auto& m : policy_.compute(sync.layout(), weights, s, prunable_)) {
          const auto bytes = serialize(m);
          detail::put_u64(blob, bytes.size());
          blob.insert(blob.end(), bytes.begin(), bytes.end());
        }
      } catch (const std::exception& e) {
        failure = detail::strip_prefix(e.what());
      }
    }
    // Size first (all ones: rank 0 failed, its message follows), then the masks.
    std::uint64_t size = failure.empty() ? blob.size() : ~0ULL;
    comm.broadcast(std::span<std::uint64_t>(&size, 1), 0);
    if (size == ~0ULL) {
      PACTRAIN_FAIL("pruner: rank 0 could not compute the masks: " +
                    detail::broadcast_text(comm, 0, failure));
    }
    blob.resize(static_cast<std::size_t>(size));
    comm.broadcast(std::span<std::byte>(blob), 0);
    std::vector<mask_type> masks;
    std::size_t at = 0;
    while (at < blob.size()) {
      const auto len = static_cast<std::size_t>(detail::get_u64(blob, at));
      masks.push_back(
          deserialize<mask_type>(std::span<const std::byte>(blob).subspan(at + 8, len)));
      at += 8 + len;
    }
    return masks;
  }

  static void parse(const param_layout& layout, std::span<const std::byte> in,
                    std::vector<mask_type>& masks, std::uint64_t& step, double& sparsity) {
    const std::string what = "checkpoint rejected: ";
    constexpr std::size_t header = 48;
    PACTRAIN_EXPECTS(in.size() >= header + 8, what + "truncated");
    PACTRAIN_EXPECTS(std::memcmp(in.data(), "PTRNCKPT", 8) == 0, what + "bad magic");
    const std::uint32_t version = detail::get_u32(in, 8);
    PACTRAIN_EXPECTS(version == checkpoint_format_version,
                     what + "unsupported format version " + std::to_string(version));
    const std::size_t body = in.size() - 8;
    PACTRAIN_EXPECTS(detail::get_u64(in, body) == detail::checksum(in.first(body)),
                     what + "checksum mismatch (corrupt or truncated)");
    PACTRAIN_EXPECTS(detail::get_u64(in, 16) == layout.digest(),
                     what +
                         "it does not fit the layout (layout digest differs: other tensors, "
                         "shapes or bucketing)");
    step = detail::get_u64(in, 24);
    sparsity = std::bit_cast<double>(detail::get_u64(in, 32));
    PACTRAIN_EXPECTS(sparsity >= 0.0 && sparsity <= 1.0, what + "sparsity out of range");
    const std::uint64_t count = detail::get_u64(in, 40);
    PACTRAIN_EXPECTS(count == layout.tensor_count(), what + std::to_string(count) + " masks for " +
                                                         std::to_string(layout.tensor_count()) +
                                                         " tensors");
    std::size_t at = header;
    masks.clear();
    for (std::uint64_t i = 0; i < count; ++i) {
      PACTRAIN_EXPECTS(body - at >= 8, what + "truncated mask list");
      const std::uint64_t len = detail::get_u64(in, at);
      at += 8;
      PACTRAIN_EXPECTS(len <= body - at, what + "truncated mask list");
      masks.push_back(deserialize<mask_type>(in.subspan(at, static_cast<std::size_t>(len))));
      PACTRAIN_EXPECTS(masks.back().size() == layout.tensor(i).size,
                       what + "mask of tensor '" + layout.tensor(i).name + "' has the wrong size");
      at += static_cast<std::size_t>(len);
    }
    PACTRAIN_EXPECTS(at == body, what + "trailing bytes");
  }

  Policy policy_;
  Schedule schedule_;
  std::vector<bool> prunable_;
  mask_source source_;
  std::uint64_t step_ = 0;
  double sparsity_ = 0.0;
};

/// One flag per tensor: true for tensors with a matrix shape (weights), false for 1-D ones
/// (biases, norms) — the usual choice of what to prune.
inline std::vector<bool> matrix_tensors(const param_layout& layout) {
  std::vector<bool> v;
  v.reserve(layout.tensor_count());
  for (const auto& t : layout.tensors()) v.push_back(t.rows > 0);
  return v;
}

}  // namespace pactrain
