// pactrain::sync on device buffers, for any device compactor: basic_device_compactor<Exec>
// (cuda_compactor, thrust_compactor). Internal; users include <pactrain/cuda/sync.cuh> or
// <pactrain/cuda/thrust_compactor.hpp>. The contract is described in <pactrain/cuda/sync.cuh>.
//
// Compiles without nvcc where Exec does (thrust_compactor on Thrust's CPP or OMP system), so
// the engine's device math runs in CI without a GPU.
#pragma once

#include <pactrain/codec.hpp>
#include <pactrain/codec/half_cast.hpp>
#include <pactrain/communicator.hpp>
#include <pactrain/cuda/detail/device_compactor.hpp>
#include <pactrain/cuda/detail/device_ops.hpp>
#include <pactrain/detail/sync/core.hpp>
#include <pactrain/error.hpp>
#include <pactrain/layout.hpp>
#include <pactrain/mask.hpp>
#include <pactrain/sync.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace pactrain {

namespace detail {
template <class Codec>
inline constexpr bool is_cast_codec_v = false;
template <half_value Wire>
inline constexpr bool is_cast_codec_v<cast_codec<Wire>> = true;

/// Comm reduces Exec's device buffers of T in stream order: after
/// allreduce_async(span, op, stream) returns, work queued later on the stream sees the result.
template <class Comm, class Exec, class T>
concept stream_ordered_for = requires(Comm& c, std::span<T> d, typename Exec::stream_type s) {
  c.allreduce_async(d, reduce_op::sum, Exec::native(s));
};
}  // namespace detail

/// The sync engine over device gradient buffers (see <pactrain/cuda/sync.cuh>), with the host
/// engine's collective, cross-checked configuration calls. Steps on different streams run in
/// call order without blocking the host. Not copyable or movable.
template <gradient_mask Mask, communicator Comm, class Codec, class Feedback, class Exec>
class sync<Mask, basic_device_compactor<Exec>, Comm, Codec, Feedback>
    : public detail::sync_core<sync<Mask, basic_device_compactor<Exec>, Comm, Codec, Feedback>,
                               Mask, basic_device_compactor<Exec>, Comm, Codec, Feedback> {
  using compactor_t = basic_device_compactor<Exec>;
  using core = detail::sync_core<sync, Mask, compactor_t, Comm, Codec, Feedback>;
  friend core;
  static constexpr bool checked_supported = false;  // sync_options::checked: host engine only
  static constexpr bool stream_ordered =
      detail::stream_ordered_for<Comm, Exec, typename Codec::wire_type>;

  static_assert(codec_traits<Codec>::is_identity || detail::is_cast_codec_v<Codec>,
                "pactrain::sync on device buffers supports identity_codec, fp16_codec and "
                "bf16_codec so far; use the host engine (host_compactor) for ternary_codec");
  static_assert(codec_traits<Codec>::is_identity || !Feedback::enabled,
                "pactrain::sync on device buffers has no error feedback yet (use no_feedback)");
  static_assert(stream_ordered || Exec::host_accessible,
                "pactrain::sync on device buffers needs a stream-ordered communicator "
                "(nccl_communicator, mpi_cuda_communicator): allreduce_async(span, op, "
                "cudaStream_t)");

 public:
  using typename core::plan_type;
  using typename core::value_type;
  using typename core::wire_type;
  using stream_type = typename Exec::stream_type;

  /// Collective: checks that all ranks hold the same layout and starts with every entry
  /// kept. Plans and the payload live on `stream` (it must outlive the engine); the
  /// constructor synchronises it.
  sync(Comm comm, param_layout layout, compactor_t compactor = {}, sync_options opt = {},
       Codec codec = {}, stream_type stream = {})
      : core(std::move(comm), std::move(layout), std::move(compactor), opt, std::move(codec)),
        home_(stream) {
    this->commit_full("sync");
  }

  /// The same, with the default compactor and codec: sync{comm, layout, stream}.
  sync(Comm comm, param_layout layout, stream_type stream, sync_options opt = {})
      : sync(std::move(comm), std::move(layout), compactor_t{}, opt, Codec{}, stream) {}

  sync(const sync&) = delete;
  sync& operator=(const sync&) = delete;
  /// Waits for the last step (its kernels use the plans and payload freed here), even when
  /// the stream it ran on has been destroyed since.
  ~sync() { step_done_.wait_noexcept(); }

  /// Collective, as on the host engine (sync.hpp); set_masks and set_strategies wait for the
  /// last step and build the new plans before returning. On bad input or disagreement on any
  /// rank, every rank throws the same pactrain::error and nothing changes.
  using core::reject_masks;
  using core::set_masks;
  using core::set_strategies;

  /// Averages `grads` (device memory, the flat buffer of all tensors) across ranks in place,
  /// queued on `stream`; pruned entries come back as +0. Never synchronises. Bad input
  /// throws pactrain::error before anything is queued.
  void allreduce_async(std::span<value_type> grads, stream_type stream = {}) {
    PACTRAIN_EXPECTS(grads.size() == this->layout_.total_size(),
                     "sync::allreduce: buffer has " + std::to_string(grads.size()) +
                         " entries, the layout " + std::to_string(this->layout_.total_size()));
    Exec::expect_device(grads.data(), grads.size(), "sync::allreduce: ", "gradient");
    run(grads, stream);
  }

  /// allreduce_async, then synchronises `stream`.
  void allreduce(std::span<value_type> grads, stream_type stream = {}) {
    allreduce_async(grads, stream);
    exec().synchronize(stream);
  }

  /// As above for a pointer and a size.
  void allreduce(value_type* data, std::size_t n, stream_type stream = {}) {
    PACTRAIN_EXPECTS(data != nullptr || n == 0,
                     "sync::allreduce: null buffer with " + std::to_string(n) + " entries");
    allreduce(std::span<value_type>(data, n), stream);
  }

 private:
  // allreduce_async checked the gradient buffer once; the payload is the engine's own.
  static constexpr detail::device_buffers_checked checked{};
  using core::is_identity;
  template <class T>
  using buffer = typename Exec::template buffer<T>;

  const Exec& exec() const noexcept { return this->compactor_.exec(); }

  // --- commit hooks (see detail/sync/core.hpp) ---

  void check_commit(const char*) const noexcept {}
  static void check_strategy(bucket_strategy st) {
    PACTRAIN_EXPECTS(st == bucket_strategy::sparse || st == bucket_strategy::dense,
                     std::string("strategy ") + to_string(st) +
                         ": the device engine runs the sparse and dense strategies only");
  }
  plan_type build_plan(const Mask& m) { return this->compactor_.make_plan(m, home_); }
  struct no_requests {};
  using requests_t =
      std::conditional_t<stream_ordered, no_requests, std::vector<typename Comm::request_type>>;
  struct workspace_buffers {
    buffer<value_type> payload;
    buffer<wire_type> wire;
    requests_t requests;  // host communicators: one per bucket
  };
  // May throw: runs before the agreement, so a failure reaches every rank. The last step may
  // still use the old plans and payload: let it finish, and let the new plans be built,
  // before the swap.
  workspace_buffers allocate_workspace(const detail::workspace_layout& w) {
    step_done_.wait();
    exec().synchronize(home_);
    workspace_buffers n{buffer<value_type>(w.payload_size(), home_),
                        buffer<wire_type>(is_identity ? 0 : w.wire_size(), home_),
                        {}};
    if constexpr (!stream_ordered) n.requests.resize(this->layout_.buckets().size());
    exec().synchronize(home_);  // the buffers exist for every stream
    return n;
  }
  void install_workspace(workspace_buffers&& n) noexcept {
    payload_ = std::move(n.payload);
    wire_ = std::move(n.wire);
    if constexpr (!stream_ordered) requests_ = std::move(n.requests);
  }

  const detail::workspace_layout& ws() const noexcept { return this->workspace_; }
  std::span<value_type> tensor_payload(std::size_t i) {
    return {payload_.data() + ws().tensor_payload[i], this->plans_[i].count()};
  }
  std::span<value_type> bucket_payload(std::size_t b) {
    return {payload_.data() + ws().bucket_payload[b], ws().payload_of(b)};
  }

  // Codecs: the wire elements of sparse bucket b's tensor i (one per kept entry), and of
  // bucket b.
  std::span<wire_type> tensor_wire(std::size_t b, std::size_t i) {
    return {wire_.data() + ws().wire[b] + (ws().tensor_payload[i] - ws().bucket_payload[b]),
            this->plans_[i].count()};
  }
  std::span<wire_type> bucket_wire(std::size_t b) {
    return {wire_.data() + ws().wire[b], ws().wire_of(b)};
  }

  void run(std::span<value_type> grads, stream_type stream) {
    sync_stats s = this->begin_stats();
    const auto step_start = detail::sync_clock::now();
    // The payload is shared: a step on another stream runs after the previous one, without
    // blocking the host.
    step_done_.order(Exec::native(stream));
    const value_type scale = value_type(1) / static_cast<value_type>(this->comm_.size());
    {
      detail::phase_timer t(s.gather_seconds);
      gather(grads, stream);
    }
    {
      detail::phase_timer t(s.allreduce_seconds);
      reduce(grads, stream, s);
    }
    {
      detail::phase_timer t(s.scatter_seconds);
      expand(grads, scale, stream);
    }
    step_done_.record(Exec::native(stream));
    this->end_step(s, step_start);
  }

  std::span<value_type> dense_of(std::span<value_type> grads, std::size_t i) const {
    const auto& t = this->layout_.tensors()[i];
    return grads.subspan(t.offset, t.size);
  }

  // Gathers every sparse bucket's payload (a codec's encode fused in); a codec also encodes
  // each dense bucket, its pruned entries zeroed first.
  void gather(std::span<value_type> grads, stream_type stream) {
    const auto& buckets = this->layout_.buckets();
    for (std::size_t b = 0; b < buckets.size(); ++b) {
      const auto& bk = buckets[b];
      if (is_sparse(this->strategies_[b])) {
        for (std::size_t i = bk.first_tensor; i < bk.first_tensor + bk.tensor_count; ++i) {
          const std::span<const value_type> d(dense_of(grads, i));
          if constexpr (is_identity) {
            this->compactor_.gather_async(this->plans_[i], d, tensor_payload(i), stream, checked);
          } else {
            this->compactor_.gather_async(this->plans_[i], d, tensor_wire(b, i), stream, checked);
          }
        }
      } else if constexpr (!is_identity) {
        if (bk.size == 0) continue;
        for (std::size_t i = bk.first_tensor; i < bk.first_tensor + bk.tensor_count; ++i) {
          const auto& p = this->plans_[i];
          if (p.count() != p.size()) expand_dense(i, dense_of(grads, i), 1, stream);
        }
        exec().for_each(bk.size,
                        detail::encode_op<value_type, wire_type>{grads.data() + bk.offset,
                                                                 bucket_wire(b).data()},
                        stream);
      }
    }
  }

  // One collective per bucket, launched together where the communicator can group them.
  void reduce(std::span<value_type> grads, stream_type stream, sync_stats& s) {
    constexpr bool groups = requires(Comm & c) {
      c.group_start();
      c.group_end();
    };
    auto& comm = this->comm_;
    const auto& buckets = this->layout_.buckets();
    if constexpr (groups) comm.group_start();
    try {
      for (std::size_t b = 0; b < buckets.size(); ++b) {
        std::span<wire_type> region;
        if constexpr (is_identity) {
          region = is_sparse(this->strategies_[b])
                       ? bucket_payload(b)
                       : grads.subspan(buckets[b].offset, buckets[b].size);
        } else {
          region = bucket_wire(b);
        }
        if (region.empty()) continue;  // nothing kept: the same on every rank
        if constexpr (stream_ordered) {
          (void)comm.allreduce_async(region, reduce_op::sum, Exec::native(stream));
        } else {  // host-accessible device memory: as the host engine, all buckets in flight
          requests_[pending_++] = comm.allreduce_async(region, reduce_op::sum);
        }
        ++s.collectives;
        s.bytes_sent += region.size_bytes();
      }
      if constexpr (!stream_ordered) wait_pending();
    } catch (...) {
      if constexpr (!stream_ordered) {
        try {
          wait_pending();  // the buffers must not change under a collective in flight
        } catch (...) {    // the first error is the one to report
        }
      }
      if constexpr (groups) {
        try {
          comm.group_end();
        } catch (...) {  // the first error is the one to report
        }
      }
      throw;
    }
    if constexpr (groups) comm.group_end();
  }

  // The mean, +0 at pruned entries. A codec decodes each dense bucket in place (pruned
  // entries were sent as +0 by every rank, so they come back +0).
  void expand(std::span<value_type> grads, value_type scale, stream_type stream) {
    const auto& buckets = this->layout_.buckets();
    for (std::size_t b = 0; b < buckets.size(); ++b) {
      const auto& bk = buckets[b];
      const bool sparse = is_sparse(this->strategies_[b]);
      if constexpr (!is_identity) {
        if (!sparse) {
          exec().for_each(bk.size,
                          detail::decode_op<value_type, wire_type>{bucket_wire(b).data(),
                                                                   grads.data() + bk.offset, scale},
                          stream);
        }
      }
      for (std::size_t i = bk.first_tensor; i < bk.first_tensor + bk.tensor_count; ++i) {
        const auto& p = this->plans_[i];
        if (!sparse) {
          if constexpr (is_identity) expand_dense(i, dense_of(grads, i), scale, stream);
        } else if constexpr (is_identity) {
          this->compactor_.scatter_async(p, std::span<const value_type>(tensor_payload(i)),
                                         dense_of(grads, i), scale, stream, checked);
        } else {  // decode (the mean) fused into the scatter
          this->compactor_.scatter_async(p, std::span<const wire_type>(tensor_wire(b, i)),
                                         dense_of(grads, i), scale, stream, checked);
        }
      }
    }
  }

  // A reduced dense tensor in place: times scale at kept entries, +0 elsewhere.
  void expand_dense(std::size_t i, std::span<value_type> d, value_type scale, stream_type stream) {
    if (d.empty()) return;
    const auto& p = this->plans_[i];
    if (p.count() == p.size()) {
      if (scale == value_type(1)) return;
      exec().for_each(d.size(), detail::scale_op<value_type>{d.data(), d.data(), scale}, stream);
      return;
    }
    this->compactor_.gather_async(p, std::span<const value_type>(d), tensor_payload(i), stream,
                                  checked);
    this->compactor_.scatter_async(p, std::span<const value_type>(tensor_payload(i)), d, scale,
                                   stream, checked);
  }

  // Completes the collectives in flight, in issue order; each is waited for once even when
  // one throws.
  void wait_pending() {
    const std::size_t n = std::exchange(pending_, 0);
    std::size_t k = 0;
    try {
      for (; k < n; ++k) requests_[k].wait();
    } catch (...) {
      for (++k; k < n; ++k) {
        try {
          requests_[k].wait();
        } catch (...) {  // the first error is the one to report
        }
      }
      throw;
    }
  }

  stream_type home_{};              // plans and payload are allocated and freed here
  typename Exec::event step_done_;  // the end of the last step
  buffer<value_type> payload_;
  buffer<wire_type> wire_;  // codecs only
  requests_t requests_{};   // host communicators: the collectives in flight, pending_ of them
  std::size_t pending_ = 0;
};

}  // namespace pactrain
