// The host engine under the public facade (pactrain/sync.hpp): the step's entry points,
// checked steps, the commit hooks and the state across a resume, over the bucket pipeline of
// host_pipeline.hpp.
#pragma once

#include <pactrain/communicator.hpp>
#include <pactrain/detail/agreement.hpp>
#include <pactrain/detail/sync/checked_step.hpp>
#include <pactrain/detail/sync/commit.hpp>
#include <pactrain/detail/sync/host_pipeline.hpp>
#include <pactrain/detail/sync/host_workspace.hpp>
#include <pactrain/error.hpp>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace pactrain::detail {

template <communicator Comm, class Codec, gradient_mask Mask, class Compactor>
class host_engine : public host_pipeline<host_engine<Comm, Codec, Mask, Compactor>, Comm, Codec,
                                         Mask, Compactor> {
  using pipeline = host_pipeline<host_engine, Comm, Codec, Mask, Compactor>;
  using core = sync_core<host_engine, Comm, Codec, Mask, Compactor>;
  friend core;

 public:
  using pipeline::plain_supported;
  using typename pipeline::plan_type;
  using typename pipeline::value_type;
  using typename pipeline::wire_type;

 protected:
  using pipeline::current_;
  using pipeline::feedback;
  using pipeline::finish_now;
  using pipeline::guarded;
  using pipeline::is_identity;
  using pipeline::open_step;
  using pipeline::residual_;
  using pipeline::scales_;
  using pipeline::submit_now;

  host_engine(Comm comm, param_layout layout, Codec codec, Compactor compactor, sync_options opt)
      : pipeline(std::move(comm), std::move(layout), std::move(codec), std::move(compactor), opt) {
    this->commit_full("sync");
  }

  // --- the step ---

  template <class Views>
  void begin(Views views, const char* op) {
    if (this->options_.checked) return begin_checked(views, op);
    current_.set_views(this->layout_, views, op);
    open_step();
  }

  void submit(std::size_t b) {
    current_.check_open("submit_bucket");
    if (this->options_.checked) return checked_.request(b);
    this->check_bucket(b, "submit_bucket");
    current_.check_unsubmitted(b);
    guarded([&] { submit_now(b); });
  }

  // `update`: null, or the fused optimizer step (see sync.hpp) that takes the results.
  template <class Update = no_update>
  void finish(Update* update = nullptr) {
    if (this->options_.checked) agree_checked();
    current_.check_open("finish_step");
    guarded([&] {
      if (this->options_.checked) {
        for (const auto b : checked_.order()) submit_now(b);
      }
      finish_now(update);
    });
  }

  static constexpr bool checked_supported = true;

  [[nodiscard]] std::span<const value_type> residuals() const noexcept { return residual_; }
  [[nodiscard]] bool step_open() const noexcept { return current_.open(); }

 private:
  // --- checked steps (sync_options::checked; see checked_step.hpp) ---

  template <class Views>
  void begin_checked(Views views, const char* op) {
    if (current_.open()) {
      checked_.fail(std::string("sync::") + op + ": a step is open (begun and not finished)");
      return;
    }
    checked_.open(this->layout_.buckets().size());
    try {
      current_.set_views(this->layout_, views, op);
    } catch (const std::exception& e) {
      checked_.fail(e.what());
    }
    open_step();
  }

  // One agreement round: every rank's verdict, the submission order, and what is committed.
  void agree_checked() {
    try {
      agree(this->comm_, checked_.agreement(this->layout_, current_.open(), this->codec_digest(),
                                            this->mask_digests_));
    } catch (...) {
      current_.close();
      scales_.abandon();
      throw;
    }
    auto& s = current_.stats();
    ++s.collectives;
    s.bytes_sent += agreement_words * sizeof(std::uint64_t);
  }

  // --- commit hooks (see commit.hpp) ---

  void check_commit(const char* op) const { current_.check_closed(op); }
  void check_strategy(bucket_strategy st) const {
    PACTRAIN_EXPECTS(plain_supported || is_identity || !is_plain(st),
                     std::string("strategy ") + to_string(st) +
                         " needs a communicator that can sum the codec's value_type");
  }
  plan_type build_plan(const Mask& m) const { return this->compactor_.make_plan(m); }
  // A commit's new buffers (host_workspace.hpp); may throw: runs before the agreement, so a
  // failure reaches every rank.
  using workspace_buffers = host_workspace_buffers<Codec, Comm, feedback>;
  [[nodiscard]] workspace_buffers allocate_workspace(const workspace_layout& w,
                                                     std::span<const plan_type>) const {
    return workspace_buffers::allocate(w, this->codec_);
  }
  void install_workspace(workspace_buffers&& n) noexcept {
    this->payload_ = std::move(n.payload);
    this->wire_ = std::move(n.wire);
    residual_ = std::move(n.residual);
    this->residual_next_ = std::move(n.residual_next);
    if constexpr (!is_identity) scales_ = std::move(n.scales);
  }

  // --- state hooks (see commit.hpp) ---

  using staged_state = engine_state<value_type>;
  template <class F>
  void view_state(F&& f) const {
    f(std::span<const value_type>(residual_), std::span<const float>(scales_.previous()),
      scales_.ready());
  }
  [[nodiscard]] std::pair<std::size_t, std::size_t> state_sizes() const noexcept {
    return {residual_.size(), scales_.previous().size()};
  }
  static staged_state stage_state(engine_state<value_type>&& st) noexcept { return std::move(st); }
  void install_state(staged_state&& st) noexcept {
    residual_ = std::move(st.residuals);
    scales_.restore(std::move(st.scales), st.scales_ready);
  }

  checked_step checked_;  // sync_options::checked: the step's record
};

}  // namespace pactrain::detail
