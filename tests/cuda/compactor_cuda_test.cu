// cuda_compactor against host_compactor, bit for bit: every mask type, size, density, value
// type and scale of the host test; unaligned buffers, non-default and per-bucket streams;
// bad input rejected before anything is launched. Skips (77) without a GPU.
#include <doctest/doctest.h>

#include <pactrain/compactor.hpp>
#include <pactrain/cuda/compactor.cuh>

#include "common/cuda_helpers.cuh"
#include "common/test_data.hpp"

#include <string>
#include <vector>

using namespace pactrain;
using test::device_array;
using test::same_bits;

namespace {

// Device gather and scatter of `mask` equal the host compactor's, for every scale; `offset`
// shifts the device dense buffer by that many entries (0: aligned, 1: scalar path).
template <class T, class Mask>
void check_mask(const Mask& mask, std::uint64_t seed, std::size_t offset = 0) {
  const std::size_t n = mask.size();
  const auto dense = test::values<T>(n, seed);
  const host_compactor hc;
  const auto hplan = hc.make_plan(mask);
  std::vector<T> want_payload(hplan.count());
  hc.gather(hplan, std::span<const T>(dense), std::span<T>(want_payload));

  const cuda_compactor dc;
  const auto plan = dc.make_plan(mask);
  REQUIRE(plan.size() == n);
  REQUIRE(plan.count() == mask.count());

  std::vector<T> padded(n + offset, T(55));
  std::copy(dense.begin(), dense.end(), padded.begin() + static_cast<std::ptrdiff_t>(offset));
  device_array<T> d_dense(padded);
  const std::span<T> d_view = d_dense.span().subspan(offset, n);
  device_array<T> d_payload(plan.count());
  d_payload.fill_bytes(0x7f);
  dc.gather(plan, std::span<const T>(d_view), d_payload.span());
  CHECK(test::bad_entries(d_payload.host(), want_payload) == 0);

  for (const T scale : {T(1), T(0.25), T(-3)}) {
    CAPTURE(scale);
    std::vector<T> want_dense(n, T(77));
    hc.scatter(hplan, std::span<const T>(want_payload), std::span<T>(want_dense), scale);
    d_dense.fill_bytes(0x7f);  // every entry must be written
    dc.scatter(plan, d_payload.cspan(), d_view, scale);
    const auto got = d_dense.host();
    CHECK(test::bad_entries(
              std::vector<T>(got.begin() + static_cast<std::ptrdiff_t>(offset), got.end()),
              want_dense) == 0);
    for (std::size_t i = 0; i < offset; ++i) CHECK(got[i] != T(0));  // nothing before the view
  }
}

template <class T, class Mask>
void check_all_offsets(const Mask& mask, std::uint64_t seed) {
  for (std::size_t offset : {0, 1, 3}) {
    CAPTURE(offset);
    check_mask<T>(mask, seed, offset);
  }
}

}  // namespace

TEST_CASE_TEMPLATE("bitmap and index masks, every size and density", T, float, double) {
  for (std::size_t n : test::sizes) {
    for (double d : test::densities) {
      CAPTURE(n);
      CAPTURE(d);
      const auto m = test::random_mask(n, d, n * 31 + 1);
      check_all_offsets<T>(m, 5);
      check_all_offsets<T>(mask_cast<index_mask>(m), 6);
    }
  }
}

TEST_CASE_TEMPLATE("block masks, sizes not a multiple of the block", T, float, double) {
  for (std::size_t n : test::sizes) {
    for (double d : test::densities) {
      CAPTURE(n);
      CAPTURE(d);
      check_all_offsets<T>(test::random_block_mask<4>(n, d, n + 3), 7);
      check_all_offsets<T>(test::random_block_mask<48>(n, d, n + 4), 8);
    }
  }
}

TEST_CASE("word patterns and large tensors") {
  const std::size_t n = 64 * 9 + 13;
  const auto m = bitmap_mask::from_predicate(n, [](std::size_t i) {
    const std::size_t j = i % 64;
    switch (i / 64) {
      case 0: return true;
      case 1: return false;
      case 2: return j < 8;
      case 3: return j % 2 == 1;
      case 4: return j >= 60;
      case 5: return j % 9 == 0;
      case 6: return (j / 4) % 2 == 0;
      case 7: return j == 63;
      case 8: return j != 5;
      default: return j % 3 != 0;
    }
  });
  check_all_offsets<float>(m, 9);
  // Many blocks per launch (one grid covers 2^30 entries; beyond that the loops stride).
  check_mask<float>(test::random_mask((std::size_t{1} << 22) + 77, 0.1, 4), 11);
  check_mask<double>(mask_cast<index_mask>(test::random_mask((std::size_t{1} << 20) + 5, 0.01, 5)),
                     12);
}

TEST_CASE_TEMPLATE("fp16 and bf16 payloads: encode fused into gather, decode into scatter", W,
                   pactrain::half, pactrain::bfloat16) {
  const cuda_compactor dc;
  for (std::size_t n : {std::size_t{0}, std::size_t{65}, std::size_t{4099}}) {
    const auto m = test::random_mask(n, 0.5, n);
    const auto dense = test::values<float>(n, 3);
    const auto hplan = host_compactor{}.make_plan(m);
    std::vector<float> kept(hplan.count());
    host_compactor{}.gather(hplan, std::span<const float>(dense), std::span<float>(kept));
    std::vector<W> want_wire;
    for (float v : kept) want_wire.push_back(W(v));  // the host codec's rounding
    std::vector<float> widened;
    for (W w : want_wire) widened.push_back(float(w));
    std::vector<float> want_dense(n);
    host_compactor{}.scatter(hplan, std::span<const float>(widened), std::span<float>(want_dense),
                             0.25f);
    for (const auto& plan : {dc.make_plan(m), dc.make_plan(mask_cast<index_mask>(m))}) {
      device_array<float> d_dense(dense);
      device_array<W> d_wire(plan.count());
      dc.gather(plan, d_dense.cspan(), d_wire.span());
      std::vector<std::uint16_t> got_bits;
      for (W w : d_wire.host()) got_bits.push_back(w.bits());
      std::vector<std::uint16_t> want_bits;
      for (W w : want_wire) want_bits.push_back(w.bits());
      CHECK(got_bits == want_bits);
      dc.scatter(plan, d_wire.cspan(), d_dense.span(), 0.25f);
      CHECK(test::bad_entries(d_dense.host(), want_dense) == 0);
    }
  }
}

TEST_CASE("the device word ranks equal the host mask's rank prefix") {
  const cuda_compactor dc;
  for (std::size_t n : test::sizes) {
    const auto m = test::random_mask(n, 0.3, n);
    const auto plan = dc.make_plan(m);
    const auto ranks = plan.device_ranks();
    std::vector<std::uint64_t> got(ranks.size());
    if (!got.empty()) {
      PACTRAIN_CUDA_TRY(
          cudaMemcpy(got.data(), ranks.data(), ranks.size_bytes(), cudaMemcpyDeviceToHost));
    }
    const auto want = m.rank_prefix();
    CHECK(std::vector<std::uint64_t>(want.begin(), want.end() - 1) == got);
  }
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

TEST_CASE("bad input is rejected before any launch and changes nothing") {
  const cuda_compactor dc;
  const auto m = test::random_mask(100, 0.5, 3);
  const auto plan = dc.make_plan(m);
  const auto dense0 = test::values<float>(100, 1);
  const std::vector<float> payload0(plan.count(), 5.0f);
  device_array<float> dense(dense0);
  device_array<float> payload(payload0);
  auto untouched = [&] {
    CHECK(dense.host() == dense0);
    CHECK(payload.host() == payload0);
  };
  device_array<float> short_dense(99);
  CHECK_THROWS_WITH_AS(dc.gather(plan, short_dense.cspan(), payload.span()),
                       doctest::Contains("dense buffer has 99 entries, the plan 100"), error);
  untouched();
  CHECK_THROWS_WITH_AS(dc.gather(plan, dense.cspan(), payload.span().first(3)),
                       doctest::Contains("payload buffer has 3 entries"), error);
  untouched();
  CHECK_THROWS_WITH_AS(dc.scatter(plan, payload.cspan().first(3), dense.span(), 1.0f),
                       doctest::Contains("payload buffer has 3 entries"), error);
  untouched();
  // Host memory where device memory is required.
  std::vector<float> host_dense = dense0;
  std::vector<float> host_payload = payload0;
  CHECK_THROWS_WITH_AS(dc.gather(plan, std::span<const float>(host_dense), payload.span()),
                       doctest::Contains("dense buffer is not device memory"), error);
  CHECK_THROWS_WITH_AS(dc.scatter(plan, std::span<const float>(host_payload), dense.span(), 1.0f),
                       doctest::Contains("payload buffer is not device memory"), error);
  CHECK(host_dense == dense0);
  untouched();
  CHECK_THROWS_WITH_AS(
      dc.gather(plan, std::span<const float>(static_cast<const float*>(nullptr), 100),
                payload.span()),
      doctest::Contains("null dense buffer"), error);
  CHECK_THROWS_WITH_AS(dc.gather(plan, dense.cspan(), dense.span().subspan(10, plan.count())),
                       doctest::Contains("overlap"), error);
  untouched();
  // Empty plans take empty (even null) buffers.
  const auto empty = dc.make_plan(bitmap_mask::none(0));
  dc.gather(empty, std::span<const float>(), std::span<float>());
  dc.scatter(empty, std::span<const float>(), std::span<float>(), 1.0f);
  const auto nothing_kept = dc.make_plan(index_mask::none(100));
  dc.gather(nothing_kept, dense.cspan(), std::span<float>());
  dc.scatter(nothing_kept, std::span<const float>(), dense.span(), 2.0f);
  CHECK(same_bits(dense.host(), std::vector<float>(100, 0.0f)));
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
