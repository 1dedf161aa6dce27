// Pruning policies, schedules, apply_masks and checkpoints on one rank.
#include <doctest/doctest.h>

#include <pactrain/pactrain.hpp>
#include <pactrain/pruning/pruner.hpp>

#include "common/test_data.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <vector>

using namespace pactrain;

namespace {

param_layout model() {
  param_layout l(500);
  l.add("fc1.weight", 30, 17).add("fc1.bias", 30).add("fc2.weight", 10, 30).add("fc2.bias", 10);
  return l;
}

// Weights with many ties: values in {-4, ..., 4} / 4.
std::vector<float> tied_weights(std::size_t n, std::uint64_t seed) {
  std::vector<float> w(n);
  for (std::size_t i = 0; i < n; ++i)
    w[i] = static_cast<float>(static_cast<int>(test::mix(seed + i) % 9) - 4) / 4;
  return w;
}

// The reference for magnitude pruning of one tensor: sort by (|w| desc, index asc).
std::vector<bool> reference_keep(std::span<const float> w, std::size_t keep) {
  std::vector<std::size_t> idx(w.size());
  for (std::size_t i = 0; i < idx.size(); ++i) idx[i] = i;
  std::stable_sort(idx.begin(), idx.end(),
                   [&](std::size_t a, std::size_t b) { return std::abs(w[a]) > std::abs(w[b]); });
  std::vector<bool> k(w.size(), false);
  for (std::size_t i = 0; i < keep; ++i) k[idx[i]] = true;
  return k;
}

template <class Mask>
std::vector<bool> bits(const Mask& m) {
  std::vector<bool> v(m.size());
  for (std::size_t i = 0; i < m.size(); ++i) v[i] = m.test(i);
  return v;
}

using loop_sync = pactrain::sync<loopback_communicator>;

}  // namespace

TEST_CASE("pruned counts round half up and are exact") {
  CHECK(pruned_count(10, 0.9) == 9);
  CHECK(pruned_count(10, 0.25) == 3);  // 2.5 rounds up
  CHECK(pruned_count(10, 0.24) == 2);
  CHECK(pruned_count(0, 0.5) == 0);
  CHECK(pruned_count(7, 1.0) == 7);
  CHECK(pruned_count(7, 0.0) == 0);
  CHECK_THROWS_WITH_AS(pruned_count(7, 1.5), doctest::Contains("outside [0, 1]"), error);
  CHECK_THROWS_AS(pruned_count(7, std::nan("")), error);
}

TEST_CASE("magnitude per tensor: exact counts, ties broken by index, biases kept") {
  const auto l = model();
  const auto w = tied_weights(l.total_size(), 3);
  for (double s : {0.0, 0.1, 0.5, 0.9, 0.99, 1.0}) {
    CAPTURE(s);
    const auto masks =
        magnitude_pruning{}.compute(l, std::span<const float>(w), s, matrix_tensors(l));
    REQUIRE(masks.size() == 4);
    for (std::size_t i = 0; i < 4; ++i) {
      const auto& t = l.tensor(i);
      if (t.rows == 0) {
        CHECK(masks[i].count() == t.size);
        continue;
      }
      CHECK(masks[i].count() == t.size - pruned_count(t.size, s));
      CHECK(bits(masks[i]) ==
            reference_keep(std::span<const float>(w).subspan(t.offset, t.size), masks[i].count()));
    }
  }
}

TEST_CASE("magnitude global: one threshold across tensors") {
  const auto l = model();
  auto w = test::values<float>(l.total_size(), 8);
  // fc2.weight gets tiny weights: global pruning takes them first.
  for (std::size_t j = 0; j < 300; ++j)
    w[l.tensor(2).offset + j] = 1e-3f * static_cast<float>(j % 7 + 1);
  const auto prunable = matrix_tensors(l);
  const auto masks =
      magnitude_pruning{pruning_scope::global}.compute(l, std::span<const float>(w), 0.3, prunable);
  const std::size_t total = 510 + 300;
  CHECK(masks[0].count() + masks[2].count() == total - pruned_count(total, 0.3));
  CHECK(masks[2].count() == 57);  // all 243 pruned entries come from fc2.weight
  CHECK(masks[0].count() == 510);
  CHECK(masks[1].count() == 30);
}

TEST_CASE("magnitude global equals ranking every prunable entry together") {
  // Tensors at offsets and of sizes that are no multiple of 64, a tensor that is not
  // prunable between prunable ones, ties everywhere, and more than 4096 entries (the radix
  // selection).
  param_layout l;
  l.add("a", 50, 101).add("bias", 7).add("b", 130).add("c", 64 * 70 + 3).add("empty", 0);
  const std::vector<bool> prunable{true, false, true, true, true};
  const auto w = tied_weights(l.total_size(), 11);
  std::vector<float> together;  // the prunable entries in flat order
  for (std::size_t i = 0; i < l.tensor_count(); ++i) {
    if (!prunable[i]) continue;
    const auto& t = l.tensor(i);
    together.insert(together.end(), w.begin() + t.offset, w.begin() + t.offset + t.size);
  }
  for (double s : {0.0, 0.37, 0.9, 1.0}) {
    CAPTURE(s);
    const auto masks =
        magnitude_pruning{pruning_scope::global}.compute(l, std::span<const float>(w), s, prunable);
    const auto ref = reference_keep(together, together.size() - pruned_count(together.size(), s));
    std::vector<bool> got;
    for (std::size_t i = 0; i < l.tensor_count(); ++i) {
      if (!prunable[i]) {
        CHECK(masks[i].count() == l.tensor(i).size);
        continue;
      }
      const auto b = bits(masks[i]);
      got.insert(got.end(), b.begin(), b.end());
    }
    CHECK(got == ref);
  }
}

TEST_CASE("magnitude pruning of double weights keeps what float's does (64-bit keys)") {
  // The same tied values as double: the radix selection and its last pass run on 64-bit keys.
  param_layout l;
  l.add("a", 50, 101).add("b", 130).add("c", 64 * 70 + 3);
  const auto w = tied_weights(l.total_size(), 13);
  const std::vector<double> wd(w.begin(), w.end());
  const std::vector<bool> prunable{true, true, true};
  for (const auto scope : {pruning_scope::per_tensor, pruning_scope::global}) {
    for (double s : {0.0, 0.37, 0.9, 1.0}) {
      CAPTURE(s);
      const magnitude_pruning p{scope};
      CHECK(p.compute(l, std::span<const double>(wd), s, prunable) ==
            p.compute(l, std::span<const float>(w), s, prunable));
    }
  }
}

TEST_CASE("N:M keeps N of every M along rows") {
  param_layout l;
  l.add("w", 6, 11).add("v", 13);  // rows of 11: groups 4, 4, 3
  const auto w = tied_weights(l.total_size(), 5);
  const auto masks = nm_pruning(2, 4).compute(l, std::span<const float>(w), 0.5, {true, true});
  for (std::size_t r = 0; r < 6; ++r) {
    for (std::size_t g0 = 0; g0 < 11; g0 += 4) {
      const std::size_t g = std::min<std::size_t>(4, 11 - g0);
      std::size_t kept = 0;
      for (std::size_t j = 0; j < g; ++j) kept += masks[0].test(r * 11 + g0 + j);
      CHECK(kept == 2);
      // The kept ones are the largest in the group (ties by index).
      const auto ref = reference_keep(std::span<const float>(w).subspan(r * 11 + g0, g), 2);
      for (std::size_t j = 0; j < g; ++j) CHECK(masks[0].test(r * 11 + g0 + j) == ref[j]);
    }
  }
  CHECK(masks[1].count() == 2 + 2 + 2 + 1);  // 13 = 4 + 4 + 4 + 1: the last group keeps min(2, 1)
  CHECK(nm_pruning(1, 4).compute(l, std::span<const float>(w), 0.0, {true, true})[0].count() == 66);
  CHECK_THROWS_WITH_AS(nm_pruning(5, 4), doctest::Contains("0 < N <= M"), error);
  CHECK_THROWS_AS(nm_pruning(0, 4), error);
}

TEST_CASE("block magnitude keeps whole blocks with the largest mean |w|") {
  param_layout l;
  l.add("w", 100).add("b", 5);
  std::vector<float> w(105, 0.0f);
  for (std::size_t b = 0; b < 7; ++b) {
    const std::size_t end = std::min<std::size_t>(100, (b + 1) * 16);
    for (std::size_t j = b * 16; j < end; ++j)
      w[j] = static_cast<float>(b % 3);  // ties across blocks
  }
  w[99] = 50.0f;  // the short last block (96..99) has the largest mean
  const auto masks =
      block_magnitude_pruning<16>{}.compute(l, std::span<const float>(w), 0.5, {true, false});
  // 7 blocks, 4 pruned (3.5 rounds up), 3 kept: the last block, then blocks 2 and 5 (value
  // 2, ties by index; the last block also ties by mean with none).
  CHECK(masks[0].blocks().count() == 3);
  CHECK(masks[0].blocks().test(6));
  CHECK(masks[0].blocks().test(2));
  CHECK(masks[0].blocks().test(5));
  CHECK(masks[0].count() == 16 + 16 + 4);
  CHECK(masks[1].count() == 5);
}

TEST_CASE("random pruning: exact counts, seed-determined") {
  const auto l = model();
  const auto w = test::values<float>(l.total_size(), 1);
  const auto a = random_pruning{7}.compute(l, std::span<const float>(w), 0.8, matrix_tensors(l));
  const auto b = random_pruning{7}.compute(
      l, std::span<const float>(test::values<float>(l.total_size(), 2)), 0.8, matrix_tensors(l));
  const auto c = random_pruning{8}.compute(l, std::span<const float>(w), 0.8, matrix_tensors(l));
  CHECK(a == b);  // the weights do not matter
  CHECK(a != c);
  CHECK(a[0].count() == 510 - pruned_count(510, 0.8));
}

TEST_CASE("policies reject bad input") {
  const auto l = model();
  auto w = test::values<float>(l.total_size(), 1);
  const auto p = matrix_tensors(l);
  CHECK_THROWS_WITH_AS(magnitude_pruning{}.compute(l, std::span<const float>(w).first(5), 0.5, p),
                       doctest::Contains("weight buffer has 5 entries"), error);
  CHECK_THROWS_WITH_AS(magnitude_pruning{}.compute(l, std::span<const float>(w), 0.5, {true}),
                       doctest::Contains("1 prunable flags for 4 tensors"), error);
  w[l.tensor(2).offset + 3] = std::nanf("");
  CHECK_THROWS_WITH_AS(magnitude_pruning{}.compute(l, std::span<const float>(w), 0.5, p),
                       doctest::Contains("weight 3 of tensor 'fc2.weight' is not finite"), error);
  w[l.tensor(2).offset + 3] = 0;
  w[l.tensor(1).offset] = INFINITY;  // a bias: not prunable, not inspected
  CHECK_NOTHROW(magnitude_pruning{}.compute(l, std::span<const float>(w), 0.5, p));
}

TEST_CASE("gradual schedule follows the cubic formula, with a dense warm-up") {
  const gradual_schedule g{.initial_sparsity = 0.1,
                           .final_sparsity = 0.9,
                           .start_step = 100,
                           .interval = 10,
                           .updates = 8};
  g.validate();
  for (std::uint64_t t = 0; t < 100; ++t) {
    CHECK(g.sparsity_at(t) == 0.0);
    CHECK_FALSE(g.is_update_step(t));
  }
  for (std::uint64_t t = 100; t <= 200; ++t) {
    const double f = std::min(1.0, (static_cast<double>(t) - 100.0) / 80.0);
    const double want = 0.9 + (0.1 - 0.9) * std::pow(1.0 - f, 3);
    CHECK(g.sparsity_at(t) == doctest::Approx(want).epsilon(1e-12));
    CHECK(g.is_update_step(t) == (t <= 180 && t % 10 == 0));
  }
  CHECK(g.sparsity_at(100) == doctest::Approx(0.1));
  CHECK(g.sparsity_at(180) == 0.9);
  CHECK(g.sparsity_at(100000) == 0.9);
  CHECK_THROWS_AS((gradual_schedule{.initial_sparsity = 0.5, .final_sparsity = 0.4}.validate()),
                  error);
  CHECK_THROWS_AS((gradual_schedule{.interval = 0}.validate()), error);
  const one_shot_schedule o{.step = 5, .sparsity = 0.7};
  CHECK(o.sparsity_at(4) == 0.0);
  CHECK(o.sparsity_at(5) == 0.7);
  CHECK(o.is_update_step(5));
  CHECK_FALSE(o.is_update_step(6));
}

TEST_CASE("apply_masks: kept entries untouched, pruned ones +0, bitmap and run by run alike") {
  for (const std::size_t n : test::sizes) {
    for (const double d : test::densities) {
      CAPTURE(n);
      CAPTURE(d);
      param_layout l;
      l.add("t", n);
      const auto m = test::random_mask(n, d, 3);
      auto x = test::values<float>(n, 6);
      for (std::size_t i = 0; i < n; i += 5) x[i] = i % 2 == 0 ? -0.0f : std::nanf("");
      const auto original = x;
      auto by_runs = x;
      apply_masks(l, std::vector<bitmap_mask>{m}, std::span<float>(x));
      apply_masks(l, std::vector<index_mask>{index_mask::from_mask(m)}, std::span<float>(by_runs));
      std::size_t wrong = 0;
      for (std::size_t i = 0; i < n; ++i) {
        const auto before = std::bit_cast<std::uint32_t>(by_runs[i]);
        const auto after = std::bit_cast<std::uint32_t>(x[i]);
        const auto kept = std::bit_cast<std::uint32_t>(original[i]);
        wrong += after != before || after != (m.test(i) ? kept : 0U);
      }
      CHECK(wrong == 0);
    }
  }
}

TEST_CASE("the pruner commits masks at update steps; apply_masks zeroes weights and momentum") {
  const auto l = model();
  loop_sync s{loopback_communicator{}, l};
  pruner pr{magnitude_pruning{},
            gradual_schedule{.final_sparsity = 0.8, .start_step = 3, .interval = 2, .updates = 2},
            matrix_tensors(l)};
  auto w = test::values<float>(l.total_size(), 4);
  auto momentum = test::values<float>(l.total_size(), 5);
  std::vector<bool> updated;
  for (int t = 0; t < 10; ++t) {
    updated.push_back(pr.step(s, std::span<const float>(w)));
    apply_masks(l, s.masks(), std::span<float>(w));
    apply_masks(l, s.masks(), std::span<float>(momentum));
  }
  CHECK(updated ==
        std::vector<bool>{false, false, false, true, false, true, false, true, false, false});
  CHECK(pr.current_step() == 10);
  CHECK(pr.current_sparsity() == 0.8);
  CHECK(s.masks()[0].count() == 510 - pruned_count(510, 0.8));
  for (std::size_t i = 0; i < l.tensor_count(); ++i) {
    for (std::size_t j = 0; j < l.tensor(i).size; ++j) {
      if (!s.masks()[i].test(j)) {
        CHECK(w[l.tensor(i).offset + j] == 0.0f);
        CHECK(momentum[l.tensor(i).offset + j] == 0.0f);
      }
    }
  }
  CHECK_THROWS_WITH_AS(apply_masks(l, s.masks(), std::span<float>(w).first(3)),
                       doctest::Contains("buffer has 3"), error);
}

TEST_CASE("checkpoints resume with bit-identical masks; bad ones are rejected") {
  const auto l = model();
  const auto sched =
      gradual_schedule{.final_sparsity = 0.9, .start_step = 0, .interval = 3, .updates = 4};
  auto w = test::values<float>(l.total_size(), 6);
  loop_sync a{loopback_communicator{}, l};
  pruner pa{magnitude_pruning{}, sched, matrix_tensors(l)};
  for (int t = 0; t < 5; ++t) pa.step(a, std::span<const float>(w));
  const auto ckpt = pa.save(a);

  loop_sync b{loopback_communicator{}, l};
  pruner pb{magnitude_pruning{}, sched, matrix_tensors(l)};
  pb.load(b, ckpt);
  CHECK(pb.current_step() == 5);
  CHECK(pb.current_sparsity() == pa.current_sparsity());
  CHECK(b.masks() == a.masks());
  for (int t = 5; t < 14; ++t) {
    for (auto& x : w) x *= 0.999f;
    pa.step(a, std::span<const float>(w));
    pb.step(b, std::span<const float>(w));
    CHECK(b.masks() == a.masks());
  }

  loop_sync c{loopback_communicator{}, l};
  pruner pc{magnitude_pruning{}, sched, matrix_tensors(l)};
  auto bad = ckpt;
  bad[60] ^= std::byte{1};
  CHECK_THROWS_WITH_AS(pc.load(c, bad), doctest::Contains("checksum mismatch"), error);
  bad = ckpt;
  bad.resize(bad.size() - 9);
  CHECK_THROWS_AS(pc.load(c, bad), error);
  CHECK_THROWS_WITH_AS(pc.load(c, std::span<const std::byte>(ckpt).first(20)),
                       doctest::Contains("truncated"), error);
  // A nonzero reserved field behind a valid checksum: save() would not give these bytes back.
  bad = ckpt;
  bad[14] = std::byte{1};
  const std::size_t body = bad.size() - 8;
  const std::uint64_t sum = detail::checksum(std::span<const std::byte>(bad).first(body));
  for (int k = 0; k < 8; ++k) bad[body + k] = static_cast<std::byte>((sum >> (8 * k)) & 0xff);
  CHECK_THROWS_WITH_AS(pc.load(c, bad), doctest::Contains("reserved field 65536 where 0"), error);
  CHECK(pc.current_step() == 0);
  CHECK(c.masks()[0].count() == 510);  // unchanged

  param_layout other(500);
  other.add("fc1.weight", 30, 17).add("fc1.bias", 30).add("fc2.weight", 10, 31).add("fc2.bias", 10);
  loop_sync d{loopback_communicator{}, other};
  pruner pd{magnitude_pruning{}, sched, matrix_tensors(other)};
  CHECK_THROWS_WITH_AS(pd.load(d, ckpt), doctest::Contains("does not fit the layout"), error);
}

TEST_CASE("block policies drive block-mask engines") {
  param_layout l;
  l.add("w", 40, 50).add("b", 40);
  pactrain::sync<loopback_communicator, identity_codec<float>, block_mask<32>> s{
      loopback_communicator{}, l};
  pruner pr{block_magnitude_pruning<32>{}, one_shot_schedule{.step = 0, .sparsity = 0.75},
            matrix_tensors(l)};
  auto w = test::values<float>(l.total_size(), 2);
  CHECK(pr.step(s, std::span<const float>(w)));
  CHECK(s.masks()[0].blocks().count() == 63 - pruned_count(63, 0.75));
  CHECK(s.masks()[1].count() == 40);
}

// The keep highest of n scores (score descending, index ascending), by sorting: the reference.
template <class S>
std::vector<bool> top_by_sort(const std::vector<S>& score, std::size_t keep) {
  std::vector<std::size_t> idx(score.size());
  for (std::size_t i = 0; i < idx.size(); ++i) idx[i] = i;
  std::stable_sort(idx.begin(), idx.end(),
                   [&](std::size_t a, std::size_t b) { return score[a] > score[b]; });
  std::vector<bool> kept(score.size(), false);
  for (std::size_t k = 0; k < keep; ++k) kept[idx[k]] = true;
  return kept;
}

template <class S>
void check_selection(const std::vector<S>& score) {
  const std::size_t n = score.size();
  for (const std::size_t keep : {std::size_t{0}, std::size_t{1}, n / 10, n / 2, n - 1, n}) {
    const auto words =
        pactrain::detail::top_words(n, keep, [&](std::size_t i) { return score[i]; });
    const auto want = top_by_sort(score, keep);
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < n; ++i)
      wrong += (((words[i / 64] >> (i % 64)) & 1U) != 0) != want[i];
    CHECK_MESSAGE(wrong == 0, "n " << n << ", keep " << keep);
  }
}

TEST_CASE("selection of the highest scores: radix (large n) and nth_element agree with a sort") {
  for (const std::size_t n :
       {std::size_t{100}, std::size_t{4095}, std::size_t{4096}, std::size_t{70001}}) {
    std::vector<float> f(n);
    std::vector<double> d(n);
    std::vector<std::uint64_t> u(n);
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint64_t h = test::mix(i);
      f[i] = static_cast<float>(h % 1000) / 8.0f;  // many ties
      if (i % 7 == 0) f[i] = -f[i];                // negatives order below; -0 ties with +0
      d[i] = static_cast<double>(h % 100003) * 1e-3;
      u[i] = h % 17 == 0 ? 5 : h;  // ties among 64-bit keys
    }
    check_selection(f);
    check_selection(d);
    check_selection(u);
  }
  // Radix selection digit by digit: all keys equal (no digit narrows them down), and keys that
  // differ only in their lowest bits (every digit of the threshold is needed).
  const std::size_t n = 9000;
  check_selection(std::vector<float>(n, 0.5f));
  std::vector<float> close(n);
  std::vector<std::uint64_t> close_u(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint64_t h = test::mix(i);
    close[i] =
        std::bit_cast<float>(std::uint32_t{0x3f800000} + static_cast<std::uint32_t>(h % 700));
    close_u[i] = (std::uint64_t{1} << 63) + h % 300;
  }
  check_selection(close);
  check_selection(close_u);
}
