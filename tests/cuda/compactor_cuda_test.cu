// cuda_compactor against host_compactor, bit for bit (compactor_checks.hpp: every mask type,
// size, density, value type, scale and offset of the host test; 16-bit rounding; bad sizes),
// also with a grid of 3 blocks so that the kernels' striding loops run; non-default and
// per-bucket streams; host memory refused. Skips (77) without a GPU. The same checks run
// thrust_compactor on the CPU (thrust_cpu_test.cpp); pactrain_cuda_bench times it on the GPU
// beside these kernels.
#include <doctest/doctest.h>

#include <pactrain/compactor.hpp>
#include <pactrain/cuda/compactor.cuh>

#include "common/cuda_helpers.cuh"
#include "common/test_data.hpp"
#include "cuda/compactor_checks.hpp"

#include <string>
#include <vector>

using namespace pactrain;
using test::device_array;
using test::same_bits;

TEST_CASE("cuda_compactor equals host_compactor bit for bit") {
  test::compactor_checks<cuda_compactor>{}.all();
}

TEST_CASE("cuda_compactor with a grid of 3 blocks: the striding loops") {
  test::compactor_checks<cuda_compactor>{cuda_compactor{detail::cuda_exec{.max_blocks = 3}}}.all();
}

TEST_CASE("plans move; a non-default stream and per-bucket streams") {
  const cuda_compactor dc;
  constexpr int buckets = 4;
  cudaStream_t streams[buckets];
  for (auto& s : streams) PACTRAIN_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  {
    std::vector<cuda_compactor::plan_type> plans;
    std::vector<bitmap_mask> masks;
    std::vector<device_array<float>> dense;
    std::vector<device_array<float>> payload;
    for (int b = 0; b < buckets; ++b) {
      masks.push_back(test::random_mask(100000 + 17 * b, 0.1 * (b + 1), b));
      auto p = dc.make_plan(masks.back(), streams[b]);
      plans.push_back(std::move(p));  // a moved plan keeps its device memory
      CHECK(p.size() == 0);
      dense.emplace_back(test::values<float>(masks.back().size(), b));
      payload.emplace_back(masks.back().count());
    }
    // All buckets in flight at once, each on its own stream.
    for (int b = 0; b < buckets; ++b) {
      dc.gather_async(plans[b], dense[b].cspan(), payload[b].span(), streams[b]);
      dc.scatter_async(plans[b], payload[b].cspan(), dense[b].span(), 0.5f, streams[b]);
    }
    for (auto& s : streams) PACTRAIN_CUDA_TRY(cudaStreamSynchronize(s));
    for (int b = 0; b < buckets; ++b) {
      auto want = test::values<float>(masks[b].size(), b);
      for (std::size_t i = 0; i < want.size(); ++i)
        want[i] = masks[b].test(i) ? want[i] * 0.5f : 0.0f;
      CHECK(same_bits(dense[b].host(), want));
    }
  }  // plans freed on their streams, which are still alive
  for (auto& s : streams) PACTRAIN_CUDA_TRY(cudaStreamDestroy(s));
}

TEST_CASE("host memory where device memory is required is refused before any launch") {
  const cuda_compactor dc;
  const auto m = test::random_mask(100, 0.5, 3);
  const auto plan = dc.make_plan(m);
  const auto dense0 = test::values<float>(100, 1);
  const std::vector<float> payload0(plan.count(), 5.0f);
  device_array<float> dense(dense0);
  device_array<float> payload(payload0);
  std::vector<float> host_dense = dense0;
  std::vector<float> host_payload = payload0;
  CHECK_THROWS_WITH_AS(
      dc.gather(plan, std::span<const float>(host_dense), payload.span()),
      doctest::Contains("cuda_compactor::gather: dense buffer is not device memory"), error);
  CHECK_THROWS_WITH_AS(dc.scatter(plan, std::span<const float>(host_payload), dense.span(), 1.0f),
                       doctest::Contains("payload buffer is not device memory"), error);
  CHECK(host_dense == dense0);
  CHECK(dense.host() == dense0);
  CHECK(payload.host() == payload0);
}

TEST_CASE("a CUDA failure becomes pactrain::cuda_error with the call, file and line") {
  try {
    PACTRAIN_CUDA_TRY(cudaSetDevice(-1));
    FAIL("no exception");
  } catch (const cuda_error& e) {
    CHECK(e.call() == "cudaSetDevice(-1)");
    CHECK(e.file().find("compactor_cuda_test.cu") != std::string::npos);
    CHECK(e.line() > 0);
    CHECK(std::string(e.what()).find("cudaErrorInvalidDevice") != std::string::npos);
  }
}
