// sync::load_state on untrusted bytes, into a one-rank ternary engine with error feedback and
// the previous step's scales: either pactrain::error and the engine's state unchanged, or a
// state that saves back to the very bytes it was loaded from and that a step can run on.
#include "fuzz.hpp"

#include <cstddef>
#include <cstdint>
#include <span>

using namespace pactrain;
using fuzz::expect;

namespace {

struct fixture {
  fuzz::state_engine engine = fuzz::make_state_engine(fuzz::fixed_masks(fuzz::fixed_layout()), 2);
  fuzz::bytes baseline = engine.save_state();
};

fixture& fixed() {
  static fixture f;
  return f;
}

// Sealing puts in the digest of what this engine was configured with, then the checksum.
void seal(fuzz::bytes& b) {
  if (b.size() >= 24) fuzz::put_at(b, 16, detail::get_u64(fixed().baseline, 16));
  fuzz::append_checksum(b);
}

std::vector<fuzz::named_seed> seeds() {
  using fuzz::raw_seed;
  using fuzz::sealed_seed;
  const auto l = fuzz::fixed_layout();
  const auto later = fuzz::make_state_engine(fuzz::fixed_masks(l), 3).save_state();
  const auto fresh = fuzz::make_state_engine(fuzz::fixed_masks(l), 0).save_state();
  auto other_masks = fuzz::fixed_masks(l);
  other_masks.front() = bitmap_mask::full(other_masks.front().size());
  const auto other = fuzz::make_state_engine(other_masks, 1).save_state();
  auto flags = later;
  fuzz::put_at(flags, 32, 2);
  return {
      {"later", raw_seed(0, later)},
      {"later-sealed", sealed_seed(0, later)},
      {"fresh-sealed", sealed_seed(0, fresh)},
      {"other-masks", raw_seed(0, other)},
      {"flags-sealed", sealed_seed(0, flags)},
      {"truncated", raw_seed(0, std::span(later).first(40))},
  };
}

void run(fuzz::input& in) {
  if (in.sealed) seal(in.data);
  auto& f = fixed();
  try {
    f.engine.load_state(in.data);
  } catch (const error&) {
    expect(f.engine.save_state() == f.baseline, "a refused state changes nothing");
    return;
  }
  expect(f.engine.save_state() == in.data, "a loaded state saves as it was loaded");
  // A step on the loaded residuals and scales, whatever their bits.
  auto g = fuzz::values(f.engine.layout().total_size(), 5);
  f.engine.allreduce(std::span<float>(g));
  f.engine.load_state(f.baseline);
  expect(f.engine.save_state() == f.baseline, "the baseline state is restored");
}

}  // namespace

PACTRAIN_FUZZ_TARGET(seeds, run)
