// The compression methods users would pick instead of pactrain, as gradient exchanges
// (examples::gradient_exchange, examples/common/exchange.hpp) of the trainers, so that they
// train through the same loops, data, seeds and steps as pactrain's runs:
//   dense     one blocking MPI_Allreduce of the whole gradient (the dense reference)
//   fp16      PyTorch's fp16_compress_hook: g / P as IEEE half, summed in half on every hop
//   topk      DGC (Lin et al., ICLR 2018): momentum correction, Top-k of the accumulated
//             velocity with error feedback, momentum factor masking, one MPI_Allgather
//   powersgd  rank-r PowerSGD with error feedback and warm start (powersgd.hpp)
// dense and fp16 are pactrain-sync-bench's methods (bench/sync), Top-k its selection.
#pragma once

#include "../sync/harness.hpp"
#include "../sync/topk.hpp"
#include "powersgd.hpp"

#include "common/exchange.hpp"

#include <memory>
#include <span>
#include <vector>

namespace e2e {

/// A pactrain-sync-bench method (dense, fp16) as a gradient exchange.
class bench_exchange final : public examples::gradient_exchange {
 public:
  explicit bench_exchange(std::unique_ptr<sync_bench::strategy> s) : s_(std::move(s)) {}
  void exchange(std::span<float> grads, std::span<const float>) override { s_->sync(grads); }
  [[nodiscard]] std::size_t bytes_sent() const override { return s_->bytes_sent(); }

 private:
  std::unique_ptr<sync_bench::strategy> s_;
};

/// dense (MPI_Allreduce) or fp16 over `comm`, for gradients of n entries.
inline std::unique_ptr<bench_exchange> make_bench_exchange(const char* method, MPI_Comm comm,
                                                           std::size_t n) {
  const sync_bench::options o;
  const sync_bench::gradient none;
  const sync_bench::method_args a{comm, o, n, none};
  if (std::string_view(method) == "fp16") {
    return std::make_unique<bench_exchange>(sync_bench::make_fp16(a));
  }
  return std::make_unique<bench_exchange>(sync_bench::make_dense(a));
}

/// DGC: u = m u + (g + wd w) (momentum correction); the residual v += u and its k entries of
/// largest |v| are sent (topk_strategy's error feedback); u and v are cleared where this rank
/// sent (momentum factor masking). The trainer then takes a plain SGD step on the mean.
class dgc_exchange final : public examples::gradient_exchange {
 public:
  dgc_exchange(MPI_Comm comm, std::size_t n, std::size_t k, float momentum, float weight_decay)
      : topk_(comm, n, k), m_(momentum), wd_(weight_decay), u_(n, 0.0f) {}
  void exchange(std::span<float> grads, std::span<const float> params) override {
    PACTRAIN_EXPECTS(grads.size() == u_.size() && params.size() == u_.size(),
                     "dgc_exchange: buffer sizes differ from the exchange's");
    for (std::size_t i = 0; i < u_.size(); ++i) {
      u_[i] = m_ * u_[i] + (grads[i] + wd_ * params[i]);
      grads[i] = u_[i];
    }
    topk_.sync(grads);
    for (std::uint32_t i : topk_.selected()) u_[i] = 0.0f;
  }
  [[nodiscard]] std::size_t bytes_sent() const override { return topk_.bytes_sent(); }
  [[nodiscard]] bool applies_momentum() const override { return true; }
  [[nodiscard]] std::span<const float> momentum() const noexcept { return u_; }

 private:
  sync_bench::topk_strategy topk_;
  float m_;
  float wd_;
  std::vector<float> u_;
};

/// PowerSGD as a gradient exchange.
class powersgd_exchange final : public examples::gradient_exchange {
 public:
  powersgd_exchange(MPI_Comm comm, const pactrain::param_layout& layout, std::size_t rank,
                    std::uint64_t seed)
      : p_(comm, layout, rank, seed) {}
  void exchange(std::span<float> grads, std::span<const float>) override { p_.exchange(grads); }
  [[nodiscard]] std::size_t bytes_sent() const override { return p_.bytes_sent(); }
  [[nodiscard]] std::size_t collectives() const override { return p_.collectives(); }

 private:
  powersgd p_;
};

}  // namespace e2e
