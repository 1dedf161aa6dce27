// pactrain-sync-bench: time one gradient synchronisation across MPI ranks, for pactrain's
// compacted allreduce and the alternatives a user would otherwise pick.
//
// Build and run (from the repository root):
//   cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
//   cmake --build build --target pactrain_sync_bench
//   mpiexec -n 2 build/bench/pactrain-sync-bench --bytes 16M --density 0.1 --strategy sparse
//   bench/netbed/setup.sh 4 1gbit
//   bench/netbed/launch.sh build/bench/pactrain-sync-bench --bytes 100M --density 0.1 --strategy
//   topk --csv
//
// Options:
//   --bytes N        dense gradient bytes (float32; suffixes k M G = 10^3.., Ki Mi Gi = 2^10..)
//   --density D      kept fraction, 0 < D <= 1 (sparse, topk; reported for all)
//   --strategy S[,S...]  dense | sparse | topk | fp16 | sparse-fp16 | sparse-ternary | auto;
//                    several, comma-separated, are timed side by side in one run: all are
//                    set up first, then the timed syncs take turns (one sync of each, in the
//                    order given, per iteration), and each prints its own row
//   --iters N        timed synchronisations (default 10)
//   --warmup N       untimed synchronisations first (default 2)
//   --tensor N       entries per tensor of the synthetic layout (default 4Mi; one bucket each)
//   --seed N         gradient and mask seed (default 1)
//   --pages P        huge (default): the gradient buffers on transparent huge pages
//                    (pactrain::huge_page_allocator), as a trainer that streams 100 MB per
//                    step would allocate them; small: plain std::allocator (4 KiB pages
//                    under Debian's default "madvise" setting)
//   --netdev IF      count the bytes IF really transmitted (from /sys/class/net) per sync
//   --verify         check the first synchronisation's result against a reference; exit 1
//                    on a mismatch
//   --csv            print one CSV row (rank 0) instead of the readable summary
//   --csv-header     print the CSV header line and exit (no MPI needed)
//
// Strategies (what each rank sends per sync, n = dense entries, k = kept entries):
//   dense   one MPI_Allreduce (MPI_SUM, MPI_FLOAT, in place) of the whole gradient, then a
//           scale by 1/P: the plain dense baseline. It uses whatever allreduce algorithm Open
//           MPI is told to (the testbed launcher forces ring; the `allreduce` column says
//           which). 4n bytes handed to the collective.
//   sparse  pactrain::sync<bitmap_mask, host_compactor, mpi_communicator> with a random mask
//           of exactly k = round(D n) kept entries per tensor (random_pruning, the same seed on
//           every rank): compaction, one MPI_Iallreduce of k floats per bucket, expansion.
//           4k bytes.
//   topk    DGC-style Top-k: per rank, a = g + residual; select the k entries of largest |a|
//           (k the same as sparse's; the threshold is estimated on a 1% sample, then refined
//           exactly with std::nth_element over the candidates, ties broken by lower index);
//           MPI_Allgather of k (uint32 index, float value) pairs; accumulate every rank's pairs
//           into the dense result and scale by 1/P; error feedback: residual = a with the sent
//           entries zeroed. 8k bytes.
//   sparse-fp16     as sparse, the kept entries sent as IEEE half (pactrain::fp16_codec): 2k.
//   sparse-ternary  as sparse, the kept entries sent as ternary lanes with error feedback
//           (pactrain::ternary_codec, scale from a MAX allreduce per bucket): about k/2 bytes
//           at 4 ranks (8 lanes per 32-bit word), plus 8 bytes of scale per bucket.
//   auto    the planner and the tuner: pactrain::calibrate_link times two allreduces once;
//           then, for an engine with the fp16 codec and one with ternary lanes and error
//           feedback, pactrain::calibrate_local times compaction and the codec at the size of
//           one bucket and the run's density, and pactrain::candidate_strategies gives the plans
//           worth timing from that cost model (the planner's per-bucket choice, and every
//           bucket on one strategy). Those predicted within 3x of the best are timed by
//           pactrain::step_tuner, 3 syncs each in turn, and the fastest engine and plan are
//           kept (the readable summary lists them). The `plan` column names the codec and
//           the chosen strategies, `predicted_s` the planner's prediction for it (empty for
//           the fixed strategies).
//   fp16    as PyTorch's fp16_compress_hook: g / P rounded to IEEE half (round to nearest
//           even), one MPI_Allreduce of n 16-bit values with a user MPI_Op that adds two halves
//           in float and rounds the sum back to half (so every hop of the ring carries 2 bytes
//           per entry), then widened back to float. 2n bytes.
//
// Times: every timed sync starts after an MPI_Barrier; its time is the slowest rank's. The row
// gives the median, min and max over --iters. compute_s is the median (slowest rank) of the
// local work inside the sync: compaction and expansion for sparse, selection, packing and
// accumulation for topk, conversions for fp16, the scale for dense. compute_p_s is the part
// of it that grows with the number of ranks (topk's accumulation of P k pairs; 0 otherwise).
// wire_bytes (with --netdev) is the mean over ranks of what the interface transmitted per
// timed sync, headers and retransmissions included; bytes_sent is what a rank hands to the
// collective.
#include <pactrain/mpi.hpp>
#include <pactrain/pactrain.hpp>

#include <mpi.h>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define PACTRAIN_BENCH_X86 1
#endif

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace {

using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

constexpr const char* csv_header =
    "strategy,ranks,bytes,density,median_s,min_s,max_s,bytes_sent,wire_bytes,compute_s,"
    "compute_p_s,iters,allreduce,plan,predicted_s,pages";

struct options {
  std::size_t bytes = 0;
  double density = -1;
  std::vector<std::string> strategies;  // timed side by side, one sync each in turn
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
bool gradients_on_huge_pages = true;

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

struct usage_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::uint64_t parse_count(std::string_view opt, std::string_view s) {
  std::uint64_t mult = 1;
  std::string_view num = s;
  struct suffix {
    std::string_view text;
    std::uint64_t mult;
  };
  constexpr suffix suffixes[] = {{"Ki", 1ull << 10},  {"Mi", 1ull << 20}, {"Gi", 1ull << 30},
                                 {"k", 1000ull},      {"K", 1000ull},     {"M", 1000000ull},
                                 {"G", 1000000000ull}};
  for (const auto& sf : suffixes) {
    if (num.size() > sf.text.size() && num.ends_with(sf.text)) {
      mult = sf.mult;
      num.remove_suffix(sf.text.size());
      break;
    }
  }
  if (num.empty() || num.find_first_not_of("0123456789") != std::string_view::npos ||
      num.size() > 12) {
    throw usage_error(std::string(opt) + ": '" + std::string(s) +
                      "' is not a non-negative integer (with an optional k, M, G, Ki, Mi, Gi)");
  }
  return std::stoull(std::string(num)) * mult;
}

options parse(int argc, char** argv) {
  options o;
  auto value = [&](int& i) -> std::string_view {
    if (i + 1 >= argc) throw usage_error(std::string(argv[i]) + " needs a value");
    return argv[++i];
  };
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "--bytes") {
      o.bytes = parse_count(a, value(i));
    } else if (a == "--density") {
      const std::string v(value(i));
      char* end = nullptr;
      o.density = std::strtod(v.c_str(), &end);
      if (v.empty() || *end != '\0' || !(o.density > 0.0 && o.density <= 1.0)) {
        throw usage_error("--density: '" + v + "' is not a number in (0, 1]");
      }
    } else if (a == "--strategy") {
      constexpr std::string_view known[] = {"dense",       "sparse",         "topk", "fp16",
                                            "sparse-fp16", "sparse-ternary", "auto"};
      o.strategies.clear();
      std::string_view list = value(i);
      for (;;) {
        const std::size_t comma = list.find(',');
        const std::string name(list.substr(0, comma));
        if (std::find(std::begin(known), std::end(known), name) == std::end(known)) {
          throw usage_error(
              "--strategy: '" + name +
              "' is not dense, sparse, topk, fp16, sparse-fp16, sparse-ternary or auto");
        }
        if (std::find(o.strategies.begin(), o.strategies.end(), name) != o.strategies.end()) {
          throw usage_error("--strategy: '" + name + "' is listed twice");
        }
        o.strategies.push_back(name);
        if (comma == std::string_view::npos) break;
        list.remove_prefix(comma + 1);
      }
    } else if (a == "--iters") {
      const auto n = parse_count(a, value(i));
      if (n < 1 || n > 1000000) throw usage_error("--iters: must be in 1..1000000");
      o.iters = static_cast<int>(n);
    } else if (a == "--warmup") {
      const auto n = parse_count(a, value(i));
      if (n > 1000000) throw usage_error("--warmup: must be in 0..1000000");
      o.warmup = static_cast<int>(n);
    } else if (a == "--tensor") {
      o.tensor = parse_count(a, value(i));
      if (o.tensor < 1) throw usage_error("--tensor: must be positive");
    } else if (a == "--pages") {
      const std::string_view v = value(i);
      if (v != "huge" && v != "small") throw usage_error("--pages: expected huge or small");
      o.huge_pages = v == "huge";
    } else if (a == "--seed") {
      o.seed = parse_count(a, value(i));
    } else if (a == "--netdev") {
      o.netdev = value(i);
      if (o.netdev.empty() || o.netdev.find('/') != std::string::npos || o.netdev[0] == '.') {
        throw usage_error("--netdev: '" + o.netdev + "' is not an interface name");
      }
    } else if (a == "--verify") {
      o.verify = true;
    } else if (a == "--csv") {
      o.csv = true;
    } else {
      throw usage_error("unknown option '" + std::string(a) + "'");
    }
  }
  if (o.strategies.empty()) throw usage_error("--strategy is required");
  if (o.bytes == 0) throw usage_error("--bytes is required and must be positive");
  if (o.bytes % sizeof(float) != 0) {
    throw usage_error("--bytes: " + std::to_string(o.bytes) + " is not a multiple of 4 (float32)");
  }
  if (o.bytes / sizeof(float) > 0xffffffffull) {
    throw usage_error("--bytes: at most 2^32 entries (topk sends 32-bit indices)");
  }
  if (o.density < 0) {
    for (const auto& name : o.strategies) {
      if (name == "sparse" || name == "topk") {
        throw usage_error("--density is required for --strategy " + name);
      }
    }
    o.density = 1.0;
  }
  return o;
}

// Deterministic gradient values from (seed, rank, index): multiples of 2^-20 in [-1, 1), so
// sums over up to 8 ranks are exact in float whatever the order.
float grad_value(std::uint64_t seed, int rank, std::size_t i) {
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

void fill_gradient(std::span<float> g, std::uint64_t seed, int rank) {
  for (std::size_t i = 0; i < g.size(); ++i) g[i] = grad_value(seed, rank, i);
}

std::uint64_t read_tx_bytes(const std::string& dev) {
  if (dev.empty()) return 0;
  std::ifstream f("/sys/class/net/" + dev + "/statistics/tx_bytes");
  std::uint64_t v = 0;
  if (!(f >> v)) throw std::runtime_error("--netdev: cannot read tx_bytes of '" + dev + "'");
  return v;
}

pactrain::param_layout make_layout(std::size_t n, std::size_t tensor) {
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
pactrain::calibration_options calibration(const options& o) {
  return {.compact_entries = std::max<std::size_t>(o.tensor, 1),
          .compact_density = o.density > 0 && o.density <= 1 ? o.density : 0.1};
}

// --- half precision -----------------------------------------------------------------------------

// IEEE binary16 <-> binary32, round to nearest even; the portable reference path.
std::uint16_t float_to_half_ref(float f) {
  std::uint32_t x;
  std::memcpy(&x, &f, 4);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u) {  // inf or nan
    return static_cast<std::uint16_t>(sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u : 0u));
  }
  if (absx >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // rounds to inf
  if (absx < 0x38800000u) {  // below the smallest normal half: subnormal or zero
    if (absx < 0x33000000u) return static_cast<std::uint16_t>(sign);  // < half of 2^-24
    const std::uint32_t mant = (absx & 0x7fffffu) | 0x800000u;
    const int shift = 126 - static_cast<int>(absx >> 23);  // 14..24
    std::uint32_t h = mant >> shift;
    const std::uint32_t rem = mant & ((1u << shift) - 1);
    const std::uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1u))) ++h;
    return static_cast<std::uint16_t>(sign | h);
  }
  std::uint32_t h = ((absx >> 13) - (112u << 10));
  const std::uint32_t rem = absx & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // may carry into the exponent: fine
  return static_cast<std::uint16_t>(sign | h);
}

float half_to_float_ref(std::uint16_t h) {
  const std::uint32_t sign = (static_cast<std::uint32_t>(h) & 0x8000u) << 16;
  const std::uint32_t e = (h >> 10) & 0x1fu;
  std::uint32_t m = h & 0x3ffu;
  std::uint32_t x;
  if (e == 0) {
    if (m == 0) {
      x = sign;
    } else {  // subnormal: normalise
      int ex = -1;
      do {
        m <<= 1;
        ++ex;
      } while ((m & 0x400u) == 0);
      x = sign | (static_cast<std::uint32_t>(112 - ex) << 23) | ((m & 0x3ffu) << 13);
    }
  } else if (e == 31) {
    x = sign | 0x7f800000u | (m << 13);
  } else {
    x = sign | ((e + 112u) << 23) | (m << 13);
  }
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

#ifdef PACTRAIN_BENCH_X86
bool have_f16c() {
  static const bool v = __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx");
  return v;
}

__attribute__((target("avx,f16c"))) void to_half_f16c(const float* src, std::uint16_t* dst,
                                                      std::size_t n, float scale) {
  const __m256 s = _mm256_set1_ps(scale);
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_mul_ps(_mm256_loadu_ps(src + i), s);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  for (; i < n; ++i) dst[i] = float_to_half_ref(src[i] * scale);
}

__attribute__((target("avx,f16c"))) void from_half_f16c(const std::uint16_t* src, float* dst,
                                                        std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(dst + i,
                     _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
  }
  for (; i < n; ++i) dst[i] = half_to_float_ref(src[i]);
}

__attribute__((target("avx,f16c"))) void add_half_f16c(const std::uint16_t* in, std::uint16_t* io,
                                                       std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 a = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i)));
    const __m256 b = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(io + i)));
    _mm_storeu_si128(
        reinterpret_cast<__m128i*>(io + i),
        _mm256_cvtps_ph(_mm256_add_ps(a, b), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  for (; i < n; ++i) io[i] = float_to_half_ref(half_to_float_ref(in[i]) + half_to_float_ref(io[i]));
}
#endif

void to_half(const float* src, std::uint16_t* dst, std::size_t n, float scale) {
#ifdef PACTRAIN_BENCH_X86
  if (have_f16c()) return to_half_f16c(src, dst, n, scale);
#endif
  for (std::size_t i = 0; i < n; ++i) dst[i] = float_to_half_ref(src[i] * scale);
}

void from_half(const std::uint16_t* src, float* dst, std::size_t n) {
#ifdef PACTRAIN_BENCH_X86
  if (have_f16c()) return from_half_f16c(src, dst, n);
#endif
  for (std::size_t i = 0; i < n; ++i) dst[i] = half_to_float_ref(src[i]);
}

// The user MPI_Op: io[i] = half(float(in[i]) + float(io[i])). The float sum of two halves is
// exact, so each hop rounds once.
void half_sum_op(void* in, void* io, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const std::uint16_t*>(in);
  auto* b = static_cast<std::uint16_t*>(io);
  const auto n = static_cast<std::size_t>(*len);
#ifdef PACTRAIN_BENCH_X86
  if (have_f16c()) return add_half_f16c(a, b, n);
#endif
  for (std::size_t i = 0; i < n; ++i)
    b[i] = float_to_half_ref(half_to_float_ref(a[i]) + half_to_float_ref(b[i]));
}

// --- strategies --------------------------------------------------------------------------------

void check_mpi(int rc, const char* what) {
  if (rc != MPI_SUCCESS) throw std::runtime_error(std::string(what) + " failed");
}

/// One strategy: sync(g) averages g across ranks in place and returns the seconds of local
/// work it did.
class strategy {
 public:
  virtual ~strategy() = default;
  virtual double sync(gradient& g) = 0;
  [[nodiscard]] virtual std::size_t bytes_sent() const = 0;
  /// The expected result of the first sync, from every rank's gradient.
  virtual std::vector<float> reference(const options& o, int ranks) = 0;
  /// Largest allowed |result - reference|.
  [[nodiscard]] virtual double tolerance(int) const { return 0.0; }
  /// Seconds of the last sync's local work that grow with the number of ranks.
  [[nodiscard]] virtual double rank_dependent_seconds() const { return 0.0; }
  /// The engine's bucket strategies, e.g. "sparse:24 dense_plain:1" (empty for baselines).
  [[nodiscard]] virtual std::string plan() const { return {}; }
  /// auto: the planner's predicted seconds per sync; negative for the fixed strategies.
  [[nodiscard]] virtual double predicted_seconds() const { return -1.0; }
};

std::vector<float> dense_average(const options& o, std::size_t n, int ranks) {
  std::vector<float> sum(n, 0.0f), g(n);
  for (int r = 0; r < ranks; ++r) {
    fill_gradient(g, o.seed, r);
    for (std::size_t i = 0; i < n; ++i) sum[i] += g[i];
  }
  const float scale = 1.0f / static_cast<float>(ranks);
  for (auto& v : sum) v *= scale;
  return sum;
}

class dense_strategy final : public strategy {
 public:
  dense_strategy(MPI_Comm comm, std::size_t n) : comm_(comm), n_(n) {
    MPI_Comm_size(comm_, &ranks_);
  }
  double sync(gradient& g) override {
    for (std::size_t at = 0; at < g.size(); at += chunk) {
      const int c = static_cast<int>(std::min(chunk, g.size() - at));
      check_mpi(MPI_Allreduce(MPI_IN_PLACE, g.data() + at, c, MPI_FLOAT, MPI_SUM, comm_),
                "MPI_Allreduce");
    }
    const auto t0 = clock_type::now();
    const float scale = 1.0f / static_cast<float>(ranks_);
    for (auto& v : g) v *= scale;
    return seconds_since(t0);
  }
  [[nodiscard]] std::size_t bytes_sent() const override { return n_ * sizeof(float); }
  std::vector<float> reference(const options& o, int ranks) override {
    return dense_average(o, n_, ranks);
  }

 private:
  static constexpr std::size_t chunk = std::size_t{1} << 30;
  MPI_Comm comm_;
  std::size_t n_;
  int ranks_ = 1;
};

class fp16_strategy final : public strategy {
 public:
  fp16_strategy(MPI_Comm comm, std::size_t n) : comm_(comm), n_(n), wire_(n) {
    MPI_Comm_size(comm_, &ranks_);
    check_mpi(MPI_Op_create(&half_sum_op, 1, &op_), "MPI_Op_create");
  }
  ~fp16_strategy() override { MPI_Op_free(&op_); }
  fp16_strategy(const fp16_strategy&) = delete;
  fp16_strategy& operator=(const fp16_strategy&) = delete;

  double sync(gradient& g) override {
    auto t0 = clock_type::now();
    to_half(g.data(), wire_.data(), n_, 1.0f / static_cast<float>(ranks_));
    double local = seconds_since(t0);
    for (std::size_t at = 0; at < n_; at += chunk) {
      const int c = static_cast<int>(std::min(chunk, n_ - at));
      check_mpi(MPI_Allreduce(MPI_IN_PLACE, wire_.data() + at, c, MPI_UINT16_T, op_, comm_),
                "MPI_Allreduce");
    }
    t0 = clock_type::now();
    from_half(wire_.data(), g.data(), n_);
    return local + seconds_since(t0);
  }
  [[nodiscard]] std::size_t bytes_sent() const override { return n_ * sizeof(std::uint16_t); }
  std::vector<float> reference(const options& o, int ranks) override {
    return dense_average(o, n_, ranks);
  }
  // Each rank's value rounds once (<= 2^-12 for |g/P| < 1), each of the P-1 sums once more.
  [[nodiscard]] double tolerance(int ranks) const override { return ranks * 0x1p-10; }

 private:
  static constexpr std::size_t chunk = std::size_t{1} << 30;
  MPI_Comm comm_;
  std::size_t n_;
  int ranks_ = 1;
  MPI_Op op_ = MPI_OP_NULL;
  std::vector<std::uint16_t> wire_;
};

std::vector<pactrain::bitmap_mask> bench_masks(const pactrain::param_layout& l, const options& o) {
  std::vector<float> w(l.total_size(), 0.0f);  // random_pruning looks only at the layout
  return pactrain::random_pruning{.seed = o.seed}.compute(
      l, std::span<const float>(w), 1.0 - o.density, std::vector<bool>(l.tensor_count(), true));
}

/// "codec strategy:count ...", e.g. "ternary dense_plain:1 sparse:24".
std::string plan_text(std::string codec, const std::vector<pactrain::bucket_strategy>& s) {
  std::map<std::string, std::size_t> count;
  for (auto st : s) ++count[pactrain::to_string(st)];
  for (const auto& [name, n] : count) codec += " " + name + ":" + std::to_string(n);
  return codec;
}

/// pactrain::sync over a random mask of the density: plain compaction (identity codec), or a
/// codec on the kept entries (sparse-fp16, sparse-ternary with error feedback); auto plans
/// and tunes its strategies (see make_auto).
template <class Codec, class Feedback = pactrain::no_feedback>
class engine_strategy final : public strategy {
 public:
  engine_strategy(MPI_Comm comm, const options& o, std::size_t n, Codec codec = {})
      : sync_(pactrain::mpi_communicator{comm}, make_layout(n, o.tensor), {}, {},
              std::move(codec)) {
    sync_.set_masks(bench_masks(sync_.layout(), o));
  }
  /// Collective: the plans worth timing, from a cost model of the local work calibrated over
  /// `link`.
  std::vector<pactrain::strategy_choice> candidates(const options& o, const pactrain::link_model& link) {
    const auto model = pactrain::calibrate_local(sync_.get_communicator(), link, calibration(o),
                                                 sync_.compactor(), sync_.codec());
    return pactrain::candidate_strategies(model, sync_.get_communicator().size(),
                                     pactrain::bucket_shapes(sync_));
  }
  /// Collective: puts a plan in force.
  void use(const pactrain::strategy_choice& p) {
    if (sync_.strategies() != p.strategies) sync_.set_strategies(p.strategies);
    predicted_ = p.predicted_seconds;
  }
  /// Planned: the planner's predicted seconds per sync (the same on every rank).
  [[nodiscard]] double predicted_seconds() const override { return predicted_; }
  double sync(gradient& g) override {
    sync_.allreduce(std::span<float>(g));
    return sync_.stats().gather_seconds + sync_.stats().scatter_seconds;
  }
  [[nodiscard]] std::size_t bytes_sent() const override { return sync_.stats().bytes_sent; }
  [[nodiscard]] std::string plan() const override {
    return plan_text(codec_name(), sync_.strategies());
  }
  std::vector<float> reference(const options& o, int ranks) override {
    auto avg = dense_average(o, sync_.layout().total_size(), ranks);
    pactrain::apply_masks(sync_.layout(), sync_.masks(), std::span<float>(avg));
    for (auto& v : avg) v += 0.0f;  // -0 -> +0, as the engine returns
    return avg;
  }
  // identity: exact. fp16/bf16: each value rounds once on encode and every partial sum once
  // more (|g| < 1). ternary: one draw of an unbiased estimate, within 2 scales (|g| < 1).
  [[nodiscard]] double tolerance(int ranks) const override {
    if constexpr (pactrain::codec_traits<Codec>::is_identity) {
      return 0.0;
    } else if constexpr (std::is_same_v<Codec, pactrain::ternary_codec>) {
      return 2.0;
    } else {
      return ranks * 0x1p-7;
    }
  }

 private:
  pactrain::sync<pactrain::bitmap_mask, pactrain::host_compactor, pactrain::mpi_communicator, Codec,
                 Feedback>
      sync_;
  double predicted_ = -1.0;

  static std::string codec_name() {
    if constexpr (pactrain::codec_traits<Codec>::is_identity) {
      return "identity";
    } else if constexpr (std::is_same_v<Codec, pactrain::ternary_codec>) {
      return "ternary";
    } else if constexpr (std::is_same_v<Codec, pactrain::fp16_codec>) {
      return "fp16";
    } else {
      return "codec";
    }
  }
};

/// auto: one engine per codec (fp16, and ternary lanes with error feedback). The link is
/// calibrated once; each engine's local work is calibrated and pactrain::candidate_strategies
/// gives its plans worth timing (the ternary engine's with a coded bucket only: its plain
/// plans are the fp16 engine's). Plans predicted more than 3x slower than the best are
/// dropped; pactrain::step_tuner times the rest in turn, 3 syncs each on this run's
/// gradient (after a barrier, the slowest rank's time, as the timed syncs), and the fastest
/// engine and plan are kept. Every rank keeps the same. `base` is this rank's gradient.
std::unique_ptr<strategy> make_auto(MPI_Comm comm, const options& o, std::size_t n,
                                    const gradient& base) {
  using fp16_engine = engine_strategy<pactrain::fp16_codec>;
  using ternary_engine = engine_strategy<pactrain::ternary_codec, pactrain::error_feedback>;
  pactrain::mpi_communicator link_comm{comm};
  const auto link = pactrain::calibrate_link(link_comm, calibration(o));
  auto fp16 = std::make_unique<fp16_engine>(comm, o, n, pactrain::fp16_codec{});
  auto ternary =
      std::make_unique<ternary_engine>(comm, o, n, pactrain::ternary_codec{{.seed = o.seed}});
  struct candidate {
    int engine;  // 0 fp16, 1 ternary
    pactrain::strategy_choice plan;
  };
  std::vector<candidate> c;
  for (auto& p : fp16->candidates(o, link)) c.push_back({0, std::move(p)});
  for (auto& p : ternary->candidates(o, link)) {
    const bool coded = std::any_of(p.strategies.begin(), p.strategies.end(),
                                   [](auto s) { return !pactrain::is_plain(s); });
    if (coded) c.push_back({1, std::move(p)});
  }
  double best = std::numeric_limits<double>::infinity();
  for (const auto& x : c) best = std::min(best, x.plan.predicted_seconds);
  // candidate_strategies' cut-off, applied again across the two engines.
  const double keep = pactrain::candidate_options{}.keep_within;
  std::erase_if(c, [&](const auto& x) { return x.plan.predicted_seconds > keep * best; });

  pactrain::step_tuner tuner(c.size(), 3);
  strategy* engines[2] = {fp16.get(), ternary.get()};
  auto use = [&](const candidate& x) {
    if (x.engine == 0) fp16->use(x.plan);
    if (x.engine == 1) ternary->use(x.plan);
  };
  gradient g(n);
  while (tuner.tuning()) {
    const auto& x = c[tuner.current()];
    use(x);
    g = base;
    MPI_Barrier(comm);
    const auto t0 = clock_type::now();
    engines[x.engine]->sync(g);
    tuner.record(link_comm, seconds_since(t0));
  }
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  if (rank == 0 && !o.csv) {
    for (std::size_t i = 0; i < c.size(); ++i) {
      std::printf("  auto candidate %zu: %s, predicted %.6f s, timed %.6f s%s\n", i,
                  plan_text(c[i].engine == 0 ? "fp16" : "ternary", c[i].plan.strategies).c_str(),
                  c[i].plan.predicted_seconds, tuner.median(i),
                  i == tuner.best() ? " (kept)" : "");
    }
  }
  const auto& kept = c[tuner.best()];
  use(kept);
  if (kept.engine == 0) return fp16;
  return ternary;
}

/// DGC-style Top-k selection with error feedback. Adds g into `acc` (the residual) and puts
/// into `out` the indices (ascending) of the k entries of largest |acc|, ties broken by lower
/// index. `scratch` and `cand` are reused buffers.
void select_topk(std::span<float> acc, std::span<const float> g, std::size_t k,
                 std::vector<std::uint32_t>& out, std::vector<float>& scratch,
                 std::vector<std::uint32_t>& cand, std::uint64_t step) {
  const std::size_t n = acc.size();
  out.clear();
  if (k >= n) {
    for (std::size_t i = 0; i < n; ++i) {
      acc[i] += g[i];
      out.push_back(static_cast<std::uint32_t>(i));
    }
    return;
  }
  // 1. Estimate the threshold on a strided sample of acc + g (DGC samples 0.1-1%), aiming a
  //    little low so that the candidates usually hold at least k entries.
  const std::size_t samples = std::min(n, std::max<std::size_t>(std::size_t{1} << 16, n / 100));
  const std::size_t stride = n / samples;
  scratch.resize(samples);
  const std::size_t start = static_cast<std::size_t>(step % stride);
  for (std::size_t s = 0; s < samples; ++s) {
    const std::size_t i = start + s * stride;
    scratch[s] = std::fabs(acc[i] + g[i]);
  }
  const double frac = static_cast<double>(k) / static_cast<double>(n);
  const auto want = std::min(samples - 1, static_cast<std::size_t>(frac * 1.1 * samples + 16));
  std::nth_element(scratch.begin(), scratch.begin() + static_cast<std::ptrdiff_t>(want),
                   scratch.end(), std::greater<float>());
  const float est = scratch[want];
  // 2. One pass: acc += g, and the candidates at or above the estimate (branch-free).
  cand.resize(n);
  std::size_t c = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const float v = acc[i] + g[i];
    acc[i] = v;
    cand[c] = static_cast<std::uint32_t>(i);
    c += std::fabs(v) >= est ? 1 : 0;
  }
  if (c < k) {  // the estimate was too high: every entry is a candidate
    for (std::size_t i = 0; i < n; ++i) cand[i] = static_cast<std::uint32_t>(i);
    c = n;
  }
  cand.resize(c);
  if (k == 0) return;
  // 3. The exact k-th largest magnitude among the candidates is the global one.
  scratch.resize(c);
  for (std::size_t j = 0; j < c; ++j) scratch[j] = std::fabs(acc[cand[j]]);
  std::nth_element(scratch.begin(), scratch.begin() + static_cast<std::ptrdiff_t>(k - 1),
                   scratch.end(), std::greater<float>());
  const float t = scratch[k - 1];
  std::size_t above = 0;
  for (std::size_t j = 0; j < c; ++j) above += std::fabs(acc[cand[j]]) > t ? 1 : 0;
  std::size_t ties = k - above;
  out.reserve(k);
  for (std::uint32_t i : cand) {  // ascending
    const float m = std::fabs(acc[i]);
    if (m > t || (m == t && ties > 0)) {
      if (m == t) --ties;
      out.push_back(i);
    }
  }
}

class topk_strategy final : public strategy {
 public:
  struct pair {
    std::uint32_t index;
    float value;
  };
  static_assert(sizeof(pair) == 8);

  topk_strategy(MPI_Comm comm, const options& o, std::size_t n)
      : comm_(comm), n_(n), residual_(n, 0.0f) {
    MPI_Comm_size(comm_, &ranks_);
    // The same k as the sparse mask: round(D * size) kept entries per tensor.
    const auto l = make_layout(n, o.tensor);
    for (const auto& t : l.tensors())
      k_ += t.size - pactrain::pruned_count(t.size, 1.0 - o.density);
    PACTRAIN_EXPECTS(k_ * sizeof(pair) <= static_cast<std::size_t>(INT32_MAX),
                     "topk: k * 8 bytes exceeds one MPI_Allgather count");
    send_.resize(k_);
    recv_.resize(k_ * static_cast<std::size_t>(ranks_));
  }

  double sync(gradient& g) override {
    auto t0 = clock_type::now();
    // Error feedback: what was not sent before is added to this step's gradient.
    select_topk(residual_, g, k_, idx_, scratch_, cand_, step_++);
    for (std::size_t j = 0; j < k_; ++j) {
      const std::uint32_t i = idx_[j];
      send_[j] = {i, residual_[i]};
      residual_[i] = 0.0f;
    }
    double local = seconds_since(t0);
    const int count = static_cast<int>(k_ * sizeof(pair));
    check_mpi(MPI_Allgather(send_.data(), count, MPI_BYTE, recv_.data(), count, MPI_BYTE, comm_),
              "MPI_Allgather");
    t0 = clock_type::now();
    const auto t_acc = t0;
    std::fill(g.begin(), g.end(), 0.0f);
    // Ranks in order: the same sum on every rank. Scaling each pair (by 1/P, exact for a
    // power of two) saves a pass over the dense result.
    const float scale = 1.0f / static_cast<float>(ranks_);
    for (const pair& p : recv_) g[p.index] += p.value * scale;
    accumulate_seconds_ = seconds_since(t_acc);
    return local + accumulate_seconds_;
  }
  [[nodiscard]] std::size_t bytes_sent() const override { return k_ * sizeof(pair); }
  [[nodiscard]] double rank_dependent_seconds() const override { return accumulate_seconds_; }

  std::vector<float> reference(const options& o, int ranks) override {
    // First sync, residual zero: every rank's own top-k, summed in rank order.
    std::vector<float> sum(n_, 0.0f), g(n_);
    for (int r = 0; r < ranks; ++r) {
      fill_gradient(g, o.seed, r);
      // The reference selection: full sort by (|a| descending, index ascending).
      std::vector<std::uint32_t> order(n_);
      for (std::size_t i = 0; i < n_; ++i) order[i] = static_cast<std::uint32_t>(i);
      std::stable_sort(order.begin(), order.end(), [&](std::uint32_t x, std::uint32_t y) {
        return std::fabs(g[x]) > std::fabs(g[y]);
      });
      const float scale = 1.0f / static_cast<float>(ranks);
      for (std::size_t j = 0; j < k_; ++j) sum[order[j]] += g[order[j]] * scale;
    }
    return sum;
  }

 private:
  MPI_Comm comm_;
  std::size_t n_;
  std::size_t k_ = 0;
  int ranks_ = 1;
  std::uint64_t step_ = 0;
  double accumulate_seconds_ = 0;
  std::vector<float> residual_;
  std::vector<pair> send_, recv_;
  std::vector<std::uint32_t> idx_, cand_;
  std::vector<float> scratch_;
};

std::string allreduce_algorithm() {
  const char* dyn = std::getenv("OMPI_MCA_coll_tuned_use_dynamic_rules");
  const char* alg = std::getenv("OMPI_MCA_coll_tuned_allreduce_algorithm");
  if (dyn == nullptr || std::string_view(dyn) != "1" || alg == nullptr) return "default";
  const std::string_view a = alg;
  if (a == "4" || a == "ring") return "ring";
  std::string name = "alg";
  name.append(a);
  return name;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t m = v.size() / 2;
  return v.size() % 2 == 1 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

int run(const options& o) {
  MPI_Comm comm = MPI_COMM_NULL;
  check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &comm), "MPI_Comm_dup");
  int rank = 0, ranks = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &ranks);
  const std::size_t n = o.bytes / sizeof(float);

  gradient base(n), g(n);
  fill_gradient(base, o.seed, rank);
  int bad = 0;
  {
    // Every strategy is built before any is timed, and the timed syncs take turns (one of
    // each, then the next round), so that a drift of the machine weighs on all alike.
    struct entry {
      std::string name;
      std::unique_ptr<strategy> s;
      std::vector<double> times, locals, growing;
      std::uint64_t tx = 0;  // bytes the interface sent during this strategy's timed syncs
    };
    std::vector<entry> list;
    for (const auto& name : o.strategies) {
      std::unique_ptr<strategy> s;
      if (name == "dense") s = std::make_unique<dense_strategy>(comm, n);
      if (name == "fp16") s = std::make_unique<fp16_strategy>(comm, n);
      if (name == "sparse")
        s = std::make_unique<engine_strategy<pactrain::identity_codec<float>>>(comm, o, n);
      if (name == "sparse-fp16")
        s = std::make_unique<engine_strategy<pactrain::fp16_codec>>(comm, o, n);
      if (name == "sparse-ternary") {
        s = std::make_unique<engine_strategy<pactrain::ternary_codec, pactrain::error_feedback>>(
            comm, o, n, pactrain::ternary_codec{{.seed = o.seed}});
      }
      if (name == "auto") s = make_auto(comm, o, n, base);
      if (name == "topk") s = std::make_unique<topk_strategy>(comm, o, n);
      list.push_back({name, std::move(s), {}, {}, {}, 0});
    }

    if (o.verify) {
      for (auto& e : list) {
        g = base;
        e.s->sync(g);
        const auto ref = e.s->reference(o, ranks);
        const double tol = e.s->tolerance(ranks);
        std::size_t mismatches = 0;
        double worst = 0;
        for (std::size_t i = 0; i < n; ++i) {
          const double d = std::fabs(static_cast<double>(g[i]) - ref[i]);
          worst = std::max(worst, d);
          if (d > tol || (tol == 0 && std::memcmp(&g[i], &ref[i], 4) != 0)) ++mismatches;
        }
        int wrong = mismatches != 0;
        if (wrong) {
          std::fprintf(stderr, "rank %d: verify %s: %zu of %zu entries differ (worst %.3g)\n",
                       rank, e.name.c_str(), mismatches, n, worst);
        }
        MPI_Allreduce(MPI_IN_PLACE, &wrong, 1, MPI_INT, MPI_MAX, comm);
        bad = bad || wrong;
        if (rank == 0 && !o.csv) {
          std::printf("verify %s: %s\n", e.name.c_str(), wrong ? "FAILED" : "ok");
        }
      }
    }

    for (int w = 0; w < o.warmup; ++w) {
      for (auto& e : list) {
        g = base;
        e.s->sync(g);
      }
    }
    for (int it = 0; it < o.iters; ++it) {
      for (auto& e : list) {
        g = base;
        const std::uint64_t tx0 = read_tx_bytes(o.netdev);
        MPI_Barrier(comm);
        const auto t0 = clock_type::now();
        double local = e.s->sync(g);
        double dt = seconds_since(t0);
        MPI_Allreduce(MPI_IN_PLACE, &dt, 1, MPI_DOUBLE, MPI_MAX, comm);
        double grow = e.s->rank_dependent_seconds();
        MPI_Allreduce(MPI_IN_PLACE, &local, 1, MPI_DOUBLE, MPI_MAX, comm);
        MPI_Allreduce(MPI_IN_PLACE, &grow, 1, MPI_DOUBLE, MPI_MAX, comm);
        e.tx += read_tx_bytes(o.netdev) - tx0;
        e.times.push_back(dt);
        e.locals.push_back(local);
        e.growing.push_back(grow);
      }
    }
    for (auto& e : list) {
      std::string wire;
      if (!o.netdev.empty()) {
        double tx = static_cast<double>(e.tx) / o.iters;
        MPI_Allreduce(MPI_IN_PLACE, &tx, 1, MPI_DOUBLE, MPI_SUM, comm);
        wire = std::to_string(static_cast<std::uint64_t>(tx / ranks));
      }
      if (rank != 0) continue;
      const auto& s = e.s;
      const double med = median(e.times);
      const double lo = *std::min_element(e.times.begin(), e.times.end());
      const double hi = *std::max_element(e.times.begin(), e.times.end());
      if (o.csv) {
        const std::string predicted =
            s->predicted_seconds() < 0 ? "" : std::to_string(s->predicted_seconds());
        std::printf("%s,%d,%zu,%g,%.6f,%.6f,%.6f,%zu,%s,%.6f,%.6f,%d,%s,%s,%s,%s\n",
                    e.name.c_str(), ranks, o.bytes, o.density, med, lo, hi, s->bytes_sent(),
                    wire.c_str(), median(e.locals), median(e.growing), o.iters,
                    allreduce_algorithm().c_str(), s->plan().c_str(), predicted.c_str(),
                    o.huge_pages ? "huge" : "small");
      } else {
        std::printf(
            "%s: %d ranks, %zu bytes, density %g: median %.6f s per sync (min %.6f, max %.6f) "
            "over %d, local work %.6f s; %zu bytes sent per rank%s%s; allreduce %s%s%s; %s "
            "pages\n",
            e.name.c_str(), ranks, o.bytes, o.density, med, lo, hi, o.iters,
            median(e.locals), s->bytes_sent(), wire.empty() ? "" : ", on the wire ",
            wire.c_str(), allreduce_algorithm().c_str(), s->plan().empty() ? "" : "; buckets ",
            s->plan().c_str(), o.huge_pages ? "huge" : "small");
        if (s->predicted_seconds() >= 0) {
          std::printf("  the planner predicted %.6f s per sync\n", s->predicted_seconds());
        }
      }
      std::fflush(stdout);
    }
  }
  MPI_Comm_free(&comm);
  return bad;
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::string_view(argv[i]) == "--csv-header") {
      std::printf("%s\n", csv_header);
      return 0;
    }
  }
  options o;
  try {
    o = parse(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr,
                 "pactrain-sync-bench: %s\nusage: pactrain-sync-bench --bytes N --strategy "
                 "dense|sparse|topk|fp16 [--density D] [--iters N] [--warmup N] [--tensor N] "
                 "[--seed N] [--pages huge|small] [--netdev IF] [--verify] [--csv] | "
                 "--csv-header\n",
                 e.what());
    return 2;
  }
  gradients_on_huge_pages = o.huge_pages;
  MPI_Init(&argc, &argv);
  int rc = 0;
  try {
    rc = run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pactrain-sync-bench: %s\n", e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
  return rc;
}
