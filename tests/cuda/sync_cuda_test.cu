// nccl_communicator on one rank and the device sync engine over it: results equal the host
// engine's (the masked gradient) bit for bit for every mask type, density and strategy; a
// non-default stream; bad input rejected before anything is queued. Skips (77) without a GPU.
#include <doctest/doctest.h>

#include <pactrain/cuda/nccl.hpp>
#include <pactrain/cuda/sync.cuh>
#include <pactrain/pactrain.hpp>

#include "common/cuda_helpers.cuh"
#include "common/test_data.hpp"

#include <cstdint>
#include <vector>

using namespace pactrain;
using test::device_array;

namespace {

// One NCCL communicator of one rank on device 0, for the whole test run.
ncclComm_t nccl() {
  static ncclComm_t comm = [] {
    ncclComm_t c = nullptr;
    int dev = 0;
    PACTRAIN_NCCL_TRY(nullptr, ncclCommInitAll(&c, 1, &dev));
    return c;
  }();
  return comm;
}

template <class Mask, class Codec>
void check_against_host(const param_layout& l, cudaStream_t stream) {
  using T = typename Codec::value_type;
  using dev_sync = pactrain::sync<Mask, cuda_compactor, nccl_communicator, Codec>;
  using host_sync = pactrain::sync<Mask, host_compactor, loopback_communicator, Codec>;
  dev_sync ds{nccl_communicator{nccl(), stream}, l, stream};
  host_sync hs{loopback_communicator{}, l};
  CHECK(ds.layout().buckets().size() == hs.layout().buckets().size());
  for (double d : test::densities) {
    CAPTURE(d);
    const auto masks = test::masks_for<Mask>(l, d, 17);
    ds.set_masks(masks);
    hs.set_masks(masks);
    CHECK(ds.masks() == masks);
    for (auto strategy : {bucket_strategy::sparse, bucket_strategy::dense}) {
      CAPTURE(to_string(strategy));
      const std::vector<bucket_strategy> st(l.buckets().size(), strategy);
      ds.set_strategies(st);
      hs.set_strategies(st);
      for (int step = 0; step < 2; ++step) {
        auto g = test::values<T>(l.total_size(), 3 + step);
        device_array<T> dg(g);
        ds.allreduce(dg.span(), stream);
        hs.allreduce(std::span<T>(g));
        CHECK(test::bad_entries(dg.host(), g) == 0);
        if constexpr (codec_traits<Codec>::is_identity) {
          CHECK(test::bad_entries(
                    g, test::masked(l, masks, test::values<T>(l.total_size(), 3 + step))) == 0);
        }
      }
      CHECK(ds.stats().bytes_sent == hs.stats().bytes_sent);
      CHECK(ds.stats().collectives == hs.stats().collectives);
      CHECK(ds.stats().dense_bytes == hs.stats().dense_bytes);
    }
  }
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

TEST_CASE_TEMPLATE("the device engine equals the host engine", Mask, bitmap_mask, index_mask,
                   block_mask<4>) {
  check_against_host<Mask, identity_codec<float>>(test::small_layout(), nullptr);
}

TEST_CASE_TEMPLATE("fp16 and bf16 codecs: the device engine equals the host engine", Codec,
                   fp16_codec, bf16_codec) {
  // Values with 10 significant bits: exact in fp16, rounded in bf16 (the same way on both).
  check_against_host<bitmap_mask, Codec>(test::small_layout(), nullptr);
  check_against_host<index_mask, Codec>(test::small_layout(), nullptr);
}

TEST_CASE("double gradients, one big bucket, a non-default stream") {
  cudaStream_t s = nullptr;
  PACTRAIN_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  {
    param_layout l(1 << 20);
    l.add("a", 1000, 300).add("b", 300).add("c", 4099);
    check_against_host<bitmap_mask, identity_codec<double>>(l, s);
  }
  PACTRAIN_CUDA_TRY(cudaStreamDestroy(s));
}

TEST_CASE("steps on alternating streams stay ordered") {
  const auto l = test::small_layout();
  pactrain::sync<bitmap_mask, cuda_compactor, nccl_communicator> ds{nccl_communicator{nccl()}, l};
  const auto masks = test::masks_for<bitmap_mask>(l, 0.5, 9);
  ds.set_masks(masks);
  cudaStream_t s[2];
  for (auto& x : s) PACTRAIN_CUDA_TRY(cudaStreamCreateWithFlags(&x, cudaStreamNonBlocking));
  {
    std::vector<device_array<float>> g;
    for (int k = 0; k < 6; ++k) g.emplace_back(test::values<float>(l.total_size(), 30 + k));
    for (int k = 0; k < 6; ++k) ds.allreduce_async(g[k].span(), s[k % 2]);  // never syncs
    for (auto& x : s) PACTRAIN_CUDA_TRY(cudaStreamSynchronize(x));
    for (int k = 0; k < 6; ++k) {
      CHECK(test::bad_entries(
                g[k].host(), test::masked(l, masks, test::values<float>(l.total_size(), 30 + k))) ==
            0);
    }
    CHECK(ds.stats().steps == 6);
  }
  for (auto& x : s) PACTRAIN_CUDA_TRY(cudaStreamDestroy(x));
}

TEST_CASE("a fully pruned model sends nothing and zeroes everything") {
  const auto l = test::small_layout();
  pactrain::sync<bitmap_mask, cuda_compactor, nccl_communicator> ds{nccl_communicator{nccl()}, l};
  ds.set_masks(test::masks_for<bitmap_mask>(l, 0.0, 1));
  device_array<float> g(test::values<float>(l.total_size(), 1));
  ds.allreduce(g.data(), g.size());
  CHECK(test::same_bits(g.host(), std::vector<float>(l.total_size(), 0.0f)));
  CHECK(ds.stats().collectives == 0);
  CHECK(ds.stats().bytes_sent == 0);
}

TEST_CASE("bad input is rejected before anything is queued") {
  const auto l = test::small_layout();
  pactrain::sync<bitmap_mask, cuda_compactor, nccl_communicator> ds{nccl_communicator{nccl()}, l};
  const auto masks = test::masks_for<bitmap_mask>(l, 0.5, 5);
  ds.set_masks(masks);
  const auto g0 = test::values<float>(l.total_size(), 2);
  device_array<float> g(g0);
  std::vector<float> host = g0;
  CHECK_THROWS_WITH_AS(ds.allreduce(std::span<float>(host)),
                       doctest::Contains("gradient buffer is not device memory"), error);
  CHECK(host == g0);
  CHECK_THROWS_WITH_AS(ds.allreduce(g.span().first(783)),
                       doctest::Contains("buffer has 783 entries, the layout 784"), error);
  CHECK_THROWS_WITH_AS(ds.allreduce(static_cast<float*>(nullptr), 5),
                       doctest::Contains("null buffer"), error);
  CHECK(g.host() == g0);
  auto wrong = masks;
  wrong[3] = bitmap_mask::full(10);
  CHECK_THROWS_WITH_AS(ds.set_masks(wrong),
                       doctest::Contains("mask of tensor 'fc2.weight' has 10 entries"), error);
  CHECK_THROWS_WITH_AS(ds.set_strategies({bucket_strategy::dense}),
                       doctest::Contains("1 strategies given for 3 buckets"), error);
  CHECK_THROWS_WITH_AS(ds.set_strategies({bucket_strategy::dense, bucket_strategy::sparse_plain,
                                          bucket_strategy::sparse}),
                       doctest::Contains("runs the sparse and dense strategies only"), error);
  CHECK_THROWS_WITH_AS(ds.reject_masks("policy failed"),
                       doctest::Contains("rejected on rank 0: policy failed"), error);
  CHECK(ds.masks() == masks);
  ds.allreduce(g.span());
  CHECK(test::bad_entries(g.host(), test::masked(l, masks, g0)) == 0);
}
