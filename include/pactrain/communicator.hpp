// Communicators: the collectives the sync engine needs, over a handle the user owns.
#pragma once

#include <pactrain/error.hpp>
#include <pactrain/half.hpp>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>

namespace pactrain {

/// Elementwise reductions of allreduce.
enum class reduce_op { sum, max, min };

/// Element types the communicators transfer. Sums, maxima and minima of half and bfloat16
/// are formed in float and rounded back once per pairwise combine (see mpi_communicator).
template <class T>
concept wire_value =
    std::same_as<T, float> || std::same_as<T, double> || std::same_as<T, std::int32_t> ||
    std::same_as<T, std::uint32_t> || std::same_as<T, std::int64_t> ||
    std::same_as<T, std::uint64_t> || std::same_as<T, std::byte> || half_value<T>;

/// A group of ranks; every member calls the same collectives, with the same sizes, in the same
/// order. allreduce is in place; allreduce_async's request completes on wait(), and `data` stays
/// alive and untouched until then. Failures throw pactrain::communication_error. A
/// communicator of device gradients also declares `static constexpr memory_space memory =
/// memory_space::device` (concepts.hpp), which picks sync's default compactor.
template <class C>
concept communicator = std::movable<C> &&
    requires(C& c, const C& cc, std::span<float> f, std::span<double> d, std::span<std::uint64_t> u,
             std::span<std::uint32_t> w, std::span<std::byte> b, typename C::request_type& r) {
  { cc.rank() } -> std::convertible_to<int>;
  { cc.size() } -> std::convertible_to<int>;
  c.allreduce(f, reduce_op::sum);
  c.allreduce(d, reduce_op::sum);
  c.allreduce(u, reduce_op::max);
  c.allreduce(w, reduce_op::sum);
  c.broadcast(b, 0);
  { c.allreduce_async(f, reduce_op::sum) } -> std::same_as<typename C::request_type>;
  { c.allreduce_async(d, reduce_op::sum) } -> std::same_as<typename C::request_type>;
  r.wait();
};

/// A communicator of one rank: every collective is the identity. For unit tests and for
/// running a data-parallel program on a single worker without MPI.
class loopback_communicator {
 public:
  class request_type {
   public:
    void wait() noexcept {}
    [[nodiscard]] bool test() noexcept { return true; }
  };

  [[nodiscard]] int rank() const noexcept { return 0; }
  [[nodiscard]] int size() const noexcept { return 1; }

  template <wire_value T>
  void allreduce(std::span<T> data, reduce_op) const {
    check(data.data(), data.size());
  }
  template <wire_value T>
  request_type allreduce_async(std::span<T> data, reduce_op op) const {
    allreduce(data, op);
    return {};
  }
  template <wire_value T>
  void broadcast(std::span<T> data, int root) const {
    check(data.data(), data.size());
    PACTRAIN_EXPECTS(root == 0, "loopback_communicator: broadcast root must be 0");
  }

 private:
  static void check(const void* p, std::size_t n) {
    PACTRAIN_EXPECTS(p != nullptr || n == 0, "loopback_communicator: null buffer");
  }
};

static_assert(communicator<loopback_communicator>);

}  // namespace pactrain
