// The host engine's open step: step_state, plus the caller's tensors, each bucket's region and
// request, and the dense workspace of buckets that cannot run in place.
#pragma once

#include <pactrain/detail/buffer_checks.hpp>
#include <pactrain/detail/sync/step_state.hpp>
#include <pactrain/huge_pages.hpp>
#include <pactrain/layout.hpp>
#include <pactrain/strategy.hpp>
#include <pactrain/sync_options.hpp>

#include <concepts>
#include <cstddef>
#include <span>
#include <vector>

namespace pactrain::detail {

template <class T, class Request>
class host_step : public step_state {
 public:
  static constexpr std::size_t npos = static_cast<std::size_t>(-1);

  /// The views of a flat buffer of every tensor. Throws, changing nothing, on a bad buffer.
  void set_views(const param_layout& layout, std::span<T> grads, const char* op) {
    check_closed(op);
    check_flat_grads(layout, grads, op);
    views_.clear();
    for (const auto& t : layout.tensors()) views_.push_back(grads.subspan(t.offset, t.size));
  }

  /// The views of one buffer per tensor. Throws, changing nothing, on a bad buffer.
  void set_views(const param_layout& layout, std::span<const std::span<T>> tensors,
                 const char* op) {
    check_closed(op);
    check_tensor_grads(layout, tensors, op);
    views_.assign(tensors.begin(), tensors.end());
  }

  /// Opens the step over the views set last. Every dense bucket that cannot run in place
  /// gets its own stretch of the dense workspace, whatever the order of submission.
  void begin(const param_layout& layout, std::span<const bucket_strategy> strategies,
             const sync_stats& stats) {
    const auto& buckets = layout.buckets();
    const std::size_t nb = buckets.size();
    dense_offset_.assign(nb, npos);
    in_place_.assign(nb, nullptr);
    std::size_t needed = 0;
    for (std::size_t b = 0; b < nb; ++b) {
      if (is_sparse(strategies[b]) || buckets[b].size == 0) continue;
      in_place_[b] =
          bucket_in_place<T>(layout, buckets[b], [&](std::size_t i) { return views_[i].data(); });
      if (in_place_[b] == nullptr) {
        dense_offset_[b] = needed;
        needed += buckets[b].size;
      }
    }
    if (dense_.size() < needed) dense_.resize(needed);
    requests_.clear();
    requests_.resize(nb);
    regions_.assign(nb, {});
    done_ = 0;
    step_state::begin(nb, stats);
  }

  /// Closes the step (completed or abandoned).
  void close() noexcept {
    requests_.clear();
    step_state::close();
  }

  // Nonblocking collectives of MPI progress only inside MPI calls (Open MPI's libnbc has no
  // progress thread): testing between buckets of local work keeps their messages moving. One
  // test drives every collective in flight, so only the oldest incomplete one (from position
  // `from` of the order on) is tested, and the ones before it are passed over for good: a
  // step with n buckets makes O(n) tests, not O(n^2).
  void progress(std::size_t from) {
    if constexpr (requires(Request & r) {
                    { r.test() } -> std::convertible_to<bool>;
                  }) {
      const auto& order = this->order();
      if (done_ < from) done_ = from;
      while (done_ < order.size() && requests_[order[done_]].test()) ++done_;
    }
  }

  /// Dense bucket b's entries in the caller's buffers when they lie back to back, else null.
  [[nodiscard]] T* in_place(std::size_t b) const { return in_place_[b]; }
  /// The stretch of the dense workspace of a dense bucket that is not in place.
  [[nodiscard]] std::span<T> dense_workspace(std::size_t b, std::size_t size) {
    return std::span<T>(dense_).subspan(dense_offset_[b], size);
  }

  [[nodiscard]] std::span<T> view(std::size_t tensor) const { return views_[tensor]; }
  void mark_submitted(std::size_t b, std::span<T> region) {
    regions_[b] = region;
    step_state::mark_submitted(b);
  }
  [[nodiscard]] std::span<T> region(std::size_t b) const { return regions_[b]; }
  Request& request(std::size_t b) { return requests_[b]; }

 private:
  std::vector<std::span<T>> views_;        // the step's tensors
  std::vector<std::span<T>> regions_;      // per bucket: what its collective covers
  std::vector<Request> requests_;          // per bucket
  std::size_t done_ = 0;                   // order()[0, done_) are complete or waited for
  std::vector<std::size_t> dense_offset_;  // per bucket: its stretch of dense_, or npos
  std::vector<T*> in_place_;               // per dense bucket: its region in place, or null
  huge_vector<T> dense_;                   // on huge pages: streamed every step
};

}  // namespace pactrain::detail
