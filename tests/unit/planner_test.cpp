// The adaptive planner: predictions, choices on synthetic cost models, calibration on one
// rank, and bad input.
#include <doctest/doctest.h>

#include <pactrain/pactrain.hpp>
#include <pactrain/planner.hpp>

#include "common/cost_models.hpp"
#include "common/test_data.hpp"

#include <limits>
#include <vector>

using namespace pactrain;

using test::fast_link;
using test::round_model;
using test::slow_link;

TEST_CASE("predictions follow the alpha-beta formulas") {
  cost_model m;
  m.latency = 1;
  m.seconds_per_byte = 0.5;
  m.compact_seconds_per_entry = 0.25;
  m.dense_seconds_per_entry = 0.125;
  // 2(P-1) alpha + 2(P-1)/P S beta = 6 + 1.5 * 8 * 0.5
  CHECK(predict_allreduce(m, 4, 8) == 12.0);
  CHECK(predict_allreduce(m, 1, 8) == 0.0);  // one rank: nothing crosses a link
  CHECK(predict_allreduce(m, 4, 0) == 0.0);  // no collective at all
  const auto c = predict(m, 2, {16, 4, 4});
  CHECK(c.dense_plain == 2 + 1.0 * 64 * 0.5 + 16 * 0.125);
  CHECK(c.sparse_plain == 2 + 1.0 * 16 * 0.5 + 16 * 0.25);
}

TEST_CASE("a slow link makes large pruned buckets sparse, small and dense ones stay dense") {
  const std::vector<bucket_shape> b = {
      {25'000'000, 2'500'000, 4},   // 90% sparsity: sparse
      {25'000'000, 25'000'000, 4},  // nothing pruned: dense
      {1000, 10, 4},                // below min_sparse_entries: dense
      {1 << 20, 0, 4},              // everything pruned: sparse (no collective at all)
      {0, 0, 4},                    // empty bucket: dense (nothing to gain)
  };
  const auto p = choose_strategies(slow_link(), 4, b);
  REQUIRE(p.strategies.size() == b.size());
  CHECK(p.strategies[0] == bucket_strategy::sparse);
  CHECK(p.strategies[1] == bucket_strategy::dense);
  CHECK(p.strategies[2] == bucket_strategy::dense);
  CHECK(p.strategies[3] == bucket_strategy::sparse);
  CHECK(p.strategies[4] == bucket_strategy::dense);
  CHECK(p.predicted_seconds < p.predicted_dense_plain_seconds);
  CHECK(p.costs[0].sparse_plain < 0.2 * p.costs[0].dense_plain);
}

TEST_CASE("a fast link or one rank keeps everything dense") {
  const std::vector<bucket_shape> b = {{25'000'000, 2'500'000, 4}, {1 << 20, 1 << 18, 4}};
  for (const auto& p :
       {choose_strategies(fast_link(), 4, b), choose_strategies(slow_link(), 1, b)}) {
    CHECK(p.strategies == std::vector<bucket_strategy>(2, bucket_strategy::dense));
    CHECK(p.predicted_seconds == p.predicted_dense_plain_seconds);
  }
}

TEST_CASE("the margin keeps marginal gains dense") {
  // Sparse saves about 3% here: below the default 5% margin, above a 1% one.
  cost_model m;
  m.seconds_per_byte = 1e-9;
  m.compact_seconds_per_entry = 0.97 * 4e-9 * 1.5 - 0.5 * 4e-9 * 1.5;
  const std::vector<bucket_shape> b = {{1 << 20, 1 << 19, 4}};
  const auto c = predict(m, 4, b[0]);
  CHECK(c.sparse_plain / c.dense_plain == doctest::Approx(0.97));
  CHECK(choose_strategies(m, 4, b).strategies[0] == bucket_strategy::dense);
  CHECK(choose_strategies(m, 4, b, {.margin = 0.01}).strategies[0] == bucket_strategy::sparse);
}

TEST_CASE("bad models and shapes are refused") {
  const std::vector<bucket_shape> ok = {{100, 10, 4}};
  auto m = slow_link();
  m.latency = -1;
  CHECK_THROWS_AS(choose_strategies(m, 4, ok), pactrain::error);
  m = slow_link();
  m.seconds_per_byte = std::numeric_limits<double>::quiet_NaN();
  CHECK_THROWS_AS(choose_strategies(m, 4, ok), pactrain::error);
  const std::vector<bucket_shape> too_many = {{100, 101, 4}};
  CHECK_THROWS_WITH_AS(choose_strategies(slow_link(), 4, too_many),
                       doctest::Contains("keeps more entries"), pactrain::error);
  const std::vector<bucket_shape> no_bytes = {{100, 10, 0}};
  CHECK_THROWS_AS(choose_strategies(slow_link(), 4, no_bytes), pactrain::error);
  CHECK_THROWS_AS(choose_strategies(slow_link(), 0, ok), pactrain::error);
  CHECK_THROWS_AS(choose_strategies(slow_link(), 4, ok, {.margin = 1.0}), pactrain::error);
  CHECK(choose_strategies(slow_link(), 4, std::vector<bucket_shape>{}).strategies.empty());
}

TEST_CASE("calibration on one rank, and a plan applied to a sync engine") {
  loopback_communicator comm;
  const auto m =
      calibrate(comm, {.large_bytes = 1 << 16, .compact_entries = 1 << 14, .repetitions = 2});
  CHECK(m.latency == 0.0);  // one rank: no link to measure
  CHECK(m.seconds_per_byte == 0.0);
  CHECK(m.compact_seconds_per_entry > 0.0);
  CHECK_NOTHROW(m.validate());
  CHECK_THROWS_AS(calibrate(comm, {.small_bytes = 64, .large_bytes = 64}), pactrain::error);
  CHECK_THROWS_AS(calibrate(comm, {.compact_density = 0}), pactrain::error);

  param_layout l(5000);
  l.add("big", 100, 100).add("small", 50).add("empty", 0);
  pactrain::sync<loopback_communicator> s{comm, l};
  s.set_masks(test::masks_for<bitmap_mask>(l, 0.1, 3));
  const auto shapes = bucket_shapes(s);
  REQUIRE(shapes.size() == l.buckets().size());
  CHECK(shapes[0].entries == 10000);
  CHECK(shapes[0].kept == s.payload_size(0));
  CHECK(shapes[0].value_bytes == sizeof(float));
  const auto p = choose_strategies(slow_link(), 4, shapes);
  s.set_strategies(p.strategies);
  CHECK(s.strategies() == p.strategies);
  CHECK(s.strategies()[0] == bucket_strategy::sparse);
}

TEST_CASE("with a codec the planner weighs the coded paths against the plain ones") {
  // 90% sparsity; ternary at 4 ranks: 8 lanes per word, so a coded entry costs 0.5 bytes.
  auto coded = [](std::size_t entries, std::size_t kept) {
    return bucket_shape{entries, kept, 4, true, (kept + 7) / 8 * 4, (entries + 7) / 8 * 4};
  };
  const std::vector<bucket_shape> b = {coded(25'000'000, 2'500'000), coded(1000, 100),
                                       coded(25'000'000, 25'000'000)};
  auto m = slow_link();
  m.codec_seconds_per_entry = 2e-9;
  const auto c = predict(m, 4, b[0]);
  // Coded: 1.25 MB on the wire plus 2 ns per kept entry, on top of the compaction.
  CHECK(c.sparse_coded == doctest::Approx(6 * m.latency + 1.5 * 1'250'000 * m.seconds_per_byte +
                                          25e6 * m.compact_seconds_per_entry + 2.5e6 * 2e-9));
  CHECK(c.dense_coded == doctest::Approx(predict_allreduce(m, 4, 12'500'000) +
                                         25e6 * (m.dense_seconds_per_entry + 2e-9)));
  // Slow link: the least bytes win; a small bucket stays plain dense.
  auto p = choose_strategies(m, 4, b);
  CHECK(p.strategies[0] == bucket_strategy::sparse);  // sparse through the codec
  CHECK(p.strategies[1] == bucket_strategy::dense_plain);
  CHECK(p.strategies[2] == bucket_strategy::dense);  // nothing pruned: coded dense
  // Encoding so slow that it does not pay: plain sparse.
  m.codec_seconds_per_entry = 200e-9;
  p = choose_strategies(m, 4, b);
  CHECK(p.strategies[0] == bucket_strategy::sparse_plain);
  CHECK(p.strategies[2] == bucket_strategy::dense_plain);
  // A fast link: plain dense everywhere.
  auto f = fast_link();
  f.codec_seconds_per_entry = 2e-9;
  CHECK(choose_strategies(f, 4, b).strategies ==
        std::vector<bucket_strategy>(3, bucket_strategy::dense_plain));
  // Without a codec the coded paths cost nothing to consider: they are infinite.
  const auto plain = predict(m, 4, {1000, 100, 4});
  CHECK(plain.sparse_coded == std::numeric_limits<double>::infinity());
  CHECK(plain.dense_coded == std::numeric_limits<double>::infinity());
}

TEST_CASE("calibration with a codec, and shapes of a codec engine") {
  loopback_communicator comm;
  const auto m =
      calibrate(comm, {.large_bytes = 1 << 16, .compact_entries = 1 << 14, .repetitions = 2},
                host_compactor{}, ternary_codec{});
  CHECK(m.codec_seconds_per_entry > 0.0);
  const auto plain =
      calibrate(comm, {.large_bytes = 1 << 16, .compact_entries = 1 << 14, .repetitions = 2});
  CHECK(plain.codec_seconds_per_entry == 0.0);
  // A link measured once is carried into each engine's model unchanged.
  const link_model link{.latency = 2.5e-5, .seconds_per_byte = 8e-9};
  const auto reused = calibrate_local(
      comm, link, {.large_bytes = 1 << 16, .compact_entries = 1 << 14, .repetitions = 2},
      host_compactor{}, fp16_codec{});
  CHECK(reused.latency == 2.5e-5);
  CHECK(reused.seconds_per_byte == 8e-9);
  CHECK(reused.codec_seconds_per_entry > 0.0);
  CHECK_THROWS_WITH_AS(calibrate_local(comm, link_model{.latency = -1}),
                       doctest::Contains("finite and >= 0"), pactrain::error);
  CHECK_THROWS_WITH_AS(calibrate_local(comm, link_model{.seconds_per_byte = NAN}),
                       doctest::Contains("finite and >= 0"), pactrain::error);
  CHECK(calibrate_link(comm, {.large_bytes = 1 << 16}).seconds_per_byte == 0.0);

  param_layout l(5000);
  l.add("big", 100, 100).add("small", 50);
  pactrain::sync<loopback_communicator, ternary_codec> s{comm, l};
  s.set_masks(test::masks_for<bitmap_mask>(l, 0.1, 3));
  const auto shapes = bucket_shapes(s);
  REQUIRE(shapes.size() == 2);
  CHECK(shapes[0].has_codec);
  // One rank: lanes of 2 bits, 16 per word.
  CHECK(shapes[0].coded_sparse_bytes == (s.payload_size(0) + 15) / 16 * 4);
  CHECK(shapes[0].coded_dense_bytes == (10000 + 15) / 16 * 4);
  CHECK(shapes[0].scale_round);  // current_max: the scale is reduced before encoding
  auto slow = slow_link();
  slow.codec_seconds_per_entry = 1e-9;
  // Coding 1000 entries saves about 45 us of link time, less than the scale round's 300 us.
  auto p = choose_strategies(slow, 4, shapes);
  s.set_strategies(p.strategies);
  CHECK(s.strategies()[0] == bucket_strategy::sparse_plain);
  CHECK(s.strategies()[1] == bucket_strategy::dense_plain);
  // Without the round (the previous step's scale) coding pays.
  auto no_round = shapes;
  for (auto& b : no_round) b.scale_round = false;
  p = choose_strategies(slow, 4, no_round);
  s.set_strategies(p.strategies);
  CHECK(s.strategies()[0] == bucket_strategy::sparse);
  CHECK(s.strategies()[1] == bucket_strategy::dense_plain);
}

TEST_CASE("a scale round before encoding must be paid for by the coded buckets together") {
  // Coding saves 1.5 * 0.875 * 1 MB * 1 ns = 1.3 ms of link time per bucket and costs
  // 0.25 ms of codec work; the scale round is one allreduce of 2(P-1) = 6 steps of 1 ms.
  const cost_model m = round_model();
  bucket_shape s{2'500'000, 250'000, 4, true, 125'000, 1'250'000};
  const auto c = predict(m, 4, s);
  CHECK(c.sparse_plain - c.sparse_coded == doctest::Approx(1.5 * 875'000e-9 - 250'000e-9));
  // Without a round: coded sparse. With it, one bucket does not pay for the round...
  CHECK(choose_strategies(m, 4, std::vector<bucket_shape>{s}).strategies[0] ==
        bucket_strategy::sparse);
  s.scale_round = true;
  auto p = choose_strategies(m, 4, std::vector<bucket_shape>{s});
  CHECK(p.strategies[0] == bucket_strategy::sparse_plain);
  CHECK(p.predicted_seconds == doctest::Approx(c.sparse_plain));
  // ... but ten buckets share one round and do.
  p = choose_strategies(m, 4, std::vector<bucket_shape>(10, s));
  CHECK(p.strategies == std::vector<bucket_strategy>(10, bucket_strategy::sparse));
  CHECK(p.predicted_seconds == doctest::Approx(10 * c.sparse_coded + predict_allreduce(m, 4, 80)));
}

TEST_CASE("predict_strategies prices any strategies, with one scale round for the coded buckets") {
  const cost_model m = round_model();
  const bucket_shape s{2'500'000, 250'000, 4, true, 125'000, 1'250'000, true};
  const std::vector<bucket_shape> b(3, s);
  const auto c = predict(m, 4, s);
  using bs = bucket_strategy;
  auto p = predict_strategies(m, 4, b, {bs::sparse, bs::dense, bs::sparse_plain});
  CHECK(p.predicted_seconds == doctest::Approx(c.sparse_coded + c.dense_coded + c.sparse_plain +
                                               predict_allreduce(m, 4, 16)));
  CHECK(p.predicted_dense_plain_seconds == doctest::Approx(3 * c.dense_plain));
  CHECK(p.costs.size() == 3);
  p = predict_strategies(m, 4, b, {bs::dense_plain, bs::sparse_plain, bs::sparse_plain});
  CHECK(p.predicted_seconds == doctest::Approx(c.dense_plain + 2 * c.sparse_plain));  // no round
  // It agrees with choose_strategies on choose_strategies' own choice.
  const auto chosen = choose_strategies(m, 4, b);
  CHECK(predict_strategies(m, 4, b, chosen.strategies).predicted_seconds ==
        doctest::Approx(chosen.predicted_seconds));
  // Without a codec, a coded strategy is the plain path.
  const std::vector<bucket_shape> plain = {{1000, 100, 4}};
  CHECK(predict_strategies(m, 4, plain, {bs::sparse}).predicted_seconds ==
        predict_strategies(m, 4, plain, {bs::sparse_plain}).predicted_seconds);
  CHECK_THROWS_WITH_AS(predict_strategies(m, 4, b, {bs::sparse}),
                       doctest::Contains("1 strategies for 3 buckets"), pactrain::error);
}

TEST_CASE(
    "candidate_strategies: the planner's choice first, then uniform plans within the factor") {
  using bs = bucket_strategy;
  auto m = slow_link();
  m.codec_seconds_per_entry = 2e-9;
  const bucket_shape big{25'000'000, 2'500'000, 4, true, 1'250'000, 12'500'000, false};
  const bucket_shape small{1000, 100, 4, true, 52, 500, false};
  const std::vector<bucket_shape> b = {big, small, big};
  const auto all = candidate_strategies(m, 4, b, {.keep_within = 1e9});
  REQUIRE(all.size() >= 2);
  CHECK(all[0].strategies == choose_strategies(m, 4, b).strategies);
  // Coded sparse everywhere is what the planner chose, so it is not repeated; the small
  // bucket stays plain dense in every plan.
  std::vector<std::vector<bs>> got;
  for (const auto& p : all) {
    got.push_back(p.strategies);
    CHECK(p.strategies[1] == bs::dense_plain);
    CHECK(p.predicted_seconds ==
          doctest::Approx(predict_strategies(m, 4, b, p.strategies).predicted_seconds));
  }
  // Per big bucket: coded sparse 45 ms, plain sparse 145 ms, coded dense 206 ms, plain
  // dense 1.2 s.
  CHECK(got == std::vector<std::vector<bs>>{{bs::sparse, bs::dense_plain, bs::sparse},
                                            {bs::sparse_plain, bs::dense_plain, bs::sparse_plain},
                                            {bs::dense, bs::dense_plain, bs::dense},
                                            {bs::dense_plain, bs::dense_plain, bs::dense_plain}});
  for (std::size_t i = 2; i < all.size(); ++i) {
    CHECK(all[i - 1].predicted_seconds <= all[i].predicted_seconds);
  }
  // The factor leaves out what is predicted far slower than the best: here all but the
  // first (plain sparse is 3.2 times slower).
  CHECK(candidate_strategies(m, 4, b).size() == 1);
  CHECK(candidate_strategies(m, 4, b, {.keep_within = 3.3}).size() == 2);
  CHECK(candidate_strategies(m, 4, b, {.keep_within = 1}).size() == 1);
  // Without a codec: the plain strategies only, named sparse and dense.
  const std::vector<bucket_shape> plain = {{25'000'000, 2'500'000, 4}};
  const auto pp = candidate_strategies(m, 4, plain, {.keep_within = 1e9});
  REQUIRE(pp.size() == 2);
  CHECK(pp[0].strategies == std::vector<bs>{bs::sparse});
  CHECK(pp[1].strategies == std::vector<bs>{bs::dense});
  CHECK_THROWS_WITH_AS(candidate_strategies(m, 4, b, {.keep_within = 0.5}),
                       doctest::Contains("keep_within"), pactrain::error);
  CHECK(candidate_strategies(m, 4, std::vector<bucket_shape>{}).size() == 1);
}
