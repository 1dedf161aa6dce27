// Calibration over MPI: every rank gets the same cost model, so every rank plans the same
// strategies, which the sync engine then accepts.
#include <doctest/doctest.h>

#include <pactrain/mpi.hpp>
#include <pactrain/pactrain.hpp>
#include <pactrain/planner.hpp>

#include "common/mpi_helpers.hpp"
#include "common/test_data.hpp"

#include <mpi.h>

#include <string>
#include <vector>

using namespace pactrain;

TEST_CASE("calibrate gives every rank the same model") {
  mpi_communicator comm{MPI_COMM_WORLD};
  const auto m =
      calibrate(comm, {.large_bytes = 1 << 18, .compact_entries = 1 << 15, .repetitions = 3});
  CHECK_NOTHROW(m.validate());
  double v[4] = {m.latency, m.seconds_per_byte, m.compact_seconds_per_entry,
                 m.dense_seconds_per_entry};
  double lo[4];
  double hi[4];
  MPI_Allreduce(v, lo, 4, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(v, hi, 4, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  for (int i = 0; i < 4; ++i) CHECK(lo[i] == hi[i]);
  if (comm.size() == 1) {
    CHECK(m.latency == 0.0);
    CHECK(m.seconds_per_byte == 0.0);
  }

  param_layout l(4000);
  l.add("w1", 60, 60).add("b1", 60).add("w2", 10, 60).add("b2", 10);
  pactrain::sync<mpi_communicator> s{mpi_communicator{MPI_COMM_WORLD}, l};
  s.set_masks(test::masks_for<bitmap_mask>(l, 0.1, 5));
  const auto p = choose_strategies(m, comm.size(), bucket_shapes(s), {.min_sparse_entries = 0});
  CHECK_NOTHROW(s.set_strategies(p.strategies));  // collective: checked across ranks
  auto g = test::values<float>(l.total_size(), 7, static_cast<std::uint64_t>(comm.rank()));
  s.allreduce(std::span<float>(g));
  CHECK(s.stats().steps == 1);
}

TEST_CASE("calibration options bad or different on one rank fail every rank alike") {
  mpi_communicator comm{MPI_COMM_WORLD};
  const bool last = comm.rank() == comm.size() - 1;
  const std::string r = std::to_string(comm.size() - 1);
  // Before, different small_bytes timed allreduces of different lengths: MPI_ERR_TRUNCATE.
  calibration_options opt{.large_bytes = 1 << 16, .compact_entries = 1 << 12, .repetitions = 1};
  if (last) opt.small_bytes = 1024;
  CHECK(
      test::error_of([&] { (void)calibrate_link(comm, opt); }) ==
      (comm.size() > 1 ? "pactrain: calibrate_link: calibration options differ across ranks" : ""));
  if (last) opt.small_bytes = opt.large_bytes;  // invalid: small_bytes < large_bytes
  CHECK(test::error_of([&] { (void)calibrate_link(comm, opt); }) ==
        "pactrain: calibrate_link rejected on rank " + r +
            ": calibrate: need 4 <= small_bytes < large_bytes");
  opt.small_bytes = 4096;
  const link_model bad{.latency = last ? -1.0 : 0.0, .seconds_per_byte = 0.0};
  CHECK(test::error_of([&] { (void)calibrate_local(comm, bad, opt); }) ==
        "pactrain: calibrate_local rejected on rank " + r +
            ": calibrate_local: the link model must be finite and >= 0");
  // The same options everywhere still calibrate.
  const auto link = calibrate_link(comm, opt);
  CHECK_NOTHROW((void)calibrate_local(comm, link, opt));
}
