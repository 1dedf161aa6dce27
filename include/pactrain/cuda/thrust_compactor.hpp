// thrust_compactor: cuda_compactor's operations as Thrust algorithms over the same per-element
// functors (cuda/detail/device_ops.hpp), on whichever device system Thrust is built for.
//
//   // nvcc: the GPU (Thrust's CUDA system), the reference for cuda_compactor's kernels
//   // g++ -I<CUDA>/include/cccl -DTHRUST_DEVICE_SYSTEM=THRUST_DEVICE_SYSTEM_CPP: the CPU
//   pactrain::thrust_compactor c;
//   auto plan = c.make_plan(mask);
//   c.gather(plan, dense, payload);   // buffers in Thrust's device memory
//
// The same contract and results, bit for bit, as cuda_compactor and host_compactor. On the CPU
// systems (CPP, OMP) device memory is host memory and streams are in order; on CUDA, buffers
// are allocated with cudaMalloc (not stream-ordered) and work is queued on the given stream.
// This is the slower, simpler path: use cuda_compactor on a GPU.
//
// The device sync engine runs over it too: sync<Comm, Codec, Mask, thrust_compactor>, with
// a stream-ordered communicator on CUDA, and with any host communicator (mpi_communicator,
// loopback_communicator) on the CPU systems, where device memory is host memory.
#pragma once

#include <thrust/detail/config.h>

#if THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_CUDA && !defined(__CUDACC__)
#error \
    "pactrain/cuda/thrust_compactor.hpp on Thrust's CUDA system needs nvcc; with a host compiler, define THRUST_DEVICE_SYSTEM=THRUST_DEVICE_SYSTEM_CPP (or _OMP)"
#endif

#include <pactrain/cuda/detail/device_compactor.hpp>
#include <pactrain/cuda/detail/device_engine.hpp>
#include <pactrain/cuda/detail/device_ops.hpp>

#include <thrust/copy.h>
#include <thrust/device_ptr.h>
#include <thrust/device_vector.h>
#include <thrust/execution_policy.h>
#include <thrust/fill.h>
#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/transform_iterator.h>
#include <thrust/scan.h>

#if THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_CUDA
#include <pactrain/cuda/detail/cuda_runtime.hpp>

#include <cuda/stream_ref>
#endif

#include <cstddef>
#include <cstdint>

namespace pactrain {

namespace detail {

/// Runs device_ops functors with Thrust algorithms (see the top of this file).
struct thrust_exec {
  static constexpr memory_space memory = memory_space::device;
  static constexpr const char* name = "thrust_compactor";
  static constexpr const char* gather_where = "thrust_compactor::gather: ";
  static constexpr const char* scatter_where = "thrust_compactor::scatter: ";

#if THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_CUDA
  using stream_type = cuda::stream_ref;
  using event = cuda_event;
  static constexpr bool host_accessible = false;
  static cudaStream_t native(stream_type s) noexcept { return s.get(); }
  static auto policy(stream_type s) { return thrust::cuda::par_nosync.on(s.get()); }
#else
  /// The CPU systems run every call to completion, in call order: one implicit stream.
  struct stream_type {
    friend bool operator==(stream_type, stream_type) = default;
  };
  /// Nothing to order: every call has finished when it returns.
  struct event {
    void record(stream_type) noexcept {}
    void order(stream_type) const noexcept {}
    void wait() const noexcept {}
    void wait_noexcept() const noexcept {}
  };
  /// Device memory is host memory: the engine may use any host communicator.
  static constexpr bool host_accessible = true;
  static stream_type native(stream_type s) noexcept { return s; }
  static auto policy(stream_type) { return thrust::device; }
#endif

  /// An array in Thrust's device memory. The stream is accepted for the Exec interface;
  /// Thrust allocates without one.
  template <class T>
  class buffer {
   public:
    buffer() = default;
    buffer(std::size_t n, stream_type) : v_(n) {}
    [[nodiscard]] T* data() noexcept { return thrust::raw_pointer_cast(v_.data()); }
    [[nodiscard]] const T* data() const noexcept { return thrust::raw_pointer_cast(v_.data()); }
    [[nodiscard]] std::size_t size() const noexcept { return v_.size(); }
    [[nodiscard]] bool empty() const noexcept { return v_.empty(); }

   private:
    thrust::device_vector<T> v_;
  };

  template <class F>
  void for_each(std::size_t n, const F& f, stream_type s) const {
    if (n == 0) return;
    thrust::for_each(policy(s), thrust::counting_iterator<std::size_t>(0),
                     thrust::counting_iterator<std::size_t>(n), f);
  }

  void exclusive_popcount_scan(const std::uint64_t* words, std::uint64_t* out, std::size_t n,
                               stream_type s) const {
    if (n == 0) return;
    const auto counts =
        thrust::make_transform_iterator(thrust::device_pointer_cast(words), popcount_op{});
    thrust::exclusive_scan(policy(s), counts, counts + static_cast<std::ptrdiff_t>(n),
                           thrust::device_pointer_cast(out), std::uint64_t{0});
  }

  template <class T>
  void upload(T* dst, const T* src, std::size_t n, stream_type) const {
    if (n == 0) return;
    thrust::copy(src, src + n, thrust::device_pointer_cast(dst));
  }

  template <class T>
  void download(T* dst, const T* src, std::size_t n, stream_type) const {
    if (n == 0) return;
    thrust::copy(thrust::device_pointer_cast(src), thrust::device_pointer_cast(src + n), dst);
  }

  template <class T>
  void copy(T* dst, const T* src, std::size_t n, stream_type s) const {
    if (n == 0) return;
    thrust::copy(policy(s), thrust::device_pointer_cast(src), thrust::device_pointer_cast(src + n),
                 thrust::device_pointer_cast(dst));
  }

  template <class T>
  void zero(T* p, std::size_t n, stream_type s) const {
    if (n == 0) return;
    thrust::fill(policy(s), thrust::device_pointer_cast(p), thrust::device_pointer_cast(p + n),
                 T(0));
  }

  void synchronize([[maybe_unused]] stream_type s) const {
#if THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_CUDA
    PACTRAIN_CUDA_TRY(cudaStreamSynchronize(s.get()));
#endif
  }

  static void expect_device([[maybe_unused]] const void* p, [[maybe_unused]] std::size_t n,
                            [[maybe_unused]] const char* where, [[maybe_unused]] const char* what) {
#if THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_CUDA
    expect_device_buffer(p, n, where, what);
#endif
  }
};

}  // namespace detail

/// The device compactor over Thrust algorithms (see the top of this file).
using thrust_compactor = basic_device_compactor<detail::thrust_exec>;

static_assert(compactor_for<thrust_compactor, bitmap_mask, float>);
static_assert(compactor_for<thrust_compactor, index_mask, double>);
static_assert(compactor_for<thrust_compactor, block_mask<32>, float>);

}  // namespace pactrain
