// What the fuzz targets share: the input convention, checks that stop the run, mask
// invariants, the seed writer, and the fixed engine setups the state and checkpoint targets
// load into.
//
// Every input is one control byte, then the bytes for the library. Bit 7 of the control byte
// asks the target to seal the bytes first: append their checksum and put in the digest the
// engine expects, so that mutations reach the checks behind the checksum. Bits 0-1 pick a mask
// type where a target has a choice.
#pragma once

#include <pactrain/pactrain.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace pactrain::fuzz {

using bytes = std::vector<std::byte>;

inline constexpr unsigned sealed_bit = 0x80;

/// Masks the mask targets check densely (runs, digests, casts to a bitmap) have at most this
/// many entries; deserialize is asked to refuse more.
inline constexpr std::size_t dense_limit = std::size_t{1} << 20;

struct input {
  bool sealed = false;
  unsigned choice = 0;  // bits 0-1 of the control byte
  bytes data;
};

inline input split(const std::uint8_t* p, std::size_t n) {
  input in;
  if (n == 0) return in;
  in.sealed = (p[0] & sealed_bit) != 0;
  in.choice = p[0] & 3u;
  in.data.resize(n - 1);
  for (std::size_t k = 1; k < n; ++k) in.data[k - 1] = static_cast<std::byte>(p[k]);
  return in;
}

/// Stops the run: libFuzzer reports a crash and keeps the input.
[[noreturn]] inline void fail(const char* what) {
  std::fprintf(stderr, "fuzz check failed: %s\n", what);
  std::abort();
}
inline void expect(bool ok, const char* what) {
  if (!ok) fail(what);
}
template <class F>
void expect_error(F&& f, const char* what) {
  try {
    f();
  } catch (const error&) {
    return;
  }
  fail(what);
}

inline void put_at(bytes& b, std::size_t at, std::uint64_t v) {
  for (int k = 0; k < 8; ++k) b[at + k] = static_cast<std::byte>((v >> (8 * k)) & 0xff);
}
inline void append_checksum(bytes& b) { detail::put_u64(b, detail::checksum(b)); }

/// A seed the target reads as it is, and one it seals: `blob`'s checksum is left out, since
/// the target puts it in (with the digests it expects).
inline bytes raw_seed(unsigned choice, std::span<const std::byte> blob) {
  bytes s{static_cast<std::byte>(choice)};
  s.insert(s.end(), blob.begin(), blob.end());
  return s;
}
inline bytes sealed_seed(unsigned choice, std::span<const std::byte> blob) {
  return raw_seed(sealed_bit | choice, blob.first(blob.size() - 8));
}

using named_seed = std::pair<std::string, bytes>;

/// With PACTRAIN_FUZZ_WRITE_SEEDS=<dir> in the environment, writes the target's seeds there and
/// exits; the committed corpus under tests/fuzz/corpus/ is this output.
template <class Seeds>
void write_seeds_if_asked(Seeds&& seeds) {
  const char* dir = std::getenv("PACTRAIN_FUZZ_WRITE_SEEDS");
  if (dir == nullptr) return;
  for (const auto& [name, b] : seeds()) {
    std::ofstream f(std::string(dir) + "/" + name, std::ios::binary);
    f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
    expect(f.good(), "cannot write a seed");
  }
  std::exit(0);
}

/// libFuzzer's two entry points: `seeds()` gives the named seeds, `run(fuzz::input&)` takes one
/// input; anything but a pactrain::error escaping it is a crash.
#define PACTRAIN_FUZZ_TARGET(seeds, run)                                              \
  extern "C" int LLVMFuzzerInitialize(int*, char***) {                                \
    ::pactrain::fuzz::write_seeds_if_asked(seeds);                                    \
    return 0;                                                                         \
  }                                                                                   \
  extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) { \
    auto in = ::pactrain::fuzz::split(data, size);                                    \
    run(in);                                                                          \
    return 0;                                                                         \
  }

// --- masks --------------------------------------------------------------------------------------

/// The mask types of the mask targets, by index 0-3.
template <class F>
void with_mask_type(unsigned choice, F&& f) {
  switch (choice & 3u) {
    case 0: f(std::type_identity<bitmap_mask>{}); break;
    case 1: f(std::type_identity<index_mask>{}); break;
    case 2: f(std::type_identity<block_mask<4>>{}); break;
    default: f(std::type_identity<block_mask<64>>{}); break;
  }
}

/// The mask targets' input: serialized bytes, sealed by appending their checksum, read as the
/// mask type the choice picks: read(std::type_identity<Mask>{}, bytes).
template <class F>
void read_as_chosen_mask(input& in, F&& read) {
  if (in.sealed) append_checksum(in.data);
  with_mask_type(in.choice, [&](auto type) { read(type, std::as_const(in.data)); });
}

template <class Mask>
std::vector<std::pair<std::size_t, std::size_t>> runs_of(const Mask& m) {
  std::vector<std::pair<std::size_t, std::size_t>> r;
  m.for_each_run([&](std::size_t b, std::size_t len) { r.emplace_back(b, len); });
  return r;
}

/// What every mask promises: runs in increasing order, maximal, nonempty and inside the
/// mask, adding up to count(), and test() agreeing at their edges.
template <class Mask>
void check_invariants(const Mask& m) {
  std::size_t kept = 0;
  std::size_t end = 0;
  bool first = true;
  for (const auto& [b, len] : runs_of(m)) {
    expect(len > 0 && b <= m.size() && len <= m.size() - b, "a run inside the mask");
    expect(first || b > end, "runs in increasing order, apart");
    expect(m.test(b) && m.test(b + len - 1), "test() true on a run");
    expect(b == 0 || !m.test(b - 1), "test() false before a run");
    expect(!m.test(b + len), "test() false after a run");
    kept += len;
    end = b + len;
    first = false;
  }
  expect(kept == m.count(), "count() is the length of the runs");
  expect(!m.test(m.size()), "test() false past the end");
}

// --- the engines the state and checkpoint targets load into -------------------------------------

/// Three tensors in buckets of 64 entries: 96, 8 and 40 entries.
inline param_layout fixed_layout() {
  param_layout l(64);
  l.add("w", 8, 12).add("b", 8).add("v", 40);
  return l;
}

/// A gradient or weight vector of dyadic values, different per `seed`.
inline std::vector<float> values(std::size_t n, std::uint64_t seed) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint64_t h = detail::splitmix64(seed * 1000003u + i);
    v[i] = static_cast<float>(static_cast<std::int64_t>(h % 2001) - 1000) / 8.0f;
  }
  return v;
}

/// Every third entry pruned, shifted by the tensor.
inline std::vector<bitmap_mask> fixed_masks(const param_layout& l) {
  std::vector<bitmap_mask> m;
  for (std::size_t t = 0; t < l.tensor_count(); ++t) {
    m.push_back(bitmap_mask::from_predicate(l.tensor(t).size,
                                            [t](std::size_t i) { return (i + t) % 3 != 0; }));
  }
  return m;
}

/// Ternary with error feedback and the previous step's scales: a state with a step, residuals
/// and scales. The first bucket sparse, the rest dense.
using state_engine = pactrain::sync<loopback_communicator, error_feedback<ternary_codec>>;

inline state_engine make_state_engine(std::vector<bitmap_mask> masks, std::uint64_t steps) {
  const auto l = fixed_layout();
  state_engine e{loopback_communicator{}, l,
                 ternary_codec{{.seed = 7, .scale = scale_source::previous_max}}};
  e.set_masks(std::move(masks));
  std::vector<bucket_strategy> st(l.buckets().size(), bucket_strategy::dense);
  st.front() = bucket_strategy::sparse;
  e.set_strategies(st);
  for (std::uint64_t k = 0; k < steps; ++k) {
    auto g = values(l.total_size(), k);
    e.allreduce(std::span<float>(g));
  }
  return e;
}

/// A plain engine and a gradual magnitude pruner of its weight matrix.
using checkpoint_engine = pactrain::sync<loopback_communicator>;
using checkpoint_pruner = pruner<magnitude_pruning, gradual_schedule>;

inline checkpoint_pruner make_pruner() {
  return checkpoint_pruner{{},
                           gradual_schedule{.final_sparsity = 0.75, .interval = 2, .updates = 3},
                           matrix_tensors(fixed_layout())};
}

/// Runs `steps` steps of the pruner on fixed weights.
inline void prune_steps(checkpoint_engine& e, checkpoint_pruner& p, std::uint64_t steps) {
  const auto w = values(e.layout().total_size(), 11);
  for (std::uint64_t k = 0; k < steps; ++k) p.step(e, std::span<const float>(w));
}

}  // namespace pactrain::fuzz
