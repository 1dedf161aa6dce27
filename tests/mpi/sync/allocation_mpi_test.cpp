// A steady-state step allocates nothing: this executable replaces the global operator new with
// one that counts while a step runs, and every engine configuration must count 0 once warmed
// up (three steps after a commit). Commits (set_masks, set_strategies) and the steps right after
// them may allocate; they are not counted.
//
// Counting operator new sees every allocation of pactrain and the standard library (std::vector,
// std::string, huge_vector). Open MPI is C and allocates with malloc, which is not counted, so
// the count is pactrain's own. Every rank checks its own count. Under AddressSanitizer these
// functions take the place of its operator new; it still checks the memory through malloc and
// free.
#include <doctest/doctest.h>

#include <pactrain/mpi.hpp>
#include <pactrain/pactrain.hpp>

#include "common/mpi_helpers.hpp"
#include "common/test_data.hpp"

#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <iterator>
#include <limits>
#include <new>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace {

std::atomic<bool> counting{false};
std::atomic<std::size_t> allocations{0};

void* allocate(std::size_t n, std::size_t align) noexcept {
  if (counting.load(std::memory_order_relaxed)) {
    allocations.fetch_add(1, std::memory_order_relaxed);
  }
  if (n == 0) n = 1;
  if (align <= alignof(std::max_align_t)) return std::malloc(n);
  return std::aligned_alloc(align, (n + align - 1) / align * align);
}

void* allocate_or_throw(std::size_t n, std::size_t align) {
  void* p = allocate(n, align);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}

}  // namespace

// The replaced global allocation functions: every form, so that each pair matches.
void* operator new(std::size_t n) { return allocate_or_throw(n, 0); }
void* operator new[](std::size_t n) { return allocate_or_throw(n, 0); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept { return allocate(n, 0); }
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept { return allocate(n, 0); }
void* operator new(std::size_t n, std::align_val_t a) {
  return allocate_or_throw(n, static_cast<std::size_t>(a));
}
void* operator new[](std::size_t n, std::align_val_t a) {
  return allocate_or_throw(n, static_cast<std::size_t>(a));
}
void* operator new(std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  return allocate(n, static_cast<std::size_t>(a));
}
void* operator new[](std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  return allocate(n, static_cast<std::size_t>(a));
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }

using namespace pactrain;

namespace {

// Counting is on from construction to destruction (also when unwinding).
class counted_scope {
 public:
  counted_scope() noexcept {
    allocations = 0;
    counting = true;
  }
  counted_scope(const counted_scope&) = delete;
  counted_scope& operator=(const counted_scope&) = delete;
  ~counted_scope() { counting = false; }
};

template <class F>
std::size_t allocations_in(F&& f) {
  {
    counted_scope c;
    f();
  }
  return allocations.load();
}

// 24 tensors in 16 buckets: even buckets hold one tensor, odd ones two (so that per-tensor
// spans, which do not lie back to back, send dense buckets through the dense workspace).
// The densities give every plan format, fully pruned tensors and fully kept ones.
constexpr std::size_t bucket_entries = 640;
constexpr std::size_t bucket_count = 16;
constexpr double tensor_densities[] = {1.0, 0.5, 0.0,  0.02, 0.9, 0.3, 1.0,  0.05,
                                       1.0, 0.7, 0.01, 0.5,  0.0, 0.0, 0.25, 0.99,
                                       0.1, 1.0, 0.6,  0.4,  0.8, 0.5, 0.03, 1.0};

param_layout sixteen_buckets() {
  param_layout l(bucket_entries);
  for (std::size_t b = 0; b < bucket_count; ++b) {
    const std::string name = "layer" + std::to_string(b);
    if (b % 2 == 0) {
      l.add(name + ".weight", 20, bucket_entries / 20);
    } else {
      l.add(name + ".weight", 10, bucket_entries / 20).add(name + ".bias", bucket_entries / 2);
    }
  }
  return l;
}

template <class Mask>
std::vector<Mask> mixed_masks(const param_layout& l) {
  std::vector<Mask> m;
  for (std::size_t i = 0; i < l.tensor_count(); ++i) {
    const auto bm = test::random_mask(l.tensor(i).size, tensor_densities[i], 7 + i);
    m.push_back(mask_cast<Mask>(bm));
  }
  return m;
}

// How a step is driven.
enum class drive { flat, pointer, tensors, phases_flat, phases_tensors };
constexpr drive drives[] = {drive::flat, drive::pointer, drive::tensors, drive::phases_flat,
                            drive::phases_tensors};

const char* to_string(drive d) {
  switch (d) {
    case drive::flat: return "allreduce(flat span)";
    case drive::pointer: return "allreduce(pointer, size)";
    case drive::tensors: return "allreduce(per-tensor spans)";
    case drive::phases_flat: return "begin_step(flat)/submit_bucket/finish_step";
    case drive::phases_tensors: return "begin_step(per-tensor spans)/submit_bucket/finish_step";
  }
  return "?";
}

// The gradient buffers of a run, allocated before anything is counted: one flat buffer, and
// one buffer per tensor (not back to back, so dense buckets go through the dense workspace).
struct gradients {
  explicit gradients(const param_layout& l) : flat(l.total_size()) {
    for (const auto& t : l.tensors()) separate.emplace_back(t.size);
    for (auto& v : separate) spans.emplace_back(v);
  }
  void fill(std::uint64_t step) {
    const auto r = static_cast<std::uint64_t>(test::world_rank());
    for (std::size_t i = 0; i < flat.size(); ++i) flat[i] = test::value<float>(step, r, i);
    for (std::size_t t = 0; t < separate.size(); ++t) {
      for (std::size_t i = 0; i < separate[t].size(); ++i) {
        separate[t][i] = test::value<float>(step, r + 100 * t, i);
      }
    }
  }
  void poison() {
    std::fill(flat.begin(), flat.end(), std::numeric_limits<float>::infinity());
    for (auto& v : separate) std::fill(v.begin(), v.end(), std::numeric_limits<float>::infinity());
  }
  std::vector<float> flat;
  std::vector<std::vector<float>> separate;
  std::vector<std::span<float>> spans;
};

template <class Sync>
void run_step(Sync& s, drive d, gradients& g) {
  const std::size_t nb = s.layout().buckets().size();
  switch (d) {
    case drive::flat: s.allreduce(std::span<float>(g.flat)); break;
    case drive::pointer: s.allreduce(g.flat.data(), g.flat.size()); break;
    case drive::tensors: s.allreduce(std::span<const std::span<float>>(g.spans)); break;
    case drive::phases_flat:
    case drive::phases_tensors:
      if (d == drive::phases_flat) {
        s.begin_step(std::span<float>(g.flat));
      } else {
        s.begin_step(std::span<const std::span<float>>(g.spans));
      }
      // Every other bucket, last first, as a backward pass would; finish_step sends the rest.
      for (std::size_t b = nb; b-- > 0;) {
        if (b % 2 == 1) s.submit_bucket(b);
      }
      s.finish_step();
      break;
  }
}

std::vector<std::pair<const char*, std::vector<bucket_strategy>>> strategy_sets(
    std::size_t buckets) {
  std::vector<std::pair<const char*, std::vector<bucket_strategy>>> v;
  v.emplace_back("sparse", std::vector<bucket_strategy>(buckets, bucket_strategy::sparse));
  v.emplace_back("dense", std::vector<bucket_strategy>(buckets, bucket_strategy::dense));
  v.emplace_back("sparse_plain",
                 std::vector<bucket_strategy>(buckets, bucket_strategy::sparse_plain));
  v.emplace_back("dense_plain",
                 std::vector<bucket_strategy>(buckets, bucket_strategy::dense_plain));
  std::vector<bucket_strategy> mixed;
  const bucket_strategy cycle[] = {bucket_strategy::sparse, bucket_strategy::dense,
                                   bucket_strategy::sparse_plain, bucket_strategy::dense_plain};
  for (std::size_t b = 0; b < buckets; ++b) mixed.push_back(cycle[b % 4]);
  v.emplace_back("mixed", std::move(mixed));
  return v;
}

constexpr int warmup_steps = 3;
constexpr int counted_steps = 3;

// Every strategy set and every way of driving a step: after the warm-up, each counted step
// must allocate nothing.
template <class Mask, class Codec>
void check_steady_state(const char* config, Codec codec = {}, sync_options opt = {}) {
  const auto l = sixteen_buckets();
  REQUIRE(l.buckets().size() == bucket_count);
  REQUIRE(l.tensor_count() == std::size(tensor_densities));
  pactrain::sync<mpi_communicator, Codec, Mask> s{mpi_communicator{MPI_COMM_WORLD}, l,
                                                  std::move(codec), opt};
  s.set_masks(mixed_masks<Mask>(l));
  gradients g(l);
  std::uint64_t seed = 1;
  for (const auto& [name, strategies] : strategy_sets(l.buckets().size())) {
    s.set_strategies(strategies);
    for (const drive d : drives) {
      for (int k = 0; k < warmup_steps; ++k) {
        g.fill(seed++);
        run_step(s, d, g);
      }
      std::size_t worst = 0;
      std::size_t collectives = 0;
      for (int k = 0; k < counted_steps; ++k) {
        g.fill(seed++);
        worst = std::max(worst, allocations_in([&] { run_step(s, d, g); }));
        collectives += s.stats().collectives;
      }
      // A step that Inf reaches allocates nothing either.
      g.fill(seed++);
      g.poison();
      worst = std::max(worst, allocations_in([&] { run_step(s, d, g); }));
      CHECK(s.stats().nonfinite_buckets > 0);
      CHECK_MESSAGE(worst == 0, std::string(config) << ", " << std::string(name) << ", "
                                                    << std::string(to_string(d)) << ": " << worst
                                                    << " allocations in a steady-state step");
      CHECK(collectives > 0);
    }
  }
}

}  // namespace

float* volatile escaped_floats = nullptr;  // keeps the allocations below from being elided
char* volatile escaped_chars = nullptr;

TEST_CASE("the counting operator new counts") {
  const std::size_t n = allocations_in([] {
    std::vector<float> v(10);
    std::string s(100, 'x');
    escaped_floats = v.data();
    escaped_chars = s.data();
  });
  CHECK(n == 2);
}

TEST_CASE("a collective keeps the requests of two chunks inline; more chunks go to the heap") {
  // mpi_communicator splits a buffer into chunks of 2^30 elements; small chunks stand in here.
  mpi_communicator comm{MPI_COMM_WORLD};
  const int p = test::world_size();
  for (const std::size_t chunk :
       {std::size_t{10}, std::size_t{5}, std::size_t{3}, std::size_t{1}}) {
    CAPTURE(chunk);
    const std::size_t chunks = (10 + chunk - 1) / chunk;
    std::vector<std::int64_t> v(10);
    for (std::size_t i = 0; i < v.size(); ++i) {
      v[i] = static_cast<std::int64_t>(i) + 100 * test::world_rank();
    }
    detail::mpi_requests started;
    const std::size_t n = allocations_in([&] {
      detail::mpi_iallreduce_chunks(v.data(), v.size(), MPI_INT64_T, MPI_SUM, comm.native(), chunk,
                                    started);
    });
    CHECK(started.size() == static_cast<int>(chunks));
    CHECK((n == 0) == (chunks <= detail::mpi_requests::inline_capacity));
    detail::mpi_requests moved(std::move(started));
    CHECK(started.empty());
    CHECK(moved.size() == static_cast<int>(chunks));
    CHECK(MPI_Waitall(moved.size(), moved.data(), MPI_STATUSES_IGNORE) == MPI_SUCCESS);
    std::size_t bad = 0;
    for (std::size_t i = 0; i < v.size(); ++i) {
      bad += v[i] != static_cast<std::int64_t>(i) * p + 100 * p * (p - 1) / 2;
    }
    CHECK(bad == 0);
  }
  // One chunk through the communicator: no allocation from start to wait.
  std::vector<float> f(64, 1.0f);
  const std::size_t n = allocations_in([&] {
    auto req = comm.allreduce_async(std::span<float>(f), reduce_op::sum);
    auto moved = std::move(req);
    (void)moved.test();
    moved.wait();
  });
  CHECK(n == 0);
  CHECK(f[63] == static_cast<float>(p));
}

TEST_CASE_TEMPLATE("steady-state steps allocate nothing", Mask, bitmap_mask, index_mask) {
  check_steady_state<Mask, identity_codec<float>>("identity");
  check_steady_state<Mask, fp16_codec>("fp16");
  check_steady_state<Mask, error_feedback<fp16_codec>>("fp16 + error_feedback");
  check_steady_state<Mask, ternary_codec>("ternary", ternary_codec{{.seed = 3}});
  check_steady_state<Mask, error_feedback<ternary_codec>>("ternary + error_feedback",
                                                          ternary_codec{{.seed = 3}});
  check_steady_state<Mask, error_feedback<ternary_codec>>(
      "ternary previous_max + error_feedback",
      ternary_codec{{.seed = 3, .scale = scale_source::previous_max}});
  check_steady_state<Mask, identity_codec<float>>("identity, checked steps", {}, {.checked = true});
  check_steady_state<Mask, error_feedback<ternary_codec>>(
      "ternary + error_feedback, checked steps", ternary_codec{{.seed = 3}}, {.checked = true});
}
