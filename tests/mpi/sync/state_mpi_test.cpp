// save_state and load_state over MPI: every rank restores its own residuals and the shared
// scales and step, and the run continues bit for bit; one rank's bad bytes, or step counters
// that differ, make every rank throw the same error and change nothing.
//
// Every rank runs every test case; CHECK (not REQUIRE) before collectives.
#include <doctest/doctest.h>

#include <pactrain/mpi.hpp>
#include <pactrain/pactrain.hpp>

#include "common/mpi_helpers.hpp"
#include "common/test_data.hpp"

#include <mpi.h>

#include <bit>
#include <cstdint>
#include <string>
#include <vector>

using namespace pactrain;

namespace {

using test::error_of;
using test::same_bits;
using test::world_rank;
using test::world_size;

using engine = pactrain::sync<mpi_communicator, error_feedback<ternary_codec>>;

param_layout layout() {
  param_layout l(2500);
  l.add("w1", 40, 61).add("b1", 40).add("w2", 10, 40).add("b2", 10);
  return l;
}

engine make_engine(const param_layout& l, MPI_Comm comm = MPI_COMM_WORLD) {
  engine e{mpi_communicator{comm}, l,
           ternary_codec{{.seed = 12, .scale = scale_source::previous_max}}};
  e.set_masks(test::masks_for<bitmap_mask>(l, 0.25, 3));
  return e;
}

std::vector<float> gradient(std::size_t n, std::uint64_t step) {
  return test::spread_values(n, step, static_cast<std::uint64_t>(world_rank()));
}

// An engine after `steps` syncs of this rank's gradients.
engine trained(const param_layout& l, std::uint64_t steps) {
  auto e = make_engine(l);
  for (std::uint64_t k = 0; k < steps; ++k) {
    auto g = gradient(l.total_size(), k);
    e.allreduce(std::span<float>(g));
  }
  return e;
}

// Step k's sync on both engines (collective): true when the results agree bit for bit.
bool same_step(engine& a, engine& b, const param_layout& l, std::uint64_t k) {
  auto ga = gradient(l.total_size(), k);
  auto gb = ga;
  a.allreduce(std::span<float>(ga));
  b.allreduce(std::span<float>(gb));
  return same_bits(ga, gb);
}

}  // namespace

TEST_CASE("every rank restores its own state and the run continues bit for bit") {
  const auto l = layout();
  auto a = trained(l, 3);
  const auto bytes = a.save_state();
  auto b = make_engine(l);
  b.load_state(bytes);
  CHECK(b.step() == 3);
  for (std::uint64_t k = 3; k < 5; ++k) {
    CHECK(same_step(a, b, l, k));
    CHECK(same_bits(a.residuals(), b.residuals()));
  }
}

TEST_CASE("one rank's bad bytes, or different steps, fail on every rank and change nothing") {
  const auto l = layout();
  auto a = trained(l, 2);
  auto bytes = a.save_state();
  auto b = make_engine(l);
  const auto before = b.save_state();
  const int bad = world_size() - 1;
  auto mine = bytes;
  if (world_rank() == bad) mine[70] ^= std::byte{4};
  const std::string msg = error_of([&] { b.load_state(mine); });
  CHECK(msg.find("load_state rejected on rank " + std::to_string(bad)) != std::string::npos);
  CHECK(msg.find("checksum mismatch") != std::string::npos);
  CHECK(b.save_state() == before);

  if (world_size() > 1) {
    // The last rank saved one step later than the others.
    if (world_rank() == bad) a.set_step(a.step() + 1);
    bytes = a.save_state();
    const std::string step_msg = error_of([&] { b.load_state(bytes); });
    CHECK(step_msg.find("step counters or scales differ across ranks") != std::string::npos);
    CHECK(b.save_state() == before);
  }
  // The engine still works, and a good state loads.
  if (world_rank() == bad) a.set_step(2);
  b.load_state(a.save_state());
  CHECK(same_step(a, b, l, 7));
}

TEST_CASE("a rank's state loads on that rank only, and in a job of the same size") {
  const auto l = layout();
  auto a = trained(l, 2);
  auto b = make_engine(l);
  const auto before = b.save_state();
  if (world_size() > 1) {
    // Every rank loads rank 0's bytes: every rank but 0 refuses them, the highest reports.
    auto bytes = a.save_state();
    MPI_Bcast(bytes.data(), static_cast<int>(bytes.size()), MPI_BYTE, 0, MPI_COMM_WORLD);
    const std::string last = std::to_string(world_size() - 1);
    CHECK(error_of([&] { b.load_state(bytes); }) ==
          "pactrain: load_state rejected on rank " + last +
              ": state rejected: saved by rank 0, this is rank " + last +
              " (each rank loads the state it saved)");
    CHECK(b.save_state() == before);
    // A one-rank job's bytes, same layout and masks.
    auto solo = make_engine(l, MPI_COMM_SELF);
    const std::string msg = error_of([&] { b.load_state(solo.save_state()); });
    CHECK(msg.find("state rejected: saved by a job of 1 ranks, this one has " +
                   std::to_string(world_size())) != std::string::npos);
    CHECK(b.save_state() == before);
  }
  b.load_state(a.save_state());
  CHECK(same_step(a, b, l, 5));
}
