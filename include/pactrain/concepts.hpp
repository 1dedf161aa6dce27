// pactrain's vocabulary: where buffers live, the gradient value types, and the concepts the
// components meet. Codecs, pruning, the cost model and the adapters include this header, not
// the components (so none of them pulls in the compactor's kernels). The mask concept
// (gradient_mask) is in mask.hpp, the communicator concept in communicator.hpp, the codec
// concepts in codec.hpp; this header includes the first two.
#pragma once

#include <pactrain/communicator.hpp>
#include <pactrain/layout.hpp>
#include <pactrain/mask.hpp>
#include <pactrain/strategy.hpp>
#include <pactrain/sync_options.hpp>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

namespace pactrain {

/// Where a component's buffers live.
enum class memory_space { host, device };

class host_compactor;
template <class Exec>
class basic_device_compactor;
namespace detail {
struct cuda_exec;

/// Where the gradients a communicator reduces live: what it declares as `memory` (the CUDA
/// communicators say memory_space::device), host memory otherwise.
template <class Comm>
constexpr memory_space gradient_memory() {
  if constexpr (requires { Comm::memory; }) {
    return Comm::memory;
  } else {
    return memory_space::host;
  }
}
}  // namespace detail

/// The compactor of sync<Comm> unless one is named: host_compactor, or cuda_compactor
/// (<pactrain/cuda/sync.cuh>) for a communicator of device gradients.
template <class Comm>
struct default_compactor {
  using type = std::conditional_t<detail::gradient_memory<Comm>() == memory_space::device,
                                  basic_device_compactor<detail::cuda_exec>, host_compactor>;
};

/// Value types the compactors handle.
template <class T>
concept gradient_value = std::same_as<T, float> || std::same_as<T, double>;

/// C compacts T gradients under Mask, with both buffers in C::memory: make_plan(mask) gives a
/// plan_type with size() and count(); gather(plan, dense, payload): payload[k] = dense[k-th kept
/// index]; scatter(plan, payload, dense, factor): dense[i] = factor * payload[rank(i)] or +0.
template <class C, class Mask, class T>
concept compactor_for = gradient_mask<Mask> &&
    requires(const C& c, const Mask& m, const typename C::plan_type& p, std::span<const T> in,
             std::span<T> out, T factor) {
  { C::memory } -> std::convertible_to<memory_space>;
  { c.make_plan(m) } -> std::same_as<typename C::plan_type>;
  { p.size() } -> std::same_as<std::size_t>;
  { p.count() } -> std::same_as<std::size_t>;
  c.gather(p, in, out);
  c.scatter(p, in, out, factor);
};

/// A fused optimizer step (sync::finish_step(update)) over gradients of T: it takes a sparse
/// bucket's tensor as its kept entries' payload and factor, a dense bucket's tensor whole, and
/// is told when every tensor is in. sgd::fused and device_sgd_update make one.
template <class U, class T>
concept fused_update = requires(U& u, std::span<const T> values, T factor, std::size_t tensor) {
  u.kept(tensor, values, factor);
  u.dense(tensor, values);
  u.done();
};

/// What the pruner, the strategy tuner and the LibTorch adapter need of a sync engine
/// (pactrain::sync, on host or device buffers): its layout and committed masks, the collective
/// calls that change them, the three-phase step, its communicator, statistics and step counter.
template <class S>
concept sync_engine = gradient_mask<typename S::mask_type> &&
    communicator<typename S::communicator_type> &&
    requires(S& s, const S& cs, std::vector<typename S::mask_type> masks,
             std::vector<bucket_strategy> strategies, std::string reason,
             std::span<typename S::value_type> grads, std::size_t bucket) {
  s.begin_step(grads);
  s.submit_bucket(bucket);
  s.finish_step();
  { cs.step_open() } -> std::same_as<bool>;
  { cs.layout() } -> std::same_as<const param_layout&>;
  { cs.masks() } -> std::same_as<const std::vector<typename S::mask_type>&>;
  { cs.strategies() } -> std::same_as<const std::vector<bucket_strategy>&>;
  s.set_masks(std::move(masks));
  s.set_strategies(std::move(strategies));
  s.reject_masks(std::move(reason));
  { s.get_communicator() } -> std::same_as<typename S::communicator_type&>;
  { cs.stats() } -> std::same_as<const sync_stats&>;
  { cs.step() } -> std::same_as<std::uint64_t>;
};

}  // namespace pactrain
