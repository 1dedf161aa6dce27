// Mask serialization: round trips, and every kind of corruption rejected with a message.
#include <doctest/doctest.h>

#include <pactrain/serialize.hpp>

#include "common/test_data.hpp"

#include <cstddef>
#include <cstdint>
#include <vector>

using namespace pactrain;

namespace {

using bytes = std::vector<std::byte>;

// Rewrites the checksum so a test can reach the semantic checks behind it.
void reseal(bytes& b) {
  const std::size_t body = b.size() - 8;
  const std::uint64_t c = detail::checksum(std::span<const std::byte>(b).first(body));
  for (int k = 0; k < 8; ++k) b[body + k] = static_cast<std::byte>((c >> (8 * k)) & 0xff);
}

void put(bytes& b, std::size_t at, std::uint64_t v, int width = 8) {
  for (int k = 0; k < width; ++k) b[at + k] = static_cast<std::byte>((v >> (8 * k)) & 0xff);
}

template <class Mask>
void round_trip(const Mask& m) {
  const bytes b = serialize(m);
  CHECK(b.size() == 48 + 8 +
                        8 * (Mask::kind == mask_kind::index
                                 ? m.count()
                                 : (Mask::kind == mask_kind::bitmap ? detail::words_for(m.size())
                                                                    : b.size() / 8 - 7)));
  const Mask back = deserialize<Mask>(b);
  CHECK(back == m);
  CHECK(back.digest() == m.digest());
}

}  // namespace

TEST_CASE("round trips of every mask kind") {
  for (std::size_t n : test::sizes) {
    for (double d : test::densities) {
      CAPTURE(n);
      CAPTURE(d);
      const auto b = test::random_mask(n, d, 3);
      round_trip(b);
      round_trip(mask_cast<index_mask>(b));
      round_trip(test::random_block_mask<16>(n, d, 5));
      round_trip(test::random_block_mask<1>(n, d, 5));
    }
  }
}

TEST_CASE("the header is little-endian and versioned") {
  const bytes b = serialize(index_mask(100, {3, 70}));
  REQUIRE(b.size() == 48 + 16 + 8);
  CHECK(static_cast<char>(b[0]) == 'P');
  CHECK(static_cast<char>(b[7]) == 'K');
  CHECK(b[8] == std::byte{1});   // version
  CHECK(b[12] == std::byte{2});  // kind: index
  CHECK(b[16] == std::byte{100});
  CHECK(b[24] == std::byte{2});  // count
  CHECK(b[40] == std::byte{2});  // items
  CHECK(b[48] == std::byte{3});
  CHECK(b[56] == std::byte{70});
}

TEST_CASE("truncated or extended input is rejected at every length") {
  const bytes good = serialize(test::random_mask(300, 0.5, 9));
  for (std::size_t len = 0; len < good.size(); ++len) {
    CAPTURE(len);
    const bytes cut(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(len));
    CHECK_THROWS_AS(deserialize<bitmap_mask>(cut), error);
  }
  bytes longer = good;
  longer.push_back(std::byte{0});
  CHECK_THROWS_WITH_AS(deserialize<bitmap_mask>(longer), doctest::Contains("trailing"), error);
  longer.resize(longer.size() + 7);
  CHECK_THROWS_AS(deserialize<bitmap_mask>(longer), error);
}

TEST_CASE("any flipped bit is caught") {
  const bytes good = serialize(mask_cast<index_mask>(test::random_mask(200, 0.3, 4)));
  for (std::size_t at = 0; at < good.size(); ++at) {
    for (int bit = 0; bit < 8; bit += 3) {
      bytes b = good;
      b[at] ^= static_cast<std::byte>(1 << bit);
      CAPTURE(at);
      CHECK_THROWS_AS(deserialize<index_mask>(b), error);
    }
  }
}

TEST_CASE("each header field is validated with its own message") {
  const bytes good = serialize(test::random_mask(130, 0.5, 2));
  auto expect = [](bytes b, const char* what, bool seal) {
    if (seal) reseal(b);
    CHECK_THROWS_WITH_AS(deserialize<bitmap_mask>(b), doctest::Contains(what), error);
  };
  bytes b = good;
  b[0] = std::byte{'X'};
  expect(b, "bad magic", false);
  b = good;
  put(b, 8, 2, 4);
  expect(b, "unsupported format version 2", false);
  b = good;
  put(b, 12, 2, 4);
  expect(b, "mask kind 2 where kind 1", false);
  b = good;
  put(b, 32, 4);
  expect(b, "block size 4 where 1", false);
  b = good;
  put(b, 40, 1000);
  expect(b, "does not match 1000 items", false);
  b = good;
  put(b, 40, ~0ULL);  // an item count whose byte size overflows
  expect(b, "does not match", false);
  b = good;
  b[b.size() - 1] ^= std::byte{0x80};
  expect(b, "checksum mismatch", false);
  b = good;
  put(b, 16, 200);  // size no longer matches the 3 words
  expect(b, "word count does not match size", true);
  b = good;
  put(b, 16, 129);  // 3 words still, but bit 129 is set past the end
  expect(b, "bits set past the last entry", true);
  b = good;
  put(b, 24, 131);
  expect(b, "count exceeds size", true);
  b = good;
  put(b, 24, 1);
  expect(b, "count does not match", true);
  b = good;
  put(b, 16, ~0ULL);
  expect(b, "size does not fit", true);
  // The same file read as another kind.
  CHECK_THROWS_WITH_AS(deserialize<index_mask>(good), doctest::Contains("mask kind 1 where kind 2"),
                       error);
  CHECK_THROWS_WITH_AS(deserialize<block_mask<8>>(good), doctest::Contains("mask kind"), error);
}

TEST_CASE("index payloads are validated") {
  const bytes good = serialize(index_mask(100, {3, 50, 70}));
  auto expect = [](bytes b, const char* what) {
    reseal(b);
    CHECK_THROWS_WITH_AS(deserialize<index_mask>(b), doctest::Contains(what), error);
  };
  bytes b = good;
  put(b, 56, 2);  // 3, 2, 70
  expect(b, "not strictly increasing");
  b = good;
  put(b, 56, 3);  // duplicate
  expect(b, "not strictly increasing");
  b = good;
  put(b, 64, 100);
  expect(b, "out of range");
  b = good;
  put(b, 24, 2);
  expect(b, "index count does not match count");
}

TEST_CASE("block payloads are validated") {
  const bytes good = serialize(block_mask<4>::full(10));  // 3 blocks
  bytes b = good;
  put(b, 48, 0b1111);  // a fourth block past the end
  reseal(b);
  CHECK_THROWS_WITH_AS(deserialize<block_mask<4>>(b), doctest::Contains("past the last entry"),
                       error);
  CHECK_THROWS_WITH_AS(deserialize<block_mask<8>>(good), doctest::Contains("block size 4 where 8"),
                       error);
}

TEST_CASE("a claimed size is bounded, by default and by the caller") {
  // 56 bytes that claim an index mask of 2^62 entries, none kept: its digest would hash 2^56
  // words and its bitmap would need 2^59 bytes.
  bytes huge = serialize(index_mask::none(0));
  REQUIRE(huge.size() == 56);
  put(huge, 16, std::uint64_t{1} << 62);
  reseal(huge);
  CHECK_THROWS_WITH_AS(deserialize<index_mask>(huge),
                       doctest::Contains("size 4611686018427387904 exceeds the largest accepted"),
                       error);
  // The default bound itself, and a bound of the caller's.
  put(huge, 16, default_max_mask_size + 1);
  reseal(huge);
  CHECK_THROWS_WITH_AS(deserialize<index_mask>(huge), doctest::Contains("exceeds"), error);
  put(huge, 16, default_max_mask_size);
  reseal(huge);
  CHECK(deserialize<index_mask>(huge).size() == default_max_mask_size);
  const bytes small = serialize(index_mask(200, {3, 150}));
  CHECK_THROWS_WITH_AS(deserialize<index_mask>(small, 199),
                       doctest::Contains("size 200 exceeds the largest accepted, 199 entries"),
                       error);
  CHECK(deserialize<index_mask>(small, 200) == index_mask(200, {3, 150}));
  // Bitmap and block masks: the bound applies alike, before the words are counted.
  const bytes bits = serialize(test::random_mask(130, 0.5, 2));
  CHECK_THROWS_WITH_AS(deserialize<bitmap_mask>(bits, 129), doctest::Contains("exceeds"), error);
  CHECK(deserialize<bitmap_mask>(bits, 130).size() == 130);
  const bytes blocks = serialize(block_mask<4>::full(10));
  CHECK_THROWS_WITH_AS(deserialize<block_mask<4>>(blocks, 9), doctest::Contains("exceeds"), error);
  CHECK(deserialize<block_mask<4>>(blocks, 10) == block_mask<4>::full(10));
}
