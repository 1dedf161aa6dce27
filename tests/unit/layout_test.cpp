// param_layout: offsets, bucketing, digests and errors.
#include <doctest/doctest.h>

#include <pactrain/layout.hpp>

using namespace pactrain;

TEST_CASE("tensors are laid out back to back and bucketed greedily") {
  param_layout l(100);
  l.add("w1", 10, 6).add("b1", 10).add("w2", 150).add("empty", 0).add("b2", 30).add("b3", 70);
  CHECK(l.tensor_count() == 6);
  CHECK(l.total_size() == 320);
  CHECK(l.tensor(0).rows == 10);
  CHECK(l.tensor(0).cols == 6);
  CHECK(l.tensor(1).rows == 0);
  CHECK(l.tensor(2).offset == 70);
  CHECK(l.tensor(4).offset == 220);
  // w1+b1 = 70 fits; w2 (150) is larger than the capacity and gets its own bucket; the empty
  // tensor joins it; b2+b3 = 100 fits exactly.
  REQUIRE(l.buckets().size() == 3);
  CHECK(l.buckets()[0].tensor_count == 2);
  CHECK(l.buckets()[0].size == 70);
  CHECK(l.buckets()[1].first_tensor == 2);
  CHECK(l.buckets()[1].tensor_count == 2);
  CHECK(l.buckets()[1].size == 150);
  CHECK(l.buckets()[2].offset == 220);
  CHECK(l.buckets()[2].size == 100);
  CHECK(l.tensor(5).bucket == 2);
  CHECK(*l.find("b2") == 4);
  CHECK_FALSE(l.find("nope"));

  l.set_bucket_capacity(1);
  CHECK(l.buckets().size() == 5);  // the empty tensor shares w2's bucket
  l.set_bucket_capacity(1000);
  CHECK(l.buckets().size() == 1);
}

TEST_CASE("an empty layout has no buckets") {
  const param_layout l;
  CHECK(l.total_size() == 0);
  CHECK(l.buckets().empty());
}

TEST_CASE("digests follow names, shapes, order and bucketing") {
  const auto make = [] { return param_layout(64).add("a", 4, 4).add("b", 3); };
  CHECK(make().digest() == make().digest());
  CHECK(make() == make());
  CHECK(make().digest() != param_layout(64).add("a", 16).add("b", 3).digest());
  CHECK(make().digest() != param_layout(64).add("a", 4, 4).add("c", 3).digest());
  CHECK(make().digest() != param_layout(64).add("b", 3).add("a", 4, 4).digest());
  CHECK(make().digest() != param_layout(32).add("a", 4, 4).add("b", 3).digest());
  CHECK(make().digest() != param_layout(64).add("a", 4, 4).add("b", 4).digest());
}

TEST_CASE("bad layouts are rejected") {
  param_layout l;
  l.add("a", 3);
  CHECK_THROWS_WITH_AS(l.add("a", 4), doctest::Contains("duplicate tensor name 'a'"), error);
  CHECK_THROWS_WITH_AS(l.add("", 4), doctest::Contains("must not be empty"), error);
  CHECK_THROWS_WITH_AS(l.add("big", ~std::size_t{0} / 2, 4), doctest::Contains("overflows"), error);
  CHECK_THROWS_WITH_AS(l.set_bucket_capacity(0), doctest::Contains("must be positive"), error);
  CHECK_THROWS_WITH_AS((void)l.tensor(1), doctest::Contains("out of range"), error);
  CHECK(l.tensor_count() == 1);
  CHECK(l.total_size() == 3);
}
