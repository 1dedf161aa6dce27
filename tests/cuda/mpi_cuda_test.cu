// mpi_cuda_communicator and the device sync engine over MPI, several ranks sharing one GPU:
// bit-for-bit equality with the host engine over MPI (sync_checks.hpp's cross-rank subset:
// every mask type, value type and 16-bit codec, the three-phase step), the staged and the detected
// transfer paths, and the agreement. Every rank exits with 77 without a GPU.
#include <doctest/doctest.h>

#include <pactrain/cuda/mpi_cuda.hpp>
#include <pactrain/cuda/sync.cuh>
#include <pactrain/pactrain.hpp>

#include "common/cuda_helpers.cuh"
#include "common/mpi_helpers.hpp"
#include "common/test_data.hpp"
#include "cuda/sync_checks.hpp"

#include <mpi.h>

#include <string>
#include <vector>

using namespace pactrain;
using test::device_array;
using test::world_rank;
using test::world_size;

// Read by the shared MPI doctest main before any test runs.
extern "C" int pactrain_mpi_test_skip_code() {
  if (!test::have_gpu()) return test::skip_code;
  PACTRAIN_CUDA_TRY(cudaSetDevice(world_rank() % detail::cuda_device_count()));
  return 0;
}

namespace {

constexpr mpi_device_transfer transfers[] = {mpi_device_transfer::automatic,
                                             mpi_device_transfer::staged};

}  // namespace

TEST_CASE("device buffers through MPI: allreduce and broadcast") {
  for (auto transfer : transfers) {
    mpi_cuda_communicator c{MPI_COMM_WORLD, nullptr, transfer};
    if (world_rank() == 0) {
      MESSAGE("MPI CUDA-aware: " << mpi_cuda_aware() << ", direct: " << c.direct());
    }
    CHECK(c.size() == world_size());
    const auto v = test::values<float>(5000, 1, world_rank());
    device_array<float> d(v);
    c.allreduce(d.span(), reduce_op::sum);
    auto want = v;
    MPI_Allreduce(MPI_IN_PLACE, want.data(), static_cast<int>(want.size()), MPI_FLOAT, MPI_SUM,
                  MPI_COMM_WORLD);
    CHECK(test::bad_entries(d.host(), want) == 0);
    device_array<double> b(test::values<double>(77, 2, world_rank()));
    c.broadcast(b.span(), world_size() - 1);
    CHECK(b.host() == test::values<double>(77, 2, world_size() - 1));
    std::vector<std::uint64_t> words{std::uint64_t(world_rank())};
    c.allreduce_async(std::span<std::uint64_t>(words), reduce_op::max).wait();  // host: as MPI
    CHECK(words[0] == std::uint64_t(world_size() - 1));
  }
}

TEST_CASE("the device engine over MPI equals the host engine over MPI") {
  // Reduce ops, value types, the 1/P scale and the cross-rank layout, on several ranks.
  auto host = [] { return mpi_communicator{MPI_COMM_WORLD}; };
  SUBCASE("transfer automatic") {
    auto dev = [] { return mpi_cuda_communicator{MPI_COMM_WORLD}; };
    test::make_sync_checks<cuda_compactor>(dev, host, world_rank(), {}, false).cross_rank();
  }
  SUBCASE("transfer staged") {
    auto dev = [] {
      return mpi_cuda_communicator{MPI_COMM_WORLD, nullptr, mpi_device_transfer::staged};
    };
    test::make_sync_checks<cuda_compactor>(dev, host, world_rank(), {}, false).cross_rank();
  }
}

TEST_CASE("masks that differ across ranks are refused on every rank") {
  const auto l = test::small_layout();
  pactrain::sync<mpi_cuda_communicator> s{mpi_cuda_communicator{MPI_COMM_WORLD}, l};
  const auto masks = test::masks_for<bitmap_mask>(l, 0.5, 1);
  s.set_masks(masks);
  auto mine = masks;
  if (world_size() > 1 && world_rank() == 1) mine[3] = test::random_mask(mine[3].size(), 0.5, 99);
  const std::string msg = test::error_of([&] { s.set_masks(mine); });
  if (world_size() > 1) {
    CHECK(msg.find("masks differ across ranks, first at tensor 3 'fc2.weight'") !=
          std::string::npos);
  } else {
    CHECK(msg.empty());
  }
  CHECK(s.masks() == (world_size() > 1 ? masks : mine));
}
