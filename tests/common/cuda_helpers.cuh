// Helpers shared by the device tests (tests/cuda/*.cu): the GPU check, device arrays filled
// from and read back into host vectors (common/device_array.hpp).
#pragma once

#if !defined(__CUDACC__)
#error "tests/common/cuda_helpers.cuh needs nvcc"
#endif

#include <pactrain/cuda/detail/cuda_exec.cuh>
#include <pactrain/cuda/detail/cuda_runtime.hpp>

#include "common/device_array.hpp"

#include <cstdio>
#include <cstring>
#include <span>
#include <utility>
#include <vector>

namespace pactrain::test {

/// Exit code that ctest reports as "skipped" (SKIP_RETURN_CODE).
inline constexpr int skip_code = 77;

/// True when a CUDA device can run the test; prints why not otherwise.
inline bool have_gpu() {
  if (detail::cuda_device_count() > 0) return true;
  std::printf("no CUDA device usable: %s: test skipped\n", detail::cuda_device_status().c_str());
  return false;
}

/// A device array on the CUDA backend (cuda_compactor's), complete on every stream after each
/// copy.
template <class T>
using device_array = basic_device_array<T, detail::cuda_exec>;

}  // namespace pactrain::test
