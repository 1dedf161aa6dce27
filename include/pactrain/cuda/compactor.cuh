// cuda_compactor: gather and scatter of pruned gradients in device memory.
//
//   pactrain::cuda_compactor c;
//   auto plan = c.make_plan(mask, stream);                  // uploads the mask, builds on the GPU
//   c.gather_async(plan, dense, payload, stream);           // payload[k] = dense[k-th kept]
//   c.scatter_async(plan, payload, dense, 1.0f / P, stream) // dense = payload/P, +0 elsewhere
//
// The same contract as host_compactor (same payload order, +0 at pruned entries, the scale
// applied with one multiply), so its results equal host_compactor's bit for bit. The host
// mask types are the API: make_plan uploads the mask's words (bitmap_mask, block_mask<B>) or
// indices (index_mask) and computes the rank of each word on the device with CUB.
//
// Streams: every operation takes the stream last (default: the default stream). The *_async
// forms never synchronise; gather and scatter synchronise the stream before returning.
// make_plan is stream-ordered: the plan is ready for work queued after it on the same
// stream (use it on another stream only after synchronising). Plans own device memory,
// allocated and freed in stream order on the stream they were built on, which must outlive
// them.
//
// The kernels are the per-element functors of cuda/detail/device_ops.hpp in grid-stride loops;
// thrust_compactor (<pactrain/cuda/thrust_compactor.hpp>) runs the same functors through
// Thrust, which is how CI checks this math without a GPU. cuda_compactor{detail::cuda_exec{
// .max_blocks = n}} caps the grid (tests use it to run the striding loops).
//
// Errors: bad input (wrong sizes, overlapping buffers, null or host pointers where device
// memory is required) throws pactrain::error before anything is launched, and changes
// nothing. A failing CUDA call throws pactrain::cuda_error. Device-side faults surface as a
// cuda_error from a later call on the stream.
#pragma once

#if !defined(__CUDACC__)
#error \
    "pactrain/cuda/compactor.cuh needs nvcc (CUDA); host-only code includes <pactrain/pactrain.hpp>"
#endif

#include <pactrain/compactor.hpp>
#include <pactrain/cuda/detail/cuda_exec.cuh>
#include <pactrain/cuda/detail/device_compactor.hpp>
#include <pactrain/mask.hpp>

namespace pactrain {

/// The compactor for buffers in CUDA device memory (see the top of this file).
using cuda_compactor = basic_device_compactor<detail::cuda_exec>;

static_assert(compactor_for<cuda_compactor, bitmap_mask, float>);
static_assert(compactor_for<cuda_compactor, index_mask, double>);
static_assert(compactor_for<cuda_compactor, block_mask<32>, float>);

}  // namespace pactrain
