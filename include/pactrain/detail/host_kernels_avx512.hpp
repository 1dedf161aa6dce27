// The AVX-512 forms of the host compaction kernels (see host_kernels.hpp): vcompress and
// vexpand, one kernel per operation for float and double.
#pragma once

#include <pactrain/detail/config.hpp>

#include <cstddef>
#include <cstdint>

#if PACTRAIN_HAS_X86_KERNELS
#include <immintrin.h>

#define PACTRAIN_TARGET_AVX512 __attribute__((target("avx512f,avx2,popcnt")))

namespace pactrain::detail {

// ---- AVX-512 -----------------------------------------------------------------------------------
// vcompressps/vexpandps do the permutation in hardware; masked loads and stores never touch
// memory outside the kept lanes, so no bounds special case is needed beyond the store.
// avx512_ops<T>: a 512-bit register's lanes (16 floats or 8 doubles), its mask type and the
// intrinsics on them.

template <class T>
struct avx512_ops;

template <>
struct avx512_ops<float> {
  using vec = __m512;
  using mask = __mmask16;
  static constexpr unsigned lanes = 16;
  PACTRAIN_TARGET_AVX512 static vec set1(float x) noexcept { return _mm512_set1_ps(x); }
  PACTRAIN_TARGET_AVX512 static vec load(const float* p) noexcept { return _mm512_loadu_ps(p); }
  PACTRAIN_TARGET_AVX512 static vec load(mask m, const float* p) noexcept {
    return _mm512_maskz_loadu_ps(m, p);
  }
  PACTRAIN_TARGET_AVX512 static vec compress(mask m, vec v) noexcept {
    return _mm512_maskz_compress_ps(m, v);
  }
  PACTRAIN_TARGET_AVX512 static vec expand_mul(mask m, vec v, vec s) noexcept {
    return _mm512_maskz_mul_ps(m, _mm512_maskz_expand_ps(m, v), s);
  }
  PACTRAIN_TARGET_AVX512 static void store(float* p, vec v) noexcept { _mm512_storeu_ps(p, v); }
  PACTRAIN_TARGET_AVX512 static void store(float* p, mask m, vec v) noexcept {
    _mm512_mask_storeu_ps(p, m, v);
  }
  PACTRAIN_TARGET_AVX512 static void store_nontemporal(float* p, vec v) noexcept {
    _mm512_stream_ps(p, v);
  }
};

template <>
struct avx512_ops<double> {
  using vec = __m512d;
  using mask = __mmask8;
  static constexpr unsigned lanes = 8;
  PACTRAIN_TARGET_AVX512 static vec set1(double x) noexcept { return _mm512_set1_pd(x); }
  PACTRAIN_TARGET_AVX512 static vec load(const double* p) noexcept { return _mm512_loadu_pd(p); }
  PACTRAIN_TARGET_AVX512 static vec load(mask m, const double* p) noexcept {
    return _mm512_maskz_loadu_pd(m, p);
  }
  PACTRAIN_TARGET_AVX512 static vec compress(mask m, vec v) noexcept {
    return _mm512_maskz_compress_pd(m, v);
  }
  PACTRAIN_TARGET_AVX512 static vec expand_mul(mask m, vec v, vec s) noexcept {
    return _mm512_maskz_mul_pd(m, _mm512_maskz_expand_pd(m, v), s);
  }
  PACTRAIN_TARGET_AVX512 static void store(double* p, vec v) noexcept { _mm512_storeu_pd(p, v); }
  PACTRAIN_TARGET_AVX512 static void store(double* p, mask m, vec v) noexcept {
    _mm512_mask_storeu_pd(p, m, v);
  }
  PACTRAIN_TARGET_AVX512 static void store_nontemporal(double* p, vec v) noexcept {
    _mm512_stream_pd(p, v);
  }
};

template <class T>
PACTRAIN_TARGET_AVX512 inline std::size_t gather_words_avx512(const std::uint64_t* words,
                                                              std::size_t nwords, const T* in,
                                                              T* out, std::size_t count) noexcept {
  using V = avx512_ops<T>;
  using mask = typename V::mask;
  constexpr unsigned lanes = V::lanes;
  std::size_t k = 0;
  for (std::size_t wi = 0; wi < nwords; ++wi, in += 64) {
    const std::uint64_t w = words[wi];
    if (w == 0) continue;
    for (unsigned j = 0; j < 64 / lanes; ++j) {
      const auto m = static_cast<mask>(w >> (lanes * j));
      if (m == 0) continue;
      const unsigned pop = static_cast<unsigned>(__builtin_popcount(m));
      const typename V::vec v = V::compress(m, V::load(in + lanes * j));
      if (k + lanes <= count) {
        V::store(out + k, v);
      } else {
        V::store(out + k, static_cast<mask>((1U << pop) - 1U), v);
      }
      k += pop;
    }
  }
  return k;
}

// The scatter loads the next 16 (8) payload entries whole while that many remain, and expands
// them in registers: the memory form of vexpandps is microcoded on some cores (AMD Zen 4),
// where it made this scatter slower than the AVX2 one. NonTemporal: non-temporal stores, as the
// AVX2 scatter (out 64-byte aligned).
template <bool NonTemporal, class T>
PACTRAIN_TARGET_AVX512 inline std::size_t scatter_words_avx512_impl(const std::uint64_t* words,
                                                                    std::size_t nwords, const T* p,
                                                                    T* out, T factor,
                                                                    std::size_t count) noexcept {
  using V = avx512_ops<T>;
  using mask = typename V::mask;
  constexpr unsigned lanes = V::lanes;
  const typename V::vec s = V::set1(factor);
  std::size_t k = 0;
  for (std::size_t wi = 0; wi < nwords; ++wi, out += 64) {
    const std::uint64_t w = words[wi];
    for (unsigned j = 0; j < 64 / lanes; ++j) {
      const auto m = static_cast<mask>(w >> (lanes * j));
      const unsigned pop = static_cast<unsigned>(__builtin_popcount(m));
      const typename V::vec in =
          k + lanes <= count ? V::load(p + k) : V::load(static_cast<mask>((1U << pop) - 1U), p + k);
      const typename V::vec v = V::expand_mul(m, in, s);
      if constexpr (NonTemporal) {
        V::store_nontemporal(out + lanes * j, v);
      } else {
        V::store(out + lanes * j, v);
      }
      k += pop;
    }
  }
  if constexpr (NonTemporal) _mm_sfence();  // order the non-temporal lines before later stores
  return k;
}

/// The AVX-512 scatter of float or double; `nontemporal`: non-temporal stores, out 64-byte aligned.
template <class T>
PACTRAIN_TARGET_AVX512 inline std::size_t scatter_words_avx512(const std::uint64_t* words,
                                                               std::size_t nwords, const T* p,
                                                               T* out, T factor, std::size_t count,
                                                               bool nontemporal) noexcept {
  return nontemporal ? scatter_words_avx512_impl<true>(words, nwords, p, out, factor, count)
                     : scatter_words_avx512_impl<false>(words, nwords, p, out, factor, count);
}

}  // namespace pactrain::detail

#undef PACTRAIN_TARGET_AVX512

#endif  // PACTRAIN_HAS_X86_KERNELS
