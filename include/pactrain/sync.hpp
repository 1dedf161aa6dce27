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

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace pactrain {

/// How a bucket is synchronised. Both give the same result with the identity codec.
///   sparse  gather kept entries, allreduce count() values, scatter;
///   dense   allreduce the whole bucket, then zero pruned entries.
enum class bucket_strategy : std::uint8_t { sparse, dense };

inline const char* to_string(bucket_strategy s) noexcept {
  return s == bucket_strategy::sparse ? "sparse" : "dense";
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
/// allreduce them with SUM, decode the mean and scatter it. The identity codec skips encode
/// and decode: the payload itself is summed and 1/P is folded into the scatter.
///
/// Collective calls (constructor, set_masks, set_strategies, allreduce) must be made by all
/// ranks in the same order. Input errors found before any communication throw
/// pactrain::error and change nothing; set_masks and set_strategies include every rank's
/// verdict in their collective, so all ranks throw together. allreduce() checks its
/// arguments locally and adds no round to the step: when it rejects a buffer on one rank
/// only, the other ranks wait in their collective, so the caller must then stop the job
/// (e.g. MPI_Abort). Pass buffers of layout().total_size() entries on every rank.
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
    PACTRAIN_EXPECTS(grads.data() != nullptr || grads.empty(), "sync::allreduce: null buffer");
    PACTRAIN_EXPECTS(grads.size() == layout_.total_size(),
                     "sync::allreduce: buffer has " + std::to_string(grads.size()) +
                         " entries, the layout " + std::to_string(layout_.total_size()));
    views_.clear();
    for (const auto& t : layout_.tensors()) views_.push_back(grads.subspan(t.offset, t.size));
    run(views_);
  }

  /// As above for a pointer and a size.
  void allreduce(value_type* data, std::size_t n) {
    PACTRAIN_EXPECTS(data != nullptr || n == 0,
                     "sync::allreduce: null buffer with " + std::to_string(n) + " entries");
    allreduce(std::span<value_type>(data, n));
  }

  /// Averages tensors held in separate buffers: one span per tensor, in layout order.
  void allreduce(std::span<const std::span<value_type>> tensors) {
    PACTRAIN_EXPECTS(tensors.size() == layout_.tensor_count(),
                     "sync::allreduce: " + std::to_string(tensors.size()) +
                         " tensors given, the layout has " +
                         std::to_string(layout_.tensor_count()));
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      const auto& t = layout_.tensors()[i];
      PACTRAIN_EXPECTS(tensors[i].data() != nullptr || tensors[i].empty(),
                       "sync::allreduce: null buffer for tensor '" + t.name + "'");
      PACTRAIN_EXPECTS(tensors[i].size() == t.size,
                       "sync::allreduce: tensor '" + t.name + "' has " +
                           std::to_string(tensors[i].size()) + " entries, the layout " +
                           std::to_string(t.size));
    }
    run(tensors);
  }

  [[nodiscard]] const param_layout& layout() const noexcept { return layout_; }
  [[nodiscard]] const std::vector<Mask>& masks() const noexcept { return masks_; }
  [[nodiscard]] const plan_type& plan(std::size_t tensor) const { return plans_.at(tensor); }
  [[nodiscard]] const std::vector<bucket_strategy>& strategies() const noexcept {
    return strategies_;
  }
  /// Payload entries sent for bucket b under the sparse strategy.
  [[nodiscard]] std::size_t payload_size(std::size_t b) const { return bucket_payload_.at(b); }
  /// Wire elements bucket b sends per step under its current strategy (identity: values).
  [[nodiscard]] std::size_t wire_size(std::size_t b) const {
    return codec_.wire_size(input_size(b), comm_.size());
  }
  [[nodiscard]] const Codec& codec() const noexcept { return codec_; }
  /// The step counter the codec's random numbers use: allreduce() calls begun since
  /// construction, or since set_step. Restore it on resume for a bit-identical continuation.
  [[nodiscard]] std::uint64_t step() const noexcept { return step_; }
  void set_step(std::uint64_t s) noexcept { step_ = s; }
  /// error_feedback: the residuals, codec input entries of bucket 0, 1, ... in order (empty
  /// otherwise).
  [[nodiscard]] std::span<const value_type> residuals() const noexcept { return residual_; }
  [[nodiscard]] const sync_stats& stats() const noexcept { return stats_; }
  [[nodiscard]] Comm& get_communicator() noexcept { return comm_; }
  [[nodiscard]] const Compactor& compactor() const noexcept { return compactor_; }

 private:
  using clock = std::chrono::steady_clock;
  using request_type = typename Comm::request_type;

  static double seconds_since(clock::time_point t0) {
    return std::chrono::duration<double>(clock::now() - t0).count();
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
      PACTRAIN_EXPECTS(masks.size() == layout_.tensor_count(),
                       std::to_string(masks.size()) + " masks given for " +
                           std::to_string(layout_.tensor_count()) + " tensors");
      PACTRAIN_EXPECTS(strategies.size() == layout_.buckets().size(),
                       std::to_string(strategies.size()) + " strategies given for " +
                           std::to_string(layout_.buckets().size()) + " buckets");
      for (std::size_t i = 0; i < masks.size(); ++i) {
        const auto& t = layout_.tensors()[i];
        PACTRAIN_EXPECTS(masks[i].size() == t.size,
                         "mask of tensor '" + t.name + "' has " + std::to_string(masks[i].size()) +
                             " entries, the tensor " + std::to_string(t.size));
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
    std::vector<std::size_t> offset(masks.size());
    std::vector<std::size_t> per_bucket(layout_.buckets().size(), 0);
    std::size_t total = 0;
    for (std::size_t b = 0; b < layout_.buckets().size(); ++b) {
      const auto& bk = layout_.buckets()[b];
      bucket_start_.resize(layout_.buckets().size());
      bucket_start_[b] = total;
      for (std::size_t i = bk.first_tensor; i < bk.first_tensor + bk.tensor_count; ++i) {
        offset[i] = total;
        total += plans[i].count();
        per_bucket[b] += plans[i].count();
      }
    }
    payload_.assign(total, value_type(0));
    masks_ = std::move(masks);
    plans_ = std::move(plans);
    strategies_ = std::move(strategies);
    tensor_payload_offset_ = std::move(offset);
    bucket_payload_ = std::move(per_bucket);
    if constexpr (!is_identity) {
      // Codec inputs and wire elements, bucket by bucket; residuals restart at zero and
      // the previous step's scales no longer describe the buckets.
      const std::size_t nb = layout_.buckets().size();
      input_offset_.assign(nb + 1, 0);
      wire_offset_.assign(nb + 1, 0);
      for (std::size_t b = 0; b < nb; ++b) {
        input_offset_[b + 1] = input_offset_[b] + input_size(b);
        wire_offset_[b + 1] = wire_offset_[b] + wire_size(b);
      }
      wire_.assign(wire_offset_[nb], wire_type{});
      if constexpr (feedback) residual_.assign(input_offset_[nb], value_type(0));
      local_max_.assign(nb, 0);
      scale_.assign(nb, 0.0f);
      scale_used_.assign(nb, 0.0f);
      scale_ready_ = false;
    }
  }

  static constexpr bool is_identity = codec_traits<Codec>::is_identity;
  static constexpr bool feedback = Feedback::enabled && !is_identity;

  // Codec input entries of bucket b: its payload (sparse) or all its entries (dense).
  [[nodiscard]] std::size_t input_size(std::size_t b) const {
    return strategies_.at(b) == bucket_strategy::sparse ? bucket_payload_.at(b)
                                                        : layout_.buckets().at(b).size;
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

  void run(std::span<const std::span<value_type>> t) {
    const auto& buckets = layout_.buckets();
    sync_stats s = stats_;
    s.collectives = 0;
    s.bytes_sent = 0;
    s.dense_bytes = 0;
    s.gather_seconds = s.allreduce_seconds = s.scatter_seconds = 0;
    for (const auto& bk : buckets) s.dense_bytes += bk.size * sizeof(value_type);
    const auto step_start = clock::now();
    requests_.clear();
    requests_.resize(buckets.size());
    regions_.assign(buckets.size(), {});
    reserve_dense_ws(t);

    if constexpr (is_identity) {
      run_identity(t, s);
    } else {
      run_codec(t, s);
    }
    requests_.clear();

    ++step_;
    ++s.steps;
    s.total_bytes_sent += s.bytes_sent;
    s.total_seconds += seconds_since(step_start);
    stats_ = s;
  }

  // The payload of sparse bucket b, gathered from the tensors.
  std::span<value_type> gather_bucket(std::size_t b, std::span<const std::span<value_type>> t) {
    const auto& bk = layout_.buckets()[b];
    for (std::size_t i = bk.first_tensor; i < bk.first_tensor + bk.tensor_count; ++i) {
      compactor_.gather(plans_[i], std::span<const value_type>(t[i]), tensor_payload(i));
    }
    return std::span<value_type>(payload_).subspan(bucket_start_[b], bucket_payload_[b]);
  }

  void run_identity(std::span<const std::span<value_type>> t, sync_stats& s) {
    const auto& buckets = layout_.buckets();
    const value_type scale = value_type(1) / static_cast<value_type>(comm_.size());

    // Phase 1: compact (or pack) each bucket and start its collective, so earlier buckets
    // are in flight while later ones are compacted.
    std::size_t ws_used = 0;
    for (std::size_t b = 0; b < buckets.size(); ++b) {
      auto t0 = clock::now();
      const auto region = strategies_[b] == bucket_strategy::sparse ? gather_bucket(b, t)
                                                                    : dense_region(b, t, ws_used);
      s.gather_seconds += seconds_since(t0);
      regions_[b] = region;
      if (region.empty()) continue;  // nothing kept: same on every rank, no collective
      t0 = clock::now();
      requests_[b] = comm_.allreduce_async(region, reduce_op::sum);
      progress(0, b + 1);
      s.allreduce_seconds += seconds_since(t0);
      ++s.collectives;
      s.bytes_sent += region.size() * sizeof(value_type);
    }

    // Phase 2: complete in order and expand, advancing the later buckets meanwhile.
    for (std::size_t b = 0; b < buckets.size(); ++b) {
      auto t0 = clock::now();
      requests_[b].wait();
      progress(b + 1, buckets.size());
      s.allreduce_seconds += seconds_since(t0);
      t0 = clock::now();
      expand_bucket(b, t, scale);
      s.scatter_seconds += seconds_since(t0);
    }
  }

  // Nonblocking collectives of MPI progress only inside MPI calls (Open MPI's libnbc has no
  // progress thread): testing the ones in flight between buckets of local work keeps their
  // messages moving, so compaction and expansion overlap the network.
  void progress(std::size_t from, std::size_t to) {
    if constexpr (requires(request_type & r) {
                    { r.test() } -> std::convertible_to<bool>;
                  }) {
      for (std::size_t b = from; b < to; ++b) (void)requests_[b].test();
    }
  }

  // Writes the reduced bucket b back to the tensors, times scale, +0 at pruned entries.
  void expand_bucket(std::size_t b, std::span<const std::span<value_type>> t, value_type scale) {
    const auto& bk = layout_.buckets()[b];
    std::size_t at = 0;
    for (std::size_t i = bk.first_tensor; i < bk.first_tensor + bk.tensor_count; ++i) {
      if (strategies_[b] == bucket_strategy::sparse) {
        compactor_.scatter(plans_[i], std::span<const value_type>(tensor_payload(i)), t[i], scale);
      } else {
        expand_dense(i, regions_[b].subspan(at, t[i].size()), t[i], scale);
      }
      at += t[i].size();
    }
  }

  // The dense strategy's region of bucket b: the user's buffer when the bucket's tensors lie
  // back to back, else a copy in the dense workspace (advancing ws_used).
  std::span<value_type> dense_region(std::size_t b, std::span<const std::span<value_type>> t,
                                     std::size_t& ws_used) {
    const auto& bk = layout_.buckets()[b];
    if (bk.size == 0) return {};
    if (contiguous(bk, t)) return std::span<value_type>(t[bk.first_tensor].data(), bk.size);
    auto region = std::span<value_type>(dense_ws_).subspan(ws_used, bk.size);
    std::size_t at = 0;
    for (std::size_t i = bk.first_tensor; i < bk.first_tensor + bk.tensor_count; ++i) {
      std::copy(t[i].begin(), t[i].end(), region.begin() + static_cast<std::ptrdiff_t>(at));
      at += t[i].size();
    }
    ws_used += bk.size;
    return region;
  }

  void reserve_dense_ws(std::span<const std::span<value_type>> t) {
    const auto& buckets = layout_.buckets();
    std::size_t needed = 0;
    for (std::size_t b = 0; b < buckets.size(); ++b) {
      if (strategies_[b] == bucket_strategy::dense && buckets[b].size != 0 &&
          !contiguous(buckets[b], t)) {
        needed += buckets[b].size;
      }
    }
    if (dense_ws_.size() < needed) dense_ws_.resize(needed);
  }

  std::span<wire_type> wire_of(std::size_t b) {
    return std::span<wire_type>(wire_).subspan(wire_offset_[b],
                                               wire_offset_[b + 1] - wire_offset_[b]);
  }

  // Steps of a codec bucket. prepare: the codec input (gathered payload, or the dense region
  // with pruned entries zeroed so they cannot sway the scale or feed residuals), its local
  // scale, plus the residual. send: encode, keep what did not get through, start the
  // allreduce.
  void prepare(std::size_t b, std::span<const std::span<value_type>> t, std::size_t& ws_used,
               sync_stats& s) {
    const auto& bk = layout_.buckets()[b];
    const auto t0 = clock::now();
    std::span<value_type> region;
    if (strategies_[b] == bucket_strategy::sparse) {
      region = gather_bucket(b, t);
    } else {
      region = dense_region(b, t, ws_used);
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
    // The scale comes from the fresh gradient: a residual that counted would feed the scale
    // and, through the noise of a larger scale, itself. What exceeds it clips into the
    // residual.
    if constexpr (Codec::uses_scale) {
      local_max_[b] = std::bit_cast<std::uint32_t>(
          static_cast<float>(codec_.local_scale(std::span<const value_type>(region))));
    }
    if constexpr (feedback) {
      const value_type* r = residual_.data() + input_offset_[b];
      for (std::size_t k = 0; k < region.size(); ++k) region[k] += r[k];
    }
    regions_[b] = region;
    s.gather_seconds += seconds_since(t0);
  }

  codec_context context(std::size_t b) const noexcept {
    return codec_context{.rank = comm_.rank(),
                         .size = comm_.size(),
                         .step = step_,
                         .stream = b,
                         .scale = scale_used_.empty() ? 0.0f : scale_used_[b]};
  }

  void send(std::size_t b, sync_stats& s) {
    const auto region = regions_[b];
    if (region.empty()) return;  // nothing kept: same on every rank, no collective
    auto t0 = clock::now();
    const auto wire = wire_of(b);
    const codec_context ctx = context(b);
    codec_.encode(std::span<const value_type>(region), wire, ctx);
    if constexpr (feedback) {
      auto r = std::span<value_type>(residual_).subspan(input_offset_[b], region.size());
      codec_.decode_local(std::span<const wire_type>(wire), r, ctx);
      for (std::size_t k = 0; k < r.size(); ++k) r[k] = region[k] - r[k];
    }
    s.gather_seconds += seconds_since(t0);
    t0 = clock::now();
    requests_[b] = comm_.allreduce_async(wire, reduce_op::sum);
    s.allreduce_seconds += seconds_since(t0);
    ++s.collectives;
    s.bytes_sent += wire.size_bytes();
  }

  void run_codec(std::span<const std::span<value_type>> t, sync_stats& s) {
    const auto& buckets = layout_.buckets();
    const std::size_t nb = buckets.size();
    bool any = false;  // the same on every rank: region sizes follow the agreed masks
    for (std::size_t b = 0; b < nb; ++b) any = any || input_size(b) != 0;

    // Phase 1: prepare and send each bucket, so earlier buckets are in flight while later
    // ones are prepared; a codec whose scale is needed now prepares all buckets, reduces
    // their scales in one small MAX allreduce and only then sends.
    std::size_t ws_used = 0;
    request_type scale_request;
    bool scale_pending = false;
    if constexpr (Codec::uses_scale) {
      const bool reuse = codec_.scale_from_previous_step() && scale_ready_;
      if (reuse) {
        scale_used_ = scale_;
        for (std::size_t b = 0; b < nb; ++b) {
          prepare(b, t, ws_used, s);
          send(b, s);
        }
        if (any) {  // next step's scales, reduced while this step's data is in flight
          const auto t0 = clock::now();
          scale_request =
              comm_.allreduce_async(std::span<std::uint64_t>(local_max_), reduce_op::max);
          s.allreduce_seconds += seconds_since(t0);
          ++s.collectives;
          s.bytes_sent += local_max_.size() * sizeof(std::uint64_t);
          scale_pending = true;
        }
      } else {
        for (std::size_t b = 0; b < nb; ++b) prepare(b, t, ws_used, s);
        if (any) {
          const auto t0 = clock::now();
          comm_.allreduce(std::span<std::uint64_t>(local_max_), reduce_op::max);
          s.allreduce_seconds += seconds_since(t0);
          ++s.collectives;
          s.bytes_sent += local_max_.size() * sizeof(std::uint64_t);
        }
        for (std::size_t b = 0; b < nb; ++b) {
          scale_used_[b] = std::bit_cast<float>(static_cast<std::uint32_t>(local_max_[b]));
        }
        for (std::size_t b = 0; b < nb; ++b) send(b, s);
        if (codec_.scale_from_previous_step()) {
          scale_ = scale_used_;
          scale_ready_ = true;
        }
      }
    } else {
      for (std::size_t b = 0; b < nb; ++b) {
        prepare(b, t, ws_used, s);
        send(b, s);
        progress(0, b + 1);
      }
    }

    // Phase 2: complete in order, decode the mean and expand.
    for (std::size_t b = 0; b < nb; ++b) {
      auto t0 = clock::now();
      requests_[b].wait();
      progress(b + 1, nb);
      s.allreduce_seconds += seconds_since(t0);
      t0 = clock::now();
      const auto region = regions_[b];
      if (!region.empty()) {
        codec_.decode(std::span<const wire_type>(wire_of(b)), region, context(b));
      }
      expand_bucket(b, t, value_type(1));  // decode gave the mean
      s.scatter_seconds += seconds_since(t0);
    }
    if (scale_pending) {
      const auto t0 = clock::now();
      scale_request.wait();
      s.allreduce_seconds += seconds_since(t0);
      for (std::size_t b = 0; b < nb; ++b) {
        scale_[b] = std::bit_cast<float>(static_cast<std::uint32_t>(local_max_[b]));
      }
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

  Comm comm_;
  param_layout layout_;
  Compactor compactor_;
  Codec codec_;
  std::vector<bucket_strategy> strategies_;
  std::vector<Mask> masks_;
  std::vector<plan_type> plans_;
  std::vector<std::size_t> tensor_payload_offset_;  // into payload_
  std::vector<std::size_t> bucket_start_;           // into payload_
  std::vector<std::size_t> bucket_payload_;         // entries per bucket
  std::vector<value_type> payload_;
  std::vector<value_type> dense_ws_;
  std::vector<std::span<value_type>> views_;
  std::vector<std::span<value_type>> regions_;
  std::vector<request_type> requests_;
  sync_stats stats_;
  std::uint64_t step_ = 0;
  // Codec state (unused by the identity codec), laid out bucket by bucket.
  std::vector<std::size_t> input_offset_;  // codec input entries before bucket b
  std::vector<std::size_t> wire_offset_;   // wire elements before bucket b
  std::vector<wire_type> wire_;
  std::vector<value_type> residual_;      // error_feedback
  std::vector<std::uint64_t> local_max_;  // bits of each bucket's scale (non-negative float)
  std::vector<float> scale_;              // previous_max: the last step's global scales
  std::vector<float> scale_used_;         // this step's scales
  bool scale_ready_ = false;
};

}  // namespace pactrain
