// The step's entry points of both sync engines, on top of the shared core (commit.hpp):
// begin, submit and finish, with one close-on-error guard, and checked steps
// (sync_options::checked, checked_step.hpp): a checked step records this rank's mistakes until
// finish's agreement, which every rank reaches, and submits its buckets only then.
//
// An engine derives from step_entry<Engine, ...> (CRTP, through its pipeline) and supplies
// six hooks:
//   current()                      the open step (a step_state);
//   set_views(views, op)           takes the step's gradients; throws, changing nothing;
//   open_step(args...)             opens the step over them;
//   submit_now(b), finish_now(...) the step's submission of bucket b, and the rest
//                                  (step_flow.hpp);
//   abandon_step()                 closes the step after a failure; cannot throw.
#pragma once

#include <pactrain/communicator.hpp>
#include <pactrain/detail/agreement.hpp>
#include <pactrain/detail/sync/checked_step.hpp>
#include <pactrain/detail/sync/commit.hpp>
#include <pactrain/mask.hpp>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>
#include <utility>

namespace pactrain::detail {

template <class Engine, communicator Comm, class Codec, gradient_mask Mask, class Compactor>
class step_entry : public sync_core<Engine, Comm, Codec, Mask, Compactor> {
  using core = sync_core<Engine, Comm, Codec, Mask, Compactor>;

 public:
  [[nodiscard]] bool step_open() const noexcept { return engine().current().open(); }

 protected:
  using core::core;

  template <class Views, class... Open>
  void begin(Views views, const char* op, Open... open) {
    auto& cur = engine().current();
    if (!this->options_.checked) {
      cur.check_closed(op);
      engine().set_views(views, op);
      return engine().open_step(open...);
    }
    if (cur.open()) {
      return checked_.fail(std::string("sync::") + op +
                           ": a step is open (begun and not finished)");
    }
    checked_.open(this->layout_.buckets().size());
    try {
      engine().set_views(views, op);
    } catch (const std::exception& e) {  // the agreement refuses the step: open only the record
      checked_.fail(e.what());
      return cur.step_state::begin(this->layout_.buckets().size(), this->begin_stats());
    }
    engine().open_step(open...);
  }

  void submit(std::size_t b) {
    auto& cur = engine().current();
    cur.check_open("submit_bucket");
    if (this->options_.checked) return checked_.request(b);
    this->check_bucket(b, "submit_bucket");
    cur.check_unsubmitted(b);
    guarded([&] { engine().submit_now(b); });
  }

  template <class... Args>
  void finish(Args&&... args) {
    if (this->options_.checked) agree_checked();
    engine().current().check_open("finish_step");
    guarded([&] {
      if (this->options_.checked) {
        for (const auto b : checked_.order()) engine().submit_now(b);
      }
      engine().finish_now(std::forward<Args>(args)...);
    });
  }

  // A failure inside a step (a communication error, an allocation) abandons the step, so the
  // engine can begin another; what was already written or queued stays.
  template <class F>
  void guarded(F&& f) {
    try {
      f();
    } catch (...) {
      engine().abandon_step();
      throw;
    }
  }

 private:
  // One agreement round: every rank's verdict, the submission order, and what is committed.
  void agree_checked() {
    guarded([&] {
      agree(this->comm_, checked_.agreement(this->layout_, engine().current().open(),
                                            this->codec_digest(), this->mask_digests_));
    });
    auto& s = engine().current().stats();
    ++s.collectives;
    s.bytes_sent += agreement_words * sizeof(std::uint64_t);
  }

  checked_step checked_;  // sync_options::checked: the open step's record

  Engine& engine() noexcept { return static_cast<Engine&>(*this); }
  const Engine& engine() const noexcept { return static_cast<const Engine&>(*this); }
};

}  // namespace pactrain::detail
