// Helpers shared by the device tests (tests/cuda/*.cu): the GPU check, device arrays filled
// from and read back into host vectors.
#pragma once

#if !defined(__CUDACC__)
#error "tests/common/cuda_helpers.cuh needs nvcc"
#endif

#include <pactrain/detail/cuda_runtime.hpp>

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
  std::printf("no CUDA device found: test skipped\n");
  return false;
}

/// A device array with synchronous copies to and from host vectors (tests only).
template <class T>
class device_array {
 public:
  device_array() = default;
  // Allocated on the legacy default stream, then synchronised: usable on any stream.
  explicit device_array(std::size_t n) : buf_(n, nullptr) {
    PACTRAIN_CUDA_TRY(cudaStreamSynchronize(nullptr));
  }
  explicit device_array(const std::vector<T>& v) : device_array(v.size()) { assign(v); }

  void assign(const std::vector<T>& v) {
    if (!v.empty()) {
      PACTRAIN_CUDA_TRY(
          cudaMemcpy(buf_.data(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
    }
  }
  void fill_bytes(int byte) {
    if (!buf_.empty()) PACTRAIN_CUDA_TRY(cudaMemset(buf_.data(), byte, buf_.size() * sizeof(T)));
  }
  [[nodiscard]] std::vector<T> host() const {
    PACTRAIN_CUDA_TRY(cudaDeviceSynchronize());
    std::vector<T> v(buf_.size());
    if (!v.empty()) {
      PACTRAIN_CUDA_TRY(
          cudaMemcpy(v.data(), buf_.data(), v.size() * sizeof(T), cudaMemcpyDeviceToHost));
    }
    return v;
  }
  [[nodiscard]] T* data() noexcept { return buf_.data(); }
  [[nodiscard]] std::size_t size() const noexcept { return buf_.size(); }
  [[nodiscard]] std::span<T> span() noexcept { return {buf_.data(), buf_.size()}; }
  [[nodiscard]] std::span<const T> cspan() const noexcept { return {buf_.data(), buf_.size()}; }

 private:
  detail::device_buffer<T> buf_;
};

/// Bit-for-bit equality (tells +0 from -0).
template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

/// Number of entries that differ bit for bit (plus one if the sizes differ).
template <class T>
std::size_t bad_entries(const std::vector<T>& a, const std::vector<T>& b) {
  std::size_t bad = a.size() != b.size();
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) {
    bad += std::memcmp(&a[i], &b[i], sizeof(T)) != 0;
  }
  return bad;
}

}  // namespace pactrain::test
