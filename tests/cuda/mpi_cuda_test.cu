// mpi_cuda_communicator and the device sync engine over MPI, several ranks sharing one GPU:
// bit-for-bit equality with a dense MPI_Allreduce of the masked gradients, the staged and the
// detected transfer paths, and the agreement. Every rank exits with 77 without a GPU.
#include <doctest/doctest.h>

#include <pactrain/cuda/mpi_cuda.hpp>
#include <pactrain/cuda/sync.cuh>
#include <pactrain/pactrain.hpp>

#include "common/cuda_helpers.cuh"
#include "common/mpi_helpers.hpp"
#include "common/test_data.hpp"

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

template <class T>
std::vector<T> reduced_mean(std::vector<T> g) {
  MPI_Allreduce(MPI_IN_PLACE, g.data(), static_cast<int>(g.size()),
                std::is_same_v<T, float> ? MPI_FLOAT : MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  const T scale = T(1) / static_cast<T>(world_size());
  for (auto& v : g) v *= scale;
  return g;
}

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

TEST_CASE_TEMPLATE("the device engine over MPI equals a dense allreduce", Mask, bitmap_mask,
                   index_mask) {
  param_layout l(2000);
  l.add("conv.weight", 16, 75).add("conv.bias", 16).add("fc1.weight", 120, 33);
  l.add("unused", 0).add("fc1.bias", 120).add("fc2.weight", 10, 121).add("fc2.bias", 10);
  for (auto transfer : transfers) {
    pactrain::sync<Mask, cuda_compactor, mpi_cuda_communicator> s{
        mpi_cuda_communicator{MPI_COMM_WORLD, nullptr, transfer}, l};
    for (double d : test::densities) {
      CAPTURE(d);
      const auto masks = test::masks_for<Mask>(l, d, 100);
      s.set_masks(masks);
      for (auto strategy : {bucket_strategy::sparse, bucket_strategy::dense}) {
        s.set_strategies(std::vector<bucket_strategy>(l.buckets().size(), strategy));
        const auto g = test::values<float>(l.total_size(), 40, world_rank());
        const auto want = reduced_mean(test::masked(l, masks, g));
        device_array<float> dg(g);
        s.allreduce(dg.span());
        CHECK(test::bad_entries(dg.host(), want) == 0);
      }
    }
  }
}

TEST_CASE("masks that differ across ranks are refused on every rank") {
  const auto l = test::small_layout();
  pactrain::sync<bitmap_mask, cuda_compactor, mpi_cuda_communicator> s{
      mpi_cuda_communicator{MPI_COMM_WORLD}, l};
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
