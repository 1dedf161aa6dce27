// The AVX2 forms of the host compaction kernels (see host_kernels.hpp): permutations from
// lookup tables, one kernel per operation for float and double.
#pragma once

#include <pactrain/detail/config.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>

#if PACTRAIN_HAS_X86_KERNELS
#include <immintrin.h>

#define PACTRAIN_TARGET_AVX2 __attribute__((target("avx2,popcnt")))

namespace pactrain::detail {

// ---- lookup tables -----------------------------------------------------------------------------

// compress8[b]: byte i = lane of the i-th set bit of b (a permutation packing kept lanes low).
// expand8[b]:   byte i = rank of lane i among the set bits of b (its source lane when expanding).
// The *4 forms do the same for 4 lanes of 64 bits as 8 lanes of 32 bits (pairs 2l, 2l+1).
struct avx2_tables {
  std::array<std::uint64_t, 256> compress8{};
  std::array<std::uint64_t, 256> expand8{};
  std::array<std::uint64_t, 16> compress4{};
  std::array<std::uint64_t, 16> expand4{};
};

inline constexpr avx2_tables make_avx2_tables() noexcept {
  avx2_tables t;
  for (unsigned b = 0; b < 256; ++b) {
    std::uint64_t c = 0;
    std::uint64_t e = 0;
    unsigned k = 0;
    for (unsigned lane = 0; lane < 8; ++lane) {
      if ((b >> lane) & 1U) {
        c |= static_cast<std::uint64_t>(lane) << (8 * k);
        e |= static_cast<std::uint64_t>(k) << (8 * lane);
        ++k;
      }
    }
    t.compress8[b] = c;
    t.expand8[b] = e;
  }
  for (unsigned q = 0; q < 16; ++q) {
    std::uint64_t c = 0;
    std::uint64_t e = 0;
    unsigned k = 0;
    for (unsigned lane = 0; lane < 4; ++lane) {
      if ((q >> lane) & 1U) {
        c |= static_cast<std::uint64_t>(2 * lane) << (16 * k);
        c |= static_cast<std::uint64_t>(2 * lane + 1) << (16 * k + 8);
        e |= static_cast<std::uint64_t>(2 * k) << (16 * lane);
        e |= static_cast<std::uint64_t>(2 * k + 1) << (16 * lane + 8);
        ++k;
      }
    }
    t.compress4[q] = c;
    t.expand4[q] = e;
  }
  return t;
}

inline constexpr avx2_tables avx2_lut = make_avx2_tables();

PACTRAIN_TARGET_AVX2 inline __m256i avx2_lanes(std::uint64_t packed) noexcept {
  return _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<long long>(packed)));
}

// ---- kernels ------------------------------------------------------------------------------------
// One kernel per operation for float and double: avx2_ops<T> holds what differs, the lanes of a
// 256-bit register (8 floats or 4 doubles) and the intrinsics on them. A group of `lanes` mask
// bits selects its permutation from avx2_lut (compress8/expand8 for floats; compress4/expand4
// move doubles as pairs of 32-bit lanes).

template <class T>
struct avx2_ops;

template <>
struct avx2_ops<float> {
  using vec = __m256;
  static constexpr unsigned lanes = 8;
  PACTRAIN_TARGET_AVX2 static __m256i lane_id() noexcept {
    return _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  }
  PACTRAIN_TARGET_AVX2 static __m256i lane_bit() noexcept {
    return _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  }
  // All ones in the lanes below `n`.
  PACTRAIN_TARGET_AVX2 static __m256i first(unsigned n, __m256i id) noexcept {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)), id);
  }
  // All ones in the lanes whose bit of `bits` is set.
  PACTRAIN_TARGET_AVX2 static __m256i selected(unsigned bits, __m256i bit) noexcept {
    return _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(static_cast<int>(bits)), bit),
                              bit);
  }
  PACTRAIN_TARGET_AVX2 static __m256i compress_index(unsigned bits) noexcept {
    return avx2_lanes(avx2_lut.compress8[bits]);
  }
  PACTRAIN_TARGET_AVX2 static __m256i expand_index(unsigned bits) noexcept {
    return avx2_lanes(avx2_lut.expand8[bits]);
  }
  PACTRAIN_TARGET_AVX2 static vec permute(vec v, __m256i index) noexcept {
    return _mm256_permutevar8x32_ps(v, index);
  }
  PACTRAIN_TARGET_AVX2 static vec set1(float x) noexcept { return _mm256_set1_ps(x); }
  PACTRAIN_TARGET_AVX2 static vec load(const float* p) noexcept { return _mm256_loadu_ps(p); }
  PACTRAIN_TARGET_AVX2 static vec load(const float* p, __m256i m) noexcept {
    return _mm256_maskload_ps(p, m);
  }
  PACTRAIN_TARGET_AVX2 static vec mul(vec a, vec b) noexcept { return _mm256_mul_ps(a, b); }
  PACTRAIN_TARGET_AVX2 static vec keep(vec v, __m256i m) noexcept {
    return _mm256_and_ps(v, _mm256_castsi256_ps(m));
  }
  PACTRAIN_TARGET_AVX2 static void store(float* p, vec v) noexcept { _mm256_storeu_ps(p, v); }
  PACTRAIN_TARGET_AVX2 static void store(float* p, __m256i m, vec v) noexcept {
    _mm256_maskstore_ps(p, m, v);
  }
  PACTRAIN_TARGET_AVX2 static void store_nontemporal(float* p, vec v) noexcept {
    _mm_stream_ps(p, _mm256_castps256_ps128(v));
    _mm_stream_ps(p + 4, _mm256_extractf128_ps(v, 1));
  }
};

template <>
struct avx2_ops<double> {
  using vec = __m256d;
  static constexpr unsigned lanes = 4;
  PACTRAIN_TARGET_AVX2 static __m256i lane_id() noexcept { return _mm256_setr_epi64x(0, 1, 2, 3); }
  PACTRAIN_TARGET_AVX2 static __m256i lane_bit() noexcept { return _mm256_setr_epi64x(1, 2, 4, 8); }
  PACTRAIN_TARGET_AVX2 static __m256i first(unsigned n, __m256i id) noexcept {
    return _mm256_cmpgt_epi64(_mm256_set1_epi64x(n), id);
  }
  PACTRAIN_TARGET_AVX2 static __m256i selected(unsigned bits, __m256i bit) noexcept {
    return _mm256_cmpeq_epi64(_mm256_and_si256(_mm256_set1_epi64x(bits), bit), bit);
  }
  PACTRAIN_TARGET_AVX2 static __m256i compress_index(unsigned bits) noexcept {
    return avx2_lanes(avx2_lut.compress4[bits]);
  }
  PACTRAIN_TARGET_AVX2 static __m256i expand_index(unsigned bits) noexcept {
    return avx2_lanes(avx2_lut.expand4[bits]);
  }
  PACTRAIN_TARGET_AVX2 static vec permute(vec v, __m256i index) noexcept {
    return _mm256_castps_pd(_mm256_permutevar8x32_ps(_mm256_castpd_ps(v), index));
  }
  PACTRAIN_TARGET_AVX2 static vec set1(double x) noexcept { return _mm256_set1_pd(x); }
  PACTRAIN_TARGET_AVX2 static vec load(const double* p) noexcept { return _mm256_loadu_pd(p); }
  PACTRAIN_TARGET_AVX2 static vec load(const double* p, __m256i m) noexcept {
    return _mm256_maskload_pd(p, m);
  }
  PACTRAIN_TARGET_AVX2 static vec mul(vec a, vec b) noexcept { return _mm256_mul_pd(a, b); }
  PACTRAIN_TARGET_AVX2 static vec keep(vec v, __m256i m) noexcept {
    return _mm256_and_pd(v, _mm256_castsi256_pd(m));
  }
  PACTRAIN_TARGET_AVX2 static void store(double* p, vec v) noexcept { _mm256_storeu_pd(p, v); }
  PACTRAIN_TARGET_AVX2 static void store(double* p, __m256i m, vec v) noexcept {
    _mm256_maskstore_pd(p, m, v);
  }
  PACTRAIN_TARGET_AVX2 static void store_nontemporal(double* p, vec v) noexcept {
    _mm_stream_pd(p, _mm256_castpd256_pd128(v));
    _mm_stream_pd(p + 2, _mm256_extractf128_pd(v, 1));
  }
};

// Within a word every group of lanes takes the same path. A branch on empty groups
// mispredicts most near 10% density, where 43% of the 8-bit groups are zero, and made the
// float scatter markedly slower there (bench/results/measurements.md).
template <class T>
PACTRAIN_TARGET_AVX2 inline std::size_t gather_words_avx2(const std::uint64_t* words,
                                                          std::size_t nwords, const T* in, T* out,
                                                          std::size_t count) noexcept {
  using V = avx2_ops<T>;
  constexpr unsigned lanes = V::lanes;
  constexpr unsigned group = (1U << lanes) - 1U;
  const __m256i lane_id = V::lane_id();
  std::size_t k = 0;
  for (std::size_t wi = 0; wi < nwords; ++wi, in += 64) {
    const std::uint64_t w = words[wi];
    if (w == 0) continue;
    if (w == ~0ULL) {
      std::memcpy(out + k, in, 64 * sizeof(T));
      k += 64;
      continue;
    }
    for (unsigned j = 0; j < 64 / lanes; ++j) {
      const unsigned bits = static_cast<unsigned>(w >> (lanes * j)) & group;
      const unsigned pop = static_cast<unsigned>(__builtin_popcount(bits));
      const typename V::vec v = V::permute(V::load(in + lanes * j), V::compress_index(bits));
      if (k + lanes <= count) {
        V::store(out + k, v);
      } else {
        V::store(out + k, V::first(pop, lane_id), v);
      }
      k += pop;
    }
  }
  return k;
}

// NonTemporal: non-temporal stores (out must be 16-byte aligned). They skip reading the lines they
// overwrite and bypass the caches: faster for outputs larger than the caches (figures in
// bench/results/measurements.md, "Figures quoted by the code").
template <bool NonTemporal, class T>
PACTRAIN_TARGET_AVX2 inline std::size_t scatter_words_avx2_impl(const std::uint64_t* words,
                                                                std::size_t nwords, const T* p,
                                                                T* out, T factor,
                                                                std::size_t count) noexcept {
  using V = avx2_ops<T>;
  constexpr unsigned lanes = V::lanes;
  constexpr unsigned group = (1U << lanes) - 1U;
  const __m256i lane_id = V::lane_id();
  const __m256i lane_bit = V::lane_bit();
  const typename V::vec s = V::set1(factor);
  std::size_t k = 0;
  for (std::size_t wi = 0; wi < nwords; ++wi, out += 64) {
    const std::uint64_t w = words[wi];
    // A word consumes at most 64 payload entries: while 64 remain, every load is in bounds.
    const bool whole = k + 64 <= count;
    for (unsigned j = 0; j < 64 / lanes; ++j) {
      const unsigned bits = static_cast<unsigned>(w >> (lanes * j)) & group;
      const unsigned pop = static_cast<unsigned>(__builtin_popcount(bits));
      typename V::vec v =
          whole || k + lanes <= count ? V::load(p + k) : V::load(p + k, V::first(pop, lane_id));
      v = V::keep(V::mul(V::permute(v, V::expand_index(bits)), s), V::selected(bits, lane_bit));
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

/// The AVX2 scatter of float or double; `nontemporal`: non-temporal stores, out 16-byte aligned.
template <class T>
PACTRAIN_TARGET_AVX2 inline std::size_t scatter_words_avx2(const std::uint64_t* words,
                                                           std::size_t nwords, const T* p, T* out,
                                                           T factor, std::size_t count,
                                                           bool nontemporal) noexcept {
  return nontemporal ? scatter_words_avx2_impl<true>(words, nwords, p, out, factor, count)
                     : scatter_words_avx2_impl<false>(words, nwords, p, out, factor, count);
}

}  // namespace pactrain::detail

#undef PACTRAIN_TARGET_AVX2

#endif  // PACTRAIN_HAS_X86_KERNELS
