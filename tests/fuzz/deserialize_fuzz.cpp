// deserialize<Mask> of every mask type on untrusted bytes: either pactrain::error, or a mask
// that keeps its promises and serializes back to the very bytes it was read from.
#include "fuzz.hpp"

#include <cstddef>
#include <cstdint>
#include <type_traits>

using namespace pactrain;
using fuzz::expect;

namespace {

template <class Mask>
void read(const fuzz::bytes& b) {
  Mask m;
  try {
    m = deserialize<Mask>(b);
  } catch (const error&) {
    return;
  }
  expect(m.size() <= default_max_mask_size, "the default bound holds");
  // The caller's bound: the mask's own size passes, one less does not.
  expect(deserialize<Mask>(b, m.size()) == m, "the exact size is accepted");
  if (m.size() > 0) {
    fuzz::expect_error([&] { (void)deserialize<Mask>(b, m.size() - 1); },
                       "a size above the caller's bound is refused");
  }
  expect(serialize(m) == b, "serialize(deserialize(x)) == x");
  if (m.size() > fuzz::dense_limit) return;  // digests and runs take O(size)
  const Mask again = deserialize<Mask>(serialize(m));
  expect(again == m && again.digest() == m.digest(), "a round trip gives an equal mask");
  fuzz::check_invariants(m);
}

std::vector<fuzz::named_seed> seeds() {
  using fuzz::raw_seed;
  using fuzz::sealed_seed;
  const auto bitmap = serialize(
      bitmap_mask::from_predicate(130, [](std::size_t i) { return i % 5 < 2 || i == 129; }));
  const auto index = serialize(index_mask(100, {3, 50, 51, 70}));
  const auto block4 = serialize(block_mask<4>(10, bitmap_mask(3, std::vector<std::uint64_t>{5})));
  const auto block64 = serialize(block_mask<64>::full(300));
  auto huge = serialize(index_mask::none(0));
  fuzz::put_at(huge, 16, std::uint64_t{1} << 62);  // the size a 56-byte blob once could claim
  return {
      {"bitmap", raw_seed(0, bitmap)},
      {"bitmap-sealed", sealed_seed(0, bitmap)},
      {"index", raw_seed(1, index)},
      {"index-sealed", sealed_seed(1, index)},
      {"index-empty", raw_seed(1, serialize(index_mask::none(0)))},
      {"index-huge-sealed", sealed_seed(1, huge)},
      {"block4-sealed", sealed_seed(2, block4)},
      {"block64-sealed", sealed_seed(3, block64)},
      {"bitmap-as-index", raw_seed(1, bitmap)},
      {"truncated", raw_seed(0, std::span(bitmap).first(20))},
  };
}

void run(fuzz::input& in) {
  fuzz::read_as_chosen_mask(
      in, []<class Mask>(std::type_identity<Mask>, const fuzz::bytes& b) { read<Mask>(b); });
}

}  // namespace

PACTRAIN_FUZZ_TARGET(seeds, run)
