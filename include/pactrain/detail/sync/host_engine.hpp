// The host engine's bucket pipeline under the public facade (pactrain/sync.hpp):
//   prepare   the bucket's codec input: its gathered payload (sparse) or its dense region,
//             pruned entries zeroed for a coded dense bucket; its local scale;
//   send      encode (coded buckets; error feedback adds and keeps the residual here) and
//             start the allreduce;
//   complete  wait in order of submission, decode, expand (+0 at pruned entries, 1/P folded
//             in where no decode did it).
// Plain buckets (the identity codec, and the plain strategies of any codec) skip encode and
// decode: the payload itself is summed.
#pragma once

#include <pactrain/codec.hpp>
#include <pactrain/communicator.hpp>
#include <pactrain/compactor.hpp>
#include <pactrain/detail/agreement.hpp>
#include <pactrain/detail/sync/core.hpp>
#include <pactrain/detail/sync/host_step.hpp>
#include <pactrain/detail/sync/phase_timer.hpp>
#include <pactrain/detail/sync/scale_exchange.hpp>
#include <pactrain/detail/sync/state_format.hpp>
#include <pactrain/digest.hpp>
#include <pactrain/error.hpp>
#include <pactrain/feedback.hpp>
#include <pactrain/memory.hpp>

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace pactrain::detail {

template <gradient_mask Mask, class Compactor, communicator Comm, class Codec, class Feedback>
class host_engine : public sync_core<host_engine<Mask, Compactor, Comm, Codec, Feedback>, Mask,
                                     Compactor, Comm, Codec, Feedback> {
  using core = sync_core<host_engine, Mask, Compactor, Comm, Codec, Feedback>;
  friend core;

  static_assert(bucket_codec<Codec>,
                "pactrain::sync: Codec must provide wire_size, validate, encode, decode and "
                "decode_local (the bucket_codec concept)");
  static_assert(Compactor::memory == memory_space::host,
                "pactrain::sync: this version synchronises host buffers (host_compactor)");
  static_assert(
      requires(Comm & c, std::span<typename Codec::wire_type> w, std::span<std::uint64_t> u) {
        { c.allreduce_async(w, reduce_op::sum) } -> std::same_as<typename Comm::request_type>;
        { c.allreduce_async(u, reduce_op::max) } -> std::same_as<typename Comm::request_type>;
      },
      "pactrain::sync: the communicator cannot sum the codec's wire_type (it needs "
      "allreduce_async of wire_type spans with reduce_op::sum, and of uint64 with max)");

 public:
  using typename core::plan_type;
  using typename core::value_type;
  using typename core::wire_type;
  using request_type = typename Comm::request_type;

  static constexpr bool plain_supported = requires(Comm & c, std::span<value_type> v) {
    { c.allreduce_async(v, reduce_op::sum) } -> std::same_as<request_type>;
  };

 protected:
  using core::coded;
  using core::feedback;
  using core::is_identity;
  using core::plain;

  host_engine(Comm comm, param_layout layout, Compactor compactor, sync_options opt, Codec codec)
      : core(std::move(comm), std::move(layout), std::move(compactor), opt, std::move(codec)) {
    this->commit_full("sync");
  }

  // --- the step ---

  template <class Views>
  void begin(Views views, const char* op) {
    current_.set_views(this->layout_, views, op);
    current_.begin(this->layout_, this->strategies_, this->begin_stats());
    scales_.open_step(this->codec_, this->layout_.buckets().size());
  }

  void submit(std::size_t b) {
    current_.check_open("submit_bucket");
    this->check_bucket(b, "submit_bucket");
    PACTRAIN_EXPECTS(!current_.submitted(b), "sync::submit_bucket: bucket " + std::to_string(b) +
                                                 " was already submitted in this step");
    guarded([&] {
      send_scaled();
      prepare(b);
      if (needs_scale(b)) {
        scales_.start(this->comm_, current_.stats(), b);
      } else {
        send(b);
      }
    });
  }

  void finish() {
    current_.check_open("finish_step");
    guarded([&] {
      send_scaled();
      // A bucket that needs no scale of this step is sent as soon as it is prepared, so its
      // allreduce moves while the next one is compacted; the others wait for one round.
      auto& due = scales_.due();
      due.clear();
      for (std::size_t b = 0; b < current_.buckets(); ++b) {
        if (current_.submitted(b)) continue;
        prepare(b);
        if (needs_scale(b)) {
          due.push_back(b);
        } else {
          send(b);
        }
      }
      if (!due.empty()) scales_.reduce_due(this->comm_, current_.stats());
      for (const auto b : due) send(b);
      complete();
    });
  }

  // --- state across a resume ---

  [[nodiscard]] std::vector<std::byte> save() const {
    current_.check_closed("save_state");
    return state_format<value_type>::write(fit_digest(), this->step_, scales_.ready(), residual_,
                                           scales_.previous());
  }

  void load(std::span<const std::byte> in) {
    engine_state<value_type> st;
    agreement_input a;
    a.layout = &this->layout_;
    a.operation = "load_state";
    a.config_name = "strategies, step counters or scales";
    try {
      current_.check_closed("load_state");
      st = state_format<value_type>::read(in, fit_digest(), residual_.size(),
                                          scales_.previous().size());
    } catch (const std::exception& e) {  // bad_alloc too: never leave the peers waiting
      a.local_error = e.what();
    }
    digest_builder cd(0x73746174);  // "stat": what must agree across ranks
    for (const auto s : this->strategies_) cd.add(s.code());
    cd.add(st.step).add(std::uint64_t{st.scales_ready});
    for (const float f : st.scales) cd.add(std::uint64_t{std::bit_cast<std::uint32_t>(f)});
    a.config_digest = cd.value();
    a.codec_digest = this->codec_digest();
    a.mask_digests = this->mask_digests_;
    agree(this->comm_, a);
    this->step_ = st.step;
    residual_ = std::move(st.residuals);
    scales_.restore(std::move(st.scales), st.scales_ready);
  }

  [[nodiscard]] std::span<const value_type> residuals() const noexcept { return residual_; }
  [[nodiscard]] bool step_open() const noexcept { return current_.open(); }

 private:
  // --- commit hooks (see core.hpp) ---

  void check_commit(const char* op) const { current_.check_closed(op); }
  void check_strategy(bucket_strategy st) const {
    PACTRAIN_EXPECTS(plain_supported || is_identity || !is_plain(st),
                     std::string("strategy ") + to_string(st) +
                         " needs a communicator that can sum the codec's value_type");
  }
  plan_type build_plan(const Mask& m) const { return this->compactor_.make_plan(m); }
  // Residuals restart at zero, and the previous step's scales no longer describe the buckets.
  void install_workspace(const workspace_layout& w) {
    huge_vector<value_type> payload(w.payload_size(), value_type(0));
    huge_vector<wire_type> wire;
    huge_vector<value_type> residual;
    if constexpr (!is_identity) {
      wire.assign(w.wire_size(), wire_type{});
      if constexpr (feedback) residual.assign(w.codec_input_size(), value_type(0));
    }
    payload_ = std::move(payload);
    wire_ = std::move(wire);
    residual_ = std::move(residual);
    if constexpr (!is_identity) scales_.reset(w.buckets());
  }

  // What the saved state must have been saved with: layout, masks, strategies, codec
  // settings and rank count.
  [[nodiscard]] std::uint64_t fit_digest() const {
    digest_builder d(0x66697473);  // "fits"
    d.add(this->layout_.digest()).add(static_cast<std::uint64_t>(this->comm_.size()));
    d.add(this->mask_digests_);
    for (const auto s : this->strategies_) d.add(s.code());
    if constexpr (requires { this->codec_.digest(); }) d.add(this->codec_.digest());
    return d.value();
  }

  // A failure inside a step (a communication error, an allocation) abandons the step, so the
  // engine can begin another; what was already written to the buffer stays.
  template <class F>
  void guarded(F&& f) {
    try {
      f();
    } catch (...) {
      current_.close();
      scales_.abandon();
      throw;
    }
  }

  [[nodiscard]] bool needs_scale(std::size_t b) const {
    return scales_.needs_round(coded(b), current_.region(b).empty());
  }

  std::span<value_type> tensor_payload(std::size_t i) {
    return std::span<value_type>(payload_).subspan(this->workspace_.tensor_payload[i],
                                                   this->plans_[i].count());
  }
  std::span<wire_type> wire_of(std::size_t b) {
    return std::span<wire_type>(wire_).subspan(this->workspace_.wire[b],
                                               this->workspace_.wire_of(b));
  }
  codec_context context(std::size_t b) const noexcept {
    return codec_context{.rank = this->comm_.rank(),
                         .size = this->comm_.size(),
                         .step = this->step_,
                         .bucket = b,
                         .scale = scales_.scale(b)};
  }

  // The payload of sparse bucket b, gathered from the tensors.
  std::span<value_type> gather_bucket(std::size_t b) {
    const auto& bk = this->layout_.buckets()[b];
    for (std::size_t i = bk.first_tensor; i < bk.first_tensor + bk.tensor_count; ++i) {
      this->compactor_.gather(this->plans_[i], std::span<const value_type>(current_.view(i)),
                              tensor_payload(i));
    }
    return std::span<value_type>(payload_).subspan(this->workspace_.bucket_payload[b],
                                                   this->workspace_.payload_of(b));
  }

  // The dense strategies' region of bucket b: the caller's buffer when the bucket's tensors
  // lie back to back, else a copy in the bucket's stretch of the dense workspace.
  std::span<value_type> dense_region(std::size_t b) {
    const auto& bk = this->layout_.buckets()[b];
    if (bk.size == 0) return {};
    auto region = current_.dense_workspace(b, bk.size);
    if (region.empty())
      return std::span<value_type>(current_.view(bk.first_tensor).data(), bk.size);
    std::size_t at = 0;
    for (std::size_t i = bk.first_tensor; i < bk.first_tensor + bk.tensor_count; ++i) {
      const auto v = current_.view(i);
      std::copy(v.begin(), v.end(), region.begin() + static_cast<std::ptrdiff_t>(at));
      at += v.size();
    }
    return region;
  }

  // First half of a submission: the bucket's codec input. A coded dense bucket has its
  // pruned entries zeroed, so they sway neither the scale nor the residuals. The scale comes
  // from the fresh gradient: a residual that counted would feed the scale and, through the
  // noise of a larger scale, itself; what exceeds it clips into the residual.
  void prepare(std::size_t b) {
    phase_timer t(current_.stats().gather_seconds);
    const bool sparse = is_sparse(this->strategies_[b]);
    std::span<value_type> region = sparse ? gather_bucket(b) : dense_region(b);
    if (coded(b)) {
      if (!sparse) zero_pruned(b, region);
      scales_.note_local(this->codec_, b, std::span<const value_type>(region));
    }
    current_.mark_submitted(b, region);
  }

  void zero_pruned(std::size_t b, std::span<value_type> region) {
    const auto& bk = this->layout_.buckets()[b];
    std::size_t at = 0;
    for (std::size_t i = bk.first_tensor; i < bk.first_tensor + bk.tensor_count; ++i) {
      const auto& plan = this->plans_[i];
      if (plan.count() != plan.size()) {
        auto part = region.subspan(at, plan.size());
        this->compactor_.gather(plan, std::span<const value_type>(part), tensor_payload(i));
        this->compactor_.scatter(plan, std::span<const value_type>(tensor_payload(i)), part,
                                 value_type(1));
      }
      at += plan.size();
    }
  }

  // Completes submit_bucket's scale rounds and sends those buckets.
  void send_scaled() {
    scales_.complete_started(current_.stats(), [&](std::size_t b) { send(b); });
  }

  // Second half of a submission: encode (coded buckets), keep what did not get through
  // (error feedback), start the allreduce. An empty region sends nothing: region sizes
  // follow the agreed masks, so every rank skips the same buckets.
  void send(std::size_t b) {
    current_.started(b);
    const auto region = current_.region(b);
    if (region.empty()) return;
    auto& s = current_.stats();
    if (plain(b)) {
      if constexpr (is_identity || plain_supported) {
        phase_timer t(s.allreduce_seconds);
        current_.request(b) = this->comm_.allreduce_async(region, reduce_op::sum);
        s.bytes_sent += region.size_bytes();
      }
    } else {
      const auto wire = wire_of(b);
      {
        phase_timer t(s.gather_seconds);
        const codec_context ctx = context(b);
        if constexpr (feedback) {  // the residual is added here, in the codec's pass if it can
          encode_with_feedback(this->codec_, region, wire,
                               std::span<value_type>(residual_).subspan(
                                   this->workspace_.codec_input[b], region.size()),
                               ctx);
        } else {
          this->codec_.encode(std::span<const value_type>(region), wire, ctx);
        }
      }
      phase_timer t(s.allreduce_seconds);
      current_.request(b) = this->comm_.allreduce_async(wire, reduce_op::sum);
      s.bytes_sent += wire.size_bytes();
    }
    ++s.collectives;
    current_.progress(0);
  }

  // Waits for the buckets in submission order and writes them back; reduces next step's
  // scales alongside (previous_max); closes the step.
  void complete() {
    auto& s = current_.stats();
    const value_type inv_p = value_type(1) / static_cast<value_type>(this->comm_.size());
    // The same on every rank: input sizes follow the agreed masks.
    scales_.start_next(this->comm_, s, this->workspace_.codec_input_size() != 0);
    const auto& order = current_.order();
    for (std::size_t k = 0; k < order.size(); ++k) {
      const std::size_t b = order[k];
      {
        phase_timer t(s.allreduce_seconds);
        current_.request(b).wait();
        current_.progress(k + 1);
      }
      phase_timer t(s.scatter_seconds);
      if (plain(b)) {
        expand_bucket(b, inv_p);
      } else {
        if (!current_.region(b).empty()) {
          this->codec_.decode(std::span<const wire_type>(wire_of(b)), current_.region(b),
                              context(b));
        }
        expand_bucket(b, value_type(1));  // decode gave the mean
      }
    }
    scales_.finish_next(this->codec_, s);
    current_.close();
    this->end_step(s, current_.start());
  }

  // Writes the reduced bucket b back to the tensors, times scale, +0 at pruned entries.
  void expand_bucket(std::size_t b, value_type scale) {
    const auto& bk = this->layout_.buckets()[b];
    const auto region = current_.region(b);
    std::size_t at = 0;
    for (std::size_t i = bk.first_tensor; i < bk.first_tensor + bk.tensor_count; ++i) {
      const auto dst = current_.view(i);
      if (is_sparse(this->strategies_[b])) {
        this->compactor_.scatter(this->plans_[i], std::span<const value_type>(tensor_payload(i)),
                                 dst, scale);
      } else {
        expand_dense(i, region.subspan(at, dst.size()), dst, scale);
      }
      at += dst.size();
    }
  }

  // dst = scale * src at kept entries, +0 elsewhere; src is the reduced dense tensor (it may
  // be dst itself).
  void expand_dense(std::size_t i, std::span<value_type> src, std::span<value_type> dst,
                    value_type scale) {
    const auto& plan = this->plans_[i];
    if (plan.count() == plan.size()) {
      if (scale == value_type(1) && src.data() == dst.data()) return;  // already in place
      for (std::size_t k = 0; k < dst.size(); ++k) dst[k] = src[k] * scale;
      return;
    }
    this->compactor_.gather(plan, std::span<const value_type>(src), tensor_payload(i));
    this->compactor_.scatter(plan, std::span<const value_type>(tensor_payload(i)), dst, scale);
  }

  huge_vector<value_type> payload_;   // workspaces on huge pages: streamed every step
  huge_vector<wire_type> wire_;       // coded buckets' wire elements
  huge_vector<value_type> residual_;  // error_feedback: one per codec input entry
  scale_exchange<Codec, Comm> scales_;
  host_step<value_type, request_type> current_;  // the open step
};

}  // namespace pactrain::detail
