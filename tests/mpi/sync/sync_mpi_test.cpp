// The sync engine over MPI on several ranks: bit-for-bit equality with a dense MPI_Allreduce
// of the masked gradients, and the agreement catching disagreement on every rank.
//
// Every rank runs every test case; CHECK (not REQUIRE) before collectives so that a failure
// on one rank never leaves the others waiting.
#include <doctest/doctest.h>

#include <pactrain/mpi.hpp>
#include <pactrain/pactrain.hpp>

#include "common/mpi_helpers.hpp"
#include "common/test_data.hpp"

#include <mpi.h>

#include <algorithm>
#include <cstddef>
#include <span>
#include <string>
#include <vector>

using namespace pactrain;

namespace {

using test::error_of;
using test::world_rank;
using test::world_size;

param_layout test_layout(std::size_t capacity = 2000) {
  param_layout l(capacity);
  l.add("conv.weight", 16, 75).add("conv.bias", 16).add("fc1.weight", 120, 33);
  l.add("unused", 0).add("fc1.bias", 120).add("fc2.weight", 10, 121).add("fc2.bias", 10);
  return l;
}

// The reference: mask each rank's gradient, MPI_Allreduce it densely, divide by P.
template <class T, class Mask>
std::vector<T> reference(const param_layout& l, const std::vector<Mask>& masks, std::vector<T> g) {
  g = test::masked(l, masks, std::move(g));
  MPI_Allreduce(MPI_IN_PLACE, g.data(), static_cast<int>(g.size()),
                std::is_same_v<T, float> ? MPI_FLOAT : MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  const T scale = T(1) / static_cast<T>(world_size());
  for (auto& v : g) v *= scale;
  return g;
}

template <class T>
std::size_t bad_entries(const std::vector<T>& a, const std::vector<T>& b) {
  std::size_t bad = 0;
  for (std::size_t i = 0; i < a.size(); ++i) bad += std::memcmp(&a[i], &b[i], sizeof(T)) != 0;
  return bad + (a.size() != b.size());
}

template <class Mask, class T>
void check_exact(std::size_t capacity) {
  const auto l = test_layout(capacity);
  pactrain::sync<mpi_communicator, identity_codec<T>, Mask> s{mpi_communicator{MPI_COMM_WORLD}, l};
  for (double d : test::densities) {
    CAPTURE(d);
    const auto masks = test::masks_for<Mask>(l, d, 100);
    s.set_masks(masks);
    for (auto strategy : {bucket_strategy::sparse, bucket_strategy::dense}) {
      s.set_strategies(std::vector<bucket_strategy>(l.buckets().size(), strategy));
      for (int step = 0; step < 2; ++step) {
        auto g = test::values<T>(l.total_size(), 40 + step, world_rank());
        const auto want = reference(l, masks, g);
        s.allreduce(std::span<T>(g));
        CHECK(bad_entries(g, want) == 0);
      }
      std::size_t kept = 0;
      for (const auto& m : masks) kept += m.count();
      if (strategy == bucket_strategy::sparse) {
        CHECK(s.stats().bytes_sent == kept * sizeof(T));
      } else {
        CHECK(s.stats().bytes_sent == l.total_size() * sizeof(T));
      }
    }
  }
}

// A plain float codec whose wire, on a rank that sets `extra`, is too large for any vector:
// its buffers cannot be built, after every check of the commit has passed.
struct oversized_codec {
  using value_type = float;
  using wire_type = float;
  static constexpr bool uses_scale = false;
  static inline std::size_t extra = 0;

  static std::size_t wire_size(std::size_t n, int) noexcept { return n + extra; }
  static void validate(int) {}
  static void encode(std::span<const float> in, std::span<float> wire, const codec_context&) {
    std::copy(in.begin(), in.end(), wire.begin());
  }
  static void decode(std::span<const float> wire, std::span<float> out, const codec_context& c) {
    for (std::size_t k = 0; k < out.size(); ++k) out[k] = wire[k] / static_cast<float>(c.size);
  }
  static void decode_local(std::span<const float> wire, std::span<float> out,
                           const codec_context&) {
    std::copy(wire.begin(), wire.begin() + static_cast<std::ptrdiff_t>(out.size()), out.begin());
  }
};

}  // namespace

template <>
struct pactrain::codec_traits<oversized_codec> {
  static constexpr bool is_linear = true;
  static constexpr bool is_identity = false;
};

TEST_CASE("a commit whose buffers cannot be built on one rank changes nothing on any rank") {
  const auto l = test_layout();
  pactrain::sync<mpi_communicator, oversized_codec> s{mpi_communicator{MPI_COMM_WORLD}, l,
                                                      oversized_codec{}};
  const auto masks = test::masks_for<bitmap_mask>(l, 0.5, 3);
  s.set_masks(masks);
  const auto strategies = s.strategies();
  const int culprit = world_size() - 1;
  // More wire elements than a vector can hold: std::length_error before any allocation.
  if (world_rank() == culprit) oversized_codec::extra = std::size_t{1} << 61;
  const std::string msg = error_of([&] { s.set_masks(test::masks_for<bitmap_mask>(l, 0.25, 4)); });
  oversized_codec::extra = 0;
  CHECK(test::same_on_every_rank(msg));
  CHECK(msg.find("set_masks rejected on rank " + std::to_string(culprit) + ": ") !=
        std::string::npos);
  CHECK(s.masks() == masks);
  CHECK(s.strategies() == strategies);
  // Every rank is still on the old state, buffers included: the next step is exact.
  auto g = test::values<float>(l.total_size(), 6, world_rank());
  const auto want = reference(l, masks, g);
  s.allreduce(std::span<float>(g));
  CHECK(bad_entries(g, want) == 0);
}

TEST_CASE("mpi_communicator collectives") {
  mpi_communicator c{MPI_COMM_WORLD};
  CHECK(c.rank() == world_rank());
  CHECK(c.size() == world_size());
  std::vector<std::uint64_t> u{static_cast<std::uint64_t>(c.rank()), 5};
  c.allreduce(std::span<std::uint64_t>(u), reduce_op::max);
  CHECK(u[0] == static_cast<std::uint64_t>(c.size() - 1));
  std::vector<float> f(1000, 1.5f);
  auto req = c.allreduce_async(std::span<float>(f), reduce_op::sum);
  req.wait();
  CHECK(f[999] == 1.5f * static_cast<float>(c.size()));
  std::vector<double> d{static_cast<double>(c.rank())};
  c.allreduce(std::span<double>(d), reduce_op::min);
  CHECK(d[0] == 0.0);
  std::vector<std::byte> b(3, static_cast<std::byte>(c.rank()));
  c.broadcast(std::span<std::byte>(b), c.size() - 1);
  CHECK(b[2] == static_cast<std::byte>(c.size() - 1));
  CHECK_THROWS_WITH_AS(c.broadcast(std::span<std::byte>(b), c.size()),
                       doctest::Contains("out of range"), error);
  mpi_communicator moved = std::move(c);
  CHECK(moved.size() == world_size());
  CHECK_THROWS_WITH_AS(c.allreduce(std::span<float>(f), reduce_op::sum),  // NOLINT: use after move
                       doctest::Contains("moved-from"), error);
}

TEST_CASE("MPI errors become exceptions") {
  mpi_communicator c{MPI_COMM_WORLD};
  // A negative count is an error MPI itself detects; it must not abort the job.
  const std::string msg = error_of(
      [&] { detail::mpi_check(MPI_Bcast(nullptr, -1, MPI_BYTE, 0, c.native()), "MPI_Bcast"); });
  CHECK(msg.find("MPI_Bcast failed") != std::string::npos);
}

TEST_CASE_TEMPLATE("sparse sync equals a dense allreduce of the masked gradients, bit for bit",
                   Mask, bitmap_mask, index_mask, block_mask<16>) {
  check_exact<Mask, float>(2000);     // several buckets
  check_exact<Mask, double>(1);       // one tensor per bucket
  check_exact<Mask, float>(1 << 20);  // one bucket
}

TEST_CASE("masks updated every step stay exact") {
  const auto l = test_layout();
  pactrain::sync<mpi_communicator> s{mpi_communicator{MPI_COMM_WORLD}, l};
  for (int step = 0; step < 5; ++step) {
    const auto masks = test::masks_for<bitmap_mask>(l, 0.1 + 0.2 * step, 1000 + step);
    s.set_masks(masks);
    auto g = test::values<float>(l.total_size(), step, world_rank());
    const auto want = reference(l, masks, g);
    s.allreduce(std::span<float>(g));
    CHECK(bad_entries(g, want) == 0);
  }
}

TEST_CASE("a mask that differs on one rank is caught on every rank, with the same message") {
  const auto l = test_layout();
  pactrain::sync<mpi_communicator> s{mpi_communicator{MPI_COMM_WORLD}, l};
  const auto good = test::masks_for<bitmap_mask>(l, 0.5, 7);
  s.set_masks(good);
  auto masks = good;
  if (world_rank() == world_size() - 1) {
    // Flip one entry of fc1.weight (tensor 2) and of fc2.weight (tensor 5) on the last rank.
    for (std::size_t t : {std::size_t{2}, std::size_t{5}}) {
      std::vector<std::uint64_t> w(masks[t].words().begin(), masks[t].words().end());
      w[0] ^= 1;
      masks[t] = bitmap_mask(masks[t].size(), w);
    }
  }
  const std::string msg = error_of([&] { s.set_masks(masks); });
  if (world_size() > 1) {
    CHECK(msg ==
          "pactrain: set_masks: masks differ across ranks, first at tensor 2 'fc1.weight' "
          "(name as on rank 0)");
    CHECK(s.masks() == good);  // the previous masks stay in force
  } else {
    CHECK(msg.empty());
  }
  CHECK(test::same_on_every_rank(msg));
  // The engine still works with the masks every rank agrees on.
  s.set_masks(good);
  auto g = test::values<float>(l.total_size(), 9, world_rank());
  const auto want = reference(l, good, g);
  s.allreduce(std::span<float>(g));
  CHECK(bad_entries(g, want) == 0);
}

TEST_CASE("mismatched layouts are rejected on every rank") {
  const bool odd = world_rank() % 2 == 1;
  auto make = [&](param_layout l) {
    return error_of([&] {
      pactrain::sync<mpi_communicator> s{mpi_communicator{MPI_COMM_WORLD}, std::move(l)};
    });
  };
  const bool many = world_size() > 1;
  std::string msg = make(odd ? param_layout(100).add("a", 10).add("b", 5)
                             : param_layout(100).add("a", 10).add("b", 6));
  CHECK(test::same_on_every_rank(msg));
  if (many)
    CHECK(msg.find("layouts differ across ranks, first at tensor 1 'b'") != std::string::npos);

  msg = make(odd ? param_layout(100).add("a", 10) : param_layout(100).add("a", 10).add("b", 5));
  CHECK(test::same_on_every_rank(msg));
  if (many) CHECK(msg.find("between 1 and 2 tensors") != std::string::npos);

  msg = make(odd ? param_layout(100).add("a", 10) : param_layout(50).add("a", 10));
  CHECK(test::same_on_every_rank(msg));
  if (many) CHECK(msg.find("bucket capacities differ") != std::string::npos);

  msg = make(odd ? param_layout(100).add("x", 10) : param_layout(100).add("y", 10));
  CHECK(test::same_on_every_rank(msg));
  if (many) CHECK(msg.find("at tensor 0 'y' (name as on rank 0)") != std::string::npos);
}

TEST_CASE("strategies that differ across ranks are rejected") {
  const auto l = test_layout();
  pactrain::sync<mpi_communicator> s{mpi_communicator{MPI_COMM_WORLD}, l};
  std::vector<bucket_strategy> st(l.buckets().size(), bucket_strategy::sparse);
  if (world_rank() == 0) st[0] = bucket_strategy::dense;
  const std::string msg = error_of([&] { s.set_strategies(st); });
  CHECK(test::same_on_every_rank(msg));
  if (world_size() > 1)
    CHECK(msg.find("bucket strategies or sync_options differ across ranks") != std::string::npos);
}

TEST_CASE("bad input on one rank fails every rank without a hang") {
  const auto l = test_layout();
  pactrain::sync<mpi_communicator> s{mpi_communicator{MPI_COMM_WORLD}, l};
  auto masks = test::masks_for<bitmap_mask>(l, 0.5, 3);
  s.set_masks(masks);
  const int culprit = world_size() - 1;
  auto bad = masks;
  if (world_rank() == culprit) bad[4] = bitmap_mask::full(7);
  const std::string msg = error_of([&] { s.set_masks(bad); });
  CHECK(test::same_on_every_rank(msg));
  CHECK(msg == "pactrain: set_masks rejected on rank " + std::to_string(culprit) +
                   ": mask of tensor 'fc1.bias' has 7 entries, the tensor 120");
  CHECK(s.masks() == masks);

  // Wrong lengths and null data are rejected locally before any communication, with the
  // buffer untouched; here every rank makes the same mistake.
  auto g = test::values<float>(l.total_size(), 5, world_rank());
  const auto g0 = g;
  CHECK(error_of([&] {
          s.allreduce(std::span<float>(g).first(g.size() - 1));
        }).find("entries, the layout") != std::string::npos);
  CHECK(error_of([&] {
          s.allreduce(static_cast<float*>(nullptr), g.size());
        }).find("null buffer") != std::string::npos);
  CHECK(g == g0);
  const auto want = reference(l, masks, g);
  s.allreduce(std::span<float>(g));
  CHECK(bad_entries(g, want) == 0);
}
