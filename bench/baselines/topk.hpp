// topk: DGC-style Top-k with error feedback; every rank's k (index, value) pairs gathered by one
// MPI_Allgather and accumulated into the dense result. topk_method, one global selection over
// the whole gradient, is pactrain_sync_bench's method (topk.cpp); select_topk is also the
// per-tensor selection of the end-to-end trainer's DGC baseline (bench/baselines/baselines.hpp).
#pragma once

#include "../sync/harness.hpp"

#include <algorithm>
#include <cmath>
#include <functional>

namespace sync_bench {

/// DGC-style Top-k selection with error feedback. Adds g into `acc` (the residual) and puts
/// into `out` the indices (ascending) of the k entries of largest |acc|, ties broken by lower
/// index. `scratch` and `cand` are reused buffers.
inline void select_topk(std::span<float> acc, std::span<const float> g, std::size_t k,
                        std::vector<std::uint32_t>& out, std::vector<float>& scratch,
                        std::vector<std::uint32_t>& cand, std::uint64_t step) {
  const std::size_t n = acc.size();
  out.clear();
  if (k >= n) {
    for (std::size_t i = 0; i < n; ++i) {
      acc[i] += g[i];
      out.push_back(static_cast<std::uint32_t>(i));
    }
    return;
  }
  // 1. Estimate the threshold on a strided sample of acc + g (DGC samples 0.1-1%), aiming a
  //    little low so that the candidates usually hold at least k entries.
  const std::size_t samples = std::min(n, std::max<std::size_t>(std::size_t{1} << 16, n / 100));
  const std::size_t stride = n / samples;
  scratch.resize(samples);
  const std::size_t start = static_cast<std::size_t>(step % stride);
  for (std::size_t s = 0; s < samples; ++s) {
    const std::size_t i = start + s * stride;
    scratch[s] = std::fabs(acc[i] + g[i]);
  }
  const double frac = static_cast<double>(k) / static_cast<double>(n);
  const auto want = std::min(samples - 1, static_cast<std::size_t>(frac * 1.1 * samples + 16));
  std::nth_element(scratch.begin(), scratch.begin() + static_cast<std::ptrdiff_t>(want),
                   scratch.end(), std::greater<float>());
  const float est = scratch[want];
  // 2. One pass: acc += g, and the candidates at or above the estimate (branch-free).
  cand.resize(n);
  std::size_t c = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const float v = acc[i] + g[i];
    acc[i] = v;
    cand[c] = static_cast<std::uint32_t>(i);
    c += std::fabs(v) >= est ? 1 : 0;
  }
  if (c < k) {  // the estimate was too high: every entry is a candidate
    for (std::size_t i = 0; i < n; ++i) cand[i] = static_cast<std::uint32_t>(i);
    c = n;
  }
  cand.resize(c);
  if (k == 0) return;
  // 3. The exact k-th largest magnitude among the candidates is the global one.
  scratch.resize(c);
  for (std::size_t j = 0; j < c; ++j) scratch[j] = std::fabs(acc[cand[j]]);
  std::nth_element(scratch.begin(), scratch.begin() + static_cast<std::ptrdiff_t>(k - 1),
                   scratch.end(), std::greater<float>());
  const float t = scratch[k - 1];
  std::size_t above = 0;
  for (std::size_t j = 0; j < c; ++j) above += std::fabs(acc[cand[j]]) > t ? 1 : 0;
  std::size_t ties = k - above;
  out.reserve(k);
  for (std::uint32_t i : cand) {  // ascending
    const float m = std::fabs(acc[i]);
    if (m > t || (m == t && ties > 0)) {
      if (m == t) --ties;
      out.push_back(i);
    }
  }
}

class topk_method final : public method {
 public:
  struct pair {
    std::uint32_t index;
    float value;
  };
  static_assert(sizeof(pair) == 8);

  /// k of n entries sent by every rank in each sync.
  topk_method(MPI_Comm comm, std::size_t n, std::size_t k)
      : comm_(comm), n_(n), k_(k), residual_(n, 0.0f) {
    MPI_Comm_size(comm_, &ranks_);
    PACTRAIN_EXPECTS(k_ <= n_, "topk: k exceeds the gradient's entries");
    PACTRAIN_EXPECTS(k_ * sizeof(pair) <= static_cast<std::size_t>(INT32_MAX),
                     "topk: k * 8 bytes exceeds one MPI_Allgather count");
    send_.resize(k_);
    recv_.resize(k_ * static_cast<std::size_t>(ranks_));
  }
  /// The same k as the sparse mask of o.density: round(D * size) kept entries per tensor.
  topk_method(MPI_Comm comm, const options& o, std::size_t n)
      : topk_method(comm, n, kept_entries(o, n)) {}

  double sync(std::span<float> g) override {
    auto t0 = clock_type::now();
    // Error feedback: what was not sent before is added to this step's gradient.
    select_topk(residual_, g, k_, idx_, scratch_, cand_, step_++);
    for (std::size_t j = 0; j < k_; ++j) {
      const std::uint32_t i = idx_[j];
      send_[j] = {i, residual_[i]};
      residual_[i] = 0.0f;
    }
    double local = seconds_since(t0);
    const int count = static_cast<int>(k_ * sizeof(pair));
    check_mpi(MPI_Allgather(send_.data(), count, MPI_BYTE, recv_.data(), count, MPI_BYTE, comm_),
              "MPI_Allgather");
    t0 = clock_type::now();
    const auto t_acc = t0;
    std::fill(g.begin(), g.end(), 0.0f);
    // Ranks in order: the same sum on every rank. Scaling each pair (by 1/P, exact for a
    // power of two) saves a pass over the dense result.
    const float scale = 1.0f / static_cast<float>(ranks_);
    for (const pair& p : recv_) g[p.index] += p.value * scale;
    accumulate_seconds_ = seconds_since(t_acc);
    return local + accumulate_seconds_;
  }
  [[nodiscard]] std::size_t bytes_sent() const override { return k_ * sizeof(pair); }
  /// The indices this rank sent in the last sync, ascending.
  [[nodiscard]] std::span<const std::uint32_t> selected() const noexcept { return idx_; }
  [[nodiscard]] double rank_dependent_seconds() const override { return accumulate_seconds_; }
  [[nodiscard]] collective_choice collective(const pactrain::mpi_allreduce_config&,
                                             int) const override {
    return {"allgather", false};
  }

  std::vector<float> reference(const options& o, int ranks) override {
    // First sync, residual zero: every rank's own top-k, summed in rank order.
    std::vector<float> sum(n_, 0.0f), g(n_);
    for (int r = 0; r < ranks; ++r) {
      fill_gradient(g, o.seed, r);
      // The reference selection: full sort by (|a| descending, index ascending).
      std::vector<std::uint32_t> order(n_);
      for (std::size_t i = 0; i < n_; ++i) order[i] = static_cast<std::uint32_t>(i);
      std::stable_sort(order.begin(), order.end(), [&](std::uint32_t x, std::uint32_t y) {
        return std::fabs(g[x]) > std::fabs(g[y]);
      });
      const float scale = 1.0f / static_cast<float>(ranks);
      for (std::size_t j = 0; j < k_; ++j) sum[order[j]] += g[order[j]] * scale;
    }
    return sum;
  }

 private:
  static std::size_t kept_entries(const options& o, std::size_t n) {
    std::size_t k = 0;
    const auto layout = make_layout(n, o.tensor);
    for (const auto& t : layout.tensors())
      k += t.size - pactrain::pruned_count(t.size, 1.0 - o.density);
    return k;
  }

  MPI_Comm comm_;
  std::size_t n_;
  std::size_t k_ = 0;
  int ranks_ = 1;
  std::uint64_t step_ = 0;
  double accumulate_seconds_ = 0;
  std::vector<float> residual_;
  std::vector<pair> send_, recv_;
  std::vector<std::uint32_t> idx_, cand_;
  std::vector<float> scratch_;
};

}  // namespace sync_bench
