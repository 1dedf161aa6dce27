// The tuners: step_tuner's turns and median, and strategy_tuner driving a sync engine through
// the planner's candidates to the fastest, on one rank.
#include <doctest/doctest.h>

#include <pactrain/pactrain.hpp>
#include <pactrain/planner.hpp>
#include <pactrain/tuner.hpp>

#include "common/cost_models.hpp"
#include "common/test_data.hpp"

#include <vector>

using namespace pactrain;

using test::slow_link;

TEST_CASE("step_tuner: candidates in turn, then the lowest median") {
  loopback_communicator comm;
  step_tuner t(3, 3);
  // Times per candidate, in turn: 0 is steady at 5; 1 has one fast outlier (median 4);
  // 2 is the fastest but for one slow outlier (median 2).
  const double times[9] = {5, 9, 2, 5, 1, 2, 5, 4, 30};
  for (int i = 0; i < 9; ++i) {
    CHECK(t.tuning());
    CHECK(t.current() == static_cast<std::size_t>(i % 3));
    CHECK_THROWS_WITH_AS((void)t.best(), doctest::Contains("still tuning"), pactrain::error);
    t.record(comm, times[i]);
  }
  CHECK_FALSE(t.tuning());
  CHECK(t.best() == 2);
  CHECK(t.current() == 2);
  CHECK(t.median(0) == 5.0);
  CHECK(t.median(1) == 4.0);
  CHECK(t.median(2) == 2.0);
  t.record(comm, 100);  // after tuning: ignored
  CHECK(t.best() == 2);
  // Equal medians keep the first; one candidate needs no comparison.
  step_tuner e(2, 1);
  e.record(comm, 1.0);
  e.record(comm, 1.0);
  CHECK(e.best() == 0);
  step_tuner one(1, 2);
  CHECK(one.median(0) == std::numeric_limits<double>::infinity());
  one.record(comm, 3.0);
  one.record(comm, 4.0);
  CHECK(one.best() == 0);
  // Bad input: refused, nothing recorded.
  CHECK_THROWS_WITH_AS(step_tuner(0), doctest::Contains("at least one candidate"), pactrain::error);
  CHECK_THROWS_WITH_AS(step_tuner(2, 0), doctest::Contains("trials must be >= 1"), pactrain::error);
  step_tuner b(2, 1);
  CHECK_THROWS_WITH_AS(b.record(comm, NAN), doctest::Contains("finite and >= 0"), pactrain::error);
  CHECK_THROWS_AS(b.record(comm, -1.0), pactrain::error);
  CHECK(b.current() == 0);
  CHECK(b.median(0) == std::numeric_limits<double>::infinity());
  CHECK_THROWS_AS((void)b.median(2), pactrain::error);
}

TEST_CASE("strategy_tuner drives an engine through its candidates and keeps one") {
  loopback_communicator comm;
  param_layout l(5000);
  l.add("big", 100, 100).add("small", 50);
  pactrain::sync<loopback_communicator, fp16_codec> s{comm, l};
  s.set_masks(test::masks_for<bitmap_mask>(l, 0.1, 3));
  using bs = bucket_strategy;
  const std::vector<std::vector<bs>> cands = {{bs::sparse_plain, bs::dense_plain},
                                              {bs::sparse, bs::dense}};
  strategy_tuner t(cands, 2);
  // Exactly representable in half, so both candidates give the same, exact result.
  const auto g0 = test::values<float>(l.total_size(), 5, 0);
  std::vector<float> want(g0.size());
  for (std::size_t i = 0; i < 4; ++i) {
    CHECK(t.tuning());
    const std::size_t c = t.tuner().current();
    auto g = g0;
    t.allreduce(s, std::span<float>(g));
    if (i < 3) CHECK(s.strategies() == cands[c]);
    if (i == 0) want = g;
    CHECK(g == want);
  }
  CHECK_FALSE(t.tuning());
  CHECK(s.strategies() == t.best());  // in force at once
  auto g = g0;
  t.allreduce(s, std::span<float>(g));
  CHECK(s.strategies() == t.best());
  CHECK(g == want);
  CHECK(s.stats().steps == 5);
  // New masks: a new tuner over new candidates, and the steps stay exact.
  s.set_masks(test::masks_for<bitmap_mask>(l, 0.5, 4));
  const auto shapes = bucket_shapes(s);
  t = strategy_tuner{candidate_strategies(slow_link(), 1, shapes, {.keep_within = 1e9}), 1};
  CHECK(t.tuning());
  const auto want2 = test::masked(l, s.masks(), g0);
  while (t.tuning()) {
    g = g0;
    t.allreduce(s, std::span<float>(g));
    CHECK(g == want2);
  }
  CHECK(s.strategies() == t.best());
  // Candidates must agree in length; a length the engine does not have fails there.
  CHECK_THROWS_WITH_AS(strategy_tuner({{bs::sparse}, {bs::sparse, bs::dense}}),
                       doctest::Contains("candidates have 1 and 2 strategies"), pactrain::error);
  CHECK_THROWS_AS(strategy_tuner(std::vector<std::vector<bs>>{}), pactrain::error);
  strategy_tuner wrong({{bs::sparse}});
  CHECK_THROWS_AS(wrong.begin_step(s), pactrain::error);
  CHECK(s.strategies() == t.best());
}
