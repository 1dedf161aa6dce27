// host_compactor: every mask type x plan format x instruction set x value type against a
// reference, bit for bit; bad input rejected with buffers untouched.
#include <doctest/doctest.h>

#include <pactrain/compactor.hpp>

#include "common/test_data.hpp"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

using namespace pactrain;

namespace {

constexpr host_isa all_isas[] = {host_isa::portable, host_isa::avx2, host_isa::avx512};
constexpr plan_format all_formats[] = {plan_format::automatic, plan_format::bitmap,
                                       plan_format::runs, plan_format::indices};

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

// The reference: what gather and scatter mean, entry by entry.
template <class T, class Mask>
void check_mask(const Mask& mask, std::uint64_t seed) {
  const std::size_t n = mask.size();
  const auto dense = test::values<T>(n, seed);
  std::vector<T> want_payload;
  for (std::size_t i = 0; i < n; ++i) {
    if (mask.test(i)) want_payload.push_back(dense[i]);
  }
  REQUIRE(want_payload.size() == mask.count());
  for (const T scale : {T(1), T(0.25), T(-3)}) {
    std::vector<T> want_dense(n);
    for (std::size_t i = 0, k = 0; i < n; ++i) {
      want_dense[i] = mask.test(i) ? want_payload[k++] * scale : T(0);
    }
    for (host_isa isa : all_isas) {
      if (!isa_supported(isa)) continue;
      for (plan_format f : all_formats) {
        // Plain stores, and non-temporal ones wherever the kernel has them and the output is
        // aligned for them (16 bytes from std::vector, where the AVX-512 compactor streams
        // through the AVX2 kernel; 64 below).
        for (const std::size_t stream : {std::numeric_limits<std::size_t>::max(), std::size_t{0}}) {
          CAPTURE(to_string(isa));
          CAPTURE(to_string(f));
          CAPTURE(scale);
          CAPTURE(stream);
          const host_compactor c({.isa = isa, .format = f, .nontemporal_min_bytes = stream});
          const auto plan = c.make_plan(mask);
          CHECK(plan.size() == n);
          CHECK(plan.count() == mask.count());
          std::vector<T> payload(plan.count(), T(99));
          c.gather(plan, std::span<const T>(dense), std::span<T>(payload));
          CHECK(same_bits(payload, want_payload));
          std::vector<T> out(n, T(77));
          c.scatter(plan, std::span<const T>(payload), std::span<T>(out), scale);
          CHECK(same_bits(out, want_dense));  // +0 at pruned entries, never -0
          // An output that is not 16-byte aligned takes plain stores, with the same result.
          std::vector<T> shifted(n + 1, T(55));
          c.scatter(plan, std::span<const T>(payload), std::span<T>(shifted).subspan(1), scale);
          CHECK(shifted[0] == T(55));
          CHECK(same_bits(std::vector<T>(shifted.begin() + 1, shifted.end()), want_dense));
          // A 64-byte aligned output: AVX-512's non-temporal stores.
          std::vector<T> wide(n + 64 / sizeof(T), T(55));
          const auto skip = (64 - reinterpret_cast<std::uintptr_t>(wide.data()) % 64) % 64;
          const auto aligned = std::span<T>(wide).subspan(skip / sizeof(T), n);
          c.scatter(plan, std::span<const T>(payload), aligned, scale);
          CHECK(same_bits(std::vector<T>(aligned.begin(), aligned.end()), want_dense));
        }
      }
    }
  }
}

}  // namespace

TEST_CASE("the CPU's instruction sets are reported") {
  MESSAGE("avx2: " << isa_supported(host_isa::avx2)
                   << ", avx512: " << isa_supported(host_isa::avx512) << ", automatic picks "
                   << std::string(to_string(host_compactor{}.isa())));
  CHECK(isa_supported(host_isa::portable));
  CHECK(host_compactor{}.isa() != host_isa::automatic);
  for (host_isa isa : all_isas) {
    if (!isa_supported(isa)) {
      CHECK_THROWS_WITH_AS(host_compactor({.isa = isa}), doctest::Contains("does not support"),
                           error);
    }
  }
}

TEST_CASE_TEMPLATE("bitmap and index masks, every size and density", T, float, double) {
  for (std::size_t n : test::sizes) {
    for (double d : test::densities) {
      CAPTURE(n);
      CAPTURE(d);
      const auto m = test::random_mask(n, d, n * 31 + 1);
      check_mask<T>(m, 5);
      check_mask<T>(mask_cast<index_mask>(m), 6);
    }
  }
}

TEST_CASE_TEMPLATE("block masks, sizes not a multiple of the block", T, float, double) {
  for (std::size_t n : test::sizes) {
    for (double d : test::densities) {
      CAPTURE(n);
      CAPTURE(d);
      check_mask<T>(test::random_block_mask<4>(n, d, n + 3), 7);
      check_mask<T>(test::random_block_mask<48>(n, d, n + 4), 8);
    }
  }
}

TEST_CASE_TEMPLATE("word patterns that exercise every SIMD branch", T, float, double) {
  const auto m = test::word_pattern_mask();
  check_mask<T>(m, 9);
}

TEST_CASE("automatic formats follow the mask's structure") {
  const host_compactor c;
  CHECK(c.make_plan(block_mask<64>::full(1000)).format() == plan_format::runs);
  CHECK(c.make_plan(test::random_block_mask<64>(1 << 16, 0.5, 1)).format() == plan_format::runs);
  CHECK(c.make_plan(test::random_mask(1 << 16, 0.5, 1)).format() == plan_format::bitmap);
  CHECK(c.make_plan(test::random_mask(1 << 16, 0.01, 1)).format() == plan_format::indices);
  CHECK(c.make_plan(bitmap_mask::none(100)).format() == plan_format::runs);
}

TEST_CASE("plans are reusable values") {
  const host_compactor c;
  const auto m = test::random_mask(1000, 0.3, 2);
  const auto plan = c.make_plan(m);
  const auto copy = plan;
  const auto dense = test::values<float>(1000, 1);
  std::vector<float> p1(plan.count());
  std::vector<float> p2(plan.count());
  c.gather(plan, std::span<const float>(dense), std::span<float>(p1));
  c.gather(copy, std::span<const float>(dense), std::span<float>(p2));
  c.gather(plan, std::span<const float>(dense), std::span<float>(p2));
  CHECK(p1 == p2);
}

TEST_CASE("bad input is rejected and changes nothing") {
  const host_compactor c;
  const auto m = test::random_mask(100, 0.5, 3);
  const auto plan = c.make_plan(m);
  std::vector<float> dense = test::values<float>(100, 1);
  std::vector<float> payload(plan.count(), 5.0f);
  const auto dense0 = dense;
  const auto payload0 = payload;
  auto untouched = [&] {
    CHECK(dense == dense0);
    CHECK(payload == payload0);
  };
  std::vector<float> short_dense(99);
  CHECK_THROWS_WITH_AS(
      c.gather(plan, std::span<const float>(short_dense), std::span<float>(payload)),
      doctest::Contains("dense buffer has 99 entries, the plan 100"), error);
  untouched();
  CHECK_THROWS_WITH_AS(
      c.gather(plan, std::span<const float>(dense), std::span<float>(payload).first(3)),
      doctest::Contains("payload buffer has 3 entries"), error);
  untouched();
  CHECK_THROWS_WITH_AS(
      c.scatter(plan, std::span<const float>(payload).first(3), std::span<float>(dense), 1.0f),
      doctest::Contains("payload buffer has 3 entries"), error);
  untouched();
  CHECK_THROWS_WITH_AS(
      c.scatter(plan, std::span<const float>(payload), std::span<float>(dense).first(50), 1.0f),
      doctest::Contains("dense buffer has 50"), error);
  untouched();
  // Overlapping buffers: the payload inside the dense tensor.
  CHECK_THROWS_WITH_AS(c.gather(plan, std::span<const float>(dense),
                                std::span<float>(dense).subspan(10, plan.count())),
                       doctest::Contains("overlap"), error);
  untouched();
  // An empty plan takes empty (even null) buffers.
  const auto empty = c.make_plan(bitmap_mask::none(0));
  c.gather(empty, std::span<const float>(), std::span<float>());
  c.scatter(empty, std::span<const float>(), std::span<float>(), 1.0f);
  const auto nothing_kept = c.make_plan(bitmap_mask::none(100));
  c.gather(nothing_kept, std::span<const float>(dense), std::span<float>());
  c.scatter(nothing_kept, std::span<const float>(), std::span<float>(dense), 2.0f);
  for (float v : dense) CHECK(v == 0.0f);
}
