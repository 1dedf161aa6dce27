// The non-finite policy: an Inf or NaN in one rank's gradient (or an fp16 overflow) comes back
// non-finite on every rank for its bucket, is counted alike in stats(), and leaves the engine's
// state (residuals, scales, step counter) as it was, so the steps after it are bit for bit
// those of a run that never had the bad step. Every codec, feedback policy, scale source and
// strategy; flat buffers with allreduce and per-tensor buffers with the three-phase step.
//
// Every rank runs every test case; CHECK (not REQUIRE) before collectives.
#include <doctest/doctest.h>

#include <pactrain/mpi.hpp>
#include <pactrain/pactrain.hpp>

#include "common/mpi_helpers.hpp"
#include "common/test_data.hpp"

#include <mpi.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

using namespace pactrain;

namespace {

using test::same_bits;
using test::same_on_every_rank;
using test::world_rank;
using test::world_size;

constexpr float inf = std::numeric_limits<float>::infinity();
constexpr float qnan = std::numeric_limits<float>::quiet_NaN();

template <class Codec>
using engine_of = pactrain::sync<mpi_communicator, Codec>;

constexpr bucket_strategy all_strategies[] = {bucket_strategy::sparse, bucket_strategy::dense,
                                              bucket_strategy::sparse_plain,
                                              bucket_strategy::dense_plain};

// How a step is handed over: one flat allreduce, or per-tensor spans through the three-phase
// step with the buckets submitted in reverse order (the last one left to finish_step).
enum class call { flat, three_phase };

template <class Engine>
void run_step(Engine& e, std::vector<float>& g, call how) {
  if (how == call::flat) {
    e.allreduce(std::span<float>(g));
    return;
  }
  std::vector<std::span<float>> views;
  for (const auto& t : e.layout().tensors()) views.emplace_back(g.data() + t.offset, t.size);
  e.begin_step(std::span<const std::span<float>>(views));
  const std::size_t nb = e.layout().buckets().size();
  for (std::size_t b = nb; b-- > 1;) e.submit_bucket(b);
  e.finish_step();
}

std::vector<float> gradient(std::size_t n, std::uint64_t step) {
  return test::spread_values(n, step, static_cast<std::uint64_t>(world_rank()));
}

std::size_t bucket_of(const param_layout& l, std::size_t tensor) {
  for (std::size_t b = 0; b < l.buckets().size(); ++b) {
    const auto& bk = l.buckets()[b];
    if (tensor >= bk.first_tensor && tensor < bk.first_tensor + bk.tensor_count) return b;
  }
  return l.buckets().size();
}

// The flat index of the first entry of `tensor` that `masks` keeps (or prunes).
std::size_t entry(const param_layout& l, const std::vector<bitmap_mask>& masks, std::size_t tensor,
                  bool kept) {
  const auto& t = l.tensor(tensor);
  for (std::size_t j = 0; j < t.size; ++j) {
    if (masks[tensor].test(j) == kept) return t.offset + j;
  }
  return l.total_size();
}

// Two engines with the same masks and strategy: one meets the bad step, the other does not.
template <class Engine>
struct twins {
  template <class Make>
  twins(Make&& make, bucket_strategy st) : a(make(layout)), b(make(layout)) {
    for (Engine* e : {&a, &b}) {
      e->set_masks(masks);
      e->set_strategies(std::vector<bucket_strategy>(layout.buckets().size(), st));
    }
  }
  param_layout layout = test::small_layout();
  std::vector<bitmap_mask> masks = test::masks_for<bitmap_mask>(layout, 0.5, 7);
  Engine a;
  Engine b;
};

// A digest of which entries are non-finite: it must be the same on every rank.
std::uint64_t nonfinite_pattern(std::span<const float> g) {
  digest_builder d(1);
  for (std::size_t i = 0; i < g.size(); ++i) {
    if (!std::isfinite(g[i])) d.add(std::uint64_t{i});
  }
  return d.value();
}

// Runs engine `a` through steps 0, bad, 1, 2 and engine `b` through steps 0, 1, 2 (the same
// gradients), where the bad step is step 1's gradient with `bad` at a kept entry of tensor 0
// on the last rank. Checks the bad step's result and stats, then that a's state and results
// equal b's.
template <class Engine, class Make>
void check_policy(Make&& make, bucket_strategy st, float bad, call how) {
  twins<Engine> t(make, st);
  const auto& l = t.layout;
  const auto& masks = t.masks;
  Engine& a = t.a;
  Engine& b = t.b;
  const std::size_t n = l.total_size();
  const std::size_t at = entry(l, masks, 0, true);
  const std::size_t bad_bucket = bucket_of(l, 0);
  const bool last = world_rank() == world_size() - 1;

  auto g0a = gradient(n, 0);
  auto g0b = g0a;
  run_step(a, g0a, how);
  run_step(b, g0b, how);
  CHECK(same_bits(g0a, g0b));

  auto g = gradient(n, 1);
  if (last) g[at] = bad;
  run_step(a, g, how);
  CHECK(a.stats().nonfinite_buckets == 1);
  CHECK(a.stats().nonfinite_steps == 1);
  CHECK(same_on_every_rank(a.stats().nonfinite_buckets));
  CHECK_FALSE(std::isfinite(g[at]));
  CHECK(same_on_every_rank(nonfinite_pattern(g)));
  // Only the bad bucket is affected; pruned entries stay +0.
  for (std::size_t i = 0; i < l.tensor_count(); ++i) {
    const auto& t = l.tensor(i);
    for (std::size_t j = 0; j < t.size; ++j) {
      const float v = g[t.offset + j];
      if (!masks[i].test(j)) {
        CHECK(std::bit_cast<std::uint32_t>(v) == 0u);
      } else if (bucket_of(l, i) != bad_bucket) {
        CHECK(std::isfinite(v));
      }
    }
  }
  // The state is as it was before the bad step.
  CHECK(a.step() == b.step());
  CHECK(same_bits(a.residuals(), b.residuals()));
  CHECK(a.save_state() == b.save_state());

  for (std::uint64_t k = 1; k <= 2; ++k) {
    auto ga = gradient(n, k);
    auto gb = ga;
    run_step(a, ga, how);
    run_step(b, gb, how);
    CHECK(a.stats().nonfinite_buckets == 0);
    CHECK(same_bits(ga, gb));
  }
  CHECK(a.save_state() == b.save_state());
  CHECK(a.stats().nonfinite_steps == 1);
}

// A non-finite gradient at a pruned entry is not part of the masked sum: a finite step.
template <class Engine, class Make>
void check_pruned_entry_ignored(Make&& make, bucket_strategy st) {
  twins<Engine> t(make, st);
  const auto& l = t.layout;
  const auto& masks = t.masks;
  Engine& a = t.a;
  Engine& b = t.b;
  auto ga = gradient(l.total_size(), 0);
  auto gb = ga;
  ga[entry(l, masks, 0, false)] = qnan;
  ga[entry(l, masks, 3, false)] = inf;
  a.allreduce(std::span<float>(ga));
  b.allreduce(std::span<float>(gb));
  CHECK(a.stats().nonfinite_buckets == 0);
  CHECK(same_bits(ga, gb));
  CHECK(a.step() == 1);
}

template <class Engine, class Make>
void check_all(Make&& make, std::initializer_list<float> bads) {
  for (const auto st : all_strategies) {
    for (const float bad : bads) {
      // A finite value beyond the 16-bit range overflows only where the codec encodes it.
      if (std::isfinite(bad) && is_plain(st)) continue;
      for (const call how : {call::flat, call::three_phase}) {
        CAPTURE(to_string(st));
        CAPTURE(bad);
        CAPTURE(how == call::flat ? "flat" : "three-phase");
        check_policy<Engine>(make, st, bad, how);
      }
    }
    check_pruned_entry_ignored<Engine>(make, st);
  }
}

template <class Engine>
auto maker(typename Engine::codec_type codec = {}) {
  return [codec](const param_layout& l) {
    return Engine{mpi_communicator{MPI_COMM_WORLD}, l, codec};
  };
}

ternary_codec ternary(scale_source s, std::size_t block = 0) {
  return ternary_codec{{.seed = 5, .scale = s, .scale_block = block}};
}

}  // namespace

TEST_CASE("identity: an Inf or NaN comes back at its entry on every rank, the step is counted") {
  using E = engine_of<identity_codec<float>>;
  check_all<E>(maker<E>(), {inf, -inf, qnan});
}

TEST_CASE("fp16 with error feedback: an overflow poisons no residual") {
  using E = engine_of<error_feedback<fp16_codec>>;
  check_all<E>(maker<E>(), {1e5f, inf, qnan});
}

TEST_CASE("fp16 without feedback: an overflow comes back as Inf") {
  using E = engine_of<fp16_codec>;
  check_all<E>(maker<E>(), {1e5f, qnan});
}

TEST_CASE("ternary with error feedback: Inf and NaN leave residuals and scales as they were") {
  using E = engine_of<error_feedback<ternary_codec>>;
  for (const auto s : {scale_source::current_max, scale_source::previous_max}) {
    CAPTURE(to_string(s));
    check_all<E>(maker<E>(ternary(s)), {inf, qnan});
  }
  // With scale blocks, one bad block makes its whole bucket bad, alike on every rank.
  check_all<E>(maker<E>(ternary(scale_source::current_max, 16)), {qnan});
  check_all<E>(maker<E>(ternary(scale_source::previous_max, 16)), {inf});
}

TEST_CASE("ternary without feedback: a NaN is not hidden behind a finite result") {
  using E = engine_of<ternary_codec>;
  for (const auto s : {scale_source::current_max, scale_source::previous_max}) {
    CAPTURE(to_string(s));
    check_all<E>(maker<E>(ternary(s)), {qnan, -inf});
  }
}

TEST_CASE("ternary: the bad bucket comes back NaN at every kept entry, +0 at pruned ones") {
  const auto l = test::small_layout();
  const auto masks = test::masks_for<bitmap_mask>(l, 0.5, 7);
  using E = engine_of<error_feedback<ternary_codec>>;
  for (const auto s : {scale_source::current_max, scale_source::previous_max}) {
    CAPTURE(to_string(s));
    E e{mpi_communicator{MPI_COMM_WORLD}, l, ternary(s)};
    e.set_masks(masks);
    auto g = gradient(l.total_size(), 0);
    e.allreduce(std::span<float>(g));  // previous_max: the next step reuses this one's scales
    g = gradient(l.total_size(), 1);
    if (world_rank() == 0) g[entry(l, masks, 0, true)] = qnan;
    e.allreduce(std::span<float>(g));
    const auto& bk = l.buckets()[bucket_of(l, 0)];
    std::size_t nan_kept = 0, kept = 0;
    for (std::size_t i = bk.first_tensor; i < bk.first_tensor + bk.tensor_count; ++i) {
      const auto& t = l.tensor(i);
      for (std::size_t j = 0; j < t.size; ++j) {
        if (masks[i].test(j)) {
          ++kept;
          nan_kept += std::isnan(g[t.offset + j]);
        } else {
          CHECK(std::bit_cast<std::uint32_t>(g[t.offset + j]) == 0u);
        }
      }
    }
    CHECK(kept > 0);
    CHECK(nan_kept == kept);
  }
}

TEST_CASE("a state saved by this version never holds Inf or NaN, and bytes that do are refused") {
  const auto l = test::small_layout();
  using E = engine_of<error_feedback<ternary_codec>>;
  E e{mpi_communicator{MPI_COMM_WORLD}, l, ternary(scale_source::previous_max)};
  auto g = gradient(l.total_size(), 0);
  e.allreduce(std::span<float>(g));
  auto bytes = e.save_state();
  // The 4 bytes before the checksum are the last bucket's scale: an Inf there, sealed with
  // a valid checksum, is corrupt state all the same.
  const std::size_t body = bytes.size() - 8;
  const std::uint32_t inf_bits = std::bit_cast<std::uint32_t>(inf);
  for (std::size_t k = 0; k < 4; ++k) {
    bytes[body - 4 + k] = static_cast<std::byte>((inf_bits >> (8 * k)) & 0xff);
  }
  const std::uint64_t sum = detail::checksum(std::span<const std::byte>(bytes).first(body));
  for (std::size_t k = 0; k < 8; ++k)
    bytes[body + k] = static_cast<std::byte>((sum >> (8 * k)) & 0xff);
  E f{mpi_communicator{MPI_COMM_WORLD}, l, ternary(scale_source::previous_max)};
  const std::string what = test::error_of([&] { f.load_state(bytes); });
  CHECK(what.find("is not finite") != std::string::npos);
  CHECK(f.step() == 0);
}
