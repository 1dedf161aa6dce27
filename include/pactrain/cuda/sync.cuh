// pactrain::sync on device buffers: the same engine, specialised for cuda_compactor.
//
//   ncclComm_t nccl = ...;                         // the user's, one rank per GPU
//   pactrain::sync s{pactrain::nccl_communicator{nccl, stream}, layout, stream};  // collective
//   s.set_masks(masks);                            // collective; checked across ranks
//   s.allreduce_async(device_grads, stream);       // queued on stream; averaged, +0 pruned
//
// sync<nccl_communicator> and sync<mpi_cuda_communicator> take cuda_compactor by default
// (default_compactor, beside each communicator); sync<Comm, Codec, Mask, thrust_compactor>
// runs the same engine on Thrust.
//
// Per step and bucket, all queued on the caller's stream and never synchronised:
// gather the kept entries (sparse) into the payload, allreduce (SUM) the payloads or the whole
// dense buckets -- grouped into one NCCL launch where the communicator offers
// group_start/group_end -- then scatter with the 1/P factor fused in (+0 at pruned entries).
// Each bucket's gather and scatter is one launch over all its tensors. The three-phase step
// (begin_step(grads, stream), submit_bucket(b), finish_step()) queues a bucket's gather and
// allreduce as soon as it is submitted, so that they overlap the rest of the backward pass.
// All four bucket strategies run; the plain ones bypass the codec. The gradients may be one
// flat buffer or one buffer per tensor (allreduce_async(std::span<const std::span<T>>,
// stream)); a dense bucket whose tensors do not lie back to back is staged through a copy.
//
// The communicator must be stream-ordered on device buffers: after
// allreduce_async(span, op, stream) returns, work queued later on `stream` sees the result
// (nccl_communicator queues it there; mpi_cuda_communicator completes it before returning).
// The agreement's few uint64 words travel from host memory (the communicator accepts
// host spans for them).
//
// Codecs: identity_codec<float|double>, and fp16_codec/bf16_codec with the rounding fused into
// the gather and the widening and 1/P into the scatter (dense buckets: an encode and a decode
// kernel), bit for bit as the host engine; ternary_codec with or without error_feedback and
// scale blocks, current_max or previous_max scales, also bit for bit
// (cuda/detail/device_ternary.hpp; previous_max after a queued non-finite step: cuda.md).
//
// allreduce (which synchronises) judges each bucket's result for Inf and NaN and reports it as
// the host engine does; queued steps cannot know without waiting, so they report none and
// advance the step counter. save_state/load_state write the host engine's bytes. Checked steps
// (sync_options::checked) run as on the host; their agreement round waits on the host. The
// fused optimizer step (finish_step(update); device_sgd_update in cuda/sgd.hpp) waits for the
// step's verdict, then queues the update.
//
// The engine itself (cuda/detail/device_engine.hpp) is written over the device compactor's
// execution backend: with thrust_compactor (<pactrain/cuda/thrust_compactor.hpp>) the same
// engine runs on Thrust, and on Thrust's CPU systems with any host communicator.
#pragma once

#if !defined(__CUDACC__)
#error "pactrain/cuda/sync.cuh needs nvcc (CUDA); host-only code includes <pactrain/pactrain.hpp>"
#endif

#include <pactrain/communicator.hpp>
#include <pactrain/cuda/compactor.cuh>
#include <pactrain/cuda/detail/device_engine.hpp>

#include <cuda_runtime_api.h>

#include <span>

namespace pactrain {

/// A communicator that can reduce device buffers of T in stream order (see the top of this
/// file): nccl_communicator, mpi_cuda_communicator.
template <class C, class T>
concept stream_ordered_communicator = communicator<C> &&
    requires(C& c, std::span<T> d, cudaStream_t s) {
  c.allreduce_async(d, reduce_op::sum, s);
};

/// sync{comm, layout, stream}, sync{comm, layout, options, stream} and
/// sync{comm, layout, codec, options, stream}: the engine on the communicator's default
/// compactor, its buffers on `stream`.
template <communicator Comm>
sync(Comm, param_layout, cudaStream_t) -> sync<Comm>;
template <communicator Comm>
sync(Comm, param_layout, sync_options, cudaStream_t) -> sync<Comm>;
template <communicator Comm, gradient_codec Codec>
sync(Comm, param_layout, Codec, sync_options, cudaStream_t) -> sync<Comm, Codec>;

}  // namespace pactrain
