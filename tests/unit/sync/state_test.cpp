// The engine's codec state across a checkpoint: save_state and load_state continue a run bit
// for bit, and refuse bytes that are corrupt or do not fit, changing nothing.
#include <doctest/doctest.h>

#include <pactrain/pactrain.hpp>

#include "common/test_data.hpp"

#include <bit>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

using namespace pactrain;

namespace {

using ternary_fb = pactrain::sync<loopback_communicator, error_feedback<ternary_codec>>;

param_layout state_layout() {
  param_layout l(3000);
  l.add("w1", 50, 41).add("b1", 50).add("w2", 10, 50).add("b2", 10);
  return l;
}

std::vector<float> gradient(std::size_t n, std::uint64_t step) {
  return test::spread_values(n, step, 2);
}

}  // namespace

using test::same_bits;

TEST_CASE("a restored engine continues bit for bit; a fresh one does not") {
  const auto l = state_layout();
  const auto masks = test::masks_for<bitmap_mask>(l, 0.3, 6);
  using bs = bucket_strategy;
  // One scale per bucket, and per block of 8 codec inputs (the saved scales are per block).
  for (const std::size_t block : {std::size_t{0}, std::size_t{8}}) {
    for (const auto source : {scale_source::current_max, scale_source::previous_max}) {
      CAPTURE(block);
      CAPTURE(to_string(source));
      const ternary_codec c{{.seed = 3, .scale = source, .scale_block = block}};
      ternary_fb a{loopback_communicator{}, l, c};
      a.set_masks(masks);
      std::vector<bs> st(l.buckets().size(), bs::sparse);
      st.back() = bs::dense;  // residuals of a dense bucket too
      a.set_strategies(st);
      for (std::uint64_t k = 0; k < 3; ++k) {
        auto g = gradient(l.total_size(), k);
        a.allreduce(std::span<float>(g));
      }
      const auto bytes = a.save_state();

      ternary_fb b{loopback_communicator{}, l, c};
      b.set_masks(masks);
      b.set_strategies(st);
      ternary_fb fresh{loopback_communicator{}, l, c};
      fresh.set_masks(masks);
      fresh.set_strategies(st);
      fresh.set_step(a.step());  // the step alone is not enough
      b.load_state(bytes);
      CHECK(b.step() == 3);
      CHECK(same_bits(b.residuals(), a.residuals()));
      CHECK(b.save_state() == bytes);
      for (std::uint64_t k = 3; k < 5; ++k) {
        auto ga = gradient(l.total_size(), k);
        auto gb = ga;
        auto gf = ga;
        a.allreduce(std::span<float>(ga));
        b.allreduce(std::span<float>(gb));
        fresh.allreduce(std::span<float>(gf));
        CHECK(same_bits(ga, gb));
        CHECK(same_bits(a.residuals(), b.residuals()));
        CHECK_FALSE(same_bits(ga, gf));
      }
      // Another scale granularity does not fit the saved state.
      ternary_fb other{loopback_communicator{}, l,
                       ternary_codec{{.seed = 3, .scale = source, .scale_block = block + 4}}};
      other.set_masks(masks);
      other.set_strategies(st);
      CHECK_THROWS_AS(other.load_state(bytes), error);
      CHECK(other.step() == 0);
    }
  }
}

TEST_CASE("load_state refuses corrupt or unfitting bytes and changes nothing") {
  const auto l = state_layout();
  const auto masks = test::masks_for<bitmap_mask>(l, 0.3, 6);
  const ternary_codec c{{.seed = 3, .scale = scale_source::previous_max}};
  ternary_fb a{loopback_communicator{}, l, c};
  a.set_masks(masks);
  for (std::uint64_t k = 0; k < 2; ++k) {
    auto g = gradient(l.total_size(), k);
    a.allreduce(std::span<float>(g));
  }
  const auto good = a.save_state();
  REQUIRE(good.size() == 64 + 4 * a.residuals().size() + 4 * l.buckets().size() + 8);

  ternary_fb b{loopback_communicator{}, l, c};
  b.set_masks(masks);
  {
    auto g = gradient(l.total_size(), 9);
    b.allreduce(std::span<float>(g));
  }
  const auto before = b.save_state();
  const auto refused = [&](std::vector<std::byte> bytes, const char* why) {
    CAPTURE(why);
    CHECK_THROWS_WITH_AS(b.load_state(bytes), doctest::Contains(why), error);
    CHECK(b.save_state() == before);
  };
  refused({}, "truncated");
  refused(std::vector<std::byte>(good.begin(), good.end() - 1), "does not match");
  auto longer = good;
  longer.push_back(std::byte{0});
  refused(longer, "does not match");
  auto magic = good;
  magic[0] = std::byte{'X'};
  refused(magic, "bad magic");
  auto version = good;
  version[8] = std::byte{3};
  refused(version, "unsupported format version 3");
  auto old_version = good;
  old_version[8] = std::byte{1};
  refused(old_version, "unsupported format version 1 (it does not record the saving rank)");
  auto flipped = good;
  flipped[70] ^= std::byte{1};  // a residual bit
  refused(flipped, "checksum mismatch");
  auto rank = good;
  rank[56] ^= std::byte{1};  // the saving rank: caught by the checksum first
  refused(rank, "checksum mismatch");
  auto count = good;
  count[40] = std::byte{0xff};  // residual count far beyond the bytes
  refused(count, "does not match");

  // Bytes of another configuration: other masks, strategies, codec settings.
  ternary_fb other{loopback_communicator{}, l, c};
  other.set_masks(test::masks_for<bitmap_mask>(l, 0.3, 7));
  refused(other.save_state(), "saved with other masks");
  ternary_fb dense{loopback_communicator{}, l, c};
  dense.set_masks(masks);
  dense.set_strategies(std::vector<bucket_strategy>(l.buckets().size(), bucket_strategy::dense));
  refused(dense.save_state(), "saved with other masks");
  ternary_fb seed{loopback_communicator{}, l, ternary_codec{{.seed = 4}}};
  seed.set_masks(masks);
  refused(seed.save_state(), "saved with other masks");

  // Not inside a step.
  auto g = gradient(l.total_size(), 1);
  b.begin_step(std::span<float>(g));
  CHECK_THROWS_WITH_AS(b.load_state(good), doctest::Contains("a step is open"), error);
  CHECK_THROWS_WITH_AS((void)b.save_state(), doctest::Contains("a step is open"), error);
  b.finish_step();
  CHECK_NOTHROW(b.load_state(good));
  CHECK(b.step() == 2);
}

TEST_CASE("state of engines without feedback or codec: the step counter") {
  const auto l = state_layout();
  pactrain::sync<loopback_communicator> s{loopback_communicator{}, l};
  s.set_step(77);
  const auto bytes = s.save_state();
  CHECK(bytes.size() == 72);  // header and checksum: no residuals, no scales
  pactrain::sync<loopback_communicator> t{loopback_communicator{}, l};
  t.load_state(bytes);
  CHECK(t.step() == 77);
  // fp16 without feedback: scales are kept (all zero), no residuals.
  pactrain::sync<loopback_communicator, fp16_codec> h{loopback_communicator{}, l};
  h.set_step(5);
  pactrain::sync<loopback_communicator, fp16_codec> h2{loopback_communicator{}, l};
  h2.load_state(h.save_state());
  CHECK(h2.step() == 5);
  // A float engine's state does not load into a double one.
  pactrain::sync<loopback_communicator, identity_codec<double>> d{loopback_communicator{}, l};
  CHECK_THROWS_WITH_AS(d.load_state(bytes), doctest::Contains("values of 4 bytes"), error);
  CHECK(d.step() == 0);
}
