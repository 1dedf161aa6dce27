// pactrain/torch_params.hpp: a LibTorch module's parameters bound to layout-ordered flat
// buffers (part of <pactrain/torch.hpp>; CMake target pactrain::torch).
#pragma once

#include <pactrain/communicator.hpp>
#include <pactrain/concepts.hpp>
#include <pactrain/error.hpp>
#include <pactrain/layout.hpp>
#include <pactrain/pruning/pruner.hpp>

#include <torch/csrc/autograd/variable.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace pactrain {

/// What torch_params takes from a module.
struct torch_options {
  /// Entries per bucket (param_layout's default: 4 Mi).
  std::size_t bucket_capacity = param_layout::default_bucket_capacity;
  /// Which parameters the pruner may prune; by default those with two or more dimensions
  /// (linear and embedding matrices, convolution kernels), not biases or norms.
  std::function<bool(const std::string& name, const torch::Tensor& p)> prunable = {};
  /// 0: one layout tensor per parameter. Otherwise each parameter of two or more dimensions
  /// becomes layout tensors of at most this many rows (of its first dimension), named
  /// "<name>.rows<first row>", each with its own mask ranking (per-tensor pruning scope) and,
  /// with bucket_capacity 1, its own bucket (collective and ternary scale). For finer ternary
  /// scales alone, ternary_options::scale_block costs no extra collectives.
  std::size_t rows_per_tensor = 0;
};

/// A module's trainable parameters moved into layout-ordered flat buffers: each parameter
/// becomes a view of one flat float tensor, its gradient a view of another (gradients as bucket
/// views, as DDP's gradient_as_bucket_view), and a third holds the optimizer's momentum. A
/// tensor of shape [d0, d1, ...] is a d0 x (d1 * ...) matrix of the layout, a 0-D or 1-D one a
/// vector (or several row blocks, see torch_options::rows_per_tensor). Parameters must be
/// float32 on the CPU; frozen ones (requires_grad false) are left out. The module must outlive
/// this object and keep its parameters (no .to(), no new ones).
class torch_params {
 public:
  explicit torch_params(torch::nn::Module& module, torch_options o = {})
      : layout_(o.bucket_capacity) {
    const auto named = module.named_parameters(/*recurse=*/true);
    for (const auto& item : named) {
      const torch::Tensor& p = item.value();
      if (!p.requires_grad()) continue;
      PACTRAIN_EXPECTS(p.scalar_type() == torch::kFloat32 && p.device().is_cpu(),
                       "torch_params: parameter '" + item.key() +
                           "' is not a float32 CPU tensor (pactrain's LibTorch adapter binds "
                           "host float buffers)");
      const auto n = static_cast<std::size_t>(p.numel());
      first_tensor_.push_back(layout_.tensor_count());
      if (p.dim() >= 2) {
        const auto rows = static_cast<std::size_t>(p.size(0));
        const std::size_t cols = rows == 0 ? 0 : n / rows;
        const std::size_t block = o.rows_per_tensor == 0 ? rows : o.rows_per_tensor;
        if (block >= rows) {
          layout_.add(item.key(), rows, cols);
        } else {
          for (std::size_t r = 0; r < rows; r += block) {
            layout_.add(item.key() + ".rows" + std::to_string(r), std::min(block, rows - r), cols);
          }
        }
      } else {
        layout_.add(item.key(), n);
      }
      params_.push_back(p);
      names_.push_back(item.key());
      const bool prune = o.prunable ? o.prunable(item.key(), p) : p.dim() >= 2;
      prunable_.resize(layout_.tensor_count(), prune);
    }
    first_tensor_.push_back(layout_.tensor_count());
    const auto total = static_cast<std::int64_t>(layout_.total_size());
    values_ = torch::empty({total}, torch::kFloat32);
    grads_ = torch::zeros({total}, torch::kFloat32);
    momentum_ = torch::zeros({total}, torch::kFloat32);
    torch::NoGradGuard no_grad;
    for (std::size_t i = 0; i < params_.size(); ++i) {
      auto& p = params_[i];
      // A parameter's blocks are consecutive in the layout: it starts at its first one's offset.
      const auto at = static_cast<std::int64_t>(layout_.tensor(first_tensor_[i]).offset);
      const auto n = p.numel();
      values_.narrow(0, at, n).copy_(p.detach().reshape({-1}));
      p.set_data(values_.narrow(0, at, n).view(p.sizes()));
      p.mutable_grad() = grads_.narrow(0, at, n).view(p.sizes());
    }
  }

  torch_params(const torch_params&) = delete;
  torch_params& operator=(const torch_params&) = delete;

  [[nodiscard]] const param_layout& layout() const noexcept { return layout_; }
  /// One flag per tensor of the layout (see torch_options::prunable).
  [[nodiscard]] const std::vector<bool>& prunable() const noexcept { return prunable_; }
  /// The bound parameters, in layout order, and their names.
  [[nodiscard]] const std::vector<torch::Tensor>& parameters() const noexcept { return params_; }
  [[nodiscard]] const std::vector<std::string>& names() const noexcept { return names_; }
  /// The layout tensors of parameter i: [first, last). One unless rows_per_tensor splits it.
  [[nodiscard]] std::pair<std::size_t, std::size_t> tensors_of(std::size_t i) const {
    PACTRAIN_EXPECTS(i < params_.size(), "torch_params::tensors_of: parameter " +
                                             std::to_string(i) + " of " +
                                             std::to_string(params_.size()));
    return {first_tensor_[i], first_tensor_[i + 1]};
  }

  /// The flat buffers, layout().total_size() entries each.
  [[nodiscard]] std::span<float> values() noexcept { return span_of(values_); }
  [[nodiscard]] std::span<const float> values_const() noexcept { return span_of(values_); }
  [[nodiscard]] std::span<float> grads() noexcept { return span_of(grads_); }
  [[nodiscard]] std::span<float> momentum() noexcept { return span_of(momentum_); }
  [[nodiscard]] const torch::Tensor& flat_values() const noexcept { return values_; }
  [[nodiscard]] const torch::Tensor& flat_grads() const noexcept { return grads_; }

  /// Zeroes every gradient in place (Module::zero_grad(true) would unbind them from the flat
  /// buffer).
  void zero_grad() {
    auto g = grads();
    std::fill(g.begin(), g.end(), 0.0f);
  }

  /// Collective over `comm`: every rank takes rank `root`'s parameter values (as DDP does at
  /// construction), so training starts from the same weights everywhere.
  template <communicator Comm>
  void broadcast(Comm& comm, int root = 0) {
    auto v = values();
    comm.broadcast(std::as_writable_bytes(v), root);
  }

  /// Sets the pruned entries of the parameters and of the momentum to +0.
  template <gradient_mask Mask>
  void apply_masks(const std::vector<Mask>& masks) {
    pactrain::apply_masks(layout_, masks, values());
    pactrain::apply_masks(layout_, masks, momentum());
  }

 private:
  static std::span<float> span_of(const torch::Tensor& t) noexcept {
    return {t.data_ptr<float>(), static_cast<std::size_t>(t.numel())};
  }

  param_layout layout_;
  std::vector<torch::Tensor> params_;
  std::vector<std::string> names_;
  std::vector<std::size_t> first_tensor_;  // per parameter, and one past the last
  std::vector<bool> prunable_;             // per layout tensor
  torch::Tensor values_;
  torch::Tensor grads_;
  torch::Tensor momentum_;
};

}  // namespace pactrain
