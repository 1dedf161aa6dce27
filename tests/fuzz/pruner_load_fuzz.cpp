// pruner::load on untrusted bytes, over a one-rank engine: either pactrain::error and the
// masks and schedule position unchanged, or a checkpoint that saves back to the very bytes it
// was loaded from, whose masks the engine and apply_masks then use.
#include "fuzz.hpp"

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>

using namespace pactrain;
using fuzz::expect;

namespace {

struct fixture {
  fuzz::checkpoint_engine engine{loopback_communicator{}, fuzz::fixed_layout()};
  fuzz::checkpoint_pruner pruner = fuzz::make_pruner();
  fuzz::bytes baseline;
  fixture() {
    fuzz::prune_steps(engine, pruner, 3);
    baseline = pruner.save(engine);
  }
};

fixture& fixed() {
  static fixture f;
  return f;
}

// Sealing puts in the layout's digest and every length-prefixed mask's checksum, then the
// checkpoint's checksum.
void seal(fuzz::bytes& b) {
  if (b.size() >= 24) fuzz::put_at(b, 16, fixed().engine.layout().digest());
  std::size_t at = 48;
  while (at <= b.size() && b.size() - at >= 8) {
    const std::uint64_t len = detail::get_u64(b, at);
    at += 8;
    if (len > b.size() - at) break;
    const auto n = static_cast<std::size_t>(len);
    if (n >= 56) {
      const auto body = std::span<const std::byte>(b).subspan(at, n - 8);
      fuzz::put_at(b, at + n - 8, detail::checksum(body));
    }
    at += n;
  }
  fuzz::append_checksum(b);
}

std::vector<fuzz::named_seed> seeds() {
  using fuzz::raw_seed;
  using fuzz::sealed_seed;
  const auto l = fuzz::fixed_layout();
  fuzz::checkpoint_engine e{loopback_communicator{}, l};
  auto p = fuzz::make_pruner();
  const auto dense = p.save(e);
  fuzz::prune_steps(e, p, 5);
  const auto pruned = p.save(e);
  param_layout other_layout(64);
  other_layout.add("w", 8, 12).add("b", 8).add("v", 41);
  fuzz::checkpoint_engine o{loopback_communicator{}, other_layout};
  const auto other = fuzz::make_pruner().save(o);
  auto wrong_count = pruned;
  fuzz::put_at(wrong_count, 40, 2);
  return {
      {"pruned", raw_seed(0, pruned)},
      {"pruned-sealed", sealed_seed(0, pruned)},
      {"dense-sealed", sealed_seed(0, dense)},
      {"other-layout", raw_seed(0, other)},
      {"other-layout-sealed", sealed_seed(0, other)},
      {"mask-count-sealed", sealed_seed(0, wrong_count)},
      {"truncated", raw_seed(0, std::span(pruned).first(50))},
  };
}

void run(fuzz::input& in) {
  if (in.sealed) seal(in.data);
  auto& f = fixed();
  try {
    f.pruner.load(f.engine, in.data);
  } catch (const error&) {
    expect(f.pruner.save(f.engine) == f.baseline, "a refused checkpoint changes nothing");
    return;
  }
  expect(f.pruner.save(f.engine) == in.data, "a loaded checkpoint saves as it was loaded");
  // The loaded masks at work: a step of the engine, and the weights they prune.
  const auto& l = f.engine.layout();
  const auto g0 = fuzz::values(l.total_size(), 5);
  auto g = g0;
  f.engine.allreduce(std::span<float>(g));
  auto w = fuzz::values(l.total_size(), 6);
  apply_masks(l, f.engine.masks(), std::span<float>(w));
  for (std::size_t t = 0; t < l.tensor_count(); ++t) {
    const auto& m = f.engine.masks()[t];
    fuzz::check_invariants(m);
    for (std::size_t i = 0; i < m.size(); ++i) {
      const std::size_t k = l.tensor(t).offset + i;
      const auto zero = [](float x) { return x == 0.0f && !std::signbit(x); };
      expect(m.test(i) || (zero(w[k]) && zero(g[k])), "pruned entries come back +0");
      expect(!m.test(i) || g[k] == g0[k], "one rank's average of a kept entry is the entry");
    }
  }
  f.pruner.load(f.engine, f.baseline);
  expect(f.pruner.save(f.engine) == f.baseline, "the baseline checkpoint is restored");
}

}  // namespace

PACTRAIN_FUZZ_TARGET(seeds, run)
