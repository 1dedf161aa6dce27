// Functors over the 64-bit words the device engine reduces and flags: scale words holding
// float bits (ternary_codec's scales, reduced with MAX over ranks), and per-bucket flags (a
// synchronous step's deferred verdict). Internal; callable on host and device.
#pragma once

#include <cuda/std/bit>

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace pactrain::detail {

/// The float whose bits a scale word holds.
_CCCL_HOST_DEVICE inline float scale_of_word(std::uint64_t w) noexcept {
  return cuda::std::bit_cast<float>(static_cast<std::uint32_t>(w));
}
_CCCL_HOST_DEVICE inline bool finite_word(std::uint64_t w) noexcept {
  return (w & 0x7f800000u) != 0x7f800000u;
}

/// *p = max(*p, v), atomically.
_CCCL_HOST_DEVICE inline void atomic_max(std::uint64_t* p, std::uint64_t v) noexcept {
#if defined(__CUDA_ARCH__)
  atomicMax(reinterpret_cast<unsigned long long*>(p), static_cast<unsigned long long>(v));
#else
  std::atomic_ref<std::uint64_t> a(*p);
  std::uint64_t cur = a.load(std::memory_order_relaxed);
  while (cur < v && !a.compare_exchange_weak(cur, v, std::memory_order_relaxed)) {
  }
#endif
}

/// Scale words of a codec input: one per block of `block` entries, or one for all (0).
struct scale_words {
  const std::uint64_t* words;
  std::size_t block;
  _CCCL_HOST_DEVICE float of(std::size_t e) const noexcept {
    return scale_of_word(words[block == 0 ? 0 : e / block]);
  }
};

/// *out = max(*out, words[k]) for item k: a bucket's largest scale, non-finite when any is.
struct max_word_op {
  const std::uint64_t* words;
  std::uint64_t* out;
  _CCCL_HOST_DEVICE void operator()(std::size_t k) const noexcept { atomic_max(out, words[k]); }
};

/// dst[k] = src[k] when the step's verdict (*ok) is finite: previous_max keeps its scales.
struct keep_scales_op {
  const std::uint64_t* src;
  std::uint64_t* dst;
  const int* ok;
  _CCCL_HOST_DEVICE void operator()(std::size_t k) const noexcept {
    if (*ok != 0) dst[k] = src[k];
  }
};

/// *flag = 1 where x[i] (float or double) has every exponent bit set: an Inf or a NaN, whatever
/// the compiler's floating-point flags.
template <class T>
struct nonfinite_flag_op {
  const T* x;
  std::uint64_t* flag;
  _CCCL_HOST_DEVICE void operator()(std::size_t i) const noexcept {
    bool finite = true;
    if constexpr (sizeof(T) == 4) {
      finite = (cuda::std::bit_cast<std::uint32_t>(x[i]) & 0x7f800000u) != 0x7f800000u;
    } else {
      finite =
          (cuda::std::bit_cast<std::uint64_t>(x[i]) & 0x7ff0000000000000u) != 0x7ff0000000000000u;
    }
    if (!finite) atomic_max(flag, 1);
  }
};

}  // namespace pactrain::detail
