// pactrain::sgd: stochastic gradient descent with momentum, dampening, weight decay and
// Nesterov over flat buffers (parameters, gradients and momentum laid out alike, e.g. by a
// param_layout), computing what torch::optim::SGD computes, bit for bit.
#pragma once

#include <pactrain/detail/config.hpp>
#include <pactrain/detail/cpu.hpp>
#include <pactrain/error.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

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

 private:
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

  PACTRAIN_ALWAYS_INLINE static void body(const factors& f, float* __restrict p,
                                          const float* __restrict g, float* __restrict buf,
                                          std::size_t n) noexcept {
    if (f.momentum) {
      for (std::size_t i = 0; i < n; ++i) entry(f, p[i], g[i], buf[i]);
    } else {
      float unused = 0;
      for (std::size_t i = 0; i < n; ++i) entry(f, p[i], g[i], unused);
    }
  }

  static void run(const factors& f, float* p, const float* g, float* buf, std::size_t n) {
    body(f, p, g, buf, n);
  }
#if PACTRAIN_HAS_X86_KERNELS
  PACTRAIN_SGD_FMA static void run_fma(const factors& f, float* p, const float* g, float* buf,
                                       std::size_t n) {
    body(f, p, g, buf, n);
  }
#endif

  sgd_options opt_;
  std::uint64_t steps_ = 0;
};

}  // namespace pactrain

#undef PACTRAIN_SGD_FMA
