// pactrain::device_sgd_update: sgd (pactrain/sgd.hpp) fused into a device engine's step, the
// device counterpart of sgd::fused. The engine hands each tensor's averaged gradient over in
// device memory: a sparse bucket's as its kept entries (never written to the gradient buffer),
// a dense bucket's as the written-back tensor; the update queues one launch per tensor on the
// step's stream, computing per entry what sgd::step computes, bit for bit.
//
//   pactrain::sgd opt{{.lr = 0.1, .momentum = 0.9}};
//   pactrain::device_sgd_update u{opt, engine, params, momentum, stream};  // one per step
//   engine.allreduce(grads, u, stream);   // or begin_step ... finish_step(u)
//
// Compiles without nvcc where the engine's execution backend does (Thrust's CPU systems).
#pragma once

#include <pactrain/compactor.hpp>
#include <pactrain/cuda/detail/device_ops.hpp>
#include <pactrain/error.hpp>
#include <pactrain/layout.hpp>
#include <pactrain/sgd.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace pactrain {
namespace detail {

/// sgd's per-entry factors, as a value a kernel can take.
struct sgd_factors {
  float wd;
  float m;
  float damp;
  float neg_lr;
  bool momentum;
  bool first;
  bool nesterov;

  // One entry, as sgd::entry: every fma rounded once.
  _CCCL_HOST_DEVICE void apply(float& p, float g, float* buf) const noexcept {
    float d = wd != 0 ? ::fmaf(p, wd, g) : g;
    if (momentum) {
      *buf = first ? d : ::fmaf(d, damp, *buf * m);
      d = nesterov ? ::fmaf(*buf, m, d) : *buf;
    }
    p = ::fmaf(d, neg_lr, p);
  }
};

/// Entry k of a dense tensor: its whole gradient.
struct sgd_dense_op {
  sgd_factors f;
  const float* grad;
  float* params;
  float* momentum;  // null without momentum
  _CCCL_HOST_DEVICE void operator()(std::size_t k) const noexcept {
    f.apply(params[k], grad[k], momentum == nullptr ? nullptr : momentum + k);
  }
};

/// Kept entry k of an index plan: its gradient is payload[k] * factor.
struct sgd_indices_op {
  sgd_factors f;
  const std::uint64_t* indices;
  const float* payload;
  float factor;
  float* params;
  float* momentum;
  _CCCL_HOST_DEVICE void operator()(std::size_t k) const noexcept {
    const std::size_t i = load_readonly(indices + k);
    f.apply(params[i], payload[k] * factor, momentum == nullptr ? nullptr : momentum + i);
  }
};

/// The kept entries of quad q of a bitmap plan; pruned entries are left alone.
struct sgd_bitmap_op {
  sgd_factors f;
  bitmap_view m;
  const float* payload;
  float factor;
  float* params;
  float* momentum;
  quad_grid grid;
  _CCCL_HOST_DEVICE void operator()(std::size_t q) const noexcept {
    const quad_slots s(m, grid.first(q));
    for (int j = 0; j < 4; ++j) {
      if (!s.kept[j]) continue;
      const std::size_t i = s.i0 + static_cast<std::size_t>(j);
      f.apply(params[i], payload[s.slot[j]] * factor, momentum == nullptr ? nullptr : momentum + i);
    }
  }
};

}  // namespace detail

/// The fused optimizer step of a device engine: `params` and `momentum` (device memory, laid
/// out by the engine's layout; momentum may be empty without momentum) updated on `stream`,
/// which must be the step's. Build one per step; the engine and the buffers must outlive it.
/// Bit for bit the device engine's finish_step followed by sgd::step when pruned parameters
/// and momentum are +0, as for sgd::fused.
template <class Engine>
class device_sgd_update {
 public:
  using stream_type = typename Engine::compactor_type::stream_type;

  device_sgd_update(sgd& opt, const Engine& engine, std::span<float> params,
                    std::span<float> momentum, stream_type stream)
      : opt_(opt), engine_(engine), params_(params), momentum_(momentum), stream_(stream) {
    const auto f = opt.factors_of(opt.options().momentum != 0);
    f_ = {f.wd, f.m, f.damp, f.neg_lr, f.momentum, f.first, f.nesterov};
    const std::size_t n = engine.layout().total_size();
    PACTRAIN_EXPECTS(
        params.size() == n && (momentum.size() == n || (!f_.momentum && momentum.empty())),
        "device_sgd_update: " + std::to_string(params.size()) + " parameters and " +
            std::to_string(momentum.size()) + " momentum entries, the layout " + std::to_string(n));
  }

  /// Tensor i's kept entries: their averaged gradients are payload[k] * factor, in index order.
  void kept(std::size_t i, std::span<const float> payload, float factor) {
    const auto& plan = engine_.plan(i);
    if (plan.count() == 0) return;
    const auto& t = engine_.layout().tensor(i);
    float* p = params_.data() + t.offset;
    if (plan.format() == plan_format::indices) {
      exec().for_each(plan.count(),
                      detail::sgd_indices_op{f_, plan.device_indices().data(), payload.data(),
                                             factor, p, momentum(t.offset)},
                      stream_);
      return;
    }
    const detail::bitmap_view m{plan.device_words().data(), plan.device_ranks().data(), t.size,
                                plan.unit()};
    const auto grid = detail::quad_grid::of(p, t.size);
    exec().for_each(
        grid.quads,
        detail::sgd_bitmap_op{f_, m, payload.data(), factor, p, momentum(t.offset), grid}, stream_);
  }

  /// Tensor i's whole averaged gradient (a dense bucket's, written back).
  void dense(std::size_t i, std::span<const float> grad) {
    const auto& t = engine_.layout().tensor(i);
    if (t.size == 0) return;
    exec().for_each(
        t.size,
        detail::sgd_dense_op{f_, grad.data(), params_.data() + t.offset, momentum(t.offset)},
        stream_);
  }

  /// Every tensor has had its update: the step counts.
  void done() noexcept { ++opt_.steps_; }

 private:
  const auto& exec() const noexcept { return engine_.compactor().exec(); }
  float* momentum(std::size_t offset) const noexcept {
    return f_.momentum ? momentum_.data() + offset : nullptr;
  }

  sgd& opt_;
  const Engine& engine_;
  std::span<float> params_;
  std::span<float> momentum_;
  stream_type stream_;
  detail::sgd_factors f_{};
};

}  // namespace pactrain
