// What the host and device sync engines share: the components, the layout, the committed
// masks with their digests and compaction plans, the strategies, the workspace layout, the
// collective commit and reject, the saved state, statistics and the step counter.
//
// An engine derives from sync_core<Engine, ...> (CRTP) and supplies five hooks, called by
// commit():
//   check_commit(op)               throws if this engine cannot take a commit now;
//   check_strategy(s)              throws if this engine cannot run strategy s;
//   build_plan(mask)               the compactor's plan for one mask;
//   allocate_workspace(w, plans)   the buffers `w` describes (and whatever else the engine
//                                  derives from the new plans); may throw;
//   install_workspace(buffers)     puts them in place; cannot throw;
// four called by save() and load() (check_commit too: no step may be open):
//   view_state(f)                  f(residuals, scales, scales_ready) in host memory, after
//                                  the last step;
//   state_sizes()                  {residuals, scales} this engine holds;
//   stage_state(st)                what install_state needs of a parsed state, built where
//                                  the state will live; may throw;
//   install_state(staged)          puts it in place; cannot throw.
// The step's entry points, checked steps included, are step_entry.hpp's, on top of this.
// One byte format (state_format.hpp) for both: a state saved by either engine loads into
// the other.
#pragma once

#include <pactrain/codec.hpp>
#include <pactrain/communicator.hpp>
#include <pactrain/compactor.hpp>
#include <pactrain/detail/agreement.hpp>
#include <pactrain/detail/sync/phase_timer.hpp>
#include <pactrain/detail/sync/state_format.hpp>
#include <pactrain/detail/sync/workspace.hpp>
#include <pactrain/digest.hpp>
#include <pactrain/error.hpp>
#include <pactrain/feedback.hpp>
#include <pactrain/layout.hpp>
#include <pactrain/mask.hpp>
#include <pactrain/strategy.hpp>
#include <pactrain/sync_options.hpp>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace pactrain::detail {

template <class Engine, communicator Comm, class Codec, gradient_mask Mask, class Compactor>
class sync_core {
  static_assert(gradient_codec<Codec>,
                "pactrain::sync: Codec must model gradient_codec (value_type, wire_type, "
                "codec_traits)");
  static_assert(codec_traits<Codec>::is_linear,
                "pactrain::sync: a compacted allreduce sums encoded payloads, which is correct "
                "only for codecs that are linear under summation (codec_traits<Codec>::is_linear)");
  static_assert(compactor_for<Compactor, Mask, typename Codec::value_type>,
                "pactrain::sync: Compactor must model compactor_for<Compactor, Mask, value_type>");

 public:
  using mask_type = Mask;
  using compactor_type = Compactor;
  using communicator_type = Comm;
  using codec_type = Codec;
  using value_type = typename Codec::value_type;
  using wire_type = typename Codec::wire_type;
  using plan_type = typename Compactor::plan_type;

  [[nodiscard]] const param_layout& layout() const noexcept { return layout_; }
  [[nodiscard]] const std::vector<Mask>& masks() const noexcept { return masks_; }
  [[nodiscard]] const plan_type& plan(std::size_t tensor) const { return plans_.at(tensor); }
  [[nodiscard]] const std::vector<bucket_strategy>& strategies() const noexcept {
    return strategies_;
  }
  [[nodiscard]] std::size_t payload_size(std::size_t b) const {
    check_bucket(b, "payload_size");
    return workspace_.payload_of(b);
  }
  [[nodiscard]] std::size_t wire_size(std::size_t b) const {
    check_bucket(b, "wire_size");
    if (plain(b)) return is_sparse(strategies_[b]) ? payload_size(b) : layout_.buckets()[b].size;
    return workspace_.wire_of(b);
  }
  [[nodiscard]] std::size_t wire_bytes(std::size_t b, bucket_strategy s) const {
    const std::size_t n = is_sparse(s) ? payload_size(b) : layout_.buckets().at(b).size;
    if (is_identity || is_plain(s)) return n * sizeof(value_type);
    return codec_.wire_size(n, comm_.size()) * sizeof(wire_type);
  }
  [[nodiscard]] const Codec& codec() const noexcept { return codec_; }
  [[nodiscard]] std::uint64_t step() const noexcept { return step_; }
  void set_step(std::uint64_t s) noexcept { step_ = s; }
  [[nodiscard]] const sync_stats& stats() const noexcept { return stats_; }
  [[nodiscard]] const sync_options& options() const noexcept { return options_; }
  [[nodiscard]] Comm& get_communicator() noexcept { return comm_; }
  [[nodiscard]] const Compactor& compactor() const noexcept { return compactor_; }

  // The collective changes of what is committed; both engines' contracts are in sync.hpp.
  void set_masks(std::vector<Mask> masks) { commit(std::move(masks), strategies_, "set_masks"); }
  [[noreturn]] void reject_masks(std::string reason) { reject(std::move(reason), "set_masks"); }
  void set_strategies(std::vector<bucket_strategy> s) {
    commit(masks_, std::move(s), "set_strategies");
  }

 protected:
  static constexpr bool is_identity = codec_traits<Codec>::is_identity;
  static constexpr bool feedback = has_feedback_v<Codec> && !is_identity;

  sync_core(Comm comm, param_layout layout, Codec codec, Compactor compactor, sync_options opt)
      : comm_(std::move(comm)),
        layout_(std::move(layout)),
        compactor_(std::move(compactor)),
        codec_(std::move(codec)),
        options_(opt),
        strategies_(layout_.buckets().size(), opt.strategy) {}

  // Engines call this last in their constructor, once their own members exist: the first
  // commit, every entry kept.
  void commit_full(const char* op) {
    std::vector<Mask> full;
    std::string error;
    try {
      full.reserve(layout_.tensor_count());
      for (const auto& t : layout_.tensors()) full.push_back(Mask::full(t.size));
    } catch (const std::exception& e) {  // never leave the peers waiting
      error = e.what();
    }
    if (!error.empty()) reject(std::move(error), op);
    commit(std::move(full), strategies_, op);
  }

  // --- state across a resume (sync::save_state and load_state) ---

  [[nodiscard]] std::vector<std::byte> save() const {
    engine().check_commit("save_state");
    std::vector<std::byte> out;
    engine().view_state([&](std::span<const value_type> residuals, std::span<const float> scales,
                            bool scales_ready) {
      out = state_format<value_type>::write(fit_digest(), comm_.rank(), comm_.size(), step_,
                                            scales_ready, residuals, scales);
    });
    return out;
  }

  void load(std::span<const std::byte> in) {
    std::uint64_t step = 0;
    typename Engine::staged_state staged;
    agreement_input a;
    a.layout = &layout_;
    a.operation = "load_state";
    a.config_name = "strategies, step counters or scales";
    try {
      engine().check_commit("load_state");
      const auto [residuals, scales] = engine().state_sizes();
      auto st = state_format<value_type>::read(in, fit_digest(), comm_.rank(), comm_.size(),
                                               residuals, scales);
      a.config_digest = loaded_state_digest(strategies_, st);
      step = st.step;
      staged = engine().stage_state(std::move(st));
    } catch (const std::exception& e) {  // bad_alloc too: never leave the peers waiting
      a.local_error = e.what();
      a.config_digest = loaded_state_digest(strategies_, engine_state<value_type>{});
    }
    a.codec_digest = codec_digest();
    a.mask_digests = mask_digests_;
    agree(comm_, a);
    step_ = step;
    engine().install_state(std::move(staged));
  }

  // How bucket b travels (workspace.hpp); a plain bucket bypasses the codec (the identity
  // codec's always do).
  [[nodiscard]] const bucket_route& route(std::size_t b) const { return workspace_.routes[b]; }
  [[nodiscard]] bool plain(std::size_t b) const { return !route(b).coded; }

  void check_bucket(std::size_t b, const char* op) const {
    PACTRAIN_EXPECTS(b < layout_.buckets().size(), std::string("sync::") + op + ": bucket " +
                                                       std::to_string(b) + " of " +
                                                       std::to_string(layout_.buckets().size()));
  }

  // Collective: every rank takes part and throws the same error naming this rank's reason.
  [[noreturn]] void reject(std::string reason, const char* op) {
    agreement_input in;
    in.layout = &layout_;
    in.operation = op;
    in.local_error = reason.empty() ? "no reason given" : std::move(reason);
    agree(comm_, in);
    PACTRAIN_FAIL(std::string(op) + ": rejected");  // not reached: agree throws
  }

  // Collective: checks and builds everything new locally, agrees across ranks (every rank's
  // verdict is part of the round, so all ranks throw together), then installs it with moves
  // that cannot throw. A failure on any rank leaves every rank on the old state.
  void commit(std::vector<Mask> masks, std::vector<bucket_strategy> strategies, const char* op) {
    agreement_input in;
    in.layout = &layout_;
    in.operation = op;
    std::vector<std::uint64_t> digests;
    std::vector<plan_type> plans;
    workspace_layout w;
    typename Engine::workspace_buffers buffers;
    try {
      engine().check_commit(op);
      check_commit_sizes(layout_, masks, strategies.size());
      for (const auto st : strategies) {
        PACTRAIN_EXPECTS(st.valid(),
                         "bucket strategy (payload " +
                             std::to_string(static_cast<unsigned>(st.payload)) + ", encoding " +
                             std::to_string(static_cast<unsigned>(st.encoding)) +
                             ") is not one of sparse, dense, sparse_plain, dense_plain");
        engine().check_strategy(st);
      }
      digests.reserve(masks.size());
      plans.reserve(masks.size());
      for (const auto& m : masks) {
        digests.push_back(m.digest());
        plans.push_back(engine().build_plan(m));
      }
      codec_.validate(comm_.size());
      // Sized before the agreement: an error while sizing reaches every rank through it.
      w = workspace_layout::make(
          layout_, strategies, [&](std::size_t i) { return plans[i].count(); },
          [](bucket_strategy s) { return !is_identity && !is_plain(s); },
          [&](std::size_t n) { return codec_.wire_size(n, comm_.size()); }, Codec::uses_scale);
      buffers = engine().allocate_workspace(w, std::span<const plan_type>(plans));
    } catch (const std::exception& e) {  // bad_alloc too: never leave the peers waiting
      in.local_error = e.what();
    }
    in.config_digest =
        digest_builder(strategies_digest(strategies)).add(std::uint64_t{options_.checked}).value();
    in.config_name = "bucket strategies or sync_options";
    in.codec_digest = codec_digest();
    in.mask_digests = digests;
    agree(comm_, in);

    // Everyone agrees, and everything new exists: install it without a throw.
    engine().install_workspace(std::move(buffers));
    masks_ = std::move(masks);
    mask_digests_ = std::move(digests);
    plans_ = std::move(plans);
    strategies_ = std::move(strategies);
    workspace_ = std::move(w);
  }

  // What a saved state must have been saved with (state_format.hpp).
  [[nodiscard]] std::uint64_t fit_digest() const {
    return state_fit_digest(layout_, comm_.size(), mask_digests_, strategies_, codec_);
  }

  static std::uint64_t strategies_digest(std::span<const bucket_strategy> strategies) {
    digest_builder d(0x73747261);  // "stra"
    for (const auto s : strategies) d.add(s.code());
    return d.value();
  }
  // The codec's settings, the value type and the feedback policy: engines that differ in any
  // of them would sum different wire formats or keep different state.
  [[nodiscard]] std::uint64_t codec_digest() const {
    digest_builder d(0x636f6463);  // "codc"
    d.add(std::uint64_t{sizeof(value_type)}).add(std::uint64_t{feedback});
    if constexpr (requires { codec_.digest(); }) d.add(codec_.digest());
    return d.value();
  }

  // The statistics of a step about to run, and their hand-over once it has.
  [[nodiscard]] sync_stats begin_stats() const noexcept {
    sync_stats s = stats_;
    s.collectives = 0;
    s.nonfinite_buckets = 0;
    s.bytes_sent = 0;
    s.dense_bytes = 0;
    s.gather_seconds = s.allreduce_seconds = s.scatter_seconds = 0;
    for (const auto& bk : layout_.buckets()) s.dense_bytes += bk.size * sizeof(value_type);
    return s;
  }
  // A step with a non-finite bucket leaves the step counter, like all state, as it was.
  void end_step(sync_stats s, sync_clock::time_point start) noexcept {
    if (s.nonfinite_buckets == 0) {
      ++step_;
    } else {
      ++s.nonfinite_steps;
    }
    ++s.steps;
    s.total_bytes_sent += s.bytes_sent;
    s.total_seconds += seconds_since(start);
    stats_ = s;
  }

  Comm comm_;
  param_layout layout_;
  Compactor compactor_;
  Codec codec_;
  sync_options options_;
  std::vector<bucket_strategy> strategies_;
  std::vector<Mask> masks_;
  std::vector<std::uint64_t> mask_digests_;  // of masks_, as committed
  std::vector<plan_type> plans_;
  workspace_layout workspace_;
  sync_stats stats_;
  std::uint64_t step_ = 0;

 private:
  Engine& engine() noexcept { return static_cast<Engine&>(*this); }
  const Engine& engine() const noexcept { return static_cast<const Engine&>(*this); }
};

}  // namespace pactrain::detail
