// fmnist::gradient_exchange: the interface through which the Fashion-MNIST trainer
// (trainer.hpp) averages gradients with a method other than pactrain::sync. bench/e2e's
// baselines implement it, so that they train through the same loop, data and seed.
#pragma once

#include <cstddef>
#include <span>

namespace pactrain::fmnist {

/// A gradient exchange other than pactrain::sync: bench/e2e's baselines (a blocking dense
/// allreduce, Top-k, PowerSGD, fp16) train through the same loop, data and seed with it.
class gradient_exchange {
 public:
  virtual ~gradient_exchange() = default;
  /// Collective: replaces `grads` (this rank's flat gradient, in the model's layout) with what
  /// the method makes of the mean over ranks. `params` are the weights before this step.
  virtual void exchange(std::span<float> grads, std::span<const float> params) = 0;
  /// Payload bytes this rank handed to the collectives in the last exchange.
  [[nodiscard]] virtual std::size_t bytes_sent() const = 0;
  /// True where the exchange applies momentum and weight decay itself (DGC's momentum
  /// correction): the trainer's optimiser then takes plain SGD steps on its result.
  [[nodiscard]] virtual bool applies_momentum() const { return false; }
};

}  // namespace pactrain::fmnist
