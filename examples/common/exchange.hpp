// examples::gradient_exchange: the interface through which the trainers (the Fashion-MNIST
// MLP's and the LibTorch one) average gradients with a method other than pactrain::sync, and
// examples::exchange_engine, which puts such an exchange where the training loops expect a
// sync engine. bench/e2e's baselines implement the interface, so that they train through the
// same loops, data and seeds as pactrain's runs.
#pragma once

#include <pactrain/concepts.hpp>
#include <pactrain/error.hpp>
#include <pactrain/layout.hpp>
#include <pactrain/mask.hpp>
#include <pactrain/mpi.hpp>
#include <pactrain/sync_options.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace examples {

/// A gradient exchange other than pactrain::sync: bench/e2e's baselines (a dense
/// allreduce, Top-k, PowerSGD, fp16) train through the same loops, data and seeds with it.
class gradient_exchange {
 public:
  virtual ~gradient_exchange() = default;
  /// Collective: replaces `grads` (this rank's flat gradient, in the model's layout) with what
  /// the method makes of the mean over ranks. `params` are the weights before this step.
  virtual void exchange(std::span<float> grads, std::span<const float> params) = 0;
  /// Payload bytes this rank handed to the collectives in the last exchange.
  [[nodiscard]] virtual std::size_t bytes_sent() const = 0;
  /// Collectives one exchange issues (each pays the network's latency).
  [[nodiscard]] virtual std::size_t collectives() const { return 1; }
  /// True where the exchange applies momentum and weight decay itself (DGC's momentum
  /// correction): the trainer's optimiser then takes plain SGD steps on its result.
  [[nodiscard]] virtual bool applies_momentum() const { return false; }
  /// True where the exchange clips each rank's own gradient before it compresses it (DGC's
  /// local gradient clipping). A trainer that clips the averaged gradient to a norm then
  /// passes that norm to set_clip once, before the first exchange, and does not clip the
  /// exchange's result.
  [[nodiscard]] virtual bool clips_locally() const { return false; }
  /// The norm the trainer would clip the averaged gradient to (0: none); read only where
  /// clips_locally().
  virtual void set_clip(double /*norm*/) {}
};

/// A gradient_exchange in the place of a sync engine in a training loop: the model's layout,
/// every entry kept, one exchange per step at finish_step (no overlap, no pruning, no fused
/// optimizer step). The weights must be bound (bind_params) before the first step.
class exchange_engine {
 public:
  exchange_engine(pactrain::mpi_communicator comm, const pactrain::param_layout& layout,
                  gradient_exchange& x)
      : comm_(std::move(comm)), x_(x), layout_(layout) {
    for (const auto& t : layout_.tensors()) masks_.push_back(pactrain::bitmap_mask::full(t.size));
    strategies_.assign(layout_.buckets().size(), pactrain::bucket_strategy::dense_plain);
    stats_.dense_bytes = layout_.total_size() * sizeof(float);
  }

  /// The weights the exchange sees (DGC adds their weight decay), in the layout.
  void bind_params(std::span<const float> params) {
    PACTRAIN_EXPECTS(params.size() == layout_.total_size(),
                     "exchange_engine: the weights do not match the layout");
    params_ = params;
  }

  /// Collective: the exchange of `grads`, timed as the step's allreduce.
  void allreduce(std::span<float> grads) {
    PACTRAIN_EXPECTS(grads.size() == layout_.total_size() && params_.size() == grads.size(),
                     "exchange_engine: the gradients (or the bound weights) do not match the "
                     "layout");
    const auto t0 = std::chrono::steady_clock::now();
    x_.exchange(grads, params_);
    stats_.allreduce_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    stats_.bytes_sent = x_.bytes_sent();
    stats_.collectives = x_.collectives();
    ++stats_.steps;
  }
  // The three-phase step: the exchange runs whole at finish_step.
  void begin_step(std::span<float> grads) {
    grads_ = grads;
    open_ = true;
  }
  [[nodiscard]] bool step_open() const noexcept { return open_; }
  void submit_bucket(std::size_t) {}
  void finish_step() {
    open_ = false;
    allreduce(grads_);
  }
  /// The fused optimizer step needs the sync engine's payloads: refused.
  template <class Update>
  void finish_step(Update&) {
    open_ = false;
    throw pactrain::error("exchange_engine: the fused optimizer step needs pactrain's sync engine");
  }

  // What a sync engine has (pactrain::sync_engine), for the loops' types: a baseline trains
  // dense, with every entry kept, so masks and strategies cannot change.
  using value_type = float;
  using mask_type = pactrain::bitmap_mask;
  using communicator_type = pactrain::mpi_communicator;
  void set_masks(std::vector<pactrain::bitmap_mask>) { refuse("set_masks"); }
  [[noreturn]] void reject_masks(std::string) { refuse("reject_masks"); }
  void set_strategies(std::vector<pactrain::bucket_strategy>) { refuse("set_strategies"); }
  [[nodiscard]] const std::vector<pactrain::bucket_strategy>& strategies() const noexcept {
    return strategies_;
  }
  [[nodiscard]] std::uint64_t step() const noexcept { return stats_.steps; }

  [[nodiscard]] const pactrain::param_layout& layout() const noexcept { return layout_; }
  [[nodiscard]] const std::vector<pactrain::bitmap_mask>& masks() const noexcept { return masks_; }
  [[nodiscard]] const pactrain::sync_stats& stats() const noexcept { return stats_; }
  [[nodiscard]] pactrain::mpi_communicator& get_communicator() noexcept { return comm_; }
  [[nodiscard]] gradient_exchange& exchange() const noexcept { return x_; }

 private:
  pactrain::mpi_communicator comm_;
  gradient_exchange& x_;
  const pactrain::param_layout& layout_;
  std::span<const float> params_;
  std::span<float> grads_;
  bool open_ = false;
  [[noreturn]] static void refuse(const char* op) {
    throw pactrain::error(std::string("exchange_engine::") + op +
                          ": a baseline trains dense; its masks and strategies do not change");
  }

  std::vector<pactrain::bitmap_mask> masks_;
  std::vector<pactrain::bucket_strategy> strategies_;
  pactrain::sync_stats stats_;
};

static_assert(pactrain::sync_engine<exchange_engine>);

/// True for exchange_engine: the training loops then skip what only a sync engine has
/// (pruning, the tuner, the fused step).
template <class Sync>
inline constexpr bool is_exchange_engine =
    std::is_same_v<std::remove_cvref_t<Sync>, exchange_engine>;

}  // namespace examples
