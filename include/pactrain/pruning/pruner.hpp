// Pruning: the pruner, which drives a sync engine's masks through a schedule and checkpoints
// them, and apply_masks. Policies (pruning/policies.hpp) are rank-invariant, so ranks compute
// masks locally and the agreement only confirms what is already true; schedules are in
// pruning/schedule.hpp.
#pragma once

#include <pactrain/concepts.hpp>
#include <pactrain/detail/agreement.hpp>
#include <pactrain/digest.hpp>
#include <pactrain/error.hpp>
#include <pactrain/layout.hpp>
#include <pactrain/mask.hpp>
#include <pactrain/pruning/policies.hpp>
#include <pactrain/pruning/schedule.hpp>
#include <pactrain/serialize.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <concepts>
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

// --- masks applied to weights and optimizer state ----------------------------------------------

namespace detail {

template <gradient_mask Mask>
void check_masks(const param_layout& layout, const std::vector<Mask>& masks) {
  PACTRAIN_EXPECTS(masks.size() == layout.tensor_count(),
                   "apply_masks: " + std::to_string(masks.size()) + " masks for " +
                       std::to_string(layout.tensor_count()) + " tensors");
  for (std::size_t i = 0; i < masks.size(); ++i) {
    PACTRAIN_EXPECTS(masks[i].size() == layout.tensor(i).size,
                     "apply_masks: mask of tensor '" + layout.tensor(i).name + "' has " +
                         std::to_string(masks[i].size()) + " entries, the tensor " +
                         std::to_string(layout.tensor(i).size));
  }
}

// One span per tensor of the layout, each of its tensor's size and not null.
template <class T>
void check_tensor_spans(const char* op, const param_layout& layout,
                        std::span<const std::span<T>> tensors) {
  PACTRAIN_EXPECTS(tensors.size() == layout.tensor_count(),
                   std::string(op) + ": " + std::to_string(tensors.size()) +
                       " tensors given, the layout has " + std::to_string(layout.tensor_count()));
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const auto& t = layout.tensor(i);
    PACTRAIN_EXPECTS(tensors[i].data() != nullptr || tensors[i].empty(),
                     std::string(op) + ": null buffer for tensor '" + t.name + "'");
    PACTRAIN_EXPECTS(tensors[i].size() == t.size, std::string(op) + ": tensor '" + t.name +
                                                      "' has " + std::to_string(tensors[i].size()) +
                                                      " entries, the layout " +
                                                      std::to_string(t.size));
  }
}

template <gradient_mask Mask, class T>
void apply_mask(const Mask& mask, T* x) {
  if constexpr (detail::word_bitmap<Mask>) {
    // Word by word: the kept values aside, the 64 entries zeroed at once, the kept ones put
    // back. A fine-grained mask has about as many runs as kept entries, and zeroing run by run
    // was about three times slower (bench/results/measurements.md).
    const auto words = mask.words();
    T kept[64];
    for (std::size_t w = 0; w < words.size(); ++w) {
      const std::uint64_t bits = words[w];
      if (bits == ~0ULL) continue;
      T* y = x + w * 64;
      std::size_t k = 0;
      for (std::uint64_t b = bits; b != 0; b &= b - 1) kept[k++] = y[std::countr_zero(b)];
      std::fill(y, y + std::min<std::size_t>(64, mask.size() - w * 64), T(0));
      k = 0;
      for (std::uint64_t b = bits; b != 0; b &= b - 1) y[std::countr_zero(b)] = kept[k++];
    }
  } else {
    std::size_t pos = 0;
    mask.for_each_run([&](std::size_t b, std::size_t len) {
      std::fill(x + pos, x + b, T(0));
      pos = b + len;
    });
    std::fill(x + pos, x + mask.size(), T(0));
  }
}

}  // namespace detail

/// Sets the pruned entries of `buffer` (a flat buffer laid out by `layout`: weights, momentum,
/// any optimizer state) to +0, so pruned weights stay exactly zero. Throws pactrain::error
/// (touching nothing) on mismatched sizes.
template <gradient_mask Mask, gradient_value T>
void apply_masks(const param_layout& layout, const std::vector<Mask>& masks, std::span<T> buffer) {
  PACTRAIN_EXPECTS(buffer.data() != nullptr || buffer.empty(), "apply_masks: null buffer");
  PACTRAIN_EXPECTS(buffer.size() == layout.total_size(),
                   "apply_masks: buffer has " + std::to_string(buffer.size()) +
                       " entries, the layout " + std::to_string(layout.total_size()));
  detail::check_masks(layout, masks);
  for (std::size_t i = 0; i < masks.size(); ++i) {
    detail::apply_mask(masks[i], buffer.data() + layout.tensor(i).offset);
  }
}

/// As above for tensors in separate buffers: one span per tensor, in layout order.
template <gradient_mask Mask, gradient_value T>
void apply_masks(const param_layout& layout, const std::vector<Mask>& masks,
                 std::span<const std::span<T>> tensors) {
  detail::check_tensor_spans("apply_masks", layout, tensors);
  detail::check_masks(layout, masks);
  for (std::size_t i = 0; i < masks.size(); ++i) detail::apply_mask(masks[i], tensors[i].data());
}
template <gradient_mask Mask, gradient_value T>
void apply_masks(const param_layout& layout, const std::vector<Mask>& masks,
                 const std::vector<std::span<T>>& tensors) {
  apply_masks(layout, masks, std::span<const std::span<T>>(tensors));
}

// --- the pruner: the mask lifecycle ------------------------------------------------------------

/// Where new masks come from at an update step: each rank computes them (policies are
/// rank-invariant, so equal weights give equal masks), or rank 0 computes and broadcasts.
enum class mask_source { local, root_broadcast };

inline constexpr std::uint32_t checkpoint_format_version = 1;

/// Drives a sync engine's masks through a schedule: call step() on every rank once per training
/// step, after the optimizer step. save() and load() checkpoint the masks and the schedule
/// position, so that a resumed run continues with bit-identical masks. Every rank must hold the
/// same schedule, mask source and prunable flags; the first step() and every load() check it.
template <pruning_policy Policy, pruning_schedule Schedule>
class pruner {
 public:
  using mask_type = typename Policy::mask_type;

  /// `prunable`: one flag per tensor of the layout (biases and norms usually false).
  pruner(Policy policy, Schedule schedule, std::vector<bool> prunable,
         mask_source source = mask_source::local)
      : policy_(std::move(policy)),
        schedule_(std::move(schedule)),
        prunable_(std::move(prunable)),
        source_(source) {
    schedule_.validate();
  }

  /// Collective on update steps and on the first call (which checks that every rank holds the
  /// same schedule, mask source, prunable flags and step): commits the masks for the
  /// schedule's sparsity from `weights` (laid out by sync.layout()) and returns true. A
  /// failure on any rank throws on every rank and leaves the old masks and the step count.
  template <sync_engine Sync, gradient_value T>
  bool step(Sync& sync, std::span<const T> weights) {
    return step_with<T>(sync, [&] { return weights; });
  }

  /// As above with the weights in separate buffers, one span per tensor in layout order
  /// (copied into one buffer on update steps only).
  template <sync_engine Sync>
  bool step(Sync& sync, std::span<const std::span<typename Sync::value_type>> tensors) {
    using T = typename Sync::value_type;
    std::vector<T> flat;
    return step_with<T>(sync, [&] {
      detail::check_tensor_spans("pruner::step", sync.layout(), tensors);
      flat.resize(sync.layout().total_size());
      for (std::size_t i = 0; i < tensors.size(); ++i) {
        std::copy(tensors[i].begin(), tensors[i].end(),
                  flat.begin() + static_cast<std::ptrdiff_t>(sync.layout().tensor(i).offset));
      }
      return std::span<const T>(flat);
    });
  }
  template <sync_engine Sync>
  bool step(Sync& sync, const std::vector<std::span<typename Sync::value_type>>& tensors) {
    return step(sync, std::span<const std::span<typename Sync::value_type>>(tensors));
  }

 private:
  // The step; weights() gives the flat weights (it may throw: an update step turns that into
  // every rank's error).
  template <class T, class Sync, class Weights>
  bool step_with(Sync& sync, Weights&& weights) {
    static_assert(std::is_same_v<typename Sync::mask_type, mask_type>,
                  "pruner::step: the sync engine's Mask must be the policy's mask_type");
    if (!agreed_) {
      std::vector<std::uint64_t> digests;
      for (const auto& m : sync.masks()) digests.push_back(m.digest());
      agree_position(sync, step_, sparsity_, digests, {}, "pruner::step");
      agreed_ = true;
    }
    const std::uint64_t t = step_;
    if (!schedule_.is_update_step(t)) {
      ++step_;
      return false;
    }
    const double s = schedule_.sparsity_at(t);
    std::vector<mask_type> masks;
    std::string failure;
    if (source_ == mask_source::local || sync.get_communicator().size() == 1) {
      try {
        masks = policy_.compute(sync.layout(), weights(), s, prunable_);
      } catch (const std::exception& e) {
        failure = e.what();
      }
    } else {
      masks = broadcast_masks<T>(sync, weights, s);
    }
    if (!failure.empty()) {
      sync.reject_masks(std::move(failure));
    } else {
      sync.set_masks(std::move(masks));
    }
    sparsity_ = s;
    ++step_;
    return true;
  }

 public:
  [[nodiscard]] std::uint64_t current_step() const noexcept { return step_; }
  /// The sparsity of the last committed update (0 before the first).
  [[nodiscard]] double current_sparsity() const noexcept { return sparsity_; }
  [[nodiscard]] const Schedule& schedule() const noexcept { return schedule_; }
  [[nodiscard]] const std::vector<bool>& prunable() const noexcept { return prunable_; }

  /// Local: the masks and the schedule position as versioned, checksummed bytes for load(),
  /// independent of the host.
  template <class Sync>
  [[nodiscard]] std::vector<std::byte> save(const Sync& sync) const {
    std::vector<std::byte> out;
    for (char c : std::string_view("PTRNCKPT")) out.push_back(static_cast<std::byte>(c));
    detail::put_u32(out, checkpoint_format_version);
    detail::put_u32(out, 0);
    detail::put_u64(out, sync.layout().digest());
    detail::put_u64(out, step_);
    detail::put_u64(out, std::bit_cast<std::uint64_t>(sparsity_));
    detail::put_u64(out, sync.masks().size());
    for (const auto& m : sync.masks()) {
      const auto bytes = serialize(m);
      detail::put_u64(out, bytes.size());
      out.insert(out.end(), bytes.begin(), bytes.end());
    }
    detail::put_u64(out, detail::checksum(out));
    return out;
  }

  /// Collective: restores masks and schedule position from save(). A checkpoint that is
  /// corrupt or does not fit sync.layout() on any rank, or checkpoints of different steps,
  /// masks or pruner settings across ranks, throw pactrain::error on every rank and change
  /// nothing.
  template <class Sync>
  void load(Sync& sync, std::span<const std::byte> in) {
    std::vector<mask_type> masks;
    std::vector<std::uint64_t> digests;
    std::uint64_t step = 0;
    double sparsity = 0;
    std::string failure;
    try {
      parse(sync.layout(), in, masks, step, sparsity);
      digests.reserve(masks.size());
      for (const auto& m : masks) digests.push_back(m.digest());
    } catch (const std::exception& e) {  // bad_alloc too: never leave the peers waiting
      failure = e.what();
    }
    agree_position(sync, step, sparsity, digests, std::move(failure), "pruner::load");
    sync.set_masks(std::move(masks));
    step_ = step;
    sparsity_ = sparsity;
    agreed_ = true;
  }

 private:
  template <class T, class Sync, class Weights>
  std::vector<mask_type> broadcast_masks(Sync& sync, Weights&& weights, double s) {
    auto& comm = sync.get_communicator();
    std::vector<std::byte> blob;
    std::string failure;
    if (comm.rank() == 0) {
      try {
        for (const auto& m :
             policy_.compute(sync.layout(), std::span<const T>(weights()), s, prunable_)) {
          const auto bytes = serialize(m);
          detail::put_u64(blob, bytes.size());
          blob.insert(blob.end(), bytes.begin(), bytes.end());
        }
      } catch (const std::exception& e) {
        failure = detail::strip_prefix(e.what());
      }
    }
    // Size first (all ones: rank 0 failed, its message follows), then the masks.
    std::uint64_t size = failure.empty() ? blob.size() : ~0ULL;
    comm.broadcast(std::span<std::uint64_t>(&size, 1), 0);
    if (size == ~0ULL) {
      PACTRAIN_FAIL("pruner: rank 0 could not compute the masks: " +
                    detail::broadcast_text(comm, 0, failure));
    }
    blob.resize(static_cast<std::size_t>(size));
    comm.broadcast(std::span<std::byte>(blob), 0);
    std::vector<mask_type> masks;
    std::size_t at = 0;
    while (at < blob.size()) {
      const auto len = static_cast<std::size_t>(detail::get_u64(blob, at));
      masks.push_back(
          deserialize<mask_type>(std::span<const std::byte>(blob).subspan(at + 8, len)));
      at += 8 + len;
    }
    return masks;
  }

  static void parse(const param_layout& layout, std::span<const std::byte> in,
                    std::vector<mask_type>& masks, std::uint64_t& step, double& sparsity) {
    const std::string what = "checkpoint rejected: ";
    constexpr std::size_t header = 48;
    PACTRAIN_EXPECTS(in.size() >= header + 8, what + "truncated");
    PACTRAIN_EXPECTS(std::memcmp(in.data(), "PTRNCKPT", 8) == 0, what + "bad magic");
    const std::uint32_t version = detail::get_u32(in, 8);
    PACTRAIN_EXPECTS(version == checkpoint_format_version,
                     what + "unsupported format version " + std::to_string(version));
    const std::size_t body = in.size() - 8;
    PACTRAIN_EXPECTS(detail::get_u64(in, body) == detail::checksum(in.first(body)),
                     what + "checksum mismatch (corrupt or truncated)");
    const std::uint32_t reserved = detail::get_u32(in, 12);
    PACTRAIN_EXPECTS(reserved == 0,
                     what + "reserved field " + std::to_string(reserved) + " where 0 was expected");
    PACTRAIN_EXPECTS(detail::get_u64(in, 16) == layout.digest(),
                     what +
                         "it does not fit the layout (layout digest differs: other tensors, "
                         "shapes or bucketing)");
    step = detail::get_u64(in, 24);
    sparsity = std::bit_cast<double>(detail::get_u64(in, 32));
    PACTRAIN_EXPECTS(sparsity >= 0.0 && sparsity <= 1.0, what + "sparsity out of range");
    const std::uint64_t count = detail::get_u64(in, 40);
    PACTRAIN_EXPECTS(count == layout.tensor_count(), what + std::to_string(count) + " masks for " +
                                                         std::to_string(layout.tensor_count()) +
                                                         " tensors");
    std::size_t at = header;
    masks.clear();
    for (std::uint64_t i = 0; i < count; ++i) {
      PACTRAIN_EXPECTS(body - at >= 8, what + "truncated mask list");
      const std::uint64_t len = detail::get_u64(in, at);
      at += 8;
      PACTRAIN_EXPECTS(len <= body - at, what + "truncated mask list");
      masks.push_back(deserialize<mask_type>(in.subspan(at, static_cast<std::size_t>(len))));
      PACTRAIN_EXPECTS(masks.back().size() == layout.tensor(i).size,
                       what + "mask of tensor '" + layout.tensor(i).name + "' has the wrong size");
      at += static_cast<std::size_t>(len);
    }
    PACTRAIN_EXPECTS(at == body, what + "trailing bytes");
  }

  // Collective: every rank's verdict, and its settings, position and masks, in one agreement
  // round; throws the same pactrain::error on every rank unless all agree.
  template <class Sync>
  void agree_position(Sync& sync, std::uint64_t step, double sparsity,
                      std::span<const std::uint64_t> mask_digests, std::string failure,
                      const char* op) const {
    digest_builder d(0x7072756e);  // "prun"
    d.add(static_cast<std::uint64_t>(source_))
        .add(step)
        .add(std::bit_cast<std::uint64_t>(sparsity));
    for (const bool p : prunable_) d.add(std::uint64_t{p});
    if constexpr (requires { schedule_.digest(); }) d.add(schedule_.digest());
    detail::agreement_input in;
    in.layout = &sync.layout();
    in.operation = op;
    in.config_name = "pruner steps, schedules, mask sources or prunable flags";
    in.config_digest = d.value();
    in.mask_digests = mask_digests;
    in.local_error = std::move(failure);
    detail::agree(sync.get_communicator(), in);
  }

  Policy policy_;
  Schedule schedule_;
  std::vector<bool> prunable_;
  mask_source source_;
  std::uint64_t step_ = 0;
  double sparsity_ = 0.0;
  bool agreed_ = false;  // settings and position checked across ranks
};

/// One flag per tensor: true for tensors with a matrix shape (weights), false for 1-D ones
/// (biases, norms) — the usual choice of what to prune.
inline std::vector<bool> matrix_tensors(const param_layout& layout) {
  std::vector<bool> v;
  v.reserve(layout.tensor_count());
  for (const auto& t : layout.tensors()) v.push_back(t.rows > 0);
  return v;
}

}  // namespace pactrain
