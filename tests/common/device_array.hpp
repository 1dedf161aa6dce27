// A device array for tests over any device compactor's execution backend (cuda_exec, or
// thrust_exec on Thrust's CUDA or CPU systems), filled from and read back into host vectors.
// Every copy is complete, on every stream, when it returns: tests launch on non-blocking
// streams right after an upload.
#pragma once

#include <thrust/detail/config.h>

#if THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_CUDA
#include <pactrain/cuda/detail/cuda_runtime.hpp>
#endif

#include <cstddef>
#include <cstring>
#include <span>
#include <vector>

namespace pactrain::test {

/// Waits until all queued device work, on every stream, has finished (nothing to wait for on
/// Thrust's CPU systems).
inline void device_synchronize() {
#if THRUST_DEVICE_SYSTEM == THRUST_DEVICE_SYSTEM_CUDA
  PACTRAIN_CUDA_TRY(cudaDeviceSynchronize());
#endif
}

template <class T, class Exec>
class basic_device_array {
 public:
  basic_device_array() = default;
  explicit basic_device_array(std::size_t n) : buf_(n, {}) { device_synchronize(); }
  explicit basic_device_array(const std::vector<T>& v) : basic_device_array(v.size()) { assign(v); }

  void assign(const std::vector<T>& v) {
    Exec{}.upload(buf_.data(), v.data(), v.size(), {});
    device_synchronize();
  }
  /// Every byte set to `byte` (to see which entries a kernel writes).
  void fill_bytes(int byte) {
    std::vector<T> v(buf_.size());
    if (!v.empty()) std::memset(static_cast<void*>(v.data()), byte, v.size() * sizeof(T));
    assign(v);
  }
  [[nodiscard]] std::vector<T> host() const {
    device_synchronize();
    std::vector<T> v(buf_.size());
    Exec{}.download(v.data(), buf_.data(), v.size(), {});
    return v;
  }
  [[nodiscard]] T* data() noexcept { return buf_.data(); }
  [[nodiscard]] std::size_t size() const noexcept { return buf_.size(); }
  [[nodiscard]] std::span<T> span() noexcept { return {buf_.data(), buf_.size()}; }
  [[nodiscard]] std::span<const T> cspan() const noexcept { return {buf_.data(), buf_.size()}; }

 private:
  typename Exec::template buffer<T> buf_;
};

/// Bit-for-bit equality (tells +0 from -0).
template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

/// Number of entries that differ bit for bit (plus one if the sizes differ); with any_nan, two
/// NaNs match whatever their payloads.
template <class T>
std::size_t bad_entries(const std::vector<T>& a, const std::vector<T>& b, bool any_nan = false) {
  std::size_t bad = a.size() != b.size();
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) {
    if (any_nan && a[i] != a[i] && b[i] != b[i]) continue;  // NaN against NaN, any payload
    bad += std::memcmp(&a[i], &b[i], sizeof(T)) != 0;
  }
  return bad;
}

}  // namespace pactrain::test
