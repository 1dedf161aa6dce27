// Checked steps (sync_options::checked): one agreement per step turns a wrong length, a bad
// bucket number or a different submission order on one rank into the same error on every
// rank, with every buffer and the engine's state unchanged; when all ranks agree the results
// are bit for bit those of unchecked steps.
//
// Every rank runs every test case; CHECK (not REQUIRE) before collectives.
#include <doctest/doctest.h>

#include <pactrain/mpi.hpp>
#include <pactrain/pactrain.hpp>

#include "common/mpi_helpers.hpp"
#include "common/test_data.hpp"

#include <mpi.h>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

using namespace pactrain;

namespace {

using test::error_of;
using test::same_bits;
using test::same_on_every_rank;
using test::world_rank;
using test::world_size;

using plain_engine = pactrain::sync<mpi_communicator>;
using ternary_engine = pactrain::sync<mpi_communicator, error_feedback<ternary_codec>>;

constexpr sync_options checked{.checked = true};

std::vector<float> gradient(std::size_t n, std::uint64_t step) {
  return test::values<float>(n, step, static_cast<std::uint64_t>(world_rank()));
}

bool last_rank() { return world_rank() == world_size() - 1; }

// Submits the buckets in `order` (then finish_step submits the rest).
template <class Engine>
void three_phase(Engine& e, std::vector<float>& g, const std::vector<std::size_t>& order) {
  e.begin_step(std::span<float>(g));
  for (const auto b : order) e.submit_bucket(b);
  e.finish_step();
}

}  // namespace

TEST_CASE("checked steps give the results of unchecked ones, bit for bit") {
  const auto l = test::small_layout();
  const auto masks = test::masks_for<bitmap_mask>(l, 0.5, 3);
  const std::vector<std::size_t> order = {2, 0};
  {
    plain_engine a{mpi_communicator{MPI_COMM_WORLD}, l, checked};
    plain_engine b{mpi_communicator{MPI_COMM_WORLD}, l};
    a.set_masks(masks);
    b.set_masks(masks);
    for (std::uint64_t k = 0; k < 3; ++k) {
      auto ga = gradient(l.total_size(), k);
      auto gb = ga;
      three_phase(a, ga, order);
      three_phase(b, gb, order);
      CHECK(same_bits(ga, gb));
      a.allreduce(std::span<float>(ga));
      b.allreduce(std::span<float>(gb));
      CHECK(same_bits(ga, gb));
    }
    // One more collective: the agreement round, counted with its bytes.
    CHECK(a.stats().collectives == b.stats().collectives + 1);
    CHECK(a.stats().bytes_sent == b.stats().bytes_sent + 88);
  }
  for (const auto s : {scale_source::current_max, scale_source::previous_max}) {
    const ternary_codec codec{{.seed = 9, .scale = s}};
    ternary_engine a{mpi_communicator{MPI_COMM_WORLD}, l, codec, checked};
    ternary_engine b{mpi_communicator{MPI_COMM_WORLD}, l, codec};
    a.set_masks(masks);
    b.set_masks(masks);
    for (std::uint64_t k = 0; k < 3; ++k) {
      auto ga = test::spread_values(l.total_size(), k, static_cast<std::uint64_t>(world_rank()));
      auto gb = ga;
      three_phase(a, ga, order);
      three_phase(b, gb, order);
      CHECK(same_bits(ga, gb));
    }
    CHECK(same_bits(a.residuals(), b.residuals()));
  }
}

TEST_CASE("checked: a wrong length on one rank throws the same error on every rank") {
  const auto l = test::small_layout();
  plain_engine e{mpi_communicator{MPI_COMM_WORLD}, l, checked};
  auto g = gradient(l.total_size(), 1);
  const auto before = g;
  const std::size_t n = last_rank() ? g.size() - 1 : g.size();
  const std::string what = error_of([&] { e.allreduce(std::span<float>(g.data(), n)); });
  CHECK(same_on_every_rank(what));
  CHECK(what.find("finish_step rejected on rank " + std::to_string(world_size() - 1) +
                  ": sync::allreduce: buffer has " + std::to_string(g.size() - 1) +
                  " entries, the layout " + std::to_string(g.size())) != std::string::npos);
  CHECK(same_bits(g, before));
  CHECK(e.step() == 0);
  CHECK_FALSE(e.step_open());
  // The engine goes on as if the step had not been tried.
  plain_engine ref{mpi_communicator{MPI_COMM_WORLD}, l};
  auto h = g;
  e.allreduce(std::span<float>(g));
  ref.allreduce(std::span<float>(h));
  CHECK(same_bits(g, h));
}

TEST_CASE("checked: different submission orders throw the same error on every rank") {
  const auto l = test::small_layout();
  plain_engine e{mpi_communicator{MPI_COMM_WORLD}, l, checked};
  auto g = gradient(l.total_size(), 2);
  const auto before = g;
  const std::vector<std::size_t> order =
      world_rank() == 0 ? std::vector<std::size_t>{0, 1} : std::vector<std::size_t>{1, 0};
  const std::string what = error_of([&] { three_phase(e, g, order); });
  CHECK(same_on_every_rank(what));
  if (world_size() > 1) {
    CHECK(what == "pactrain: finish_step: bucket submission orders differ across ranks");
    CHECK(same_bits(g, before));
  } else {
    CHECK(what.empty());
  }
  CHECK_FALSE(e.step_open());
}

TEST_CASE("checked: a bucket submitted twice or out of range is every rank's error") {
  const auto l = test::small_layout();
  plain_engine e{mpi_communicator{MPI_COMM_WORLD}, l, checked};
  const std::size_t nb = l.buckets().size();
  for (const std::size_t bad : {std::size_t{1}, nb}) {
    auto g = gradient(l.total_size(), 3);
    const auto before = g;
    std::vector<std::size_t> order = {1};
    if (last_rank()) order.push_back(bad);
    const std::string what = error_of([&] { three_phase(e, g, order); });
    CHECK(same_on_every_rank(what));
    const std::string expected = bad == nb ? "sync::submit_bucket: bucket " + std::to_string(nb) +
                                                 " of " + std::to_string(nb)
                                           : "sync::submit_bucket: bucket 1 was already "
                                             "submitted in this step";
    CHECK(what == "pactrain: finish_step rejected on rank " + std::to_string(world_size() - 1) +
                      ": " + expected);
    CHECK(same_bits(g, before));
  }
}

TEST_CASE("checked: a null tensor buffer on one rank is every rank's error") {
  const auto l = test::small_layout();
  plain_engine e{mpi_communicator{MPI_COMM_WORLD}, l, checked};
  auto g = gradient(l.total_size(), 4);
  std::vector<std::span<float>> views;
  for (const auto& t : l.tensors()) views.emplace_back(g.data() + t.offset, t.size);
  if (last_rank()) views[0] = std::span<float>(static_cast<float*>(nullptr), views[0].size());
  const std::string what = error_of([&] { e.allreduce(std::span<const std::span<float>>(views)); });
  CHECK(same_on_every_rank(what));
  CHECK(what.find("null buffer for tensor 'fc1.weight'") != std::string::npos);
}

TEST_CASE("checked steps must be chosen on every rank alike") {
  const auto l = test::small_layout();
  const sync_options opt{.checked = world_rank() == 0};
  const std::string what = error_of([&] {
    plain_engine e{mpi_communicator{MPI_COMM_WORLD}, l, opt};
  });
  CHECK(same_on_every_rank(what));
  if (world_size() > 1) {
    CHECK(what.find("bucket strategies or sync_options differ across ranks") != std::string::npos);
  } else {
    CHECK(what.empty());
  }
}
