// The sync engine on one rank (loopback): results, strategies, stats and bad input.
#include <doctest/doctest.h>

#include <pactrain/pactrain.hpp>

#include "common/test_data.hpp"

#include <string>
#include <vector>

using namespace pactrain;

TEST_CASE_TEMPLATE("one rank: the result is the masked gradient", Mask, bitmap_mask, index_mask) {
  const auto l = test::small_layout();
  using sync_t = pactrain::sync<loopback_communicator, identity_codec<float>, Mask>;
  sync_t s{loopback_communicator{}, l};
  CHECK(s.layout().buckets().size() == 3);
  for (double d : test::densities) {
    CAPTURE(d);
    const auto masks = test::masks_for<Mask>(l, d, 17);
    s.set_masks(masks);
    for (auto strategy : {bucket_strategy::sparse, bucket_strategy::dense}) {
      s.set_strategies(std::vector<bucket_strategy>(l.buckets().size(), strategy));
      auto g = test::values<float>(l.total_size(), 3);
      const auto want = test::masked(l, masks, g);
      s.allreduce(std::span<float>(g));
      CHECK(g == want);
      std::size_t kept = 0;
      for (const auto& m : masks) kept += m.count();
      const auto& st = s.stats();
      CHECK(st.dense_bytes == l.total_size() * sizeof(float));
      if (strategy == bucket_strategy::sparse) {
        CHECK(st.bytes_sent == kept * sizeof(float));
      } else {
        CHECK(st.bytes_sent == st.dense_bytes);
      }
    }
  }
}

TEST_CASE("double gradients through a block mask, tensors in separate buffers") {
  param_layout l(64);
  l.add("a", 100).add("b", 37).add("c", 64);
  using sync_t = pactrain::sync<loopback_communicator, identity_codec<double>, block_mask<8>>;
  sync_t s{loopback_communicator{}, l};
  std::vector<block_mask<8>> masks;
  for (const auto& t : l.tensors())
    masks.push_back(test::random_block_mask<8>(t.size, 0.5, t.size));
  s.set_masks(masks);
  for (auto strategy : {bucket_strategy::sparse, bucket_strategy::dense}) {
    s.set_strategies({strategy, bucket_strategy::sparse, strategy});
    std::vector<std::vector<double>> bufs;
    for (const auto& t : l.tensors()) bufs.push_back(test::values<double>(t.size, t.size));
    std::vector<std::span<double>> views;
    for (auto& b : bufs) views.emplace_back(b);
    s.allreduce(std::span<const std::span<double>>(views));
    for (std::size_t i = 0; i < bufs.size(); ++i) {
      const auto want = test::values<double>(l.tensor(i).size, l.tensor(i).size);
      for (std::size_t j = 0; j < bufs[i].size(); ++j) {
        CHECK(bufs[i][j] == (masks[i].test(j) ? want[j] : 0.0));
      }
    }
  }
}

TEST_CASE("a dense bucket whose tensors lie back to back around empty ones runs in place") {
  param_layout l(64);
  l.add("e0", 0).add("a", 7).add("e1", 0).add("c", 9).add("e2", 0);
  REQUIRE(l.buckets().size() == 1);
  pactrain::sync<loopback_communicator> s{loopback_communicator{}, l};
  std::vector<bitmap_mask> masks;
  for (const auto& t : l.tensors()) masks.push_back(test::random_mask(t.size, 0.5, t.size + 1));
  s.set_masks(masks);
  s.set_strategies({bucket_strategy::dense});
  auto g = test::values<float>(16, 5);
  const auto want = test::masked(l, masks, g);
  // a and c back to back in one buffer; the empty tensors anywhere (null, or elsewhere).
  float elsewhere = 0;
  const std::vector<std::span<float>> views = {{},
                                               std::span<float>(g).first(7),
                                               std::span<float>(&elsewhere, 0),
                                               std::span<float>(g).subspan(7),
                                               {}};
  s.allreduce(std::span<const std::span<float>>(views));
  CHECK(g == want);
}

TEST_CASE("a fully pruned model sends nothing and zeroes everything") {
  const auto l = test::small_layout();
  pactrain::sync<loopback_communicator> s{loopback_communicator{}, l};
  s.set_masks(test::masks_for<bitmap_mask>(l, 0.0, 1));
  auto g = test::values<float>(l.total_size(), 1);
  s.allreduce(g.data(), g.size());
  for (float v : g) CHECK(v == 0.0f);
  CHECK(s.stats().collectives == 0);
  CHECK(s.stats().bytes_sent == 0);
  CHECK(s.stats().steps == 1);
}

TEST_CASE("an empty layout is fine") {
  pactrain::sync<loopback_communicator> s{loopback_communicator{}, param_layout{}};
  s.allreduce(static_cast<float*>(nullptr), 0);
  CHECK(s.stats().steps == 1);
  CHECK(s.stats().collectives == 0);
}

TEST_CASE("bad input is rejected and changes nothing") {
  const auto l = test::small_layout();
  pactrain::sync<loopback_communicator> s{loopback_communicator{}, l};
  const auto masks = test::masks_for<bitmap_mask>(l, 0.5, 5);
  s.set_masks(masks);
  auto g = test::values<float>(l.total_size(), 2);
  const auto g0 = g;

  std::vector<float> shorter(l.total_size() - 1);
  CHECK_THROWS_WITH_AS(s.allreduce(std::span<float>(shorter)),
                       doctest::Contains("buffer has 783 entries, the layout 784"), error);
  CHECK_THROWS_WITH_AS(s.allreduce(static_cast<float*>(nullptr), 5),
                       doctest::Contains("null buffer"), error);
  std::vector<std::span<float>> views{std::span<float>(g).first(260)};
  CHECK_THROWS_WITH_AS(s.allreduce(std::span<const std::span<float>>(views)),
                       doctest::Contains("1 tensors given, the layout has 5"), error);
  views = {std::span<float>(g).first(260), std::span<float>(g).subspan(260, 19), {}, {}, {}};
  CHECK_THROWS_WITH_AS(s.allreduce(std::span<const std::span<float>>(views)),
                       doctest::Contains("tensor 'fc1.bias' has 19 entries, the layout 20"), error);
  CHECK(g == g0);

  auto wrong = masks;
  wrong[3] = bitmap_mask::full(10);
  CHECK_THROWS_WITH_AS(
      s.set_masks(wrong),
      doctest::Contains("mask of tensor 'fc2.weight' has 10 entries, the tensor 497"), error);
  wrong.pop_back();
  CHECK_THROWS_WITH_AS(s.set_masks(wrong), doctest::Contains("4 masks given for 5 tensors"), error);
  CHECK_THROWS_WITH_AS(s.set_strategies({bucket_strategy::dense}),
                       doctest::Contains("1 strategies given for 3 buckets"), error);
  CHECK(s.masks() == masks);  // the previous masks stay in force
  s.allreduce(std::span<float>(g));
  CHECK(g == test::masked(l, masks, g0));
}

TEST_CASE("the engine's compile-time rules") {
  struct nonlinear_codec {
    using value_type = float;
    using wire_type = float;
  };
  static_assert(gradient_codec<identity_codec<float>>);
  static_assert(gradient_codec<nonlinear_codec>);
  static_assert(!codec_traits<nonlinear_codec>::is_linear);
  static_assert(communicator<loopback_communicator>);
  static_assert(!communicator<int>);
  static_assert(!gradient_mask<int>);
  static_assert(compactor_for<host_compactor, index_mask, double>);
  static_assert(!compactor_for<host_compactor, bitmap_mask, int>);
}

TEST_CASE("the plain strategies of the identity codec are its sparse and dense paths") {
  const auto l = test::small_layout();
  pactrain::sync<loopback_communicator> s{loopback_communicator{}, l};
  const auto masks = test::masks_for<bitmap_mask>(l, 0.5, 9);
  s.set_masks(masks);
  std::size_t kept = 0;
  for (const auto& m : masks) kept += m.count();
  for (auto st : {bucket_strategy::sparse_plain, bucket_strategy::dense_plain}) {
    CAPTURE(to_string(st));
    s.set_strategies(std::vector<bucket_strategy>(l.buckets().size(), st));
    auto g = test::values<float>(l.total_size(), 4);
    const auto want = test::masked(l, masks, g);
    s.allreduce(std::span<float>(g));
    CHECK(g == want);
    CHECK(s.stats().bytes_sent ==
          (st == bucket_strategy::sparse_plain ? kept : l.total_size()) * sizeof(float));
  }
  CHECK(is_sparse(bucket_strategy::sparse_plain));
  CHECK_FALSE(is_sparse(bucket_strategy::dense_plain));
  CHECK(is_plain(bucket_strategy::dense_plain));
  CHECK_FALSE(is_plain(bucket_strategy::sparse));
  CHECK(std::string(to_string(bucket_strategy::dense_plain)) == "dense_plain");
}

TEST_CASE("a step in three phases: begin, submit buckets, finish") {
  const auto l = test::small_layout();
  pactrain::sync<loopback_communicator> s{loopback_communicator{}, l};
  const auto masks = test::masks_for<bitmap_mask>(l, 0.5, 11);
  s.set_masks(masks);
  s.set_strategies({bucket_strategy::sparse, bucket_strategy::dense, bucket_strategy::sparse});
  auto g = test::values<float>(l.total_size(), 6);
  const auto want = test::masked(l, masks, g);

  // Out of a step.
  CHECK_THROWS_WITH_AS(s.submit_bucket(0), doctest::Contains("no step is open"), error);
  CHECK_THROWS_WITH_AS(s.finish_step(), doctest::Contains("no step is open"), error);
  std::vector<float> shorter(l.total_size() - 1);
  CHECK_THROWS_WITH_AS(s.begin_step(std::span<float>(shorter)),
                       doctest::Contains("sync::begin_step: buffer has 783 entries"), error);
  CHECK_FALSE(s.step_open());

  s.begin_step(std::span<float>(g));
  CHECK(s.step_open());
  // Inside a step: nothing else may start, and a bad call changes nothing.
  CHECK_THROWS_WITH_AS(s.begin_step(std::span<float>(g)), doctest::Contains("a step is open"),
                       error);
  CHECK_THROWS_WITH_AS(s.allreduce(std::span<float>(g)), doctest::Contains("a step is open"),
                       error);
  CHECK_THROWS_WITH_AS(s.set_masks(masks), doctest::Contains("a step is open"), error);
  CHECK_THROWS_WITH_AS(s.submit_bucket(3), doctest::Contains("bucket 3 of 3"), error);
  s.submit_bucket(2);
  CHECK_THROWS_WITH_AS(s.submit_bucket(2), doctest::Contains("already submitted"), error);
  s.submit_bucket(0);
  CHECK(s.step_open());
  s.finish_step();  // submits bucket 1
  CHECK_FALSE(s.step_open());
  CHECK(g == want);
  CHECK(s.stats().steps == 1);
  CHECK(s.stats().collectives == 3);
  CHECK(s.masks() == masks);

  // Tensors in separate buffers; nothing submitted before finish.
  std::vector<std::vector<float>> bufs;
  for (const auto& t : l.tensors()) bufs.push_back(test::values<float>(t.size, t.size + 1));
  std::vector<std::span<float>> views;
  for (auto& b : bufs) views.emplace_back(b);
  s.begin_step(std::span<const std::span<float>>(views));
  views.clear();  // the engine keeps its own copy of the spans
  s.finish_step();
  for (std::size_t i = 0; i < bufs.size(); ++i) {
    const auto v = test::values<float>(l.tensor(i).size, l.tensor(i).size + 1);
    for (std::size_t j = 0; j < v.size(); ++j)
      CHECK(bufs[i][j] == (masks[i].test(j) ? v[j] : 0.0f));
  }
}

TEST_CASE("a codec engine rejects plain strategies only when the communicator cannot sum values") {
  const auto l = test::small_layout();
  pactrain::sync<loopback_communicator, ternary_codec> s{loopback_communicator{}, l};
  static_assert(decltype(s)::plain_supported);
  s.set_strategies(
      {bucket_strategy::dense_plain, bucket_strategy::sparse, bucket_strategy::sparse_plain});
  auto g = test::values<float>(l.total_size(), 7);
  const auto want = test::masked(l, s.masks(), g);
  s.allreduce(std::span<float>(g));
  // On one rank, plain buckets come back exact.
  for (std::size_t b : {0u, 2u}) {
    const auto& bk = l.buckets()[b];
    for (std::size_t i = bk.offset; i < bk.offset + bk.size; ++i) CHECK(g[i] == want[i]);
  }
  CHECK(s.residuals().empty());  // no feedback: no residuals
  CHECK_THROWS_WITH_AS(
      s.set_strategies({bucket_strategy::dense, bucket_strategy::dense,
                        bucket_strategy{static_cast<payload_kind>(7), encoding_kind::coded}}),
      doctest::Contains("is not one of sparse, dense"), error);
}
