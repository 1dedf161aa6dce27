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

// DGC's small tensors, sent whole.
bool is_whole(const pactrain::tensor_info& t) { return t.rows == 0 || t.size < 1024; }

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

// DGC's selection from `v` at `density`: each tensor's top k_t by |v| (ties to the lower
// index), the small tensors (1-D or under 1024 entries) whole.
std::vector<bool> dgc_selection(const pactrain::param_layout& l, std::span<const float> v,
                                double density) {
  std::vector<bool> chosen(v.size(), false);
  for (const auto& t : l.tensors()) {
    const bool whole = is_whole(t);
    const std::size_t k = whole ? t.size : e2e::dgc_exchange::kept(density, t.size);
    std::vector<std::uint32_t> order(t.size);
    for (std::size_t i = 0; i < t.size; ++i) order[i] = static_cast<std::uint32_t>(t.offset + i);
    std::stable_sort(order.begin(), order.end(), [&](std::uint32_t a, std::uint32_t b) {
      return std::fabs(v[a]) > std::fabs(v[b]);
    });
    for (std::size_t j = 0; j < k; ++j) chosen[order[j]] = true;
  }
  return chosen;
}

// topk (DGC) with momentum 0.5 (exact on these multiples of 2^-20): per-tensor Top-k, the
// small tensors whole, against a reference replaying momentum correction, error feedback and
// momentum factor masking for every rank, on the first steps of the warm-up (densities 1/4
// and 1/16); then the warm-up's densities.
void check_dgc(checker& c) {
  pactrain::param_layout l;
  l.add("w1", 60, 90).add("b1", 1300).add("w2", 20, 30).add("w3", 41, 50).add("b3", 7);
  const std::size_t n = l.total_size();
  const float m = 0.5f;
  const float scale = 1.0f / static_cast<float>(c.ranks);
  e2e::dgc_exchange x(MPI_COMM_WORLD, l,
                      {.momentum = m, .weight_decay = 0.0f, .sparsity = 0.999, .warmup_steps = 4});
  const std::vector<float> params(n, 1.0f);  // weight decay 0: not read into the result
  // The reference's state of every rank.
  std::vector<std::vector<float>> u(static_cast<std::size_t>(c.ranks), std::vector<float>(n));
  auto v = u;
  for (int step = 0; step < 2; ++step) {
    const double d = x.density(static_cast<std::uint64_t>(step));
    std::vector<float> want(n, 0.0f), g(n);
    std::size_t pairs = 0;
    for (int r = 0; r < c.ranks; ++r) {
      auto& ur = u[static_cast<std::size_t>(r)];
      auto& vr = v[static_cast<std::size_t>(r)];
      for (std::size_t i = 0; i < n; ++i) {
        const float gi = sync_bench::grad_value(5 + static_cast<std::uint64_t>(step), r, i);
        if (r == c.rank) g[i] = gi;
        ur[i] = m * ur[i] + gi;
      }
      // Sparse tensors: v += u, top-k of v sent, v and u cleared there; small ones: u sent.
      std::vector<float> acc = ur;
      for (const auto& t : l.tensors()) {
        if (is_whole(t)) continue;
        for (std::size_t i = t.offset; i < t.offset + t.size; ++i) acc[i] = vr[i] + ur[i];
        pairs += e2e::dgc_exchange::kept(d, t.size);
      }
      const std::vector<bool> sent = dgc_selection(l, acc, d);
      for (const auto& t : l.tensors()) {
        for (std::size_t i = t.offset; i < t.offset + t.size; ++i) {
          if (sent[i]) want[i] += acc[i] * scale;
          if (is_whole(t)) continue;
          vr[i] = sent[i] ? 0.0f : acc[i];
          if (sent[i]) ur[i] = 0.0f;
        }
      }
    }
    x.exchange(g, params);
    const double err = max_error(g, want);
    const std::size_t whole = 1300 + 600 + 7;
    const bool bytes = x.whole_entries() == whole && x.pairs() * c.ranks == pairs &&
                       x.bytes_sent() == whole * 4 + x.pairs() * 8;
    c.report(step == 0 ? "topk (step 1, density 1/4)" : "topk (step 2, density 1/16)",
             err == 0.0 && bytes, err);
    // Momentum factor masking: u as the reference's (0 where this rank sent).
    const double u_err = max_error(x.momentum(), u[static_cast<std::size_t>(c.rank)]);
    c.report(step == 0 ? "topk (momentum, step 1)" : "topk (momentum, step 2)", u_err == 0.0,
             u_err);
  }
  // The warm-up: 4 steps of 1/4, 1/16, 1/64, 1/256 (sparsity 0.999), then 0.001; 3 stages at
  // 0.99 (1/4 to 1/64 over 6 steps), then 0.01.
  bool schedule = x.warmup_stages() == 4 && x.density(4) == 1.0 - 0.999;
  for (std::uint64_t s = 0; s < 4; ++s)
    schedule = schedule && x.density(s) == std::ldexp(1.0, -2 * static_cast<int>(s + 1));
  const e2e::dgc_exchange y(MPI_COMM_WORLD, l, {.sparsity = 0.99, .warmup_steps = 6});
  const double want99[] = {0.25, 0.25, 0.0625, 0.0625, 0.015625, 0.015625, 1.0 - 0.99};
  schedule = schedule && y.warmup_stages() == 3;
  for (std::uint64_t s = 0; s < 7; ++s) schedule = schedule && y.density(s) == want99[s];
  schedule = schedule && e2e::dgc_exchange::kept(0.001, 1000) == 1 &&
             e2e::dgc_exchange::kept(0.001, 5400) == 6 && e2e::dgc_exchange::kept(1e-9, 10) == 1;
  c.report("topk (warm-up schedule)", schedule, 0.0);
}

// DGC's local gradient clipping: each rank's share of the mean, g / P, to C / sqrt(P), so g
// to C sqrt(P). Rank r's gradient is 2^(r-1) times a vector of norm 1 and C = 1/2: on 4 ranks
// the limit is 1, so ranks 0 and 1 are left as they are and rank r > 1 is scaled by 2^(1-r)
// (exactly) to norm 1 before its momentum and selection. The reference scales as the
// exchange does, so that other rank counts compare bit for bit too.
void check_dgc_clip(checker& c) {
  pactrain::param_layout l;
  l.add("w", 40, 40);
  const std::size_t n = l.total_size();
  // 0.75^2 + 0.5^2 + 3 * 0.25^2 = 1.
  const std::pair<std::size_t, float> base[] = {
      {3, 0.75f}, {700, -0.5f}, {1001, 0.25f}, {1200, -0.25f}, {1599, 0.25f}};
  // Rank r's gradient, clipped as the exchange clips it (its norm is 2^(r-1) exactly).
  const double limit = 0.5 * std::sqrt(static_cast<double>(c.ranks));
  auto gradient = [&](int r, bool clipped) {
    const double norm = std::ldexp(1.0, r - 1);
    const float f = clipped && norm > limit ? static_cast<float>(limit / norm) : 1.0f;
    std::vector<float> g(n, 0.0f);
    for (const auto& [i, v] : base) g[i] = v * std::ldexp(1.0f, r - 1) * f;
    return g;
  };
  e2e::dgc_exchange x(MPI_COMM_WORLD, l, {.momentum = 0.5f, .sparsity = 0.999});
  x.set_clip(0.5);
  const std::vector<float> params(n, 0.0f);
  std::vector<float> g = gradient(c.rank, false);
  x.exchange(g, params);  // k = 2: entries 3 and 700 sent
  std::vector<float> want(n, 0.0f);
  const float scale = 1.0f / static_cast<float>(c.ranks);
  for (int r = 0; r < c.ranks; ++r) {
    const std::vector<float> clipped = gradient(r, true);
    want[3] += clipped[3] * scale;
    want[700] += clipped[700] * scale;
  }
  std::vector<float> u = gradient(c.rank, true);
  u[3] = u[700] = 0.0f;
  // On 4 ranks: ranks 2 and 3 end at norm 1 exactly.
  const bool exact =
      c.ranks != 4 || (gradient(2, true)[3] == 0.75f && gradient(3, true)[3] == 0.75f);
  const double err = std::max(max_error(g, want), max_error(x.momentum(), u));
  c.report("topk (local clipping)", err == 0.0 && exact && x.clips_locally(), err);
}

// PowerSGD's test gradient of step `step` (whose mean over ranks is of rank 2: every rank's
// matrix is a combination of the same two outer products, the vector dyadic noise): this
// rank's in `g`, the mean, scaled as the exchange scales, in `want`.
void powersgd_gradient(const checker& c, std::size_t rows, std::size_t cols, std::size_t n,
                       int step, std::vector<float>& g, std::vector<float>& want) {
  g.assign(n, 0.0f);
  want.assign(n, 0.0f);
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
}

// PowerSGD on gradients whose mean is of rank 2: rank 2 recovers the mean up to rounding, on
// two steps (the second warm-started, with the first's error near 0); the vector is averaged
// exactly. Then with a dense start of 2 steps (start_powerSGD_iter): those steps' results are
// the mean bit for bit (dyadic data, summed exactly in any order), and the two compressed
// steps after them recover the rank-2 mean as above (the error starts empty).
void check_powersgd(checker& c) {
  const std::size_t rows = 70;
  const std::size_t cols = 45;  // neither a multiple of 8
  pactrain::param_layout l;
  l.add("w", rows, cols).add("b", 13);
  const std::size_t n = l.total_size();
  for (const std::uint64_t dense : {0, 2}) {
    e2e::powersgd x(MPI_COMM_WORLD, l, 2, 11, dense);
    for (int step = 0; step < static_cast<int>(dense) + 2; ++step) {
      std::vector<float> g, want;
      if (static_cast<std::uint64_t>(step) < dense) {  // dyadic: the mean is exact
        g.assign(n, 0.0f);
        want.assign(n, 0.0f);
        for (int r = 0; r < c.ranks; ++r) {
          for (std::size_t i = 0; i < n; ++i) {
            const float v = sync_bench::grad_value(12 + static_cast<std::uint64_t>(step), r, i);
            if (r == c.rank) g[i] = v;
            want[i] += v;
          }
        }
        for (auto& v : want) v *= 1.0f / static_cast<float>(c.ranks);
      } else {
        powersgd_gradient(c, rows, cols, n, step, g, want);
      }
      x.exchange(g);
      const double err = max_error(g, want);
      const std::string name = "powersgd (" + std::string(dense ? "dense start, " : "") + "step " +
                               std::to_string(step + 1) + ")";
      if (static_cast<std::uint64_t>(step) < dense) {
        c.report(name.c_str(),
                 err == 0.0 && x.bytes_sent() == n * sizeof(float) && x.collectives() == 1, err);
        continue;
      }
      double scale = 0;
      for (float v : want) scale = std::max(scale, static_cast<double>(std::fabs(v)));
      const bool vector_exact = max_error(std::span<const float>(g).subspan(rows * cols),
                                          std::span<const float>(want).subspan(rows * cols)) == 0.0;
      const bool bytes =
          x.bytes_sent() == (13 + (rows + cols) * 2) * sizeof(float) && x.collectives() == 2;
      c.report(name.c_str(), err <= 1e-5 * scale && vector_exact && bytes && x.compressed() == 1,
               err);
    }
  }
}

}  // namespace

int verify_baselines(int rank, int ranks) {
  checker c{rank, ranks};
  check_dense_fp16(c);
  check_dgc(c);
  check_dgc_clip(c);
  check_powersgd(c);
  return c.ok ? 0 : 1;
}
