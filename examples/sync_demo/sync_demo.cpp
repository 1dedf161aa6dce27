// sync_demo: pruned gradient sync over MPI, checked against a dense allreduce.
//
// Build and run (from the repository root):
//   cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
//   cmake --build build --target pactrain_sync_demo
//   mpiexec -n 4 build/examples/pactrain_sync_demo [--density 0.1] [--steps 20]
// (as root add --allow-run-as-root --oversubscribe; scripts/demo.sh does all of it.)
//
// Every rank builds the layout of a 784-1024-1024-10 MLP, derives the same magnitude-style
// masks from a shared seed, and synchronises exactly summable gradients for a few steps.
// Each step is compared bit for bit with MPI_Allreduce of the masked dense gradients. At
// the end one rank deliberately changes a mask, and every rank reports the tracker's error.
#include <pactrain/detail/random.hpp>
#include <pactrain/mpi.hpp>
#include <pactrain/pactrain.hpp>

#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "../common/run_main.hpp"

namespace {

struct options {
  double density = 0.1;
  int steps = 20;
};

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--density" && i + 1 < argc) {
      o.density = std::strtod(argv[++i], nullptr);
    } else if (a == "--steps" && i + 1 < argc) {
      o.steps = std::atoi(argv[++i]);
    } else {
      throw pactrain::error("usage: pactrain_sync_demo [--density D] [--steps N]; got '" + a + "'");
    }
  }
  if (!(o.density >= 0.0 && o.density <= 1.0) || o.steps < 1) {
    throw pactrain::error("--density must be in [0, 1] and --steps positive");
  }
  return o;
}

std::uint64_t mix(std::uint64_t z) { return pactrain::detail::splitmix64(z); }

// Dyadic values: sums over ranks are exact, so sparse and dense must agree bit for bit.
float grad(std::uint64_t step, int rank, std::size_t i) {
  return static_cast<float>(static_cast<std::int64_t>(mix(mix(step * 131 + rank) ^ i) % 2001) -
                            1000) /
         8.0f;
}

double seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int run(int argc, char** argv) {
  const options opt = parse(argc, argv);
  const auto [rank, ranks] = examples::world();

  pactrain::param_layout layout;
  layout.add("fc1.weight", 1024, 784).add("fc1.bias", 1024);
  layout.add("fc2.weight", 1024, 1024).add("fc2.bias", 1024);
  layout.add("fc3.weight", 10, 1024).add("fc3.bias", 10);

  pactrain::sync sync{pactrain::mpi_communicator{MPI_COMM_WORLD}, layout};

  // Prune weights only; biases stay dense. The seed is shared, so the masks are equal on
  // every rank (the tracker checks that in set_masks).
  std::vector<pactrain::bitmap_mask> masks;
  for (const auto& t : layout.tensors()) {
    const bool weight = t.rows > 0;
    const auto keep = static_cast<std::uint64_t>(opt.density * 18446744073709551615.0);
    masks.push_back(pactrain::bitmap_mask::from_predicate(t.size, [&](std::size_t i) {
      return !weight || opt.density >= 1.0 || mix(t.offset + i) < keep;
    }));
  }
  sync.set_masks(masks);

  std::size_t kept = 0;
  for (const auto& m : masks) kept += m.count();
  if (rank == 0) {
    std::printf("pactrain %s sync demo: %d ranks, %zu tensors in %zu buckets, %zu parameters\n",
                pactrain::version_string(), ranks, layout.tensor_count(), layout.buckets().size(),
                layout.total_size());
    std::printf("masks: %zu of %zu entries kept (%.1f%%), compaction kernels: %s\n", kept,
                layout.total_size(), 100.0 * static_cast<double>(kept) / layout.total_size(),
                pactrain::to_string(sync.compactor().isa()));
    std::printf("%6s %14s %14s %10s %10s %10s %10s %8s\n", "step", "bytes sent", "dense bytes",
                "gather ms", "reduce ms", "scatter ms", "dense ms", "check");
  }

  std::vector<float> g(layout.total_size());
  std::vector<float> ref(layout.total_size());
  std::size_t mismatches = 0;
  double sparse_total = 0;
  double dense_total = 0;
  for (int step = 0; step < opt.steps; ++step) {
    for (std::size_t i = 0; i < g.size(); ++i) g[i] = grad(step, rank, i);
    // Reference: mask densely, MPI_Allreduce the whole gradient, average.
    for (std::size_t t = 0; t < layout.tensor_count(); ++t) {
      const auto& ti = layout.tensor(t);
      for (std::size_t j = 0; j < ti.size; ++j)
        ref[ti.offset + j] = masks[t].test(j) ? g[ti.offset + j] : 0.0f;
    }
    MPI_Barrier(MPI_COMM_WORLD);
    auto t0 = std::chrono::steady_clock::now();
    MPI_Allreduce(MPI_IN_PLACE, ref.data(), static_cast<int>(ref.size()), MPI_FLOAT, MPI_SUM,
                  MPI_COMM_WORLD);
    const double dense_s = seconds(t0);
    for (auto& v : ref) v /= static_cast<float>(ranks);

    MPI_Barrier(MPI_COMM_WORLD);
    t0 = std::chrono::steady_clock::now();
    sync.allreduce(std::span<float>(g));
    const double sparse_s = seconds(t0);
    if (step > 0) {  // the first step warms up buffers and connections
      sparse_total += sparse_s;
      dense_total += dense_s;
    }

    std::size_t bad = 0;
    for (std::size_t i = 0; i < g.size(); ++i)
      bad += std::memcmp(&g[i], &ref[i], sizeof(float)) != 0;
    unsigned long long bad_all = bad;
    MPI_Allreduce(MPI_IN_PLACE, &bad_all, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
    mismatches += bad_all;
    const auto& st = sync.stats();
    if (rank == 0 && (step < 3 || step == opt.steps - 1 || (step + 1) % 10 == 0)) {
      std::printf("%6d %14zu %14zu %10.3f %10.3f %10.3f %10.3f %8s\n", step + 1, st.bytes_sent,
                  st.dense_bytes, 1e3 * st.gather_seconds, 1e3 * st.allreduce_seconds,
                  1e3 * st.scatter_seconds, 1e3 * dense_s, bad_all == 0 ? "exact" : "MISMATCH");
    }
  }

  if (rank == 0) {
    const auto& st = sync.stats();
    std::printf("sent %.1f%% of the dense bytes per step (%zu of %zu)\n",
                100.0 * static_cast<double>(st.bytes_sent) / st.dense_bytes, st.bytes_sent,
                st.dense_bytes);
    if (opt.steps > 1) {
      std::printf(
          "mean time per step after warm-up: sparse sync %.3f ms, dense MPI_Allreduce %.3f ms "
          "(shared memory, not a network)\n",
          1e3 * sparse_total / (opt.steps - 1), 1e3 * dense_total / (opt.steps - 1));
    }
    std::printf("check: %zu mismatching entries against the dense reference over %d steps\n",
                mismatches, opt.steps);
  }

  // The agreement: the last rank changes one entry of fc2.weight and calls set_masks.
  if (ranks > 1) {
    auto changed = masks;
    if (rank == ranks - 1) {
      std::vector<std::uint64_t> w(changed[2].words().begin(), changed[2].words().end());
      w[w.size() / 2] ^= 1;
      changed[2] = pactrain::bitmap_mask(changed[2].size(), std::move(w));
    }
    std::string caught = "(nothing)";
    try {
      sync.set_masks(changed);
    } catch (const pactrain::error& e) {
      caught = e.what();
    }
    // Every rank reports, in rank order.
    for (int r = 0; r < ranks; ++r) {
      MPI_Barrier(MPI_COMM_WORLD);
      if (r == rank) std::printf("rank %d caught: %s\n", rank, caught.c_str());
      std::fflush(stdout);
    }
  }
  return mismatches == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  return examples::run_main(argc, argv, "pactrain_sync_demo", [&] { return run(argc, argv); });
}
