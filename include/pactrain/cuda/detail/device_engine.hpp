// pactrain::sync on device buffers, for any device compactor: basic_device_compactor<Exec>
// (cuda_compactor, thrust_compactor). Internal; users include <pactrain/cuda/sync.cuh> or
// <pactrain/cuda/thrust_compactor.hpp>. The contract is described in <pactrain/cuda/sync.cuh>;
// the step itself is device_pipeline.hpp.
//
// Compiles without nvcc where Exec does (thrust_compactor on Thrust's CPP or OMP system), so
// the engine's device math runs in CI without a GPU.
#pragma once

#include <pactrain/codec.hpp>
#include <pactrain/communicator.hpp>
#include <pactrain/concepts.hpp>
#include <pactrain/cuda/detail/device_compactor.hpp>
#include <pactrain/cuda/detail/device_pipeline.hpp>
#include <pactrain/detail/sync/commit.hpp>
#include <pactrain/error.hpp>
#include <pactrain/layout.hpp>
#include <pactrain/mask.hpp>
#include <pactrain/sync.hpp>

#include <cstddef>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace pactrain {

/// The sync engine over device gradient buffers (see <pactrain/cuda/sync.cuh>), with the host
/// engine's collective, cross-checked configuration calls. Steps on different streams run in
/// call order without blocking the host. Not copyable or movable.
template <communicator Comm, class Codec, gradient_mask Mask, class Exec>
class sync<Comm, Codec, Mask, basic_device_compactor<Exec>>
    : public detail::device_pipeline<sync<Comm, Codec, Mask, basic_device_compactor<Exec>>, Comm,
                                     Codec, Mask, Exec> {
  using compactor_t = basic_device_compactor<Exec>;
  using pipeline = detail::device_pipeline<sync, Comm, Codec, Mask, Exec>;
  using core = detail::sync_core<sync, Comm, Codec, Mask, compactor_t>;
  using entry = detail::step_entry<sync, Comm, Codec, Mask, compactor_t>;
  friend core;
  friend entry;
  using pipeline::is_ternary;

 public:
  using typename pipeline::plan_type;
  using typename pipeline::stream_type;
  using typename pipeline::value_type;
  using typename pipeline::wire_type;

  /// Collective: checks that all ranks hold the same layout and codec settings and starts
  /// with every entry kept, as on the host engine (sync.hpp). Plans and the payload live on
  /// `stream` (it must outlive the engine); the constructor synchronises it.
  sync(Comm comm, param_layout layout, sync_options opt = {}, stream_type stream = {})
      : sync(std::move(comm), std::move(layout), Codec{}, compactor_t{}, opt, stream) {}
  /// As above, on `stream`: sync{comm, layout, stream}.
  sync(Comm comm, param_layout layout, stream_type stream)
      : sync(std::move(comm), std::move(layout), Codec{}, compactor_t{}, sync_options{}, stream) {}
  /// As above, with a codec's settings.
  sync(Comm comm, param_layout layout, Codec codec, sync_options opt = {}, stream_type stream = {})
      : sync(std::move(comm), std::move(layout), std::move(codec), compactor_t{}, opt, stream) {}
  /// As above, with a compactor's settings too.
  sync(Comm comm, param_layout layout, Codec codec, compactor_t compactor, sync_options opt = {},
       stream_type stream = {})
      : pipeline(std::move(comm), std::move(layout), std::move(codec), std::move(compactor), opt,
                 stream) {
    this->commit_full("sync");
  }

  /// Collective, as on the host engine (sync.hpp); set_masks and set_strategies wait for the
  /// last step and build the new plans before returning. On bad input or disagreement on any
  /// rank, every rank throws the same pactrain::error and nothing changes.
  using core::reject_masks;
  using core::set_masks;
  using core::set_strategies;

  /// Averages `grads` (device memory, the flat buffer of all tensors) across ranks in place,
  /// queued on `stream`; pruned entries come back as +0. Never synchronises (with
  /// sync_options::checked its agreement round waits for every rank on the host). Bad input
  /// throws pactrain::error before anything is queued.
  void allreduce_async(std::span<value_type> grads, stream_type stream = {}) {
    begin(grads, "allreduce", stream);
    finish();
  }
  /// As above, with each tensor in a buffer of its own (device memory, layout order). A dense
  /// bucket whose tensors do not lie back to back goes through a staging copy.
  void allreduce_async(std::span<const std::span<value_type>> tensors, stream_type stream = {}) {
    begin(tensors, "allreduce", stream);
    finish();
  }

  /// Local: opens a step over `grads` (device memory, all tensors) on `stream`. The buffer
  /// must stay alive, and each bucket's entries untouched from its submission until the work
  /// finish_step queues has run.
  void begin_step(std::span<value_type> grads, stream_type stream = {}) {
    begin(grads, "begin_step", stream);
  }
  /// As above, with each tensor in a buffer of its own.
  void begin_step(std::span<const std::span<value_type>> tensors, stream_type stream = {}) {
    begin(tensors, "begin_step", stream);
  }
  /// Collective: bucket `b`'s gradients are final on the step's stream; queues its gather and
  /// allreduce there now, so that they overlap the backward pass of the next buckets. Every
  /// rank submits the same buckets in the same order.
  void submit_bucket(std::size_t b) { this->submit(b); }
  /// Collective: submits, in layout order, every bucket not yet submitted (grouped where the
  /// communicator can), then queues every bucket's scatter of the mean. Closes the step;
  /// never synchronises.
  void finish_step() { finish(); }
  /// Collective: finish_step fused with the optimizer step, as on the host engine (sync.hpp):
  /// waits for the step's results (the update needs their verdict), then hands them to
  /// `update` on the step's stream, in device memory: update.kept(tensor, payload, factor) for
  /// a sparse bucket's tensors (the gradient buffer is not written), update.dense(tensor,
  /// grad) for a dense bucket's, then update.done(). After a non-finite step no update is made
  /// and the gradients are written back as finish_step writes them. device_sgd_update
  /// (<pactrain/cuda/sgd.hpp>) makes such an update.
  template <fused_update<value_type> Update>
  void finish_step(Update& update) {
    finish(true, &update);
  }
  /// True between begin_step and finish_step.
  using entry::step_open;

  /// Waits for the last step; what a resumed run needs besides masks and strategies (the step
  /// counter, error feedback's residuals), in the host engine's format: a state saved by either
  /// engine loads into the other. Every rank saves its own. Throws pactrain::error while a step
  /// is open.
  [[nodiscard]] std::vector<std::byte> save_state() const { return this->save(); }
  /// Collective, after set_masks and set_strategies (which reset the state): restores this
  /// rank's save_state(). Corrupt bytes, bytes saved under another layout, masks, strategies,
  /// codec or rank count, or unequal steps: every rank throws alike, nothing changes.
  void load_state(std::span<const std::byte> in) { this->load(in); }

  /// allreduce_async, then synchronises `stream` and judges the results as the host engine
  /// does: stats().nonfinite_buckets counts the buckets holding an Inf or a NaN, and such a
  /// step leaves the step counter as it was (queued steps cannot know: see sync.cuh).
  void allreduce(std::span<value_type> grads, stream_type stream = {}) {
    begin(grads, "allreduce", stream);
    finish(true);
    exec().synchronize(stream);
  }

  /// allreduce fused with the optimizer step, as finish_step(update); synchronises `stream`
  /// after the update.
  template <fused_update<value_type> Update>
  void allreduce(std::span<value_type> grads, Update& update, stream_type stream = {}) {
    begin(grads, "allreduce", stream);
    finish_step(update);
    exec().synchronize(stream);
  }

  /// As above for a pointer and a size.
  void allreduce(value_type* data, std::size_t n, stream_type stream = {}) {
    PACTRAIN_EXPECTS(data != nullptr || n == 0,
                     "sync::allreduce: null buffer with " + std::to_string(n) + " entries");
    allreduce(std::span<value_type>(data, n), stream);
  }
  /// As above, over one buffer per tensor.
  void allreduce(std::span<const std::span<value_type>> tensors, stream_type stream = {}) {
    begin(tensors, "allreduce", stream);
    finish(true);
    exec().synchronize(stream);
  }

 private:
  using entry::begin;
  using entry::finish;
  using pipeline::exec;

  // --- commit hooks (see detail/sync/commit.hpp; the buffers' are the pipeline's) ---

  void check_commit(const char* op) const { this->current_.check_closed(op); }
  static void check_strategy(bucket_strategy) noexcept {}  // all four run here

  // --- state hooks (see commit.hpp): the step counter, and the ternary codec's residuals and
  // previous_max scales (zeros with current_max, as the host engine saves) ---

  struct no_state {};
  using staged_state =
      std::conditional_t<is_ternary, typename detail::device_ternary<Exec>::staged_state, no_state>;
  template <class F>
  void view_state(F&& f) const {
    std::vector<value_type> residuals;
    std::vector<float> scales;
    bool ready = false;
    if constexpr (is_ternary) {
      this->step_done_.wait();
      residuals.resize(this->bufs_.ternary.residual_count());
      scales.resize(this->bufs_.ternary.scale_word_count());
      this->bufs_.ternary.download_state(exec(), residuals, scales, ready, this->home_);
    }
    f(std::span<const value_type>(residuals), std::span<const float>(scales), ready);
  }
  [[nodiscard]] std::pair<std::size_t, std::size_t> state_sizes() const noexcept {
    if constexpr (is_ternary) {
      return {this->bufs_.ternary.residual_count(), this->bufs_.ternary.scale_word_count()};
    } else {
      return {0, 0};
    }
  }
  staged_state stage_state(detail::engine_state<value_type>&& st) const {
    if constexpr (is_ternary) {
      this->step_done_.wait();
      return this->bufs_.ternary.stage_state(exec(), st.residuals, st.scales, st.scales_ready,
                                             this->home_);
    } else {
      return {};
    }
  }
  void install_state(staged_state&& staged) noexcept {
    if constexpr (is_ternary) this->bufs_.ternary.install_state(std::move(staged));
  }
};

}  // namespace pactrain
