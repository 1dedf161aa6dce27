// nccl_communicator on one rank and the device sync engine over it: results equal the host
// engine's bit for bit (sync_checks.hpp) on the default and a non-default stream; steps on
// alternating streams; an engine that outlives its streams; host memory refused. (The engine
// over thrust_compactor runs these checks on the CPU: thrust_cpu_test.) Skips (77)
// without a GPU.
#include <doctest/doctest.h>

#include <pactrain/cuda/nccl.hpp>
#include <pactrain/cuda/sync.cuh>
#include <pactrain/pactrain.hpp>

#include "common/cuda_helpers.cuh"
#include "common/test_data.hpp"
#include "cuda/sync_checks.hpp"

#include <cstdint>
#include <vector>

using namespace pactrain;
using test::device_array;

namespace {

// One NCCL communicator of one rank on device 0, for the whole test run; destroyed at exit.
struct nccl_world {
  ncclComm_t comm = nullptr;
  nccl_world() {
    int dev = 0;
    PACTRAIN_NCCL_TRY(nullptr, ncclCommInitAll(&comm, 1, &dev));
  }
  ~nccl_world() { (void)ncclCommDestroy(comm); }
};
ncclComm_t nccl() {
  static nccl_world w;
  return w.comm;
}

}  // namespace

TEST_CASE("nccl_communicator on one rank: device and host buffers, groups, 16-bit floats") {
  nccl_communicator c{nccl()};
  CHECK(c.rank() == 0);
  CHECK(c.size() == 1);
  const auto v = test::values<float>(1000, 1);
  device_array<float> d(v);
  auto r = c.allreduce_async(d.span(), reduce_op::sum);
  r.wait();
  CHECK(d.host() == v);
  // Host words (the agreement's): staged.
  std::vector<std::uint64_t> words{1, 2, ~std::uint64_t{0}};
  c.allreduce(std::span<std::uint64_t>(words), reduce_op::max);
  CHECK(words == std::vector<std::uint64_t>{1, 2, ~std::uint64_t{0}});
  std::vector<std::byte> text(16, std::byte{7});
  c.broadcast(std::span<std::byte>(text), 0);
  CHECK(text[15] == std::byte{7});
  // Several buckets in one group.
  device_array<double> a(test::values<double>(300, 2));
  device_array<float> b(test::values<float>(70, 3));
  c.group_start();
  (void)c.allreduce_async(a.span(), reduce_op::sum);
  (void)c.allreduce_async(b.span(), reduce_op::sum);
  c.group_end();
  CHECK(a.host() == test::values<double>(300, 2));
  CHECK(b.host() == test::values<float>(70, 3));
  device_array<pactrain::half> h(std::vector<pactrain::half>(9, pactrain::half(1.5f)));
  c.allreduce(h.span(), reduce_op::sum);
  CHECK(float(h.host()[8]) == 1.5f);
  c.check_async_error();
  CHECK_THROWS_WITH_AS(c.broadcast(std::span<std::byte>(text), 1), doctest::Contains("root 1"),
                       error);
  // Moved-from communicators refuse politely.
  nccl_communicator moved = std::move(c);
  CHECK(moved.size() == 1);
  CHECK_THROWS_WITH_AS(c.allreduce(d.span(), reduce_op::sum),  // NOLINT(bugprone-use-after-move)
                       doctest::Contains("moved-from"), error);
}

TEST_CASE("the device engine equals the host engine") {
  auto dev = [] { return nccl_communicator{nccl()}; };
  auto host = [] { return loopback_communicator{}; };
  test::make_sync_checks<cuda_compactor>(dev, host, 0).all();
}

TEST_CASE("the device engine on a non-default stream equals the host engine") {
  cudaStream_t s = nullptr;
  PACTRAIN_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  {
    auto dev = [s] { return nccl_communicator{nccl(), s}; };
    auto host = [] { return loopback_communicator{}; };
    test::make_sync_checks<cuda_compactor>(dev, host, 0, s).all();
  }
  PACTRAIN_CUDA_TRY(cudaStreamDestroy(s));
}

TEST_CASE("steps on alternating streams stay ordered; the engine may outlive them") {
  const auto l = test::small_layout();
  const auto masks = test::masks_for<bitmap_mask>(l, 0.5, 9);
  std::vector<device_array<float>> g;
  for (int k = 0; k < 6; ++k) g.emplace_back(test::values<float>(l.total_size(), 30 + k));
  {
    pactrain::sync<nccl_communicator> ds{nccl_communicator{nccl()}, l};
    ds.set_masks(masks);
    cudaStream_t s[2];
    for (auto& x : s) PACTRAIN_CUDA_TRY(cudaStreamCreateWithFlags(&x, cudaStreamNonBlocking));
    for (int k = 0; k < 6; ++k) ds.allreduce_async(g[k].span(), s[k % 2]);  // never syncs
    CHECK(ds.stats().steps == 6);
    // The user destroys the streams while the last step may still run; the engine then waits
    // for that step through its event, not through a destroyed stream.
    for (auto& x : s) PACTRAIN_CUDA_TRY(cudaStreamDestroy(x));
  }
  CHECK(cudaPeekAtLastError() == cudaSuccess);  // nothing left for a later call to report
  for (int k = 0; k < 6; ++k) {
    CHECK(test::bad_entries(g[k].host(),
                            test::masked(l, masks, test::values<float>(l.total_size(), 30 + k))) ==
          0);
  }
  // The next launch works.
  device_array<float> d(test::values<float>(100, 1));
  const cuda_compactor dc;
  const auto plan = dc.make_plan(bitmap_mask::full(100));
  device_array<float> p(100);
  dc.gather(plan, d.cspan(), p.span());
  CHECK(p.host() == test::values<float>(100, 1));
}

TEST_CASE("host memory is refused before anything is queued") {
  const auto l = test::small_layout();
  pactrain::sync<nccl_communicator> ds{nccl_communicator{nccl()}, l};
  const auto g0 = test::values<float>(l.total_size(), 2);
  std::vector<float> host = g0;
  CHECK_THROWS_WITH_AS(ds.allreduce(std::span<float>(host)),
                       doctest::Contains("gradient buffer is not device memory"), error);
  CHECK(host == g0);
  CHECK(ds.stats().steps == 0);
}
