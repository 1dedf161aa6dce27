// The compression methods users would pick instead of pactrain, as gradient exchanges
// (examples::gradient_exchange, examples/common/exchange.hpp) of the trainers, so that they
// train through the same loops, data, seeds and steps as pactrain's runs:
//   dense     one MPI_Iallreduce of the whole gradient (the dense reference)
//   fp16      PyTorch's fp16_compress_hook: g / P as IEEE half, summed in half on every hop
//   topk      DGC (Lin et al., ICLR 2018) as its paper runs it: local gradient clipping,
//             momentum correction, per-tensor Top-k of the accumulated velocity with error
//             feedback, momentum factor masking, the exponential warm-up of the sparsity;
//             small tensors whole; one MPI_Allgather
//   powersgd  rank-r PowerSGD with error feedback and warm start, optionally after dense
//             steps (powersgd.hpp)
// dense and fp16 are pactrain_sync_bench's methods (bench/sync), Top-k its selection.
#pragma once

#include "../sync/harness.hpp"
#include "topk.hpp"
#include "powersgd.hpp"

#include "common/exchange.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

namespace e2e {

/// A pactrain_sync_bench method (dense, fp16) as a gradient exchange.
class bench_exchange final : public examples::gradient_exchange {
 public:
  explicit bench_exchange(std::unique_ptr<sync_bench::method> s) : s_(std::move(s)) {}
  void exchange(std::span<float> grads, std::span<const float>) override { s_->sync(grads); }
  [[nodiscard]] std::size_t bytes_sent() const override { return s_->bytes_sent(); }

 private:
  std::unique_ptr<sync_bench::method> s_;
};

/// dense (MPI_Iallreduce) or fp16 over `comm`, for gradients of n entries.
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

/// DGC (Lin et al., ICLR 2018) as its paper runs it, on a model's layout:
///  - local gradient clipping: where the trainer clips the mean gradient to norm C (set_clip),
///    each rank clips its share of the mean, g / N, to C / sqrt(N) (N ranks) before
///    accumulating it, and the trainer does not clip the result. The paper's local gradient
///    is g / N (its loss is over the N b samples of all nodes), so this is its N^(-1/2)
///    scaling of the threshold: on this rank's own mean gradient g, a norm of C sqrt(N);
///  - momentum correction: u = m u + (g + wd w), and the residual v += u;
///  - per-tensor Top-k: each sparse tensor sends its k_t = ceil(d * size_t) (at least 1)
///    entries of largest |v| (ties to the lower index); v is cleared where it sent (error
///    feedback) and so is u (momentum factor masking);
///  - small tensors (1-D ones and those under `min_sparse` entries: biases, norms, the small
///    layers) are sent whole every step, with plain momentum (never masked);
///  - the exponential warm-up of the density d: 1/4, 1/16, 1/64, ... while above the final
///    density 1 - S, in equal stages over the first `warmup_steps` steps (the paper's 75%,
///    93.75%, 98.4375%, 99.6% over 4 epochs, then 99.9%).
/// One MPI_Allgather per step carries every rank's small tensors and (index, value) pairs:
/// k_t depends only on the step, so every rank sends the same count. The trainer then takes
/// a plain SGD step on the mean.
class dgc_exchange final : public examples::gradient_exchange {
 public:
  struct config {
    float momentum = 0.9f;
    float weight_decay = 0.0f;
    double sparsity = 0.999;         // final
    std::uint64_t warmup_steps = 0;  // 0: the final density from the first step
    std::size_t min_sparse = 1024;   // smaller (and 1-D) tensors are sent whole
  };

  /// Collective over nothing (the constructor only reads `comm`'s size).
  dgc_exchange(MPI_Comm comm, const pactrain::param_layout& layout, const config& c)
      : comm_(comm), c_(c), n_(layout.total_size()), u_(n_, 0.0f), residual_(n_, 0.0f) {
    PACTRAIN_EXPECTS(c.sparsity > 0.0 && c.sparsity < 1.0, "dgc: sparsity must be in (0, 1)");
    MPI_Comm_size(comm_, &ranks_);
    for (const auto& t : layout.tensors()) {
      if (t.rows > 0 && t.size >= c.min_sparse) {
        sparse_.push_back({t.offset, t.size});
      } else {
        whole_.push_back({t.offset, t.size});
        whole_entries_ += t.size;
      }
    }
    for (double d = 0.25; d > 1.0 - c.sparsity; d *= 0.25) ++stages_;
    PACTRAIN_EXPECTS((whole_entries_ + 2 * n_) * sizeof(float) <= INT32_MAX,
                     "dgc: a step's payload may exceed one MPI_Allgather count");
  }

  /// The density of step `step` (from 0): the warm-up's stage, or the final 1 - sparsity.
  [[nodiscard]] double density(std::uint64_t step) const noexcept {
    if (step >= c_.warmup_steps || stages_ == 0) return 1.0 - c_.sparsity;
    const std::uint64_t stage = step * stages_ / c_.warmup_steps;
    return std::ldexp(1.0, -2 * static_cast<int>(stage + 1));
  }
  /// Entries a tensor of `size` sends at density `d`: ceil(d * size), at least 1.
  [[nodiscard]] static std::size_t kept(double d, std::size_t size) noexcept {
    // The margin keeps a product that is whole in exact arithmetic (0.001 * 1000) whole.
    const double want = std::ceil(d * static_cast<double>(size) - 1e-6);
    return std::clamp<std::size_t>(static_cast<std::size_t>(std::max(want, 1.0)), 1, size);
  }

  void set_clip(double norm) override { clip_ = norm; }
  [[nodiscard]] bool clips_locally() const override { return true; }

  void exchange(std::span<float> grads, std::span<const float> params) override {
    PACTRAIN_EXPECTS(grads.size() == n_ && params.size() == n_,
                     "dgc_exchange: buffer sizes differ from the exchange's");
    if (clip_ > 0) clip_local(grads);
    for (std::size_t i = 0; i < n_; ++i)
      u_[i] = c_.momentum * u_[i] + (grads[i] + c_.weight_decay * params[i]);
    // This rank's message: the small tensors' u, then every sparse tensor's pairs.
    send_.clear();
    for (const auto& t : whole_) {
      for (std::size_t i = t.offset; i < t.offset + t.size; ++i)
        send_.push_back(std::bit_cast<std::uint32_t>(u_[i]));
    }
    const double d = density(step_);
    pairs_ = 0;
    for (const auto& t : sparse_) {
      const std::size_t k = kept(d, t.size);
      sync_bench::select_topk(std::span(residual_).subspan(t.offset, t.size),
                              std::span<const float>(u_).subspan(t.offset, t.size), k, idx_,
                              scratch_, cand_, step_);
      for (const std::uint32_t j : idx_) {
        const std::size_t i = t.offset + j;
        send_.push_back(static_cast<std::uint32_t>(i));
        send_.push_back(std::bit_cast<std::uint32_t>(residual_[i]));
        residual_[i] = 0.0f;
        u_[i] = 0.0f;
      }
      pairs_ += k;
    }
    ++step_;
    const std::size_t words = send_.size();
    recv_.resize(words * static_cast<std::size_t>(ranks_));
    const int count = static_cast<int>(words * sizeof(std::uint32_t));
    sync_bench::check_mpi(
        MPI_Allgather(send_.data(), count, MPI_BYTE, recv_.data(), count, MPI_BYTE, comm_),
        "MPI_Allgather");
    // Ranks in order: the same sum on every rank. Each value is scaled by 1/N (exact for a
    // power of two).
    std::fill(grads.begin(), grads.end(), 0.0f);
    const float scale = 1.0f / static_cast<float>(ranks_);
    for (int r = 0; r < ranks_; ++r) {
      const std::uint32_t* w = recv_.data() + static_cast<std::size_t>(r) * words;
      for (const auto& t : whole_) {
        for (std::size_t i = t.offset; i < t.offset + t.size; ++i)
          grads[i] += std::bit_cast<float>(*w++) * scale;
      }
      for (std::size_t p = 0; p < pairs_; ++p, w += 2)
        grads[w[0]] += std::bit_cast<float>(w[1]) * scale;
    }
  }
  /// The last step's message: the small tensors as floats, 8 bytes per (index, value) pair.
  [[nodiscard]] std::size_t bytes_sent() const override { return send_.size() * sizeof(float); }
  [[nodiscard]] bool applies_momentum() const override { return true; }
  [[nodiscard]] std::span<const float> momentum() const noexcept { return u_; }
  /// Entries sent whole every step, and (index, value) pairs in the last step.
  [[nodiscard]] std::size_t whole_entries() const noexcept { return whole_entries_; }
  [[nodiscard]] std::size_t pairs() const noexcept { return pairs_; }
  /// The warm-up's stages (density 1/4, 1/16, ... above the final one).
  [[nodiscard]] std::size_t warmup_stages() const noexcept { return stages_; }

 private:
  struct range {
    std::size_t offset, size;
  };

  // This rank's gradient g scaled to norm C sqrt(N) where it is longer (g / N to C / sqrt(N));
  // the norm in double.
  void clip_local(std::span<float> g) const {
    double sq = 0;
    for (const float v : g) sq += static_cast<double>(v) * v;
    const double norm = std::sqrt(sq);
    const double limit = clip_ * std::sqrt(static_cast<double>(ranks_));
    if (!(norm > limit)) return;
    const auto f = static_cast<float>(limit / norm);
    for (float& v : g) v *= f;
  }

  MPI_Comm comm_;
  config c_;
  std::size_t n_;
  int ranks_ = 1;
  double clip_ = 0;
  std::size_t stages_ = 0;
  std::size_t whole_entries_ = 0;
  std::size_t pairs_ = 0;
  std::uint64_t step_ = 0;
  std::vector<range> sparse_, whole_;
  std::vector<float> u_, residual_;
  std::vector<std::uint32_t> send_, recv_, idx_, cand_;
  std::vector<float> scratch_;
};

/// PowerSGD as a gradient exchange.
class powersgd_exchange final : public examples::gradient_exchange {
 public:
  powersgd_exchange(MPI_Comm comm, const pactrain::param_layout& layout, std::size_t rank,
                    std::uint64_t seed, std::uint64_t dense_steps = 0)
      : p_(comm, layout, rank, seed, dense_steps) {}
  void exchange(std::span<float> grads, std::span<const float>) override { p_.exchange(grads); }
  [[nodiscard]] std::size_t bytes_sent() const override { return p_.bytes_sent(); }
  [[nodiscard]] std::size_t collectives() const override { return p_.collectives(); }

 private:
  powersgd p_;
};

}  // namespace e2e
