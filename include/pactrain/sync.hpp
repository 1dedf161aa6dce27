// pactrain::sync — the engine: averages pruned gradients across ranks, sending only kept
// entries.
//
//   using sync_t = pactrain::sync<pactrain::bitmap_mask, pactrain::host_compactor,
//                                 pactrain::mpi_communicator>;
//   sync_t sync{pactrain::mpi_communicator{MPI_COMM_WORLD}, layout};   // collective
//   sync.set_masks(masks);      // collective; checked across ranks
//   sync.allreduce(grads);      // averaged; pruned entries come back as +0
#pragma once

#include <pactrain/codec.hpp>
#include <pactrain/communicator.hpp>
#include <pactrain/compactor.hpp>
#include <pactrain/detail/agreement.hpp>
#include <pactrain/error.hpp>
#include <pactrain/layout.hpp>
#include <pactrain/mask.hpp>

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
  std::size_t collectives = 0;   // last step: allreduce collectives issued
  std::size_t bytes_sent = 0;    // last step: bytes this rank handed to the allreduces
  std::size_t dense_bytes = 0;   // last step: bytes a dense allreduce would hand over
  double gather_seconds = 0;     // last step: compaction into payloads (and packing)
  double allreduce_seconds = 0;  // last step: starting and waiting for the collectives
  double scatter_seconds = 0;    // last step: expansion, scaling and masking
  std::uint64_t total_bytes_sent = 0;
  double total_seconds = 0;
};

/// The sync engine over a param_layout. Template parameters are the mask representation,
/// the compactor, the communicator and the codec (its value_type is the gradient type).
///
/// Collective calls (constructor, set_masks, set_strategies, allreduce) must be made by all
/// ranks in the same order. Input errors found before any communication throw
/// pactrain::error and change nothing; set_masks and set_strategies include every rank's
/// verdict in their collective, so all ranks throw together. allreduce() checks its
/// arguments locally and adds no round to the step: when it rejects a buffer on one rank
/// only, the other ranks wait in their collective, so the caller must then stop the job
/// (e.g. MPI_Abort). Pass buffers of layout().total_size() entries on every rank.
template <gradient_mask Mask, class Compactor, communicator Comm,
          class Codec = identity_codec<float>>
class sync {
  static_assert(gradient_codec<Codec>,
                "pactrain::sync: Codec must model gradient_codec (value_type, wire_type, "
                "codec_traits)");
  static_assert(codec_traits<Codec>::is_linear,
                "pactrain::sync: a compacted allreduce sums encoded payloads, which is correct "
                "only for codecs that are linear under summation (codec_traits<Codec>::is_linear)");
  static_assert(codec_traits<Codec>::is_identity,
                "pactrain::sync: this version sends payload values as they are (identity_codec)");
  static_assert(compactor_for<Compactor, Mask, typename Codec::value_type>,
                "pactrain::sync: Compactor must model compactor_for<Compactor, Mask, value_type>");
  static_assert(Compactor::memory == memory_space::host,
                "pactrain::sync: this version synchronises host buffers (host_compactor)");

 public:
  using mask_type = Mask;
  using compactor_type = Compactor;
  using communicator_type = Comm;
  using codec_type = Codec;
  using value_type = typename Codec::value_type;
  using plan_type = typename Compactor::plan_type;

  /// Collective: checks that all ranks hold the same layout, and starts with every entry
  /// kept (masks of Mask::full).
  sync(Comm comm, param_layout layout, Compactor compactor = {}, sync_options opt = {})
      : comm_(std::move(comm)),
        layout_(std::move(layout)),
        compactor_(std::move(compactor)),
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
    } catch (const std::exception& e) {  // bad_alloc too: never leave the peers waiting
      in.local_error = e.what();
    }
    digest_builder cd(0x73747261);  // "stra"
    for (auto s : strategies) cd.add(static_cast<std::uint64_t>(s));
    in.config_digest = cd.value();
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
    const value_type scale = value_type(1) / static_cast<value_type>(comm_.size());
    sync_stats s = stats_;
    s.collectives = 0;
    s.bytes_sent = 0;
    s.dense_bytes = 0;
    s.gather_seconds = s.allreduce_seconds = s.scatter_seconds = 0;
    const auto step_start = clock::now();

    requests_.clear();
    requests_.resize(buckets.size());
    regions_.assign(buckets.size(), {});
    std::size_t dense_ws_needed = 0;
    for (std::size_t b = 0; b < buckets.size(); ++b) {
      if (strategies_[b] == bucket_strategy::dense && buckets[b].size != 0 &&
          !contiguous(buckets[b], t)) {
        dense_ws_needed += buckets[b].size;
      }
    }
    if (dense_ws_.size() < dense_ws_needed) dense_ws_.resize(dense_ws_needed);

    // Phase 1: compact (or pack) each bucket and start its collective, so earlier buckets
    // are in flight while later ones are compacted.
    std::size_t ws_used = 0;
    for (std::size_t b = 0; b < buckets.size(); ++b) {
      const auto& bk = buckets[b];
      s.dense_bytes += bk.size * sizeof(value_type);
      auto t0 = clock::now();
      std::span<value_type> region;
      if (strategies_[b] == bucket_strategy::sparse) {
        for (std::size_t i = bk.first_tensor; i < bk.first_tensor + bk.tensor_count; ++i) {
          compactor_.gather(plans_[i], std::span<const value_type>(t[i]), tensor_payload(i));
        }
        region = std::span<value_type>(payload_).subspan(bucket_start_[b], bucket_payload_[b]);
      } else if (bk.size != 0) {
        if (contiguous(bk, t)) {
          region = std::span<value_type>(t[bk.first_tensor].data(), bk.size);
        } else {
          region = std::span<value_type>(dense_ws_).subspan(ws_used, bk.size);
          std::size_t at = 0;
          for (std::size_t i = bk.first_tensor; i < bk.first_tensor + bk.tensor_count; ++i) {
            std::copy(t[i].begin(), t[i].end(), region.begin() + static_cast<std::ptrdiff_t>(at));
            at += t[i].size();
          }
          ws_used += bk.size;
        }
      }
      s.gather_seconds += seconds_since(t0);
      regions_[b] = region;
      if (region.empty()) continue;  // nothing kept: same on every rank, no collective
      t0 = clock::now();
      requests_[b] = comm_.allreduce_async(region, reduce_op::sum);
      s.allreduce_seconds += seconds_since(t0);
      ++s.collectives;
      s.bytes_sent += region.size() * sizeof(value_type);
    }

    // Phase 2: complete in order and expand.
    for (std::size_t b = 0; b < buckets.size(); ++b) {
      const auto& bk = buckets[b];
      auto t0 = clock::now();
      requests_[b].wait();
      s.allreduce_seconds += seconds_since(t0);
      t0 = clock::now();
      std::size_t at = 0;
      for (std::size_t i = bk.first_tensor; i < bk.first_tensor + bk.tensor_count; ++i) {
        if (strategies_[b] == bucket_strategy::sparse) {
          compactor_.scatter(plans_[i], std::span<const value_type>(tensor_payload(i)), t[i],
                             scale);
        } else {
          expand_dense(i, regions_[b].subspan(at, t[i].size()), t[i], scale);
        }
        at += t[i].size();
      }
      s.scatter_seconds += seconds_since(t0);
    }
    requests_.clear();

    ++s.steps;
    s.total_bytes_sent += s.bytes_sent;
    s.total_seconds += seconds_since(step_start);
    stats_ = s;
  }

  // dst = scale * src at kept entries, +0 elsewhere; src is the reduced dense tensor (it may
  // be dst itself).
  void expand_dense(std::size_t i, std::span<value_type> src, std::span<value_type> dst,
                    value_type scale) {
    if (plans_[i].count() == plans_[i].size()) {
      for (std::size_t k = 0; k < dst.size(); ++k) dst[k] = src[k] * scale;
      return;
    }
    compactor_.gather(plans_[i], std::span<const value_type>(src), tensor_payload(i));
    compactor_.scatter(plans_[i], std::span<const value_type>(tensor_payload(i)), dst, scale);
  }

  Comm comm_;
  param_layout layout_;
  Compactor compactor_;
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
};

}  // namespace pactrain
