// mask_cast between every pair of mask types, from a deserialized mask: the kept set, size,
// count and digest survive, casting back gives the mask again, and a cast to block_mask<B>
// is refused exactly when some block of B entries is partly kept.
#include "fuzz.hpp"

#include <cstddef>
#include <cstdint>
#include <type_traits>

using namespace pactrain;
using fuzz::expect;

namespace {

template <std::size_t B, class Mask>
bool block_structured(const Mask& m) {
  for (const auto& [b, len] : fuzz::runs_of(m)) {
    if (b % B != 0 || ((b + len) % B != 0 && b + len != m.size())) return false;
  }
  return true;
}

template <class To, class From>
void cast(const From& m) {
  To t;
  try {
    t = mask_cast<To>(m);
  } catch (const error&) {
    if constexpr (To::kind == mask_kind::block) {
      expect(!block_structured<To::block_size>(m), "a block-structured mask casts to blocks");
      return;
    }
    fuzz::fail("only a cast to blocks may be refused");
  }
  if constexpr (To::kind == mask_kind::block) {
    expect(block_structured<To::block_size>(m), "a cast to blocks keeps whole blocks");
  }
  expect(t.size() == m.size() && t.count() == m.count(), "size and count survive");
  expect(t.digest() == m.digest(), "equal kept sets have equal digests");
  expect(fuzz::runs_of(t) == fuzz::runs_of(m), "the kept set survives");
  expect(mask_cast<From>(t) == m, "casting back gives the mask again");
  expect(deserialize<To>(serialize(t)) == t, "the cast mask round-trips");
  fuzz::check_invariants(t);
}

template <class From>
void read(const fuzz::bytes& b) {
  From m;
  try {
    m = deserialize<From>(b, fuzz::dense_limit);  // a caller that knows its tensors' sizes
  } catch (const error&) {
    return;
  }
  fuzz::check_invariants(m);
  fuzz::with_mask_type(0, [&]<class To>(std::type_identity<To>) { cast<To>(m); });
  fuzz::with_mask_type(1, [&]<class To>(std::type_identity<To>) { cast<To>(m); });
  fuzz::with_mask_type(2, [&]<class To>(std::type_identity<To>) { cast<To>(m); });
  fuzz::with_mask_type(3, [&]<class To>(std::type_identity<To>) { cast<To>(m); });
}

std::vector<fuzz::named_seed> seeds() {
  // Blocks of 4 kept whole (it casts to block_mask<4>, not to block_mask<64>), a scattered
  // bitmap, a sparse index mask with a run crossing a word, and blocks of 64 with a short tail.
  const auto blocks =
      bitmap_mask::from_predicate(200, [](std::size_t i) { return i / 4 % 3 == 0; });
  const auto scattered = bitmap_mask::from_predicate(77, [](std::size_t i) { return i % 7 == 2; });
  const auto sparse = index_mask(1000, {0, 62, 63, 64, 65, 999});
  const auto tail = block_mask<64>(130, bitmap_mask(3, std::vector<std::uint64_t>{0b101}));
  return {
      {"bitmap-blocks", fuzz::sealed_seed(0, serialize(blocks))},
      {"bitmap-scattered", fuzz::sealed_seed(0, serialize(scattered))},
      {"index-sparse", fuzz::sealed_seed(1, serialize(sparse))},
      {"index-full", fuzz::sealed_seed(1, serialize(index_mask::full(9)))},
      {"block4", fuzz::sealed_seed(2, serialize(mask_cast<block_mask<4>>(blocks)))},
      {"block64-tail", fuzz::sealed_seed(3, serialize(tail))},
      {"empty", fuzz::sealed_seed(0, serialize(bitmap_mask::none(0)))},
  };
}

void run(fuzz::input& in) {
  fuzz::read_as_chosen_mask(
      in, []<class Mask>(std::type_identity<Mask>, const fuzz::bytes& b) { read<Mask>(b); });
}

}  // namespace

PACTRAIN_FUZZ_TARGET(seeds, run)
