// mpi_cuda_communicator: MPI collectives on device buffers, for clusters without NCCL.
//
//   pactrain::mpi_cuda_communicator c{MPI_COMM_WORLD, stream};
//   c.allreduce(device_span, pactrain::reduce_op::sum);
//
// Needs MPI and the CUDA runtime (link pactrain::mpi and pactrain::cuda); compiles with a
// host compiler.
//
// Where the MPI library is CUDA-aware, device pointers go to MPI directly; otherwise they are
// staged through pinned host memory. Which one is detected at run time, not assumed: Open MPI
// built with CUDA declares MPIX_CUDA_AWARE_SUPPORT in <mpi-ext.h> and answers
// MPIX_Query_cuda_support(); any other MPI, or one built without CUDA (Debian's), is staged.
//
// MPI knows no streams, so device collectives are synchronous: the stream is synchronised
// before MPI reads the buffer and again once the result is back. allreduce_async on a device
// buffer therefore completes before returning (its request is already done); on a host
// buffer it is a real nonblocking MPI collective, as with mpi_communicator.
#pragma once

#include <pactrain/communicator.hpp>
#include <pactrain/concepts.hpp>
#include <pactrain/cuda/detail/cuda_runtime.hpp>
#include <pactrain/error.hpp>
#include <pactrain/mpi.hpp>

#include <cuda_runtime_api.h>
#include <mpi.h>
#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h>
#endif

#include <cstddef>
#include <span>
#include <string>
#include <utility>

namespace pactrain {

/// How mpi_cuda_communicator hands device buffers to MPI: direct (device pointers; the caller
/// vouches for a CUDA-aware MPI), staged (through pinned host memory), or automatic (direct
/// where the MPI library reports CUDA support, staged otherwise).
enum class mpi_device_transfer { automatic, direct, staged };

/// True when this MPI library takes device pointers (asked at run time where the library
/// can tell; false where it cannot).
inline bool mpi_cuda_aware() noexcept {
#if defined(MPIX_CUDA_AWARE_SUPPORT) && MPIX_CUDA_AWARE_SUPPORT
  return MPIX_Query_cuda_support() == 1;
#else
  return false;
#endif
}

/// MPI collectives on device or host buffers (see the top of this file). Owns an
/// mpi_communicator (a duplicate of the user's MPI_Comm, see mpi_communicator).
class mpi_cuda_communicator {
 public:
  /// The gradients it reduces are device buffers: sync<mpi_cuda_communicator> takes cuda_compactor.
  static constexpr memory_space memory = memory_space::device;

  using request_type = mpi_communicator::request_type;

  /// Collective (duplicates `comm`). Device collectives default to `stream`.
  explicit mpi_cuda_communicator(MPI_Comm comm, cudaStream_t stream = nullptr,
                                 mpi_device_transfer transfer = mpi_device_transfer::automatic)
      : mpi_(comm),
        stream_(stream),
        direct_(transfer == mpi_device_transfer::direct ||
                (transfer == mpi_device_transfer::automatic && mpi_cuda_aware())) {}

  [[nodiscard]] int rank() const noexcept { return mpi_.rank(); }
  [[nodiscard]] int size() const noexcept { return mpi_.size(); }
  [[nodiscard]] MPI_Comm native() const noexcept { return mpi_.native(); }
  [[nodiscard]] cudaStream_t stream() const noexcept { return stream_; }
  /// True when device pointers go to MPI directly, false when they are staged.
  [[nodiscard]] bool direct() const noexcept { return direct_; }

  /// In-place allreduce; device buffers after the work queued on `stream`, synchronously.
  template <wire_value T>
  void allreduce(std::span<T> data, reduce_op op, cudaStream_t stream) {
    if (!on_device(data)) {
      mpi_.allreduce(data, op);
      return;
    }
    run_on_device(data, stream, [&](std::span<T> d) { mpi_.allreduce(d, op); });
  }
  template <wire_value T>
  void allreduce(std::span<T> data, reduce_op op) {
    allreduce(data, op, stream_);
  }

  /// Host buffers: nonblocking. Device buffers: done before returning (see the top).
  template <wire_value T>
  request_type allreduce_async(std::span<T> data, reduce_op op, cudaStream_t stream) {
    if (!on_device(data)) return mpi_.allreduce_async(data, op);
    allreduce(data, op, stream);
    return {};
  }
  template <wire_value T>
  request_type allreduce_async(std::span<T> data, reduce_op op) {
    return allreduce_async(data, op, stream_);
  }

  template <wire_value T>
  void broadcast(std::span<T> data, int root, cudaStream_t stream) {
    if (!on_device(data)) {
      mpi_.broadcast(data, root);
      return;
    }
    run_on_device(data, stream, [&](std::span<T> d) { mpi_.broadcast(d, root); });
  }
  template <wire_value T>
  void broadcast(std::span<T> data, int root) {
    broadcast(data, root, stream_);
  }

 private:
  template <class T>
  static bool on_device(std::span<T> data) {
    return !data.empty() && detail::is_device_pointer(data.data());
  }

  // Runs the MPI call `f` on the data's device buffer (direct) or on a pinned copy (staged).
  template <class T, class F>
  void run_on_device(std::span<T> data, cudaStream_t stream, F&& f) {
    // 16-bit floats are reduced by pactrain's host-side MPI_Ops: always staged.
    const bool direct = direct_ && !half_value<T>;
    if (direct) {
      PACTRAIN_CUDA_TRY(cudaStreamSynchronize(stream));  // the data is ready
      f(data);
      return;
    }
    const std::size_t bytes = data.size_bytes();
    if (pinned_.size() < bytes) pinned_ = detail::pinned_buffer<std::byte>(bytes);
    T* h = reinterpret_cast<T*>(pinned_.data());
    PACTRAIN_CUDA_TRY(cudaMemcpyAsync(h, data.data(), bytes, cudaMemcpyDeviceToHost, stream));
    PACTRAIN_CUDA_TRY(cudaStreamSynchronize(stream));
    f(std::span<T>(h, data.size()));
    PACTRAIN_CUDA_TRY(cudaMemcpyAsync(data.data(), h, bytes, cudaMemcpyHostToDevice, stream));
    PACTRAIN_CUDA_TRY(cudaStreamSynchronize(stream));  // the pinned buffer is free again
  }

  mpi_communicator mpi_;
  cudaStream_t stream_ = nullptr;
  bool direct_ = false;
  detail::pinned_buffer<std::byte> pinned_;
};

static_assert(communicator<mpi_cuda_communicator>);

}  // namespace pactrain
