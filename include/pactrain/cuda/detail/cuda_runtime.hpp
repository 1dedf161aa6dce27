// Host-side helpers over the CUDA runtime API, shared by the .cuh headers and by nccl.hpp
// and mpi_cuda.hpp: error checking, pointer checks and a stream-ordered device buffer.
//
// Compiles with a host compiler (g++) and the CUDA toolkit's include directory; needs the
// CUDA runtime library (CUDA::cudart) at link time. No kernels here.
#pragma once

#include <pactrain/error.hpp>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>
#include <utility>

namespace pactrain::detail {

/// Throws pactrain::cuda_error unless rc is cudaSuccess. The sticky error state is cleared
/// (cudaGetLastError) so that a later call is not blamed for this one.
inline void cuda_check(cudaError_t rc, const char* call, const char* file, int line) {
  if (rc == cudaSuccess) return;
  (void)cudaGetLastError();
  throw cuda_error(std::string("pactrain: ") + call + " failed: " + cudaGetErrorName(rc) + " (" +
                       cudaGetErrorString(rc) + ") at " + file + ":" + std::to_string(line),
                   call, file, line);
}

}  // namespace pactrain::detail

/// Runs a CUDA runtime call and throws pactrain::cuda_error (with the call, file and line)
/// when it fails.
#define PACTRAIN_CUDA_TRY(call) ::pactrain::detail::cuda_check((call), #call, __FILE__, __LINE__)

namespace pactrain::detail {

/// Number of CUDA devices usable here; 0 when the runtime reports any error (no driver, no
/// device), which is how the tests decide to skip. cuda_device_status() says which error.
inline int cuda_device_count() noexcept {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

/// Why CUDA devices are or are not usable here, for messages: "1 CUDA device(s)", or the
/// runtime's error, e.g. "cudaErrorInsufficientDriver (CUDA driver version is insufficient for
/// CUDA runtime version)" when the driver is older than the runtime needs.
inline std::string cuda_device_status() {
  int n = 0;
  const cudaError_t rc = cudaGetDeviceCount(&n);
  if (rc != cudaSuccess) {
    (void)cudaGetLastError();
    return std::string(cudaGetErrorName(rc)) + " (" + cudaGetErrorString(rc) + ")";
  }
  return std::to_string(n) + " CUDA device(s)";
}

/// True when `p` can be read by device code on the current device: device memory or
/// managed memory. Host memory (registered or not) is not accepted where a kernel reads it.
inline bool is_device_pointer(const void* p) {
  cudaPointerAttributes a{};
  const cudaError_t rc = cudaPointerGetAttributes(&a, p);
  if (rc != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

/// Throws pactrain::error (naming `where` and `what`) unless the n-entry buffer at p is
/// device memory; empty buffers pass whatever their pointer. Allocates only to throw.
inline void expect_device_buffer(const void* p, std::size_t n, const char* where,
                                 const char* what) {
  if (n == 0) return;
  PACTRAIN_EXPECTS(p != nullptr, std::string(where) + "null " + what + " buffer with " +
                                     std::to_string(n) + " entries");
  PACTRAIN_EXPECTS(is_device_pointer(p),
                   std::string(where) + what + " buffer is not device memory (a host pointer?)");
}

/// An array of T in device memory, allocated and freed in stream order
/// (cudaMallocAsync/cudaFreeAsync on the stream it was created with; that stream must outlive
/// the buffer). Movable, not copyable. Contents are uninitialised.
template <class T>
class device_buffer {
 public:
  device_buffer() = default;
  device_buffer(std::size_t n, cudaStream_t stream) : size_(n), stream_(stream) {
    if (n != 0) {
      void* p = nullptr;
      PACTRAIN_CUDA_TRY(cudaMallocAsync(&p, n * sizeof(T), stream));
      data_ = static_cast<T*>(p);
    }
  }
  device_buffer(device_buffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)),
        size_(std::exchange(o.size_, 0)),
        stream_(o.stream_) {}
  device_buffer& operator=(device_buffer&& o) noexcept {
    if (this != &o) {
      release();
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
      stream_ = o.stream_;
    }
    return *this;
  }
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
  ~device_buffer() { release(); }

  [[nodiscard]] T* data() noexcept { return data_; }
  [[nodiscard]] const T* data() const noexcept { return data_; }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] bool empty() const noexcept { return size_ == 0; }
  [[nodiscard]] cudaStream_t stream() const noexcept { return stream_; }

 private:
  void release() noexcept {
    // Destructors cannot throw; a dropped error is cleared so that no later call reports it.
    if (data_ != nullptr && cudaFreeAsync(data_, stream_) != cudaSuccess) (void)cudaGetLastError();
    data_ = nullptr;
    size_ = 0;
  }
  T* data_ = nullptr;
  std::size_t size_ = 0;
  cudaStream_t stream_ = nullptr;
};

/// A host array in pinned (page-locked) memory, for staging copies. Movable, not copyable.
template <class T>
class pinned_buffer {
 public:
  pinned_buffer() = default;
  explicit pinned_buffer(std::size_t n) : size_(n) {
    if (n != 0) {
      void* p = nullptr;
      PACTRAIN_CUDA_TRY(cudaMallocHost(&p, n * sizeof(T)));
      data_ = static_cast<T*>(p);
    }
  }
  pinned_buffer(pinned_buffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  pinned_buffer& operator=(pinned_buffer&& o) noexcept {
    if (this != &o) {
      release();
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  pinned_buffer(const pinned_buffer&) = delete;
  pinned_buffer& operator=(const pinned_buffer&) = delete;
  ~pinned_buffer() { release(); }

  [[nodiscard]] T* data() noexcept { return data_; }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }

 private:
  void release() noexcept {
    if (data_ != nullptr && cudaFreeHost(data_) != cudaSuccess) (void)cudaGetLastError();
    data_ = nullptr;
    size_ = 0;
  }
  T* data_ = nullptr;
  std::size_t size_ = 0;
};

/// Marks the end of an engine's last step, so that the engine never keeps a raw stream: a
/// step on another stream waits for it on the device, and the destructor waits for it on the
/// host even after the user has destroyed that stream. Created on first use; movable.
class cuda_event {
 public:
  cuda_event() = default;
  cuda_event(cuda_event&& o) noexcept : e_(std::exchange(o.e_, nullptr)), recorded_(o.recorded_) {}
  cuda_event& operator=(cuda_event&& o) noexcept {
    if (this != &o) {
      release();
      e_ = std::exchange(o.e_, nullptr);
      recorded_ = o.recorded_;
    }
    return *this;
  }
  cuda_event(const cuda_event&) = delete;
  cuda_event& operator=(const cuda_event&) = delete;
  ~cuda_event() { release(); }

  /// Marks the point after the work queued so far on `s`.
  void record(cudaStream_t s) {
    if (e_ == nullptr) PACTRAIN_CUDA_TRY(cudaEventCreateWithFlags(&e_, cudaEventDisableTiming));
    PACTRAIN_CUDA_TRY(cudaEventRecord(e_, s));
    recorded_ = true;
  }
  /// Work queued on `s` after this call runs after the marked point.
  void order(cudaStream_t s) const {
    if (recorded_) PACTRAIN_CUDA_TRY(cudaStreamWaitEvent(s, e_, 0));
  }
  /// Waits on the host for the marked point.
  void wait() const {
    if (recorded_) PACTRAIN_CUDA_TRY(cudaEventSynchronize(e_));
  }
  /// As wait(), for destructors: an error is dropped and cleared from the runtime's last
  /// error, so that it is not reported by an unrelated later call.
  void wait_noexcept() const noexcept {
    if (recorded_ && cudaEventSynchronize(e_) != cudaSuccess) (void)cudaGetLastError();
  }

 private:
  void release() noexcept {
    if (e_ != nullptr && cudaEventDestroy(e_) != cudaSuccess) (void)cudaGetLastError();
    e_ = nullptr;
    recorded_ = false;
  }
  cudaEvent_t e_ = nullptr;
  bool recorded_ = false;
};

}  // namespace pactrain::detail
