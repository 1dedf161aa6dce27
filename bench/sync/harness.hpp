// The sync benchmark's harness, shared by its methods: the run's options, the gradient buffers
// and their exactly summable values, the synthetic layout, and the interface every method
// implements. Each method has a file of its own: pactrain's here (engine.cpp, auto.cpp), the
// baselines' in bench/baselines/ (dense.cpp, fp16.cpp, topk.cpp), which bench/e2e's trainers
// use too; harness.cpp parses the command line, times the methods and prints their rows.
#pragma once

#include <pactrain/mpi.hpp>
#include <pactrain/pactrain.hpp>

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace sync_bench {

using clock_type = std::chrono::steady_clock;

inline double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

struct options {
  std::size_t bytes = 0;
  double density = -1;
  std::vector<std::string> methods;  // timed side by side, one sync each in turn
  int iters = 10;
  int warmup = 2;
  std::size_t tensor = std::size_t{1} << 22;
  std::uint64_t seed = 1;
  std::string netdev;
  bool verify = false;
  bool csv = false;
  bool huge_pages = true;
};

/// --pages: where the gradient buffers live. Set once, before any gradient is allocated.
inline bool gradients_on_huge_pages = true;

/// The gradient buffers' allocator: pactrain::huge_page_allocator, or std::allocator with
/// --pages small.
template <class T>
struct gradient_allocator {
  using value_type = T;
  gradient_allocator() noexcept = default;
  template <class U>
  gradient_allocator(const gradient_allocator<U>&) noexcept {}  // NOLINT: rebinding
  T* allocate(std::size_t n) {
    return gradients_on_huge_pages ? pactrain::huge_page_allocator<T>{}.allocate(n)
                                   : std::allocator<T>{}.allocate(n);
  }
  void deallocate(T* p, std::size_t n) noexcept {
    if (gradients_on_huge_pages) {
      pactrain::huge_page_allocator<T>{}.deallocate(p, n);
    } else {
      std::allocator<T>{}.deallocate(p, n);
    }
  }
  template <class U>
  bool operator==(const gradient_allocator<U>&) const noexcept {
    return true;
  }
};
using gradient = std::vector<float, gradient_allocator<float>>;

// Deterministic gradient values from (seed, rank, index): multiples of 2^-20 in [-1, 1), so
// sums over up to 8 ranks are exact in float whatever the order.
inline float grad_value(std::uint64_t seed, int rank, std::size_t i) {
  std::uint64_t x = seed * 0x9e3779b97f4a7c15ull +
                    static_cast<std::uint64_t>(rank) * 0xbf58476d1ce4e5b9ull +
                    static_cast<std::uint64_t>(i);
  x ^= x >> 31;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 29;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 32;
  const auto m = static_cast<std::int64_t>(x >> 43);  // 21 bits
  return static_cast<float>(m - (std::int64_t{1} << 20)) * 0x1p-20f;
}

inline void fill_gradient(std::span<float> g, std::uint64_t seed, int rank) {
  for (std::size_t i = 0; i < g.size(); ++i) g[i] = grad_value(seed, rank, i);
}

inline pactrain::param_layout make_layout(std::size_t n, std::size_t tensor) {
  pactrain::param_layout l;
  std::size_t at = 0;
  for (int t = 0; at < n; ++t) {
    const std::size_t size = std::min(tensor, n - at);
    std::string name = std::to_string(t);
    name.insert(name.begin(), 't');  // not "t" + ...: g++ 12 warns falsely (-Wrestrict)
    l.add(std::move(name), size);
    at += size;
  }
  // One bucket per tensor: compaction of one overlaps the allreduce of the previous.
  l.set_bucket_capacity(std::max<std::size_t>(tensor, 1));
  return l;
}

/// The planner's calibration for this run: local work timed at the size of one bucket (one
/// tensor) and at the run's density, as the engine will do it.
inline pactrain::calibration_options calibration(const options& o) {
  return {.compact_entries = std::max<std::size_t>(o.tensor, 1),
          .compact_density = o.density > 0 && o.density <= 1 ? o.density : 0.1};
}

inline void check_mpi(int rc, const char* what) {
  if (rc != MPI_SUCCESS) throw std::runtime_error(std::string(what) + " failed");
}

/// The dense baselines' collective: in-place MPI_Iallreduce and MPI_Wait over `count` entries
/// of `type`, in chunks that fit an int. Nonblocking like the engine's, so that both run the
/// same algorithm: on 2 ranks the blocking call ran at half the link's rate back to back,
/// whatever its algorithm (bench/netbed/README.md), and a baseline is measured at its best.
inline void allreduce_in_place(void* data, std::size_t count, std::size_t element_bytes,
                               MPI_Datatype type, MPI_Op op, MPI_Comm comm) {
  constexpr std::size_t chunk = std::size_t{1} << 30;
  auto* bytes = static_cast<char*>(data);
  for (std::size_t at = 0; at < count; at += chunk) {
    const int c = static_cast<int>(std::min(chunk, count - at));
    MPI_Request request = MPI_REQUEST_NULL;
    check_mpi(MPI_Iallreduce(MPI_IN_PLACE, bytes + at * element_bytes, c, type, op, comm, &request),
              "MPI_Iallreduce");
    check_mpi(MPI_Wait(&request, MPI_STATUS_IGNORE), "MPI_Wait");
  }
}

/// What a method's collective runs: an algorithm's name ("ring", "binomial", ...; "allgather"
/// for a method without an allreduce), and whether the MPI settings forced it.
struct collective_choice {
  std::string algorithm;
  bool forced = false;
};

/// One method: sync(g) averages g across ranks in place and returns the seconds of local
/// work it did.
class method {
 public:
  virtual ~method() = default;
  virtual double sync(std::span<float> g) = 0;
  [[nodiscard]] virtual std::size_t bytes_sent() const = 0;
  /// The expected result of the first sync, from every rank's gradient.
  virtual std::vector<float> reference(const options& o, int ranks) = 0;
  /// Largest allowed |result - reference|.
  [[nodiscard]] virtual double tolerance(int) const { return 0.0; }
  /// Seconds of the last sync's local work that grow with the number of ranks.
  [[nodiscard]] virtual double rank_dependent_seconds() const { return 0.0; }
  /// The engine's bucket methods, e.g. "sparse:24 dense_plain:1" (empty for baselines).
  [[nodiscard]] virtual std::string plan() const { return {}; }
  /// auto: the planner's predicted seconds per sync; negative for the fixed methods.
  [[nodiscard]] virtual double predicted_seconds() const { return -1.0; }
  /// The algorithm the MPI library runs for this method's data collective on `ranks` ranks,
  /// from `c` (pactrain::mpi_allreduce_algorithms()), and whether an MCA setting forced it.
  /// This default is pactrain's engine and the dense baselines: an in-place MPI_Iallreduce.
  [[nodiscard]] virtual collective_choice collective(const pactrain::mpi_allreduce_config& c,
                                                     int ranks) const {
    return {pactrain::to_string(c.nonblocking(bytes_sent() / sizeof(float), sizeof(float), ranks)),
            c.readable && c.nonblocking_forced != 0};
  }
};

/// The dense average of every rank's first gradient: the reference of the dense methods.
inline std::vector<float> dense_average(const options& o, std::size_t n, int ranks) {
  std::vector<float> sum(n, 0.0f), g(n);
  for (int r = 0; r < ranks; ++r) {
    fill_gradient(g, o.seed, r);
    for (std::size_t i = 0; i < n; ++i) sum[i] += g[i];
  }
  const float scale = 1.0f / static_cast<float>(ranks);
  for (auto& v : sum) v *= scale;
  return sum;
}

/// What a method is built from: the run's communicator and options, the gradient's entries and
/// this rank's gradient (auto times its candidates on it).
struct method_args {
  MPI_Comm comm;
  const options& o;
  std::size_t n;
  const gradient& base;
};

/// Collective: builds a method. One per method file.
std::unique_ptr<method> make_dense(const method_args& a);                   // baselines/dense.cpp
std::unique_ptr<method> make_fp16(const method_args& a);                    // baselines/fp16.cpp
std::unique_ptr<method> make_sparse(const method_args& a);                  // engine.cpp
std::unique_ptr<method> make_sparse_fp16(const method_args& a);             // engine.cpp
std::unique_ptr<method> make_sparse_ternary(const method_args& a);          // engine.cpp
std::unique_ptr<method> make_auto(const method_args& a);                    // auto.cpp
std::unique_ptr<method> make_sparse_checked(const method_args& a);          // engine.cpp
std::unique_ptr<method> make_sparse_ternary_checked(const method_args& a);  // engine.cpp
std::unique_ptr<method> make_topk(const method_args& a);                    // baselines/topk.cpp

}  // namespace sync_bench
