// pactrain_e2e --verify: every baseline's exchange against a reference every rank computes
// from all ranks' gradients, on data where the reference is exact (sums of multiples of a
// power of two; a mean gradient of rank 2 for PowerSGD). Prints one line per check; returns
// 1 on every rank when any check failed on any rank.
#include "baselines.hpp"

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

namespace {

/// Multiples of 2^-8 in (-1, 1): their means over up to 4 ranks are exact in IEEE half.
float coarse_value(int rank, std::size_t i) {
  return static_cast<float>(static_cast<int>(sync_bench::grad_value(7, rank, i) * 255.0f)) *
         0x1p-8f;
}

/// Largest |a - b|.
double max_error(std::span<const float> a, std::span<const float> b) {
  double e = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    e = std::max(e, std::fabs(static_cast<double>(a[i]) - b[i]));
  return e;
}

struct checker {
  int rank;
  int ranks;
  bool ok = true;

  void report(const char* name, bool pass, double error) {
    int fail = pass ? 0 : 1;
    MPI_Allreduce(MPI_IN_PLACE, &fail, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, &error, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (rank == 0)
      std::printf("verify %-30s %s (largest error %.3g)\n", name, fail ? "FAILED" : "ok", error);
    ok = ok && fail == 0;
  }
};

bool power_of_two(int p) { return (p & (p - 1)) == 0; }

// dense and fp16: the mean, exact where 1/P is (fp16: each hop's half sum is exact).
void check_dense_fp16(checker& c) {
  const std::size_t n = 1000;  // not a multiple of 8 (fp16's vector width) or 64
  for (const char* method : {"dense", "fp16"}) {
    const bool fp16 = std::string_view(method) == "fp16";
    std::vector<float> g(n), want(n, 0.0f);
    for (int r = 0; r < c.ranks; ++r) {
      for (std::size_t i = 0; i < n; ++i) {
        const float v = fp16 ? coarse_value(r, i) : sync_bench::grad_value(3, r, i);
        if (r == c.rank) g[i] = v;
        want[i] += v;
      }
    }
    for (auto& v : want) v *= 1.0f / static_cast<float>(c.ranks);
    auto x = e2e::make_bench_exchange(method, MPI_COMM_WORLD, n);
    x->exchange(g, {});
    const double err = max_error(g, want);
    const double tol = power_of_two(c.ranks) ? 0.0 : c.ranks * 0x1p-10;
    c.report(method, err <= tol && x->bytes_sent() == n * (fp16 ? 2 : 4), err);
  }
}

// topk (DGC) on its first step with momentum 0: every rank's own k largest |g| (ties to the
// lower index), summed over ranks and scaled by 1/P; then momentum factor masking.
void check_dgc(checker& c) {
  const std::size_t n = 5000;
  const std::size_t k = 371;
  std::vector<float> mine(n), want(n, 0.0f), g(n);
  const float scale = 1.0f / static_cast<float>(c.ranks);
  for (int r = 0; r < c.ranks; ++r) {
    for (std::size_t i = 0; i < n; ++i) g[i] = sync_bench::grad_value(5, r, i);
    if (r == c.rank) mine = g;
    std::vector<std::uint32_t> order(n);
    for (std::size_t i = 0; i < n; ++i) order[i] = static_cast<std::uint32_t>(i);
    std::stable_sort(order.begin(), order.end(), [&](std::uint32_t a, std::uint32_t b) {
      return std::fabs(g[a]) > std::fabs(g[b]);
    });
    for (std::size_t j = 0; j < k; ++j) want[order[j]] += g[order[j]] * scale;
  }
  e2e::dgc_exchange x(MPI_COMM_WORLD, n, k, 0.5f, 0.0f);
  const std::vector<float> params(n, 1.0f);  // weight decay 0: not read into the result
  g = mine;
  x.exchange(g, params);
  const double err = max_error(g, want);
  c.report("topk (first step)", err == 0.0 && x.bytes_sent() == k * 8, err);
  // Momentum factor masking: u is 0 where this rank sent, its gradient elsewhere.
  std::size_t zeros = 0;
  bool masked = true;
  for (std::size_t i = 0; i < n; ++i) {
    const float u = x.momentum()[i];
    zeros += u == 0.0f ? 1 : 0;
    masked = masked && (u == 0.0f || u == mine[i]);
  }
  c.report("topk (momentum masking)", masked && zeros == k, 0.0);
}

// PowerSGD on gradients whose mean is of rank 2 (every rank's matrix is a combination of the
// same two outer products): rank 2 recovers the mean up to rounding, on two steps (the second
// warm-started, with the first's error near 0); the vector is averaged exactly.
void check_powersgd(checker& c) {
  const std::size_t rows = 70;
  const std::size_t cols = 45;  // neither a multiple of 8
  pactrain::param_layout l;
  l.add("w", rows, cols).add("b", 13);
  const std::size_t n = l.total_size();
  e2e::powersgd x(MPI_COMM_WORLD, l, 2, 11);
  for (int step = 0; step < 2; ++step) {
    std::vector<float> g(n), want(n, 0.0f);
    for (int r = 0; r < c.ranks; ++r) {
      const float a = sync_bench::grad_value(9, r, static_cast<std::size_t>(2 * step));
      const float b = sync_bench::grad_value(9, r, static_cast<std::size_t>(2 * step + 1));
      for (std::size_t i = 0; i < rows; ++i) {
        for (std::size_t j = 0; j < cols; ++j) {
          const float u = sync_bench::grad_value(1, 0, i) * sync_bench::grad_value(2, 0, j);
          const float v = sync_bench::grad_value(3, 0, i) * sync_bench::grad_value(4, 0, j);
          const float m = a * u + b * v;
          if (r == c.rank) g[i * cols + j] = m;
          want[i * cols + j] += m;
        }
      }
      for (std::size_t i = rows * cols; i < n; ++i) {
        const float v = sync_bench::grad_value(6, r, i);
        if (r == c.rank) g[i] = v;
        want[i] += v;
      }
    }
    for (auto& v : want) v *= 1.0f / static_cast<float>(c.ranks);  // as the exchange scales
    x.exchange(g);
    double scale = 0;
    for (float v : want) scale = std::max(scale, static_cast<double>(std::fabs(v)));
    const double err = max_error(g, want);
    const bool vector_exact = max_error(std::span<const float>(g).subspan(rows * cols),
                                        std::span<const float>(want).subspan(rows * cols)) == 0.0;
    const bool bytes = x.bytes_sent() == (13 + (rows + cols) * 2) * sizeof(float);
    c.report(step == 0 ? "powersgd (rank-2 mean, step 1)" : "powersgd (rank-2 mean, step 2)",
             err <= 1e-5 * scale && vector_exact && bytes && x.compressed() == 1, err);
  }
}

}  // namespace

int verify_baselines(int rank, int ranks) {
  checker c{rank, ranks};
  check_dense_fp16(c);
  check_dgc(c);
  check_powersgd(c);
  return c.ok ? 0 : 1;
}
