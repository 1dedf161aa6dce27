// nccl_communicator: pactrain's collectives over an NCCL communicator the user owns.
//
//   ncclComm_t comm;  ncclCommInitRank(&comm, nranks, id, rank);   // the user's
//   pactrain::nccl_communicator c{comm, stream};
//   c.allreduce_async(device_span, pactrain::reduce_op::sum);      // queued on `stream`
//
// Needs NCCL and the CUDA runtime (link pactrain::nccl); compiles with a host compiler.
//
// Device buffers are stream-ordered: allreduce_async and broadcast_async queue the collective
// on the stream (the communicator's, or the one passed last) and return at once; work queued
// after them on that stream sees the result. The request's wait() synchronises that stream.
// allreduce and broadcast also synchronise it before returning.
//
// Host buffers (the sync engine's mask agreement sends a few uint64 words from host memory)
// are staged through a small device buffer synchronously: copied in, reduced, copied back,
// the stream synchronised. Meant for a handful of words, not for gradients.
#pragma once

#include <pactrain/communicator.hpp>
#include <pactrain/concepts.hpp>
#include <pactrain/cuda/detail/cuda_runtime.hpp>
#include <pactrain/error.hpp>
#include <pactrain/half.hpp>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <utility>

namespace pactrain {

/// A failed NCCL call: the message names the call, NCCL's error text and where it was made.
class nccl_error : public communication_error {
 public:
  nccl_error(const std::string& what, ncclResult_t code, std::string call, std::string file,
             int line)
      : communication_error(what),
        code_(code),
        call_(std::move(call)),
        file_(std::move(file)),
        line_(line) {}
  [[nodiscard]] ncclResult_t code() const noexcept { return code_; }
  [[nodiscard]] const std::string& call() const noexcept { return call_; }
  [[nodiscard]] const std::string& file() const noexcept { return file_; }
  [[nodiscard]] int line() const noexcept { return line_; }

 private:
  ncclResult_t code_;
  std::string call_;
  std::string file_;
  int line_ = 0;
};

namespace detail {

inline void nccl_check(ncclResult_t rc, ncclComm_t comm, const char* call, const char* file,
                       int line) {
  if (rc == ncclSuccess) return;
  std::string what = std::string("pactrain: ") + call + " failed: " + ncclGetErrorString(rc);
  if (comm != nullptr) {
    const char* last = ncclGetLastError(comm);
    if (last != nullptr && *last != '\0') what += std::string(" (") + last + ")";
  }
  what += std::string(" at ") + file + ":" + std::to_string(line);
  throw nccl_error(what, rc, call, file, line);
}

template <class T>
constexpr ncclDataType_t nccl_type() noexcept {
  if constexpr (std::is_same_v<T, float>) return ncclFloat32;
  if constexpr (std::is_same_v<T, double>) return ncclFloat64;
  if constexpr (std::is_same_v<T, std::int32_t>) return ncclInt32;
  if constexpr (std::is_same_v<T, std::uint32_t>) return ncclUint32;
  if constexpr (std::is_same_v<T, std::int64_t>) return ncclInt64;
  if constexpr (std::is_same_v<T, std::uint64_t>) return ncclUint64;
  if constexpr (std::is_same_v<T, std::byte>) return ncclUint8;
  if constexpr (std::is_same_v<T, half>) return ncclFloat16;
  if constexpr (std::is_same_v<T, bfloat16>) return ncclBfloat16;
}

constexpr ncclRedOp_t nccl_op(reduce_op op) noexcept {
  switch (op) {
    case reduce_op::sum: return ncclSum;
    case reduce_op::max: return ncclMax;
    case reduce_op::min: return ncclMin;
  }
  return ncclSum;
}

}  // namespace detail
}  // namespace pactrain

/// Runs an NCCL call on communicator `comm` and throws pactrain::nccl_error when it fails.
#define PACTRAIN_NCCL_TRY(comm, call) \
  ::pactrain::detail::nccl_check((call), (comm), #call, __FILE__, __LINE__)

namespace pactrain {

/// Collectives over a borrowed ncclComm_t, which must outlive this object (see the top of this
/// file). Every rank calls the same collectives with the same sizes in the same order (NCCL's
/// rule); half and bfloat16 are reduced by NCCL natively.
class nccl_communicator {
 public:
  /// The gradients it reduces are device buffers: sync<nccl_communicator> takes cuda_compactor.
  static constexpr memory_space memory = memory_space::device;

  /// A queued collective on a stream; wait() synchronises the stream. Destroying a request
  /// without waiting is fine: the collective stays ordered on its stream.
  class request_type {
   public:
    request_type() = default;
    explicit request_type(cudaStream_t s) noexcept : stream_(s), pending_(true) {}
    void wait() {
      if (!pending_) return;
      pending_ = false;
      PACTRAIN_CUDA_TRY(cudaStreamSynchronize(stream_));
    }
    /// True once the stream has finished the work queued before the collective and the
    /// collective itself.
    [[nodiscard]] bool test() {
      if (!pending_) return true;
      const cudaError_t rc = cudaStreamQuery(stream_);
      if (rc == cudaErrorNotReady) {
        (void)cudaGetLastError();
        return false;
      }
      PACTRAIN_CUDA_TRY(rc);
      pending_ = false;
      return true;
    }

   private:
    cudaStream_t stream_ = nullptr;
    bool pending_ = false;
  };

  /// Borrows `comm`; collectives default to `stream` (the legacy default stream when null).
  /// Throws pactrain::error for a null communicator, nccl_error when NCCL cannot report its
  /// rank and size.
  explicit nccl_communicator(ncclComm_t comm, cudaStream_t stream = nullptr)
      : comm_(comm), stream_(stream) {
    PACTRAIN_EXPECTS(comm != nullptr, "nccl_communicator: null ncclComm_t given");
    PACTRAIN_NCCL_TRY(comm_, ncclCommUserRank(comm_, &rank_));
    PACTRAIN_NCCL_TRY(comm_, ncclCommCount(comm_, &size_));
  }

  nccl_communicator(nccl_communicator&& o) noexcept
      : comm_(std::exchange(o.comm_, nullptr)),
        stream_(o.stream_),
        rank_(o.rank_),
        size_(o.size_),
        staging_(std::move(o.staging_)) {}
  nccl_communicator& operator=(nccl_communicator&& o) noexcept {
    comm_ = std::exchange(o.comm_, nullptr);
    stream_ = o.stream_;
    rank_ = o.rank_;
    size_ = o.size_;
    staging_ = std::move(o.staging_);
    return *this;
  }
  nccl_communicator(const nccl_communicator&) = delete;
  nccl_communicator& operator=(const nccl_communicator&) = delete;
  ~nccl_communicator() = default;

  [[nodiscard]] int rank() const noexcept { return rank_; }
  [[nodiscard]] int size() const noexcept { return size_; }
  [[nodiscard]] ncclComm_t native() const noexcept { return comm_; }
  /// The stream collectives use unless one is passed.
  [[nodiscard]] cudaStream_t stream() const noexcept { return stream_; }

  /// Queues an in-place allreduce of a device buffer on `stream` (host buffers: staged, see
  /// the top of this file). Never synchronises for device buffers.
  template <wire_value T>
  request_type allreduce_async(std::span<T> data, reduce_op op) {
    return allreduce_async(data, op, stream_);
  }
  template <wire_value T>
  request_type allreduce_async(std::span<T> data, reduce_op op, cudaStream_t stream) {
    check(data.data(), data.size(), "allreduce");
    return run(data, stream, [&](T* d) {
      PACTRAIN_NCCL_TRY(comm_, ncclAllReduce(d, d, data.size(), detail::nccl_type<T>(),
                                             detail::nccl_op(op), comm_, stream));
    });
  }

  /// allreduce_async, then waits for the result.
  template <wire_value T>
  void allreduce(std::span<T> data, reduce_op op) {
    allreduce_async(data, op, stream_).wait();
  }
  template <wire_value T>
  void allreduce(std::span<T> data, reduce_op op, cudaStream_t stream) {
    allreduce_async(data, op, stream).wait();
  }

  /// Queues an in-place broadcast from `root` on `stream` (host buffers: staged).
  template <wire_value T>
  request_type broadcast_async(std::span<T> data, int root, cudaStream_t stream) {
    check(data.data(), data.size(), "broadcast");
    PACTRAIN_EXPECTS(root >= 0 && root < size_, "nccl_communicator::broadcast: root " +
                                                    std::to_string(root) + " out of range");
    return run(data, stream, [&](T* d) {
      PACTRAIN_NCCL_TRY(
          comm_, ncclBroadcast(d, d, data.size(), detail::nccl_type<T>(), root, comm_, stream));
    });
  }

  /// broadcast_async, then waits for the result.
  template <wire_value T>
  void broadcast(std::span<T> data, int root) {
    broadcast_async(data, root, stream_).wait();
  }
  template <wire_value T>
  void broadcast(std::span<T> data, int root, cudaStream_t stream) {
    broadcast_async(data, root, stream).wait();
  }

  /// ncclGroupStart/ncclGroupEnd: collectives queued between them (e.g. one per bucket) are
  /// launched together. Host buffers must not be used inside a group.
  void group_start() { PACTRAIN_NCCL_TRY(comm_, ncclGroupStart()); }
  void group_end() { PACTRAIN_NCCL_TRY(comm_, ncclGroupEnd()); }

  /// Throws nccl_error if NCCL has recorded an asynchronous error on the communicator (e.g.
  /// a peer failed); a job should then abort the communicator.
  void check_async_error() const {
    ncclResult_t async = ncclSuccess;
    PACTRAIN_NCCL_TRY(comm_, ncclCommGetAsyncError(comm_, &async));
    PACTRAIN_NCCL_TRY(comm_, async);
  }

 private:
  void check(const void* p, std::size_t n, const char* op) const {
    PACTRAIN_EXPECTS(comm_ != nullptr,
                     std::string("nccl_communicator::") + op + ": moved-from communicator");
    PACTRAIN_EXPECTS(p != nullptr || n == 0,
                     std::string("nccl_communicator::") + op + ": null buffer");
  }

  // Queues `enqueue` (a collective on a device pointer) on the data itself, or on a staged
  // copy of host data.
  template <class T, class F>
  request_type run(std::span<T> data, cudaStream_t stream, F&& enqueue) {
    if (data.empty()) return {};
    if (!detail::is_device_pointer(data.data())) {
      staged(data, stream, enqueue);
      return {};
    }
    enqueue(data.data());
    return request_type(stream);
  }

  // Host data: copy into the staging buffer, run `collective` on it, copy back, synchronise.
  template <class T, class F>
  void staged(std::span<T> data, cudaStream_t stream, F&& collective) {
    const std::size_t bytes = data.size_bytes();
    if (staging_.size() < bytes || staging_.stream() != stream) {
      staging_ = detail::device_buffer<std::byte>(bytes < 4096 ? 4096 : bytes, stream);
    }
    T* d = reinterpret_cast<T*>(staging_.data());
    PACTRAIN_CUDA_TRY(cudaMemcpyAsync(d, data.data(), bytes, cudaMemcpyHostToDevice, stream));
    collective(d);
    PACTRAIN_CUDA_TRY(cudaMemcpyAsync(data.data(), d, bytes, cudaMemcpyDeviceToHost, stream));
    PACTRAIN_CUDA_TRY(cudaStreamSynchronize(stream));
  }

  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  int rank_ = 0;
  int size_ = 1;
  detail::device_buffer<std::byte> staging_;
};

static_assert(communicator<nccl_communicator>);

}  // namespace pactrain
