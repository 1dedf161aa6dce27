// The per-element work of the device compactor and engine, as functors callable on host and
// device (_CCCL_HOST_DEVICE). Internal.
//
// Each functor does one work item: item q of gather_bitmap_op is one quad of four consecutive
// entries, item k of gather_indices_op one kept entry. The CUDA kernels
// (cuda/detail/cuda_exec.cuh) call them in a grid-stride loop; thrust_exec runs them with
// thrust::for_each, on the GPU or, built with Thrust's CPP device system, on the CPU. That is
// how the device math runs in CI without a GPU.
//
// They mirror host_compactor exactly: payload slot k is the k-th kept entry in index order,
// scatter writes factor * payload[slot] (one multiply, as on the host) at kept entries and +0
// at pruned ones; a 16-bit wire value is rounded to nearest even and widened exactly.
//
// Compiles with nvcc, or with a host compiler given the CCCL headers (<cuda/std/...>).
#pragma once

#include <pactrain/half.hpp>

#include <cuda/std/bit>

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace pactrain::detail {

/// Four consecutive values, for one vector memory access on the device.
template <class T>
struct alignas(4 * sizeof(T)) vec4 {
  T v[4];
};

/// The dense side of a bitmap plan: one bit per unit of `unit` entries (1 for bitmap masks,
/// B for block_mask<B>) and the number of kept units before each 64-bit word.
struct bitmap_view {
  const std::uint64_t* words;
  const std::uint64_t* ranks;
  std::size_t size;  // entries
  std::size_t unit;  // entries per bit
};

/// Quads of a dense tensor at `p` with n entries: quad q holds entries [4q - head, 4q - head + 4)
/// clipped to [0, n), so that every full quad starts at a vec4-aligned address whatever the
/// tensor's offset in its buffer (only the first and last quads are partial).
struct quad_grid {
  std::size_t head = 0;  // entries before the first aligned address, 0..3
  std::size_t quads = 0;

  template <class T>
  _CCCL_HOST_DEVICE static quad_grid of(const T* p, std::size_t n) noexcept {
    const auto misalign = reinterpret_cast<std::uintptr_t>(p) % sizeof(vec4<T>);
    // A T* is aligned to sizeof(T), so misalign is a whole number of entries.
    const std::size_t head = n == 0 ? 0 : misalign / sizeof(T);
    return {head, (n + head + 3) / 4};
  }
  /// First entry of quad q (may be "negative": wraps, and then `valid` rejects it).
  _CCCL_HOST_DEVICE std::size_t first(std::size_t q) const noexcept { return 4 * q - head; }
};

_CCCL_HOST_DEVICE inline std::uint64_t load_readonly(const std::uint64_t* p) noexcept {
#if defined(__CUDA_ARCH__)
  return __ldg(p);
#else
  return *p;
#endif
}

/// Where the entries i0 + j of one quad go: whether each is in the tensor (valid), kept, and
/// its payload slot.
struct quad_slots {
  std::size_t i0;
  bool valid[4];
  bool kept[4];
  std::size_t slot[4];

  /// One division by the unit per quad (entries of a block share its bit), none for plain
  /// bitmaps.
  _CCCL_HOST_DEVICE quad_slots(const bitmap_view& m, std::size_t first) noexcept : i0(first) {
    std::size_t u = 0;
    std::size_t r = 0;  // entry within its unit
    bool started = false;
    for (int j = 0; j < 4; ++j) {
      const std::size_t i = i0 + static_cast<std::size_t>(j);  // wraps below 0: i >= size
      valid[j] = i < m.size;
      kept[j] = false;
      slot[j] = 0;
      if (!valid[j]) continue;
      if (!started) {
        u = m.unit == 1 ? i : i / m.unit;
        r = i - u * m.unit;
        started = true;
      } else if (++r == m.unit) {
        r = 0;
        ++u;
      }
      const std::uint64_t w = load_readonly(m.words + u / 64);
      const unsigned bit = static_cast<unsigned>(u % 64);
      if (((w >> bit) & 1U) == 0) continue;
      const std::size_t below =
          load_readonly(m.ranks + u / 64) +
          static_cast<std::size_t>(cuda::std::popcount(w & ((std::uint64_t{1} << bit) - 1)));
      kept[j] = true;
      slot[j] = m.unit == 1 ? below : below * m.unit + r;
    }
  }
  /// All four entries are in the tensor: the quad is one aligned vector access.
  _CCCL_HOST_DEVICE bool full() const noexcept { return valid[0] && valid[3]; }
  _CCCL_HOST_DEVICE bool any_kept() const noexcept {
    return kept[0] || kept[1] || kept[2] || kept[3];
  }
};

/// A payload value as stored: itself, or rounded to nearest even into a 16-bit float (the
/// fp16/bf16 codecs' encode, bit for bit as pactrain::half and pactrain::bfloat16 round).
template <class W, class T>
_CCCL_HOST_DEVICE W to_wire(T v) noexcept {
  if constexpr (std::is_same_v<W, pactrain::half>) {
#if defined(__CUDA_ARCH__)
    return cuda::std::bit_cast<pactrain::half>(__half_as_ushort(__float2half_rn(v)));
#else
    return pactrain::half(v);
#endif
  } else if constexpr (std::is_same_v<W, pactrain::bfloat16>) {
#if defined(__CUDA_ARCH__)
    return cuda::std::bit_cast<pactrain::bfloat16>(__bfloat16_as_ushort(__float2bfloat16_rn(v)));
#else
    return pactrain::bfloat16(v);
#endif
  } else {
    return v;
  }
}

/// A stored payload value back in the gradient's type (exact).
template <class T, class W>
_CCCL_HOST_DEVICE T from_wire(W w) noexcept {
  if constexpr (std::is_same_v<W, pactrain::half>) {
#if defined(__CUDA_ARCH__)
    return __half2float(__ushort_as_half(cuda::std::bit_cast<unsigned short>(w)));
#else
    return static_cast<float>(w);
#endif
  } else if constexpr (std::is_same_v<W, pactrain::bfloat16>) {
#if defined(__CUDA_ARCH__)
    return __bfloat162float(__ushort_as_bfloat16(cuda::std::bit_cast<unsigned short>(w)));
#else
    return static_cast<float>(w);
#endif
  } else {
    return w;
  }
}

// A full, aligned quad: one vector access on the device, four scalar ones on the host (where
// reading a T array through vec4<T> would break aliasing rules).
template <class T>
_CCCL_HOST_DEVICE vec4<T> load_quad(const T* p) noexcept {
#if defined(__CUDA_ARCH__)
  return *reinterpret_cast<const vec4<T>*>(p);
#else
  return {{p[0], p[1], p[2], p[3]}};
#endif
}
template <class T>
_CCCL_HOST_DEVICE void store_quad(T* p, const vec4<T>& v) noexcept {
#if defined(__CUDA_ARCH__)
  *reinterpret_cast<vec4<T>*>(p) = v;
#else
  for (int j = 0; j < 4; ++j) p[j] = v.v[j];
#endif
}

/// payload[slot(i)] = dense[i] for the kept entries of quad q (converted to the wire type W).
template <class T, class W>
struct gather_bitmap_op {
  bitmap_view m;
  const T* dense;
  W* payload;
  quad_grid grid;

  _CCCL_HOST_DEVICE void operator()(std::size_t q) const noexcept {
    const quad_slots s(m, grid.first(q));
    if (!s.any_kept()) return;
    if (s.full()) {
      const vec4<T> v = load_quad(dense + s.i0);
      for (int j = 0; j < 4; ++j) {
        if (s.kept[j]) payload[s.slot[j]] = to_wire<W>(v.v[j]);
      }
    } else {
      for (int j = 0; j < 4; ++j) {
        if (s.kept[j]) payload[s.slot[j]] = to_wire<W>(dense[s.i0 + static_cast<std::size_t>(j)]);
      }
    }
  }
};

/// dense[i] = factor * payload[slot(i)] for kept i of quad q (widened from W), +0 for pruned i.
template <class T, class W>
struct scatter_bitmap_op {
  bitmap_view m;
  const W* payload;
  T* dense;
  T factor;
  quad_grid grid;

  _CCCL_HOST_DEVICE void operator()(std::size_t q) const noexcept {
    const quad_slots s(m, grid.first(q));
    vec4<T> v;
    for (int j = 0; j < 4; ++j) {
      v.v[j] = s.kept[j] ? from_wire<T>(payload[s.slot[j]]) * factor : T(0);
    }
    if (s.full()) {
      store_quad(dense + s.i0, v);
    } else {
      for (int j = 0; j < 4; ++j) {
        if (s.valid[j]) dense[s.i0 + static_cast<std::size_t>(j)] = v.v[j];
      }
    }
  }
};

/// payload[k] = dense[indices[k]].
template <class T, class W>
struct gather_indices_op {
  const std::uint64_t* indices;
  const T* dense;
  W* payload;
  _CCCL_HOST_DEVICE void operator()(std::size_t k) const noexcept {
    payload[k] = to_wire<W>(dense[load_readonly(indices + k)]);
  }
};

/// dense[indices[k]] = factor * payload[k]; the pruned entries are zeroed before.
template <class T, class W>
struct scatter_indices_op {
  const std::uint64_t* indices;
  const W* payload;
  T* dense;
  T factor;
  _CCCL_HOST_DEVICE void operator()(std::size_t k) const noexcept {
    dense[load_readonly(indices + k)] = from_wire<T>(payload[k]) * factor;
  }
};

/// One tensor of a bucket, for the engine's bucket-wide gather and scatter: one launch per
/// bucket over a table of its tensors instead of one per tensor.
struct bucket_tensor {
  bitmap_view m;                 // bitmap plans (m.size: the tensor's entries)
  const std::uint64_t* indices;  // index plans
  bool by_index;                 // an index plan: one work item per kept entry
  std::size_t count;             // kept entries
  std::size_t tensor;            // index in the layout
  std::size_t offset;            // first entry in the flat gradient buffer
  std::size_t payload;           // first payload slot, counted from the bucket's first
  std::size_t first_item;        // work items of the bucket's tensors before this one
};

/// Where a bucket launch finds each tensor's entries: in one buffer (tensor t at
/// base + t.offset - origin), or, where `tensors` is set, in a device table of one pointer per
/// tensor of the layout (gradients held in separate buffers).
template <class T>
struct dense_source {
  T* base = nullptr;
  std::size_t origin = 0;
  T* const* tensors = nullptr;

  _CCCL_HOST_DEVICE T* of(const bucket_tensor& t) const noexcept {
    return tensors != nullptr ? tensors[t.tensor] : base + (t.offset - origin);
  }
};

/// dst[k] = values[k] for k < N: a few values queued as a launch's argument, so that a small
/// table reaches the device in stream order without a host buffer that must outlive the copy.
template <class T, std::size_t N>
struct store_op {
  T values[N];
  T* dst;
  _CCCL_HOST_DEVICE void operator()(std::size_t k) const noexcept { dst[k] = values[k]; }
};

/// Work items of one tensor in a bucket launch: its kept entries (index plans), or its quads
/// for any alignment of its first entry (bitmap plans; quad_grid has at most this many).
inline std::size_t bucket_items(std::size_t size, std::size_t count, bool indices) noexcept {
  if (indices) return count;
  return size == 0 ? 0 : (size + 3 + 3) / 4;
}

/// The tensor of work item k: the last one whose first item is at most k.
_CCCL_HOST_DEVICE inline const bucket_tensor& tensor_of_item(const bucket_tensor* t, std::size_t n,
                                                             std::size_t k) noexcept {
  std::size_t lo = 0;
  std::size_t hi = n;  // t[lo].first_item <= k < t[hi].first_item (hi == n: past the end)
  while (hi - lo > 1) {
    const std::size_t mid = lo + (hi - lo) / 2;
    if (t[mid].first_item <= k) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return t[lo];
}

/// payload[t.payload + slot] = (tensor t's entry i) for the kept entries of every tensor of a
/// bucket (as gather_bitmap_op and gather_indices_op, per tensor).
template <class T, class W>
struct bucket_gather_op {
  const bucket_tensor* tensors;
  std::size_t tensor_count;
  dense_source<T> grads;
  W* payload;

  _CCCL_HOST_DEVICE void operator()(std::size_t k) const noexcept {
    const bucket_tensor& t = tensor_of_item(tensors, tensor_count, k);
    const std::size_t item = k - t.first_item;
    const T* dense = grads.of(t);
    if (t.by_index) {
      gather_indices_op<T, W>{t.indices, dense, payload + t.payload}(item);
      return;
    }
    const auto grid = quad_grid::of(dense, t.m.size);
    if (item < grid.quads) gather_bitmap_op<T, W>{t.m, dense, payload + t.payload, grid}(item);
  }
};

/// (tensor t's entry i) = factor * payload[t.payload + slot] at kept entries of every tensor of
/// a bucket, +0 at pruned ones of bitmap plans (index plans' tensors are zeroed before).
template <class T, class W>
struct bucket_scatter_op {
  const bucket_tensor* tensors;
  std::size_t tensor_count;
  const W* payload;
  dense_source<T> grads;
  T factor;

  _CCCL_HOST_DEVICE void operator()(std::size_t k) const noexcept {
    const bucket_tensor& t = tensor_of_item(tensors, tensor_count, k);
    const std::size_t item = k - t.first_item;
    T* dense = grads.of(t);
    if (t.by_index) {
      scatter_indices_op<T, W>{t.indices, payload + t.payload, dense, factor}(item);
      return;
    }
    const auto grid = quad_grid::of(dense, t.m.size);
    if (item < grid.quads) {
      scatter_bitmap_op<T, W>{t.m, payload + t.payload, dense, factor, grid}(item);
    }
  }
};

/// The number of kept units in a mask word: the input of the rank scan.
struct popcount_op {
  _CCCL_HOST_DEVICE std::uint64_t operator()(std::uint64_t w) const noexcept {
    return static_cast<std::uint64_t>(cuda::std::popcount(w));
  }
};

/// dst[k] = factor * src[k] (dst may be src): a dense bucket's mean.
template <class T>
struct times_op {
  const T* src;
  T* dst;
  T factor;
  _CCCL_HOST_DEVICE void operator()(std::size_t k) const noexcept { dst[k] = src[k] * factor; }
};

/// wire[k] = src[k] as the wire type: a dense bucket's encode.
template <class T, class W>
struct encode_op {
  const T* src;
  W* wire;
  _CCCL_HOST_DEVICE void operator()(std::size_t k) const noexcept { wire[k] = to_wire<W>(src[k]); }
};

/// dst[k] = wire[k] * factor: a dense bucket's decode (the mean, as the host codec decodes).
template <class T, class W>
struct decode_op {
  const W* wire;
  T* dst;
  T factor;
  _CCCL_HOST_DEVICE void operator()(std::size_t k) const noexcept {
    dst[k] = from_wire<T>(wire[k]) * factor;
  }
};

}  // namespace pactrain::detail
