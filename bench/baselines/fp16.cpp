// fp16: as PyTorch's fp16_compress_hook, g / P rounded to IEEE half, one MPI_Iallreduce of
// 16-bit values with a user MPI_Op that adds two halves in float and rounds back (so every hop
// of the ring carries 2 bytes per entry), then widened back to float.
#include "../sync/harness.hpp"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define PACTRAIN_BENCH_X86 1
#endif

#include <cstring>

namespace sync_bench {
namespace {

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

class fp16_method final : public method {
 public:
  fp16_method(MPI_Comm comm, std::size_t n) : comm_(comm), n_(n), wire_(n) {
    MPI_Comm_size(comm_, &ranks_);
    check_mpi(MPI_Op_create(&half_sum_op, 1, &op_), "MPI_Op_create");
  }
  ~fp16_method() override { MPI_Op_free(&op_); }
  fp16_method(const fp16_method&) = delete;
  fp16_method& operator=(const fp16_method&) = delete;

  double sync(std::span<float> g) override {
    auto t0 = clock_type::now();
    to_half(g.data(), wire_.data(), n_, 1.0f / static_cast<float>(ranks_));
    double local = seconds_since(t0);
    allreduce_in_place(wire_.data(), n_, sizeof(std::uint16_t), MPI_UINT16_T, op_, comm_);
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
  // The user MPI_Op is commutative, so coll/libnbc decides as for MPI_SUM, on 2-byte elements.
  [[nodiscard]] collective_choice collective(const pactrain::mpi_allreduce_config& c,
                                             int ranks) const override {
    return {pactrain::to_string(c.nonblocking(n_, sizeof(std::uint16_t), ranks)),
            c.readable && c.nonblocking_forced != 0};
  }

 private:
  MPI_Comm comm_;
  std::size_t n_;
  int ranks_ = 1;
  MPI_Op op_ = MPI_OP_NULL;
  std::vector<std::uint16_t> wire_;
};

}  // namespace

std::unique_ptr<method> make_fp16(const method_args& a) {
  return std::make_unique<fp16_method>(a.comm, a.n);
}

}  // namespace sync_bench
