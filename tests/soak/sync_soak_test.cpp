// Soak test of the sync engine on 4 ranks: thousands of steps with random layouts, masks
// (densities from 0 to 1, tensor sizes that are not multiples of 64), bucket strategies,
// codecs, buffer forms and submission orders, all drawn from one seed that every rank shares.
// Every step is compared with a reference the test computes itself, never through the engine:
//   - identity and fp16 (on data exact in fp16), and the plain buckets of any codec: a dense
//     MPI_Allreduce of the masked gradients, bit for bit;
//   - ternary with error feedback: every rank's codec input gathered, encoded with the public
//     ternary_codec under each rank's context with simulated residuals, the wire words summed
//     and decoded, bit for bit.
// Each step also checks this rank's residuals, the step counter, the bytes sent and the
// collectives issued. Now and then a new engine resumes from the running one's save_state.
//
//   mpiexec -n 4 build/tests/soak/sync_soak_test
//   PACTRAIN_SOAK_SEED=<n> PACTRAIN_SOAK_STEPS=<n> (rank 0's values) for another seed or length.
//
// Every rank makes the same random choices and the same collectives; the first failing
// episode on any rank ends the run.
#include <doctest/doctest.h>

#include <pactrain/mpi.hpp>
#include <pactrain/pactrain.hpp>

#include "common/mpi_helpers.hpp"
#include "common/test_data.hpp"

#include <mpi.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <numeric>
#include <span>
#include <string>
#include <utility>
#include <vector>

using namespace pactrain;

namespace {

using test::world_rank;
using test::world_size;

// --- shared random choices ------------------------------------------------------------------

// A counter through splitmix64: the same stream on every rank that starts from the same seed.
// The counter starts at a hash of the seed, so that neighbouring seeds give unrelated streams.
class shared_random {
 public:
  explicit shared_random(std::uint64_t seed) : state_(test::mix(seed)) {}
  std::uint64_t next() { return test::mix(state_++); }
  std::size_t below(std::size_t n) { return static_cast<std::size_t>(next() % n); }
  double unit() { return static_cast<double>(next() >> 11) * 0x1p-53; }
  bool chance(double p) { return unit() < p; }

 private:
  std::uint64_t state_;
};

struct soak_settings {
  std::uint64_t seed = 1;
  std::uint64_t steps = 20000;
};

// Rank 0's environment, so that every rank runs the same soak however mpiexec passes it on.
soak_settings settings() {
  soak_settings s;
  unsigned long long v[2] = {s.seed, s.steps};
  if (world_rank() == 0) {
    if (const char* e = std::getenv("PACTRAIN_SOAK_SEED")) v[0] = std::strtoull(e, nullptr, 0);
    if (const char* e = std::getenv("PACTRAIN_SOAK_STEPS")) v[1] = std::strtoull(e, nullptr, 0);
  }
  MPI_Bcast(v, 2, MPI_UNSIGNED_LONG_LONG, 0, MPI_COMM_WORLD);
  return {v[0], v[1]};
}

// --- random configurations ------------------------------------------------------------------

// 1 to 8 tensors, mostly of sizes that are not multiples of 64 (empty ones too), in buckets of
// one tensor each, a few, or one bucket.
param_layout random_layout(shared_random& rnd) {
  constexpr std::size_t capacities[] = {1, 300, 1000, 3000, std::size_t{1} << 20};
  param_layout l(capacities[rnd.below(std::size(capacities))]);
  const std::size_t tensors = 1 + rnd.below(8);
  for (std::size_t i = 0; i < tensors; ++i) {
    const std::size_t n =
        rnd.chance(0.5) ? test::sizes[rnd.below(std::size(test::sizes))] : 1 + rnd.below(1500);
    l.add("t" + std::to_string(i), n);
  }
  return l;
}

// One mask per tensor: none kept, all kept, a random density, nearly none or nearly all (the
// bitmap, indices and runs plan formats), or runs of random length.
std::vector<bitmap_mask> random_masks(const param_layout& l, shared_random& rnd) {
  std::vector<bitmap_mask> masks;
  for (const auto& t : l.tensors()) {
    const std::uint64_t seed = rnd.next();
    const double densities[] = {0.0, 1.0, rnd.unit(), 0.02, 0.98};
    const std::size_t pattern = rnd.below(std::size(densities) + 1);
    if (pattern < std::size(densities)) {
      masks.push_back(test::random_mask(t.size, densities[pattern], seed));
    } else {
      const std::size_t run = 8 + rnd.below(200);
      masks.push_back(bitmap_mask::from_predicate(
          t.size, [&](std::size_t j) { return (test::mix(seed + j / run) & 1) != 0; }));
    }
  }
  return masks;
}

constexpr bucket_strategy all_strategies[] = {bucket_strategy::sparse, bucket_strategy::dense,
                                              bucket_strategy::sparse_plain,
                                              bucket_strategy::dense_plain};

// One strategy for every bucket, or each bucket its own.
std::vector<bucket_strategy> random_strategies(std::size_t buckets, shared_random& rnd) {
  std::vector<bucket_strategy> st(buckets, all_strategies[rnd.below(4)]);
  if (rnd.chance(0.6)) {
    for (auto& s : st) s = all_strategies[rnd.below(4)];
  }
  return st;
}

// The engine's mask type, built from the kept entries (not through mask_cast).
template <class Mask>
std::vector<Mask> engine_masks(const std::vector<bitmap_mask>& masks) {
  if constexpr (std::is_same_v<Mask, bitmap_mask>) {
    return masks;
  } else {
    std::vector<Mask> out;
    for (const auto& m : masks) {
      std::vector<std::uint64_t> kept;
      for (std::size_t j = 0; j < m.size(); ++j) {
        if (m.test(j)) kept.push_back(j);
      }
      out.emplace_back(m.size(), std::move(kept));
    }
    return out;
  }
}

// Every value is m / 8 with |m| <= 255, or that times 2^-12 (down to fp16's subnormals): all
// partial sums over 4 ranks are exact in fp16 and in float, whatever the order.
enum class flavour { mixed, zero, one_rank, tiny, same };
constexpr const char* flavour_names[] = {"mixed", "zero", "one_rank", "tiny", "same"};

std::vector<float> gradient(std::size_t n, flavour f, std::uint64_t seed, int only_rank) {
  const int r = world_rank();
  switch (f) {
    case flavour::zero: return std::vector<float>(n, 0.0f);
    case flavour::one_rank:
      return r == only_rank ? test::small_values(n, seed, 0, 255) : std::vector<float>(n, 0.0f);
    case flavour::tiny: {
      auto g = test::small_values(n, seed, static_cast<std::uint64_t>(r), 255);
      for (auto& v : g) v *= 0x1p-12f;
      return g;
    }
    case flavour::same: return test::small_values(n, seed, 0, 255);
    case flavour::mixed: break;
  }
  return test::small_values(n, seed, static_cast<std::uint64_t>(r), 255);
}

// How a step hands the gradients over.
enum class form { flat, pointer, tensors, phases_flat, phases_tensors };
constexpr const char* form_names[] = {"allreduce(span)", "allreduce(pointer, size)",
                                      "allreduce(tensor spans)", "three calls, flat",
                                      "three calls, tensor spans"};

struct step_plan {
  form how = form::flat;
  std::vector<std::size_t> submitted;  // three calls: buckets submitted one by one, in order
};

step_plan random_plan(std::size_t buckets, shared_random& rnd) {
  step_plan p;
  p.how = static_cast<form>(rnd.below(5));
  if (p.how == form::phases_flat || p.how == form::phases_tensors) {
    std::vector<std::size_t> order(buckets);
    std::iota(order.begin(), order.end(), std::size_t{0});
    for (std::size_t i = buckets; i > 1; --i) std::swap(order[i - 1], order[rnd.below(i)]);
    const double share[] = {0.0, 0.5, 1.0};
    const double keep = share[rnd.below(3)];
    for (const auto b : order) {
      if (rnd.chance(keep)) p.submitted.push_back(b);
    }
  }
  return p;
}

// --- the reference --------------------------------------------------------------------------

enum class codec_kind { identity, fp16, ternary };

// Ternary wire words for n values on p ranks: lanes of bit_width(2p) bits, 32 / bits a word.
std::size_t ternary_words(std::size_t n, int p) {
  const std::size_t lanes = 32 / std::bit_width(2 * static_cast<unsigned>(p));
  return (n + lanes - 1) / lanes;
}

// What the test knows of an engine's configuration, and the state of its reference.
struct model {
  model(const param_layout& layout, codec_kind k, ternary_codec t)
      : l(layout), kind(k), ternary(t) {}

  const param_layout& l;
  codec_kind kind;
  ternary_codec ternary;
  int p = world_size();
  std::vector<std::uint8_t> keep;  // flat, from the committed masks
  std::vector<bucket_strategy> strategies;
  std::uint64_t step = 0;
  std::uint64_t steps_done = 0;
  bool fresh = true;                                      // no step since the last commit
  std::vector<std::vector<std::vector<float>>> residual;  // ternary: [rank][bucket]
  std::vector<float> previous_scale;                      // ternary: [bucket]

  // A commit: residuals restart at zero and previous_max has no scales.
  void commit(const std::vector<bitmap_mask>& masks, std::vector<bucket_strategy> st) {
    keep.assign(l.total_size(), 0);
    for (std::size_t i = 0; i < l.tensor_count(); ++i) {
      const auto& t = l.tensor(i);
      for (std::size_t j = 0; j < t.size; ++j) keep[t.offset + j] = masks[i].test(j);
    }
    strategies = std::move(st);
    fresh = true;
    residual.assign(p, std::vector<std::vector<float>>(l.buckets().size()));
    previous_scale.assign(l.buckets().size(), 0.0f);
  }

  [[nodiscard]] bool coded(std::size_t b) const {
    return kind != codec_kind::identity && !is_plain(strategies[b]);
  }

  // Bucket b's codec input from one rank's flat gradient: the kept entries in layout order
  // (sparse), or every entry with the pruned ones zeroed (dense).
  [[nodiscard]] std::vector<float> input(std::span<const float> g, std::size_t b) const {
    const auto& bk = l.buckets()[b];
    const bool sparse = is_sparse(strategies[b]);
    std::vector<float> in;
    for (std::size_t i = bk.offset; i < bk.offset + bk.size; ++i) {
      if (keep[i] != 0 || !sparse) in.push_back(keep[i] != 0 ? g[i] : 0.0f);
    }
    return in;
  }

  [[nodiscard]] std::size_t input_size(std::size_t b) const {
    const auto& bk = l.buckets()[b];
    if (!is_sparse(strategies[b])) return bk.size;
    return static_cast<std::size_t>(
        std::count(keep.begin() + static_cast<std::ptrdiff_t>(bk.offset),
                   keep.begin() + static_cast<std::ptrdiff_t>(bk.offset + bk.size), 1));
  }

  // This step's result on this rank. `all` holds every rank's gradient, rank after rank;
  // `mean` is the dense MPI_Allreduce of the masked gradients times 1/P, which is the result
  // of every bucket but the ternary-coded ones.
  [[nodiscard]] std::vector<float> expect(std::span<const float> all, std::vector<float> mean) {
    if (kind != codec_kind::ternary) return mean;
    for (std::size_t b = 0; b < l.buckets().size(); ++b) {
      if (coded(b)) simulate_ternary(all, b, mean);
    }
    return mean;
  }

  // Every rank's encoding of bucket b with its residuals, the wire words summed and decoded.
  void simulate_ternary(std::span<const float> all, std::size_t b, std::vector<float>& out) {
    const std::size_t n = l.total_size();
    std::vector<std::vector<float>> in(p);
    float mx = 0;  // the scale: MAX over ranks of max |g| of the fresh codec input
    for (int r = 0; r < p; ++r) {
      in[r] = input(all.subspan(r * n, n), b);
      for (const float v : in[r]) mx = std::max(mx, std::fabs(v));
    }
    const float scale = ternary.scale_from_previous_step() && !fresh ? previous_scale[b] : mx;
    previous_scale[b] = mx;
    const std::size_t m = in[0].size();
    if (m == 0) return;  // nothing kept: `out` holds +0 there already
    std::vector<std::uint32_t> sum(ternary_words(m, p), 0);
    std::vector<std::uint32_t> wire(sum.size());
    std::vector<float> local(m);
    for (int r = 0; r < p; ++r) {
      auto& res = residual[r][b];
      res.resize(m, 0.0f);
      std::vector<float> x(m);
      for (std::size_t k = 0; k < m; ++k) x[k] = in[r][k] + res[k];
      const codec_context c{.rank = r, .size = p, .step = step, .bucket = b, .scale = scale};
      ternary.encode(x, std::span<std::uint32_t>(wire), c);
      ternary.decode_local(wire, std::span<float>(local), c);
      for (std::size_t k = 0; k < m; ++k) res[k] = x[k] - local[k];
      for (std::size_t w = 0; w < wire.size(); ++w) sum[w] += wire[w];
    }
    std::vector<float> mean(m);
    ternary.decode(sum, std::span<float>(mean),
                   {.rank = world_rank(), .size = p, .step = step, .bucket = b, .scale = scale});
    const auto& bk = l.buckets()[b];
    const bool sparse = is_sparse(strategies[b]);
    std::size_t k = 0;
    for (std::size_t i = bk.offset; i < bk.offset + bk.size; ++i) {
      out[i] = keep[i] != 0 ? mean[k] : 0.0f;
      k += keep[i] != 0 || !sparse;
    }
  }

  // This rank's residuals as the engine lays them out: the codec inputs of the coded buckets,
  // bucket after bucket. fp16 on data exact in fp16 leaves every residual +0.
  [[nodiscard]] std::vector<float> residuals() const {
    std::vector<float> r;
    if (kind == codec_kind::identity) return r;
    for (std::size_t b = 0; b < l.buckets().size(); ++b) {
      if (!coded(b)) continue;
      const std::size_t m = input_size(b);
      const auto& mine = residual[world_rank()][b];
      for (std::size_t k = 0; k < m; ++k) r.push_back(kind == codec_kind::ternary ? mine[k] : 0.0f);
    }
    return r;
  }

  struct traffic {
    std::size_t bytes = 0;
    std::size_t collectives = 0;
  };

  // What the strategies imply: each bucket with input sends its entries as floats (plain, or
  // the identity codec), halves (fp16) or ternary words, and ternary adds its scale rounds.
  [[nodiscard]] traffic expected_traffic(const step_plan& plan) const {
    traffic t;
    std::size_t scaled = 0;            // ternary-coded buckets with input
    std::size_t scaled_submitted = 0;  // of those, submitted one by one
    for (std::size_t b = 0; b < l.buckets().size(); ++b) {
      const std::size_t m = input_size(b);
      if (m == 0) continue;
      ++t.collectives;
      if (!coded(b)) {
        t.bytes += m * sizeof(float);
      } else if (kind == codec_kind::fp16) {
        t.bytes += m * sizeof(half);
      } else {
        t.bytes += ternary_words(m, p) * sizeof(std::uint32_t);
        ++scaled;
        scaled_submitted += std::count(plan.submitted.begin(), plan.submitted.end(), b);
      }
    }
    if (kind == codec_kind::ternary && scaled != 0) {
      if (ternary.scale_from_previous_step() && !fresh) {
        // Last step's scales; this step's maxima of every bucket in one round beside the data.
        t.bytes += 8 * l.buckets().size();
        t.collectives += 1;
      } else {
        // One word per scaled bucket: a round per submitted one, one round for the rest.
        t.bytes += 8 * scaled;
        t.collectives += scaled_submitted + (scaled > scaled_submitted ? 1 : 0);
      }
    }
    return t;
  }

  void finish_step() {
    ++step;
    ++steps_done;
    fresh = false;
  }
};

// --- checks ---------------------------------------------------------------------------------

// The engine configurations an episode picks from (the last with either scale source).
constexpr const char* engine_names[] = {"identity, bitmap_mask",
                                        "identity, index_mask",
                                        "fp16 + error_feedback",
                                        "ternary + error_feedback, current_max",
                                        "ternary + error_feedback, previous_max",
                                        "ternary + error_feedback, index_mask"};

struct tally {
  std::uint64_t steps = 0;
  std::uint64_t checks = 0;
  std::uint64_t failures = 0;
  std::uint64_t episodes = 0;
  std::uint64_t engine_steps[std::size(engine_names)] = {};
};

constexpr std::size_t npos = static_cast<std::size_t>(-1);

// The first entry where a and b differ in their bits (or in length), or npos.
std::size_t first_difference(std::span<const float> a, std::span<const float> b) {
  for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    if (std::bit_cast<std::uint32_t>(a[i]) != std::bit_cast<std::uint32_t>(b[i])) return i;
  }
  return a.size() == b.size() ? npos : std::min(a.size(), b.size());
}

// Counts a check; reports the first few failures of this rank in full.
template <class Describe>
void check(tally& t, bool ok, Describe&& describe) {
  ++t.checks;
  if (ok) return;
  if (++t.failures <= 8) FAIL_CHECK(describe());
}

std::string describe_entry(const char* what, std::span<const float> got,
                           std::span<const float> want, std::size_t i) {
  std::string s = std::string(what) + " differs at entry " + std::to_string(i);
  if (i < got.size() && i < want.size()) {
    s += ": " + std::to_string(got[i]) + " (bits " +
         std::to_string(std::bit_cast<std::uint32_t>(got[i])) + "), reference " +
         std::to_string(want[i]) + " (bits " +
         std::to_string(std::bit_cast<std::uint32_t>(want[i])) + ")";
  } else {
    s += ": " + std::to_string(got.size()) + " entries, reference " + std::to_string(want.size());
  }
  return s;
}

// --- one episode: an engine over a random layout, stepped and reconfigured at random -------

// Runs one step of `s` on `g` (in place) as the plan says.
template <class Sync>
void run_step(Sync& s, const param_layout& l, std::vector<float>& g, const step_plan& plan) {
  std::vector<std::vector<float>> parts;
  std::vector<std::span<float>> views;
  const bool by_tensor = plan.how == form::tensors || plan.how == form::phases_tensors;
  if (by_tensor) {
    // Separate buffers, so that dense buckets of several tensors go through the workspace.
    for (const auto& t : l.tensors()) {
      parts.emplace_back(g.begin() + static_cast<std::ptrdiff_t>(t.offset),
                         g.begin() + static_cast<std::ptrdiff_t>(t.offset + t.size));
    }
    for (auto& p : parts) views.emplace_back(p);
  }
  const std::span<const std::span<float>> tensors(views);
  switch (plan.how) {
    case form::flat: s.allreduce(std::span<float>(g)); break;
    case form::pointer: s.allreduce(g.data(), g.size()); break;
    case form::tensors: s.allreduce(tensors); break;
    case form::phases_flat:
    case form::phases_tensors:
      if (by_tensor) {
        s.begin_step(tensors);
      } else {
        s.begin_step(std::span<float>(g));
      }
      for (const auto b : plan.submitted) s.submit_bucket(b);
      s.finish_step();
      break;
  }
  for (std::size_t i = 0; i < parts.size(); ++i) {
    std::copy(parts[i].begin(), parts[i].end(),
              g.begin() + static_cast<std::ptrdiff_t>(l.tensor(i).offset));
  }
}

struct episode_spec {
  std::size_t engine;  // index into engine_names
  const char* name;
  std::uint64_t number;
  std::uint64_t seed;  // the run's
  std::size_t steps;
};

template <class Sync>
void run_episode(const episode_spec& e, codec_kind kind, typename Sync::codec_type codec,
                 shared_random& rnd, tally& t) {
  const param_layout l = random_layout(rnd);
  const std::size_t nb = l.buckets().size();
  const int p = world_size();
  const std::size_t n = l.total_size();
  ternary_codec ternary;
  if constexpr (std::is_same_v<base_codec_t<typename Sync::codec_type>, ternary_codec>)
    ternary = codec;
  model m(l, kind, ternary);

  const bucket_strategy first = all_strategies[rnd.below(4)];
  auto current = std::make_unique<Sync>(mpi_communicator{MPI_COMM_WORLD}, l, codec,
                                        sync_options{.strategy = first});
  std::vector<bitmap_mask> masks;
  for (const auto& tn : l.tensors()) masks.push_back(bitmap_mask::full(tn.size));
  m.commit(masks, std::vector<bucket_strategy>(nb, first));
  if (rnd.chance(0.3)) {  // a resumed run's step counter, up to 2^64 - 1
    m.step = rnd.next() >> rnd.below(64);
    current->set_step(m.step);
  }

  for (std::size_t k = 0; k < e.steps; ++k) {
    if (rnd.chance(0.03)) {
      // A resume from a checkpoint: a new engine takes over the state (step counter,
      // residuals, previous_max's scales) and must continue bit for bit.
      const auto state = current->save_state();
      auto next = std::make_unique<Sync>(mpi_communicator{MPI_COMM_WORLD}, l, codec);
      next->set_masks(engine_masks<typename Sync::mask_type>(masks));
      next->set_strategies(m.strategies);
      next->load_state(state);
      current = std::move(next);
      m.steps_done = 0;
    }
    Sync& s = *current;
    // Masks and strategies change every few steps (a commit with the same ones counts too).
    if (rnd.chance(0.25)) {
      if (rnd.chance(0.9)) masks = random_masks(l, rnd);
      s.set_masks(engine_masks<typename Sync::mask_type>(masks));
      m.commit(masks, m.strategies);
    }
    if (rnd.chance(0.2)) {
      auto st = random_strategies(nb, rnd);
      s.set_strategies(st);
      m.commit(masks, std::move(st));
    }
    const auto f = static_cast<flavour>(rnd.below(5));
    const std::uint64_t data_seed = rnd.next();
    const int only_rank = static_cast<int>(rnd.below(static_cast<std::size_t>(p)));
    const step_plan plan = random_plan(nb, rnd);

    auto g = gradient(n, f, data_seed, only_rank);
    // The reference, from every rank's gradient.
    std::vector<float> mean(n);
    for (std::size_t i = 0; i < n; ++i) mean[i] = m.keep[i] != 0 ? g[i] : 0.0f;
    MPI_Allreduce(MPI_IN_PLACE, mean.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM,
                  MPI_COMM_WORLD);
    for (auto& v : mean) v *= 1.0f / static_cast<float>(p);
    std::vector<float> all;
    if (kind == codec_kind::ternary) {
      all.resize(n * static_cast<std::size_t>(p));
      MPI_Allgather(g.data(), static_cast<int>(n), MPI_FLOAT, all.data(), static_cast<int>(n),
                    MPI_FLOAT, MPI_COMM_WORLD);
    }
    const auto traffic = m.expected_traffic(plan);
    const auto want = m.expect(all, std::move(mean));
    const std::uint64_t step = m.step;

    run_step(s, l, g, plan);
    m.finish_step();

    const auto where = [&] {
      std::string st;
      for (const auto x : m.strategies) st += std::string(st.empty() ? "" : " ") + to_string(x);
      return "seed " + std::to_string(e.seed) + ", episode " + std::to_string(e.number) + " (" +
             e.name + "), step " + std::to_string(k) + " (counter " + std::to_string(step) + "), " +
             form_names[static_cast<int>(plan.how)] + ", " + flavour_names[static_cast<int>(f)] +
             " data, " + std::to_string(nb) + " buckets [" + st + "]: ";
    };
    const std::size_t bad = first_difference(g, want);
    check(t, bad == npos, [&] { return where() + describe_entry("result", g, want, bad); });
    const auto want_res = m.residuals();
    const std::size_t bad_res = first_difference(s.residuals(), want_res);
    check(t, bad_res == npos,
          [&] { return where() + describe_entry("residual", s.residuals(), want_res, bad_res); });
    check(t, s.step() == m.step, [&] {
      return where() + "step counter " + std::to_string(s.step()) + ", expected " +
             std::to_string(m.step);
    });
    check(t, !s.step_open() && s.stats().steps == m.steps_done, [&] {
      return where() + "stats().steps " + std::to_string(s.stats().steps) + ", expected " +
             std::to_string(m.steps_done);
    });
    check(t, s.stats().bytes_sent == traffic.bytes, [&] {
      return where() + "bytes_sent " + std::to_string(s.stats().bytes_sent) + ", expected " +
             std::to_string(traffic.bytes);
    });
    check(t, s.stats().collectives == traffic.collectives, [&] {
      return where() + "collectives " + std::to_string(s.stats().collectives) + ", expected " +
             std::to_string(traffic.collectives);
    });
    check(t, s.stats().dense_bytes == n * sizeof(float),
          [&] { return where() + "dense_bytes " + std::to_string(s.stats().dense_bytes); });
    ++t.steps;
    ++t.engine_steps[e.engine];
  }
}

template <class Mask, class Codec = identity_codec<float>>
using engine = pactrain::sync<mpi_communicator, Codec, Mask>;

}  // namespace

TEST_CASE("soak: random steps of every engine configuration against independent references") {
  const soak_settings cfg = settings();
  shared_random rnd(cfg.seed);
  tally t;
  const double start = MPI_Wtime();
  while (t.steps < cfg.steps) {
    episode_spec e{
        rnd.below(std::size(engine_names)), "", t.episodes, cfg.seed,
        static_cast<std::size_t>(std::min<std::uint64_t>(cfg.steps - t.steps, 10 + rnd.below(40)))};
    e.name = engine_names[e.engine];
    const auto source = [&](std::size_t which) {
      return ternary_codec{
          {.seed = rnd.next(),
           .scale = which == 0 ? scale_source::current_max : scale_source::previous_max}};
    };
    switch (e.engine) {
      case 0: run_episode<engine<bitmap_mask>>(e, codec_kind::identity, {}, rnd, t); break;
      case 1: run_episode<engine<index_mask>>(e, codec_kind::identity, {}, rnd, t); break;
      case 2:
        run_episode<engine<bitmap_mask, error_feedback<fp16_codec>>>(e, codec_kind::fp16, {}, rnd,
                                                                     t);
        break;
      case 3:
      case 4:
        run_episode<engine<bitmap_mask, error_feedback<ternary_codec>>>(
            e, codec_kind::ternary, source(e.engine - 3), rnd, t);
        break;
      default:
        run_episode<engine<index_mask, error_feedback<ternary_codec>>>(
            e, codec_kind::ternary, source(rnd.below(2)), rnd, t);
        break;
    }
    ++t.episodes;
    // The first failing episode on any rank ends the run on every rank.
    int failed = t.failures != 0 ? 1 : 0;
    MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (failed != 0) break;
  }
  CHECK(t.failures == 0);

  unsigned long long totals[2] = {t.checks, t.failures};
  MPI_Allreduce(MPI_IN_PLACE, totals, 2, MPI_UNSIGNED_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
  if (world_rank() == 0) {
    std::string by_engine;
    for (std::size_t i = 0; i < std::size(engine_names); ++i) {
      by_engine += std::string(i == 0 ? "" : "; ") + engine_names[i] + " " +
                   std::to_string(t.engine_steps[i]);
    }
    std::printf(
        "[soak] %d ranks, seed %llu: %llu steps in %llu episodes (%s), %llu of %llu checks "
        "passed on all ranks, %.1f s\n",
        world_size(), static_cast<unsigned long long>(cfg.seed),
        static_cast<unsigned long long>(t.steps), static_cast<unsigned long long>(t.episodes),
        by_engine.c_str(), totals[0] - totals[1], totals[0], MPI_Wtime() - start);
    std::fflush(stdout);
  }
}
