// strategy_tuner over MPI: each rank times its own steps, yet every rank keeps the same
// candidate, and every step's result is exact whichever candidate runs.
#include <doctest/doctest.h>

#include <pactrain/mpi.hpp>
#include <pactrain/pactrain.hpp>
#include <pactrain/tuner.hpp>

#include "common/test_data.hpp"

#include <mpi.h>

#include <cstddef>
#include <vector>

using namespace pactrain;

TEST_CASE("strategy_tuner keeps the same candidate on every rank, and every step is exact") {
  param_layout l(3000);
  l.add("w1", 60, 60).add("b1", 60).add("w2", 10, 60).add("b2", 10);
  pactrain::sync<mpi_communicator> s{mpi_communicator{MPI_COMM_WORLD}, l};
  auto& comm = s.get_communicator();
  const auto masks = test::masks_for<bitmap_mask>(l, 0.3, 9);
  s.set_masks(masks);
  const std::size_t nb = l.buckets().size();
  using bs = bucket_strategy;
  // With the identity codec every strategy gives the same exact average.
  std::vector<std::vector<bs>> cands = {std::vector<bs>(nb, bs::sparse),
                                        std::vector<bs>(nb, bs::dense)};
  cands.push_back(cands[0]);
  cands[2].back() = bs::dense;
  std::vector<float> want(l.total_size(), 0.0f);
  for (int r = 0; r < comm.size(); ++r) {
    const auto g = test::values<float>(l.total_size(), 4, static_cast<std::uint64_t>(r));
    for (std::size_t i = 0; i < want.size(); ++i) want[i] += g[i];
  }
  for (auto& w : want) w /= static_cast<float>(comm.size());
  want = test::masked(l, masks, want);
  strategy_tuner t(cands, 2);
  for (int step = 0; step < 8; ++step) {
    auto g = test::values<float>(l.total_size(), 4, static_cast<std::uint64_t>(comm.rank()));
    // Each rank's own timing noise; the tuner decides on the slowest rank's times.
    if (t.tuning() && t.tuner().current() == static_cast<std::size_t>(comm.rank() % 3)) {
      volatile double x = 0;
      for (int i = 0; i < 200000; ++i) x = x + 1.0;
    }
    t.allreduce(s, std::span<float>(g));
    CHECK(g == want);
  }
  REQUIRE_FALSE(t.tuning());
  long best = static_cast<long>(t.tuner().best());
  long lo = 0;
  long hi = 0;
  MPI_Allreduce(&best, &lo, 1, MPI_LONG, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(&best, &hi, 1, MPI_LONG, MPI_MAX, MPI_COMM_WORLD);
  CHECK(lo == hi);
  CHECK(s.strategies() == cands[static_cast<std::size_t>(best)]);
}
