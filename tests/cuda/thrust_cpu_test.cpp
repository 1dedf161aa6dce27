// The device compactor's and sync engine's expectations (compactor_checks.hpp,
// sync_checks.hpp) on the CPU: thrust_compactor, built with the host compiler on Thrust's CPP
// device system, runs the same per-element functors as cuda_compactor's kernels; the engine
// over it uses mpi_communicator (device memory is host memory there) and is compared with the
// host engine on the same ranks. Label cuda-host; needs no GPU.
#include <doctest/doctest.h>

#include <pactrain/cuda/thrust_compactor.hpp>
#include <pactrain/mpi.hpp>
#include <pactrain/pactrain.hpp>

#include "common/mpi_helpers.hpp"
#include "cuda/compactor_checks.hpp"
#include "cuda/sync_checks.hpp"

#include <mpi.h>

static_assert(THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_CPP,
              "this test runs the device math on the CPU: build it with "
              "-DTHRUST_DEVICE_SYSTEM=THRUST_DEVICE_SYSTEM_CPP");

using namespace pactrain;

TEST_CASE("thrust_compactor on the CPU equals host_compactor bit for bit") {
  test::compactor_checks<thrust_compactor>{}.all();
}

TEST_CASE("the device engine on the CPU equals the host engine bit for bit") {
  auto world = [] { return mpi_communicator{MPI_COMM_WORLD}; };
  test::make_sync_checks<thrust_compactor>(world, world, test::world_rank()).all();
}

// One instantiation only: every other check runs over MPI above, and each engine type costs
// seconds of every CI build.
TEST_CASE("one rank without MPI: the loopback communicator") {
  auto loop = [] { return loopback_communicator{}; };
  test::make_sync_checks<thrust_compactor>(loop, loop, 0).fully_pruned();
}
