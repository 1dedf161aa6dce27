// pactrain::sync -- the engine: averages pruned gradients across ranks, sending only the
// entries the masks keep.
//
//   pactrain::sync s{pactrain::mpi_communicator{MPI_COMM_WORLD}, layout};   // collective
//   s.set_masks(masks);      // collective; checked across ranks
//   s.allreduce(grads);      // averaged; pruned entries come back as +0
//
// With a codec (codec/half_precision.hpp, codec/ternary.hpp), optionally with error feedback
// (feedback.hpp):
//   pactrain::sync s{pactrain::mpi_communicator{MPI_COMM_WORLD}, layout,
//                    pactrain::error_feedback{pactrain::ternary_codec{{.seed = 1}}}};
//
// The type, where it must be named: sync<Comm, Codec = identity_codec<float>,
// Mask = bitmap_mask, Compactor = default_compactor<Comm>::type>. The same facade runs on
// device buffers (cuda/sync.cuh) when the compactor is a device one.
// How a step runs, file by file: docs/ARCHITECTURE.md.
#pragma once

#include <pactrain/codec.hpp>
#include <pactrain/communicator.hpp>
#include <pactrain/compactor.hpp>
#include <pactrain/concepts.hpp>
#include <pactrain/detail/sync/host_engine.hpp>
#include <pactrain/error.hpp>
#include <pactrain/feedback.hpp>
#include <pactrain/layout.hpp>
#include <pactrain/mask.hpp>
#include <pactrain/strategy.hpp>
#include <pactrain/sync_options.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace pactrain {

/// The sync engine over a param_layout (Codec's value_type is the gradient type). Every rank
/// makes the collective calls in the same order. Bad input fails configuration calls on every
/// rank alike; step calls check only locally, so a rank that throws strands the rest (stop the
/// job), unless sync_options::checked makes every step agree first.
template <communicator Comm, class Codec = identity_codec<float>, gradient_mask Mask = bitmap_mask,
          class Compactor = typename default_compactor<Comm>::type>
class sync : private detail::host_engine<Comm, Codec, Mask, Compactor> {
  using engine = detail::host_engine<Comm, Codec, Mask, Compactor>;

 public:
  using communicator_type = Comm;
  using codec_type = Codec;
  using mask_type = Mask;
  using compactor_type = Compactor;
  using value_type = typename Codec::value_type;
  using wire_type = typename Codec::wire_type;
  using plan_type = typename Compactor::plan_type;

  /// True when the communicator can sum value_type, so the plain strategies are available.
  static constexpr bool plain_supported = engine::plain_supported;

  /// Collective: checks that all ranks hold the same layout and codec settings and that the
  /// codec suits this many ranks; starts with every entry kept (Mask::full).
  sync(Comm comm, param_layout layout, sync_options opt = {})
      : engine(std::move(comm), std::move(layout), Codec{}, Compactor{}, opt) {}
  /// As above, with a codec's settings (e.g. ternary_codec{{.seed = 1}}).
  sync(Comm comm, param_layout layout, Codec codec, sync_options opt = {})
      : engine(std::move(comm), std::move(layout), std::move(codec), Compactor{}, opt) {}
  /// As above, with a compactor's settings too.
  sync(Comm comm, param_layout layout, Codec codec, Compactor compactor, sync_options opt = {})
      : engine(std::move(comm), std::move(layout), std::move(codec), std::move(compactor), opt) {}

  // --- configuration (collective) ---

  /// Collective: replaces the masks (one per tensor, in layout order) after checking that
  /// every rank gives the same ones. On disagreement or bad input on any rank, every rank
  /// throws the same pactrain::error naming the first mismatching tensor; nothing changes.
  using engine::set_masks;

  /// Collective: what a rank that could not produce its masks calls while the others call
  /// set_masks. Every rank throws the same pactrain::error naming this rank and `reason`.
  using engine::reject_masks;

  /// Collective: sets the strategy of every bucket (one per bucket), checked across ranks.
  /// Plain strategies need plain_supported.
  using engine::set_strategies;

  // --- a step ---

  /// Collective: averages `grads` (all tensors, layout().total_size() entries) across ranks
  /// in place; pruned entries come back as +0. A bucket that an Inf or NaN reaches comes back
  /// non-finite on every rank, counted in stats().nonfinite_buckets, and the step then
  /// changes no state (residuals, scales, step counter): skip it as AMP's GradScaler would.
  void allreduce(std::span<value_type> grads) {
    this->begin(grads, "allreduce");
    this->finish();
  }
  /// As above for a pointer and a size.
  void allreduce(value_type* data, std::size_t n) {
    PACTRAIN_EXPECTS(data != nullptr || n == 0,
                     "sync::allreduce: null buffer with " + std::to_string(n) + " entries");
    allreduce(std::span<value_type>(data, n));
  }
  /// As above for tensors in separate buffers: one span per tensor, in layout order.
  void allreduce(std::span<const std::span<value_type>> tensors) {
    this->begin(tensors, "allreduce");
    this->finish();
  }

  /// Local: opens a step over `grads` (layout().total_size() entries). The buffer must stay
  /// alive, and each bucket's entries untouched from its submission until finish_step returns.
  void begin_step(std::span<value_type> grads) { this->begin(grads, "begin_step"); }
  /// Local: as above for tensors in separate buffers (the spans are copied).
  void begin_step(std::span<const std::span<value_type>> tensors) {
    this->begin(tensors, "begin_step");
  }

  /// Collective: bucket `b`'s gradients are final; starts its allreduce, which proceeds while
  /// the caller computes. Every rank submits the same buckets in the same order.
  void submit_bucket(std::size_t b) { this->submit(b); }

  /// Collective: submits, in layout order, every bucket not yet submitted, waits for all
  /// collectives and writes the averages back (pruned entries +0). Closes the step.
  void finish_step() { this->finish(); }

  /// Collective: finish_step, fused with the optimizer step. Instead of writing each average
  /// back, hands it to `update` once every bucket is in and finite: update.kept(tensor,
  /// payload, factor) for a sparse bucket's tensors (the kept entries' averages are
  /// payload[k] * factor, in index order; the gradient buffer is not written), update.dense(
  /// tensor, grad) for a dense bucket's (written back as usual), then update.done(). After a
  /// non-finite step no update is made and the gradients are written back as finish_step
  /// writes them. sgd::fused (sgd.hpp) makes such an update.
  template <fused_update<value_type> Update>
  void finish_step(Update& update) {
    this->finish(true, &update);
  }
  /// allreduce fused with the optimizer step, as finish_step(update).
  template <fused_update<value_type> Update>
  void allreduce(std::span<value_type> grads, Update& update) {
    this->begin(grads, "allreduce");
    finish_step(update);
  }

  /// True between begin_step and the end of finish_step.
  using engine::step_open;

  // --- what is committed (local) ---

  using engine::layout;
  using engine::masks;
  /// The compaction plan of tensor i under its committed mask.
  using engine::plan;
  using engine::strategies;
  /// Payload entries bucket b sends under a sparse strategy.
  using engine::payload_size;
  /// Elements bucket b sends per step under its strategy: the codec's wire elements, or
  /// value_type entries for the identity codec and the plain strategies.
  using engine::wire_size;
  /// The engine's codec, compactor and communicator.
  using engine::codec;
  using engine::compactor;
  using engine::get_communicator;
  /// Bytes bucket b would send per step under strategy s (what the planner weighs).
  using engine::wire_bytes;
  /// What the last step did on this rank, and totals since construction.
  using engine::stats;

  // --- state across a resume ---

  /// The step counter seeding the codec's random numbers: steps completed with every bucket
  /// finite since construction, or since set_step. Restore it on resume for a bit-identical
  /// continuation.
  using engine::set_step;
  using engine::step;
  /// error_feedback: the residuals, codec inputs of bucket 0, 1, ... (empty otherwise).
  using engine::residuals;

  /// Local: what a resumed run needs besides masks and strategies (step counter, residuals,
  /// previous_max's scales); every rank saves its own. Throws pactrain::error while a step is open.
  [[nodiscard]] std::vector<std::byte> save_state() const { return this->save(); }

  /// Collective, after set_masks and set_strategies (which reset the state): restores this
  /// rank's save_state(). Corrupt bytes, bytes saved under another layout, masks, strategies,
  /// codec or rank count, or unequal steps or scales: every rank throws alike, nothing changes.
  void load_state(std::span<const std::byte> in) { this->load(in); }
};

}  // namespace pactrain
