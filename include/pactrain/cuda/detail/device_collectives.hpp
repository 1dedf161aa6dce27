// How the device engine reduces its buckets through the communicator. Internal.
//
// A stream-ordered communicator (NCCL, MPI with device buffers) queues each collective on the
// step's stream. A host communicator, usable where device memory is host memory (Thrust's
// CPU systems), starts each bucket's sum nonblocking and the step waits for all of them in
// issue order, as the host engine does: Open MPI picks its algorithm by the call, so a
// blocking sum of the same bucket could differ in the last bit.
#pragma once

#include <pactrain/communicator.hpp>
#include <pactrain/sync_options.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

namespace pactrain::detail {

/// Comm reduces Exec's device buffers of T in stream order: after
/// allreduce_async(span, op, stream) returns, work queued later on the stream sees the result.
template <class Comm, class Exec, class T>
concept stream_ordered_for = requires(Comm& c, std::span<T> d, typename Exec::stream_type s) {
  c.allreduce_async(d, reduce_op::sum, Exec::native(s));
};

template <class Comm, class Exec, bool StreamOrdered>
class device_collectives {
 public:
  using stream_type = typename Exec::stream_type;

  device_collectives() = default;
  /// Room for one collective in flight per bucket. May throw.
  explicit device_collectives(std::size_t buckets) {
    if constexpr (!StreamOrdered) requests_.resize(buckets);
  }

  /// Sums `region` across ranks in place: queued on `stream`, or started and completed by
  /// group(). An empty region sends nothing (region sizes follow the agreed masks, so every
  /// rank skips alike).
  template <class T>
  void sum(Comm& comm, std::span<T> region, stream_type stream, sync_stats& s) {
    if (region.empty()) return;
    if constexpr (StreamOrdered) {
      (void)comm.allreduce_async(region, reduce_op::sum, Exec::native(stream));
    } else {
      requests_[pending_++] = comm.allreduce_async(region, reduce_op::sum);
    }
    count(region, s);
  }

  /// One MAX round over `words`: queued on `stream`, or complete when this returns.
  void max(Comm& comm, std::span<std::uint64_t> words, stream_type stream, sync_stats& s) {
    if constexpr (StreamOrdered) {
      (void)comm.allreduce_async(words, reduce_op::max, Exec::native(stream));
    } else {
      comm.allreduce(words, reduce_op::max);
    }
    count(words, s);
  }

  /// Runs issue() (which calls sum) inside the communicator's group where it has one, then
  /// waits for every sum started. On an error, nothing stays in flight and the first error
  /// propagates.
  template <class F>
  void group(Comm& comm, F&& issue) {
    constexpr bool groups = requires(Comm & c) {
      c.group_start();
      c.group_end();
    };
    if constexpr (groups) comm.group_start();
    try {
      issue();
      if constexpr (!StreamOrdered) wait_all();
    } catch (...) {
      if constexpr (!StreamOrdered) {
        try {
          wait_all();    // the buffers must not change under a collective in flight
        } catch (...) {  // the first error is the one to report
        }
      }
      if constexpr (groups) {
        try {
          comm.group_end();
        } catch (...) {  // the first error is the one to report
        }
      }
      throw;
    }
    if constexpr (groups) comm.group_end();
  }

 private:
  template <class T>
  static void count(std::span<T> sent, sync_stats& s) noexcept {
    ++s.collectives;
    s.bytes_sent += sent.size_bytes();
  }

  // Completes the sums in flight, in issue order; each is waited for once even when one
  // throws.
  void wait_all() {
    const std::size_t n = std::exchange(pending_, 0);
    std::size_t k = 0;
    try {
      for (; k < n; ++k) requests_[k].wait();
    } catch (...) {
      for (++k; k < n; ++k) {
        try {
          requests_[k].wait();
        } catch (...) {  // the first error is the one to report
        }
      }
      throw;
    }
  }

  struct none {};
  std::conditional_t<StreamOrdered, none, std::vector<typename Comm::request_type>> requests_{};
  std::size_t pending_ = 0;
};

}  // namespace pactrain::detail
