// Masks: construction, counts, runs, conversions and digests.
#include <doctest/doctest.h>

#include <pactrain/mask.hpp>

#include "common/test_data.hpp"

#include <cstdint>
#include <utility>
#include <vector>

using namespace pactrain;

namespace {

std::vector<std::pair<std::size_t, std::size_t>> runs_of(const auto& m) {
  std::vector<std::pair<std::size_t, std::size_t>> r;
  m.for_each_run([&](std::size_t b, std::size_t len) { r.emplace_back(b, len); });
  return r;
}

// The kept set, entry by entry, through test().
std::vector<bool> bits_of(const auto& m) {
  std::vector<bool> v(m.size());
  for (std::size_t i = 0; i < m.size(); ++i) v[i] = m.test(i);
  return v;
}

}  // namespace

TEST_CASE("bitmap_mask counts, tests, ranks and runs") {
  for (std::size_t n : test::sizes) {
    for (double d : test::densities) {
      CAPTURE(n);
      CAPTURE(d);
      const auto m = test::random_mask(n, d, 7);
      std::size_t kept = 0;
      std::vector<std::pair<std::size_t, std::size_t>> expect;
      for (std::size_t i = 0; i < n; ++i) {
        CHECK(m.rank(i) == kept);
        if (m.test(i)) {
          if (!expect.empty() && expect.back().first + expect.back().second == i) {
            ++expect.back().second;
          } else {
            expect.emplace_back(i, 1);
          }
          ++kept;
        }
      }
      CHECK(m.count() == kept);
      CHECK(m.rank(n) == kept);
      CHECK_FALSE(m.test(n));
      CHECK(runs_of(m) == expect);
      if (d == 0.0) CHECK(m.count() == 0);
      if (d == 1.0) CHECK(m.count() == n);
    }
  }
}

TEST_CASE("a bitmap's run count and canonical words are those its runs give") {
  for (std::size_t n : test::sizes) {
    for (double d : test::densities) {
      CAPTURE(n);
      CAPTURE(d);
      const auto m = test::random_mask(n, d, 11);
      CHECK(detail::run_count(m) == runs_of(m).size());
      const index_mask same = index_mask::from_mask(m);  // words rebuilt from runs
      CHECK(detail::run_count(same) == runs_of(m).size());
      std::vector<std::uint64_t> from_bitmap;
      std::vector<std::uint64_t> from_runs;
      detail::for_each_word(m, [&](std::uint64_t w) { from_bitmap.push_back(w); });
      detail::for_each_word(same, [&](std::uint64_t w) { from_runs.push_back(w); });
      CHECK(from_bitmap == from_runs);
    }
  }
}

TEST_CASE("full and none") {
  for (std::size_t n : test::sizes) {
    CHECK(bitmap_mask::full(n).count() == n);
    CHECK(bitmap_mask::none(n).count() == 0);
    CHECK(index_mask::full(n).count() == n);
    CHECK(index_mask::none(n).count() == 0);
    CHECK(block_mask<16>::full(n).count() == n);
    CHECK(block_mask<16>::none(n).count() == 0);
    CHECK(block_mask<16>::full(n).digest() == bitmap_mask::full(n).digest());
    CHECK(index_mask::full(n).digest() == bitmap_mask::full(n).digest());
  }
}

TEST_CASE("conversions preserve the kept set and the digest") {
  for (std::size_t n : test::sizes) {
    for (double d : test::densities) {
      CAPTURE(n);
      CAPTURE(d);
      const auto b = test::random_mask(n, d, 11);
      const auto ix = mask_cast<index_mask>(b);
      CHECK(ix.count() == b.count());
      CHECK(bits_of(ix) == bits_of(b));
      CHECK(ix.digest() == b.digest());
      CHECK(mask_cast<bitmap_mask>(ix) == b);
      CHECK(runs_of(ix) == runs_of(b));

      const auto blk = test::random_block_mask<8>(n, d, 13);
      const auto bb = mask_cast<bitmap_mask>(blk);
      CHECK(bb.count() == blk.count());
      CHECK(bits_of(bb) == bits_of(blk));
      CHECK(bb.digest() == blk.digest());
      CHECK(mask_cast<block_mask<8>>(bb) == blk);
      CHECK(mask_cast<block_mask<8>>(mask_cast<index_mask>(blk)) == blk);
      CHECK(runs_of(mask_cast<index_mask>(blk)) == runs_of(blk));
    }
  }
}

TEST_CASE("block_mask counts a short last block") {
  // 10 entries in blocks of 4: blocks {0..3}, {4..7}, {8, 9}.
  const block_mask<4> m(10, bitmap_mask(3, std::vector<std::uint64_t>{0b101}));
  CHECK(m.count() == 6);
  CHECK(runs_of(m) == std::vector<std::pair<std::size_t, std::size_t>>{{0, 4}, {8, 2}});
  CHECK(m.test(9));
  CHECK_FALSE(m.test(4));
  CHECK_FALSE(m.test(10));
  // ceil(n / B) where n + B - 1 would wrap around.
  constexpr std::size_t big = (std::size_t{1} << 63) + 2;
  static_assert(block_mask<big>::block_count(~std::size_t{0}) == 2);
  static_assert(block_mask<big>::block_count(big) == 1);
  static_assert(block_mask<4>::block_count(0) == 0 && block_mask<4>::block_count(9) == 3);
}

TEST_CASE("digests differ for different masks and sizes") {
  const auto a = test::random_mask(1000, 0.5, 1);
  auto words = std::vector<std::uint64_t>(a.words().begin(), a.words().end());
  words[3] ^= 1ULL << 17;
  const bitmap_mask b(1000, words);
  CHECK(a.digest() != b.digest());
  CHECK(bitmap_mask::none(64).digest() != bitmap_mask::none(65).digest());
  CHECK(bitmap_mask::none(0).digest() != bitmap_mask::none(1).digest());
}

TEST_CASE("digests are fixed values, the same on every machine") {
  // Pinned so that a change of the digest function (which would make ranks built from
  // different versions disagree) is noticed.
  CHECK(bitmap_mask::none(0).digest() == 0xd3befa021f11ea56ULL);
  CHECK(bitmap_mask::full(130).digest() == 0x3659578eb3498a4bULL);
  CHECK(test::random_mask(1000, 0.5, 1).digest() == 0xd8fce8e67ffe3f6ULL);
}

TEST_CASE("invalid masks are rejected with pactrain::error") {
  CHECK_THROWS_WITH_AS(bitmap_mask(65, std::vector<std::uint64_t>{0}),
                       doctest::Contains("words given for 65 entries"), error);
  CHECK_THROWS_WITH_AS(bitmap_mask(65, std::vector<std::uint64_t>{0, 2}),
                       doctest::Contains("bits set past the last entry"), error);
  CHECK_THROWS_WITH_AS(index_mask(10, {1, 3, 3}), doctest::Contains("not strictly increasing"),
                       error);
  CHECK_THROWS_WITH_AS(index_mask(10, {4, 2}), doctest::Contains("not strictly increasing"), error);
  CHECK_THROWS_WITH_AS(index_mask(10, {10}), doctest::Contains("out of range"), error);
  CHECK_THROWS_WITH_AS((block_mask<4>(10, bitmap_mask(2))),
                       doctest::Contains("2 blocks given for 10 entries"), error);
  // Entries 2..5 straddle two blocks of 4: no block mask represents it.
  const auto straddle =
      bitmap_mask::from_predicate(16, [](std::size_t i) { return i >= 2 && i < 6; });
  CHECK_THROWS_WITH_AS(mask_cast<block_mask<4>>(straddle),
                       doctest::Contains("not block-structured"), error);
}
