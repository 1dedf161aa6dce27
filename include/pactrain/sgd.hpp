// pactrain::sgd: stochastic gradient descent with momentum, dampening, weight decay and
// Nesterov over flat buffers (parameters, gradients and momentum laid out alike, e.g. by a
// param_layout), computing what torch::optim::SGD computes, bit for bit.
#pragma once

#include <pactrain/detail/config.hpp>
#include <pactrain/detail/cpu.hpp>
#include <pactrain/error.hpp>
#include <pactrain/layout.hpp>
#include <pactrain/mask.hpp>

#include <bit>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#if PACTRAIN_HAS_X86_KERNELS
#define PACTRAIN_SGD_FMA __attribute__((target("avx2,fma"))) PACTRAIN_VECTORIZE
#endif

namespace pactrain {

/// The settings of torch::optim::SGDOptions, with the same meaning and defaults (lr has none
/// in torch; 0.01 here).
struct sgd_options {
  double lr = 0.01;
  double momentum = 0;
  double dampening = 0;
  double weight_decay = 0;
  bool nesterov = false;
};

class sgd;

/// The fused optimizer step (sync::finish_step(update)): sgd applied to each tensor's averaged
/// gradient as the engine hands it over, a sparse bucket's as its kept entries only, so the
/// dense gradient is never written. Bit for bit finish_step() followed by sgd::step() when the
/// pruned parameters and momentum are +0 (apply_masks after every commit), since sgd leaves
/// such entries at +0. Build one per step (sgd::fused); the masks are the engine's.
template <gradient_mask Mask>
class sgd_update;

/// The fused step of a device engine (<pactrain/cuda/sgd.hpp>).
template <class Engine>
class device_sgd_update;

/// SGD over flat float buffers. Per entry, as torch::optim::SGD on a CPU with FMA (its AVX2 and
/// AVX-512 kernels fuse every `add` with a factor): d = g + wd * p; the first step sets the
/// momentum buf = d, later ones buf = buf * m + (1 - dampening) * d; d = d + m * buf
/// (Nesterov) or d = buf; p = p - lr * d. The factors are rounded to float as torch rounds
/// its scalars. Local; keeps whether momentum has started (steps()).
class sgd {
 public:
  /// Throws pactrain::error for a negative or non-finite setting, or Nesterov without momentum
  /// or with dampening (torch refuses the same).
  explicit sgd(sgd_options o) : opt_(o) {
    for (const double v : {o.lr, o.momentum, o.dampening, o.weight_decay}) {
      PACTRAIN_EXPECTS(std::isfinite(v) && v >= 0,
                       "sgd: lr, momentum, dampening and weight_decay must be finite and >= 0");
    }
    PACTRAIN_EXPECTS(!o.nesterov || (o.momentum > 0 && o.dampening == 0),
                     "sgd: Nesterov momentum requires a momentum and zero dampening");
  }

  [[nodiscard]] const sgd_options& options() const noexcept { return opt_; }
  /// Steps taken since construction (or set_steps); momentum starts at the first.
  [[nodiscard]] std::uint64_t steps() const noexcept { return steps_; }
  void set_steps(std::uint64_t s) noexcept { steps_ = s; }
  /// A new learning rate (e.g. from a schedule) for the next steps.
  void set_lr(double lr) {
    PACTRAIN_EXPECTS(std::isfinite(lr) && lr >= 0, "sgd: lr must be finite and >= 0");
    opt_.lr = lr;
  }

  /// One step: params -= lr * update(grads). `momentum` has one entry per parameter (it may
  /// be empty when options().momentum is 0). Throws pactrain::error, changing nothing, on
  /// mismatched sizes or null buffers.
  void step(std::span<float> params, std::span<const float> grads, std::span<float> momentum) {
    const bool with_momentum = opt_.momentum != 0;
    PACTRAIN_EXPECTS(grads.size() == params.size() &&
                         (momentum.size() == params.size() || (!with_momentum && momentum.empty())),
                     "sgd::step: " + std::to_string(params.size()) + " parameters, " +
                         std::to_string(grads.size()) + " gradients and " +
                         std::to_string(momentum.size()) + " momentum entries");
    PACTRAIN_EXPECTS(params.empty() || (params.data() != nullptr && grads.data() != nullptr &&
                                        (!with_momentum || momentum.data() != nullptr)),
                     "sgd::step: null buffer");
    const factors f = this->factors_of(with_momentum);
#if PACTRAIN_HAS_X86_KERNELS
    if (detail::cpu().avx2) {
      run_fma(f, params.data(), grads.data(), momentum.data(), params.size());
      ++steps_;
      return;
    }
#endif
    run(f, params.data(), grads.data(), momentum.data(), params.size());
    ++steps_;
  }

  /// The fused form of step() for sync::finish_step(update): `params` and `momentum` laid out
  /// by `layout`, `masks` the engine's (both must outlive the returned object). Throws
  /// pactrain::error on mismatched sizes.
  template <gradient_mask Mask>
  [[nodiscard]] sgd_update<Mask> fused(const param_layout& layout, const std::vector<Mask>& masks,
                                       std::span<float> params, std::span<float> momentum) {
    return sgd_update<Mask>(*this, layout, masks, params, momentum);
  }

 private:
  template <gradient_mask>
  friend class sgd_update;
  template <class>
  friend class device_sgd_update;

  struct factors {
    float wd;       // weight decay
    float m;        // momentum
    float damp;     // 1 - dampening
    float neg_lr;   // -lr
    bool momentum;  // momentum in use
    bool first;     // the momentum buffer starts now
    bool nesterov;
  };

  [[nodiscard]] factors factors_of(bool with_momentum) const noexcept {
    return {.wd = static_cast<float>(opt_.weight_decay),
            .m = static_cast<float>(opt_.momentum),
            .damp = static_cast<float>(1 - opt_.dampening),
            .neg_lr = static_cast<float>(-1 * opt_.lr),
            .momentum = with_momentum,
            .first = steps_ == 0,
            .nesterov = opt_.nesterov};
  }

  // One entry. Branches on f are the same for every entry and hoisted by the compiler.
  PACTRAIN_ALWAYS_INLINE static void entry(const factors& f, float& p, float g, float& buf) {
    float d = f.wd != 0 ? std::fma(p, f.wd, g) : g;
    if (f.momentum) {
      buf = f.first ? d : std::fma(d, f.damp, buf * f.m);
      d = f.nesterov ? std::fma(buf, f.m, d) : buf;
    }
    p = std::fma(d, f.neg_lr, p);
  }

  // n entries; the gradient is g[i] * factor (the scatter's one multiply; exact for 1).
  PACTRAIN_ALWAYS_INLINE static void body(const factors& f, float* __restrict p,
                                          const float* __restrict g, float* __restrict buf,
                                          std::size_t n, float factor = 1.0f) noexcept {
    if (f.momentum) {
      for (std::size_t i = 0; i < n; ++i) entry(f, p[i], g[i] * factor, buf[i]);
    } else {
      float unused = 0;
      for (std::size_t i = 0; i < n; ++i) entry(f, p[i], g[i] * factor, unused);
    }
  }

  // A tensor's kept entries: runs (begin, length) of p and buf, their gradients back to back
  // in g.
  PACTRAIN_ALWAYS_INLINE static void body_runs(
      const factors& f, float* p, const float* g, float* buf,
      std::span<const std::pair<std::size_t, std::size_t>> runs, float factor) noexcept {
    for (const auto& [begin, len] : runs) {
      body(f, p + begin, g, f.momentum ? buf + begin : nullptr, len, factor);
      g += len;
    }
  }

  // A bitmap's kept entries, word by word: a full word as a vector loop, others bit by bit
  // (at 10% density most words hold a few bits, and a run per bit would cost a call each).
  PACTRAIN_ALWAYS_INLINE static void body_words(const factors& f, float* p, const float* g,
                                                float* buf, std::span<const std::uint64_t> words,
                                                float factor) noexcept {
    float unused = 0;
    for (std::size_t wi = 0; wi < words.size(); ++wi) {
      std::uint64_t w = words[wi];
      const std::size_t base = wi * 64;
      if (w == ~0ULL) {
        body(f, p + base, g, f.momentum ? buf + base : nullptr, 64, factor);
        g += 64;
        continue;
      }
      while (w != 0) {
        const std::size_t i = base + static_cast<std::size_t>(std::countr_zero(w));
        entry(f, p[i], *g++ * factor, f.momentum ? buf[i] : unused);
        w &= w - 1;
      }
    }
  }

  static void run_words(const factors& f, float* p, const float* g, float* buf,
                        std::span<const std::uint64_t> words, float factor) {
    body_words(f, p, g, buf, words, factor);
  }
  static void run(const factors& f, float* p, const float* g, float* buf, std::size_t n,
                  float factor = 1.0f) {
    body(f, p, g, buf, n, factor);
  }
  static void run_runs(const factors& f, float* p, const float* g, float* buf,
                       std::span<const std::pair<std::size_t, std::size_t>> runs, float factor) {
    body_runs(f, p, g, buf, runs, factor);
  }
#if PACTRAIN_HAS_X86_KERNELS
  PACTRAIN_SGD_FMA static void run_fma(const factors& f, float* p, const float* g, float* buf,
                                       std::size_t n, float factor = 1.0f) {
    body(f, p, g, buf, n, factor);
  }
  PACTRAIN_SGD_FMA static void run_words_fma(const factors& f, float* p, const float* g, float* buf,
                                             std::span<const std::uint64_t> words, float factor) {
    body_words(f, p, g, buf, words, factor);
  }
  PACTRAIN_SGD_FMA static void run_runs_fma(
      const factors& f, float* p, const float* g, float* buf,
      std::span<const std::pair<std::size_t, std::size_t>> runs, float factor) {
    body_runs(f, p, g, buf, runs, factor);
  }
#endif

  sgd_options opt_;
  std::uint64_t steps_ = 0;
};

template <gradient_mask Mask>
class sgd_update {
 public:
  sgd_update(sgd& opt, const param_layout& layout, const std::vector<Mask>& masks,
             std::span<float> params, std::span<float> momentum)
      : opt_(opt),
        layout_(layout),
        masks_(masks),
        params_(params),
        momentum_(momentum),
        f_(opt.factors_of(opt.options().momentum != 0)) {
    PACTRAIN_EXPECTS(params.size() == layout.total_size() &&
                         (momentum.size() == params.size() || (!f_.momentum && momentum.empty())),
                     "sgd::fused: " + std::to_string(params.size()) + " parameters and " +
                         std::to_string(momentum.size()) + " momentum entries, the layout " +
                         std::to_string(layout.total_size()));
    PACTRAIN_EXPECTS(masks.size() == layout.tensor_count(),
                     "sgd::fused: " + std::to_string(masks.size()) + " masks for " +
                         std::to_string(layout.tensor_count()) + " tensors");
  }

  /// Tensor i's kept entries: their averaged gradients are payload[k] * factor, in index order.
  void kept(std::size_t i, std::span<const float> payload, float factor) {
    const auto& t = layout_.tensor(i);
    if constexpr (std::same_as<Mask, bitmap_mask>) {
      float* buf = f_.momentum ? momentum_.data() + t.offset : nullptr;
      float* p = params_.data() + t.offset;
      const auto words = masks_[i].words();
#if PACTRAIN_HAS_X86_KERNELS
      if (detail::cpu().avx2) return sgd::run_words_fma(f_, p, payload.data(), buf, words, factor);
#endif
      return sgd::run_words(f_, p, payload.data(), buf, words, factor);
    }
    runs_.clear();
    masks_[i].for_each_run([&](std::size_t b, std::size_t len) { runs_.emplace_back(b, len); });
    float* buf = f_.momentum ? momentum_.data() + t.offset : nullptr;
    float* p = params_.data() + t.offset;
#if PACTRAIN_HAS_X86_KERNELS
    if (detail::cpu().avx2) return sgd::run_runs_fma(f_, p, payload.data(), buf, runs_, factor);
#endif
    sgd::run_runs(f_, p, payload.data(), buf, runs_, factor);
  }

  /// Tensor i's whole averaged gradient (a dense bucket's, written back).
  void dense(std::size_t i, std::span<const float> grad) {
    const auto& t = layout_.tensor(i);
    float* buf = f_.momentum ? momentum_.data() + t.offset : nullptr;
    float* p = params_.data() + t.offset;
#if PACTRAIN_HAS_X86_KERNELS
    if (detail::cpu().avx2) return sgd::run_fma(f_, p, grad.data(), buf, grad.size());
#endif
    sgd::run(f_, p, grad.data(), buf, grad.size());
  }

  /// Every tensor has had its update: the step counts.
  void done() noexcept { ++opt_.steps_; }

 private:
  sgd& opt_;
  const param_layout& layout_;
  const std::vector<Mask>& masks_;
  std::span<float> params_;
  std::span<float> momentum_;
  sgd::factors f_;
  std::vector<std::pair<std::size_t, std::size_t>> runs_;
};

}  // namespace pactrain

#undef PACTRAIN_SGD_FMA
