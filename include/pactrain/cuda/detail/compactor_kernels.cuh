// Kernels of cuda_compactor (see <pactrain/cuda/compactor.cuh>). Internal.
//
// They mirror host_compactor exactly: payload slot k is the k-th kept entry in index order,
// scatter writes scale * payload[slot] (one multiply, as on the host) at kept entries and +0
// at pruned ones. Each thread handles four consecutive entries, with one vector load or store
// of the dense tensor when its pointer allows it.
#pragma once

#if !defined(__CUDACC__)
#error "pactrain/cuda/detail/compactor_kernels.cuh needs nvcc (CUDA)"
#endif

#include <pactrain/half.hpp>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda/std/bit>

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace pactrain::detail {

/// Four consecutive values, for one vector memory access.
template <class T>
struct alignas(4 * sizeof(T)) vec4 {
  T v[4];
};

/// The dense side of a bitmap plan: one bit per unit of `unit` entries (1 for bitmap masks,
/// B for block_mask<B>) and the number of kept units before each 64-bit word.
struct bitmap_view {
  const std::uint64_t* __restrict__ words;
  const std::uint64_t* __restrict__ ranks;
  std::size_t size;  // entries
  std::size_t unit;  // entries per bit
};

/// Whether entry i is kept, and its payload slot when it is.
__device__ __forceinline__ bool bitmap_slot(const bitmap_view& m, std::size_t i,
                                            std::size_t& slot) {
  const std::size_t u = m.unit == 1 ? i : i / m.unit;
  const std::uint64_t w = __ldg(m.words + u / 64);
  const unsigned bit = static_cast<unsigned>(u % 64);
  if (((w >> bit) & 1U) == 0) return false;
  const std::size_t below =
      __ldg(m.ranks + u / 64) + static_cast<std::size_t>(__popcll(w & ((1ULL << bit) - 1)));
  slot = m.unit == 1 ? below : below * m.unit + (i - u * m.unit);
  return true;
}

/// A payload value as stored: itself, or rounded to nearest even into a 16-bit float (the
/// fp16/bf16 codecs' encode, as pactrain::half and pactrain::bfloat16 round on the host).
template <class W, class T>
__device__ __forceinline__ W to_wire(T v) {
  if constexpr (std::is_same_v<W, pactrain::half>) {
    return cuda::std::bit_cast<pactrain::half>(__half_as_ushort(__float2half_rn(v)));
  } else if constexpr (std::is_same_v<W, pactrain::bfloat16>) {
    return cuda::std::bit_cast<pactrain::bfloat16>(__bfloat16_as_ushort(__float2bfloat16_rn(v)));
  } else {
    return v;
  }
}

/// A stored payload value back in the gradient's type (exact).
template <class T, class W>
__device__ __forceinline__ T from_wire(W w) {
  if constexpr (std::is_same_v<W, pactrain::half>) {
    return __half2float(__ushort_as_half(cuda::std::bit_cast<unsigned short>(w)));
  } else if constexpr (std::is_same_v<W, pactrain::bfloat16>) {
    return __bfloat162float(__ushort_as_bfloat16(cuda::std::bit_cast<unsigned short>(w)));
  } else {
    return w;
  }
}

inline constexpr unsigned kernel_block = 256;

/// Blocks for a grid-stride loop over `items` (> 0) work items.
inline unsigned grid_for(std::size_t items) noexcept {
  const std::size_t blocks = (items + kernel_block - 1) / kernel_block;
  return static_cast<unsigned>(blocks < (std::size_t{1} << 20) ? blocks : (std::size_t{1} << 20));
}

// payload[slot(i)] = dense[i] for kept i (converted to the payload type W).
template <class T, class W>
__global__ void __launch_bounds__(kernel_block)
    gather_bitmap_kernel(bitmap_view m, const T* __restrict__ dense, W* __restrict__ payload,
                         bool aligned) {
  const std::size_t quads = (m.size + 3) / 4;
  for (std::size_t q = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; q < quads;
       q += std::size_t{gridDim.x} * blockDim.x) {
    const std::size_t i0 = 4 * q;
    std::size_t slot[4];
    bool kept[4];
    bool any = false;
    for (int j = 0; j < 4; ++j) {
      kept[j] = i0 + j < m.size && bitmap_slot(m, i0 + j, slot[j]);
      any = any || kept[j];
    }
    if (!any) continue;
    if (aligned && i0 + 4 <= m.size) {
      const vec4<T> v = *reinterpret_cast<const vec4<T>*>(dense + i0);
      for (int j = 0; j < 4; ++j) {
        if (kept[j]) payload[slot[j]] = to_wire<W>(v.v[j]);
      }
    } else {
      for (int j = 0; j < 4; ++j) {
        if (kept[j]) payload[slot[j]] = to_wire<W>(dense[i0 + j]);
      }
    }
  }
}

// dense[i] = scale * payload[slot(i)] for kept i (read back from the payload type W), +0
// for pruned i.
template <class T, class W>
__global__ void __launch_bounds__(kernel_block)
    scatter_bitmap_kernel(bitmap_view m, const W* __restrict__ payload, T* __restrict__ dense,
                          T scale, bool aligned) {
  const std::size_t quads = (m.size + 3) / 4;
  for (std::size_t q = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; q < quads;
       q += std::size_t{gridDim.x} * blockDim.x) {
    const std::size_t i0 = 4 * q;
    vec4<T> v;
    for (int j = 0; j < 4; ++j) {
      std::size_t slot = 0;
      v.v[j] = (i0 + j < m.size && bitmap_slot(m, i0 + j, slot))
                   ? from_wire<T>(payload[slot]) * scale
                   : T(0);
    }
    if (aligned && i0 + 4 <= m.size) {
      *reinterpret_cast<vec4<T>*>(dense + i0) = v;
    } else {
      for (int j = 0; j < 4 && i0 + j < m.size; ++j) dense[i0 + j] = v.v[j];
    }
  }
}

// payload[k] = dense[indices[k]].
template <class T, class W>
__global__ void __launch_bounds__(kernel_block)
    gather_indices_kernel(const std::uint64_t* __restrict__ indices, std::size_t count,
                          const T* __restrict__ dense, W* __restrict__ payload) {
  for (std::size_t k = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; k < count;
       k += std::size_t{gridDim.x} * blockDim.x) {
    payload[k] = to_wire<W>(dense[__ldg(indices + k)]);
  }
}

// dense[indices[k]] = scale * payload[k]; the pruned entries were zeroed before.
template <class T, class W>
__global__ void __launch_bounds__(kernel_block)
    scatter_indices_kernel(const std::uint64_t* __restrict__ indices, std::size_t count,
                           const W* __restrict__ payload, T* __restrict__ dense, T scale) {
  for (std::size_t k = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; k < count;
       k += std::size_t{gridDim.x} * blockDim.x) {
    dense[__ldg(indices + k)] = from_wire<T>(payload[k]) * scale;
  }
}

// counts[w] = popcount(words[w]): the input of the rank scan.
__global__ void __launch_bounds__(kernel_block)
    popcount_kernel(const std::uint64_t* __restrict__ words, std::size_t n,
                    std::uint64_t* __restrict__ counts) {
  for (std::size_t w = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; w < n;
       w += std::size_t{gridDim.x} * blockDim.x) {
    counts[w] = static_cast<std::uint64_t>(__popcll(words[w]));
  }
}

// dst[k] = scale * src[k] (dst may be src): a dense bucket's mean.
template <class T>
__global__ void __launch_bounds__(kernel_block)
    scale_kernel(const T* src, T* dst, std::size_t n, T scale) {
  for (std::size_t k = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; k < n;
       k += std::size_t{gridDim.x} * blockDim.x) {
    dst[k] = src[k] * scale;
  }
}

// wire[k] = dense[k] as the wire type: a dense bucket's encode.
template <class T, class W>
__global__ void __launch_bounds__(kernel_block)
    encode_kernel(const T* __restrict__ src, W* __restrict__ wire, std::size_t n) {
  for (std::size_t k = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; k < n;
       k += std::size_t{gridDim.x} * blockDim.x) {
    wire[k] = to_wire<W>(src[k]);
  }
}

// dst[k] = wire[k] * scale: a dense bucket's decode (the mean, as the host codec decodes).
template <class T, class W>
__global__ void __launch_bounds__(kernel_block)
    decode_kernel(const W* __restrict__ wire, T* __restrict__ dst, std::size_t n, T scale) {
  for (std::size_t k = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; k < n;
       k += std::size_t{gridDim.x} * blockDim.x) {
    dst[k] = from_wire<T>(wire[k]) * scale;
  }
}

}  // namespace pactrain::detail
