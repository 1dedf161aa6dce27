// The memcpy reference shared by the Google Benchmark microbenchmarks: the first benchmark of
// a run times a memcpy of the working set, and every later one reports `x_memcpy`, that time
// divided by its own (1.0: as fast as copying the data once; above 1: faster).
#pragma once

#include <benchmark/benchmark.h>

#include <chrono>
#include <cstddef>
#include <cstring>

namespace pactrain_bench {

using clock_type = std::chrono::steady_clock;

/// Seconds per iteration of the memcpy reference; 0 until it has run.
inline double& memcpy_seconds() {
  static double s = 0;
  return s;
}

/// Runs `body` for the benchmark's iterations, timing the whole loop; sets x_memcpy and
/// returns the seconds per iteration.
template <class F>
double timed(benchmark::State& state, F&& body) {
  const auto t0 = clock_type::now();
  for (auto _ : state) {
    body();
    benchmark::ClobberMemory();
  }
  const double per_iter = std::chrono::duration<double>(clock_type::now() - t0).count() /
                          static_cast<double>(state.iterations());
  if (memcpy_seconds() > 0) state.counters["x_memcpy"] = memcpy_seconds() / per_iter;
  return per_iter;
}

/// The reference itself: copies `bytes` from `src` to `dst` and records the time.
inline void time_memcpy(benchmark::State& state, void* dst, const void* src, std::size_t bytes) {
  memcpy_seconds() = 0;
  const double per_iter = timed(state, [&] { std::memcpy(dst, src, bytes); });
  memcpy_seconds() = per_iter;
  state.counters["x_memcpy"] = 1.0;
}

}  // namespace pactrain_bench
