// pactrain::sync — the engine: averages pruned gradients across ranks, sending only kept
// entries.
//
//   using sync_t = pactrain::sync<pactrain::bitmap_mask, pactrain::host_compactor,
//                                 pactrain::mpi_communicator>;
//   sync_t sync{pactrain::mpi_communicator{MPI_COMM_WORLD}, layout};   // collective
//   sync.set_masks(masks);      // collective; checked across ranks
//   sync.allreduce(grads);      // averaged; pruned entries come back as +0
//
// With a codec (fp16_codec, bf16_codec, ternary_codec) and optionally error_feedback:
//   pactrain::sync<pactrain::bitmap_mask, pactrain::host_compactor, pactrain::mpi_communicator,
//                  pactrain::ternary_codec, pactrain::error_feedback>
//       sync{pactrain::mpi_communicator{MPI_COMM_WORLD}, layout, {}, {},
//            pactrain::ternary_codec{{.seed = 1}}};
#pragma once

#include <pactrain/codec.hpp>
#include <pactrain/communicator.hpp>
#include <pactrain/compactor.hpp>
#include <pactrain/detail/agreement.hpp>
#include <pactrain/error.hpp>
#include <pactrain/layout.hpp>
#include <pactrain/mask.hpp>
#include <pactrain/memory.hpp>
#include <pactrain/serialize.hpp>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace pactrain {

/// How a bucket is synchronised. With the identity codec the four give the same result.
///   sparse        gather the kept entries, encode them with the engine's codec, allreduce,
///                 decode and scatter;
///   dense         the whole bucket, pruned entries zeroed, encoded with the codec;
///   sparse_plain  the kept entries as value_type, no codec: exact, and no encoding work;
///   dense_plain   a plain allreduce of the whole bucket, then pruned entries zeroed.
/// With the identity codec, sparse and sparse_plain are the same path, as are dense and
/// dense_plain. The plain strategies let an engine with a codec leave some buckets uncoded
/// (small ones, or where the link is fast enough that encoding costs more than it saves).
enum class bucket_strategy : std::uint8_t { sparse, dense, sparse_plain, dense_plain };

inline const char* to_string(bucket_strategy s) noexcept {
  switch (s) {
    case bucket_strategy::sparse: return "sparse";
    case bucket_strategy::dense: return "dense";
    case bucket_strategy::sparse_plain: return "sparse_plain";
    case bucket_strategy::dense_plain: return "dense_plain";
  }
  return "unknown";
}

/// True for the strategies that send only the kept entries.
constexpr bool is_sparse(bucket_strategy s) noexcept {
  return s == bucket_strategy::sparse || s == bucket_strategy::sparse_plain;
}

/// True for the strategies that bypass the codec.
constexpr bool is_plain(bucket_strategy s) noexcept {
  return s == bucket_strategy::sparse_plain || s == bucket_strategy::dense_plain;
}

struct sync_options {
  /// The strategy of every bucket until set_strategies changes it.
  bucket_strategy strategy = bucket_strategy::sparse;
};

/// What the last allreduce() did on this rank, and totals since construction.
struct sync_stats {
  std::uint64_t steps = 0;       // allreduce() calls completed
  std::size_t collectives = 0;   // last step: allreduce collectives issued (scale rounds too)
  std::size_t bytes_sent = 0;    // last step: wire bytes handed to the allreduces (scales too)
  std::size_t dense_bytes = 0;   // last step: bytes a dense allreduce would hand over
  double gather_seconds = 0;     // last step: compaction into payloads (and packing)
  double allreduce_seconds = 0;  // last step: starting and waiting for the collectives
  double scatter_seconds = 0;    // last step: expansion, scaling and masking
  std::uint64_t total_bytes_sent = 0;
  double total_seconds = 0;
};

/// The sync engine over a param_layout. Template parameters are the mask representation,
/// the compactor, the communicator, the codec (its value_type is the gradient type) and the
/// feedback policy (no_feedback or error_feedback, see codec.hpp).
///
/// Per bucket and step: gather the kept entries (sparse) or take the whole bucket with pruned
/// entries zeroed (dense), add the residual (error_feedback), encode into wire elements,
/// allreduce them with SUM, decode the mean and scatter it. The identity codec, and the
/// plain strategies of any codec, skip encode and decode: the payload itself is summed and
/// 1/P is folded into the scatter.
///
/// A step is either one call, allreduce(grads), or three phases for a trainer that overlaps
/// the sync with its backward pass: begin_step(grads), then submit_bucket(b) as soon as
/// bucket b's gradients are final (its collective starts at once), then finish_step(), which
/// submits what was not submitted, waits and writes the averages back.
///
/// Collective calls (constructor, set_masks, set_strategies, allreduce, submit_bucket,
/// finish_step) must be made by all ranks in the same order, buckets submitted in the same
/// order. Input errors found before any communication throw pactrain::error and change
/// nothing; set_masks and set_strategies include every rank's verdict in their collective,
/// so all ranks throw together. The step calls check their arguments locally and add no
/// round to the step: when one rank rejects a call, the other ranks wait in their
/// collective, so the caller must then stop the job (e.g. MPI_Abort). Pass buffers of
/// layout().total_size() entries on every rank.
template <gradient_mask Mask, class Compactor, communicator Comm,
          class Codec = identity_codec<float>, class Feedback = no_feedback>
class sync {
  static_assert(gradient_codec<Codec>,
                "pactrain::sync: Codec must model gradient_codec (value_type, wire_type, "
                "codec_traits)");
  static_assert(codec_traits<Codec>::is_linear,
                "pactrain::sync: a compacted allreduce sums encoded payloads, which is correct "
                "only for codecs that are linear under summation (codec_traits<Codec>::is_linear)");
  static_assert(bucket_codec<Codec>,
                "pactrain::sync: Codec must provide wire_size, validate, encode, decode and "
                "decode_local (the bucket_codec concept)");
  static_assert(feedback_policy<Feedback>,
                "pactrain::sync: Feedback must be no_feedback or error_feedback (feedback_policy)");
  static_assert(compactor_for<Compactor, Mask, typename Codec::value_type>,
                "pactrain::sync: Compactor must model compactor_for<Compactor, Mask, value_type>");
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
  using mask_type = Mask;
  using compactor_type = Compactor;
  using communicator_type = Comm;
  using codec_type = Codec;
  using feedback_type = Feedback;
  using value_type = typename Codec::value_type;
  using wire_type = typename Codec::wire_type;
  using plan_type = typename Compactor::plan_type;

  /// True when the communicator can sum value_type, so the plain strategies are available.
  static constexpr bool plain_supported = requires(Comm & c, std::span<value_type> v) {
    { c.allreduce_async(v, reduce_op::sum) } -> std::same_as<typename Comm::request_type>;
  };

  /// Collective: checks that all ranks hold the same layout and codec settings, that the
  /// codec suits this many ranks (e.g. ternary lanes that cannot carry), and starts with
  /// every entry kept (masks of Mask::full).
  sync(Comm comm, param_layout layout, Compactor compactor = {}, sync_options opt = {},
       Codec codec = {})
      : comm_(std::move(comm)),
        layout_(std::move(layout)),
        compactor_(std::move(compactor)),
        codec_(std::move(codec)),
        strategies_(layout_.buckets().size(), opt.strategy) {
    std::vector<Mask> full;
    full.reserve(layout_.tensor_count());
    for (const auto& t : layout_.tensors()) full.push_back(Mask::full(t.size));
    commit(std::move(full), strategies_, "sync");
  }

  /// Collective: replaces the masks (one per tensor, in layout order) after checking that
  /// every rank gives the same ones; rebuilds the compaction plans. On any disagreement or
  /// bad input on any rank, every rank throws the same pactrain::error naming the first
  /// mismatching tensor, and the previous masks stay in force.
  void set_masks(std::vector<Mask> masks) { commit(std::move(masks), strategies_, "set_masks"); }

  /// Collective: the counterpart of set_masks for a rank that could not produce its masks
  /// (e.g. a pruning policy failed). The other ranks call set_masks as usual; every rank
  /// then throws the same pactrain::error naming this rank and `reason`, and the previous
  /// masks stay in force. Always throws.
  [[noreturn]] void reject_masks(std::string reason) {
    if (reason.empty()) reason = "no reason given";
    commit_rejected(std::move(reason), "set_masks");
  }

  /// Collective: sets the strategy of every bucket (one per bucket), checked across ranks.
  void set_strategies(std::vector<bucket_strategy> s) {
    commit(masks_, std::move(s), "set_strategies");
  }

  /// Averages `grads` (the flat buffer of all tensors, layout.total_size() entries) across
  /// ranks in place; pruned entries come back as +0.
  void allreduce(std::span<value_type> grads) {
    begin_flat(grads, "allreduce");
    finish_step();
  }

  /// As above for a pointer and a size.
  void allreduce(value_type* data, std::size_t n) {
    PACTRAIN_EXPECTS(data != nullptr || n == 0,
                     "sync::allreduce: null buffer with " + std::to_string(n) + " entries");
    allreduce(std::span<value_type>(data, n));
  }

  /// Averages tensors held in separate buffers: one span per tensor, in layout order.
  void allreduce(std::span<const std::span<value_type>> tensors) {
    begin_tensors(tensors, "allreduce");
    finish_step();
  }

  /// Opens a step over `grads` (layout.total_size() entries). Nothing is sent yet; the
  /// buffer must stay alive, and each bucket's entries untouched from its submission until
  /// finish_step returns. Local: no communication.
  void begin_step(std::span<value_type> grads) { begin_flat(grads, "begin_step"); }

  /// Opens a step over tensors held in separate buffers (one span per tensor, in layout
  /// order; the spans are copied, the buffers must stay alive until finish_step).
  void begin_step(std::span<const std::span<value_type>> tensors) {
    begin_tensors(tensors, "begin_step");
  }

  /// Collective: bucket `b`'s gradients are final; compacts and encodes them and starts its
  /// allreduce, which then proceeds while the caller computes the next bucket's gradients.
  /// Every rank must submit the same buckets in the same order. A codec whose scale comes
  /// from this step (scale_source::current_max) first reduces this bucket's scale, in a small
  /// nonblocking allreduce that proceeds while the caller computes; the bucket is encoded and
  /// its allreduce started at the next submit_bucket or finish_step. previous_max needs no
  /// scale round after the first step.
  void submit_bucket(std::size_t b) {
    check_open("submit_bucket");
    PACTRAIN_EXPECTS(b < layout_.buckets().size(), "sync::submit_bucket: bucket " +
                                                       std::to_string(b) + " of " +
                                                       std::to_string(layout_.buckets().size()));
    PACTRAIN_EXPECTS(!submitted_[b], "sync::submit_bucket: bucket " + std::to_string(b) +
                                         " was already submitted in this step");
    guarded([&] {
      send_scaled();
      prepare(b);
      if constexpr (Codec::uses_scale) {
        if (needs_scale_now(b)) {
          start_scale(b);
          return;
        }
      }
      send(b);
    });
  }

  /// Collective: submits, in layout order, every bucket not yet submitted, waits for all
  /// collectives and writes the averages back (pruned entries +0). Closes the step.
  void finish_step() {
    check_open("finish_step");
    guarded([&] {
      send_scaled();
      // A bucket that needs no scale of this step is sent as soon as it is prepared, so its
      // allreduce moves while the next one is compacted. The others wait for one MAX round
      // over all their scales. scale_due_ is reused: no allocation on the hot path.
      auto& due = scale_due_;
      due.clear();
      for (std::size_t b = 0; b < submitted_.size(); ++b) {
        if (submitted_[b]) continue;
        prepare(b);
        if (needs_scale_now(b)) {
          due.push_back(b);
        } else {
          send(b);
        }
      }
      if (!due.empty()) reduce_scales(due);
      for (auto b : due) send(b);
      complete();
    });
  }

  /// True between begin_step and the end of finish_step.
  [[nodiscard]] bool step_open() const noexcept { return open_; }

  [[nodiscard]] const param_layout& layout() const noexcept { return layout_; }
  [[nodiscard]] const std::vector<Mask>& masks() const noexcept { return masks_; }
  [[nodiscard]] const plan_type& plan(std::size_t tensor) const { return plans_.at(tensor); }
  [[nodiscard]] const std::vector<bucket_strategy>& strategies() const noexcept {
    return strategies_;
  }
  /// Payload entries sent for bucket b under a sparse strategy.
  [[nodiscard]] std::size_t payload_size(std::size_t b) const { return bucket_payload_.at(b); }
  /// Elements bucket b sends per step under its current strategy: wire elements of the
  /// codec, or value_type entries for the identity codec and the plain strategies.
  [[nodiscard]] std::size_t wire_size(std::size_t b) const {
    if (plain(b)) return is_sparse(strategies_.at(b)) ? payload_size(b) : layout_.buckets()[b].size;
    return codec_.wire_size(input_size(b), comm_.size());
  }
  /// Bytes bucket b sends per step under strategy s (what the planner weighs).
  [[nodiscard]] std::size_t wire_bytes(std::size_t b, bucket_strategy s) const {
    const std::size_t n = is_sparse(s) ? payload_size(b) : layout_.buckets().at(b).size;
    if (is_identity || is_plain(s)) return n * sizeof(value_type);
    return codec_.wire_size(n, comm_.size()) * sizeof(wire_type);
  }
  [[nodiscard]] const Codec& codec() const noexcept { return codec_; }
  /// The step counter the codec's random numbers use: steps begun since construction, or
  /// since set_step. Restore it on resume for a bit-identical continuation.
  [[nodiscard]] std::uint64_t step() const noexcept { return step_; }
  void set_step(std::uint64_t s) noexcept { step_ = s; }
  /// error_feedback: the residuals, codec input entries of bucket 0, 1, ... in order (empty
  /// otherwise; plain buckets have none).
  [[nodiscard]] std::span<const value_type> residuals() const noexcept { return residual_; }

  /// What a resumed run needs to continue bit-identically besides masks and strategies: the
  /// step counter, error feedback's residuals and previous_max's last scales. Local: every
  /// rank saves its own (residuals differ across ranks). Format, integers little-endian:
  ///   "PTRNSYNC", version (u32), bytes per value (u32), fit digest (u64: layout, masks,
  ///   strategies, codec settings and rank count), step (u64), flags (u64, bit 0: the
  ///   scales are valid), residual count r (u64), scale count s (u64), r values, s floats
  ///   (u32 bits), checksum (u64) of everything before it.
  [[nodiscard]] std::vector<std::byte> save_state() const {
    check_closed("save_state");
    std::vector<std::byte> out;
    for (char c : std::string_view(state_magic)) out.push_back(static_cast<std::byte>(c));
    detail::put_u32(out, state_format_version);
    detail::put_u32(out, sizeof(value_type));
    detail::put_u64(out, fit_digest());
    detail::put_u64(out, step_);
    detail::put_u64(out, scale_ready_ ? 1 : 0);
    detail::put_u64(out, residual_.size());
    detail::put_u64(out, scale_.size());
    for (const value_type r : residual_) put_value(out, r);
    for (const float f : scale_) detail::put_u32(out, std::bit_cast<std::uint32_t>(f));
    detail::put_u64(out, detail::checksum(out));
    return out;
  }

  /// Collective: restores what save_state() wrote on this rank, into an engine with the same
  /// layout, masks, strategies, codec settings and rank count. Bytes that are corrupt or do
  /// not fit on any rank, or step counters or scales that differ across ranks, make every
  /// rank throw the same pactrain::error, and nothing changes. Call it after set_masks and
  /// set_strategies, which reset the state.
  void load_state(std::span<const std::byte> in) {
    std::uint64_t step = 0;
    bool ready = false;
    huge_vector<value_type> residual;
    std::vector<float> scale;
    detail::agreement_input a;
    a.layout = &layout_;
    a.operation = "load_state";
    a.config_name = "strategies, step counters or scales";
    try {
      check_closed("load_state");
      parse_state(in, step, ready, residual, scale);
    } catch (const std::exception& e) {  // bad_alloc too: never leave the peers waiting
      a.local_error = e.what();
    }
    digest_builder cd(0x73746174);  // "stat": what must agree across ranks
    for (auto st : strategies_) cd.add(static_cast<std::uint64_t>(st));
    cd.add(step).add(std::uint64_t{ready});
    for (const float f : scale) cd.add(std::uint64_t{std::bit_cast<std::uint32_t>(f)});
    a.config_digest = cd.value();
    if constexpr (requires { codec_.digest(); }) a.codec_digest = codec_.digest();
    a.mask_digests = mask_digests_;
    detail::agree(comm_, a);
    step_ = step;
    residual_ = std::move(residual);
    scale_ = std::move(scale);
    scale_ready_ = ready;
  }

  [[nodiscard]] const sync_stats& stats() const noexcept { return stats_; }
  [[nodiscard]] Comm& get_communicator() noexcept { return comm_; }
  [[nodiscard]] const Compactor& compactor() const noexcept { return compactor_; }

 private:
  using clock = std::chrono::steady_clock;
  using request_type = typename Comm::request_type;

  static constexpr bool is_identity = codec_traits<Codec>::is_identity;
  static constexpr bool feedback = Feedback::enabled && !is_identity;

  static double seconds_since(clock::time_point t0) {
    return std::chrono::duration<double>(clock::now() - t0).count();
  }

  void check_closed(const char* op) const {
    PACTRAIN_EXPECTS(!open_, std::string("sync::") + op +
                                 ": a step is open (begun and not finished); finish it first");
  }
  void check_open(const char* op) const {
    PACTRAIN_EXPECTS(open_, std::string("sync::") + op + ": no step is open (call begin_step)");
  }

  // A failure inside a step (a communication error, an allocation) abandons the step, so the
  // engine can begin another; what was already written to the buffer stays.
  template <class F>
  void guarded(F&& f) {
    try {
      f();
    } catch (...) {
      open_ = false;
      requests_.clear();
      scale_pending_.clear();
      scale_requests_.clear();
      throw;
    }
  }

  // Bucket b bypasses the codec.
  [[nodiscard]] bool plain(std::size_t b) const {
    return is_identity || is_plain(strategies_.at(b));
  }
  [[nodiscard]] bool coded(std::size_t b) const { return !plain(b); }
  // A prepared bucket whose encoding waits for a MAX round of this step's scales.
  [[nodiscard]] bool needs_scale_now(std::size_t b) const {
    return Codec::uses_scale && !reuse_scale_ && coded(b) && !regions_[b].empty();
  }

  [[noreturn]] void commit_rejected(std::string reason, const char* op) {
    detail::agreement_input in;
    in.layout = &layout_;
    in.operation = op;
    in.local_error = std::move(reason);
    detail::agree(comm_, in);
    PACTRAIN_FAIL(std::string(op) + ": rejected");  // not reached: agree throws
  }

  void commit(std::vector<Mask> masks, std::vector<bucket_strategy> strategies, const char* op) {
    detail::agreement_input in;
    in.layout = &layout_;
    in.operation = op;
    std::vector<std::uint64_t> digests;
    std::vector<plan_type> plans;
    try {
      check_closed(op);
      detail::check_commit_sizes(layout_, masks, strategies.size());
      for (auto st : strategies) {
        PACTRAIN_EXPECTS(static_cast<unsigned>(st) <= 3u,
                         "bucket strategy " + std::to_string(static_cast<unsigned>(st)) +
                             " is not one of sparse, dense, sparse_plain, dense_plain");
        PACTRAIN_EXPECTS(plain_supported || is_identity || !is_plain(st),
                         std::string("strategy ") + to_string(st) +
                             " needs a communicator that can sum the codec's value_type");
      }
      digests.reserve(masks.size());
      plans.reserve(masks.size());
      for (const auto& m : masks) {
        digests.push_back(m.digest());
        plans.push_back(compactor_.make_plan(m));
      }
      codec_.validate(comm_.size());
    } catch (const std::exception& e) {  // bad_alloc too: never leave the peers waiting
      in.local_error = e.what();
    }
    digest_builder cd(0x73747261);  // "stra"
    for (auto s : strategies) cd.add(static_cast<std::uint64_t>(s));
    in.config_digest = cd.value();
    if constexpr (requires { codec_.digest(); }) in.codec_digest = codec_.digest();
    in.mask_digests = digests;
    detail::agree(comm_, in);

    // Everyone agrees: commit.
    const std::size_t nb = layout_.buckets().size();
    std::vector<std::size_t> offset(masks.size());
    std::vector<std::size_t> per_bucket(nb, 0);
    std::size_t total = 0;
    bucket_start_.resize(nb);
    for (std::size_t b = 0; b < nb; ++b) {
      const auto& bk = layout_.buckets()[b];
      bucket_start_[b] = total;
      for (std::size_t i = bk.first_tensor; i < bk.first_tensor + bk.tensor_count; ++i) {
        offset[i] = total;
        total += plans[i].count();
        per_bucket[b] += plans[i].count();
      }
    }
    payload_.assign(total, value_type(0));
    masks_ = std::move(masks);
    mask_digests_ = std::move(digests);
    plans_ = std::move(plans);
    strategies_ = std::move(strategies);
    tensor_payload_offset_ = std::move(offset);
    bucket_payload_ = std::move(per_bucket);
    if constexpr (!is_identity) {
      // Codec inputs and wire elements, bucket by bucket; residuals restart at zero and
      // the previous step's scales no longer describe the buckets.
      input_offset_.assign(nb + 1, 0);
      wire_offset_.assign(nb + 1, 0);
      for (std::size_t b = 0; b < nb; ++b) {
        const std::size_t n = input_size(b);
        input_offset_[b + 1] = input_offset_[b] + n;
        wire_offset_[b + 1] = wire_offset_[b] + (n == 0 ? 0 : codec_.wire_size(n, comm_.size()));
      }
      wire_.assign(wire_offset_[nb], wire_type{});
      if constexpr (feedback) residual_.assign(input_offset_[nb], value_type(0));
      local_max_.assign(nb, 0);
      scale_.assign(nb, 0.0f);
      scale_used_.assign(nb, 0.0f);
      scale_ready_ = false;
    }
  }

  // --- save_state and load_state ---
  static constexpr char state_magic[9] = "PTRNSYNC";
  static constexpr std::uint32_t state_format_version = 1;
  static constexpr std::size_t state_header_bytes = 56;
  static_assert(sizeof(value_type) == 2 || sizeof(value_type) == 4 || sizeof(value_type) == 8,
                "pactrain::sync: save_state stores values of 2, 4 or 8 bytes");
  using value_bits = std::conditional_t<
      sizeof(value_type) == 2, std::uint16_t,
      std::conditional_t<sizeof(value_type) == 4, std::uint32_t, std::uint64_t>>;

  static void put_value(std::vector<std::byte>& out, value_type v) {
    const auto bits = std::bit_cast<value_bits>(v);
    for (std::size_t k = 0; k < sizeof(v); ++k) {
      out.push_back(static_cast<std::byte>((bits >> (8 * k)) & 0xff));
    }
  }
  static value_type get_value(std::span<const std::byte> in, std::size_t at) {
    value_bits bits = 0;
    for (std::size_t k = 0; k < sizeof(value_type); ++k) {
      bits = static_cast<value_bits>(bits | static_cast<value_bits>(
                                                static_cast<value_bits>(in[at + k]) << (8 * k)));
    }
    return std::bit_cast<value_type>(bits);
  }

  // What the saved state must have been saved with: layout, masks, strategies, codec
  // settings and rank count.
  [[nodiscard]] std::uint64_t fit_digest() const {
    digest_builder d(0x66697473);  // "fits"
    d.add(layout_.digest()).add(static_cast<std::uint64_t>(comm_.size()));
    d.add(mask_digests_);
    for (auto st : strategies_) d.add(static_cast<std::uint64_t>(st));
    if constexpr (requires { codec_.digest(); }) d.add(codec_.digest());
    return d.value();
  }

  // Reads save_state's bytes; throws pactrain::error naming the first problem.
  void parse_state(std::span<const std::byte> in, std::uint64_t& step, bool& ready,
                   huge_vector<value_type>& residual, std::vector<float>& scale) const {
    const std::string what = "state rejected: ";
    PACTRAIN_EXPECTS(in.size() >= state_header_bytes + 8,
                     what + "truncated: " + std::to_string(in.size()) + " bytes");
    PACTRAIN_EXPECTS(std::memcmp(in.data(), state_magic, 8) == 0, what + "bad magic");
    const std::uint32_t version = detail::get_u32(in, 8);
    PACTRAIN_EXPECTS(version == state_format_version,
                     what + "unsupported format version " + std::to_string(version));
    const std::uint64_t r = detail::get_u64(in, 40);
    const std::uint64_t s = detail::get_u64(in, 48);
    const std::uint64_t room = (in.size() - state_header_bytes - 8);
    PACTRAIN_EXPECTS(r <= room / sizeof(value_type) && s <= room / 4 &&
                         in.size() == state_header_bytes + r * sizeof(value_type) + 4 * s + 8,
                     what + "length " + std::to_string(in.size()) + " bytes does not match " +
                         std::to_string(r) + " residuals and " + std::to_string(s) +
                         " scales (truncated or trailing bytes)");
    PACTRAIN_EXPECTS(detail::get_u64(in, in.size() - 8) == detail::checksum(in.first(in.size() - 8)),
                     what + "checksum mismatch");
    PACTRAIN_EXPECTS(detail::get_u32(in, 12) == sizeof(value_type),
                     what + "values of " + std::to_string(detail::get_u32(in, 12)) +
                         " bytes, this engine's have " + std::to_string(sizeof(value_type)));
    PACTRAIN_EXPECTS(detail::get_u64(in, 16) == fit_digest(),
                     what + "saved with other masks, strategies, codec settings, layout or "
                            "rank count than this engine has");
    PACTRAIN_EXPECTS(r == residual_.size() && s == scale_.size(),
                     what + std::to_string(r) + " residuals and " + std::to_string(s) +
                         " scales, this engine has " + std::to_string(residual_.size()) + " and " +
                         std::to_string(scale_.size()));
    const std::uint64_t flags = detail::get_u64(in, 32);
    PACTRAIN_EXPECTS(flags <= 1, what + "unknown flags " + std::to_string(flags));
    step = detail::get_u64(in, 24);
    ready = flags == 1;
    residual.resize(r);
    scale.resize(s);
    std::size_t at = state_header_bytes;
    for (auto& v : residual) {
      v = get_value(in, at);
      at += sizeof(value_type);
    }
    for (auto& f : scale) {
      f = std::bit_cast<float>(detail::get_u32(in, at));
      at += 4;
    }
  }

  // Codec input entries of bucket b: its payload (sparse), all its entries (dense), none
  // (plain strategies: they bypass the codec).
  [[nodiscard]] std::size_t input_size(std::size_t b) const {
    if (plain(b)) return 0;
    return is_sparse(strategies_.at(b)) ? bucket_payload_.at(b) : layout_.buckets().at(b).size;
  }

  // True when the bucket's tensors lie back to back in memory, so a dense allreduce can run
  // on the user's buffer in place.
  [[nodiscard]] bool contiguous(const bucket_info& bk,
                                std::span<const std::span<value_type>> t) const noexcept {
    for (std::size_t i = bk.first_tensor + 1; i < bk.first_tensor + bk.tensor_count; ++i) {
      if (t[i - 1].data() + t[i - 1].size() != t[i].data()) return false;
    }
    return true;
  }

  std::span<value_type> tensor_payload(std::size_t i) {
    return std::span<value_type>(payload_).subspan(tensor_payload_offset_[i], plans_[i].count());
  }

  std::span<wire_type> wire_of(std::size_t b) {
    return std::span<wire_type>(wire_).subspan(wire_offset_[b],
                                               wire_offset_[b + 1] - wire_offset_[b]);
  }

  void begin_flat(std::span<value_type> grads, const char* op) {
    check_closed(op);
    PACTRAIN_EXPECTS(grads.data() != nullptr || grads.empty(),
                     std::string("sync::") + op + ": null buffer");
    PACTRAIN_EXPECTS(grads.size() == layout_.total_size(),
                     std::string("sync::") + op + ": buffer has " + std::to_string(grads.size()) +
                         " entries, the layout " + std::to_string(layout_.total_size()));
    views_.clear();
    for (const auto& t : layout_.tensors()) views_.push_back(grads.subspan(t.offset, t.size));
    open_step();
  }

  void begin_tensors(std::span<const std::span<value_type>> tensors, const char* op) {
    check_closed(op);
    PACTRAIN_EXPECTS(tensors.size() == layout_.tensor_count(),
                     std::string("sync::") + op + ": " + std::to_string(tensors.size()) +
                         " tensors given, the layout has " +
                         std::to_string(layout_.tensor_count()));
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      const auto& t = layout_.tensors()[i];
      PACTRAIN_EXPECTS(tensors[i].data() != nullptr || tensors[i].empty(),
                       std::string("sync::") + op + ": null buffer for tensor '" + t.name + "'");
      PACTRAIN_EXPECTS(tensors[i].size() == t.size,
                       std::string("sync::") + op + ": tensor '" + t.name + "' has " +
                           std::to_string(tensors[i].size()) + " entries, the layout " +
                           std::to_string(t.size));
    }
    views_.assign(tensors.begin(), tensors.end());
    open_step();
  }

  // Step bookkeeping shared by allreduce() and the three-phase form. Every dense bucket that
  // cannot run in place gets its own stretch of the workspace, whatever the order of
  // submission.
  void open_step() {
    const auto& buckets = layout_.buckets();
    const std::size_t nb = buckets.size();
    std::span<const std::span<value_type>> t(views_);
    dense_ws_offset_.assign(nb, npos);
    std::size_t needed = 0;
    for (std::size_t b = 0; b < nb; ++b) {
      if (!is_sparse(strategies_[b]) && buckets[b].size != 0 && !contiguous(buckets[b], t)) {
        dense_ws_offset_[b] = needed;
        needed += buckets[b].size;
      }
    }
    if (dense_ws_.size() < needed) dense_ws_.resize(needed);
    requests_.clear();
    requests_.resize(nb);
    regions_.assign(nb, {});
    submitted_.assign(nb, 0);
    order_.clear();
    order_.reserve(nb);
    if constexpr (Codec::uses_scale) {
      scale_pending_.clear();
      scale_requests_.clear();
      scale_requests_.resize(nb);
      scale_words_bucket_.assign(nb, 0);
    }
    sync_stats s = stats_;
    s.collectives = 0;
    s.bytes_sent = 0;
    s.dense_bytes = 0;
    s.gather_seconds = s.allreduce_seconds = s.scatter_seconds = 0;
    for (const auto& bk : buckets) s.dense_bytes += bk.size * sizeof(value_type);
    step_stats_ = s;
    step_start_ = clock::now();
    if constexpr (Codec::uses_scale) {
      reuse_scale_ = codec_.scale_from_previous_step() && scale_ready_;
      if (reuse_scale_) scale_used_ = scale_;
    }
    open_ = true;
  }

  // The payload of sparse bucket b, gathered from the tensors.
  std::span<value_type> gather_bucket(std::size_t b) {
    const auto& bk = layout_.buckets()[b];
    for (std::size_t i = bk.first_tensor; i < bk.first_tensor + bk.tensor_count; ++i) {
      compactor_.gather(plans_[i], std::span<const value_type>(views_[i]), tensor_payload(i));
    }
    return std::span<value_type>(payload_).subspan(bucket_start_[b], bucket_payload_[b]);
  }

  // The dense strategies' region of bucket b: the user's buffer when the bucket's tensors lie
  // back to back, else a copy in the bucket's stretch of the dense workspace.
  std::span<value_type> dense_region(std::size_t b) {
    const auto& bk = layout_.buckets()[b];
    if (bk.size == 0) return {};
    if (dense_ws_offset_[b] == npos) {
      return std::span<value_type>(views_[bk.first_tensor].data(), bk.size);
    }
    auto region = std::span<value_type>(dense_ws_).subspan(dense_ws_offset_[b], bk.size);
    std::size_t at = 0;
    for (std::size_t i = bk.first_tensor; i < bk.first_tensor + bk.tensor_count; ++i) {
      std::copy(views_[i].begin(), views_[i].end(),
                region.begin() + static_cast<std::ptrdiff_t>(at));
      at += views_[i].size();
    }
    return region;
  }

  // First half of a bucket's submission: its input region (gathered payload, or the dense
  // region). For a coded dense bucket the pruned entries are zeroed, so they can sway neither
  // the scale nor the residuals; then its local scale. The residual is added at encoding.
  void prepare(std::size_t b) {
    const auto& bk = layout_.buckets()[b];
    const auto t0 = clock::now();
    std::span<value_type> region = is_sparse(strategies_[b]) ? gather_bucket(b) : dense_region(b);
    if (coded(b)) {
      if (!is_sparse(strategies_[b])) {
        std::size_t at = 0;
        for (std::size_t i = bk.first_tensor; i < bk.first_tensor + bk.tensor_count; ++i) {
          if (plans_[i].count() != plans_[i].size()) {
            auto part = region.subspan(at, plans_[i].size());
            compactor_.gather(plans_[i], std::span<const value_type>(part), tensor_payload(i));
            compactor_.scatter(plans_[i], std::span<const value_type>(tensor_payload(i)), part,
                               value_type(1));
          }
          at += plans_[i].size();
        }
      }
      // The scale comes from the fresh gradient: a residual that counted would feed the
      // scale and, through the noise of a larger scale, itself. What exceeds it clips into
      // the residual.
      if constexpr (Codec::uses_scale) {
        local_max_[b] = std::bit_cast<std::uint32_t>(
            static_cast<float>(codec_.local_scale(std::span<const value_type>(region))));
      }
    }
    regions_[b] = region;
    submitted_[b] = 1;
    step_stats_.gather_seconds += seconds_since(t0);
  }

  // Starts the MAX allreduce of bucket b's local scale; send_scaled completes it.
  void start_scale(std::size_t b) {
    if constexpr (Codec::uses_scale) {
      const auto t0 = clock::now();
      scale_pending_.push_back(b);
      auto word = std::span<std::uint64_t>(scale_words_bucket_).subspan(b, 1);
      word[0] = local_max_[b];
      scale_requests_[b] = comm_.allreduce_async(word, reduce_op::max);
      step_stats_.allreduce_seconds += seconds_since(t0);
      ++step_stats_.collectives;
      step_stats_.bytes_sent += sizeof(std::uint64_t);
    }
  }

  // Completes the scale rounds start_scale began, in their order, and sends those buckets.
  void send_scaled() {
    if constexpr (Codec::uses_scale) {
      for (const std::size_t b : scale_pending_) {
        const auto t0 = clock::now();
        scale_requests_[b].wait();
        step_stats_.allreduce_seconds += seconds_since(t0);
        scale_used_[b] = std::bit_cast<float>(static_cast<std::uint32_t>(scale_words_bucket_[b]));
        send(b);
      }
      scale_pending_.clear();
    }
  }

  // One MAX allreduce of the listed buckets' local scales (same list on every rank); the
  // results are this step's scales.
  void reduce_scales(std::span<const std::size_t> buckets) {
    if constexpr (Codec::uses_scale) {
      const auto t0 = clock::now();
      scale_words_.clear();
      for (auto b : buckets) scale_words_.push_back(local_max_[b]);
      comm_.allreduce(std::span<std::uint64_t>(scale_words_), reduce_op::max);
      for (std::size_t k = 0; k < buckets.size(); ++k) {
        scale_used_[buckets[k]] = std::bit_cast<float>(static_cast<std::uint32_t>(scale_words_[k]));
      }
      step_stats_.allreduce_seconds += seconds_since(t0);
      ++step_stats_.collectives;
      step_stats_.bytes_sent += scale_words_.size() * sizeof(std::uint64_t);
    }
  }

  codec_context context(std::size_t b) const noexcept {
    return codec_context{.rank = comm_.rank(),
                         .size = comm_.size(),
                         .step = step_,
                         .stream = b,
                         .scale = scale_used_.empty() ? 0.0f : scale_used_[b]};
  }

  // Second half of a submission: encode (coded buckets), keep what did not get through
  // (error feedback), start the allreduce. An empty region sends nothing: region sizes
  // follow the agreed masks, so every rank skips the same buckets.
  void send(std::size_t b) {
    order_.push_back(b);
    const auto region = regions_[b];
    if (region.empty()) return;
    auto& s = step_stats_;
    if (plain(b)) {
      if constexpr (is_identity || plain_supported) {
        const auto t0 = clock::now();
        requests_[b] = comm_.allreduce_async(region, reduce_op::sum);
        s.allreduce_seconds += seconds_since(t0);
        s.bytes_sent += region.size_bytes();
      }
    } else {
      auto t0 = clock::now();
      const auto wire = wire_of(b);
      const codec_context ctx = context(b);
      if constexpr (feedback) {  // the residual is added here, in the codec's pass if it can
        encode_with_feedback(
            codec_, region, wire,
            std::span<value_type>(residual_).subspan(input_offset_[b], region.size()), ctx);
      } else {
        codec_.encode(std::span<const value_type>(region), wire, ctx);
      }
      s.gather_seconds += seconds_since(t0);
      t0 = clock::now();
      requests_[b] = comm_.allreduce_async(wire, reduce_op::sum);
      s.allreduce_seconds += seconds_since(t0);
      s.bytes_sent += wire.size_bytes();
    }
    ++s.collectives;
    progress(0);
  }

  // Nonblocking collectives of MPI progress only inside MPI calls (Open MPI's libnbc has no
  // progress thread): testing the ones in flight between buckets of local work keeps their
  // messages moving, so compaction and expansion overlap the network. Tests the buckets
  // submitted from position `from` on.
  void progress(std::size_t from) {
    if constexpr (requires(request_type & r) {
                    { r.test() } -> std::convertible_to<bool>;
                  }) {
      for (std::size_t k = from; k < order_.size(); ++k) (void)requests_[order_[k]].test();
    }
  }

  // Waits for the buckets in submission order and writes them back; starts and completes
  // the reduction of next step's scales (previous_max) alongside; closes the step.
  void complete() {
    auto& s = step_stats_;
    const value_type inv_p = value_type(1) / static_cast<value_type>(comm_.size());
    request_type scale_request;
    bool scale_pending = false;
    if constexpr (Codec::uses_scale) {
      bool any = false;  // the same on every rank: input sizes follow the agreed masks
      for (std::size_t b = 0; b < layout_.buckets().size(); ++b) any = any || input_size(b) != 0;
      if (reuse_scale_ && any) {  // next step's scales, reduced while this step's data moves
        const auto t0 = clock::now();
        scale_request = comm_.allreduce_async(std::span<std::uint64_t>(local_max_), reduce_op::max);
        s.allreduce_seconds += seconds_since(t0);
        ++s.collectives;
        s.bytes_sent += local_max_.size() * sizeof(std::uint64_t);
        scale_pending = true;
      }
    }
    for (std::size_t k = 0; k < order_.size(); ++k) {
      const std::size_t b = order_[k];
      auto t0 = clock::now();
      requests_[b].wait();
      progress(k + 1);
      s.allreduce_seconds += seconds_since(t0);
      t0 = clock::now();
      if (plain(b)) {
        expand_bucket(b, inv_p);
      } else {
        if (!regions_[b].empty()) {
          codec_.decode(std::span<const wire_type>(wire_of(b)), regions_[b], context(b));
        }
        expand_bucket(b, value_type(1));  // decode gave the mean
      }
      s.scatter_seconds += seconds_since(t0);
    }
    if constexpr (Codec::uses_scale) {
      if (scale_pending) {
        const auto t0 = clock::now();
        scale_request.wait();
        s.allreduce_seconds += seconds_since(t0);
        for (std::size_t b = 0; b < local_max_.size(); ++b) {
          scale_[b] = std::bit_cast<float>(static_cast<std::uint32_t>(local_max_[b]));
        }
      } else if (!reuse_scale_ && codec_.scale_from_previous_step()) {
        scale_ = scale_used_;
        scale_ready_ = true;
      }
    }
    requests_.clear();
    open_ = false;
    ++step_;
    ++s.steps;
    s.total_bytes_sent += s.bytes_sent;
    s.total_seconds += seconds_since(step_start_);
    stats_ = s;
  }

  // Writes the reduced bucket b back to the tensors, times scale, +0 at pruned entries.
  void expand_bucket(std::size_t b, value_type scale) {
    const auto& bk = layout_.buckets()[b];
    std::size_t at = 0;
    for (std::size_t i = bk.first_tensor; i < bk.first_tensor + bk.tensor_count; ++i) {
      if (is_sparse(strategies_[b])) {
        compactor_.scatter(plans_[i], std::span<const value_type>(tensor_payload(i)), views_[i],
                           scale);
      } else {
        expand_dense(i, regions_[b].subspan(at, views_[i].size()), views_[i], scale);
      }
      at += views_[i].size();
    }
  }

  // dst = scale * src at kept entries, +0 elsewhere; src is the reduced dense tensor (it may
  // be dst itself).
  void expand_dense(std::size_t i, std::span<value_type> src, std::span<value_type> dst,
                    value_type scale) {
    if (plans_[i].count() == plans_[i].size()) {
      if (scale == value_type(1) && src.data() == dst.data()) return;  // already in place
      for (std::size_t k = 0; k < dst.size(); ++k) dst[k] = src[k] * scale;
      return;
    }
    compactor_.gather(plans_[i], std::span<const value_type>(src), tensor_payload(i));
    compactor_.scatter(plans_[i], std::span<const value_type>(tensor_payload(i)), dst, scale);
  }

  static constexpr std::size_t npos = static_cast<std::size_t>(-1);

  Comm comm_;
  param_layout layout_;
  Compactor compactor_;
  Codec codec_;
  std::vector<bucket_strategy> strategies_;
  std::vector<Mask> masks_;
  std::vector<std::uint64_t> mask_digests_;  // of masks_, as committed
  std::vector<plan_type> plans_;
  std::vector<std::size_t> tensor_payload_offset_;  // into payload_
  std::vector<std::size_t> bucket_start_;           // into payload_
  std::vector<std::size_t> bucket_payload_;         // entries per bucket
  huge_vector<value_type> payload_;  // workspaces on huge pages: streamed every step
  huge_vector<value_type> dense_ws_;
  sync_stats stats_;
  std::uint64_t step_ = 0;
  // The open step.
  bool open_ = false;
  std::vector<std::span<value_type>> views_;    // the step's tensors
  std::vector<std::span<value_type>> regions_;  // per bucket: what its collective covers
  std::vector<request_type> requests_;          // per bucket
  std::vector<std::uint8_t> submitted_;         // per bucket
  std::vector<std::size_t> order_;              // buckets in order of submission
  std::vector<std::size_t> scale_due_;          // finish_step: prepared, awaiting their scale
  std::vector<std::size_t> dense_ws_offset_;    // per bucket: its stretch of dense_ws_
  sync_stats step_stats_;
  clock::time_point step_start_{};
  bool reuse_scale_ = false;  // previous_max scales in force this step
  // Codec state (unused by the identity codec), laid out bucket by bucket.
  std::vector<std::size_t> input_offset_;  // codec input entries before bucket b
  std::vector<std::size_t> wire_offset_;   // wire elements before bucket b
  huge_vector<wire_type> wire_;
  huge_vector<value_type> residual_;        // error_feedback
  std::vector<std::uint64_t> local_max_;    // bits of each bucket's scale (non-negative float)
  std::vector<std::uint64_t> scale_words_;  // a scale round's buffer
  // submit_bucket's scale rounds in flight (current_max): buckets, and per bucket its request
  // and word.
  std::vector<std::size_t> scale_pending_;
  std::vector<request_type> scale_requests_;
  std::vector<std::uint64_t> scale_words_bucket_;
  std::vector<float> scale_;       // previous_max: the last step's global scales
  std::vector<float> scale_used_;  // this step's scales
  bool scale_ready_ = false;
};

}  // namespace pactrain
