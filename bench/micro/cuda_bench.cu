// cuda_bench: device gather and scatter per mask type and density (also with the fp16/bf16
// codecs' encode and decode fused in: gather_fp16, scatter_bf16, ...; thrust_gather and
// thrust_scatter: the same functors through Thrust, the reference), and a full sparse sync
// through NCCL on one GPU, each against a cudaMemcpy device-to-device measured in the same run.
//
// Build and run (from the repository root, on a machine with a GPU):
//   cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90
//   cmake --build build --target pactrain_cuda_bench
//   build/bench/pactrain_cuda_bench                       # 256 MiB of float
//   PACTRAIN_BENCH_MIB=16 build/bench/pactrain_cuda_bench --benchmark_min_time=0.05
// Exits with 77 (skipped) when no GPU is found.
//
// Timing is manual, with CUDA events around the device work of each iteration. Counters:
//   bytes_per_second  dense bytes (the tensor) per second;
//   x_memcpy          the memcpy time of the dense bytes divided by the benchmark's time;
//   x_memcpy_bw       bandwidth of the bytes the kernel moves (dense or payload read, payload
//                     or dense written, mask words and ranks read) over the memcpy's bandwidth
//                     (2 x bytes copied: read and write); 1.0 = as fast as memcpy moves bytes.
// sync/nccl1: sync::allreduce of 100 MB of gradients (PACTRAIN_BENCH_SYNC_MB) at the given
// density on one GPU; `outside_allreduce_us` is its time minus that of a bare ncclAllReduce
// of the same payload. sync_ternary_ef/nccl1: the same with ternary_codec and error feedback
// (its scale round is part of what lies outside the bare allreduce of the wire words).
#include <pactrain/cuda/compactor.cuh>
#include <pactrain/cuda/nccl.hpp>
#include <pactrain/cuda/sync.cuh>
#include <pactrain/cuda/thrust_compactor.hpp>
#include <pactrain/pactrain.hpp>

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace {

using namespace pactrain;

std::size_t env_size(const char* name, std::size_t fallback) {
  const char* env = std::getenv(name);
  const long v = env != nullptr ? std::atol(env) : 0;
  return v > 0 ? static_cast<std::size_t>(v) : fallback;
}

std::size_t entries() { return env_size("PACTRAIN_BENCH_MIB", 256) * (std::size_t{1} << 20) / 4; }

// Seconds of one memcpy of the dense tensor; 0 until measured.
double& memcpy_seconds() {
  static double s = 0;
  return s;
}

struct device_state {
  cudaStream_t stream = nullptr;
  cudaEvent_t start = nullptr;
  cudaEvent_t stop = nullptr;
  detail::device_buffer<float> dense;
  detail::device_buffer<float> out;
  detail::device_buffer<float> payload;
  device_state() {
    PACTRAIN_CUDA_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    PACTRAIN_CUDA_TRY(cudaEventCreate(&start));
    PACTRAIN_CUDA_TRY(cudaEventCreate(&stop));
    dense = detail::device_buffer<float>(entries(), stream);
    out = detail::device_buffer<float>(entries(), stream);
    payload = detail::device_buffer<float>(entries(), stream);
    std::vector<float> h(entries());
    for (std::size_t i = 0; i < h.size(); ++i) h[i] = static_cast<float>(i % 1000) * 0.5f;
    PACTRAIN_CUDA_TRY(
        cudaMemcpyAsync(dense.data(), h.data(), h.size() * 4, cudaMemcpyHostToDevice, stream));
    PACTRAIN_CUDA_TRY(cudaStreamSynchronize(stream));
  }
};

device_state& dev() {
  static device_state s;
  return s;
}

// Runs `body` (which queues device work on dev().stream) once per iteration, timed by events.
template <class F>
double timed(benchmark::State& state, F&& body) {
  auto& d = dev();
  body();  // warm-up
  double total = 0;
  for (auto _ : state) {
    PACTRAIN_CUDA_TRY(cudaEventRecord(d.start, d.stream));
    body();
    PACTRAIN_CUDA_TRY(cudaEventRecord(d.stop, d.stream));
    PACTRAIN_CUDA_TRY(cudaEventSynchronize(d.stop));
    float ms = 0;
    PACTRAIN_CUDA_TRY(cudaEventElapsedTime(&ms, d.start, d.stop));
    state.SetIterationTime(ms * 1e-3);
    total += ms * 1e-3;
  }
  return total / static_cast<double>(state.iterations());
}

void report(benchmark::State& state, double seconds, std::size_t moved_bytes) {
  const std::size_t n = entries();
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * n * sizeof(float)));
  if (memcpy_seconds() > 0 && seconds > 0) {
    state.counters["x_memcpy"] = memcpy_seconds() / seconds;
    const double memcpy_bw = 2.0 * static_cast<double>(n * sizeof(float)) / memcpy_seconds();
    state.counters["x_memcpy_bw"] = static_cast<double>(moved_bytes) / seconds / memcpy_bw;
  }
}

void bm_memcpy(benchmark::State& state) {
  auto& d = dev();
  const std::size_t bytes = entries() * sizeof(float);
  memcpy_seconds() = timed(state, [&] {
    PACTRAIN_CUDA_TRY(
        cudaMemcpyAsync(d.out.data(), d.dense.data(), bytes, cudaMemcpyDeviceToDevice, d.stream));
  });
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * bytes));
}

template <class Mask>
Mask make_mask(std::size_t n, double density) {
  // Deterministic, spread out: entry i kept when a hash of i falls under the density.
  const auto keep = [&](std::size_t i) {
    std::uint64_t z = i * 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 31)) * 0xbf58476d1ce4e5b9ULL;
    return static_cast<double>(z >> 11) * 0x1.0p-53 < density;
  };
  if constexpr (Mask::kind == mask_kind::block) {
    return Mask(n, bitmap_mask::from_predicate(Mask::block_count(n), keep));
  } else {
    return mask_cast<Mask>(bitmap_mask::from_predicate(n, keep));
  }
}

template <class Plan>
std::size_t mask_bytes(const Plan& p) {
  return p.device_words().size_bytes() + p.device_ranks().size_bytes() +
         p.device_indices().size_bytes();
}

// W: the payload type; half or bfloat16 for the fp16/bf16 codecs' fused encode and decode.
// The buffers are checked once, outside the timed loop, as the engine does.
template <class Mask, bool Gather, class W = float, class Compactor = cuda_compactor>
void bm_compact(benchmark::State& state) {
  auto& d = dev();
  const double density = static_cast<double>(state.range(0)) / 100.0;
  const std::size_t n = entries();
  const Compactor c;
  // Google Benchmark calls this function several times per benchmark: build each plan once.
  // Never destroyed: static destructors run after the CUDA runtime has shut down.
  static auto& plans = *new std::map<long, typename Compactor::plan_type>;
  auto it = plans.find(state.range(0));
  if (it == plans.end()) {
    it = plans.emplace(state.range(0), c.make_plan(make_mask<Mask>(n, density), d.stream)).first;
  }
  const auto& plan = it->second;
  const std::span<float> dense(d.dense.data(), n);
  const std::span<float> out(d.out.data(), n);
  const std::span<W> payload(reinterpret_cast<W*>(d.payload.data()), plan.count());
  c.gather_async(plan, std::span<const float>(dense), payload, d.stream);  // checks the buffers
  c.scatter_async(plan, std::span<const W>(payload), out, 0.5f, d.stream);
  constexpr detail::device_buffers_checked checked{};
  std::size_t moved = 0;
  double seconds = 0;
  if constexpr (Gather) {
    seconds = timed(state, [&] {
      c.gather_async(plan, std::span<const float>(dense), payload, d.stream, checked);
    });
    moved = n * sizeof(float) + plan.count() * sizeof(W);
  } else {
    seconds = timed(state, [&] {
      c.scatter_async(plan, std::span<const W>(payload), out, 0.5f, d.stream, checked);
    });
    moved = plan.count() * sizeof(W) + n * sizeof(float);
  }
  // Index plans read only kept entries of the dense side (gather) and need a memset (scatter).
  if (plan.format() == plan_format::indices && Gather) {
    moved = plan.count() * (sizeof(float) + sizeof(W));
  }
  report(state, seconds, moved + mask_bytes(plan));
  state.counters["density"] = density;
}

// One NCCL communicator of one rank on device 0, destroyed at exit.
struct nccl_world {
  ncclComm_t comm = nullptr;
  nccl_world() {
    int dev0 = 0;
    PACTRAIN_NCCL_TRY(nullptr, ncclCommInitAll(&comm, 1, &dev0));
  }
  ~nccl_world() { (void)ncclCommDestroy(comm); }
};
ncclComm_t nccl() {
  static nccl_world w;
  return w.comm;
}

template <class Codec = identity_codec<float>>
void bm_sync(benchmark::State& state) {
  auto& d = dev();
  const double density = static_cast<double>(state.range(0)) / 100.0;
  // The gradients are copied from the dense tensor: at most its size.
  const std::size_t n =
      std::min(entries(), env_size("PACTRAIN_BENCH_SYNC_MB", 100) * 1000 * 1000 / sizeof(float));
  param_layout l;  // default buckets of 4 Mi entries
  for (std::size_t at = 0, k = 0; at < n; at += std::size_t{1} << 20, ++k) {
    l.add("t" + std::to_string(k), std::min(std::size_t{1} << 20, n - at));
  }
  pactrain::sync<nccl_communicator, Codec> s{nccl_communicator{nccl(), d.stream}, l, Codec{},
                                             sync_options{}, d.stream};
  std::vector<bitmap_mask> masks;
  for (const auto& t : l.tensors()) masks.push_back(make_mask<bitmap_mask>(t.size, density));
  s.set_masks(masks);
  detail::device_buffer<float> g(n, d.stream);
  PACTRAIN_CUDA_TRY(
      cudaMemcpyAsync(g.data(), d.dense.data(), n * 4, cudaMemcpyDeviceToDevice, d.stream));
  std::size_t kept = 0;
  for (const auto& m : masks) kept += m.count();
  // The bare collective: one ncclAllReduce per bucket of the same wire sizes, grouped.
  using wire_t = typename Codec::wire_type;
  std::size_t wire = 0;
  for (std::size_t b = 0; b < l.buckets().size(); ++b) wire = std::max(wire, s.wire_size(b));
  detail::device_buffer<wire_t> w(wire, d.stream);
  nccl_communicator raw{nccl(), d.stream};
  const auto bare = [&] {
    raw.group_start();
    for (std::size_t b = 0; b < l.buckets().size(); ++b) {
      if (s.wire_size(b) == 0) continue;
      (void)raw.allreduce_async(std::span<wire_t>(w.data(), s.wire_size(b)), reduce_op::sum,
                                d.stream);
    }
    raw.group_end();
  };
  double bare_s = 0;
  {
    bare();
    PACTRAIN_CUDA_TRY(cudaEventRecord(d.start, d.stream));
    for (int k = 0; k < 20; ++k) bare();
    PACTRAIN_CUDA_TRY(cudaEventRecord(d.stop, d.stream));
    PACTRAIN_CUDA_TRY(cudaEventSynchronize(d.stop));
    float ms = 0;
    PACTRAIN_CUDA_TRY(cudaEventElapsedTime(&ms, d.start, d.stop));
    bare_s = ms * 1e-3 / 20;
  }
  const double seconds =
      timed(state, [&] { s.allreduce_async(std::span<float>(g.data(), n), d.stream); });
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * n * sizeof(float)));
  state.counters["density"] = density;
  state.counters["payload_MB"] = static_cast<double>(kept * sizeof(float)) / 1e6;
  state.counters["bare_allreduce_us"] = bare_s * 1e6;
  state.counters["outside_allreduce_us"] = (seconds - bare_s) * 1e6;
}

void args(benchmark::internal::Benchmark* b) {
  b->Arg(1)->Arg(10)->Arg(50)->UseManualTime()->Unit(benchmark::kMicrosecond);
}

}  // namespace

BENCHMARK(bm_memcpy)->Name("memcpy_d2d")->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(bm_compact<bitmap_mask, true>)->Name("gather/bitmap")->Apply(args);
BENCHMARK(bm_compact<bitmap_mask, false>)->Name("scatter/bitmap")->Apply(args);
BENCHMARK(bm_compact<index_mask, true>)->Name("gather/index")->Apply(args);
BENCHMARK(bm_compact<index_mask, false>)->Name("scatter/index")->Apply(args);
BENCHMARK(bm_compact<block_mask<64>, true>)->Name("gather/block64")->Apply(args);
BENCHMARK(bm_compact<block_mask<64>, false>)->Name("scatter/block64")->Apply(args);
BENCHMARK(bm_compact<bitmap_mask, true, pactrain::half>)->Name("gather_fp16/bitmap")->Apply(args);
BENCHMARK(bm_compact<bitmap_mask, false, pactrain::half>)->Name("scatter_fp16/bitmap")->Apply(args);
BENCHMARK(bm_compact<bitmap_mask, true, pactrain::bfloat16>)
    ->Name("gather_bf16/bitmap")
    ->Apply(args);
BENCHMARK(bm_compact<bitmap_mask, false, pactrain::bfloat16>)
    ->Name("scatter_bf16/bitmap")
    ->Apply(args);
BENCHMARK(bm_compact<bitmap_mask, true, float, thrust_compactor>)
    ->Name("thrust_gather/bitmap")
    ->Apply(args);
BENCHMARK(bm_compact<bitmap_mask, false, float, thrust_compactor>)
    ->Name("thrust_scatter/bitmap")
    ->Apply(args);
BENCHMARK(bm_sync<>)->Name("sync/nccl1")->Arg(10)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(bm_sync<error_feedback<ternary_codec>>)
    ->Name("sync_ternary_ef/nccl1")
    ->Arg(10)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

int main(int argc, char** argv) {
  if (detail::cuda_device_count() == 0) {
    std::printf("no CUDA device usable: %s: benchmark skipped\n",
                detail::cuda_device_status().c_str());
    return 77;
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
