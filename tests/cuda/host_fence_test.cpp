// The host side of the CUDA backend, compiled by the host compiler alone: the host core, the
// CUDA runtime helpers and nccl_communicator include and work without nvcc, and errors carry
// the call, file and line. Runs without a GPU.
#include <doctest/doctest.h>

#include <pactrain/cuda/detail/cuda_runtime.hpp>
#include <pactrain/pactrain.hpp>
#if __has_include(<nccl.h>)
#include <pactrain/cuda/nccl.hpp>
#define PACTRAIN_TEST_NCCL 1
#else
#define PACTRAIN_TEST_NCCL 0
#endif

#include <string>

using namespace pactrain;

TEST_CASE("a failing CUDA call throws cuda_error with the call, file and line") {
  try {
    PACTRAIN_CUDA_TRY(cudaSetDevice(-1));  // fails with or without a GPU
    FAIL("no exception");
  } catch (const cuda_error& e) {
    CHECK(e.call() == "cudaSetDevice(-1)");
    CHECK(e.file().find("host_fence_test.cpp") != std::string::npos);
    CHECK(e.line() > 0);
    CHECK(std::string(e.what()).find("cudaSetDevice(-1) failed: cuda") != std::string::npos);
  }
  // cuda_error is a pactrain::error.
  CHECK_THROWS_AS(PACTRAIN_CUDA_TRY(cudaSetDevice(-1)), error);
}

TEST_CASE("device detection and pointer checks never throw") {
  const int n = detail::cuda_device_count();
  MESSAGE("CUDA devices: " << n);
  CHECK(n >= 0);
  int local = 0;
  CHECK_FALSE(detail::is_device_pointer(&local));
  CHECK_THROWS_WITH_AS(detail::expect_device_buffer(&local, 1, "f: ", "dense"),
                       doctest::Contains("f: dense buffer is not device memory"), error);
  CHECK_THROWS_WITH_AS(detail::expect_device_buffer(nullptr, 3, "f: ", "dense"),
                       doctest::Contains("null dense buffer with 3 entries"), error);
  detail::expect_device_buffer(nullptr, 0, "f: ", "dense");  // empty: fine
  const detail::device_buffer<float> empty(0, nullptr);      // no CUDA call for 0 entries
  CHECK(empty.empty());
}

#if PACTRAIN_TEST_NCCL
TEST_CASE("nccl_communicator: concept, bad handle and error text") {
  static_assert(communicator<nccl_communicator>);
  CHECK_THROWS_WITH_AS(nccl_communicator(nullptr), doctest::Contains("null ncclComm_t"), error);
  try {
    PACTRAIN_NCCL_TRY(nullptr, ncclInvalidArgument);
    FAIL("no exception");
  } catch (const nccl_error& e) {
    CHECK(e.code() == ncclInvalidArgument);
    CHECK(e.call() == "ncclInvalidArgument");
    CHECK(e.line() > 0);
    CHECK(std::string(e.what()).find("failed: invalid argument") != std::string::npos);
  }
  CHECK(detail::nccl_type<pactrain::half>() == ncclFloat16);
  CHECK(detail::nccl_type<std::uint64_t>() == ncclUint64);
  CHECK(detail::nccl_op(reduce_op::max) == ncclMax);
}
#endif
