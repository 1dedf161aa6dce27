// half and bfloat16: every bit pattern round-trips, and float -> 16 bits rounds to nearest
// even exactly as an independent reference (the nearest of the format's values, computed in
// double) over ties, subnormal boundaries, overflow and a large sample of floats.
#include <doctest/doctest.h>

#include <pactrain/half.hpp>

#include "common/test_data.hpp"

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

using namespace pactrain;

namespace {

// Value of a non-negative bit pattern in a format with `mbits` mantissa bits and exponent
// bias `bias`, computed without the library; the infinity pattern gets the value the next
// binade would start at, which is where IEEE rounding to inf begins.
double format_value(std::uint32_t bits, int mbits, int bias) {
  const std::uint32_t e = bits >> mbits;
  const std::uint32_t m = bits & ((1u << mbits) - 1u);
  if (e == 0) return std::ldexp(static_cast<double>(m), 1 - bias - mbits);
  return std::ldexp(static_cast<double>((1u << mbits) + m), static_cast<int>(e) - bias - mbits);
}

struct format {
  int mbits;
  int bias;
  std::uint32_t inf;  // bits of +inf
};
constexpr format half_format{10, 15, 0x7c00};
constexpr format bf16_format{7, 127, 0x7f80};

// Round x to the nearest value of the format, ties to the even pattern; NaN -> 0x7fff.
std::uint16_t reference_round(double x, const format& f) {
  if (std::isnan(x)) return 0x7fff;
  const std::uint32_t sign = std::signbit(x) ? 0x8000u : 0u;
  const double a = std::fabs(x);
  if (a >= format_value(f.inf, f.mbits, f.bias)) return static_cast<std::uint16_t>(sign | f.inf);
  // Largest finite pattern whose value is <= a (values increase with the pattern).
  std::uint32_t lo = 0;
  std::uint32_t hi = f.inf;  // format_value(hi) > a
  while (hi - lo > 1) {
    const std::uint32_t mid = (lo + hi) / 2;
    (format_value(mid, f.mbits, f.bias) <= a ? lo : hi) = mid;
  }
  const double below = format_value(lo, f.mbits, f.bias);
  const double above = format_value(lo + 1, f.mbits, f.bias);
  std::uint32_t r = lo;
  if (a - below > above - a || (a - below == above - a && (lo & 1u) != 0)) r = lo + 1;
  return static_cast<std::uint16_t>(sign | r);
}

bool is_nan16(std::uint16_t b, const format& f) { return (b & 0x7fffu) > f.inf; }

// Floats that probe a format: every value, the midpoints between neighbours and the floats
// just beside them, powers of two across the range, and a hash-driven sample of all floats.
std::vector<float> probe_floats(const format& f) {
  std::vector<float> v;
  for (std::uint32_t b = 0; b < f.inf; ++b) {
    const double lo = format_value(b, f.mbits, f.bias);
    const double mid = (lo + format_value(b + 1, f.mbits, f.bias)) / 2;
    for (double d : {lo, mid}) {
      const auto x = static_cast<float>(d);
      if (static_cast<double>(x) != d) continue;  // a bf16 midpoint below float's range
      for (float y : {x, std::nextafter(x, 0.0f), std::nextafter(x, 1e30f)}) {
        v.push_back(y);
        v.push_back(-y);
      }
    }
  }
  for (int e = -150; e <= 128; ++e) v.push_back(std::ldexp(1.0f, e));
  for (std::uint64_t i = 0; i < 300000; ++i) {
    v.push_back(std::bit_cast<float>(static_cast<std::uint32_t>(test::mix(i))));
  }
  const float special[] = {0.0f,
                           -0.0f,
                           65504.0f,
                           65519.99f,
                           65520.0f,
                           65536.0f,
                           std::numeric_limits<float>::max(),
                           std::numeric_limits<float>::min(),
                           std::numeric_limits<float>::denorm_min(),
                           std::numeric_limits<float>::infinity(),
                           -std::numeric_limits<float>::infinity(),
                           std::numeric_limits<float>::quiet_NaN(),
                           std::bit_cast<float>(0x7f800001u),  // signalling NaN
                           std::bit_cast<float>(0xffc12345u)};
  for (float x : special) v.push_back(x);
  return v;
}

}  // namespace

TEST_CASE("half: known values, at compile time") {
  static_assert(half(1.0f).bits() == 0x3c00);
  static_assert(half(-2.0f).bits() == 0xc000);
  static_assert(half(65504.0f).bits() == 0x7bff);
  static_assert(half(65520.0f).bits() == 0x7c00);  // the tie rounds to inf (even)
  static_assert(half(65519.996f).bits() == 0x7bff);
  static_assert(half(0x1p-24f).bits() == 0x0001);             // smallest subnormal
  static_assert(half(0x1p-25f).bits() == 0x0000);             // its half: tie to even 0
  static_assert(half(0x1.000002p-25f).bits() == 0x0001);      // just above the tie
  static_assert(half(0x1.8p-24f).bits() == 0x0002);           // 1.5 ulp: tie to even 2
  static_assert(half(0x1p-14f).bits() == 0x0400);             // smallest normal
  static_assert(half(0x1.ff8p-15f).bits() == 0x03ff);         // largest subnormal
  static_assert(half(1.0f + 0x1p-11f).bits() == 0x3c00);      // tie to even (down)
  static_assert(half(1.0f + 3 * 0x1p-11f).bits() == 0x3c02);  // tie to even (up)
  static_assert(half(std::numeric_limits<float>::quiet_NaN()).bits() == 0x7fff);
  static_assert(static_cast<float>(half::from_bits(0x3555)) == 0x1.554p-2f);
  static_assert(static_cast<float>(half::from_bits(0x0001)) == 0x1p-24f);
  static_assert(bfloat16(1.0f).bits() == 0x3f80);
  static_assert(bfloat16(1.0f + 0x1p-8f).bits() == 0x3f80);  // tie to even
  static_assert(bfloat16(std::numeric_limits<float>::max()).bits() == 0x7f80);
  static_assert(bfloat16(std::numeric_limits<float>::quiet_NaN()).bits() == 0x7fff);
  static_assert(static_cast<float>(bfloat16::from_bits(0x4049)) == 3.140625f);
}

TEST_CASE("half: all 65536 patterns round-trip through float") {
  std::size_t bad = 0;
  for (std::uint32_t b = 0; b < 65536; ++b) {
    const auto h = half::from_bits(static_cast<std::uint16_t>(b));
    const float f = static_cast<float>(h);
    const auto back = half(f).bits();
    if (is_nan16(static_cast<std::uint16_t>(b), half_format)) {
      // NaN stays NaN, comes out quiet, and goes back as the canonical pattern.
      bad += !std::isnan(f) || (std::bit_cast<std::uint32_t>(f) & 0x400000u) == 0 || back != 0x7fff;
    } else {
      bad += back != b;
      // Exact: the float is the reference value.
      const double want = format_value(b & 0x7fffu, 10, 15) * ((b & 0x8000u) != 0 ? -1.0 : 1.0);
      bad += (b & 0x7fffu) != 0x7c00u && static_cast<double>(f) != want;
    }
  }
  CHECK(bad == 0);
}

TEST_CASE("bfloat16: all 65536 patterns round-trip through float") {
  std::size_t bad = 0;
  for (std::uint32_t b = 0; b < 65536; ++b) {
    const float f = static_cast<float>(bfloat16::from_bits(static_cast<std::uint16_t>(b)));
    bad += std::bit_cast<std::uint32_t>(f) != b << 16;  // exact, NaN payload kept
    const auto back = bfloat16(f).bits();
    bad += is_nan16(static_cast<std::uint16_t>(b), bf16_format) ? back != 0x7fff : back != b;
  }
  CHECK(bad == 0);
}

TEST_CASE_TEMPLATE("float -> 16 bits matches the reference rounding", T, half, bfloat16) {
  const format& f = std::same_as<T, half> ? half_format : bf16_format;
  const auto v = probe_floats(f);
  std::vector<T> bulk(v.size());
  detail::from_float(v.data(), bulk.data(), v.size());  // the vector path (F16C where present)
  std::size_t bad = 0;
  std::size_t bad_bulk = 0;
  for (std::size_t i = 0; i < v.size(); ++i) {
    const std::uint16_t want = reference_round(static_cast<double>(v[i]), f);
    bad += T(v[i]).bits() != want;
    bad_bulk += bulk[i].bits() != want;
  }
  CHECK(v.size() > 300000);
  CHECK(bad == 0);
  CHECK(bad_bulk == 0);
}

TEST_CASE_TEMPLATE("bulk 16 bits -> float equals the scalar conversion", T, half, bfloat16) {
  std::vector<T> all(65536 + 5);
  for (std::size_t b = 0; b < all.size(); ++b) all[b] = T::from_bits(static_cast<std::uint16_t>(b));
  std::vector<float> out(all.size());
  detail::to_float(all.data(), out.data(), all.size());
  std::size_t bad = 0;
  for (std::size_t b = 0; b < all.size(); ++b) {
    bad += std::bit_cast<std::uint32_t>(out[b]) !=
           std::bit_cast<std::uint32_t>(static_cast<float>(all[b]));
  }
  CHECK(bad == 0);
}

TEST_CASE_TEMPLATE("a pairwise sum rounds the exact sum once", T, half, bfloat16) {
  const format& f = std::same_as<T, half> ? half_format : bf16_format;
  constexpr std::size_t n = 50000;
  std::vector<T> a(n);
  std::vector<T> b(n);
  for (std::size_t i = 0; i < n; ++i) {
    // Finite operands of every magnitude, and pairs of equal exponent (most rounding).
    auto x = static_cast<std::uint16_t>(test::mix(2 * i) & 0xffff);
    auto y = static_cast<std::uint16_t>(test::mix(2 * i + 1) & 0xffff);
    if (i % 2 == 0) y = static_cast<std::uint16_t>((x & 0xfc00u) | (y & 0x83ffu));
    if (is_nan16(x, f) || (x & 0x7fffu) == f.inf) x = 0x1234;
    if (is_nan16(y, f) || (y & 0x7fffu) == f.inf) y = 0x4321;
    a[i] = T::from_bits(x);
    b[i] = T::from_bits(y);
  }
  auto sum = b;
  detail::combine(a.data(), sum.data(), n, [](float p, float q) { return p + q; });
  std::size_t bad = 0;
  for (std::size_t i = 0; i < n; ++i) {
    // The double sum of two such values is exact except far below the larger one's ulp.
    const double exact = static_cast<double>(static_cast<float>(a[i])) +
                         static_cast<double>(static_cast<float>(b[i]));
    bad += sum[i].bits() != reference_round(exact, f);
  }
  CHECK(bad == 0);
}
