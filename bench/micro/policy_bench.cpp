// policy_bench: mask computation per pruning policy, mask digest and mask serialization, per
// 1M weights, against memcpy.
//
// Build and run (from the repository root):
//   cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
//   cmake --build build --target pactrain_policy_bench
//   build/bench/pactrain_policy_bench                      # 1Mi weights (a 1024 x 1024 matrix)
//   PACTRAIN_BENCH_WEIGHTS=65536 build/bench/pactrain_policy_bench --benchmark_min_time=0.01
//
// Every benchmark works on the same float weight matrix of PACTRAIN_BENCH_WEIGHTS entries
// (default 1Mi, 1024 columns). `x_memcpy` is the time of a memcpy of those weights (4 MiB by
// default, the first benchmark, measured in the same run) divided by the benchmark's own time:
// 1.0 means as fast as copying the weights once. Compaction per mask type is in
// compact_bench.cpp.
#include <pactrain/pactrain.hpp>

#include <benchmark/benchmark.h>

#include "memcpy_reference.hpp"

#include <cstdint>
#include <cstdlib>
#include <span>
#include <string>
#include <vector>

namespace {

constexpr std::size_t cols = 1024;

std::size_t weights_count() {
  const char* env = std::getenv("PACTRAIN_BENCH_WEIGHTS");
  const long long n = env != nullptr ? std::atoll(env) : 0;
  const auto v = n > 0 ? static_cast<std::size_t>(n) : std::size_t{1} << 20;
  return (v + cols - 1) / cols * cols;  // whole rows
}

struct data {
  pactrain::param_layout layout;
  std::vector<float> w;
  std::vector<float> out;
  std::vector<bool> prunable{true};
  data() : w(weights_count()), out(weights_count()) {
    layout.add("w", w.size() / cols, cols);
    std::uint64_t x = 0x853c49e6748fea9bULL;
    for (auto& v : w) {  // uniform in [-1, 1), distinct magnitudes mostly
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      v = static_cast<float>(static_cast<double>(x >> 11) * 0x1p-52 - 1.0);
    }
  }
};

data& d() {
  static data v;
  return v;
}

// Runs `body` timed, reporting weights per second and the ratio to memcpy.
template <class F>
void timed(benchmark::State& state, F&& body) {
  pactrain_bench::timed(state, body);
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * d().w.size()));
}

void bm_memcpy(benchmark::State& state) {
  auto& v = d();
  pactrain_bench::time_memcpy(state, v.out.data(), v.w.data(), v.w.size() * sizeof(float));
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * v.w.size()));
}

template <class Policy>
void bm_policy(benchmark::State& state, Policy policy, double sparsity) {
  auto& v = d();
  const std::span<const float> w(v.w);
  auto masks = policy.compute(v.layout, w, sparsity, v.prunable);
  state.counters["density"] =
      static_cast<double>(masks[0].count()) / static_cast<double>(masks[0].size());
  timed(state, [&] {
    masks = policy.compute(v.layout, w, sparsity, v.prunable);
    benchmark::DoNotOptimize(masks.data());
  });
}

pactrain::bitmap_mask bench_mask() {
  auto& v = d();
  return pactrain::magnitude_pruning{}.compute(v.layout, std::span<const float>(v.w), 0.9,
                                               v.prunable)[0];
}

template <class Mask>
void bm_digest(benchmark::State& state) {
  const auto m = pactrain::mask_cast<Mask>(bench_mask());
  timed(state, [&] {
    auto h = m.digest();
    benchmark::DoNotOptimize(h);
  });
}

template <class Mask>
void bm_serialize(benchmark::State& state) {
  const auto m = pactrain::mask_cast<Mask>(bench_mask());
  std::size_t bytes = 0;
  timed(state, [&] {
    auto s = pactrain::serialize(m);
    bytes = s.size();
    benchmark::DoNotOptimize(s.data());
  });
  state.counters["bytes"] = static_cast<double>(bytes);
}

template <class Mask>
void bm_deserialize(benchmark::State& state) {
  const auto s = pactrain::serialize(pactrain::mask_cast<Mask>(bench_mask()));
  timed(state, [&] {
    auto m = pactrain::deserialize<Mask>(std::span<const std::byte>(s));
    benchmark::DoNotOptimize(m);
  });
  state.counters["bytes"] = static_cast<double>(s.size());
}

void register_all() {
  using namespace std::string_literals;
  benchmark::RegisterBenchmark("memcpy", bm_memcpy)->Unit(benchmark::kMillisecond);
  for (double s : {0.5, 0.9, 0.99}) {
    const std::string sp = std::to_string(static_cast<int>(s * 100 + 0.5)) + "%";
    benchmark::RegisterBenchmark(("policy/magnitude/"s + sp).c_str(),
                                 bm_policy<pactrain::magnitude_pruning>,
                                 pactrain::magnitude_pruning{}, s)
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("policy/block_magnitude16/"s + sp).c_str(),
                                 bm_policy<pactrain::block_magnitude_pruning<16>>,
                                 pactrain::block_magnitude_pruning<16>{}, s)
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("policy/random/"s + sp).c_str(),
                                 bm_policy<pactrain::random_pruning>,
                                 pactrain::random_pruning{.seed = 7}, s)
        ->Unit(benchmark::kMillisecond);
  }
  benchmark::RegisterBenchmark("policy/nm2:4", bm_policy<pactrain::nm_pruning>,
                               pactrain::nm_pruning(2, 4), 0.5)
      ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("digest/bitmap/10%", bm_digest<pactrain::bitmap_mask>)
      ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("digest/index/10%", bm_digest<pactrain::index_mask>)
      ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("serialize/bitmap/10%", bm_serialize<pactrain::bitmap_mask>)
      ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("serialize/index/10%", bm_serialize<pactrain::index_mask>)
      ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("deserialize/bitmap/10%", bm_deserialize<pactrain::bitmap_mask>)
      ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("deserialize/index/10%", bm_deserialize<pactrain::index_mask>)
      ->Unit(benchmark::kMillisecond);
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
