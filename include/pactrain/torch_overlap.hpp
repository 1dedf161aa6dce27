// pactrain/torch_overlap.hpp: buckets handed to the sync engine from backward's AccumulateGrad
// hooks (part of <pactrain/torch.hpp>; CMake target pactrain::torch).
#pragma once

#include <pactrain/concepts.hpp>
#include <pactrain/error.hpp>
#include <pactrain/torch_params.hpp>

#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/torch.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

namespace pactrain {

/// Hands each bucket to `sync` as soon as backward has written its last gradient, from
/// AccumulateGrad post hooks (as DDP's reducer does), so its allreduce runs while backward
/// computes the earlier layers. Bit for bit the result of one sync.allreduce(params.grads())
/// after backward. One backward per step, or several with all but the last under no_sync()
/// (gradient accumulation); parameters that get no gradient are sent by finish_step (as +0). Both
/// objects must outlive this one; the hooks stay registered but do nothing once it is destroyed.
template <sync_engine Sync>
class torch_overlap {
 public:
  torch_overlap(torch_params& params, Sync& sync) : state_(std::make_shared<state>(params, sync)) {
    const auto& layout = params.layout();
    PACTRAIN_EXPECTS(layout == sync.layout(),
                     "torch_overlap: the engine's layout is not the parameters' layout");
    for (std::size_t i = 0; i < params.parameters().size(); ++i) {
      auto acc = torch::autograd::impl::grad_accumulator(params.parameters()[i]);
      PACTRAIN_EXPECTS(acc != nullptr, "torch_overlap: parameter '" + params.names()[i] +
                                           "' has no gradient accumulator (not a leaf?)");
      acc->add_post_hook(std::make_unique<hook>(state_, i));
      accumulators_.push_back(std::move(acc));  // the hooks live as long as their node
    }
  }
  torch_overlap(const torch_overlap&) = delete;
  torch_overlap& operator=(const torch_overlap&) = delete;
  ~torch_overlap() { state_->alive = false; }

  /// Local: zeroes the gradients and opens the engine's step over them.
  void begin_step() {
    state_->params.zero_grad();
    state_->sync.begin_step(state_->params.grads());
    state_->rearm();
    state_->twice = false;
  }

  /// Local: while the returned guard lives, backward passes only add into the gradients
  /// (DDP's no_sync); the first pass after it sends the buckets. For gradient accumulation:
  /// begin_step(), then every backward pass but the last under no_sync(), then finish_step().
  [[nodiscard]] auto no_sync() {
    struct guard {
      explicit guard(std::shared_ptr<state> s) : st(std::move(s)) { st->paused = true; }
      guard(const guard&) = delete;
      guard& operator=(const guard&) = delete;
      ~guard() {
        st->paused = false;
        st->rearm();
      }
      std::shared_ptr<state> st;
    };
    return guard(state_);
  }

  /// Whether a gradient was written twice in the open (or last) step: a second backward pass
  /// outside no_sync(), which finish_step reports.
  [[nodiscard]] bool written_twice() const noexcept { return state_->twice; }

  /// Collective: submits what backward did not reach and waits for the averages. Throws
  /// pactrain::error (after the step has completed on every rank) if a gradient was written
  /// twice in the step.
  void finish_step() {
    state_->sync.finish_step();
    check_single_backward();
  }
  /// As above, fused with the optimizer step (sync::finish_step(update), e.g. sgd::fused):
  /// sparse buckets' gradients are not written back, only the kept weights are updated.
  template <class Update>
  void finish_step(Update& update) {
    state_->sync.finish_step(update);
    check_single_backward();
  }

 private:
  void check_single_backward() const {
    PACTRAIN_EXPECTS(!state_->twice,
                     "torch_overlap: a gradient was written twice in one step (one backward "
                     "per step, or all but the last under no_sync())");
  }

  struct state {
    state(torch_params& p, Sync& s) : params(p), sync(s) {}
    torch_params& params;
    Sync& sync;
    std::vector<std::size_t> pending;   // per bucket: layout tensors not yet written
    std::vector<std::uint8_t> written;  // per parameter
    bool twice = false;
    bool alive = true;
    bool paused = false;  // no_sync()

    // Every bucket waits for all its tensors again, none written yet.
    void rearm() {
      const auto& buckets = params.layout().buckets();
      pending.resize(buckets.size());
      for (std::size_t b = 0; b < buckets.size(); ++b) pending[b] = buckets[b].tensor_count;
      written.assign(params.parameters().size(), 0);
    }
  };

  struct hook final : torch::autograd::FunctionPostHook {
    hook(std::shared_ptr<state> s, std::size_t tensor) : st(std::move(s)), i(tensor) {}
    torch::autograd::variable_list operator()(
        const torch::autograd::variable_list& outputs,
        const torch::autograd::variable_list& /*inputs*/) override {
      auto& s = *st;
      if (!s.alive || s.paused || !s.sync.step_open()) return outputs;
      if (s.written[i] != 0) {
        s.twice = true;
        return outputs;
      }
      s.written[i] = 1;
      const auto [first, last] = s.params.tensors_of(i);
      for (std::size_t t = first; t < last; ++t) {
        const std::size_t b = s.params.layout().tensor(t).bucket;
        if (--s.pending[b] == 0) s.sync.submit_bucket(b);
      }
      return outputs;
    }
    std::shared_ptr<state> st;
    std::size_t i;
  };

  std::shared_ptr<state> state_;
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;
};

}  // namespace pactrain
