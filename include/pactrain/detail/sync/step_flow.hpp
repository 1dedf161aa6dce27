// The step of both sync engines, written once over the bucket primitives of a backend: the
// host pipeline (host_pipeline.hpp) and the device pipeline (cuda/detail/device_pipeline.hpp).
//   submit_now(b)  prepare bucket b (its codec input and local scales) and send it (encode,
//                  start its sum), or start its scale round first: it is sent once its scale
//                  is known;
//   finish_now     prepare and send every other bucket (those awaiting a scale after one round
//                  for all of them) and flush the sends; start the round of the next step's
//                  scales (previous_max); complete each bucket in the order of its send (wait,
//                  decode, write back, or hold the payload for a fused update); close the
//                  rounds with the step's verdicts; hand the results to a fused update; keep
//                  the step's new state only if every bucket was finite; close the step.
// A backend (a base of the engine; the flow reaches it through the engine) supplies:
//   send_ready()          sends the buckets whose scale round has completed;
//   prepare(b, alone)     bucket b's codec input and local scales (alone: submit_bucket's);
//   needs_round(b)        whether b must wait for a scale round of this step;
//   start_round(b)        b's own round; b is sent once it completes;
//   round(due)            one round for the buckets in `due`;
//   send(b, grouped)      encode and start b's sum (grouped: finish's, started by flush);
//   flush()               starts the grouped sums;
//   start_next()          previous_max's round of the next step's scales;
//   complete(b, hold)     b's result written back (hold: a sparse bucket's payload kept for a
//                         fused update instead);
//   close_rounds(judge, fused)  the verdicts of the next step's round, and (judge) of every
//                         bucket (fused: of the held payloads);
//   keep_state(finite)    keeps or drops the step's new residuals and scales;
//   tensor_payload(i), tensor(i), write_back(b)   what a fused update reads, and the write-back
//                         of a held bucket after a non-finite step.
// What the two backends cannot share is a property of the memory they work in: the host learns
// each bucket's verdict as it waits for it; the device learns the verdicts only by waiting for
// the stream, which a synchronous step does (judge) and a queued step does not.
#pragma once

#include <pactrain/communicator.hpp>
#include <pactrain/detail/sync/phase_timer.hpp>
#include <pactrain/detail/sync/step_entry.hpp>
#include <pactrain/detail/sync/step_state.hpp>
#include <pactrain/mask.hpp>

#include <cstddef>
#include <span>
#include <type_traits>
#include <vector>

namespace pactrain::detail {

template <class Engine, communicator Comm, class Codec, gradient_mask Mask, class Compactor>
class step_flow : public step_entry<Engine, Comm, Codec, Mask, Compactor> {
  using entry = step_entry<Engine, Comm, Codec, Mask, Compactor>;

 public:
  using value_type = typename Codec::value_type;

 protected:
  using entry::entry;

  void submit_now(std::size_t b) {
    auto& e = engine();
    e.send_ready();
    e.prepare(b, true);
    if (e.needs_round(b)) {
      e.start_round(b);
    } else {
      e.send(b, false);
    }
  }

  // `judge`: the device backend waits for the step and judges every bucket (the host backend
  // always does). `update`: null, or the fused optimizer step (see sync.hpp).
  template <class Update = no_update>
  void finish_now(bool judge = false, Update* update = nullptr) {
    constexpr bool fused = !std::is_same_v<Update, no_update>;
    auto& e = engine();
    auto& cur = e.current();
    e.send_ready();
    // A bucket that needs no scale of this step is sent as soon as it is prepared, so its
    // allreduce moves while the next one is compacted; the others wait for one round.
    due_.clear();
    for (std::size_t b = 0; b < cur.buckets(); ++b) {
      if (cur.submitted(b)) continue;
      e.prepare(b, false);
      if (e.needs_round(b)) {
        due_.push_back(b);
      } else {
        e.send(b, true);
      }
    }
    if (!due_.empty()) e.round(std::span<const std::size_t>(due_));
    for (const auto b : due_) e.send(b, true);
    e.flush();
    e.start_next();
    for (const auto b : cur.order()) e.complete(b, fused && this->route(b).sparse);
    e.close_rounds(judge, fused);
    const bool finite = cur.nonfinite_count() == 0;
    if constexpr (fused) hand_over(*update, finite);
    e.keep_state(finite);
    auto& s = cur.stats();
    s.nonfinite_buckets = cur.nonfinite_count();
    cur.close();
    this->end_step(s, cur.start());
  }

  /// What the sum of bucket b is multiplied by on its way back: 1/P for a plain bucket (its
  /// sum), 1 for a coded one (decode gave the mean).
  [[nodiscard]] value_type factor(std::size_t b) const {
    return this->plain(b) ? value_type(1) / static_cast<value_type>(this->comm_.size())
                          : value_type(1);
  }

 private:
  // After the verdicts: every tensor to `u` in layout order (a sparse bucket's kept entries
  // from its payload, with the factor its write-back would apply; a dense bucket's written-back
  // tensor), then u.done(). After a non-finite step no update (GradScaler's skip), and the
  // held buckets are written back instead.
  template <class Update>
  void hand_over(Update& u, bool finite) {
    auto& e = engine();
    phase_timer t(e.current().stats().scatter_seconds);
    const auto& buckets = this->layout_.buckets();
    for (std::size_t b = 0; b < buckets.size(); ++b) {
      const bool sparse = this->route(b).sparse;
      if (!finite) {
        if (sparse) e.write_back(b);
        continue;
      }
      const auto& bk = buckets[b];
      for (std::size_t i = bk.first_tensor; i < bk.first_tensor + bk.tensor_count; ++i) {
        if (sparse) {
          u.kept(i, std::span<const value_type>(e.tensor_payload(i)), factor(b));
        } else {
          u.dense(i, std::span<const value_type>(e.tensor(i)));
        }
      }
    }
    if (finite) u.done();
  }

  std::vector<std::size_t> due_;  // finish: prepared, awaiting their scale round

  Engine& engine() noexcept { return static_cast<Engine&>(*this); }
};

}  // namespace pactrain::detail
