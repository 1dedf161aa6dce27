// compact_bench: host gather and scatter per mask type and density, against memcpy.
//
// Build and run (from the repository root):
//   cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
//   cmake --build build --target pactrain_compact_bench
//   build/bench/pactrain_compact_bench   # 64 MiB of float
//   PACTRAIN_BENCH_MIB=4 build/bench/pactrain_compact_bench --benchmark_min_time=0.01
//
// Every benchmark moves the same dense tensor (PACTRAIN_BENCH_MIB MiB of float, default 64).
// bytes_per_second counts the dense bytes, and `x_memcpy` is the memcpy time of those bytes
// (the first benchmark, measured in the same run) divided by the benchmark's own time: 1.0
// means as fast as copying the dense tensor, above 1 faster. The `huge-pages` rows run the
// same on buffers from pactrain::huge_page_allocator (transparent huge pages), against a
// memcpy on those buffers.
#include <pactrain/detail/random.hpp>
#include <pactrain/pactrain.hpp>

#include <benchmark/benchmark.h>

#include "memcpy_reference.hpp"

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace {

std::size_t entries() {
  const char* env = std::getenv("PACTRAIN_BENCH_MIB");
  const long mib = env != nullptr ? std::atol(env) : 64;
  return static_cast<std::size_t>(mib > 0 ? mib : 64) * (std::size_t{1} << 20) / sizeof(float);
}

template <class Alloc>
struct buffer_set {
  std::vector<float, Alloc> dense;
  std::vector<float, Alloc> out;
  std::vector<float, Alloc> payload;
  buffer_set() : dense(entries()), out(entries()), payload(entries()) {
    for (std::size_t i = 0; i < dense.size(); ++i) dense[i] = static_cast<float>(i % 1000) * 0.5f;
  }
};

// The same tensor on 4 KiB pages (std::allocator under Linux's default THP "madvise") and on
// huge pages; each made at first use.
struct buffers {
  std::span<float> dense, out, payload;
};

buffers bufs(bool huge = false) {
  if (huge) {
    static buffer_set<pactrain::huge_page_allocator<float>> h;
    return {h.dense, h.out, h.payload};
  }
  static buffer_set<std::allocator<float>> b;
  return {b.dense, b.out, b.payload};
}

std::uint64_t mix(std::uint64_t z) { return pactrain::detail::splitmix64(z); }

// Uniformly random kept entries (unstructured pruning) at the given density.
pactrain::bitmap_mask random_mask(std::size_t n, double density, std::uint64_t seed) {
  const auto keep = static_cast<std::uint64_t>(density * 18446744073709551615.0);
  return pactrain::bitmap_mask::from_predicate(n,
                                               [&](std::size_t i) { return mix(seed ^ i) < keep; });
}

// Runs `body` timed, reporting the dense bandwidth and the ratio to memcpy.
template <class F>
void timed(benchmark::State& state, F&& body) {
  pactrain_bench::timed(state, body);
  state.SetBytesProcessed(
      static_cast<std::int64_t>(state.iterations() * bufs().dense.size() * sizeof(float)));
}

void bm_memcpy(benchmark::State& state, bool huge) {
  const auto b = bufs(huge);
  pactrain_bench::time_memcpy(state, b.out.data(), b.dense.data(), b.dense.size() * sizeof(float));
  state.SetBytesProcessed(
      static_cast<std::int64_t>(state.iterations() * b.dense.size() * sizeof(float)));
}

template <class Mask>
void run(benchmark::State& state, const Mask& mask, pactrain::host_compactor c, bool gather,
         bool huge) {
  const auto b = bufs(huge);
  const auto plan = c.make_plan(mask);
  const std::span<const float> dense(b.dense);
  const std::span<float> payload = b.payload.first(plan.count());
  c.gather(plan, dense, payload);
  state.SetLabel(std::string(pactrain::to_string(plan.format())) + "/" +
                 pactrain::to_string(c.isa()));
  state.counters["density"] = static_cast<double>(plan.count()) / static_cast<double>(plan.size());
  if (gather) {
    timed(state, [&] { c.gather(plan, dense, payload); });
  } else {
    timed(state, [&] { c.scatter(plan, std::span<const float>(payload), b.out, 0.25f); });
  }
}

enum class kind { bitmap, index, block };

void bm_mask(benchmark::State& state, kind k, double density, bool gather,
             pactrain::host_compactor::options opt, bool huge) {
  const std::size_t n = bufs().dense.size();
  if (!pactrain::isa_supported(opt.isa)) {
    state.SkipWithError("instruction set not supported on this CPU");
    return;
  }
  const pactrain::host_compactor c(opt);
  switch (k) {
    case kind::bitmap: run(state, random_mask(n, density, 1), c, gather, huge); break;
    case kind::index:
      run(state, pactrain::mask_cast<pactrain::index_mask>(random_mask(n, density, 1)), c, gather,
          huge);
      break;
    case kind::block: {
      using block_t = pactrain::block_mask<32>;
      run(state, block_t(n, random_mask(block_t::block_count(n), density, 2)), c, gather, huge);
      break;
    }
  }
}

void register_all() {
  benchmark::RegisterBenchmark("memcpy", bm_memcpy, false)->Unit(benchmark::kMillisecond);
  const std::pair<kind, const char*> kinds[] = {
      {kind::bitmap, "bitmap"}, {kind::index, "index"}, {kind::block, "block32"}};
  for (const char* op : {"gather", "scatter"}) {
    const bool gather = std::string(op) == "gather";
    for (double d : {0.01, 0.10, 0.50}) {
      const std::string dens = std::to_string(static_cast<int>(d * 100 + 0.5)) + "%";
      for (const auto& [k, name] : kinds) {
        benchmark::RegisterBenchmark((std::string(op) + "/" + name + "/" + dens).c_str(), bm_mask,
                                     k, d, gather, pactrain::host_compactor::options{}, false)
            ->Unit(benchmark::kMillisecond);
      }
      // Block masks through each plan format: where runs stop paying.
      for (auto f : {pactrain::plan_format::bitmap, pactrain::plan_format::runs}) {
        benchmark::RegisterBenchmark(
            (std::string(op) + "/block32-as/" + dens + "/" + pactrain::to_string(f)).c_str(),
            bm_mask, kind::block, d, gather, pactrain::host_compactor::options{.format = f}, false)
            ->Unit(benchmark::kMillisecond);
      }
      // The bitmap kernels themselves, per instruction set.
      for (auto isa :
           {pactrain::host_isa::portable, pactrain::host_isa::avx2, pactrain::host_isa::avx512}) {
        benchmark::RegisterBenchmark(
            (std::string(op) + "/bitmap-kernel/" + dens + "/" + pactrain::to_string(isa)).c_str(),
            bm_mask, kind::bitmap, d, gather,
            pactrain::host_compactor::options{.isa = isa, .format = pactrain::plan_format::bitmap},
            false)
            ->Unit(benchmark::kMillisecond);
      }
    }
  }
  // The gather kernels at low densities, where the vector kernels start to beat the portable
  // loop (which skips zero words and pays per kept entry).
  for (double d : {0.02, 0.03, 0.05, 0.07, 0.125}) {
    const std::string dens = std::to_string(d * 100).substr(0, 4) + "%";
    for (auto isa :
         {pactrain::host_isa::portable, pactrain::host_isa::avx2, pactrain::host_isa::avx512}) {
      benchmark::RegisterBenchmark(
          ("gather/bitmap-sweep/" + dens + "/" + pactrain::to_string(isa)).c_str(), bm_mask,
          kind::bitmap, d, true,
          pactrain::host_compactor::options{.isa = isa, .format = pactrain::plan_format::bitmap},
          false)
          ->Unit(benchmark::kMillisecond);
    }
  }
  // The bitmap plan's kernels on huge pages, against a memcpy there.
  benchmark::RegisterBenchmark("memcpy/huge-pages", bm_memcpy, true)->Unit(benchmark::kMillisecond);
  for (const char* op : {"gather", "scatter"}) {
    for (double d : {0.01, 0.10, 0.50}) {
      const std::string dens = std::to_string(static_cast<int>(d * 100 + 0.5)) + "%";
      benchmark::RegisterBenchmark((std::string(op) + "/bitmap/" + dens + "/huge-pages").c_str(),
                                   bm_mask, kind::bitmap, d, std::string(op) == "gather",
                                   pactrain::host_compactor::options{}, true)
          ->Unit(benchmark::kMillisecond);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  register_all();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
