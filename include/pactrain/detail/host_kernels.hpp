// Host compaction kernels over a bitmap plan: the portable forms here, the AVX2 and AVX-512
// forms in host_kernels_avx2.hpp and host_kernels_avx512.hpp (included below).
//
// Every form processes the full 64-entry words of a bitmap and returns; the caller finishes
// the partial last word with the portable per-word code, so no form reads or writes past a
// buffer. All forms give bit-identical results: gather copies values, scatter computes one
// IEEE multiply per kept entry and writes +0 at pruned entries.
#pragma once

#include <pactrain/detail/config.hpp>
#include <pactrain/detail/host_kernels_avx2.hpp>
#include <pactrain/detail/host_kernels_avx512.hpp>

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace pactrain::detail {

// ---- portable --------------------------------------------------------------------------------

/// Gathers the kept entries of one word (bits past the tensor's end are zero).
template <class T>
inline std::size_t gather_word(std::uint64_t w, const T* in, T* out) noexcept {
  std::size_t k = 0;
  while (w != 0) {
    out[k++] = in[std::countr_zero(w)];
    w &= w - 1;
  }
  return k;
}

/// Scatters one word of `len` <= 64 entries; returns the payload entries consumed. Zero
/// fill, then one store per set bit: no data-dependent branch per entry.
template <class T>
inline std::size_t scatter_word(std::uint64_t w, std::size_t len, const T* p, T* out,
                                T factor) noexcept {
  for (std::size_t j = 0; j < len; ++j) out[j] = T(0);
  std::size_t k = 0;
  while (w != 0) {
    out[std::countr_zero(w)] = p[k++] * factor;
    w &= w - 1;
  }
  return k;
}

template <class T>
inline std::size_t gather_words_portable(const std::uint64_t* words, std::size_t nwords,
                                         const T* in, T* out, std::size_t /*count*/) noexcept {
  std::size_t k = 0;
  for (std::size_t wi = 0; wi < nwords; ++wi, in += 64) {
    const std::uint64_t w = words[wi];
    if (w == ~0ULL) {
      std::memcpy(out + k, in, 64 * sizeof(T));
      k += 64;
    } else if (w != 0) {
      k += gather_word(w, in, out + k);
    }
  }
  return k;
}

template <class T>
inline std::size_t scatter_words_portable(const std::uint64_t* words, std::size_t nwords,
                                          const T* p, T* out, T factor,
                                          std::size_t /*count*/) noexcept {
  std::size_t k = 0;
  for (std::size_t wi = 0; wi < nwords; ++wi, out += 64) {
    const std::uint64_t w = words[wi];
    if (w == 0) {
      for (std::size_t j = 0; j < 64; ++j) out[j] = T(0);
    } else if (w == ~0ULL) {
      for (std::size_t j = 0; j < 64; ++j) out[j] = p[k + j] * factor;
      k += 64;
    } else {
      k += scatter_word(w, 64, p + k, out, factor);
    }
  }
  return k;
}

}  // namespace pactrain::detail
