// pactrain::adam: Adam and AdamW over flat buffers (parameters, gradients and the two moments
// laid out alike, e.g. by a param_layout), computing what torch::optim::Adam and
// torch::optim::AdamW compute, bit for bit.
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
#define PACTRAIN_ADAM_FMA __attribute__((target("avx2,fma"))) PACTRAIN_VECTORIZE
#endif

namespace pactrain {

/// The settings of torch::optim::AdamOptions (betas as beta1, beta2), with the same meaning
/// and defaults; `decoupled` selects AdamW (weight decay applied to the weights, not added to
/// the gradient). AMSGrad is not offered.
struct adam_options {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0;
  bool decoupled = false;
};

/// torch::optim::AdamWOptions's defaults: weight decay 1e-2, decoupled.
[[nodiscard]] inline adam_options adamw_options(double lr = 1e-3, double weight_decay = 1e-2) {
  return {.lr = lr, .weight_decay = weight_decay, .decoupled = true};
}

class adam {
 public:
  /// Throws pactrain::error for a negative or non-finite setting, or a beta outside [0, 1)
  /// (torch refuses the same).
  explicit adam(adam_options o) : opt_(o) {
    for (const double v : {o.lr, o.eps, o.weight_decay}) {
      PACTRAIN_EXPECTS(std::isfinite(v) && v >= 0,
                       "adam: lr, eps and weight_decay must be finite and >= 0");
    }
    PACTRAIN_EXPECTS(o.beta1 >= 0 && o.beta1 < 1 && o.beta2 >= 0 && o.beta2 < 1,
                     "adam: beta1 and beta2 must lie in [0, 1)");
  }

  [[nodiscard]] const adam_options& options() const noexcept { return opt_; }
  /// Steps taken since construction (or set_steps): the bias corrections follow them.
  [[nodiscard]] std::uint64_t steps() const noexcept { return steps_; }
  void set_steps(std::uint64_t s) noexcept { steps_ = s; }
  /// A new learning rate (e.g. from a schedule) for the next steps.
  void set_lr(double lr) {
    PACTRAIN_EXPECTS(std::isfinite(lr) && lr >= 0, "adam: lr must be finite and >= 0");
    opt_.lr = lr;
  }

  /// One step over every entry. `m` and `v` (the first and second moments) start at zero and
  /// have one entry per parameter. An entry whose gradient, m and v are +0 keeps its weight
  /// (a pruned weight stays +0) and its zero moments. Throws pactrain::error, changing
  /// nothing, on mismatched sizes or null buffers.
  void step(std::span<float> params, std::span<const float> grads, std::span<float> m,
            std::span<float> v) {
    PACTRAIN_EXPECTS(
        grads.size() == params.size() && m.size() == params.size() && v.size() == params.size(),
        "adam::step: " + std::to_string(params.size()) + " parameters, " +
            std::to_string(grads.size()) + " gradients and " + std::to_string(m.size()) + " and " +
            std::to_string(v.size()) + " moment entries");
    PACTRAIN_EXPECTS(params.empty() || (params.data() != nullptr && grads.data() != nullptr &&
                                        m.data() != nullptr && v.data() != nullptr),
                     "adam::step: null buffer");
    const factors f = factors_of(steps_ + 1);
#if PACTRAIN_HAS_X86_KERNELS
    if (detail::cpu().avx2) {
      run_fma(f, params.data(), grads.data(), m.data(), v.data(), params.size());
      ++steps_;
      return;
    }
#endif
    run(f, params.data(), grads.data(), m.data(), v.data(), params.size());
    ++steps_;
  }

 private:
  // Each setting rounded to float as torch's kernels take a scalar; the step's own in double
  // first, as torch computes them.
  struct factors {
    float wd;        // weight decay added to the gradient (Adam), or 0
    float decay;     // 1 - lr * weight_decay (AdamW), or 1
    float b1, b2;    // beta1, beta2
    float ob1, ob2;  // 1 - beta1, 1 - beta2
    float s2;        // sqrt(1 - beta2^t)
    float eps;
    float neg_step;  // -lr / (1 - beta1^t)
  };

  [[nodiscard]] factors factors_of(std::uint64_t t) const noexcept {
    const double bc1 = 1 - std::pow(opt_.beta1, static_cast<double>(t));
    const double bc2 = 1 - std::pow(opt_.beta2, static_cast<double>(t));
    return {.wd = opt_.decoupled ? 0.0f : static_cast<float>(opt_.weight_decay),
            .decay = opt_.decoupled && opt_.weight_decay != 0
                         ? static_cast<float>(1 - opt_.lr * opt_.weight_decay)
                         : 1.0f,
            .b1 = static_cast<float>(opt_.beta1),
            .b2 = static_cast<float>(opt_.beta2),
            .ob1 = static_cast<float>(1 - opt_.beta1),
            .ob2 = static_cast<float>(1 - opt_.beta2),
            .s2 = static_cast<float>(std::sqrt(bc2)),
            .eps = static_cast<float>(opt_.eps),
            .neg_step = static_cast<float>(-(opt_.lr / bc1))};
  }

  // One entry, in torch's order of operations and roundings: grad.add(p, wd);
  // exp_avg.mul_(b1).add_(g, 1 - b1); exp_avg_sq.mul_(b2).addcmul_(g, g, 1 - b2) (its kernel
  // fuses the last multiply and the add); denom = sqrt(v) / sqrt(bc2) + eps;
  // p.addcdiv_(m, denom, -step) as p + (-step * m) / denom. AdamW first multiplies p by decay.
  PACTRAIN_ALWAYS_INLINE static void entry(const factors& f, float& p, float g, float& m,
                                           float& v) {
    if (f.decay != 1.0f) p *= f.decay;
    if (f.wd != 0.0f) g = std::fma(p, f.wd, g);
    m = std::fma(g, f.ob1, m * f.b1);
    v = std::fma(f.ob2 * g, g, v * f.b2);
    const float d = std::sqrt(v) / f.s2 + f.eps;
    p = p + (f.neg_step * m) / d;
  }

  PACTRAIN_ALWAYS_INLINE static void body(const factors& f, float* __restrict p,
                                          const float* __restrict g, float* __restrict m,
                                          float* __restrict v, std::size_t n) noexcept {
    for (std::size_t i = 0; i < n; ++i) entry(f, p[i], g[i], m[i], v[i]);
  }
  static void run(const factors& f, float* p, const float* g, float* m, float* v, std::size_t n) {
    body(f, p, g, m, v, n);
  }
#if PACTRAIN_HAS_X86_KERNELS
  PACTRAIN_ADAM_FMA static void run_fma(const factors& f, float* p, const float* g, float* m,
                                        float* v, std::size_t n) {
    body(f, p, g, m, v, n);
  }
#endif

  adam_options opt_;
  std::uint64_t steps_ = 0;
};

}  // namespace pactrain
