// The host engine under the public facade (pactrain/sync.hpp): the hooks of the shared core
// (step_entry.hpp: the step's entry points and checked steps; commit.hpp: the commit and the
// state across a resume) and the step (step_flow.hpp) over the bucket primitives of
// host_pipeline.hpp.
#pragma once

#include <pactrain/communicator.hpp>
#include <pactrain/detail/sync/commit.hpp>
#include <pactrain/detail/sync/host_pipeline.hpp>
#include <pactrain/detail/sync/host_workspace.hpp>
#include <pactrain/error.hpp>

#include <cstddef>
#include <cstdint>
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
  using entry = step_entry<host_engine, Comm, Codec, Mask, Compactor>;
  using flow = step_flow<host_engine, Comm, Codec, Mask, Compactor>;
  friend core;
  friend entry;
  friend flow;

 public:
  using pipeline::plain_supported;
  using typename pipeline::plan_type;
  using typename pipeline::value_type;
  using typename pipeline::wire_type;

 protected:
  using pipeline::current_;
  using pipeline::feedback;
  using pipeline::is_identity;
  using pipeline::residual_;
  using pipeline::scales_;

  host_engine(Comm comm, param_layout layout, Codec codec, Compactor compactor, sync_options opt)
      : pipeline(std::move(comm), std::move(layout), std::move(codec), std::move(compactor), opt) {
    this->commit_full("sync");
  }

  [[nodiscard]] std::span<const value_type> residuals() const noexcept { return residual_; }

 private:
  // --- step hooks (see commit.hpp) ---

  [[nodiscard]] auto& current() noexcept { return current_; }
  [[nodiscard]] const auto& current() const noexcept { return current_; }
  template <class Views>
  void set_views(Views views, const char* op) {
    current_.set_views(this->layout_, views, op);
  }
  void abandon_step() noexcept {
    current_.close();
    scales_.abandon();
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
};

}  // namespace pactrain::detail
