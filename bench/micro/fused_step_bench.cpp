// fused_step_bench: the local work of one training step's sync and SGD update, unfused
// (finish_step writes the dense gradient back, then sgd::step reads it again) against fused
// (finish_step(sgd::fused(...)) updates the kept weights from the payload), on one rank
// (loopback communicator: no network, the local work only), against memcpy of the gradient.
//
// Build and run (from the repository root):
//   cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
//   cmake --build build --target pactrain_fused_step_bench
//   build/bench/pactrain_fused_step_bench                  # 100 MB of gradients (25M floats)
//   PACTRAIN_BENCH_MIB=8 build/bench/pactrain_fused_step_bench --benchmark_min_time=0.01
//
// Arguments: density in percent (10, 1). SGD with momentum 0.9 and weight decay 1e-4; tensors
// of 4Mi entries, one bucket each, random masks (pactrain::random_pruning).
#include <pactrain/pactrain.hpp>

#include <benchmark/benchmark.h>

#include "memcpy_reference.hpp"

#include <cstdint>
#include <cstdlib>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace {

using sync_t = pactrain::sync<pactrain::loopback_communicator>;

std::size_t bench_floats() {
  const char* e = std::getenv("PACTRAIN_BENCH_MIB");
  const std::size_t mib = e != nullptr ? std::strtoull(e, nullptr, 10) : 0;
  return mib > 0 ? mib * (std::size_t{1} << 20) / sizeof(float) : std::size_t{25'000'000};
}

// A model of bench_floats() entries in tensors of 4 Mi, pruned to `density`, with parameters
// and momentum zero at pruned entries.
struct model {
  explicit model(double density) : layout(std::size_t{1} << 22) {
    const std::size_t n = bench_floats();
    const std::size_t tensor = std::size_t{1} << 22;
    for (std::size_t at = 0, k = 0; at < n; at += tensor, ++k) {
      layout.add("w" + std::to_string(k), std::min(tensor, n - at));
    }
    sync.emplace(pactrain::loopback_communicator{}, layout);
    std::vector<float> w(layout.total_size(), 0.0f);
    sync->set_masks(pactrain::random_pruning{.seed = 1}.compute(
        layout, std::span<const float>(w), 1.0 - density,
        std::vector<bool>(layout.tensor_count(), true)));
    params.resize(layout.total_size());
    grads.resize(layout.total_size());
    momentum.assign(layout.total_size(), 0.0f);
    for (std::size_t i = 0; i < params.size(); ++i) {
      params[i] = static_cast<float>(i % 1000) * 1e-3f;
      grads[i] = static_cast<float>(i % 997) * 1e-4f;
    }
    pactrain::apply_masks(layout, sync->masks(), std::span<float>(params));
  }
  pactrain::param_layout layout;
  std::optional<sync_t> sync;
  pactrain::huge_vector<float> params, grads, momentum;
  pactrain::sgd opt{{.lr = 0.01, .momentum = 0.9, .weight_decay = 1e-4}};
};

void set_bytes(benchmark::State& state, std::size_t floats) {
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * floats * sizeof(float)));
}

void BM_memcpy_gradient(benchmark::State& state) {
  std::vector<float> src(bench_floats(), 1.0f), dst(bench_floats());
  pactrain_bench::time_memcpy(state, dst.data(), src.data(), src.size() * sizeof(float));
  set_bytes(state, src.size());
}

// finish_step writes every gradient back (+0 at pruned entries), sgd::step then reads it.
void BM_sync_then_sgd(benchmark::State& state) {
  model m(static_cast<double>(state.range(0)) / 100.0);
  pactrain_bench::timed(state, [&] {
    m.sync->allreduce(std::span<float>(m.grads));
    m.opt.step(m.params, m.grads, m.momentum);
  });
  set_bytes(state, m.grads.size());
}

// finish_step hands the payload to the update: only kept weights are touched.
void BM_sync_fused_sgd(benchmark::State& state) {
  model m(static_cast<double>(state.range(0)) / 100.0);
  pactrain_bench::timed(state, [&] {
    auto update = m.opt.fused(m.layout, m.sync->masks(), std::span<float>(m.params),
                              std::span<float>(m.momentum));
    m.sync->allreduce(std::span<float>(m.grads), update);
  });
  set_bytes(state, m.grads.size());
}

}  // namespace

BENCHMARK(BM_memcpy_gradient)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_sync_then_sgd)->Arg(10)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_sync_fused_sgd)->Arg(10)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();

BENCHMARK_MAIN();
