// cuda_exec: how basic_device_compactor and the device engine run on a CUDA GPU with
// hand-written kernels (the device_ops functors in grid-stride loops) and CUB. Internal; the
// public name is cuda_compactor (<pactrain/cuda/compactor.cuh>).
#pragma once

#if !defined(__CUDACC__)
#error "pactrain/cuda/detail/cuda_exec.cuh needs nvcc (CUDA)"
#endif

#include <pactrain/compactor.hpp>
#include <pactrain/cuda/detail/device_ops.hpp>
#include <pactrain/cuda/detail/cuda_runtime.hpp>
#include <pactrain/error.hpp>

#include <thrust/iterator/transform_iterator.h>
#include <cub/device/device_scan.cuh>
#include <cuda/stream_ref>

#include <cstddef>
#include <cstdint>

namespace pactrain::detail {

inline constexpr unsigned kernel_block = 256;

// f(k) for k in [0, n), grid-stride.
template <class F>
__global__ void __launch_bounds__(kernel_block) for_each_kernel(F f, std::size_t n) {
  for (std::size_t k = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; k < n;
       k += std::size_t{gridDim.x} * blockDim.x) {
    f(k);
  }
}

/// Runs device_ops functors as CUDA kernels on a stream. `max_blocks` caps the grid; the
/// loops stride beyond it (tests lower it to run the striding path on small inputs).
struct cuda_exec {
  static constexpr memory_space memory = memory_space::device;
  static constexpr const char* name = "cuda_compactor";
  static constexpr const char* gather_where = "cuda_compactor::gather: ";
  static constexpr const char* scatter_where = "cuda_compactor::scatter: ";
  using stream_type = cuda::stream_ref;
  /// device_buffer, allocated on a stream_ref.
  template <class T>
  class buffer : public device_buffer<T> {
   public:
    buffer() = default;
    buffer(std::size_t n, stream_type s) : device_buffer<T>(n, s.get()) {}
  };
  using event = cuda_event;
  /// Device memory is not host memory: communicators must be stream-ordered.
  static constexpr bool host_accessible = false;
  static cudaStream_t native(stream_type s) noexcept { return s.get(); }

  unsigned max_blocks = 1U << 20;

  /// f(k) for k in [0, n), queued on s.
  template <class F>
  void for_each(std::size_t n, const F& f, stream_type s) const {
    if (n == 0) return;
    const std::size_t want = (n + kernel_block - 1) / kernel_block;
    const auto blocks = static_cast<unsigned>(want < max_blocks ? want : max_blocks);
    for_each_kernel<<<blocks, kernel_block, 0, s.get()>>>(f, n);
    PACTRAIN_CUDA_TRY(cudaGetLastError());
  }

  /// out[w] = popcount(words[0]) + ... + popcount(words[w - 1]), queued on s (CUB's scan over
  /// a popcount iterator: no buffer of counts).
  void exclusive_popcount_scan(const std::uint64_t* words, std::uint64_t* out, std::size_t n,
                               stream_type s) const {
    if (n == 0) return;
    const auto counts = thrust::make_transform_iterator(words, popcount_op{});
    std::size_t temp_bytes = 0;
    PACTRAIN_CUDA_TRY(cub::DeviceScan::ExclusiveSum(nullptr, temp_bytes, counts, out, n, s.get()));
    // CUB always needs some scratch for a non-empty scan; zero would mean no scan ran.
    PACTRAIN_EXPECTS(temp_bytes != 0, "cuda_compactor: CUB reported no scratch for the rank scan");
    device_buffer<std::byte> temp(temp_bytes, s.get());
    PACTRAIN_CUDA_TRY(
        cub::DeviceScan::ExclusiveSum(temp.data(), temp_bytes, counts, out, n, s.get()));
  }

  /// Copies n values from pageable host memory; staged before this returns, so `src` may go.
  template <class T>
  void upload(T* dst, const T* src, std::size_t n, stream_type s) const {
    if (n == 0) return;
    PACTRAIN_CUDA_TRY(cudaMemcpyAsync(dst, src, n * sizeof(T), cudaMemcpyHostToDevice, s.get()));
  }

  /// Copies n values to host memory and waits for them.
  template <class T>
  void download(T* dst, const T* src, std::size_t n, stream_type s) const {
    if (n == 0) return;
    PACTRAIN_CUDA_TRY(cudaMemcpyAsync(dst, src, n * sizeof(T), cudaMemcpyDeviceToHost, s.get()));
    PACTRAIN_CUDA_TRY(cudaStreamSynchronize(s.get()));
  }

  /// dst[0, n) = src[0, n) between device buffers, queued on s.
  template <class T>
  void copy(T* dst, const T* src, std::size_t n, stream_type s) const {
    if (n == 0) return;
    PACTRAIN_CUDA_TRY(cudaMemcpyAsync(dst, src, n * sizeof(T), cudaMemcpyDeviceToDevice, s.get()));
  }

  /// p[0, n) = +0, queued on s.
  template <class T>
  void zero(T* p, std::size_t n, stream_type s) const {
    if (n == 0) return;
    PACTRAIN_CUDA_TRY(cudaMemsetAsync(p, 0, n * sizeof(T), s.get()));
  }

  void synchronize(stream_type s) const { PACTRAIN_CUDA_TRY(cudaStreamSynchronize(s.get())); }

  /// Throws pactrain::error unless the n-entry buffer at p is device memory.
  static void expect_device(const void* p, std::size_t n, const char* where, const char* what) {
    expect_device_buffer(p, n, where, what);
  }
};

}  // namespace pactrain::detail
